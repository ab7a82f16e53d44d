"""Mesh arithmetic has one home (meshplan/arithmetic/mesh.py): the world-size laws, derived DP, expert DP and the fast
domain.

Before, the cost model treated 8 GPUs of an h100-pcie node as one NVLink domain while the search and TP004 used
2, and the decision-table fitting capped GB200 TP at its 4-GPU tray while the search allowed the 72-GPU rack.
"""

from __future__ import annotations

import pytest

from meshplan.arithmetic import mesh
from meshplan.arithmetic.comm import links
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.hardware import get_gpu, gpu_catalog
from meshplan.request.resolve import resolve
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search.space import Layout, within_nvlink


@pytest.mark.parametrize(("gpu", "per_node", "domain"), [
    ("h100", 8, 8),          # one node is one NVLink domain
    ("h100", 4, 4),          # a smaller node ends the domain
    ("h100-pcie", 8, 2),     # PCIe cards are NVLink-bridged in pairs
    ("gb200", 4, 72),        # NVL72 spans 18 four-GPU trays
    ("a100-80gb", 8, 8),
])
def test_fast_domain(gpu, per_node, domain):
    assert mesh.fast_domain(get_gpu(gpu), per_node) == domain


def test_every_caller_sees_the_same_fast_domain():
    for gpu in gpu_catalog().values():
        job, _ = resolve(Request(model="llama-3.1-8b", gpu=gpu.key, num_gpus=gpu.gpus_per_node * 2))
        domain = mesh.fast_domain(gpu, job.gpus_per_node)
        assert links(gpu, job.gpus_per_node, calibration(job.framework)).domain == domain, gpu.key
        for tp in (1, 2, 4, 8, 16, 32, 64):
            assert within_nvlink(job, Layout(tp=tp, pp=1, cp=1, ep=1, etp=1, dp=1)) == (tp <= domain), (gpu.key, tp)


@pytest.mark.parametrize(("law", "plan", "world"), [
    ("megatron", Plan(tp=2, pp=4, cp=2, dp=8, ep=16), 128),        # EP folds into dp*cp
    ("torchtitan", Plan(tp=2, pp=4, cp=2, dp=8, ep=16), 128),
    ("kempnerforge", Plan(tp=2, pp=1, cp=1, dp=4, ep=8), 64),        # EP ranks of its own
])
def test_world_size_laws(law, plan, world):
    assert mesh.world_size(law, plan) == world
    assert mesh.derived_dp(law, world, plan.tp, plan.pp, plan.cp, plan.ep) == plan.dp


def test_expert_grid_and_expert_dp():
    plan = Plan(tp=2, pp=8, ep=64, etp=1, dp=64)
    assert mesh.expert_dp(1024, plan) == 2.0                       # DeepSeek-V3 on 1,024: 1024 / (8*64*1)
    assert mesh.expert_grid_fits("megatron", 1024, 2, 8, 1, 64, 64, 1)
    assert not mesh.expert_grid_fits("megatron", 1024, 2, 8, 1, 64, 64, 4)   # 1024/8 = 128 is not a multiple of 256
    assert not mesh.expert_grid_fits("torchtitan", 96, 2, 1, 1, 48, 64, 1)  # ep must divide dp*cp*tp = 96
    assert mesh.expert_grid_fits("kempnerforge", 96, 2, 1, 1, 48, 64, 1)
    assert mesh.smallest_world("megatron", 2, 8, 1, 1, 64, 1) == 8 * 64
    assert mesh.smallest_world("kempnerforge", 2, 1, 1, 1, 8, 1) == 16


def test_groups_cross_domains_by_stride():
    assert not mesh.crosses_domains(8, 1, 8)        # TP8 in a node
    assert mesh.crosses_domains(16, 1, 8)           # TP16 needs two nodes
    assert mesh.crosses_domains(2, 8, 8)            # any group strided by a whole node leaves it
    assert mesh.per_domain(64, 2, 8) == 4           # EP64 over ETP2: four members per node
