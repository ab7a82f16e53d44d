"""Blackwell Ultra (B300 in HGX/DGX B300 nodes, GB300 in NVL72 racks) as catalog parts: the figures the card states
for them, and the rules that name a GPU generation, a domain or a recipe treating them as the card says (the
Blackwell family's FP8 recipes, GB300's rack-wide NVLink domain placed in segments and dispatched by HybridEP, B300's
8-GPU node by DeepEP); the bench maps a row's "GB300-288GB" / "B300-288GB" onto them.

A test of the bench itself where it reads rows: it imports the bench's modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.arithmetic import mesh
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.estimate.attention_time import attention_efficiency, attention_kernel
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import resolve
from meshplan.rules.precision import runnable_recipes
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_rows as prow

MIB = 2**20


def test_the_parts_are_in_the_catalog_as_their_datasheets_state():
    b300, gb300, b200, gb200 = (get_gpu(k) for k in ("b300", "gb300", "b200", "gb200"))
    # nvidia-smi totals: 275040 MiB (B300 SXM6 AC), 284208 MiB (GB300), of the 288 GB of HBM3e both are sold with
    assert (b300.memory_bytes, gb300.memory_bytes) == (275040 * MIB, 284208 * MIB)
    # dense peaks: the HGX part B200's, the NVL72 part GB200's (Blackwell Ultra raised FP4, not BF16 / FP8)
    assert (b300.bf16_flops, b300.fp8_flops) == (b200.bf16_flops, b200.fp8_flops) == (2.25e15, 4.5e15)
    assert (gb300.bf16_flops, gb300.fp8_flops) == (gb200.bf16_flops, gb200.fp8_flops) == (2.5e15, 5.0e15)
    for part in (b300, gb300):
        assert part.arch == "blackwell" and part.fp8_any_layout and part.sources
        assert part.intra_node_bandwidth == 900e9 and part.hbm_bandwidth == 8.0e12
        assert part.network_bandwidth == 100e9  # one ConnectX-8 at 800 Gb/s per GPU, twice ConnectX-7's
    assert (b300.nvlink_domain, b300.gpus_per_node) == (8, 8)
    assert (gb300.nvlink_domain, gb300.gpus_per_node) == (72, 4)
    assert gb300.host_bandwidth == gb200.host_bandwidth == 225e9  # NVLink-C2C, one Grace per two GPUs
    assert b300.host_bandwidth == 64e9  # the host's PCIe Gen5 x16
    assert (b300.sm_count, gb300.sm_count) == (148, 152)
    for alias, key in (("GB300-NVL72", "gb300"), ("gb300_288gb", "gb300"), ("DGX-B300", "b300"), ("hgx-b300", "b300")):
        assert get_gpu(alias).key == key
    with pytest.raises(MeshplanError, match="gb300"):
        get_gpu("gb3000")


@pytest.mark.parametrize("gpu", ["b300", "gb300"])
def test_the_blackwell_recipes_run_there(gpu):
    """mxfp8 is Blackwell's (TE: compute capability 10.x), so PR003 passes it on both parts, as on B200, and
    refuses it on H100."""
    job, plan = resolve(Request(model="llama-3.1-8b", gpu=gpu, num_gpus=8, precision="fp8", fp8_recipe="mxfp8",
                                framework="megatron-bridge"))
    assert plan.fp8_recipe == "mxfp8"
    assert "mxfp8" in runnable_recipes(job.card, job.gpu) == runnable_recipes(job.card, get_gpu("b200"))
    assert "mxfp8" not in runnable_recipes(job.card, get_gpu("h100"))


@pytest.mark.parametrize("gpu", ["b300", "gb300"])
def test_the_attention_kernel_is_the_blackwell_one(gpu):
    """A framework release that picks its attention kernel by generation (torchtitan 0.1: FlashAttention-2, cuDNN on
    Blackwell) picks B200's on both parts, at B200's fraction of peak."""
    kernels = {}
    for part in (gpu, "b200", "h100"):
        job, _ = resolve(Request(model="llama-3.1-8b", framework="torchtitan", framework_version="0.1.0", gpu=part,
                                 num_gpus=8))
        kernels[part] = (attention_kernel(job), attention_efficiency(job, calibration(job.framework))[1])
    assert kernels[gpu] == kernels["b200"] and kernels[gpu][0] == "cudnn" and kernels["h100"][0] == "flash_attn_2"


def test_the_rack_domain_and_its_dispatcher():
    gb300, b300 = get_gpu("gb300"), get_gpu("b300")
    assert mesh.fast_domain(gb300, 4) == 72 and mesh.fast_domain(b300, 8) == 8
    assert mesh.flex_backend(gb300, 4) == "hybridep" and mesh.flex_backend(b300, 8) == "deepep"
    # 256 GPUs = 64 trays: segments of 16 trays (64 GPUs) inside a rack, as on GB200
    assert mesh.segment_domain(gb300, 4, 256) == mesh.segment_domain(get_gpu("gb200"), 4, 256) == 64
    assert mesh.segment_domain(b300, 8, 256) is None


def _tokens(gpu: str, **fields) -> float:
    job, plan = resolve(Request(model="llama-3.1-70b", gpu=gpu, framework="megatron-bridge", precision="fp8",
                                micro_batch_size=1, global_batch_size=256, seq_length=8192, **fields))
    return estimate_throughput(job, plan).tokens_per_s_per_gpu


def test_a_70b_plan_is_timed_from_the_parts_figures():
    """Inside one NVL72 rack GB300 differs from GB200 in no term a TP1 plan uses (same dense peaks, NVLink, C2C; the
    HBM only in capacity) but its SM count: the DP collectives' 32 NCCL CTAs beside the compute hold 32 of its 152
    SMs, of GB200's 148 (comm.ring_sm_share), so the time is the same within that; across B300 nodes the ConnectX-8
    network and the faster HBM make the same plan faster than on B200."""
    rack = dict(num_gpus=64, tp=1, pp=4, vpp=5)
    gb300, gb200 = _tokens("gb300", **rack), _tokens("gb200", **rack)
    assert gb300 > gb200
    assert gb300 == pytest.approx(gb200, rel=1e-3)
    nodes = dict(num_gpus=32, tp=8, pp=1)  # DP 4 across four 8-GPU nodes
    assert _tokens("b300", **nodes) > _tokens("b200", **nodes)


def test_the_bench_reads_the_rows_gpu_onto_the_new_parts():
    """A row naming the part as its vendor does, capacity included, is that part, the fit judged against what
    nvidia-smi reports (the 288 GB stated is the HBM's full size); before the parts were in the catalog the GB300
    rows were scored on GB200 with a "gpu" knob."""
    assert prow.gpu_for({"gpu_type": "GB300-288GB (NVL72)", "gpu_memory_gb": 288}) == ("gb300", 284208 * MIB, {})
    assert prow.gpu_for({"gpu_type": "B300-288GB", "gpu_memory_gb": 288}) == ("b300", 275040 * MIB, {})
    # a capacity the catalog has no part for is still scored on the family's part, against the row's memory
    key, capacity, knobs = prow.gpu_for({"gpu_type": "B300-192GB", "gpu_memory_gb": 192})
    assert (key, capacity) == ("b300", 192 * GIB) and "gpu" in knobs


def test_the_mcp_server_lists_and_plans_them():
    """The MCP catalog resource lists both parts with the card's figures, and a served recommend on gb300 ranks a
    layout on it (the CLI's `meshplan recommend llama-3.1-70b --gpu gb300 --num-gpus 64` is the same api.recommend)."""
    import json

    from mcp_calls import call_tool

    from meshplan.faces.mcp.resources import hardware_catalog

    listed = {g["key"]: g for g in json.loads(hardware_catalog())}
    assert listed["gb300"]["nvlink_domain"] == 72 and listed["b300"]["memory_bytes"] == 275040 * MIB
    served = call_tool("recommend_parallelism", dict(model="llama-3.1-8b", gpu="gb300", num_gpus=8, seq_length=4096,
                                                     global_batch_size=64, top_k=1))
    assert not served.is_error, served.content[0].text
    answer = served.structured_content
    assert answer["candidates"]  # a layout ranked, fit judged against GB300's 284208 MiB less the 10% headroom
    assert f"{284208 * MIB * 0.9 / GIB:.1f}" in " ".join(answer["assumptions"])
