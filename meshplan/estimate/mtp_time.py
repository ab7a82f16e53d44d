"""What each trained multi-token-prediction depth costs per micro-batch beyond its decoder layers (those
stage_time.layer_kinds appends to the MTP stage and times as layers of their kind). Megatron-Core
(megatron/core/transformer/multi_token_prediction.py): every MultiTokenPredictionLayer first projects the normed
embedding and hidden state, concatenated to 2h, back to h (`_concat_embeddings`: `self.eh_proj`, a column-parallel
linear, gather_output False); then `process_mtp_loss`, on the rank with the output layer, runs the model's own
`output_layer` and `compute_language_model_loss` once per depth (`for mtp_layer_number in
range(config.mtp_num_layers)`), the same logits GEMM and cross-entropy as the main head. Model FLOPs already count both
(flops.model_flops_per_token: mtp_extra and logits x (mtp + 1); flops.hybrid_flops_per_token likewise), the step
time did not.
"""

from __future__ import annotations

from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import gemm_seconds
from meshplan.arithmetic.schedule import Stages
from meshplan.estimate.layer_records import LayerContext
from meshplan.schema.model import Architecture


def trained_depths(arch: Architecture, pipeline: Stages) -> int:
    """The MTP depths the step trains: the model's (the request's mtp_num_layers, repeated layer included), none
    where the layout places no MTP layer (Megatron then builds none)."""
    return arch.num_mtp_layers if pipeline.mtp_trained else 0


def eh_proj_gemm(arch: Architecture, ctx: LayerContext) -> Gemm:
    """One depth's eh_proj on one rank: 2h -> h, column-parallel (its output columns split over TP, its input the
    whole micro-batch's tokens, gathered under sequence parallelism), an FP8 linear under an FP8 recipe."""
    return Gemm("mtp_eh_proj", ctx.shard.tokens, arch.hidden_size / ctx.shard.tp, 2 * arch.hidden_size)


def head_with_mtp(head: float, arch: Architecture, ctx: LayerContext, pipeline: Stages) -> float:
    """The head stage's seconds per micro-batch beyond its decoder layers: the output layer and loss (`head`,
    perf.head_seconds) once for the main loss and once per trained MTP depth, and each depth's eh_proj. The eh_proj
    runs on the MTP blocks' stage; counted here, with the head, also where a pipeline layout puts the blocks on
    another rank (one 2h x h GEMM, under a hundredth of the depth's output layer at a 131K vocabulary)."""
    depths = trained_depths(arch, pipeline)
    if not depths:
        return head
    eh_proj = gemm_seconds([eh_proj_gemm(arch, ctx)], ctx.cal, ctx.bf16_peak, ctx.fp8_peak)
    return head + depths * (head + eh_proj)
