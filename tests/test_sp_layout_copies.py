"""torchtitan's sequence-parallel TP through torch's functional collectives (cards/frameworks/torchtitan.yaml
tp_overlap.sp_layout_copies, async_tp_input_grads): each unfused all-gather and reduce-scatter on the sequence dim
copies the whole activation once more (tp_overlap.sp_copies, sp_copy_counts), and async TP leaves the backward
reduce-scatter of an input gradient that sums several linears' data gradients unfused (async_tp_unfused)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.estimate import perf
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.layer_time import layer_gemms
from meshplan.estimate.tp_overlap import exposed_tp, sp_copy_counts, tp_hidden
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _ctx(version: str | None = "0.1", micro: int = 2, overlap: bool = False, **kw):
    req = Request(framework="torchtitan", framework_version=version, model="llama-3.1-8b", gpu="h100", num_gpus=64,
                  tp=8, pp=1, micro_batch_size=micro, global_batch_size=8 * micro, seq_length=8192,
                  torch_compile=True, tp_comm_overlap=overlap, **kw)
    job, plan = resolve(req)
    return perf._step_context(job, plan, calibration())[2]


def test_card_copies_by_release_and_micro_batch():
    copies = framework_card("torchtitan").tp_overlap.sp_layout_copies
    assert copies.copies("0.1.0", 1) == (1.0, 1.0)  # torch before the micro-batch-1 view: both copy
    assert copies.copies("0.2.2", 1) == (0.0, 1.0)  # the all-gather's result a view, the reduce-scatter's cat stays
    assert copies.copies("0.2.2", 4) == (1.0, 1.0)
    assert copies.copies("0.3.0", 4) == (0.0, 0.0)  # 0.3.0's sharding not read: nothing counted
    assert copies.copies(None, 4) == (0.0, 0.0)


def test_copy_counts_per_collective():
    # two pairs, one collective per side each way: 2 gathers + 2 scatters forward, the same backward
    assert sp_copy_counts(((1, 1), (1, 1)), (1.0, 1.0)) == (4.0, 4.0)
    assert sp_copy_counts(((1, 1), (1, 1)), (0.0, 1.0)) == (2.0, 2.0)
    # KempnerForge-like per-linear gradients: 3 and 2 reduce-scatters backward
    assert sp_copy_counts(((1, 3), (1, 2)), (1.0, 1.0)) == (4.0, 7.0)
    # under async TP only the unfused input-gradient reduce-scatters copy
    assert sp_copy_counts(((1, 1), (1, 1)), (1.0, 1.0), (True, False)) == (0.0, 1.0)
    assert sp_copy_counts(((1, 1), (1, 1)), (1.0, 1.0), (False, False)) == (0.0, 0.0)


def test_vanilla_tp_pays_eight_copies_per_layer():
    ctx = _ctx()
    assert ctx.sp_copies == (1.0, 1.0) and ctx.tp_overlap_mode == "none"
    gemms = layer_gemms(ctx, False)
    with_copies, share = exposed_tp(ctx, gemms, False)
    without, plain_share = exposed_tp(replace(ctx, sp_copies=(0.0, 0.0)), gemms, False)
    act = ctx.shard.tokens * ctx.arch.hidden_size * BF16
    assert with_copies - without == pytest.approx(8 * 2 * act / ctx.hbm)  # 4 gathers + 4 scatters, read + write
    assert share == pytest.approx(plain_share) == pytest.approx(0.5)  # half of them in the forward


def test_micro_batch_one_and_unread_release():
    assert _ctx("0.2", micro=1).sp_copies == (0.0, 1.0)
    assert _ctx("0.1", micro=1).sp_copies == (1.0, 1.0)
    assert _ctx("0.3.0").sp_copies == (0.0, 0.0)
    assert _ctx(sequence_parallel=False).sp_copies == (0.0, 0.0)


def test_async_tp_leaves_summed_input_gradients_unfused():
    ctx = _ctx(overlap=True)
    assert ctx.tp_overlap_mode == "async_tp"
    assert ctx.async_tp_unfused == (True, True)  # wq, wk, wv and w1, w3: sums of data gradients
    assert _ctx("0.3.0", overlap=True).async_tp_unfused == (False, True)  # 0.3.0's fused wqkv: one matmul
    assert _ctx().async_tp_unfused == (False, False)  # no switch, nothing fused
    # the unfused dgrad reduce-scatter hides nothing beside its GEMM
    pairs = [(1e-3, 1e-3), (4e-3, 2e-3)]
    one, ag = 2e-3, 7 / 8
    fused = tp_hidden("async_tp", one, pairs, 8)
    assert fused - tp_hidden("async_tp", one, pairs, 8, unfused=(True, False)) == pytest.approx(ag * 1e-3)
    assert fused - tp_hidden("async_tp", one, pairs, 8, unfused=(True, True)) == pytest.approx(ag * (1e-3 + 2e-3))


def test_async_tp_exposes_the_unfused_scatters_and_their_copies():
    ctx = _ctx(overlap=True)
    gemms = layer_gemms(ctx, False)
    unfused, _ = exposed_tp(ctx, gemms, False)
    fused, _ = exposed_tp(replace(ctx, async_tp_unfused=(False, False), sp_copies=(0.0, 0.0)), gemms, False)
    plain, _ = exposed_tp(replace(ctx, tp_overlap_mode="none", async_tp_unfused=(False, False)), gemms, False)
    assert fused < unfused < plain  # still faster than vanilla TP, slower than every collective fused
