"""The framework card's facts about its FSDP gradient accumulation (cards/frameworks/*.yaml `grad_accumulation`):
what each FSDP unit holds between the micro-batches of a step. Apart from cards.py, which holds the card."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GradAccumulationFacts(_Card):
    """Where the trainer turns FSDP2's gradient sync off for every micro-batch of a step but the last
    (set_requires_gradient_sync(False)), each unit keeps its unsharded gradient until the last micro-batch's backward
    reduce-scatters it: a memory cost per GPU of the rank's whole parameters, not their data-parallel shard."""

    unsharded: bool = Field(description="True: with more than one micro-batch per step, every FSDP unit holds its "
                                        "unsharded gradient (the rank's TP and EP shard of its parameters, whole over "
                                        "the data-parallel ranks), accumulated over the micro-batches, from its first "
                                        "backward until the last micro-batch's reduce-scatter")
    bytes_per_param: float = Field(gt=0, description="Bytes per parameter of that held gradient (FSDP2 keeps it in "
                                                     "the MixedPrecisionPolicy's reduce_dtype)")
    source: str
