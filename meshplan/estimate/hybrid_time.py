"""One layer of a hybrid model (model_type nemotron_h, qwen3_next) per micro-batch on one rank, forward + backward, by
its kind in the pattern: M a Mamba-2 mixer, G a Gated DeltaNet (arithmetic/gdn.py), * attention, - an MLP, E an MoE
layer, each one norm and one mixer as Megatron-Core's HybridModel builds them (megatron/core/ssm/mamba_block.py).
The same parts as a transformer layer's (layer_time.py: GEMMs at their shape's fraction of peak, attention core,
memory-bound passes, launch overhead, exposed TP / CP / EP traffic, recompute's forward shares), each layer holding
one of its mixers; a Mamba-2 layer's in_proj and out_proj through the GEMM model, its conv1d, SSD chunk states and
gated norm as memory-bound passes, its SSD scan's matmuls at the GEMMs' asymptote (cards/calibration.yaml mamba_*),
and under context parallelism MambaContextParallel's all-to-alls; a Gated DeltaNet layer the same way from its own
kernels (gdn_mixer_seconds, gdn_cp; cards/calibration.yaml gdn_*).
"""

from __future__ import annotations

from functools import partial

from meshplan.arithmetic.comm import alltoall_time
from meshplan.arithmetic.flops import Gemm, attention_gemms, mlp_gemms, moe_gemms
from meshplan.arithmetic.gdn import gdn_gemms, gdn_rule_flops
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_terms
from meshplan.arithmetic.mamba import mamba_gemms, ssd_scan_flops
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.attention_time import attention_seconds
from meshplan.estimate.context_parallel import cp_passes, cp_time
from meshplan.estimate.layer_records import (
    BF16,
    FORWARD_AND_BACKWARD,
    ElementwiseLoad,
    LayerContext,
    LayerTime,
    layer_key,
    scope_memo,
)
from meshplan.estimate.layer_time import (
    assembled_layer_time,
    elementwise_load,
    elementwise_seconds,
    gemm_time,
    quantize_seconds,
)
from meshplan.estimate.moe_time import busiest_rank_experts, shared_overlap_windows
from meshplan.estimate.recompute import recomputed_forwards
from meshplan.estimate.tp_overlap import exposed_tp
from meshplan.schema.model import LAYER_KINDS, MIXER_KINDS

HYBRID_KINDS = tuple(LAYER_KINDS)  # the pattern letters, in schema/model.py's order
FP32 = 4  # bytes per element of the SSD chunk states (mamba_ssm's default state_dtype)


def hybrid_layers(ctx: LayerContext) -> dict[str, LayerTime]:
    """One layer of each kind the model's pattern holds (hybrid_layer_time), inside a shared_layers scope once per
    layer key and kind (the entry keeps the architecture and calibration alive, so their ids stay their own)."""
    pattern = ctx.arch.layer_pattern
    assert pattern is not None
    memo = scope_memo("hybrid_layers")
    out = {}
    for kind in HYBRID_KINDS:
        if kind not in pattern:
            continue
        if memo is None:
            out[kind] = hybrid_layer_time(ctx, kind)
            continue
        key = (layer_key(ctx, kind == "E"), kind)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (ctx.arch, ctx.cal, hybrid_layer_time(ctx, kind))
        out[kind] = hit[-1]
    return out


def hybrid_layer_time(ctx: LayerContext, kind: str) -> LayerTime:
    """Seconds of one hybrid layer of `kind` per micro-batch on one rank, part by part (layer_time's parts)."""
    moe = kind == "E"
    gemms = hybrid_gemms(ctx, kind)
    terms = gemm_terms(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    gemm, gemm_fwd = gemm_time(ctx, gemms, moe, terms, kind)
    attention_fwd, attention = attention_seconds(ctx) if kind == "*" else (0.0, 0.0)
    load = hybrid_load(ctx, kind)
    elementwise = elementwise_seconds(ctx, load)
    # conv, scan or chunked rule and gated norm: a third in the forward
    mixer = mamba_mixer_seconds(ctx) if kind == "M" else gdn_mixer_seconds(ctx) if kind == "G" else 0.0
    tp, tp_fwd_share = exposed_tp(ctx, gemms, moe, terms, pairs=layer_pairs(ctx, kind))
    cp = cp_time(ctx, attention_fwd, attention) if kind == "*" else mamba_cp(ctx) if kind == "M" \
        else gdn_cp(ctx) if kind == "G" else (0.0, 0.0)
    forwards = gdn_recomputed_forwards if kind == "G" else recomputed_forwards
    later = partial(forwards, ctx, gemms, load, elementwise, terms)
    return assembled_layer_time(ctx, moe, load, gemm=gemm, gemm_fwd=gemm_fwd, attention_fwd=attention_fwd,
                                attention=attention, elementwise=elementwise, mixer=mixer, tp=tp,
                                tp_fwd_share=tp_fwd_share, cp=cp,
                                cp_work=cp_passes(ctx) if kind == "*" else (0.0, 0.0), later=later,
                                quantize=quantize_seconds(ctx, gemms),
                                shared=shared_overlap_windows(ctx, gemms, terms) if moe else ())


def gdn_recomputed_forwards(ctx: LayerContext, gemms: list[Gemm], load: ElementwiseLoad, elementwise: float,
                            terms: list[float] | None = None) -> tuple[dict[str, float], float]:
    """recomputed_forwards of a Gated DeltaNet layer, with gdn_norm_out's: the gated norm's forward passes
    (cards/calibration.yaml gdn_norm_passes) at the HBM bandwidth and, under context parallelism, its output's
    all-to-all back to the sequence's shards (_gated_norm_and_a2a runs inside the checkpoint), run again in the
    backward."""
    module_fwd, op_sac_fwd = recomputed_forwards(ctx, gemms, load, elementwise, terms)
    g, sh, plan = ctx.arch.gdn, ctx.shard, ctx.plan
    assert g is not None
    again = ctx.cal.gdn_norm_passes * BF16 * sh.tokens * g.value_dim / sh.tp / ctx.hbm
    if plan.cp > 1:
        group = mesh_groups(plan, law=ctx.law).cp
        again += alltoall_time(sh.tokens * g.value_dim / sh.tp * BF16, group.size, group.stride, ctx.lk)
    return {**module_fwd, "gdn_norm_out": again}, op_sac_fwd


def hybrid_gemms(ctx: LayerContext, kind: str) -> list[Gemm]:
    """The layer's GEMMs on this rank: the Mamba-2 mixer's in_proj and out_proj, attention's, the MLP's, or the MoE
    layer's (router, shared experts, the routed experts on the most loaded EP rank)."""
    if kind == "M":
        return mamba_gemms(ctx.arch, ctx.shard)
    if kind == "G":
        return gdn_gemms(ctx.arch, ctx.shard)
    if kind == "*":
        return attention_gemms(ctx.arch, ctx.shard)
    if kind == "-":
        return mlp_gemms(ctx.arch, ctx.shard, ctx.arch.ffn_hidden_size, "mlp")
    return busiest_rank_experts(moe_gemms(ctx.arch, ctx.shard), ctx.routed_load)


def hybrid_load(ctx: LayerContext, kind: str) -> ElementwiseLoad:
    """The layer's memory-bound load as a transformer layer's (layer_time.elementwise_load), its hidden-sized term
    at the card's hybrid_layer_hidden_share (one norm and one residual add, not two), its FFN term only in an MLP or
    MoE layer."""
    load = elementwise_load(ctx, kind == "E")
    hidden = load.hidden * ctx.cal.hybrid_layer_hidden_share
    if kind in MIXER_KINDS:
        return ElementwiseLoad(hidden=hidden)
    return load._replace(hidden=hidden)


def mamba_mixer_seconds(ctx: LayerContext) -> float:
    """Forward + backward seconds of a Mamba-2 mixer beside its GEMMs, on one rank: the card's bf16 passes over its
    inner width (scan inputs and outputs, the gated RMSNorm), its conv width (the depthwise conv1d, run again in the
    backward) and its B and C (the SSD kernels' reads of them, their gradients), and its fp32 SSD chunk states per
    chunk, at the HBM bandwidth memory-bound work gets; and the SSD scan's matmul FLOPs (ssd_scan_flops, forward;
    mamba_scan_passes of them) at the GEMM model's asymptote. Heads and groups split over TP (the shapes in_proj gives
    each rank)."""
    m, cal, sh = ctx.arch.mamba, ctx.cal, ctx.shard
    assert m is not None
    tokens, tp = sh.tokens, sh.tp
    passes = (cal.mamba_inner_passes * m.d_inner + cal.mamba_conv_passes * m.conv_dim
              + cal.mamba_group_passes * m.n_groups * m.state_size) * BF16 \
        + cal.mamba_state_passes * FP32 * m.num_heads * m.head_dim * m.state_size / m.chunk_size
    memory = tokens * passes / tp / ctx.hbm
    scan = cal.mamba_scan_passes * ssd_scan_flops(ctx.arch, sh) / (ctx.bf16_peak * cal.gemm_peak_fraction)
    return memory + scan


def gdn_mixer_seconds(ctx: LayerContext) -> float:
    """Forward + backward seconds of a Gated DeltaNet mixer beside its GEMMs, on one rank: the card's bf16 passes over
    q and k at the value heads, its value width, its conv width, its chunk matrices A and its chunk states, at the HBM
    bandwidth memory-bound work gets (cards/calibration.yaml gdn_*, counted from FLA's kernels); and the conv's and
    chunked rule's FLOPs (gdn_rule_flops): the forward, its data and weight-like gradients (x3, as a GEMM's), and the
    forward's w, u and h the backward runs again, at the GEMM model's asymptote: FLA's Triton tl.dot tiles taken at
    the GEMMs' fraction of peak, as the Mamba-2 scan is; uncalibrated, no measured Gated DeltaNet run. Heads split over
    TP."""
    g, cal, sh = ctx.arch.gdn, ctx.cal, ctx.shard
    assert g is not None
    keys = g.num_value_heads * g.key_head_dim
    passes = (cal.gdn_key_passes * keys + cal.gdn_value_passes * g.value_dim + cal.gdn_conv_passes * g.conv_dim
              + cal.gdn_chunk_passes * g.num_value_heads * g.chunk_size
              + cal.gdn_state_passes * g.num_value_heads * g.key_head_dim * g.value_head_dim / g.chunk_size) * BF16
    memory = sh.tokens * passes / sh.tp / ctx.hbm
    forward, again = gdn_rule_flops(ctx.arch, sh)
    rule = (TRAINING_PASSES_PER_FORWARD * forward + again) / (ctx.bf16_peak * cal.gemm_peak_fraction)
    return memory + rule


def gdn_cp(ctx: LayerContext) -> tuple[float, float]:
    """(forward, forward + backward) seconds of a Gated DeltaNet layer's context-parallel all-to-alls
    (megatron/core/ssm/gated_delta_net/gdn.py, core_v0.19.0): tensor_a2a_cp2hp sends in_proj's output (q, k, v, z,
    beta, alpha) from the sequence's shards to the heads' before the conv, tensor_a2a_hp2cp the gated norm's output
    back before out_proj; the backward the same in reverse. None is overlapped."""
    g = ctx.arch.gdn
    assert g is not None
    return _cp_alltoalls(ctx, (g.in_proj_width, g.value_dim))


def mamba_cp(ctx: LayerContext) -> tuple[float, float]:
    """(forward, forward + backward) seconds of MambaContextParallel's all-to-alls in one Mamba-2 layer
    (megatron/core/ssm/mamba_context_parallel.py): pre_conv_ssm sends z, x, B, C and dt from the sequence's shards to
    the heads' (_all_to_all_cp2hp, one each), post_conv_ssm the output back (_all_to_all_hp2cp); the backward the
    same in reverse. None is overlapped. B and C are sent whole per group (their replication where cp exceeds the
    local groups is not counted)."""
    m = ctx.arch.mamba
    assert m is not None
    return _cp_alltoalls(ctx, (m.d_inner, m.d_inner, m.n_groups * m.state_size, m.n_groups * m.state_size,
                               m.num_heads, m.d_inner))


def _cp_alltoalls(ctx: LayerContext, widths: tuple[int, ...]) -> tuple[float, float]:
    """(forward, forward + backward) seconds of a mixer's context-parallel all-to-alls, one per tensor width sent
    (bf16, over TP), over the plan's CP group; none is overlapped, and the backward sends the same in reverse."""
    if ctx.plan.cp <= 1:
        return 0.0, 0.0
    group = mesh_groups(ctx.plan, law=ctx.law).cp
    tokens, tp = ctx.shard.tokens, ctx.shard.tp
    fwd = sum(alltoall_time(tokens * w / tp * BF16, group.size, group.stride, ctx.lk) for w in widths)
    return fwd, FORWARD_AND_BACKWARD * fwd


def layer_pairs(ctx: LayerContext, kind: str) -> tuple[int, ...]:
    """The TP pairs (tp_overlap.TP_PAIR_GEMMS indexes) a hybrid layer runs: a mixer's (a Mamba-2 or Gated DeltaNet
    layer's in_proj / out_proj, attention's) at the first, an MLP's at the second; an MoE layer's shared experts' at
    the second where it has them (routed experts only take the sequence-sharded tokens straight into the dispatcher,
    none)."""
    if kind in MIXER_KINDS:
        return (0,)
    if kind == "-":
        return (1,)
    moe = ctx.arch.moe
    return (1,) if moe is not None and moe.shared_expert_ffn_hidden_size and not ctx.shard.moe_whole else ()
