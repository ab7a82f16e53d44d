"""What a request resolves into (request/resolve.py): the `Job` (model, GPU, cluster, training settings, framework,
an RL job's workload, LoRA adapters) and the `Plan` (the parallel layout and its switches). Every estimator is a
pure function of the two; units are bytes, seconds and FLOP/s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic import Field, PrivateAttr

from meshplan.core.errors import MeshplanError
from meshplan.schema.choices import (
    AttentionBackend,
    CpCommType,
    CrossEntropyFusionImpl,
    CudaGraphImpl,
    CudaGraphModule,
    ExpertWeight,
    FlexBackend,
    Fp8Recipe,
    Framework,
    LoraTarget,
    MoeDispatcher,
    Optimizer,
    OptimizerStateDtype,
    PipelineSchedule,
    Placement,
    Precision,
    Recompute,
    RecomputeModule,
    RLAlgorithm,
    RolloutEngine,
    StrictModel,
)
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.model import Architecture

if TYPE_CHECKING:  # typing only, never run: schema sits below knowledge (tests/test_import_layers.py TYPING_ONLY)
    from meshplan.knowledge.cards import FrameworkCard
    from meshplan.knowledge.rl_card import RLCard


class LoraSpec(StrictModel):
    """A LoRA job's adapters (meshplan/arithmetic/lora.py): frozen base weights, trainable rank-r A (in x r) and B (r x
    out)."""

    rank: int = Field(ge=1)
    targets: list[LoraTarget] = Field(min_length=1)
    vision: bool = Field(True, description="The targets' adapters in a multimodal model's vision tower too, where the "
                                           "engine builds it (arithmetic/lora.py vision_adapters); false: "
                                           "exclude_modules leaves the tower out (adapters/lora.py VISION_EXCLUDE)")
    target_parameters: list[ExpertWeight] = Field(
        default_factory=list, description="The routed experts' 3D weights adapted through Hugging Face PEFT's "
                                          "ParamWrapper (verl's model.target_parameters; arithmetic/param_wrapper.py): "
                                          "one rank-r adapter per expert, its delta built whole each forward")


class RLJob(StrictModel):
    """An RL step's workload: prompts x samples sequences of prompt + response tokens (meshplan/rl/)."""

    algorithm: RLAlgorithm = "grpo"
    prompts_per_step: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1)
    prompt_length: int = Field(ge=1)
    response_length: int = Field(ge=1)
    mean_response_length: int | None = Field(None, ge=1, description="None: every response at response_length")
    mean_prompt_length: int | None = Field(None, ge=1, description="None: every prompt at prompt_length")
    prompts_per_mini_batch: int | None = Field(None, ge=1, description="None: the whole step's prompts, one "
                                                                         "optimizer step")
    update_epochs: int | None = Field(None, ge=1, description="None: one pass of the update over the batch")
    entropy_coeff: float = Field(0.0, ge=0, description="The entropy term's coefficient in the policy loss: nonzero "
                                                        "puts the entropy and its gradient in every update "
                                                        "micro-batch (memory_states.rl_loss)")
    log_prob_pass: bool = Field(False, description="The job as a no-grad log-prob pass's memory sees it "
                                                   "(rl/memory.trainer_reports' forward report): its loss keeps the "
                                                   "engine's log_prob_logits_bytes_per_element (rl_loss_bytes)")

    @property
    def mini_batch_prompts(self) -> int:
        """Prompts per optimizer step: prompts_per_mini_batch, the whole step's where the request named none."""
        return self.prompts_per_mini_batch or self.prompts_per_step

    @property
    def splits_step(self) -> bool:
        """Whether the job names a mini-batch smaller than its step: its update then runs the pipeline schedule and
        steps the optimizer once per mini-batch (verl's update_policy, SkyRL's policy mini-batch), which the rules'
        micro-batch count, the update's memory and time and the actor search read."""
        return self.prompts_per_mini_batch is not None and self.prompts_per_mini_batch < self.prompts_per_step

    @property
    def step_sequences(self) -> int:
        """Sequences per RL step: prompts_per_step x samples_per_prompt (verl's real_train_batch_size). The job's own
        global_batch_size is this, except in the estimate of one mini-batch's update (rl/step_time.mini_batch_update),
        where it is mini_batch_sequences: a rule of the whole step reads this."""
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def mini_batch_sequences(self) -> int:
        """Sequences per optimizer step: mini_batch_prompts x samples_per_prompt."""
        return self.mini_batch_prompts * self.samples_per_prompt

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per RL step: the step's prompts in mini-batches of prompts_per_mini_batch, the last one
        smaller where they do not divide (verl DataProto.make_iterator and SkyRL split the batch in order), once per
        update epoch."""
        return -(-self.prompts_per_step // self.mini_batch_prompts) * self.epochs

    @property
    def epochs(self) -> int:
        """Passes of the update over the batch: update_epochs, 1 where the request stated none."""
        return self.update_epochs or 1

    @property
    def mean_response(self) -> int:
        """The responses' mean length: response_length where the request stated none."""
        return self.response_length if self.mean_response_length is None else self.mean_response_length

    @property
    def mean_prompt(self) -> int:
        """The prompts' mean length: prompt_length where the request stated none."""
        return self.prompt_length if self.mean_prompt_length is None else self.mean_prompt_length

    @property
    def token_share(self) -> float:
        """A sequence's tokens at the mean prompt and response over those at the longest: what dynamic batches pack of
        what the trainer is planned and estimated for (1.0 where no mean is stated)."""
        return (self.mean_prompt + self.mean_response) / (self.prompt_length + self.response_length)


class Job(StrictModel):
    """What is trained, on what, with which settings: everything but the layout."""

    model: Architecture
    gpu: GpuSpec = Field(description="The catalog part on the job's cluster: its network_bandwidth the request's "
                                     "network_gbps_per_node shared by a node's GPUs where it states one "
                                     "(request/resolve.cluster_gpu), what every inter-node time reads")
    num_gpus: int = Field(ge=1)
    world_follows_layout: bool = Field(
        False, description="num_gpus was left out: it is the degrees' product (request/resolve.py), so a fix that "
                           "changes a degree changes the GPU count with it (rules/world.py tiled)")
    dp_stated: bool = Field(
        False, description="The request stated dp (a KempnerForge file's dp_shard, a ds_config's batch keys): a fix "
                           "that changes a degree names the dp it leaves beside it, or the request keeps the old one "
                           "(rules/fix_values.layout_words)")
    etp_follows_tp: bool = Field(
        False, description="The request left etp out on an MoE model whose framework defaults it to tp (request/"
                           "resolve._expert_tp: Megatron-Core's unset expert_tensor_parallel_size): a fix that changes "
                           "tp changes etp with it (rules/fix_values.at_layout, world.tiled)")
    batch_follows_layout: bool = Field(
        False, description="A training job's global_batch_size was left out: it is request/resolve."
                           "default_global_batch for the GPU count and the plan's micro-batch x dp, so a fix that "
                           "changes dp changes the batch with it (rules/fix_values.batch_at)")
    rl_step_stated: tuple[Literal["prompts_per_step", "global_batch_size"], ...] = Field(
        (), description="The fields an RL request stated its step's size in (both must agree: rl/job.py), empty where "
                        "it left both out: a fix of the step's batch names each of them, so that the request with it "
                        "resolves (rules/fix_values.rl_batch_fix)")
    gpus_per_node: int = Field(ge=1)
    node_gpus: int | None = Field(
        None, ge=1, description="GPUs each node holds, where the request named them (its gpus_per_node); None: the "
                                "GPU's catalog node, of which gpus_per_node may launch fewer (request/resolve."
                                "launch_gpus_per_node). What decides the node's NVLink wiring (mesh.wired_node)")
    seq_length: int = Field(ge=1)
    global_batch_size: int = Field(ge=1)
    precision: Precision = "bf16"
    framework: Framework = "megatron-core"
    rl: RLJob | None = Field(None, description="The RL job's rollout workload (None: a training job)")
    lora: LoraSpec | None = Field(None, description="LoRA adapters on a frozen base (None: every weight trained)")
    mtp_asked: bool = Field(False, description="The request set the MTP depth or its repeated layer (model."
                                               "num_mtp_layers and mtp_repeated_layer hold them): render writes "
                                               "them, where a framework builds the model's own depth otherwise")
    cpu_memory_per_node: int | None = Field(None, ge=1, description="Host memory per node, bytes (None: unchecked)")
    framework_version: str | None = Field(None, description="The framework release (None: the card's version)")
    framework_version_asked: str | None = Field(
        None, description="The version the request named where the card's facts of another known release stand for "
                          "it (Megatron-Core 0.16 -> 0.19.2): what a rule on a dated refusal reads (PR009), since the "
                          "facts the estimate takes from that release do not include when a release started to "
                          "refuse a setting; None: framework_version itself")
    moe_routing_imbalance: float = Field(1.0, ge=1.0, description="Most loaded EP rank's routed tokens over the mean")
    moe_fake_balanced_gate: bool = Field(False, description="AutoModel FakeBalancedGate (comm.consecutive_routing)")
    fsdp_keep_gathered: bool = Field(False, description="AutoModel enable_fsdp_optimizations: FSDP units neither "
                                                        "resharded after a backward nor reduced before the step's last "
                                                        "micro-batch (memory_states.keeps_units)")
    loss_fp32_upcast: bool = Field(True, description="The loss upcasts the logits to fp32 (memory_states.loss_upcast)")
    fp8_activation_input_store: bool = Field(
        False, description="The SwiGLU's saved input in fp8 (Megatron-Core activation_func_fp8_input_store; "
                           "activations.Layout.fp8_act_input)")
    fp8_dot_product_attention: bool = Field(
        False, description="FP8 dot-product attention (Megatron-Core fp8_dot_product_attention; activations.Layout."
                           "fp8_attention)")
    activation_offload_layers: int = Field(
        0, ge=0, description="The layers whose saved tensors Megatron-Core's layer-wise CPU offload sends to the host "
                             "(cpu_offloading_num_layers; arithmetic/offload.layer_offload_split; 0: none)")
    moe_shared_expert_overlap: bool = Field(
        False, description="The shared experts overlapped with the token dispatch (Megatron-Core "
                           "moe_shared_expert_overlap): the request's, else the framework's default for the model "
                           "(the card's defaults.moe_shared_expert_overlap); what a plan runs is memory_states."
                           "shared_expert_overlap's")
    moe_shared_expert_overlap_asked: bool = Field(
        False, description="The request set moe_shared_expert_overlap: rule EP012 holds a plan to it, where a default "
                           "yields to the plan (off beside the flex dispatcher on Megatron-Bridge, moe_a2a_overlap or "
                           "a recomputed shared_experts module)")
    bias_activation_fusion: bool = Field(
        True, description="Megatron-Core's fused bias + activation kernel runs the MLP's activation (false: its "
                          "unfused glu(), layer_records.activation_code 'unfused_functions', memory_states."
                          "unfused_glu_bytes); true on every framework without the switch")
    cross_entropy_loss_fusion: bool | None = Field(
        None, description="Megatron-Core's cross_entropy_loss_fusion as the job runs it (memory_states.megatron_loss: "
                          "false the unfused vocab-parallel loss, true cross_entropy_fusion_impl's); None: not "
                          "resolved, the framework's default for the model (request/resolve writes it), none on a "
                          "framework without the switch (its memory convention's loss)")
    cross_entropy_fusion_impl: CrossEntropyFusionImpl = Field(
        "native", description="Megatron-Core's fused cross-entropy, read where cross_entropy_loss_fusion is true: "
                              "native (fused_vocab_parallel_cross_entropy) or te (Transformer Engine's "
                              "parallel_cross_entropy)")
    moe_flex_backend: FlexBackend = Field(
        "deepep", description="The flex dispatcher's backend, resolved once (request/resolve.flex_backend: the "
                              "request's, else mesh.flex_backend's for the machine): what the flex dispatch is timed "
                              "as (comm.job_links, moe_time.dispatcher_passes), checked against (rule EP013) and "
                              "rendered; read only beside the flex dispatcher")
    headroom: float | None = Field(
        None, ge=0.0, lt=1.0, description="The share of GPU memory the request asked to keep free: a plan fits within "
                                          "capacity x (1 - headroom) (None: within capacity, MEM002 warning below its "
                                          "minimum)")
    notes: list[str] = Field(default_factory=list, description="How defaults were filled in")
    given_unread: tuple[str, ...] = Field(
        (), description="Request fields given as name=value that the plan does not carry because this layout has "
                        "nothing for them ('pipeline_microbatches=4' at pp 1, 'cp_comm_type=a2a' at cp 1): rules "
                        "PP019 and CP008 name them (request/resolve.py)")
    # The framework's card, set once by the resolver (request/resolve.carry_cards) so estimators never look a card up
    # by name: a private attribute, so no field, no schema, nothing serialized; model_copy carries it (the `card`
    # property refuses a copy whose framework changed).
    _card: Any = PrivateAttr(None)

    def attach_cards(self, card: FrameworkCard) -> Job:
        """Give the job its framework's card (the resolver's one step; request/resolve.carry_cards looks it up)."""
        if card.name != self.framework:
            raise MeshplanError(f"The card of {card.name!r} cannot go with a job of framework {self.framework!r}.",
                                fix="Attach the job's own framework card (request/resolve.carry_cards).")
        self._card = card
        return self

    @property
    def card(self) -> FrameworkCard:
        """The job's framework card, as the resolver attached it, read from the private dict (the estimators and the
        search ask tens of thousands of times an ask, and pydantic's __getattr__ for a private attribute costs 20x);
        refused where none is attached or a copy changed the framework (its card would be stale), with what to do
        instead."""
        card = self.__pydantic_private__["_card"]
        if card is not None and card.name == self.framework:
            return card
        raise MeshplanError(
            f"This job (framework {self.framework!r}) carries no card of its framework"
            + (f": it carries {card.name!r}'s (a copy changed its framework)." if card else
               ": it was built by hand, not by the resolver."),
            fix="Build jobs with meshplan.request.resolve.resolve(Request(...)), or give a hand-built or re-framed "
                "job its cards with meshplan.request.resolve.carry_cards(job).")

    @property
    def rl_card(self) -> RLCard | None:
        """The `rl` section of the job's framework card (FrameworkCard.rl; None: the framework runs no RL job)."""
        return self.card.rl


def degree_words(tp: int, pp: int, vpp: int = 1, cp: int = 1, ep: int = 1, etp: int = 1) -> list[str]:
    """A layout's degrees as every answer names them: TP and PP always, VPP, CP, EP and ETP where over 1 (Plan.short,
    the search's Layout.short, a decision table's Layout.short)."""
    return [f"TP{tp}", f"PP{pp}", *(f"{name}{value}" for name, value in (("VPP", vpp), ("CP", cp), ("EP", ep),
                                                                        ("ETP", etp)) if value > 1)]



def step_microbatches(global_batch_size: int, micro_batch_size: int, dp: int) -> int:
    """Micro-batches each data-parallel rank runs per step: the global batch over micro-batch x dp, at least one. The
    one count the estimate (Plan.num_microbatches), the search's floors and bounds, which have a layout and a
    micro-batch size but no plan, and the renders' accumulation steps read."""
    return max(1, global_batch_size // (micro_batch_size * dp))

class Plan(StrictModel):
    """A parallel layout. GPU count = tp*cp*pp*dp; the MoE part folds ep*etp into the same ranks."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1, description="Virtual stages per pipeline rank; 1 = no interleaving")
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    etp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    sequence_parallel: bool = False
    zero_stage: int = Field(1, ge=0, le=3)
    dp_replicate: int = Field(
        1, ge=1, description="Data-parallel replicas (hybrid sharding, HSDP): sharded states split over the dp*cp / "
                             "dp_replicate ranks of one replica and replicated across the dp_replicate replicas")
    micro_batch_size: int = Field(1, ge=1)
    recompute: Recompute = "none"
    recompute_layers: int | None = None
    recompute_method: Literal["uniform", "block"] | None = None  # full recompute; None: block with layers, else uniform
    recompute_modules: list[RecomputeModule] | None = None  # Megatron selective; None: its default ["core_attn"]
    selective_ac_option: str | None = None  # torchtitan: None or "op" = op-level SAC, "N" = every N-th block full AC
    cp_comm_type: CpCommType = "p2p"
    optimizer: Optimizer = "adam"  # muon: one momentum on the matrices Muon covers, Adam on the rest
    optimizer_state_dtype: OptimizerStateDtype | None = None  # None: fp32 moments, no precision-aware optimizer
    fp8_param_gather: bool | None = None  # fp8 weights instead of bf16 + fp8 copy; None: the framework default (off)
    grad_reduce_in_fp32: bool | None = None  # None: the framework's default (its memory convention's grad bytes)
    fp8_recipe: Fp8Recipe | None = None  # None: the framework's default recipe (precision=fp8 only)
    moe_token_dispatcher: MoeDispatcher = "alltoall"
    moe_a2a_overlap: bool = False  # EP all-to-all overlapped with the other micro-batch's compute (1F1B)
    pipeline_schedule: PipelineSchedule | None = None  # None: the framework's default (its card's pipeline section)
    # micro-batches one run of the pipeline schedule takes, the step running it again per gradient-accumulation step
    # (torchtitan: local_batch_size / pipeline_parallel_microbatch_size); None: every micro-batch of the step in one run
    pipeline_microbatches: int | None = Field(None, ge=1)
    tp_comm_overlap: bool = False  # TP/SP collectives pipelined with their GEMMs (the framework card's tp_overlap)
    # Megatron-Core's CUDA graphs: implementation and the modules each layer's graphs capture (empty: the whole layer;
    # none under full_iteration); rules CG001, CG002
    cuda_graph_impl: CudaGraphImpl = "none"
    cuda_graph_modules: tuple[CudaGraphModule, ...] = ()
    # the data-parallel gradient reduction (and ZeRO-1/2's gather of the updated parameters) hidden behind the compute
    # by the calibrated share (cards/calibration.yaml dp_overlap, zero_grad_overlap, param_gather_overlap), as
    # meshplan's render runs it; false: run after the backward, exposed (Megatron-Core without
    # --overlap-grad-reduce, DeepSpeed ZeRO-1/2 without zero_optimization.overlap_comm)
    grad_reduce_overlap: bool = True
    torch_compile: bool = False  # torch.compile on (what it compiles: the framework card's compile section)
    expandable_segments: bool = False  # PyTorch allocator's expandable segments: the allocated peak decides the fit
    # every FSDP unit's gradient sync deferred to the step's last micro-batch, which holds its unsharded gradient until
    # then (NeMo AutoModel's distributed.defer_fsdp_grad_sync); None: the framework card's grad_accumulation.unsharded
    defer_fsdp_grad_sync: bool | None = None
    attention_backend: AttentionBackend = "auto"  # auto: the framework's own pick (its card's attention section)
    dropout: bool | None = None  # attention + hidden dropout; None: the framework's convention (cards/memory.yaml)
    # the rollout engine of an RL job (None: not an RL job); meshplan/rl/engine.py
    rollout_engine: RolloutEngine | None = None
    rollout_tp: int | None = Field(None, ge=1)
    rollout_dp: int | None = Field(None, ge=1)
    rollout_ep: int | None = Field(None, ge=1)
    rollout_memory_fraction: float | None = Field(None, gt=0.0, le=1.0)
    placement: Placement | None = None
    rollout_gpus: int | None = Field(None, ge=1, description="GPUs running the engine (separate: beside the trainer's)")
    rollout_enforce_eager: bool = False
    first_stage_layers: int | None = Field(None, ge=0, description="Uneven PP: layers on the first stage")
    last_stage_layers: int | None = Field(None, ge=0, description="Uneven PP: layers on the last stage")
    pipeline_layout: str | None = Field(
        None, min_length=1, max_length=4096,
        description="Megatron's pipeline_model_parallel_layout string (schedule.parse_layout); None = no layout",
    )
    account_for_embedding: bool = Field(False, description="The embedding counts as a layer in the even split")
    account_for_loss: bool = Field(False, description="The loss counts as a layer in the even split")
    activation_offload: bool = Field(False, description="Activations saved for backward offloaded to host")
    param_offload: bool = Field(False, description="Parameters offloaded (in the step or between phases: the card)")
    grad_offload: bool = Field(False, description="Gradients offloaded between RL phases")
    optimizer_offload: bool = Field(False, description="Optimizer state offloaded (in the step or between phases)")
    optimizer_offload_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of the optimizer state stepped on the CPU in the step"
    )

    def num_microbatches(self, global_batch_size: int) -> int:
        """Micro-batches each data-parallel rank runs per step (step_microbatches)."""
        return step_microbatches(global_batch_size, self.micro_batch_size, self.dp)

    def schedule_microbatches(self, global_batch_size: int) -> int:
        """Micro-batches one run of the pipeline schedule takes: pipeline_microbatches, else all of the step's."""
        m = self.num_microbatches(global_batch_size)
        return min(m, self.pipeline_microbatches or m)

    @property
    def runs_schedule(self) -> PipelineSchedule | None:
        """The pipeline schedule the plan runs (None: the framework's default): its pipeline_schedule, else
        combined_1f1b where moe_a2a_overlap is on, as Megatron-Core runs overlap_moe_expert_parallel_comm
        (schedules.py forward_backward_pipelining_with_interleaving's 'Combined 1F1B path'); every estimate and
        picture reads this one."""
        if self.pipeline_schedule is None and self.moe_a2a_overlap:
            return "combined_1f1b"
        return self.pipeline_schedule

    def schedule_runs(self, global_batch_size: int) -> int:
        """Runs of the pipeline schedule per optimizer step (1 unless pipeline_microbatches cuts the step)."""
        if self.pipeline_microbatches is None:  # every micro-batch in one run, read first (every rule check asks)
            return 1
        return max(1, self.num_microbatches(global_batch_size) // self.schedule_microbatches(global_batch_size))

    def short(self) -> str:
        parts = [*degree_words(self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp), f"DP{self.dp}"]
        if self.pipeline_schedule is not None:
            parts.append(self.pipeline_schedule)
        return " ".join(parts)


# The Plan fields that hold a list (today recompute_modules): a memo keyed by a plan's values
# reads them as tuples (rules/engine.py RuleGroup, estimate/layer_records.py layer_key).
PLAN_LIST_FIELDS: frozenset[str] = frozenset(
    name for name, field in Plan.model_fields.items()
    if list in (get_origin(a) for a in (field.annotation, *get_args(field.annotation))))
