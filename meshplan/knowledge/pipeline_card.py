"""The framework card's pipeline schedule (cards/frameworks/*.yaml `pipeline`), in its own names: the orders it runs,
how it groups micro-batches per virtual chunk and how it partitions the layers, and Megatron-Core's schedules, what a
card that says nothing runs. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


PipelineOrder = Literal["gpipe", "1f1b", "interleaved_1f1b"]
# Every order meshplan/arithmetic/pipeline_timeline.py replays: the default ones above, torch's zero-bubble orders
# (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble), DualPipeV and Megatron-Core's combined 1F1B.
ScheduleOrder = Literal["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble",
                        "dualpipev", "combined_1f1b"]
InterleaveGroup = Literal["pp", "rounds"]


class PipelineFacts(_Card):
    """The pipeline schedule a framework runs, in its own names (meshplan/arithmetic/pipeline_timeline.py replays
    it): the one at vpp = 1, and the interleaved one with its micro-batch group per virtual chunk."""

    schedule: str = Field(description="The framework's name for its schedule at vpp = 1")
    order: PipelineOrder = Field(description="The order that schedule runs (gpipe or 1f1b)")
    interleaved: str | None = Field(description="The framework's interleaved schedule (vpp > 1); None: it has none")
    group: InterleaveGroup = Field(
        description="Micro-batches per virtual chunk before the next: pp (Megatron-Core's "
                    "microbatch_group_size_per_vp_stage default) or rounds (torch's m // max(1, m // pp))")
    schedules: dict[ScheduleOrder, str] = Field(
        default_factory=dict, description="Every order the framework runs (a plan's pipeline_schedule), with the "
                                          "framework's name for it; an order left out it does not run")
    runs_per_accumulation_step: bool = Field(
        False, description="True: the framework runs its schedule once per gradient-accumulation step, over the "
                           "micro-batches of one local batch (Plan.pipeline_microbatches), each run with its own fill "
                           "and drain and its own gradient sync; False: one run over every micro-batch of the step")
    steady_p2p_overlap: bool = Field(
        False, description="True: with virtual stages the framework posts each steady-state op's sends and receives "
                           "asynchronously and waits for them only before the next op (Megatron's overlap_p2p_comm), "
                           "so they run beside compute; the warm-up forwards' and cool-down backwards' transfers stay "
                           "blocking. False: every transfer blocks its rank")
    chunk_dp_sync: bool = Field(
        False, description="True: with virtual stages and the data-parallel sync overlapped, the framework launches "
                           "it model chunk by model chunk: each chunk's gradient reduction once the backward of its "
                           "last micro-batch is done, each chunk's parameter all-gather (distributed optimizer) at the "
                           "first forward of the chunk before it, so the other chunks' backward and forward run beside "
                           "them (perf.chunked_reduce_exposed / chunked_gather_exposed). False: the stage's whole "
                           "sync at its last backward and before its first forward")
    partition: Literal["told", "remainder_first"] = Field(
        "told", description="told: the framework is given its split (even, first/last stage sizes or a layout); "
                            "remainder_first: it partitions the layers itself, floor(L/pp) per stage and the first "
                            "L % pp stages one more, and can be told no other split (its source: partition_source)")
    partition_source: str | None = None
    source: str

    @model_validator(mode="after")
    def _runs_its_default(self) -> PipelineFacts:
        if self.schedules and self.order not in self.schedules:
            raise ValueError(f"schedules must hold the default order {self.order!r}")
        if self.partition != "told" and not self.partition_source:
            raise ValueError("partition_source must say where the framework's own partition rule comes from")
        return self


MEGATRON_PIPELINE = PipelineFacts(
    schedule="1F1B", order="1f1b", interleaved="interleaved 1F1B (virtual_pipeline_model_parallel_size)", group="pp",
    schedules={"1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B",
               "combined_1f1b": "combined 1F1B (overlap_moe_expert_parallel_comm)"},
    steady_p2p_overlap=True,
    chunk_dp_sync=True,
    source="NVIDIA/Megatron-LM megatron/core/pipeline_parallel/schedules.py (forward_backward_pipelining_without_"
           "interleaving / _with_interleaving, get_pp_rank_microbatches, get_schedule_table; with "
           "overlap_moe_expert_parallel_comm the combined_1f1b.py path); megatron-core 0.19.2 has no GPipe, "
           "zero-bubble or DualPipe schedule. overlap_p2p_comm is on with virtual stages: Megatron-LM's "
           "--no-overlap-p2p-communication (store_false, so on by default; megatron/training/arguments.py turns it "
           "off without virtual stages) and Megatron-Bridge's CommOverlapConfig (training/comm_overlap.py: "
           "overlap_p2p_comm=True, batch_p2p_comm=False when vp_size > 1; verl's models/mcore/config_converter.py "
           "the same). In the interleaved schedule's steady "
           "state pp_post_forward / pp_post_backward post send_forward_recv_forward / send_backward_recv_backward "
           "with overlap_p2p_comm=True and pp_pre_forward / pp_pre_backward wait on them before the next op; the "
           "warm-up forwards and the cool-down backwards call them blocking (overlap_p2p_comm_warmup_flush off by "
           "default). chunk_dp_sync: forward_backward_pipelining_with_interleaving (core_v0.7.0, unchanged on main "
           "d98e8a64) disables the gradient sync until a chunk's last micro-batch "
           "(is_last_microbatch_for_model_chunk: the last micro-batch group's pp micro-batches of each chunk, run "
           "backward from the last chunk to the first) and then calls that chunk's grad_sync_func (or lets its "
           "buckets' hooks launch it), delayed by the rank's pipeline_parallel_rank ops; it calls param_sync_func for "
           "chunks 0 and 1 before the warm-up and for chunk k + 1 at chunk k's first forward (microbatch_id + "
           "pipeline_parallel_rank); Megatron-LM's training.py sets them to the model chunks' start_grad_sync and "
           "the distributed optimizer's param sync under --overlap-grad-reduce / --overlap-param-gather, NeMo 1.x's "
           "megatron_gpt_model.py fwd_bwd_step to distributed_fused_adam's reduce_overlap_gradients / "
           "sync_overlap_parameters under overlap_grad_sync / "
           "overlap_param_sync (MLPerf Training v4.0 NVIDIA gpt3 conf/optim/distributed_fused_adam.yaml, "
           "mlcommons/training_results_v4.0 62f111b7)")
