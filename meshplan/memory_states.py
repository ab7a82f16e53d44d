"""Model-state bytes (weights, gradients, fp32 master copy, optimizer moments) under each framework's convention.

The conventions are data (cards/memory.yaml): a list of tensors per ZeRO stage, each with its bytes per
parameter and the group it is sharded over. This module only picks the preset and multiplies, so the
ZeRO paper's Figure 1 and Megatron's `6 + 12/d` come out of the same arithmetic.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from meshplan.cards import CardError, MemoryConvention, framework_card, load_card
from meshplan.errors import MeshplanError

TensorClass = Literal["weights", "gradients", "optimizer"]


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StateTensor(_Card):
    name: str
    tensor_class: TensorClass = Field(alias="class")
    bytes: float = Field(gt=0)
    shard: Literal["none", "dp"]


class Convention(_Card):
    source: str
    vocab_pad_multiple: int = Field(1, ge=1)
    flash_attention: bool = True
    dropout: bool = False
    swiglu_unfused: bool = False
    logits_bytes_per_element: float = Field(gt=0)
    loss_chunks: int = Field(1, ge=1)
    output_hidden_bytes: float = Field(4, ge=0)
    loss_hidden_bytes: float = Field(0, ge=0)
    fp8_weight_bytes: float = Field(0, ge=0)
    gathered_layers: int = Field(0, ge=0)
    gathered_bytes: float = Field(0, ge=0)
    prefetched_bytes: float = Field(0, ge=0)
    pipeline_partition: Literal["even", "compute_balanced"] = "even"
    zero: dict[int, list[StateTensor]]


class MemoryCard(_Card):
    description: str
    fixed_overhead_bytes: int = Field(ge=0)
    fixed_overhead_source: str
    cuda_context_bytes: int = Field(ge=0)
    cuda_context_source: str
    allocator_reserve_fraction: float = Field(ge=0, lt=1)
    allocator_reserve_source: str
    conventions: dict[str, Convention]


def memory_card() -> MemoryCard:
    card = load_card("memory", MemoryCard)
    for name in get_args(MemoryConvention):  # every convention a framework card may name
        if name not in card.conventions:
            raise CardError(f"cards/memory.yaml: key conventions.{name} is missing.")
    return card


def convention_name(framework: str, zero_stage: int) -> str:
    """The byte preset: the framework card's memory_convention, or at ZeRO-3 its engine.zero3_memory_convention
    where it has one (Megatron-FSDP for Megatron-Core/Bridge; FSDP2 where verl and SkyRL switch engine)."""
    card = framework_card(framework)
    if zero_stage == 3 and card.engine.zero3_memory_convention is not None:
        return card.engine.zero3_memory_convention
    return card.memory_convention


def convention(framework: str, zero_stage: int) -> tuple[str, Convention, list[StateTensor]]:
    """The preset and its tensor list for this ZeRO stage; an unsupported stage is a clear error."""
    name = convention_name(framework, zero_stage)
    conv = memory_card().conventions[name]
    stage = zero_stage
    if name.startswith("fsdp2") and stage == 1:
        stage = 2  # FSDP has no optimizer-only sharding; SHARD_GRAD_OP is the nearest
    if stage not in conv.zero:
        raise MeshplanError(
            f"zero_stage={zero_stage} is not a mode of {framework} (memory convention {name!r}).",
            fix=f"Use zero_stage in {sorted(conv.zero)}.",
        )
    return name, conv, conv.zero[stage]


def state_bytes(tensors: list[StateTensor], params: float, shard_size: float) -> dict[str, float]:
    """Bytes per class for `params` parameters whose sharded tensors are split `shard_size` ways."""
    out = {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}
    for t in tensors:
        out[t.tensor_class] += t.bytes * params / (shard_size if t.shard == "dp" else 1)
    return out


def bytes_per_param(tensors: list[StateTensor], shard_size: float) -> float:
    """E.g. 6 + 12/d for Megatron's distributed optimizer."""
    return sum(state_bytes(tensors, 1.0, shard_size).values())


def describe_tensors(tensors: list[StateTensor]) -> str:
    parts = [f"{t.name} {t.bytes:g} B" + (" sharded" if t.shard == "dp" else "") for t in tensors]
    return "; ".join(parts)


def output_activations(conv: Convention, tokens: float, vocab: float, tp: int, hidden: int, ts: int) -> float:
    """Last-stage bytes of one micro-batch past the decoder: the loss at its peak over one of `loss_chunks`
    pieces of the sequence (logits split over TP by the vocab-parallel loss), the final-norm/output-layer
    inputs (split by sequence parallelism) and what a chunked loss keeps of the hidden states (replicated)."""
    logits = conv.logits_bytes_per_element * tokens / conv.loss_chunks * vocab / tp
    return logits + conv.output_hidden_bytes * tokens * hidden / ts + conv.loss_hidden_bytes * tokens * hidden


def gathered_transient(conv: Convention, units: list[float]) -> float:
    """FSDP/ZeRO-3 bytes at the worst unit's backward peak: `gathered_layers` x `gathered_bytes` per parameter
    of that unit plus `prefetched_bytes` per parameter of the unit before it (`units`: per-GPU parameters of
    the stage's FSDP units in forward order; backward prefetches the previous one)."""
    return max((conv.gathered_layers * conv.gathered_bytes * p + conv.prefetched_bytes * (units[k - 1] if k else 0.0)
                for k, p in enumerate(units)), default=0.0)
