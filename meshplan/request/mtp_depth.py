"""The multi-token-prediction depth a job trains, as a training knob: Megatron-Core's mtp_num_layers sets how many
MTP depths run (MultiTokenPredictionBlock applies one MultiTokenPredictionLayer per depth) and mtp_use_repeated_layer
builds a single layer applied at every depth (megatron/core/transformer/multi_token_prediction.py), so the depth is the
run's, not the checkpoint's: Megatron-Bridge's Nemotron 3 Super recipes train its one MTP block at two depths
(recipes/nemotronh/h100/nemotron_3_super.py). Left out, the job trains what the engine builds by default (its card's
engine.builds_model_mtp): the model's own blocks (DeepSeek-V3's num_nextn_predict_layers) on Megatron-Core and
Megatron-Bridge, none where verl's workers zero num_nextn_predict_layers or a Hugging Face model builds no MTP layer.
Apart from resolve.py, which fills the rest of the job."""

from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import unwritable
from meshplan.knowledge.cards import FrameworkCard
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request


def mtp_asked(req: Request) -> bool:
    """Whether the request sets the MTP depth or its repeated layer (then render writes them)."""
    return req.mtp_num_layers is not None or req.mtp_use_repeated_layer is not None


def default_mtp_depth(arch: Architecture, card: FrameworkCard, zero_stage: int) -> int:
    """The MTP depth a job that does not ask trains: the model's own blocks where the engine this ZeRO stage selects
    builds them for the model's type (the card's engine.builds_model_mtp and builds_model_mtp_types, with their
    source), else none."""
    types = card.engine.builds_model_mtp_types
    builds = card.engine.builds_model_mtp[card.engine_at(zero_stage)] and (types is None or arch.model_type in types)
    return arch.num_mtp_layers if builds else 0


def trained_mtp(arch: Architecture, req: Request, card: FrameworkCard, zero_stage: int,
                notes: list[str]) -> Architecture:
    """The model with the MTP depth the request trains: mtp_num_layers depths (default: what the engine at
    `zero_stage` builds, default_mtp_depth), one block's weights at all of them with mtp_use_repeated_layer. Refused
    where Megatron-Core cannot build it: a repeated layer needs a depth, and a hybrid model's MTP layers come from its
    mtp_hybrid_override_pattern."""
    if not mtp_asked(req):
        depth = default_mtp_depth(arch, card, zero_stage)
        if not arch.num_mtp_layers:
            return arch
        engine = f"{card.display_name}'s {card.engine_at(zero_stage)} engine"
        if depth == arch.num_mtp_layers:
            notes.append(f"mtp_num_layers not given: {depth}, {arch.name}'s own MTP blocks, which {engine} builds "
                         f"by default (its card's engine.builds_model_mtp).")
            return arch
        notes.append(f"mtp_num_layers not given: 0, as {engine} builds none of {arch.name}'s {arch.num_mtp_layers} "
                     f"MTP blocks by default (its card's engine.builds_model_mtp).")
        return arch.model_copy(update={"num_mtp_layers": 0, "mtp_repeated_layer": False})
    depth = arch.num_mtp_layers if req.mtp_num_layers is None else req.mtp_num_layers
    repeated = bool(req.mtp_use_repeated_layer)
    if repeated and depth == 0:
        raise MeshplanError(f"mtp_use_repeated_layer applies one MTP block at every depth, and {arch.name} trains "
                            f"none (mtp_num_layers {depth}).",
                            fix="Set mtp_num_layers to 1 or more, or leave mtp_use_repeated_layer out.",
                            fields=("mtp_use_repeated_layer", "mtp_num_layers"))
    if depth and arch.layer_pattern is not None and arch.mtp_layer_pattern is None:
        raise MeshplanError(f"{arch.name} is a hybrid model without an MTP block pattern (mtp_hybrid_override_"
                            f"pattern): Megatron-Core's hybrid model builds its MTP layers from that pattern, so "
                            f"mtp_num_layers={depth} has no block to train.",
                            fix="Leave mtp_num_layers out (or 0) for this model.", fields=("mtp_num_layers",))
    if req.mtp_num_layers is None:
        notes.append(f"mtp_num_layers not given: {depth}, the model's own MTP blocks.")
    return arch.model_copy(update={"num_mtp_layers": depth, "mtp_repeated_layer": repeated and depth > 0})


def writable_mtp(card: FrameworkCard, job: Job, plan: Plan) -> None:
    """Refuse an MTP depth the framework's config cannot set (its card's mtp_num_layers knob has no key, or a card
    without an adapter says so in cannot_run), rather than estimate a run its config would not make."""
    if not job.mtp_asked:
        return
    instead = unwritable(card, job, plan, "mtp_num_layers")
    if instead is not None:
        repeated = ", mtp_use_repeated_layer=true" if job.model.mtp_repeated_layer else ""
        raise MeshplanError(f"{card.name} cannot set the multi-token-prediction depth (mtp_num_layers="
                            f"{job.model.num_mtp_layers}{repeated}): it has no such knob.", fix=instead,
                            fields=("mtp_num_layers", "mtp_use_repeated_layer"))
