"""A LoRA layer's GEMM time on one rank: the frozen base linears' two passes and the adapters' three."""

from __future__ import annotations

from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_seconds
from meshplan.arithmetic.lora import FROZEN_PASSES_PER_FORWARD, layer_adapters
from meshplan.estimate.layer_records import LayerContext


def lora_gemm_seconds(ctx: LayerContext, gemms: list[Gemm], moe: bool) -> tuple[float, float]:
    """(forward + backward, forward) GEMM seconds of one LoRA layer on one rank: the base linears (frozen) run their
    forward and data gradient, 2 of a trained linear's 3 passes; each adapter runs A (in -> r) and B (r -> out) in
    bf16 (Megatron-Bridge's ParallelLinearAdapter is a Megatron-Core linear, not a Transformer Engine FP8 one) with
    all 3 passes, sharded as meshplan/arithmetic/lora.py says: column-parallel bases (linear_qkv, linear_fc1) split A's
    r and B's
    out over TP, row-parallel ones (linear_proj, linear_fc2) split A's in and B's out; routed experts over etp,
    on the tokens the rank's experts see."""
    arch, sh, cal, spec = ctx.arch, ctx.shard, ctx.cal, ctx.lora
    assert spec is not None
    base = gemm_seconds(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    index = next((i for i in range(arch.num_layers) if arch.is_moe_layer(i) == moe), 0)  # a layer of this kind
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
    return frozen + adapter, (base + adapter) / TRAINING_PASSES_PER_FORWARD
