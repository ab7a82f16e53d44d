"""Transformer Engine's FP8 quantize passes around a layer's linears: the HBM bytes its quantizers move besides the
FP8 GEMMs, per micro-batch (each linear's input and output gradient) and per step (its weight).

The GEMMs are timed at the FP8 peak (arithmetic/gemm.py); the casts that feed them are memory-bound kernels of their
own, timed here as bytes at the HBM bandwidth the layer's other memory-bound work gets (estimate/layer_time.py,
estimate/perf.py). What each recipe runs is data, cards/memory.yaml fp8_quantize (with Transformer Engine's source)
and precision.fp8_weight_bytes (the copies written).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.memory_states import convention, fp8_param_gather, fp8_recipe, memory_card
from meshplan.schema.plan import Job, Plan

BF16 = 2  # bytes per element of the bf16 tensor a quantizer reads, and of the output a fused norm no longer writes

# Megatron-Core's column-parallel linears on the sequence-parallel hidden stream (their input all-gathered over TP
# under SP) and its row-parallel ones (their output reduce-scattered, so their output gradient all-gathered), by
# flops.py's GEMM names: linear_qkv, linear_fc1 (the dense MLP's and the shared experts') and a Mamba-2 or Gated
# DeltaNet mixer's in_proj; linear_proj, linear_fc2 and the mixers' out_proj (megatron/core/models/mamba/
# mamba_layer_specs.py, gpt/experimental_attention_variant_module_specs.py). Every other FP8 GEMM (MLA's projections,
# latent and indexer linears, routed experts after the dispatch) quantizes the tensor it holds.
GATHERED_INPUTS = frozenset({"qkv", "mlp_fc1", "shared_expert_fc1", "mamba_in_proj", "gdn_in_proj"})
GATHERED_GRADS = frozenset({"attn_out", "mlp_fc2", "shared_expert_fc2", "mamba_out_proj", "gdn_out_proj"})


@dataclass(frozen=True)
class Fp8Casts:
    """One job's quantize passes on its GPU and plan (fp8_casts builds it): what quantize_bytes and
    weight_cast_bytes multiply."""

    source_reads: int  # reads of the bf16 source per quantize (current scaling: its amax kernel, then the cast)
    copy_bytes: float  # bytes per element of one fp8 copy (row-wise or column-wise), its scales included
    copies: int  # copies of an input or output gradient: row-wise, and column-wise where wgrad needs its own
    weight_copies: int  # copies of a weight: row-wise for the forward, column-wise for dgrad where it needs its own
    rowwise_gather: bool  # SP inputs gathered row-wise, their column-wise copy an fp8 transpose after the gather
    norm_output: str | None  # "fp8": the norm writes fp8 itself; "amax": it computes the amax; None: unfused
    norm_fused: frozenset[str]  # the GEMMs whose input a norm fused with the cast makes (LayerNormLinear)
    sp_gather: int  # ranks a sequence-parallel input or output gradient is gathered over (1: none)
    wgrad: bool  # the linears compute weight gradients (not a LoRA job's frozen base)
    original_input: frozenset[str]  # GEMMs saving their bf16 input, quantized again for wgrad in the backward
    fp8_params: bool  # fp8 primary weights: the step casts no bf16 weight (weight_cast_bytes)
    param_gather_rowwise: bool  # ... and gathers them row-wise, making the column-wise copy after the gather


def fp8_casts(job: Job, plan: Plan) -> Fp8Casts | None:
    """The job's quantize passes: None without fp8 or where its linears are no Transformer Engine modules (the
    convention's fp8_weights: torchao's Float8Linear casts inside its own matmul, not counted here). One copy serves
    both directions where the GPU runs any FP8 layout and the recipe scales per tensor (precision.fp8_weight_bytes_
    any_layout); a LoRA job's frozen linears compute no weight gradient, so their inputs and output gradients need
    no column-wise copy (TE sets columnwise usage only where wgrad runs), while their weights keep one for dgrad."""
    recipe = fp8_recipe(job, plan)
    if recipe is None:
        return None
    conv = convention(job.card, plan.zero_stage, job.framework_version)[1]
    if conv.fp8_weights != "transformer_engine":
        return None
    card = memory_card()
    prec, facts = card.precision, card.fp8_quantize
    one_layout = job.gpu.fp8_any_layout and recipe in prec.fp8_weight_bytes_any_layout
    weight_copies = 1 if one_layout else 2
    written = prec.fp8_weight_bytes_any_layout[recipe] if one_layout else prec.fp8_weight_bytes[recipe]
    return Fp8Casts(source_reads=facts.source_reads[recipe], copy_bytes=written / weight_copies,
                    copies=1 if job.lora is not None else weight_copies, weight_copies=weight_copies,
                    rowwise_gather=recipe in facts.rowwise_gather, norm_output=facts.norm_output.get(recipe),
                    norm_fused=frozenset(facts.norm_fused_linears),
                    sp_gather=plan.tp if plan.sequence_parallel and plan.tp > 1 else 1, wgrad=job.lora is None,
                    original_input=frozenset({"attn_out"} if recipe in conv.fp8_out_proj_original_input else ()),
                    fp8_params=fp8_param_gather(job, plan),
                    param_gather_rowwise=recipe in facts.param_gather_rowwise)


def tensor_quantize_bytes(casts: Fp8Casts, elements: float, gathered: bool, fused: bool) -> tuple[float, float]:
    """(with the quantize, after the all-gather) HBM bytes of quantizing one tensor of `elements` as the GEMM reads
    it: on its sequence shard where `gathered` (elements / sp_gather), the source read source_reads times and each
    copy written; a recipe that gathers row-wise data only makes the column-wise copy after the gather by an fp8
    transpose (one copy read and written over the gathered elements). `fused`: a norm makes it; delayed scaling's
    writes fp8 in place of its bf16 output (one byte less than the norm's bf16 write the elementwise passes count,
    the column-wise copy a transpose of it), current scaling's computes the amax (one source read less)."""
    local = elements / casts.sp_gather if gathered else elements
    column = casts.copies - 1  # a column-wise copy beside the row-wise one
    transpose = 2 * casts.copy_bytes * column
    if fused and casts.norm_output == "fp8":
        row = local * (casts.copy_bytes - BF16)
        return (row, transpose * elements) if gathered else (row + transpose * local, 0.0)
    reads = casts.source_reads - (1 if fused and casts.norm_output == "amax" else 0)
    if gathered and casts.rowwise_gather:
        return local * (reads * BF16 + casts.copy_bytes), transpose * elements
    return local * (reads * BF16 + casts.copies * casts.copy_bytes), 0.0


def quantize_bytes(casts: Fp8Casts, gemms: list[Gemm]) -> tuple[float, float]:
    """(forward, backward) HBM bytes one layer's quantizers move per micro-batch on one rank: each FP8 GEMM's input
    (m x k per GEMM, its count times) in the forward, its column-wise copy made after an all-gather in the backward,
    and its output gradient (m x n) in the backward. A GEMM that saves its bf16 input instead (original_input:
    Megatron-Core's linear_proj under the recipes of the convention's fp8_out_proj_original_input, TE's
    save_original_input) quantizes it row-wise in the forward and again column-wise for wgrad in the backward."""
    fwd = bwd = 0.0
    for g in gemms:
        if not g.fp8:
            continue
        if casts.wgrad and g.name in casts.original_input:
            once = g.m * g.k * g.count * (casts.source_reads * BF16 + casts.copy_bytes)
            fwd += once
            bwd += once + sum(tensor_quantize_bytes(casts, g.m * g.n * g.count,
                                                    casts.sp_gather > 1 and g.name in GATHERED_GRADS, False))
            continue
        made, after_gather = tensor_quantize_bytes(casts, g.m * g.k * g.count,
                                                   casts.sp_gather > 1 and g.name in GATHERED_INPUTS,
                                                   g.name in casts.norm_fused)
        grad, grad_after = tensor_quantize_bytes(casts, g.m * g.n * g.count,
                                                 casts.sp_gather > 1 and g.name in GATHERED_GRADS, False)
        fwd += made
        bwd += after_gather + grad + grad_after
    return fwd, bwd


def weight_cast_bytes(casts: Fp8Casts) -> float:
    """HBM bytes per linear weight element a step's weight quantize moves (once per step and model chunk: TE caches
    the copies from the first micro-batch on): the bf16 weight read source_reads times and its copies written; with
    fp8 primary weights, the column-wise copy made from the gathered row-wise one where the GPU needs its own and the
    recipe gathers row-wise only (read and written; MXFP8 gathers both; the distributed optimizer's cast of its fp32
    master shard, 1/dp of the weights, is not counted)."""
    if casts.fp8_params:
        return 2 * casts.copy_bytes * (casts.weight_copies - 1) if casts.param_gather_rowwise else 0.0
    return casts.source_reads * BF16 + casts.weight_copies * casts.copy_bytes
