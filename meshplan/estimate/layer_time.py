"""One decoder layer's time per micro-batch on one rank, forward + backward.

The sum of its GEMMs (each at an achievable fraction of peak that depends on its shape), its attention core,
memory-bound elementwise work, a per-layer launch overhead, and the exposed part of its TP / CP / EP traffic;
with the forward shares that recompute and the overlap windows read. Each part has its module: attention_time,
context_parallel, tp_overlap, moe_time, recompute, lora_gemms.
"""

from __future__ import annotations

from copy import copy
from functools import partial

from meshplan.arithmetic.activation_passes import (
    activation_key,
    expert_bias_passes,
    ffn_passes,
    routed_weighting_passes,
)
from meshplan.arithmetic.activations import shape_of, stacked_expert_bytes
from meshplan.arithmetic.flops import Gemm, attention_gemms, mlp_gemms, moe_gemms
from meshplan.arithmetic.fp8_casts import quantize_bytes
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_terms, summed
from meshplan.arithmetic.param_wrapper import delta_pass_bytes
from meshplan.estimate.attention_time import attention_seconds
from meshplan.estimate.context_parallel import cp_passes, cp_time
from meshplan.estimate.layer_records import (
    BF16,
    GATED_FC1_WIDTHS,
    ElementwiseLoad,
    LayerContext,
    LayerTime,
    activation_code,
)
from meshplan.estimate.lora_gemms import lora_gemm_seconds
from meshplan.estimate.moe_time import (
    backward_launch_wait,
    busiest_rank_experts,
    dispatch_and_router_bytes,
    expert_launch_floor,
    exposed_ep,
    shared_overlap_windows,
)
from meshplan.estimate.recompute import recomputed_forwards
from meshplan.estimate.tp_overlap import exposed_tp


def layer_time(ctx: LayerContext, moe: bool) -> LayerTime:
    """Seconds of one layer (an MoE layer when `moe`) per micro-batch on one rank, part by part."""
    gemms = layer_gemms(ctx, moe)
    terms = gemm_terms(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)  # each GEMM's seconds, once
    gemm, gemm_fwd = gemm_time(ctx, gemms, moe, terms)
    attention_fwd, attention = attention_seconds(ctx)
    load = elementwise_load(ctx, moe)
    elementwise = elementwise_seconds(ctx, load)
    tp, tp_fwd_share = exposed_tp(ctx, gemms, moe, terms)
    return assembled_layer_time(ctx, moe, load, gemm=gemm, gemm_fwd=gemm_fwd, attention_fwd=attention_fwd,
                                attention=attention, elementwise=elementwise, mixer=0.0, tp=tp,
                                tp_fwd_share=tp_fwd_share, cp=cp_time(ctx, attention_fwd, attention),
                                cp_work=cp_passes(ctx), quantize=quantize_seconds(ctx, gemms),
                                later=partial(recomputed_forwards, ctx, gemms, load, elementwise, terms),
                                shared=shared_overlap_windows(ctx, gemms, terms) if moe else ())


def assembled_layer_time(ctx: LayerContext, moe: bool, load: ElementwiseLoad, *, gemm: float, gemm_fwd: float,
                         attention_fwd: float, attention: float, elementwise: float, mixer: float, tp: float,
                         tp_fwd_share: float, cp: tuple[float, float], cp_work: tuple[float, float],
                         later, quantize: tuple[float, float] = (0.0, 0.0),
                         shared: tuple[float, ...] = ()) -> LayerTime:
    """One layer's LayerTime from its parts (layer_time's and hybrid_time.hybrid_layer_time's, one home): the
    forward's share of its compute (the GEMMs' and attention's forward, a third of the memory-bound passes and of a
    Mamba-2 or Gated DeltaNet `mixer`'s, the stacked expert weights' copy all in the forward), an MoE layer's backward
    waiting for its experts' launches beyond what its other work hides, its overhead and exposed EP all-to-all; `cp`
    the (forward, whole) CP traffic's seconds, `cp_work` the (forward, whole) seconds of CP's memory-bound merges and
    copies (context_parallel.cp_passes), memory-bound passes with the layer's others, and `quantize` the (forward,
    whole) seconds of its FP8 quantize passes (quantize_seconds) alike; `shared` the shared experts' GEMM seconds beside
    each EP all-to-all under the shared-expert overlap (moe_time.shared_overlap_windows). A layer without a mixer passes
    0.0, which adds nothing to any sum."""
    overhead = layer_overhead(ctx, moe)
    copy = load.weight_copy_bytes / ctx.hbm  # all in the forward (stacked weights), the rest a third of the passes
    cp_work_fwd, cp_work_seconds = cp_work
    quantize_fwd, quantize_whole = quantize
    fwd_compute = (gemm_fwd + attention_fwd + (elementwise + mixer - copy) / TRAINING_PASSES_PER_FORWARD + copy
                   + cp_work_fwd + quantize_fwd)
    elementwise += cp_work_seconds + quantize_whole
    if moe and ctx.lora is None:  # the backward waiting for its experts' launches beyond what its other work hides
        gemm += backward_launch_wait(ctx, gemm + attention + elementwise + mixer - fwd_compute)
    compute = gemm + attention + elementwise + mixer + overhead  # LayerTime.compute
    ep = exposed_ep(ctx, fwd_compute, compute - fwd_compute, shared) if moe else 0.0
    cp_fwd, cp_seconds = cp
    return LayerTime(gemm=gemm, attention=attention, elementwise=elementwise + mixer, overhead=overhead, tp=tp,
                     tp_fwd=tp * tp_fwd_share, cp=cp_seconds, cp_fwd=cp_fwd, ep=ep, fwd_compute=fwd_compute,
                     attention_fwd=attention_fwd, later=later)


def overlapped_twin(ctx: LayerContext, plain: LayerTime) -> LayerTime:
    """layer_time(ctx, True) of an MoE layer whose plan overlaps its EP all-to-all (moe_a2a_overlap), from its plain
    twin's (the same context but the overlap and its steady share, layer_records.plain_twin_key): of the context those
    two only exposed_ep reads, so every part is the twin's but the EP seconds, worked out from the twin's forward and
    backward compute as layer_time does (the same floats: LayerTime.compute adds its parts in layer_time's order)."""
    twin = copy(plain)  # (its fields as they are: a recompute share still to work out is worked out alike)
    twin.ep = exposed_ep(ctx, plain.fwd_compute, plain.compute - plain.fwd_compute)
    return twin


def quantize_seconds(ctx: LayerContext, gemms: list[Gemm]) -> tuple[float, float]:
    """(forward, forward + backward) seconds of the layer's FP8 quantize passes per micro-batch (Transformer Engine's
    casts of each FP8 GEMM's input and output gradient: arithmetic/fp8_casts.quantize_bytes) at the HBM bandwidth
    memory-bound work gets; (0, 0) where the job runs none (ctx.fp8_casts)."""
    if ctx.fp8_casts is None:
        return 0.0, 0.0
    fwd, bwd = quantize_bytes(ctx.fp8_casts, gemms)
    return fwd / ctx.hbm, (fwd + bwd) / ctx.hbm


def layer_gemms(ctx: LayerContext, moe: bool) -> list[Gemm]:
    """The layer's GEMMs on this rank: attention's, then the dense MLP's or the MoE layer's (its routed experts on
    the most loaded EP rank)."""
    gemms = attention_gemms(ctx.arch, ctx.shard)
    if moe:
        gemms += busiest_rank_experts(moe_gemms(ctx.arch, ctx.shard), ctx.routed_load)
    else:
        gemms += mlp_gemms(ctx.arch, ctx.shard, ctx.arch.ffn_hidden_size, "mlp")
    return gemms


def gemm_time(ctx: LayerContext, gemms: list[Gemm], moe: bool, terms: list[float] | None = None,
              kind: str = "block") -> tuple[float, float]:
    """(forward + backward, forward) GEMM seconds: all three passes of each, or under LoRA the frozen linears'
    forward and data gradient plus the adapters' of a layer of `kind` (Architecture.layer_kind; `terms`: the GEMMs'
    gemm_terms, where the caller has them)."""
    if ctx.lora is not None:
        return lora_gemm_seconds(ctx, gemms, moe, kind)
    if terms is None:
        terms = gemm_terms(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    if moe and ctx.expert_launches[0]:  # the routed experts' forward GEMMs no faster than the host launches them
        experts = summed([t for g, t in zip(gemms, terms, strict=True) if g.name.startswith("expert_")])
        floored, floored_fwd = expert_launch_floor(ctx, experts)
        if floored > experts:
            rest = summed([t for g, t in zip(gemms, terms, strict=True) if not g.name.startswith("expert_")])
            return rest + floored, rest / TRAINING_PASSES_PER_FORWARD + floored_fwd
    total = summed(terms)
    return total, total / TRAINING_PASSES_PER_FORWARD


def elementwise_load(ctx: LayerContext, moe: bool) -> ElementwiseLoad:
    """What the layer's memory-bound work (norms, activation, rotary, residuals, dropout-free) passes over: its
    hidden-sized tensors (sequence-sharded under SP) and its FFN activations (TP-sharded; routed experts' on the
    most loaded rank), plus an MoE layer's dispatcher and router bytes and, where its experts have biases, the fc2
    output rows a per-expert bias loop passes over."""
    arch, plan, sh = ctx.arch, ctx.plan, ctx.shard
    t_sp = plan.tp if plan.sequence_parallel else 1
    hidden = sh.tokens * arch.hidden_size / t_sp
    attention = attention_widths(ctx) if ctx.hf_eager else {}
    if ctx.unfused_rope:
        attention["rotated"] = rotated_elements(ctx)
    if moe and arch.moe is not None:
        block = sh.moe_view()  # the MoE block's cut: the layer's, or where TP leaves it whole every token and weight
        copies = block.moe_tokens * arch.moe.top_k * ctx.routed_load  # the routed copies the rank's tokens make
        # each ETP rank runs its group's copies gathered (etp x as many rows) at 1/etp of the expert width, as the
        # expert GEMMs count them (flops.moe_gemms): copies x the whole width
        routed_ffn = copies * arch.moe.expert_ffn_hidden_size
        shared_ffn = block.tokens * arch.moe.shared_expert_ffn_hidden_size / block.tp
        # a per-expert fc2 bias loop over fc2's output: the ETP rank's gathered rows, hidden-wide
        bias = copies * block.etp * arch.moe.expert_width(arch.hidden_size) if arch.moe.expert_bias else 0.0
        dispatch_bytes, router_bytes = dispatch_and_router_bytes(ctx)
        copy = 2.0 * stacked_expert_bytes(shape_of(arch), plan.ep, plan.etp) if ctx.stacked_experts else 0.0
        if ctx.lora is not None and ctx.lora.target_parameters:  # PEFT's ParamWrappers build W + delta each forward
            moe_layer = next(i for i in range(arch.num_layers) if arch.is_moe_layer(i))
            copy += delta_pass_bytes(arch, moe_layer, ctx.lora.target_parameters, plan.ep, plan.etp)
        return ElementwiseLoad(hidden=hidden, routed_ffn=routed_ffn, shared_ffn=shared_ffn,
                               dispatch_bytes=dispatch_bytes, router_bytes=router_bytes, weight_copy_bytes=copy,
                               expert_bias=bias, **attention)
    return ElementwiseLoad(hidden=hidden, dense_ffn=sh.tokens * arch.ffn_hidden_size / plan.tp, **attention)


def rotated_elements(ctx: LayerContext) -> float:
    """The query and key elements on this rank a rotary embedding passes over per micro-batch: tokens x (local query
    heads + local KV heads, replicated past their count) x the head width (a non-MLA model's: the only one
    attention_time.runs_unfused_rope takes)."""
    arch, sh = ctx.arch, ctx.shard
    heads = arch.num_attention_heads / sh.tp + -(-arch.num_kv_heads // sh.tp)
    return sh.tokens * heads * arch.head_dim


def attention_widths(ctx: LayerContext) -> dict[str, float]:
    """The attention elements on this rank that transformers' eager code passes over beside the hidden ones
    (hf_eager_*): queries (heads x the Q/K head width), keys and values (KV heads x both widths; MLA's per-head
    keys and values), and those under an fp32 RMSNorm: per-head Q and K norms (Qwen3's q_norm / k_norm), or MLA's
    latent norms (kv_a_layernorm, and q_a_layernorm with a query latent)."""
    arch, sh = ctx.arch, ctx.shard
    heads = arch.num_attention_heads / sh.tp
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_head_dim
        query, key_value = heads * qk, heads * (qk + m.v_head_dim)
        normed = m.kv_lora_rank + (m.q_lora_rank or 0)
    else:
        d = arch.head_dim
        query, key_value = heads * d, 2 * -(-arch.num_kv_heads // sh.tp) * d  # KV heads replicated past their count
        normed = query + key_value / 2 if arch.qk_norm != "none" else 0.0
    return {"query": sh.tokens * query, "key_value": sh.tokens * key_value, "normed": sh.tokens * normed}


def elementwise_seconds(ctx: LayerContext, load: ElementwiseLoad) -> float:
    """Forward + backward seconds of the memory-bound work at the HBM bandwidth it gets: the card's passes over the
    hidden elements (eager ones when the blocks run uncompiled) and, over the FFN elements, the passes of the
    model's activation as the code that runs it does (activation_code; arithmetic/activation_passes.ffn_passes: the
    base constant with SwiGLU's count inside it, moved by this activation's difference), plus the dispatcher's and
    router's bytes, the routing-weight multiply where the code runs it apart (Megatron-Core's unfused functions), a
    per-expert bias loop's passes over the routed copies and the stacked copy of the local
    experts' weights a framework makes each forward (read and written). An engine that trains transformers' modeling
    code eagerly (ctx.hf_eager) moves that code's own counts (bench/step_op_census.py): hf_eager_hidden_passes over
    the hidden elements, hf_eager_query_passes and hf_eager_key_value_passes over attention's (attention_widths),
    hf_eager_qk_norm_passes over those a Q/K or latent norm runs on. Where the rotary embedding runs unfused
    (ctx.unfused_rope), unfused_rope_passes over the rotated queries and keys besides."""
    cal = ctx.cal
    key = activation_key(ctx.arch)
    ffn = ffn_passes(cal, activation_code(ctx, routed=False), key) * (load.shared_ffn + load.dense_ffn)
    routed_code = activation_code(ctx, routed=True)
    ffn += (ffn_passes(cal, routed_code, key) + sum(routed_weighting_passes(routed_code))) * load.routed_ffn
    if ctx.hf_eager:  # transformers' modeling code: its own counts over the hidden and attention elements
        elem_bytes = BF16 * (cal.hf_eager_hidden_passes * load.hidden + cal.hf_eager_query_passes * load.query
                             + cal.hf_eager_key_value_passes * load.key_value
                             + cal.hf_eager_qk_norm_passes * load.normed + ffn)
    else:
        passes = cal.eager_elementwise_passes if ctx.eager else cal.elementwise_passes
        elem_bytes = BF16 * (passes * load.hidden + ffn)
    elem_bytes += BF16 * sum(expert_bias_passes(routed_code)) * load.expert_bias
    elem_bytes += BF16 * cal.unfused_rope_passes * load.rotated  # Megatron-Core's unfused RoPE beyond TE's kernel
    elem_bytes += load.dispatch_bytes + load.router_bytes + load.weight_copy_bytes
    # the SwiGLU input's fp8 store: its casts over fc1's output, two FFN widths (Megatron-Core stores it for SwiGLU
    # only, rule PR006)
    elem_bytes += ctx.fp8_store_cast_bytes * GATED_FC1_WIDTHS * (load.dense_ffn + load.shared_ffn + load.routed_ffn)
    return elem_bytes / ctx.hbm


def eager_edge_seconds(ctx: LayerContext, vocab: int) -> float:
    """Forward + backward seconds of the memory-bound work of transformers' eager code outside its decoder layers
    (ctx.hf_eager), counted by bench/step_op_census.py: the final RMSNorm, one fp32 RMSNorm of that code
    (hf_eager_qk_norm_passes over the hidden elements), and the token embedding: the forward's gather (the picked rows
    read and written) and torch's embedding_dense_backward (the hidden gradient read, the dense [vocab, hidden]
    weight gradient written), bf16."""
    arch, sh = ctx.arch, ctx.shard
    hidden = sh.tokens * arch.hidden_size
    norm = ctx.cal.hf_eager_qk_norm_passes * BF16 * hidden
    embedding = BF16 * (3 * hidden + vocab * arch.hidden_size)
    return (norm + embedding) / ctx.hbm


def layer_overhead(ctx: LayerContext, moe: bool) -> float:
    """The layer's fixed launch overhead (card), plus in an MoE layer the dispatcher's host syncs, each a stall
    while the host refills the GPU's queue."""
    overhead = ctx.cal.layer_overhead_s
    if moe and ctx.arch.moe is not None:
        overhead += ctx.moe_host_syncs * ctx.cal.moe_host_sync_s
    return overhead
