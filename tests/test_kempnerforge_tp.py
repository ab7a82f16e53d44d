"""KempnerForge's tensor parallelism as its source runs it (cards/frameworks/kempnerforge.yaml tp_overlap,
tp_input_linears; estimate/tp_overlap.py): torch DTensor styles with no async TP, so every TP collective is exposed,
and a ColwiseParallel of its own on each of q, k, v and gate, up, so each gathers the block's input in the forward
(one gather under torch.compile) and reduces its own share of the input gradient in the backward."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.arithmetic.comm import links, ring_time
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.layer_time import layer_time
from meshplan.estimate.perf import _peaks, layer_context
from meshplan.estimate.recompute import recompute_time
from meshplan.estimate.tp_overlap import tp_input_ops, tp_ring_passes
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

DENSE = dict(model="llama-3-8b", gpu="h200", num_gpus=12, gpus_per_node=4, seq_length=4096, global_batch_size=96,
             micro_batch_size=4, tp=4, recompute="full")


def _layer(framework: str, **over):
    job, plan = resolve(Request(framework=framework, **(DENSE | over)))
    cal = calibration(framework)
    ctx = layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), _peaks(job, cal), 4, None)
    return plan, ctx, layer_time(ctx, False)


def _one_pass(ctx) -> float:
    groups = mesh_groups(ctx.plan, law=ctx.law)
    return ring_time(ctx.shard.tokens * ctx.arch.hidden_size * BF16, groups.tp.size, groups.tp.stride, ctx.lk)


def test_ring_passes_per_pair():
    """One gather/reduce per side each way is Korthikanti et al.'s 4 passes per pair, with or without SP; KempnerForge's
    per-linear plan as the torch 2.11 probe counted it (card source): SP eager 7 + 7, compiled 4 + 7, no SP
    2 all-reduces forward and 5 backward (4 + 10 passes), attention's pair alone 2 + 6 (1 all-reduce + 3)."""
    assert tp_ring_passes(((1, 1), (1, 1)), True, 2) == (4.0, 4.0)
    assert tp_ring_passes(((1, 1), (1, 1)), False, 2) == (4.0, 4.0)
    facts = framework_card("kempnerforge").tp_input_linears
    assert facts is not None
    arch = _layer("kempnerforge")[1].arch
    assert tp_ring_passes(tp_input_ops(facts, arch, eager=True), True, 2) == (7.0, 7.0)
    assert tp_ring_passes(tp_input_ops(facts, arch, eager=False), True, 2) == (4.0, 7.0)
    assert tp_ring_passes(tp_input_ops(facts, arch, eager=False), False, 2) == (4.0, 10.0)
    assert tp_ring_passes(tp_input_ops(facts, arch, eager=True), False, 1) == (2.0, 6.0)
    assert tp_input_ops(None, arch, eager=True) == ((1, 1), (1, 1))


def test_kempnerforge_tp_is_all_exposed_and_per_linear():
    """Compiled (its default) with SP: 11 ring passes of the layer's activations, none hidden (tp_overlap base none,
    not the calibration's 0.5 fraction), 4 of them forward: what full recompute runs again."""
    plan, ctx, lt = _layer("kempnerforge")
    assert plan.sequence_parallel and plan.torch_compile and ctx.tp_overlap_mode == "none"
    one = _one_pass(ctx)
    assert lt.tp == pytest.approx(11 * one)
    assert lt.tp_fwd == pytest.approx(4 * one)
    assert recompute_time(lt, "full", ctx.cal) == pytest.approx(
        lt.fwd_compute + lt.overhead * ctx.cal.forward_share_of_layer_overhead + 4 * one)
    _, _, elt = _layer("kempnerforge", torch_compile=False)
    assert elt.tp == pytest.approx(14 * one) and elt.tp_fwd == pytest.approx(7 * one)


def test_other_frameworks_keep_half_forward():
    """A framework without tp_input_linears keeps 8 passes a dense layer and half of its exposed TP forward."""
    _, ctx, lt = _layer("torchtitan")
    assert ctx.tp_input_ops == ((1, 1), (1, 1))
    assert lt.tp == pytest.approx(8 * _one_pass(ctx))
    assert lt.tp_fwd == lt.tp / 2


def test_output_head_whole_without_sequence_parallelism():
    """The head is ColwiseParallel(output_layouts=Replicate()) only under SP (tensor_parallel.py): with SP the GEMM
    runs over the vocabulary's TP shard, its logits are all-gathered and the loss reads all of them on each TP rank;
    without (pipeline stages) the whole head is on each rank, its whole GEMM, no gather. Its parameters likewise."""
    from meshplan.arithmetic.flops import logits_gemm
    from meshplan.arithmetic.gemm import gemm_seconds
    from meshplan.estimate.memory import memory_terms
    from meshplan.estimate.memory_terms import stage_params
    from meshplan.estimate.perf import head_seconds

    plan, ctx, _ = _layer("kempnerforge")
    job = resolve(Request(framework="kempnerforge", **DENSE))[0]
    arch, cal = ctx.arch, ctx.cal
    loss = cal.cross_entropy_bytes_per_logit * ctx.shard.tokens * arch.vocab_size / ctx.hbm
    gather = ring_time(ctx.shard.tokens * arch.vocab_size * BF16, 4, 1, ctx.lk)
    gemm = gemm_seconds([logits_gemm(arch, ctx.shard, arch.vocab_size)], cal, ctx.bf16_peak, None)
    assert head_seconds(job, plan, ctx) == pytest.approx(gemm + loss + gather)
    pp = dict(DENSE, model="llama-3-70b", num_gpus=32, global_batch_size=8, micro_batch_size=1, pp=4)
    pjob, pplan = resolve(Request(framework="kempnerforge", **pp))
    _, pctx, _ = _layer("kempnerforge", **pp)
    head_gemm = logits_gemm(pctx.arch, dataclasses.replace(pctx.shard, tp=1), pctx.arch.vocab_size)
    whole = gemm_seconds([head_gemm], cal, pctx.bf16_peak, None)
    ploss = cal.cross_entropy_bytes_per_logit * pctx.shard.tokens * pctx.arch.vocab_size / pctx.hbm
    assert head_seconds(pjob, pplan, pctx) == pytest.approx(whole + ploss)
    terms = memory_terms(pjob, pplan, [])
    last = terms.pipeline.head_rank
    assert stage_params(terms, last, [terms.pipeline.layers(last)]).head == terms.vocab * pctx.arch.hidden_size
    tjob, tplan = resolve(Request(framework="torchtitan", **DENSE))
    _, tctx, _ = _layer("torchtitan")
    tloss = tctx.cal.cross_entropy_bytes_per_logit * tctx.shard.tokens * tctx.arch.vocab_size / 4 / tctx.hbm
    assert head_seconds(tjob, tplan, tctx) == pytest.approx(
        gemm_seconds([logits_gemm(tctx.arch, tctx.shard, tctx.arch.vocab_size)], tctx.cal, tctx.bf16_peak, None)
        + tloss)
