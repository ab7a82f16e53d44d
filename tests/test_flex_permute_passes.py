"""The flex token dispatcher's memory-bound passes per backend (estimate/moe_time.dispatcher_passes,
cards/calibration.yaml flex_dispatch permute_passes): Megatron-Core's _DeepepManager permutes the tokens DeepEP
delivers into the local experts' order after the dispatch and unpermutes before the combine (4 passes over the routed
copies forward, 4 backward), and _HybridEPManager none, HybridEP's dispatch and combine kernels permuting as they copy;
the alltoall dispatcher keeps its permute, chunk sort, unsort and unpermute (moe_dispatch_passes, 16), the sort and
unsort only with more than one local expert (MoEAlltoAllTokenDispatcher: `if self.num_local_experts > 1`). Before
2026-12-06 every dispatcher ran the alltoall dispatcher's 16."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.estimate.layer_records import DispatchPasses
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
    assert dispatcher_passes(job, plan, calibration(job.framework)) == DispatchPasses(0.0, backend_passes)
    assert alltoall.dispatch_passes == DispatchPasses(8.0, 8.0)  # moe_dispatch_passes: 16 experts a rank, both halves
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
    assert dispatcher_passes(job, plan, calibration(job.framework)) is None


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex"])
def test_the_alltoall_dispatcher_skips_its_chunk_sort_with_one_local_expert(dispatcher):
    # Megatron-Core core_v0.19.0 token_dispatcher.py MoEAlltoAllTokenDispatcher.dispatch_postprocess and
    # combine_preprocess run sort_chunks_by_idxs only `if self.num_local_experts > 1`: Qwen3-30B-A3B's 128 experts
    # over ep 128 leave one a rank, so its dispatcher runs the permute and unpermute alone, half the count; at ep 64
    # (two a rank) it runs all 16. The flex dispatcher's count is its backend's either way.
    cal = calibration("megatron-bridge")
    fields = dict(LAYOUT, num_gpus=128, global_batch_size=128)
    one = resolve(Request(gpu="h100", moe_token_dispatcher=dispatcher, **{**fields, "ep": 128}))
    two = resolve(Request(gpu="h100", moe_token_dispatcher=dispatcher, **{**fields, "ep": 64}))
    if dispatcher == "flex":
        assert dispatcher_passes(*one, cal) == dispatcher_passes(*two, cal) == DispatchPasses(0.0, 8.0)
        return
    assert dispatcher_passes(*one, cal) == DispatchPasses(cal.moe_dispatch_passes / 2, 0.0)
    assert dispatcher_passes(*two, cal) == DispatchPasses(cal.moe_dispatch_passes / 2, cal.moe_dispatch_passes / 2)
    ctx = step_terms(*one).ctx
    routed_bytes = dispatch_and_router_bytes(ctx)[0]
    both_halves = dispatch_and_router_bytes(replace(ctx, dispatch_passes=None))[0]
    assert routed_bytes == pytest.approx(both_halves / 2, rel=1e-12)  # etp 1: the skipped half is half the bytes
