"""A LoRA layer's GEMM time on one rank: the frozen base linears' two passes and the adapters' three; under PEFT's
ParamWrappers on the routed experts (LoraSpec.target_parameters) the wrapped experts' weight gradients and the deltas'
einsum too."""

from __future__ import annotations

from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_seconds
from meshplan.arithmetic.lora import FROZEN_PASSES_PER_FORWARD, layer_adapters
from meshplan.arithmetic.param_wrapper import wrapped
from meshplan.estimate.layer_records import LayerContext


def lora_gemm_seconds(ctx: LayerContext, gemms: list[Gemm], moe: bool, kind: str = "block") -> tuple[float, float]:
    """(forward + backward, forward) GEMM seconds of one LoRA layer on one rank: the base linears (frozen) run their
    forward and data gradient, 2 of a trained linear's 3 passes; each adapter runs A (in -> r) and B (r -> out) in
    bf16 (Megatron-Bridge's ParallelLinearAdapter is a Megatron-Core linear, not a Transformer Engine FP8 one) with
    all 3 passes, sharded as meshplan/arithmetic/lora.py says: column-parallel bases (linear_qkv, linear_fc1) split A's
    r and B's
    out over TP, row-parallel ones (linear_proj, linear_fc2) split A's in and B's out; routed experts over etp,
    on the tokens the rank's experts see. `kind` is a hybrid layer's (Architecture.layer_kind: a Mamba-2 layer's
    in_proj / out_proj adapters, attention's, an MLP's or an MoE layer's); 'block' a transformer layer's."""
    arch, sh, cal, spec = ctx.arch, ctx.shard, ctx.cal, ctx.lora
    assert spec is not None
    base = gemm_seconds(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    index = arch.layer_pattern.index(kind) if arch.layer_pattern is not None and kind in arch.layer_pattern else \
        next((i for i in range(arch.num_layers) if arch.is_moe_layer(i) == moe), 0)  # a layer of this kind
    r, extra = spec.rank, []
    for a in layer_adapters(arch, index, spec, ctx.lora_engine):
        t, rows, count = sh.tp, sh.tokens, 1.0
        if a.expert:
            assert arch.moe is not None
            t, count = sh.etp, arch.moe.num_experts / sh.ep
            local = sh.tokens / sh.tp if sh.sp or sh.tp == 1 else sh.tokens
            rows = sh.ep * sh.etp * local * arch.moe.top_k / arch.moe.num_experts * ctx.routed_load
        column = a.column
        extra += [Gemm(f"lora_a_{a.target}", rows, r / t if column else r, a.inputs if column else a.inputs / t,
                       count * a.a_copies, fp8=False),
                  Gemm(f"lora_b_{a.target}", rows, a.outputs / t, r, count, fp8=False)]
    adapter = gemm_seconds(extra, cal, ctx.bf16_peak, None)
    frozen = base * FROZEN_PASSES_PER_FORWARD / TRAINING_PASSES_PER_FORWARD
    if moe and spec.target_parameters:
        frozen += param_wrapper_weight_grads(ctx, gemms)
        adapter += param_wrapper_delta_seconds(ctx, index)
    return frozen + adapter, (base + adapter) / TRAINING_PASSES_PER_FORWARD


WRAPPED_GEMMS = {"gate_up_proj": "expert_fc1", "down_proj": "expert_fc2"}
"""Each 3D weight PEFT's ParamWrapper wraps: the routed experts' GEMM (arithmetic/flops.py moe_gemms) it weighs."""


def param_wrapper_weight_grads(ctx: LayerContext, gemms: list[Gemm]) -> float:
    """Seconds of the weight-gradient GEMMs of the routed experts whose weights ParamWrappers wrap (LoraSpec.
    target_parameters): the experts run on W + delta, which needs a gradient, so these run the third pass a frozen
    linear skips (arithmetic/param_wrapper.py)."""
    assert ctx.lora is not None
    names = {WRAPPED_GEMMS[w] for w in ctx.lora.target_parameters}
    grads = gemm_seconds([g for g in gemms if g.name in names], ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    return grads / TRAINING_PASSES_PER_FORWARD


def param_wrapper_delta_seconds(ctx: LayerContext, index: int) -> float:
    """Seconds of the ParamWrappers' delta of MoE layer `index` per micro-batch: einsum('o r e, e r i -> e i o') of
    lora_B and lora_A, one (in x r) @ (r x out) product per local expert, with its two gradients (gemm_seconds' three
    passes), in bf16, whatever the tokens; each expert's shard over etp."""
    arch, sh, spec = ctx.arch, ctx.shard, ctx.lora
    assert spec is not None and arch.moe is not None
    deltas = [Gemm(f"param_wrapper_{w.name}", w.inputs, w.outputs / sh.etp, spec.rank, arch.moe.num_experts / sh.ep,
                   fp8=False) for w in wrapped(arch, index, spec.target_parameters)]
    return gemm_seconds(deltas, ctx.cal, ctx.bf16_peak, None)
