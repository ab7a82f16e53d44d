"""The framework card's facts about its FSDP gradient accumulation (cards/frameworks/*.yaml `grad_accumulation`):
what each FSDP unit holds between the micro-batches of a step; how its ZeRO-3 engine prefetches (`zero3_prefetch`)
and where its per-unit transfers run with the overlap switch off (`sharding_overlap_off`). Apart from cards.py, which
holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GradAccumulationFacts(_Card):
    """Where the trainer turns FSDP2's gradient sync off for every micro-batch of a step but the last
    (set_requires_gradient_sync(False)), each unit keeps its unsharded gradient until the last micro-batch's backward
    reduce-scatters it: a memory cost per GPU of the rank's whole parameters, not their data-parallel shard. Two
    triggers, the same held bytes: the trainer's own loop over micro-batches (`unsharded`) and torch's pipeline
    stage under pp > 1 (`pipeline`), which also keeps the units gathered."""

    unsharded: bool = Field(description="True: with more than one micro-batch per step, every FSDP unit holds its "
                                        "unsharded gradient (the rank's TP and EP shard of its parameters, whole over "
                                        "the data-parallel ranks), accumulated over the micro-batches, from its first "
                                        "backward until the last micro-batch's reduce-scatter")
    pipeline: bool = Field(False, description="True: with pp > 1 the trainer runs each stage in torch.distributed."
                                              "pipelining's PipelineStage, whose every backward turns gradient sync "
                                              "and resharding off (backward_maybe_with_nosync) until the schedule's "
                                              "_post_backward after the last: the same unsharded gradients are held "
                                              "(one micro-batch or many), and every unit stays gathered from its "
                                              "backward to the end of the step")
    gathered_through_forward: bool = Field(False, description="True: under pp > 1 the units are not resharded "
                                                              "after their forward either (fully_shard "
                                                              "reshard_after_forward False), so every unit of the "
                                                              "stage is gathered at every moment of the step; False: "
                                                              "each forward reshards them, so a backward that "
                                                              "follows a forward holds the units it has passed")
    knob: Literal["defer_fsdp_grad_sync"] | None = Field(
        None, description="The framework's own setting of `unsharded`, a Plan field of that name (NeMo AutoModel's "
                          "distributed.defer_fsdp_grad_sync): a job may turn it off or on; `unsharded` is then its "
                          "default")
    keep_knob: Literal["fsdp_keep_gathered"] | None = Field(
        None, description="The framework's setting that, without PP, holds every unit gathered and unreduced from its "
                          "first backward to the step's last micro-batch, as `pipeline` does under PP: a Job field of "
                          "that name (NeMo AutoModel's model.backend.enable_fsdp_optimizations); None: no such setting")
    bytes_per_param: float = Field(gt=0, description="Bytes per parameter of that held gradient (FSDP2 keeps it in "
                                                     "the MixedPrecisionPolicy's reduce_dtype)")
    source: str


class FullEpExperts(_Card):
    """What fully_shard does with a MoE layer's routed experts where expert parallelism takes every rank of the
    experts' data-parallel mesh (expert_dp 1: each expert on one rank, nothing to shard or reduce it over)."""

    ignored: bool = Field(description="True: the framework passes the routed experts to their block's fully_shard as "
                                      "ignored_params and gives them no unit of their own, so they are never gathered "
                                      "or reduce-scattered and autograd writes (and accumulates) their gradient in "
                                      "the parameters' own .grad, in their dtype; False: they stay parameters of an "
                                      "FSDP unit, gathered, reduced and accumulated as its others")
    source: str


class Zero3Prefetch(_Card):
    """How a ZeRO-3 engine prefetches the next parameters (DeepSpeed's PartitionedParameterCoordinator): after it has
    gathered one submodule's parameters it all-gathers the next ones of the trace, up to prefetch_bucket_size elements
    (at least one parameter), only while the gathered parameters stay under max_live_parameters elements; the
    parameter after one at least that large is gathered when its submodule starts, its all-gather exposed whole.
    Each submodule's parameters are gathered in their own collective (fetch_sub_module), not one per layer."""

    max_live_parameters: float = Field(gt=0, description="stage3_max_live_parameters default, elements")
    prefetch_bucket_size: float = Field(ge=0, description="stage3_prefetch_bucket_size default, elements")
    source: str


class ShardingOverlapOff(_Card):
    """What a sharding engine does with its per-unit all-gathers and reduce-scatters (ShardingSchedule's units, and
    hybrid sharding's all-reduce across the replicas where the same reduction issues it) when the framework's
    data-parallel overlap switch is off (the plan's grad_reduce_overlap false): runs them on the compute stream, each
    waiting whole (DeepSpeed ZeRO-3 without overlap_comm), or turns the overlap back on itself, so they stay beside
    the compute as with the switch on (Megatron-FSDP). The once-per-step gather after the optimizer of a stage that
    does not shard parameters is not a unit's: it follows the switch (sharding_traffic.dp_hidden_share)."""

    units: Literal["compute_stream", "overlapped"] = Field(
        description="compute_stream: every unit's transfer waits whole, none hidden; overlapped: timed as with the "
                    "switch on")
    zero_stages: list[Literal[0, 1, 2, 3]] = Field(
        min_length=1, description="The plan's ZeRO stages this holds for (the engine the card runs them on); another "
                                  "stage's units are timed as overlapped and the DP assumption says it is not read")
    source: str
