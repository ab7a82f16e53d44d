"""Activation recompute's time per layer: what full recompute, Megatron's recompute modules and torchtitan's
op-level SAC run again in the backward, from the forward shares layer_time records."""

from __future__ import annotations

from dataclasses import replace

from meshplan.arithmetic.activation_passes import (
    activation_key,
    expert_bias_passes,
    forward_passes,
    routed_weighting_passes,
)
from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_terms, summed
from meshplan.estimate.layer_records import (
    BF16,
    FORWARD_AND_BACKWARD,
    GATED_FC1_WIDTHS,
    ElementwiseLoad,
    LayerContext,
    LayerTime,
    activation_code,
)
from meshplan.knowledge.calibration import Calibration
from meshplan.schema.plan import Plan

# Megatron's recompute_modules -> the GEMMs (flops.py names) each one's recompute runs again; the memory-bound
# passes each repeats are counted in module_memory_bound.
MODULE_GEMMS = {"mlp": ("mlp_",), "moe": ("router", "expert_", "shared_expert_"), "shared_experts": ("shared_expert_",),
                "mla_up_proj": ("q_up", "kv_up")}
# A norm's forward reads its input and writes its output: 2 bf16 passes over the hidden activations. Megatron's
# `layernorm` module recomputes two per layer, input_layernorm and pre_mlp_layernorm (knobs_peers_data.md 2.1).
NORM_PASSES = 2.0
NORMS_PER_LAYER = 2.0


def module_forwards(gemms: list[Gemm], cal: Calibration, ctx: LayerContext,
                    terms: list[float] | None = None) -> dict[str, float]:
    """Forward seconds of the GEMMs each Megatron recompute module repeats (`terms`: the GEMMs' gemm_terms, where the
    caller has them)."""
    if terms is None:
        terms = gemm_terms(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    return {m: summed([t for g, t in zip(gemms, terms, strict=True) if g.name.startswith(prefixes)])
            / TRAINING_PASSES_PER_FORWARD for m, prefixes in MODULE_GEMMS.items()}


def module_memory_bound(ctx: LayerContext, load: ElementwiseLoad) -> dict[str, float]:
    """Forward seconds of the memory-bound passes each Megatron recompute module repeats, at the HBM bandwidth
    elementwise work gets (hardware x calibration hbm_efficiency): `layernorm` its two norms, `moe_act` the routed
    experts' activation, `mlp` / `shared_experts` their activation (each the forward passes of the model's activation
    as its code runs it: cards/calibration.yaml activation_passes, gpt-oss's eager clamps included), `moe` its
    activations, the per-expert bias loop's forward, and the forward half of the dispatcher's permutes and the
    router's fp32 passes (the load's dispatch_bytes / router_bytes are forward + backward; the card counts the
    backward as much again). mla_up_proj's RoPE and core_attn are not counted here. Under the SwiGLU input's fp8
    store each recomputed activation casts fc1's output to fp8 again (the forward's cast: half the store's bytes)."""
    key = activation_key(ctx.arch)
    # bytes per FFN element of the activation's forward: its passes, and the fp8 store's forward cast
    cast = ctx.fp8_store_cast_bytes / FORWARD_AND_BACKWARD * GATED_FC1_WIDTHS
    act = forward_passes(activation_code(ctx, routed=False), key) * BF16 + cast
    routed_code = activation_code(ctx, routed=True)
    # the routing-weight multiply, where the code runs it apart (Megatron-Core's unfused functions), recomputed too
    routed_act = (forward_passes(routed_code, key) + routed_weighting_passes(routed_code)[0]) * BF16 + cast
    bias = expert_bias_passes(routed_code)[0] * BF16 * load.expert_bias
    seconds = {"layernorm": NORMS_PER_LAYER * NORM_PASSES * BF16 * load.hidden,
               "moe_act": routed_act * load.routed_ffn,
               "shared_experts": act * load.shared_ffn,
               "mlp": act * load.dense_ffn,
               "moe": routed_act * load.routed_ffn + act * load.shared_ffn + bias
               + (load.dispatch_bytes + load.router_bytes) / FORWARD_AND_BACKWARD}
    return {m: b / ctx.hbm for m, b in seconds.items()}


def op_sac_recomputed(gemms: list[Gemm], gated: bool, k_width: float = 0.0) -> list[Gemm]:
    """The GEMMs torchtitan's op-level SAC runs again (activations.py _op_sac keeps the others' outputs): the
    router gate and the routed experts (_grouped_mm, in no save list) always; of the other mm/linear calls,
    counted per block in call order with a gated fc1 as its w1 and w3, every second one. `k_width` > 0: the
    release runs GQA's Q, K, V as three linears (the convention's qkv_projections separate: torchtitan <= 0.2's
    llama3 wq, wk, wv), so the fused qkv GEMM counts as three mms and its K part (that width) is the second,
    recomputed. Under fp8 the same ones: torchao's Float8Linear reaches the policy as aten.mm on
    Float8TrainingTensor arguments (the subclass runs _scaled_mm below the SAC mode), counted and kept or recomputed
    as in bf16, the recomputed ones at fp8 speed (cards/frameworks/torchtitan.yaml recompute.source;
    bench/torchao_fp8_probe.py sac, eager and compiled)."""
    return [gemms[at] if n is None else replace(gemms[at], n=n) for at, n in _op_sac_picks(gemms, gated, k_width)]


def _op_sac_picks(gemms: list[Gemm], gated: bool, k_width: float = 0.0) -> list[tuple[int, float | None]]:
    """op_sac_recomputed's GEMMs in order, each as (index in `gemms`, None for the whole GEMM or the width n of the
    part recomputed: a gated fc1's w1 or w3, n halved, or a separate wk's K), so a caller holding the GEMMs'
    gemm_terms reads the whole ones' terms instead of timing them again (recomputed_forwards)."""
    out: list[tuple[int, float | None]] = []
    count = 0
    for at, g in enumerate(gemms):
        if g.name == "router" or g.name.startswith("expert_"):
            out.append((at, None))
            continue
        if gated and g.name.endswith("_fc1"):
            parts: list[float | None] = [g.n / 2, g.n / 2]
        elif k_width > 0 and g.name == "qkv":
            parts = [g.n - 2 * k_width, k_width, k_width]  # wq, wk, wv
        else:
            parts = [None]
        for part in parts:
            count += 1
            if count % 2 == 0:
                out.append((at, part))
    return out


def separate_k_width(ctx: LayerContext) -> float:
    """The K projection's width on this rank where the release runs Q, K, V as three linears (LayerContext.
    qkv_separate), else 0: its KV heads on the TP rank (replicated when fewer than the ranks) x head_dim, as
    flops.attention_gemms counts them inside the fused qkv GEMM."""
    arch = ctx.arch
    if not ctx.qkv_separate or arch.mla is not None:
        return 0.0
    return -(-arch.num_kv_heads // ctx.shard.tp) * arch.head_dim


def recomputed_forwards(ctx: LayerContext, gemms: list[Gemm], load: ElementwiseLoad,
                        elementwise: float, terms: list[float] | None = None) -> tuple[dict[str, float], float]:
    """(per Megatron recompute module, torchtitan's op-level SAC) forward seconds of one layer that each would run
    again: each module's GEMMs and memory-bound passes; the GEMMs op-level SAC does not keep and the forward share
    of all memory-bound work (`elementwise`: its forward + backward seconds; `terms`: the GEMMs' gemm_terms)."""
    module_fwd = module_forwards(gemms, ctx.cal, ctx, terms)
    for m, t in module_memory_bound(ctx, load).items():
        module_fwd[m] = module_fwd.get(m, 0.0) + t
    op_sac_fwd = (summed(op_sac_terms(gemms, ctx, terms)) + elementwise) / TRAINING_PASSES_PER_FORWARD
    return module_fwd, op_sac_fwd


def op_sac_terms(gemms: list[Gemm], ctx: LayerContext, terms: list[float] | None = None) -> list[float]:
    """gemm_terms of op_sac_recomputed's GEMMs, in order (gemm_seconds of them is their sum, `summed`): a whole GEMM's
    is its term in `terms` (the layer's GEMMs' gemm_terms, where the caller has them: the same float, a GEMM's term
    reads only the GEMM and the context), a part (a gated fc1's half, a separate wk) is timed once per width."""
    k_width = separate_k_width(ctx)
    if terms is None:
        return gemm_terms(op_sac_recomputed(gemms, ctx.arch.gated_mlp, k_width), ctx.cal,
                          ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    parts: dict[tuple[int, float], float] = {}
    out = []
    for at, n in _op_sac_picks(gemms, ctx.arch.gated_mlp, k_width):
        if n is None:
            out.append(terms[at])
            continue
        if (at, n) not in parts:
            parts[at, n] = gemm_terms([replace(gemms[at], n=n)], ctx.cal, ctx.bf16_peak, ctx.fp8_peak,
                                      ctx.ridge_rows)[0]
        out.append(parts[at, n])
    return out


def recompute_time(lt: LayerTime, recompute: str, cal: Calibration, selective: str = "core_attention",
                   modules: tuple[str, ...] = ("core_attn",), attention: bool = False) -> float:
    """Full recompute runs each layer's forward again: its forward compute, the forward share of its fixed
    overhead (card) and the forward part of its TP, CP and EP traffic (counted constants above)."""
    if recompute == "full":
        return (lt.fwd_compute + lt.overhead * cal.forward_share_of_layer_overhead + lt.tp_fwd
                + lt.cp_fwd + lt.ep / FORWARD_AND_BACKWARD)
    if recompute == "selective" and selective == "op_sac":
        # the unkept GEMMs, every pointwise and norm op and the TP all-gathers (reduce-scatters are kept); the
        # attention too where the release's save list lacks its kernel (`attention`: Recompute.attention)
        return lt.op_sac_fwd + lt.tp_fwd / 2 + (lt.attention_fwd if attention else 0.0)
    if recompute == "selective":
        # each recompute module's forward again: core attention (Korthikanti et al. 2022), the GEMMs of the others,
        # and a recomputed MoE layer's dispatch and combine
        return sum(lt.attention_fwd if m == "core_attn" else lt.module_fwd.get(m, 0.0)
                   + (lt.ep / FORWARD_AND_BACKWARD if m == "moe" else 0.0) for m in modules)
    return 0.0


def recomputed_layers(plan: Plan, n_layers: int) -> int:
    """How many of a stage's (or chunk's) n_layers, from its first, Megatron's full recompute reruns: every one
    under the uniform method or with recompute_layers left out, else the block method's first recompute_layers
    (transformer_block.py _checkpointed_forward). Memory and step time both read it, so they recompute the same
    layers."""
    if plan.recompute_layers is None or plan.recompute_method == "uniform":
        return n_layers
    return min(n_layers, plan.recompute_layers)
