"""The flex token dispatcher's memory-bound passes per backend (estimate/moe_time.dispatcher_passes,
cards/calibration.yaml flex_dispatch permute_passes): Megatron-Core's _DeepepManager permutes the tokens DeepEP
delivers into the local experts' order after the dispatch and unpermutes before the combine (4 passes over the routed
copies forward, 4 backward), and _HybridEPManager none, HybridEP's dispatch and combine kernels permuting as they copy;
the alltoall dispatcher keeps its permute, chunk sort, unsort and unpermute (moe_dispatch_passes, 16). Before
2026-12-06 every dispatcher ran the alltoall dispatcher's 16."""

from __future__ import annotations

import pytest

from meshplan.estimate.layer_time import elementwise_load
from meshplan.estimate.moe_time import dispatch_and_router_bytes, dispatcher_passes
from meshplan.estimate.perf import step_terms
from meshplan.knowledge.calibration import calibration, flex_permute_passes
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

# Qwen3-30B-A3B on 8 GPUs of one NVLink domain: DeepEP on H100 and B200 (8-GPU nodes), HybridEP on GB200, whose
# NVLink domain spans its 4-GPU trays (mesh.flex_backend)
LAYOUT = dict(model="qwen3-30b-a3b", framework="megatron-bridge", num_gpus=8, ep=8, seq_length=4096,
              micro_batch_size=1, global_batch_size=64)


def _context(gpu: str, dispatcher: str, **fields):
    job, plan = resolve(Request(gpu=gpu, moe_token_dispatcher=dispatcher, **{**LAYOUT, **fields}))
    return job, plan, step_terms(job, plan).ctx


def test_the_card_counts_each_backends_passes_from_its_manager():
    assert flex_permute_passes("deepep") == 8  # permute + unpermute, read and write each, forward and backward
    assert flex_permute_passes("hybridep") == 0  # fused into hybrid_ep_dispatch / hybrid_ep_combine
    assert calibration().moe_dispatch_passes == 16  # the alltoall dispatcher's, twice DeepEP's


@pytest.mark.parametrize("gpu,backend_passes", [("h100", 8), ("b200", 8), ("gb200", 0)])
def test_the_flex_dispatcher_moves_its_backends_passes_the_alltoall_its_own(gpu, backend_passes):
    _, _, alltoall = _context(gpu, "alltoall")
    job, plan, flex = _context(gpu, "flex")
    assert dispatcher_passes(job, plan) == backend_passes
    assert alltoall.dispatch_passes is None  # the card's moe_dispatch_passes
    flex_bytes, flex_router = dispatch_and_router_bytes(flex)
    alltoall_bytes, alltoall_router = dispatch_and_router_bytes(alltoall)
    assert flex_bytes == pytest.approx(alltoall_bytes * backend_passes / 16, rel=1e-12)
    assert flex_router == pytest.approx(alltoall_router, rel=1e-12)  # the router runs the same whatever dispatches
    assert elementwise_load(flex, True).dispatch_bytes == flex_bytes


def test_hybridep_runs_the_moe_layer_faster_by_the_passes_it_fuses():
    # the same plan on GB200 under each dispatcher: HybridEP's layer has no dispatcher passes, so its elementwise
    # time is the alltoall's less the 16 passes' seconds at the GPU's HBM bandwidth
    _, _, alltoall = _context("gb200", "alltoall")
    _, _, flex = _context("gb200", "flex")
    passes_seconds = dispatch_and_router_bytes(alltoall)[0] / alltoall.hbm
    from_alltoall = elementwise_load(alltoall, True)
    from_flex = elementwise_load(flex, True)
    assert from_flex.dispatch_bytes == 0.0
    assert (from_alltoall.dispatch_bytes - from_flex.dispatch_bytes) / flex.hbm == pytest.approx(passes_seconds)


def test_flex_passes_run_over_every_copy_the_expert_tp_group_receives():
    # MoEFlexTokenDispatcher sends each copy to every rank of the expert-TP group (top_k and the experts times the tp
    # size): under etp 2 a rank permutes twice the copies, all its passes (not the alltoall's sort half alone)
    one = dispatch_and_router_bytes(_context("h100", "flex", tp=2, ep=4, etp=1)[2])[0]
    two = dispatch_and_router_bytes(_context("h100", "flex", tp=2, ep=4, etp=2)[2])[0]
    assert one > 0
    assert two == pytest.approx(2 * one, rel=1e-12)


def test_a_dispatcher_of_another_framework_keeps_the_alltoall_count():
    job, plan = resolve(Request(gpu="h100", framework="torchtitan", model="qwen3-30b-a3b", num_gpus=8, ep=8,
                                seq_length=4096, micro_batch_size=1, global_batch_size=64))
    assert dispatcher_passes(job, plan) is None
