"""Tensor parallelism's exposed traffic per layer: its collectives, what each framework's overlap mode hides
beside the GEMMs (tp_hidden), what that overlap costs the GEMMs (the SMs userbuffers kernels hold: slowed_gemm;
torch async TP's work outside its pipelines: async_tp_cost, chunked_gemm_extra)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.arithmetic.comm import hidden_beside, ring_sm_share, ring_time
from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_seconds, gemm_terms, summed
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_records import BF16, FORWARD_AND_BACKWARD, LayerContext, TpSms
from meshplan.knowledge.calibration import Calibration
from meshplan.knowledge.cards import FrameworkCard, TpOverlapFacts
from meshplan.knowledge.tp_card import TpInputLinears
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Plan

# Sequence-parallel TP: an all-gather before and a reduce-scatter after attention and after the MLP, 4 ring
# passes forward and 4 backward (Korthikanti et al. 2022, section 4.2.2; without SP, 2 all-reduces per pass
# move the same bytes).
TP_COLLECTIVES_PER_LAYER = 8.0
# A layer of routed experts only (no shared expert) keeps attention's pair, forward and backward: the experts
# take the sequence-sharded tokens straight into the all-to-all.
TP_COLLECTIVES_ATTENTION_ONLY = 4.0
# Expert TP: an all-gather before and a reduce-scatter after the experts, forward and backward.
EXPERT_TP_COLLECTIVES_PER_LAYER = 4.0
# torch's micro-pipelined TP (pytorch/pytorch torch/distributed/_symmetric_memory/__init__.py): symm_mem.barrier
# calls on the compute stream outside the pipeline, per fused op. All-gather + matmul
# (_pipelined_multi_all_gather_and_consume): barrier(channel=0) on entry, barrier(channel=1) after the local shard's
# copy, barrier(channel=0) on exit. Matmul + reduce-scatter (_pipelined_produce_and_all2all): barrier(channel=0) on
# entry and on exit (the two per step run in the pipeline, beside the other stream's chunk GEMM).
ASYNC_TP_AG_BARRIERS = 3.0
ASYNC_TP_RS_BARRIERS = 2.0
# The GEMMs that read a sequence-parallel all-gather's output (the input side of a TP pair) and the GEMM whose
# output is reduce-scattered (its output side): attention's (a hybrid's Mamba-2 layer's in_proj and out_proj in its
# place: one mixer per layer), then the dense or shared-expert MLP's.
TP_PAIR_GEMMS = ((("qkv", "q_proj", "q_down", "kv_down", "mamba_in_proj"), ("attn_out", "mamba_out_proj")),
                 (("mlp_fc1", "shared_expert_fc1"), ("mlp_fc2", "shared_expert_fc2")))


def tp_overlap_mode(card: FrameworkCard, plan: Plan) -> str:
    """Which TP collectives the plan runs beside a GEMM: its framework's switch mode when tp_comm_overlap is on,
    else the framework's base mode (the card's tp_overlap)."""
    facts = card.tp_overlap
    return facts.switch if plan.tp_comm_overlap and facts.switch else facts.base


def sp_copies(facts: TpOverlapFacts, plan: Plan, release: str | None) -> tuple[float, float]:
    """(copies per all-gather, per reduce-scatter) of the plan's sequence-parallel TP collectives that run unfused
    (every one without the overlap switch; under async TP the reduce-scatters it cannot fuse, async_tp_unfused):
    where the card's TP plan shards activations on the sequence dim, torch's functional collectives re-lay each one's
    result out with a copy of the whole activation (SpLayoutCopies); (0, 0) without sequence parallelism, TP or such
    a card."""
    copies = facts.sp_layout_copies
    if copies is None or plan.tp <= 1 or not plan.sequence_parallel:
        return 0.0, 0.0
    return copies.copies(release, plan.micro_batch_size)


def async_tp_unfused(facts: TpOverlapFacts, mode: str, qkv_separate: bool, gated: bool) -> tuple[bool, bool]:
    """Per TP pair (attention's, the MLP's), whether async TP leaves the backward reduce-scatter of its input
    gradient unfused (AsyncTpInputGrads: that gradient sums several linears' data gradients): attention's where Q, K
    and V are separate linears, a gated MLP's where gate and up are; (False, False) in any other mode."""
    grads = facts.async_tp_input_grads
    if mode != "async_tp" or grads is None:
        return False, False
    return qkv_separate, gated and grads.gate_up_separate


def sp_copy_counts(input_ops: tuple[tuple[int, int], ...], copies: tuple[float, float],
                   unfused: tuple[bool, ...] | None = None) -> tuple[float, float]:
    """(forward, backward) activation copies of a layer's TP pairs (`input_ops`: tp_input_ops' per pair) at `copies`
    per all-gather and per reduce-scatter (sp_copies): per pair forward, the input's gathers and the output's
    reduce-scatter; backward, the output gradient's gather and the input gradients' reduce-scatters. `unfused`: under
    async TP, per pair whether its input gradients' reduce-scatters run unfused, the only collectives that copy there
    (None: every collective runs unfused)."""
    gather, scatter = copies
    fwd = bwd = 0.0
    for k, (f_in, b_in) in enumerate(input_ops):
        if unfused is None:
            fwd += f_in * gather + scatter
            bwd += gather + b_in * scatter
        elif unfused[k]:
            bwd += b_in * scatter
    return fwd, bwd


def tp_sms(gpu: GpuSpec, facts: TpOverlapFacts, fp8: bool = False) -> TpSms | None:
    """The job's TpSms (`fp8`: its GEMMs run in FP8), or None where the GPU's SM count is unknown or no overlap kernel
    holds SMs."""
    fprop = facts.fp8_fprop_rs_sms if fp8 and facts.fp8_fprop_rs_sms is not None else facts.fprop_rs_sms
    if gpu.sm_count is None or not any(fprop + facts.wgrad_rs_sms):
        return None
    return TpSms(gpu.sm_count, fprop, facts.wgrad_rs_sms, facts.wgrad_rs_sm_margin)


def moe_layer_tp_ops(arch: Architecture, moe_whole: bool) -> float:
    """TP collectives of an MoE layer: attention's pair alone where the block has no TP-sharded weight (routed
    experts only, or TP leaves the block whole: the card's moe_tp), else the attention's and the shared experts'."""
    if arch.moe is not None and (not arch.moe.shared_expert_ffn_hidden_size or moe_whole):
        return TP_COLLECTIVES_ATTENTION_ONLY
    return TP_COLLECTIVES_PER_LAYER


def tp_input_ops(facts: TpInputLinears | None, arch: Architecture, eager: bool) -> tuple[tuple[int, int], ...]:
    """(forward, backward) collectives on the input side of the attention's and the MLP's TP pair: one each way where
    the framework reaches a pair's column-parallel linears through one redistribution (no tp_input_linears), else one
    per such linear each way, but one forward where the blocks are compiled and the compiler merges the gathers of
    the one input (the card's compile_merges_gathers; `eager`: blocks run uncompiled)."""
    if facts is None:
        return ((1, 1), (1, 1))
    mlp = facts.gated_mlp if arch.gated_mlp else facts.mlp
    merged = facts.compile_merges_gathers and not eager
    return ((1 if merged else facts.attention, facts.attention), (1 if merged else mlp, mlp))


def tp_ring_passes(input_ops: tuple[tuple[int, int], ...], sp: bool, pairs: int,
                   input_regather: bool = False) -> tuple[float, float]:
    """(forward, backward) ring passes of a layer's first `pairs` TP pairs, each one all-gather or reduce-scatter of
    the layer's activations (an all-reduce is two). With sequence parallelism, per pair: the input's gathers and the
    row-parallel output's reduce-scatter forward; the output gradient's gather and the input gradients' reduce-scatters
    backward, and the input's gather again where the column-parallel linear kept only its shard for the weight
    gradient (`input_regather`: the card's tp_overlap.backward_input_gather). Without: the output's all-reduce forward
    (the input is already whole on every rank), the input gradients' all-reduces backward. One collective per side
    each way (tp_input_ops' default) gives 2 + 2 passes per pair, Korthikanti et al.'s 4 (TP_COLLECTIVES_PER_LAYER for
    two pairs)."""
    fwd = bwd = 0.0
    for f_in, b_in in input_ops[:pairs]:
        if sp:
            fwd += f_in + 1.0
            bwd += 1.0 + b_in + (1.0 if input_regather else 0.0)
        else:
            fwd += 2.0
            bwd += 2.0 * b_in
    return fwd, bwd


def exposed_tp(ctx: LayerContext, gemms: list[Gemm], moe: bool, terms: list[float] | None = None,
               pairs: tuple[int, ...] | None = None) -> tuple[float, float]:
    """(exposed TP seconds of one layer per micro-batch, forward + backward; their forward share). Its TP pairs'
    ring passes (tp_ring_passes: attention's and the MLP's, attention's alone in an MoE layer without TP-sharded
    weights, moe_layer_tp_ops), expert TP's pair around the experts; less what the framework's overlap mode hides (a
    calibrated fraction, or tp_hidden beside the GEMMs), plus async TP's work outside its pipelines (`terms`: the
    GEMMs' gemm_terms, where the caller has them), plus the copies torch's functional collectives make around each
    unfused sequence-parallel collective (ctx.sp_copies, sp_copy_counts: each reads and writes the activation at the
    HBM bandwidth elementwise work gets). The forward share is the forward's passes and copies over all of them (what
    full recompute runs again). `pairs`: the indexes in TP_PAIR_GEMMS of the pairs a hybrid model's layer runs (one
    mixer each: hybrid_time.layer_pairs); None: a transformer layer's."""
    arch, plan, cal = ctx.arch, ctx.plan, ctx.cal
    act_bytes = ctx.shard.tokens * arch.hidden_size * BF16
    if pairs is None:
        attention_only = moe and moe_layer_tp_ops(arch, ctx.shard.moe_whole) == TP_COLLECTIVES_ATTENTION_ONLY
        at: tuple[int, ...] = (0,) if attention_only else (0, 1)
    else:
        at = pairs
    run = tuple(ctx.tp_input_ops[i] for i in at)
    async_tp = ctx.tp_overlap_mode == "async_tp" and plan.tp > 1 and plan.sequence_parallel
    unfused = tuple(ctx.async_tp_unfused[i] for i in at) if async_tp else None
    fwd, bwd = tp_ring_passes(run, plan.sequence_parallel, len(run), ctx.tp_input_regather)
    share = fwd / (fwd + bwd) if fwd + bwd else 0.5
    groups = mesh_groups(plan, law=ctx.law)
    tp_one = ring_time(act_bytes, groups.tp.size, groups.tp.stride, ctx.lk)
    tp_comm = (fwd + bwd) * tp_one
    copies = 0.0
    copy_fwd, copy_bwd = sp_copy_counts(run, ctx.sp_copies, unfused) if plan.tp > 1 else (0.0, 0.0)
    if copy_fwd + copy_bwd:  # each copy reads and writes the whole activation on the compute stream, beside no kernel
        one_copy = 2.0 * act_bytes / ctx.hbm
        copies = (copy_fwd + copy_bwd) * one_copy
        share = (fwd * tp_one + copy_fwd * one_copy) / (tp_comm + copies)
    if moe and plan.etp > 1:
        tp_comm += EXPERT_TP_COLLECTIVES_PER_LAYER * ring_time(act_bytes, groups.etp.size, groups.etp.stride, ctx.lk)
    if ctx.tp_overlap_mode == "fraction":
        return (1.0 - cal.tp_overlap) * tp_comm + copies, share
    # the expert-TP gathers run in the token dispatcher, beside no GEMM
    gemm_pairs = tp_pairs(gemms, cal, ctx, moe, terms)
    if pairs is not None:  # a hybrid layer's: the pairs it runs, each at its own index (the SMs the card gives it)
        gemm_pairs = [p if i in pairs else (0.0, 0.0) for i, p in enumerate(gemm_pairs)]
    exposed = tp_comm + copies - tp_hidden(ctx.tp_overlap_mode, tp_one, gemm_pairs, plan.tp,
                                           plan.sequence_parallel, ctx.tp_rs_splits, ctx.tp_sms,
                                           ctx.async_tp_unfused, ctx.tp_input_regather,
                                           ring_sm_share(groups.tp.size, groups.tp.stride, ctx.lk))
    if async_tp:
        exposed += async_tp_cost(act_bytes, plan.tp, len(gemm_pairs if pairs is None else pairs), ctx.hbm,
                                 ctx.lk.intra_lat,
                                 chunked_gemm_extra(gemms, cal, ctx, moe, plan.tp),
                                 sum(1 for u in unfused or () if u))
    return exposed, share


def tp_pairs(gemms: list[Gemm], cal: Calibration, ctx: LayerContext, moe: bool,
             terms: list[float] | None = None) -> list[tuple[float, float]]:
    """(input side, output side) forward GEMM seconds of each TP pair of the layer: attention's, and the MLP's
    where it has one (a dense MLP, or an MoE layer's shared expert: routed experts only keep attention's pair,
    TP_COLLECTIVES_ATTENTION_ONLY); `terms`: the GEMMs' gemm_terms, where the caller has them."""
    if terms is None:
        terms = gemm_terms(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)

    def fwd(names: tuple[str, ...]) -> float:
        return summed([t for g, t in zip(gemms, terms, strict=True) if g.name in names]) / TRAINING_PASSES_PER_FORWARD
    out = [(fwd(a), fwd(b)) for a, b in TP_PAIR_GEMMS]
    return out[:1] if moe and out[1] == (0.0, 0.0) else out


def slowed_gemm(gemm: float, comm: float, held: int, sms: int, margin: bool) -> float:
    """Seconds a GEMM of `gemm` seconds on all `sms` SMs takes beside a communication kernel that holds `held` of them
    for `comm` seconds. With margin (Transformer Engine's set_sm_margin) it is launched on the other sms - held for its
    whole time: gemm * sms / (sms - held). Without, it shares them while the kernel runs: that overlapped portion runs
    at (sms - held) / sms of the rate, so gemm + min(comm, gemm * sms / (sms - held)) * held / sms."""
    if held <= 0:
        return gemm
    if held >= sms:
        raise ValueError(f"a communication kernel holds {held} of the GPU's {sms} SMs")
    full = gemm * sms / (sms - held)
    return full if margin else gemm + min(comm, full) * held / sms


def tp_hidden(mode: str, one: float, pairs: list[tuple[float, float]], tp: int, sp: bool = True,
              rs_splits: int = 0, sms: TpSms | None = None, unfused: tuple[bool, ...] = (),
              input_regather: bool = False, nccl_share: float = 0.0) -> float:
    """TP seconds hidden per layer behind the GEMMs each collective runs beside (`one`: one all-gather or
    reduce-scatter of the layer's activations). Per pair, forward: an all-gather before the input GEMM, a
    reduce-scatter after the output GEMM; backward: the output GEMM's grad all-gather before its dgrad, the input
    GEMM's dgrad reduce-scatter, and where the input GEMM kept only its input's shard (`input_regather`,
    tp_ring_passes) the input's all-gather again (cards/frameworks/*.yaml tp_overlap).
    - none: every collective waits for, or is waited on by, its GEMM.
    - wgrad (Transformer Engine without userbuffers): the dgrad reduce-scatter runs beside the input GEMM's wgrad
      GEMM, hidden up to that GEMM's time (the backward's input re-gather beside dgrad is not counted either way).
    - local_shard (nanotron's asynchronous TP linears, Megatron-LM's pre-Transformer-Engine scheme with the local
      shard computed first): the forward all-gather runs beside the input GEMM's local shard, 1/tp of it, the rows
      the rank already holds; the output GEMM's reduce-scatter runs after it on the compute stream, exposed; the
      backward's gradient all-gather beside the output GEMM's local-shard dgrad (1/tp); the input's re-gather
      beside the input GEMM's dgrad and its dgrad reduce-scatter beside its wgrad, each up to that GEMM's time.
      Without sequence parallelism the input GEMM's dgrad all-reduce runs beside its wgrad, the forward all-reduce
      exposed.
    - userbuffers (TE tp_comm_overlap): the all-gathers are ring-exchanged in tp chunks, each chunk's GEMM beside the
      next chunk's transfer, so at most (tp-1)/tp of the GEMM hides them; the forward reduce-scatter is pipelined
      over rs_splits chunks (the first chunk's GEMM and the last chunk's transfer run alone: (n-1)/n of the
      shorter); the dgrad reduce-scatter runs in bulk beside the whole wgrad GEMM.
    - async_tp (torch micro-pipelined TP): both all-gathers chunked by tp as above, both reduce-scatters pipelined
      over tp chunks, the dgrad one with the dgrad GEMM that produces it, but not where Inductor cannot fuse it
      (`unfused`, per pair index: its input gradient sums several linears' dgrads, async_tp_unfused); what runs
      outside the pipelines is added by exposed_tp (async_tp_cost).
    Without sequence parallelism each pair is one all-reduce (two collectives' time) forward and one backward.
    With userbuffers the forward and the dgrad reduce-scatter are SM kernels (`sms`: the card's fprop_rs_sms and
    wgrad_rs_sms) and the GEMM beside each runs on the SMs left (slowed_gemm): the time hidden is counted against the
    slowed GEMM and the GEMM's lost time is taken off it, so an overlap can cost more than it hides. The all-gathers
    (ring exchange) and async TP's copies run on copy engines and hold no SMs; their share of HBM bandwidth is not
    modelled. The wgrad and local_shard modes' collectives are NCCL's, holding `nccl_share` of the SMs (the TP group's
    comm.ring_sm_share) beside the GEMM that hides them: each hides comm.hidden_beside of its seconds."""
    if mode == "none" or tp <= 1:
        return 0.0
    ag = (tp - 1) / tp
    hidden = 0.0
    for i, (into, out) in enumerate(pairs):
        if mode in ("wgrad", "local_shard"):  # NCCL's kernels beside the GEMMs
            # beside the input GEMM's wgrad GEMM (its forward's FLOPs)
            bulk = hidden_beside(one if sp else 2 * one, into, nccl_share)
            if mode == "wgrad" or not sp:
                hidden += bulk
                continue
            regather = hidden_beside(one, into, nccl_share) if input_regather else 0.0
            hidden += (hidden_beside(one, into / tp, nccl_share) + hidden_beside(one, out / tp, nccl_share)
                       + regather + bulk)
        elif mode == "userbuffers":
            n = rs_splits or tp
            rs_out, wgrad = out, into
            if sms is not None:
                rs_out = slowed_gemm(out, one, sms.fprop_rs[i], sms.sms, margin=True)
                wgrad = slowed_gemm(into, one, sms.wgrad_rs[i], sms.sms, sms.wgrad_margin)
            hidden += (min(one, ag * into) + min(one, ag * out) + (n - 1) / n * min(one, rs_out) - (rs_out - out)
                       + min(one if sp else 2 * one, wgrad) - (wgrad - into))
        elif mode == "async_tp":
            dgrad_rs = 0.0 if i < len(unfused) and unfused[i] else ag * min(one, into)
            hidden += min(one, ag * into) + min(one, ag * out) + ag * min(one, out) + dgrad_rs
        else:
            raise ValueError(f"unknown TP overlap mode {mode!r}")
    return hidden


def chunked_gemm_extra(gemms: list[Gemm], cal: Calibration, ctx: LayerContext, moe: bool, tp: int) -> float:
    """Seconds async TP's chunking adds to the TP pairs' GEMMs (tp_pairs): _fused_all_gather_matmul_impl runs the
    forward's and the gradient's matmul as tp GEMMs of m/tp rows, one per gathered shard, and
    _fused_matmul_reduce_scatter_impl (chunk_producer) one per scattered shard, each lower on the rows curve
    (gemm_efficiency); the weight-gradient GEMM is not chunked. So 2 of the 3 passes (gemm_seconds) run chunked, but
    1 of an input-side GEMM whose data gradient feeds a reduce-scatter async TP leaves unfused
    (ctx.async_tp_unfused)."""
    extra = 0.0
    for k, (into, out) in enumerate(TP_PAIR_GEMMS[:1] if moe else TP_PAIR_GEMMS):
        for side, passes in ((into, 1.0 if ctx.async_tp_unfused[k] else 2.0), (out, 2.0)):
            picked = [g for g in gemms if g.name in side]
            whole = gemm_seconds(picked, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
            chunked = tp * gemm_seconds([replace(g, m=g.m / tp) for g in picked], cal, ctx.bf16_peak, ctx.fp8_peak,
                                        ctx.ridge_rows)
            extra += (chunked - whole) * passes / TRAINING_PASSES_PER_FORWARD
    return extra


def async_tp_cost(act_bytes: float, tp: int, pairs: int, hbm: float, barrier_s: float, chunk_extra: float,
                  unfused: int = 0) -> float:
    """Seconds per layer torch's async TP spends outside its pipelines (pytorch/pytorch
    torch/distributed/_symmetric_memory/__init__.py), forward and backward, per TP pair one all-gather + matmul
    and one matmul + reduce-scatter each way:
    - all-gather: the local shard (act_bytes / tp) is copied into its symmetric-memory buffer on the compute stream
      before the first chunk GEMM ('we are giving up the chance to overlap "mv" and "b" with the first
      shard_consumer'): read + write, 2 * act_bytes / tp over HBM;
    - reduce-scatter: the tp partial outputs pulled into stacked_partials are summed after the pipeline
      (reduce_partials / torch.sum over the rank dimension): read act_bytes, write act_bytes / tp;
    - the barriers on the compute stream (ASYNC_TP_AG_BARRIERS, ASYNC_TP_RS_BARRIERS), each one signal and wait
      among the NVLink peers: barrier_s (the links' intra-domain latency);
    - chunk_extra: the chunked GEMMs' lost efficiency (chunked_gemm_extra).
    `unfused`: the backward reduce-scatters async TP leaves unfused (async_tp_unfused), which run none of this."""
    if tp <= 1:
        return 0.0
    shard = act_bytes / tp
    gather = 2.0 * shard / hbm + ASYNC_TP_AG_BARRIERS * barrier_s
    scatter = (act_bytes + shard) / hbm + ASYNC_TP_RS_BARRIERS * barrier_s
    return FORWARD_AND_BACKWARD * pairs * gather + (FORWARD_AND_BACKWARD * pairs - unfused) * scatter + chunk_extra
