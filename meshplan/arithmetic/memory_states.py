"""Model-state bytes (weights, gradients, fp32 master copy, optimizer moments) under each framework's convention.

The conventions are data (cards/memory.yaml): a list of tensors per ZeRO stage, each with its bytes per
parameter and the group it is sharded over. This module only picks the preset and multiplies, so the
ZeRO paper's Figure 1 and Megatron's `6 + 12/d` come out of the same arithmetic.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic.activation_passes import activation_fusable
from meshplan.arithmetic.activations import BF16, Fp8AttentionSaves
from meshplan.arithmetic.gdn import GdnLayer
from meshplan.arithmetic.mamba import Mamba2Layer
from meshplan.arithmetic.offload import offload_plan
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import CardError, FrameworkCard, checked_once, load_card
from meshplan.knowledge.engine_card import MemoryConvention, OptimizerImplementation, RlLossPasses
from meshplan.knowledge.families_card import families_card
from meshplan.schema.choices import Fp8Recipe, MegatronLoss
from meshplan.schema.plan import Job, Plan

TensorClass = Literal["weights", "gradients", "optimizer"]
# activations.MOE_BYTES's keys
MoeActivations = Literal["megatron_core", "generic", "fp32_router", "hf", "automodel_deepep"]
# Which precision knob rewrites a tensor (with_precision): weights (fp8_param_gather), main_grads
# (grad_reduce_in_fp32), master (the precision-aware optimizer's remainders), moments (optimizer_state_dtype).
# grad_copy: an fp32 copy of the gradient shard the optimizer keeps as its own (HybridDeviceOptimizer's GPU share)
TensorRole = Literal["weights", "main_grads", "master", "moments", "grad_copy"]


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StateTensor(_Card):
    name: str
    role: TensorRole | None = None
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
    # per logit where the job's loss skips its fp32 upcast (Job.loss_fp32_upcast false: loss_upcast); None: the
    # convention's loss has no such switch, and request/resolve refuses the field
    logits_bytes_without_upcast: float | None = Field(None, gt=0)
    loss_chunks: int = Field(1, ge=1)
    logits_over_tp: Literal["vocab_parallel", "replicated"] = Field(
        "vocab_parallel", description="vocab_parallel: each TP rank's loss holds its vocabulary shard of the logits; "
                                      "replicated: the framework gathers them whole on every TP rank first")
    embedding_over_tp: Literal["vocab_parallel", "replicated"] = Field(
        "vocab_parallel", description="vocab_parallel: the token embedding's rows split over the TP ranks; "
                                      "replicated: every TP rank holds the whole embedding")
    output_hidden_bytes: float = Field(4, ge=0)
    loss_hidden_bytes: float = Field(0, ge=0)
    # per token x hidden (replicated over TP) where a micro-batch holds more than one sequence: the chunked loss's
    # copies of its chunks (a sequence chunk of a [b, s, h] tensor is strided at b > 1, and copied; at b = 1 a view)
    loss_chunk_copy_bytes: float = Field(0, ge=0)
    fp8_weight_bytes: float = Field(0, ge=0)
    fp8_weights: Literal["fixed", "transformer_engine"] = Field(
        "fixed", description="fixed: fp8_weight_bytes; transformer_engine: per recipe and GPU (precision section)")
    # fp8 primary weights (fp8_param_gather) under sharded weights (Megatron-FSDP): fp8_weight_bytes is then per
    # parameter of the rank's shard, in place of its bf16 shard; no unsharded fp8 copy is kept (with_precision)
    fp8_weights_sharded: bool = False
    fp8_saved_inputs: Literal["fp8", "high_precision"] = Field(
        "fp8", description="what an fp8 linear layer saves of its input for the backward: fp8 (Transformer Engine's "
                           "one-byte copy) or high_precision (torchao's Float8Linear: the bf16 input, as without fp8)")
    fp8_out_proj_original_input: list[Fp8Recipe] = Field(
        [], description="fp8 recipes under which the attention's out-projection saves its bf16 input (which the "
                        "attention kernel keeps anyway) instead of an fp8 copy (Megatron's set_save_original_input)")
    qkv_projections: Literal["fused", "separate"] = Field(
        "fused", description="GQA's Q, K, V projections: one fused linear or three (op-level SAC counts each mm)")
    gathered_layers: int = Field(0, ge=0)
    gathered_bytes: float = Field(0, ge=0)
    prefetched_bytes: float = Field(0, ge=0)
    # When the step peaks (fsdp_walk.fsdp_backward_moments): worst_unit adds the worst FSDP unit's transient to every
    # activation, the loss and all model states at once; backward_walk walks the backward unit by unit as torch's
    # fully_shard runs it and takes the largest moment (cards/memory.yaml fsdp2, with the sources).
    step_peak: Literal["worst_unit", "backward_walk"] = "worst_unit"
    unsharded_param_bytes: float = Field(0, ge=0)  # per parameter of a unit while it runs (backward_walk)
    # per token x hidden (split by sequence parallelism): the hidden-state gradient a unit's backward receives and
    # passes on, alive at every decoder unit's moment (backward_walk: fsdp_walk.hidden_grad)
    hidden_grad_bytes: float = Field(0, ge=0)
    grads_set_to_none: bool = False  # the trainer frees the gradients before each step's backward (backward_walk)
    # ... where CUDA graphs are off (cuda_graphs_off): torchtitan 0.3's zero_grad(set_to_none=disable_cuda_graphs)
    grads_set_to_none_without_cuda_graphs: bool = False
    freed_grads_stay_reserved: bool = False  # those freed gradients stay cached in the reduce-scatter stream's pool
    # the output unit reduces inside the chunked loss, in its last chunk, the earlier chunks' gradients accumulated
    # unsharded in reduce_dtype (fsdp_walk.in_loss_moments)
    output_reduce_in_loss: bool = False
    output_resharded_at_loss: bool = False  # the output unit's params were freed after its forward (none at the loss)
    # per output-unit parameter held from its backward to the end of the backward (root unit: params and grads)
    output_held_bytes: float = Field(0, ge=0)
    embedding_in_root: bool = False  # the embedding is a parameter of that root unit (its output layer's stage's)
    retained_reduce_bytes: float = Field(0, ge=0)  # per parameter of the last reduced unit, kept into the next unit
    # the framework sets fully_shard's gradient_divide_factor, so over a shard of one rank foreach_reduce writes its
    # output from a quotient of the input, a reduce_dtype copy of the unit's size (fsdp_walk.reduce_output_bytes)
    reduce_divide_copy: bool = False
    # of gathered_bytes and of prefetched_bytes, the unsharded main-grad bucket at fp32 (Megatron-FSDP), which
    # grad_reduce_in_fp32 False allocates in bf16 (with_precision)
    main_grad_bucket_bytes: float = Field(0, ge=0)
    # HBM bytes per logit of the engine's loss, forward + backward (perf.head_seconds); None: a fused cross-entropy's,
    # the calibration's cross_entropy_bytes_per_logit
    loss_hbm_bytes_per_logit: float | None = Field(None, gt=0)
    # whose copies run on the compute stream at each gather and reduce of a unit: torch's fully_shard (fsdp_copy_bytes)
    compute_stream_copies: Literal["none", "fully_shard"] = "none"
    loss_reduce_bytes_per_element: float = Field(0, ge=0)  # per logit of a chunk, alive at the output unit's reduce
    # per logit alive at the backward of a root output unit's head, gathered again after the loss's peak (its copy-out
    # and the head's matmul; fsdp_walk.head_moments), or of an output unit reducing in the loss (the matmul writing its
    # weight gradient; fsdp_walk.in_loss_moments); 0: not derived, the walk lists no root's such moment
    head_backward_bytes_per_element: float = Field(0, ge=0)
    pipeline_partition: Literal["even", "compute_balanced"] = "even"
    # activations.MOE_BYTES: what a MoE layer keeps; under the flex (DeepEP/HybridEP) dispatcher the engine's own,
    # where its flex path keeps other tensors (activations.moe_bytes), else the same
    moe_activations: MoeActivations
    moe_activations_flex: MoeActivations | None = None
    # model types whose own model code upcasts the router's input and gate weight to fp32 (activations.moe_bytes)
    router_fp32_model_types: list[str] = []
    # what the attention code keeps beside Q, K, V, and what a norm keeps (activations.AttentionSaves)
    rope_saves: Literal["rotated_copies", "frequencies", "shared_tables"] = "rotated_copies"
    mla_v_view: bool = False
    attention_stats_bytes: float = Field(4, gt=0)
    norm_saves: Literal["input", "fp32_composite"] = "input"
    mla_v_pad: bool = False
    # what the MLP's activation keeps (activations._mlp): fused, the framework's kernel keeps its input (Megatron-Core's
    # bias_gelu / bias_swiglu / squared_relu, Transformer Engine's, torchtitan's F.silu), whatever the model's
    # activation; act2fn, the model code's ACT2FN class of its hidden_act keeps what the card's act2fn_saves says
    activation_saves: Literal["fused", "act2fn"] = "fused"
    # model types whose routed experts apply their own gate in place of act_fn(gate) * up: bytes per routed copy and
    # expert-width element it keeps beside fc2's input (expert_gate_bytes)
    expert_gates: dict[str, float] = {}
    zero: dict[int, list[StateTensor]]


class PrecisionBytes(_Card):
    """What the precision knobs change (cards/memory.yaml precision, with its sources)."""

    dtype_bytes: dict[str, float]
    master_remainder_bytes: float = Field(gt=0)
    fp8_weight_bytes: dict[Fp8Recipe, float]
    fp8_weight_bytes_any_layout: dict[Fp8Recipe, float]
    fp8_all_gather_bytes: float = Field(gt=0)
    # the optimizer state Megatron's HybridDeviceOptimizer keeps for the share it steps on the GPU (hybrid_optimizer)
    hybrid_gpu_states: list[StateTensor]
    source: str


class Fp8QuantizeFacts(_Card):
    """How Transformer Engine quantizes an FP8 linear's input, output gradient and weight per recipe (cards/memory.yaml
    fp8_quantize, with its source): the bf16 source's reads per quantize, the recipes that all-gather row-wise data
    only (their column-wise copy an fp8 transpose after the gather), what the norm before a LayerNormLinear fuses with
    the cast, and which of flops.py's GEMMs are those LayerNormLinears. Read by arithmetic/fp8_casts.py."""

    source_reads: dict[Fp8Recipe, int]
    rowwise_gather: list[Fp8Recipe]
    param_gather_rowwise: list[Fp8Recipe]  # fp8 primary weights gathered row-wise, the column-wise copy made after
    norm_output: dict[Fp8Recipe, Literal["fp8", "amax"]]  # a recipe left out: the norm writes bf16, quantized after
    norm_fused_linears: list[str]
    source: str


class Fp8SavedBytes(_Card):
    """What Megatron-Core's fp8 activation store and Transformer Engine's FP8 dot-product attention keep for the
    backward (cards/memory.yaml fp8_saves, with its source): bytes per element of the SwiGLU's input, of the
    attention's Q, K, V and output, and per head and token of the FP8 kernel's softmax statistics."""

    swiglu_input_bytes: float = Field(gt=0)
    attention_qkv_bytes: float = Field(gt=0)
    attention_output_bytes: float = Field(gt=0)
    attention_stats_bytes: float = Field(gt=0)
    source: str


class UnfusedGluBytes(_Card):
    """What Megatron-Core's unfused gated activation keeps beyond its fused kernel's, bytes per element of the
    activation's output width (cards/memory.yaml unfused_glu, with its source): in a dense MLP or the shared experts,
    and in the routed experts, whose routing-weight multiply keeps the product too."""

    mlp_bytes: float = Field(ge=0)
    routed_bytes: float = Field(ge=0)
    source: str


class CrossEntropyBytes(_Card):
    """One of Megatron-Core's cross-entropy losses (cards/memory.yaml megatron_cross_entropy, with the count): what
    it keeps per logit at its peak and what its own kernels move per logit, forward + backward."""

    logits_bytes_per_element: float = Field(gt=0)
    hbm_bytes_per_logit: float = Field(gt=0)
    # its forward's share, what a no-grad pass moves (None: not split in the count, a third of the whole taken)
    forward_hbm_bytes_per_logit: float | None = Field(None, gt=0)
    source: str


class CompileBytes(_Card):
    """What torch.compile changes in a convention (cards/memory.yaml compile, with the derivation)."""

    logits_bytes_per_element: float = Field(gt=0)  # a compiled loss at its peak
    swiglu_unfused: bool = False  # compiled blocks: silu recomputed, not saved


class OptimizerStates(_Card):
    """What each optimizer keeps beside the fp32 master (cards/memory.yaml optimizers, with its sources)."""

    moment_buffers: dict[Literal["adam", "muon"], int]
    source: str


class StepSegments(_Card):
    """The whole-partition tensors DeepSpeed ZeRO-1/2's gradient reduction and step allocate, each one tensor, in
    order (cards/memory.yaml optimizer_steps.deepspeed_zero.segments, with the derivation and source): the reduce
    bucket, the contiguous 16-bit gradient partition at the stages it is kept beside the gradients, and the step's
    copies of that partition (bytes per stepped parameter each)."""

    zero_stages: list[int]
    reduce_bucket_elements: int = Field(ge=0)
    reduce_bucket_bytes: float = Field(gt=0)
    partition_grad_bytes: dict[int, float]  # per ZeRO stage, where the partition is a buffer of its own
    step_copies: list[float]
    source: str


class OptimizerStepBytes(_Card):
    """What one optimizer implementation allocates inside optimizer.step() beyond the model states (cards/memory.yaml
    optimizer_steps, with its source): `moment_copies` tensors in the moments' dtype plus `bytes` per parameter of
    what it steps at once (`at_once`: every parameter the GPU steps, its largest tensor, or DeepSpeed ZeRO-3's sub
    group); with `when_grads_16bit`, only when the main grads are kept in 16 bits, and with `not_when_decoupled`, not
    where the optimizer reads those 16-bit gradients themselves (decoupled_grads). And, for the step time, its HBM
    traffic per parameter where it makes more passes than a fused step (`hbm_bytes_per_param`)."""

    moment_copies: float = Field(0, ge=0)
    bytes: float = Field(0, ge=0)
    at_once: Literal["stepped", "largest_tensor", "sub_group"] = "stepped"
    zero3_sub_group_params: int | None = Field(None, ge=1)
    when_grads_16bit: bool = False
    # none where the optimizer reads the gradient buffer's own 16-bit shard (Megatron's decoupled_grad: decoupled_grads)
    not_when_decoupled: bool = False
    # there the optimizer holds the master itself and allocates it with its other state (lazy_state_bytes)
    decoupled_master_lazy: bool = False
    # when the optimizer's per-parameter state is first allocated: inside the first step(), or at construction
    # (cards/memory.yaml optimizer_state_allocation_source)
    state_allocated: Literal["first_step", "init"] = "first_step"
    # the step's HBM traffic per fp32 parameter where its kernels make more passes than one fused read-modify-write
    # (the step time reads it; None: cards/calibration.yaml optimizer_bytes_per_param, the fused step's)
    hbm_bytes_per_param: float | None = Field(None, gt=0)
    # the whole-partition tensors the reduction and step allocate one after another (DeepSpeed ZeRO-1/2), which the
    # backward's cached blocks cannot serve (step_segment_bytes)
    segments: StepSegments | None = None
    source: str


class MuonPhase(_Card):
    """Bytes per element at one moment of Muon's update of one matrix (cards/memory.yaml muon_step): over the rank's
    fp32 shard (local), the whole matrix when Muon all-gathers it (gathered), the matrix Newton-Schulz runs on
    (ortho) and its m x m Gram matrix (square, m the smaller side)."""

    local: float = Field(0, ge=0)
    gathered: float = Field(0, ge=0)
    ortho: float = Field(0, ge=0)
    square: float = Field(0, ge=0)


class MuonStepBytes(_Card):
    """What Muon's step allocates while it orthogonalizes one matrix, phase by phase (cards/memory.yaml muon_step)."""

    phases: dict[str, MuonPhase]
    source: str


class ActivationSaves(_Card):
    """What one ACT2FN activation keeps for its backward besides its output (cards/memory.yaml act2fn_saves)."""

    input: bool  # the tensor it is given
    inner_bytes: float = Field(ge=0)  # its intermediates, bytes per element of its input


class Act2FnSaves(_Card):
    source: str
    activations: dict[str, ActivationSaves]


class MemoryCard(_Card):
    description: str
    precision: PrecisionBytes
    fp8_quantize: Fp8QuantizeFacts
    fp8_saves: Fp8SavedBytes
    unfused_glu: UnfusedGluBytes
    megatron_cross_entropy: dict[MegatronLoss, CrossEntropyBytes]
    optimizers: OptimizerStates
    optimizer_steps: dict[OptimizerImplementation, OptimizerStepBytes]
    optimizer_state_allocation_source: str
    muon_step: dict[str, MuonStepBytes]  # per implementation, the framework card's muon.step
    compile: CompileBytes
    act2fn_saves: Act2FnSaves
    fixed_overhead_bytes: int = Field(ge=0)
    fixed_overhead_source: str
    cuda_context_bytes: int = Field(ge=0)
    cuda_context_source: str
    allocator_reserve_fraction: float = Field(ge=0, lt=1)
    allocator_reserve_source: str
    expandable_segments_slack_bytes: int = Field(ge=0)
    expandable_segments_source: str
    mamba2_layer: Mamba2Layer
    gdn_layer: GdnLayer
    conventions: dict[str, Convention]


def memory_card() -> MemoryCard:
    """cards/memory.yaml, checked to name every convention and optimizer implementation the framework cards may name
    (once per loaded card: checked_once)."""
    return checked_once(load_card("memory", MemoryCard), _complete)


def mixer_rows(job: Job) -> dict[str, tuple]:
    """A Layout's `mamba` and `gdn` fields: the card's rows (what each layer saves) of the hybrid mixers the model
    has, () for one it lacks. The memory estimate and the search's floors both build their Layout with them."""
    card, model = memory_card(), job.model
    return {"mamba": card.mamba2_layer.terms() if model.mamba else (),
            "gdn": card.gdn_layer.terms() if model.gdn else ()}


def _complete(card: MemoryCard) -> None:
    for name in get_args(MemoryConvention):  # every convention a framework card may name
        if name not in card.conventions:
            raise CardError(f"cards/memory.yaml: key conventions.{name} is missing.")
    for name in get_args(OptimizerImplementation):  # every implementation a framework card may name
        if name not in card.optimizer_steps:
            raise CardError(f"cards/memory.yaml: key optimizer_steps.{name} is missing.")
    for recipe in get_args(Fp8Recipe):  # every recipe a plan may run, its quantize passes and its fp8 copies
        if recipe not in card.fp8_quantize.source_reads or recipe not in card.precision.fp8_weight_bytes:
            raise CardError(f"cards/memory.yaml: fp8 recipe {recipe!r} needs fp8_quantize.source_reads and "
                            "precision.fp8_weight_bytes entries.")
    known = families_card().activations  # every activation a config.json may name, and only those
    if set(card.act2fn_saves.activations) != set(known):
        raise CardError(f"cards/memory.yaml: act2fn_saves.activations names {sorted(card.act2fn_saves.activations)}, "
                        f"cards/model_families.yaml activations {sorted(known)}: they name the same.")


def activation_saves(conv: Convention, activation: str) -> tuple[bool, float] | None:
    """A Layout's `act`: what the model's activation keeps for its backward under `conv` (its activation_saves), as
    (keeps its input, bytes of intermediates per element), the card's act2fn_saves; None where the framework's fused
    kernel keeps the activation's input whatever it is."""
    if conv.activation_saves == "fused":
        return None
    saves = memory_card().act2fn_saves.activations.get(activation)
    if saves is None:
        raise MeshplanError(f"The model's activation {activation!r} is none transformers' ACT2FN knows, so what its "
                            f"MLP keeps is not known; it takes {', '.join(memory_card().act2fn_saves.activations)}.",
                            fix="Give the model's activation (Architecture.activation, config.json hidden_act) as "
                                "one of those.")
    return saves.input, saves.inner_bytes


def expert_gate_bytes(conv: Convention, model_type: str) -> float:
    """A Layout's `expert_gate`: what the model's own routed-experts gate keeps under `conv` (its expert_gates), 0
    where its experts run the activation act2fn counts."""
    return conv.expert_gates.get(model_type, 0.0)


def convention_name(card: FrameworkCard, zero_stage: int, version: str | None = None) -> str:
    """The byte preset: the framework card's memory_convention (of that release, where one differs), or at ZeRO-3
    its engine.zero3_memory_convention where it has one (Megatron-FSDP for Megatron-Core/Bridge; FSDP2 where verl
    and SkyRL switch engine)."""
    if zero_stage == 3 and card.engine.zero3_memory_convention is not None:
        return card.engine.zero3_memory_convention
    return card.convention_for(version)


def uses_fsdp(card: FrameworkCard, zero_stage: int) -> bool:
    """FSDP-style sharding: torchtitan/KempnerForge always; verl/SkyRL/DeepSpeed at zero_stage 3."""
    return card.memory_convention.startswith("fsdp2") or zero_stage == 3


def replicates_by_sharding(card: FrameworkCard, zero_stage: int, version: str | None = None) -> bool:
    """Whether the framework runs this ZeRO-0 as FSDP2's fully_shard over a shard of one data-parallel rank with every
    data-parallel rank a replica (HSDP), not as DDP (the card's engine.replica_shard: torchtitan 0.3.0, whose
    parallelize always calls apply_fsdp_to_decoder): the estimate takes it as ZeRO-3 at dp_replicate = dp (its
    states and transient, convention; its shard groups and replicas, state_replicas; its units' traffic,
    sharding_traffic.sharding_schedule)."""
    facts = card.engine.replica_shard
    return zero_stage == 0 and facts is not None and facts.shards(card.engine_at(0), version)


def state_replicas(job: Job, plan: Plan) -> int:
    """The data-parallel replicas the model states are copied over, each sharding them over its own ranks: the plan's
    dp_replicate (hybrid sharding), or every data-parallel rank where ZeRO-0 is fully_shard over a shard of one
    (replicates_by_sharding). Every reader of the shard groups and the replicas' all-reduce takes it (memory.
    state_shards, perf.dp_traffic, the assumptions)."""
    zero_stage = plan.zero_stage
    if zero_stage:  # (replicas_at's, without its call: ZeRO-0 alone may shard over one)
        return plan.dp_replicate
    return replicas_at(job, zero_stage, plan.dp, plan.dp_replicate)


def replicas_at(job: Job, zero_stage: int, dp: int, dp_replicate: int = 1) -> int:
    """state_replicas at a ZeRO stage and data-parallel degree, before a plan is made (the search's memory floors,
    search/floors.py, shard the states over dp x cp / these replicas as memory.state_shards does). The ZeRO stage is
    read first: the search asks this of thousands of grids an ask, most at a stage that cannot shard over one, and
    the job's card is not read for those."""
    if zero_stage:
        return dp_replicate
    return dp if replicates_by_sharding(job.card, 0, job.framework_version) else dp_replicate


def optimizer_sharded(card: FrameworkCard, zero_stage: int, version: str | None = None) -> bool:
    """Whether the engine at this ZeRO stage keeps its optimizer states (fp32 master, moments) on a dp shard, so its
    step updates that shard and all-gathers the updated weights: ZeRO-1 and up, and DeepSpeed's bf16 ZeRO-0, whose
    BF16_Optimizer shards them itself (cards/memory.yaml deepspeed "0")."""
    return any(t.tensor_class == "optimizer" and t.shard == "dp" for t in convention(card, zero_stage, version)[2])


def convention(card: FrameworkCard, zero_stage: int,
               version: str | None = None) -> tuple[str, Convention, list[StateTensor]]:
    """The preset and its tensor list for this ZeRO stage; an unsupported stage is a clear error."""
    # fully_shard over a shard of one (replicates_by_sharding, asked of ZeRO-0 alone: the search asks this per plan)
    stage = 3 if zero_stage == 0 and replicates_by_sharding(card, 0, version) else zero_stage
    name = convention_name(card, stage, version)
    conv = memory_card().conventions[name]
    if name.startswith("fsdp2") and stage == 1:
        stage = 2  # FSDP has no optimizer-only sharding; SHARD_GRAD_OP is the nearest
    if stage not in conv.zero:
        raise MeshplanError(
            f"zero_stage={zero_stage} is not a mode of {card.name} (memory convention {name!r}).",
            fix=f"Use zero_stage in {sorted(conv.zero)}.",
        )
    return name, conv, conv.zero[stage]


def fp8_recipe(job: Job, plan: Plan) -> Fp8Recipe | None:
    """The FP8 recipe an fp8 job runs: the plan's, else the framework card's default; None without fp8."""
    if job.precision != "fp8":
        return None
    return plan.fp8_recipe or job.card.defaults.fp8_recipe


def optimizer_fp8_recipe(job: Job, plan: Plan) -> Fp8Recipe | None:
    """The fp8_recipe Megatron-Core's OptimizerConfig holds, which decides its precision-aware optimizer's path
    (decoupled_grads): the recipe an fp8 job runs; without fp8, the plan's or the framework's default recipe where the
    framework writes it into that config whatever the precision (defaults.fp8_recipe_reaches_optimizer:
    Megatron-Bridge's MixedPrecisionConfig, tensorwise), else None."""
    recipe = fp8_recipe(job, plan)
    if recipe is None and job.card.defaults.fp8_recipe_reaches_optimizer:
        return plan.fp8_recipe or job.card.defaults.fp8_recipe
    return recipe


def fp8_param_gather(job: Job, plan: Plan) -> bool:
    """FP8 primary weights, kept and all-gathered in one byte by an fp8 job: the plan's choice, else the framework's
    default for the recipe. The one predicate of every reader (the memory's weight bytes, the FSDP units' and the
    distributed optimizer's all-gathers: sharding_traffic.param_gather_bytes, optimizer_gather_bytes). Only
    Megatron-Bridge has such a default: its mixed-precision presets keep them for delayed, tensorwise and mxfp8 (its
    card's mixed_precision_presets; Megatron-Bridge v0.6.0 training/mixed_precision.py bf16_with_fp8_delayed_scaling_
    mixed and the tensorwise and mxfp8 presets set fp8_param_gather = True, and setup copies it onto the model's
    fp8_param and the DDP config, where Megatron-FSDP builds the weights in fp8 (megatron_fsdp param_and_grad_buffer.py
    init_param_with_fp8 = ddp_config.fp8_param_gather, core_v0.15.0) and gathers them from a uint8 buffer, as the
    distributed optimizer does); Megatron-Core's fp8_param_gather, torchtitan's and KempnerForge's
    enable_fsdp_float8_all_gather and NeMo AutoModel's are False by default. False without fp8."""
    if job.precision != "fp8":
        return False
    if plan.fp8_param_gather is not None:
        return plan.fp8_param_gather
    recipe = fp8_recipe(job, plan)
    presets = job.card.mixed_precision_presets
    return recipe is not None and presets is not None and presets.keeps_fp8_params(recipe)


def fp8_inputs(job: Job, conv: Convention) -> bool:
    """Whether the linear layers keep their saved inputs in one byte: fp8 under a convention whose fp8 linears save
    fp8 copies (Transformer Engine); torchao's Float8Linear saves the bf16 input, as bf16 training does."""
    return job.precision == "fp8" and conv.fp8_saved_inputs == "fp8"


def swiglu_input_bytes(job: Job) -> float:
    """Bytes per element of fc1's output the fused SwiGLU keeps for its backward (activations.Layout.act_input_bytes):
    one under Megatron-Core's activation_func_fp8_input_store (Job.fp8_activation_input_store, rule PR006), else
    bf16's two."""
    return memory_card().fp8_saves.swiglu_input_bytes if job.fp8_activation_input_store else BF16


def unfused_glu_bytes(job: Job) -> tuple[float, float]:
    """(dense MLP or shared experts, routed experts): bytes per element of the activation's output width that
    Megatron-Core's unfused glu() keeps beyond the fused kernel (activations.Layout.unfused_glu; cards/memory.yaml
    unfused_glu), where a framework with the switch (Megatron-Core's MLP) runs a gated MLP unfused: the job turns
    bias_activation_fusion off, or its activation is one Megatron-Core never fuses (Gemma 2's fast_gelu); (0, 0)
    otherwise."""
    if job.card.defaults.bias_activation_fusion is None or not job.model.gated_mlp:
        return (0.0, 0.0)
    if job.bias_activation_fusion and activation_fusable(job.model):
        return (0.0, 0.0)
    card = memory_card().unfused_glu
    return (card.mlp_bytes, card.routed_bytes)


def swiglu_store_cast_bytes(job: Job) -> float:
    """HBM bytes per element of fc1's output that the fp8 store of the SwiGLU's input moves, forward and backward
    (layer_time.elementwise_seconds): the forward's cast to float8_e4m3fn reads the bf16 tensor and writes the fp8
    copy, the backward's cast back reads the fp8 copy and writes a bf16 tensor (two kernels of their own beside the
    fused SwiGLU: cards/memory.yaml fp8_saves). 0 without the store."""
    if not job.fp8_activation_input_store:
        return 0.0
    return 2 * (BF16 + swiglu_input_bytes(job))  # the forward's cast and the backward's, each bf16 and fp8 once


def fp8_attention_saves(job: Job, cp: int | None) -> Fp8AttentionSaves | None:
    """What FP8 dot-product attention keeps (activations.Layout.fp8_attention; Job.fp8_dot_product_attention, rule
    PR007): fp8 Q, K, V and output, and, at cp 1, the FP8 kernel's M and ZInv in place of the log-sum-exp (the
    context-parallel ring keeps its softmax_lse: stats None; cp None, a floor over every cp, takes that smaller
    count). None where the job runs bf16 attention."""
    if not job.fp8_dot_product_attention:
        return None
    saves = memory_card().fp8_saves
    return Fp8AttentionSaves(qkv=saves.attention_qkv_bytes, output=saves.attention_output_bytes,
                             stats=saves.attention_stats_bytes if cp == 1 else None)


def fp8_out_proj_copy(job: Job, plan: Plan, conv: Convention) -> bool:
    """Whether the attention's out-projection keeps its own fp8 copy of the core attention's output beside the bf16
    one: under fp8 linear inputs (fp8_inputs) and a recipe the convention does not list in
    fp8_out_proj_original_input (Megatron: delayed scaling; its other recipes save the original bf16 input)."""
    return fp8_inputs(job, conv) and fp8_recipe(job, plan) not in conv.fp8_out_proj_original_input


def precision_aware(plan: Plan) -> bool:
    """Megatron's precision-aware optimizer is on: moments in a 16- or 8-bit dtype (fp32 moments = the default)."""
    return plan.optimizer_state_dtype not in (None, "fp32")


def hybrid_optimizer(job: Job, plan: Plan) -> bool:
    """Whether Megatron's HybridDeviceOptimizer steps the job's optimizer: a share of it offloaded to the CPU in the
    step (optimizer_cpu_offload / optimizer_offload_fraction, offload.offload_plan's cpu_optimizer) on Megatron's
    distributed optimizer (the megatron convention; Megatron-FSDP has no CPU optimizer), which builds it in place of
    the precision-aware FusedAdam (cards/memory.yaml precision.hybrid_gpu_states)."""
    return (offload_plan(job.card, plan).cpu_optimizer > 0
            and convention_name(job.card, plan.zero_stage, job.framework_version) == "megatron")


def decoupled_grads(job: Job, plan: Plan) -> bool:
    """Whether Megatron's distributed optimizer hands its optimizer the gradient buffer's own shard
    (`decoupled_grad`) instead of keeping an fp32 master and an fp32 copy of each gradient shard itself: the
    precision-aware optimizer where its OptimizerConfig holds no fp8 recipe or delayed scaling
    (optimizer_fp8_recipe: on Megatron-Bridge a bf16 run's holds tensorwise), or with any recipe under
    optimizer_cpu_offload (megatron-core 24bad8e677 optimizer_config.py use_precision_aware_optimizer_no_fp8_or_ds_fp8,
    with meshplan's fp32 main params; distrib_optimizer.py _copy_model_grads_to_main_grads). Transformer Engine's
    FusedAdam then keeps the fp32 master (as 16-bit remainders of bf16 weights); HybridDeviceOptimizer keeps fp32
    copies of its own (hybrid_optimizer). One predicate of the master's bytes (with_precision) and the step's copies
    (optimizer_step_temporaries)."""
    return precision_aware(plan) and (optimizer_fp8_recipe(job, plan) in (None, "delayed")
                                      or hybrid_optimizer(job, plan))


def with_precision(job: Job, plan: Plan) -> tuple[str, Convention, list[StateTensor]]:
    """The convention and tensors of `convention`, rewritten by the plan's precision knobs: moments in
    optimizer_state_dtype, the fp32 master as 16-bit remainders under the precision-aware optimizer (bf16 weights,
    bf16 or delayed-scaling fp8), the main grads in fp32 or bf16 (grad_reduce_in_fp32; Megatron-FSDP's unsharded
    main-grad bucket too, main_grad_bucket_bytes), and the fp8 weight bytes per
    linear-layer parameter for the recipe and GPU (less the bf16 weight with fp8_param_gather); and torch.compile's
    loss and SwiGLU bytes (compiled)."""
    name, conv, tensors = convention(job.card, plan.zero_stage, job.framework_version)
    prec = memory_card().precision
    recipe = fp8_recipe(job, plan)
    aware = precision_aware(plan)
    gather = fp8_param_gather(job, plan)
    hybrid = aware and hybrid_optimizer(job, plan)
    remainders = decoupled_grads(job, plan) and not gather and not hybrid
    out = []
    for t in tensors:
        update: dict = {}
        if hybrid and t.role in ("master", "moments"):
            continue  # HybridDeviceOptimizer's own fp32 states, whatever optimizer_state_dtype says: added below
        if t.role == "moments" and aware:
            dtype = plan.optimizer_state_dtype
            update = {"bytes": 2 * prec.dtype_bytes[dtype], "name": f"Adam moments ({dtype} m, v)"}
        elif t.role == "master" and remainders:
            update = {"bytes": prec.master_remainder_bytes, "name": "fp32 master as 16-bit remainders of bf16 weights"}
        elif t.role == "main_grads" and plan.grad_reduce_in_fp32 is not None:
            dtype = "fp32" if plan.grad_reduce_in_fp32 else "bf16"
            update = {"bytes": prec.dtype_bytes[dtype], "name": f"{dtype} main grads"}
        out.append(t.model_copy(update=update) if update else t)
    if hybrid:  # its fp32 gradient copy only of a 16-bit gradient shard: .to(fp32) of an fp32 one is that tensor
        grads_16bit = any(t.role == "main_grads" and t.bytes < prec.dtype_bytes["fp32"] for t in out)
        out.extend(t for t in prec.hybrid_gpu_states if t.role != "grad_copy" or grads_16bit)
    conv_update: dict = {}
    gathered_cut = 0.0  # per parameter of the gathered and prefetched FSDP units, off conv's gathered bytes
    if recipe is not None and conv.fp8_weights == "transformer_engine":
        table = prec.fp8_weight_bytes_any_layout if job.gpu.fp8_any_layout else {}
        weight = table.get(recipe, prec.fp8_weight_bytes[recipe])
        sharded = [t.bytes for t in out if t.role == "weights" and t.shard != "none"]
        if gather and sharded:  # Megatron-FSDP: the fp8 weight is the sharded parameter, gathered unit by unit
            weight, gathered_cut = fp8_sharded_primary(recipe, weight, sum(sharded))
            conv_update["fp8_weights_sharded"] = True
        elif gather:  # the fp8 weight is the parameter: the unsharded bf16 one is not kept
            weight -= sum(t.bytes for t in out if t.role == "weights" and t.shard == "none")
        conv_update["fp8_weight_bytes"] = weight
    if gather and conv.prefetched_bytes and conv.fp8_weights == "fixed":
        conv_update["prefetched_bytes"] = prec.fp8_all_gather_bytes
    if gather and conv.unsharded_param_bytes and conv.fp8_weights == "fixed":
        conv_update["unsharded_param_bytes"] = prec.fp8_all_gather_bytes
    if plan.grad_reduce_in_fp32 is False and conv.retained_reduce_bytes:
        conv_update.update(reduce_input_in(conv, prec.dtype_bytes["bf16"]))
    if plan.grad_reduce_in_fp32 is False and conv.main_grad_bucket_bytes:  # Megatron-FSDP's bucket in bf16
        gathered_cut += conv.main_grad_bucket_bytes - prec.dtype_bytes["bf16"]
    if gathered_cut:
        conv_update |= {"gathered_bytes": conv.gathered_bytes - gathered_cut,
                        "prefetched_bytes": conv.prefetched_bytes - gathered_cut}
    conv_update.update(megatron_loss_bytes(job, plan))
    conv_update.update(rl_loss_bytes(job, plan))
    conv_update.update(loss_upcast(job, conv))
    conv_update.update(compiled(job, plan))
    return name, (conv.model_copy(update=conv_update) if conv_update else conv), out


def fp8_sharded_primary(recipe: Fp8Recipe, gathered: float, bf16_shard: float) -> tuple[float, float]:
    """(fp8_weight_bytes, gathered cut) of fp8 primary weights under Megatron-FSDP (cards/memory.yaml
    conventions.megatron_fsdp, beside fp8_weights, with its source): each rank keeps its shard of the fp8 parameter
    in place of the bf16 one,
    row-wise data only for the recipes gathered row-wise (fp8_quantize.param_gather_rowwise: the column-wise copy, made
    after the gather where the GPU needs it, is dropped with the unit), both layouts otherwise; Transformer Engine
    takes a quantized weight as it is and caches no fp8 workspace of it, so no unsharded copy stays between units.
    A gathered or prefetched unit holds `gathered` bytes (the recipe's fp8 weight on the GPU) per parameter in place
    of bf16's: the cut off the convention's gathered_bytes and prefetched_bytes."""
    card = memory_card()
    full = card.precision.fp8_weight_bytes[recipe]
    shard = full / 2 if recipe in card.fp8_quantize.param_gather_rowwise else full
    return shard - bf16_shard, card.precision.dtype_bytes["bf16"] - gathered


def reduce_input_in(conv: Convention, dtype_bytes: float) -> dict[str, float]:
    """FSDP2's reduce-scatter input in another reduce_dtype than the convention's (its figures are at fp32, the
    default MixedPrecisionPolicy of every FSDP2 framework meshplan writes): torch 2.13 _fsdp_collectives.py
    foreach_reduce allocates the input in reduce_dtype (reduce_dtype or the gradients' dtype, FSDPParam clamping a
    reduce_dtype equal to param_dtype to None) and copies the unsharded gradients (param_dtype, bf16) into it, so of a
    unit's `gathered_bytes` (unsharded gradients + input) and the input the next unit's backward still holds
    (`retained_reduce_bytes`, the input's own bytes) the input moves to `dtype_bytes`; the gradients do not."""
    return {"gathered_bytes": unsharded_grad_bytes(conv) + dtype_bytes, "retained_reduce_bytes": dtype_bytes}


class FsdpCopyBytes(NamedTuple):
    """HBM bytes per parameter of a unit that FSDP2's own copies move on the compute stream (cards/memory.yaml
    fsdp2 compute_stream_copies, with the source): at each gather over one rank, over more ranks, and at each
    reduce."""

    gather_one_rank: float  # the cast to param_dtype (where the storage differs) and the copy into the unsharded
    gather: float  # the copy-out of the all-gather output into the unsharded parameters
    reduce: float  # the chunk_cat of the unsharded gradients into the reduce-scatter input


def fsdp_copy_bytes(conv: Convention, tensors: list[StateTensor]) -> FsdpCopyBytes | None:
    """What fully_shard copies on the compute stream per parameter of a unit (`conv` and `tensors` as with_precision
    gives them: the unsharded bytes of an fp8 all-gather, the reduce_dtype of grad_reduce_in_fp32); None where the
    convention's engine is not torch's fully_shard, or nothing is sharded (no sharded weight: no unit gathers)."""
    if conv.compute_stream_copies != "fully_shard":
        return None
    stored = next((t.bytes for t in tensors if t.tensor_class == "weights" and t.shard == "dp"), None)
    if stored is None:
        return None
    unsharded = conv.unsharded_param_bytes
    cast = stored + unsharded if stored != unsharded else 0.0
    return FsdpCopyBytes(gather_one_rank=cast + 2 * unsharded, gather=2 * unsharded, reduce=conv.gathered_bytes)


def unsharded_grad_bytes(conv: Convention) -> float:
    """Bytes per parameter of a unit's unsharded gradients as its backward writes them (param_dtype, bf16): of the
    unit's `gathered_bytes` at its reduce (those gradients + the reduce-scatter input), what the input
    (`retained_reduce_bytes`) leaves."""
    return conv.gathered_bytes - conv.retained_reduce_bytes


def cuda_graphs_off(plan: Plan) -> bool:
    """Whether a torchtitan 0.3 run of the plan turns its CUDA graphs off (--training.disable_cuda_graphs, which render
    writes there): its config validation rejects the captured step with pipeline parallelism and with the default
    all-to-all expert dispatcher, which synchronises with the CPU (torchtitan/trainer.py _validate_cuda_graphs), and
    with them off its train_step frees the gradients, zero_grad(set_to_none=disable_cuda_graphs)."""
    return plan.pp > 1 or plan.ep > 1


def as_the_plan_runs(conv: Convention, plan: Plan) -> Convention:
    """The convention as this plan's layout runs it: gradients freed before each step where the trainer frees them
    only with its CUDA graphs off and the layout turns them off (cuda_graphs_off). Read once per layout (the memory's
    LayoutTerms, memoised per layout, not with_precision's per-engine terms, which layouts of other degrees share)."""
    if conv.grads_set_to_none_without_cuda_graphs and not conv.grads_set_to_none and cuda_graphs_off(plan):
        return conv.model_copy(update={"grads_set_to_none": True})
    return conv


def megatron_loss(job: Job, plan: Plan) -> CrossEntropyBytes | None:
    """The Megatron-Core cross-entropy the job runs (cards/memory.yaml megatron_cross_entropy): the unfused
    vocab-parallel one, or with cross_entropy_loss_fusion its cross_entropy_fusion_impl, native or Transformer
    Engine's; on a framework without the switch, the one the plan's engine calls itself (the card's
    engine.megatron_loss: verl's Megatron engine, Megatron-DeepSpeed), else None (its convention's loss). The one
    reading the memory (megatron_loss_bytes) and the loss's time (perf.loss_hbm_bytes) take."""
    name = megatron_loss_name(job, plan)
    return None if name is None else memory_card().megatron_cross_entropy[name]


def megatron_loss_name(job: Job, plan: Plan) -> MegatronLoss | None:
    """megatron_loss's key: unfused, or the fused implementation the job names; a job built without the fields (not
    by request/resolve, which writes them) takes the framework's default for its model (the card's
    defaults.cross_entropy); on a framework without the switch, the loss the engine of the plan's ZeRO stage calls
    itself (engine.megatron_loss; per plan, since a search moves verl between its Megatron and FSDP engines), else
    None."""
    if job.cross_entropy_loss_fusion is None:
        default = job.card.defaults.cross_entropy(job.model.model_type)
        if default is None:
            return job.card.engine.megatron_loss.get(job.card.engine_at(plan.zero_stage))
        fusion, impl = default
    else:
        fusion, impl = job.cross_entropy_loss_fusion, job.cross_entropy_fusion_impl
    return impl if fusion else "unfused"


def megatron_loss_bytes(job: Job, plan: Plan) -> dict:
    """The convention's bytes per logit at the loss's peak as the job's Megatron-Core cross-entropy keeps them
    (megatron_loss); nothing where the job runs none."""
    loss = megatron_loss(job, plan)
    return {} if loss is None else {"logits_bytes_per_element": loss.logits_bytes_per_element}


def rl_loss(job: Job, plan: Plan) -> RlLossPasses | None:
    """The RL actor's loss path the plan's engine runs (the framework card's engine.rl_loss: verl's and SkyRL's
    temperature division, log-probs and entropy), for an RL job on an engine the card counts; else None. The one the
    loss's time (perf.loss_hbm_bytes, perf.log_prob_loss_bytes) and its memory (rl_loss_bytes) read."""
    if job.rl is None:
        return None
    return job.card.engine.rl_loss.get(job.card.engine_at(plan.zero_stage))


def rl_loss_bytes(job: Job, plan: Plan) -> dict:
    """The convention's bytes per logit at the loss's peak as the RL actor's loss path keeps them (rl_loss): the
    update's, or a no-grad log-prob pass's where the job is that pass's estimate (RLJob.log_prob_pass), in place of
    the convention's or the Megatron loss's; nothing where the job runs none."""
    passes = rl_loss(job, plan)
    if passes is None:
        return {}
    kept = passes.log_prob_logits_bytes_per_element if job.rl.log_prob_pass else passes.logits_bytes_per_element
    return {"logits_bytes_per_element": kept}


def loss_upcast(job: Job, conv: Convention) -> dict:
    """The loss's bytes per logit where the job's cross-entropy runs on the bf16 logits without its fp32 upcast
    (Job.loss_fp32_upcast false; NeMo AutoModel's MaskedCrossEntropy fp32_upcast, cards/memory.yaml
    fsdp2_automodel): the convention's logits_bytes_without_upcast, the same tensors in bf16."""
    if job.loss_fp32_upcast or conv.logits_bytes_without_upcast is None:
        return {}
    return {"logits_bytes_per_element": conv.logits_bytes_without_upcast}


def upcast_switch(card: FrameworkCard, version: str | None) -> bool:
    """Whether every memory convention the framework's jobs run under prices a loss without its fp32 upcast (the
    request's loss_fp32_upcast=false): the card's convention of that release and its ZeRO-3 engine's, if any."""
    names = {card.convention_for(version), card.engine.zero3_memory_convention} - {None}
    return all(memory_card().conventions[n].logits_bytes_without_upcast is not None for n in names)


def compiled(job: Job, plan: Plan) -> dict:
    """The convention fields torch.compile rewrites (cards/memory.yaml compile), for what the framework compiles
    (its card's compile section): a compiled loss keeps no fp32 copy of the logits, compiled blocks a fused SwiGLU."""
    scope = job.card.compile
    if not plan.torch_compile or scope is None:
        return {}
    comp = memory_card().compile
    update: dict = {}
    if scope.loss:
        update["logits_bytes_per_element"] = comp.logits_bytes_per_element
    if scope.blocks:
        update["swiglu_unfused"] = comp.swiglu_unfused
    return update


def state_bytes(tensors: list[StateTensor], params: float, shard_size: float) -> dict[str, float]:
    """Bytes per class for `params` parameters whose sharded tensors are split `shard_size` ways."""
    out = {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}
    for t in tensors:
        out[t.tensor_class] += t.bytes * params / (shard_size if t.shard == "dp" else 1)
    return out


_CLASSES = ("weights", "gradients", "optimizer")  # state_bytes' classes, in its dict's order


def states_at_shards(tensors: list[StateTensor], dense_shard: float, expert_shard: float | None) -> tuple:
    """A stage's model-state tensors as a layout holds them, names left out: per tensor its class, role and bytes per
    dense and per routed-expert parameter as state_bytes splits them over the layout's shard sizes (`expert_shard`
    None: no routed experts), and whether it is a sharded weight. Two ZeRO stages of one convention with the same
    tuple hold the same bytes, since a tensor sharded over one rank is the whole tensor: Megatron's or nanotron's
    ZeRO-1 at dp x cp 1 holds its fp32 master weights and moments as ZeRO-0 does (search/zero_stages.one_plan_key
    reads it). A sharded weight stays marked at any shard size: a stage that shards the weights gathers them unit by
    unit (the memory's gathered layers, fully_shard's copies), on one rank too."""
    return tuple(sorted(
        (t.tensor_class, t.role or "", t.bytes / (dense_shard if t.shard == "dp" else 1),
         0.0 if expert_shard is None else t.bytes / (expert_shard if t.shard == "dp" else 1),
         t.tensor_class == "weights" and t.shard == "dp")
        for t in tensors))


def state_classes(tensors: list[StateTensor], memo: dict) -> tuple[tuple[int, float, bool], ...]:
    """What state_bytes reads of each of `tensors`, in order: its class's place in state_bytes' dict, its bytes per
    parameter and whether it is sharded; kept in `memo` per list (a caller's kept lists: an id names no other)."""
    key = ("classes", id(tensors))
    hit = memo.get(key)
    if hit is None or hit[0] is not tensors:
        hit = memo[key] = (tensors, tuple((_CLASSES.index(t.tensor_class), t.bytes, t.shard == "dp") for t in tensors))
    return hit[1]


def state_sums(classes: tuple[tuple[int, float, bool], ...], params: float, shard_size: float) -> tuple[float, float]:
    """sum(state_bytes(tensors, params, shard_size).values()) and its gradients' entry, from the tensors'
    state_classes: the same operations in the same order (each class summed from 0.0 in the tensors' order, then the
    classes in the dict's), so the same floats to the last bit without building the dict (the search's floors ask it
    of thousands of layouts)."""
    totals = [0.0, 0.0, 0.0]
    for index, size, sharded in classes:
        totals[index] += size * params / (shard_size if sharded else 1)
    return sum(totals), totals[1]


def muon_saved_bytes(plan: Plan, tensors: list[StateTensor], matrices: float, shard_size: float) -> float:
    """Optimizer bytes Muon does not keep on `matrices` 2-D parameters: the convention's Adam moments (m, v) less its
    one momentum buffer (cards/memory.yaml optimizers), sharded as the moments are; 0 under Adam. With the fp32
    master that is 4 + 4 B/param instead of Adam's 4 + 8; the embedding, output layer, norms and biases stay on Adam."""
    if plan.optimizer != "muon":
        return 0.0
    counts = memory_card().optimizers.moment_buffers
    dropped = 1 - counts["muon"] / counts["adam"]
    return sum(t.bytes * dropped * matrices / (shard_size if t.shard == "dp" else 1)
               for t in tensors if t.role == "moments")


def optimizer_implementation(job: Job, plan: Plan) -> OptimizerImplementation:
    """The implementation the job's engine builds its Adam step with on CUDA (the framework card's optimizer_step
    section; a card that has none: fused, no temporaries)."""
    card = job.card
    facts = card.optimizer_step
    engine = card.engine.by_zero_stage[plan.zero_stage]
    return facts.by_engine.get(engine, "fused") if facts is not None else "fused"


def optimizer_step_bytes(job: Job, plan: Plan) -> float | None:
    """HBM bytes per parameter of the job's Adam step where its implementation (optimizer_implementation) makes more
    passes than one fused read-modify-write (cards/memory.yaml optimizer_steps hbm_bytes_per_param: torch's foreach
    and per-tensor steps); None for a fused step (the time reads cards/calibration.yaml optimizer_bytes_per_param)."""
    return memory_card().optimizer_steps[optimizer_implementation(job, plan)].hbm_bytes_per_param


def optimizer_step_temporaries(step: OptimizerStepBytes, tensors: list[StateTensor], *, stepped: float,
                               largest_tensor: float, zero_stage: int, decoupled: bool = False) -> float:
    """Bytes optimizer.step() allocates on top of the model states while it runs (OptimizerStepBytes): over `stepped`
    parameters (what this GPU's optimizer steps, after sharding and CPU offload), `largest_tensor` (the largest one
    among them) or ZeRO-3's sub group (`stepped` capped at zero3_sub_group_params). The moments' dtype is the
    convention's (its `moments` tensor over Adam's two buffers). `decoupled`: the optimizer reads the 16-bit gradient
    shards themselves (decoupled_grads)."""
    if step.when_grads_16bit and not any(t.role == "main_grads" and t.bytes < 4 for t in tensors):
        return 0.0
    if step.not_when_decoupled and decoupled:
        return 0.0
    moment = sum(t.bytes for t in tensors if t.role == "moments") / memory_card().optimizers.moment_buffers["adam"]
    at_once = {"stepped": stepped, "largest_tensor": min(largest_tensor, stepped),
               "sub_group": min(stepped, step.zero3_sub_group_params or stepped) if zero_stage == 3 else stepped,
               }[step.at_once]
    return (step.moment_copies * moment + step.bytes) * at_once


def step_segment_bytes(step: OptimizerStepBytes, *, stepped: float, largest_tensor: float, zero_stage: int) -> float:
    """The bytes of the segments of their own that the reduction's and step's whole-partition tensors add to what the
    caching allocator reserved in the backward (StepSegments; 0 where the implementation allocates none at this ZeRO
    stage). Each is served from the smallest cached free block at least its size, else takes a new segment (PyTorch's
    caching allocator). Cached when each is asked for: after the reduce bucket, the largest parameter's 16-bit
    gradient, which the reduction frees as it copies the gradients out (`largest_tensor`: that parameter's elements,
    unsharded), and from the step on the reduce bucket, released at the reduction's end; a block taken is no longer
    free. One micro-batch's activation tensors, the backward's other cached blocks, are taken as smaller than each
    (`stepped`: the parameters this GPU's optimizer steps)."""
    seg = step.segments
    if seg is None or zero_stage not in seg.zero_stages:
        return 0.0
    bucket = seg.reduce_bucket_elements * seg.reduce_bucket_bytes
    cached: list[float] = []
    added = _cached_or_new(cached, bucket)
    cached.append(largest_tensor * seg.reduce_bucket_bytes)
    if zero_stage in seg.partition_grad_bytes:
        added += _cached_or_new(cached, seg.partition_grad_bytes[zero_stage] * stepped)
    cached.append(bucket)  # released at the reduction's end (_release_ipg_buffers), before the step
    for copy in seg.step_copies:
        added += _cached_or_new(cached, copy * stepped)
    return added


def _cached_or_new(cached: list[float], size: float) -> float:
    """One allocation of `size` bytes: the smallest cached free block at least its size is taken (removed from
    `cached`, 0 new bytes), else a new segment of `size` bytes."""
    fits = [b for b in cached if b >= size]
    if fits:
        cached.remove(min(fits))
        return 0.0
    return size


def lazy_state_bytes(step: OptimizerStepBytes, tensors: list[StateTensor], params: float, shard_size: float,
                     decoupled: bool = False) -> float:
    """The optimizer state an implementation allocates inside its first step (state_allocated first_step): the
    convention's moments over `params` parameters sharded `shard_size` ways (Muon's one momentum: the caller passes
    the moments Muon keeps), and the master too where the optimizer holds it (`decoupled`, with
    decoupled_master_lazy: Transformer Engine's FusedAdam under Megatron's precision-aware optimizer,
    decoupled_grads); under Megatron's HybridDeviceOptimizer (a `grad_copy` tensor: with_precision) its fp32 moments
    and gradient copy, its fp32 master clone being made at construction; 0 where the state is built at construction
    (DeepSpeed)."""
    if step.state_allocated != "first_step":
        return 0.0
    roles: tuple[str, ...] = ("moments", "master") if decoupled and step.decoupled_master_lazy else ("moments",)
    if any(t.role == "grad_copy" for t in tensors):  # HybridDeviceOptimizer: its fp32 clone is made at construction
        roles = ("moments", "grad_copy")
    return sum(t.bytes * params / (shard_size if t.shard == "dp" else 1) for t in tensors if t.role in roles)


def muon_matrix_step_bytes(step: MuonStepBytes, local: tuple[float, float], whole: tuple[float, float],
                           gathered: bool, side: str = "smaller") -> float:
    """Bytes Muon's step allocates at its peak while it updates one matrix: this rank's `local` (rows, cols) shard of
    the `whole` matrix, all-gathered whole first when `gathered` (tp_mode duplicated on a TP-sharded matrix). The
    largest of its phases (MuonStepBytes): each phase's bytes per element over the shard, the whole matrix (when
    gathered), the matrix orthogonalized (whole when gathered, else the shard) and its m x m Gram matrix, m that
    matrix's smaller side (`side` smaller) or its rows (`side` rows: X X^T as stored, the card's ns_side)."""
    shard, full = local[0] * local[1], whole[0] * whole[1]
    ortho = whole if gathered else local
    size, m = ortho[0] * ortho[1], (min(ortho) if side == "smaller" else ortho[0])
    return max(ph.local * shard + ph.gathered * (full if gathered else 0.0) + ph.ortho * size + ph.square * m ** 2
               for ph in step.phases.values())


def bytes_per_param(tensors: list[StateTensor], shard_size: float) -> float:
    """E.g. 6 + 12/d for Megatron's distributed optimizer."""
    return sum(state_bytes(tensors, 1.0, shard_size).values())


def describe_tensors(tensors: list[StateTensor]) -> str:
    parts = [f"{t.name} {t.bytes:g} B" + (" sharded" if t.shard == "dp" else "") for t in tensors]
    return "; ".join(parts)


def output_activations(conv: Convention, tokens: float, vocab: float, tp: int, hidden: int, ts: int,
                       micro_batch: int) -> float:
    """Last-stage bytes of one micro-batch of `micro_batch` sequences past the decoder: the loss at its peak over one
    of `loss_chunks` pieces of the sequence (its logits: loss_logits), the final-norm/output-layer inputs (split by
    sequence parallelism) and what a chunked loss keeps of the hidden states (replicated), with its chunks' copies
    where the micro-batch holds more than one sequence (loss_chunk_copy_bytes: one sequence's chunks are views)."""
    logits = conv.logits_bytes_per_element * loss_logits(conv, tokens, vocab, tp)
    kept = conv.loss_hidden_bytes + (conv.loss_chunk_copy_bytes if micro_batch > 1 else 0.0)
    return logits + conv.output_hidden_bytes * tokens * hidden / ts + kept * tokens * hidden


def built_vocab(vocab: int, conv: Convention, tp: int) -> int:
    """The vocabulary rows the framework builds, the one figure the memory (embedding, head, logits) and the step time
    (logits GEMM, cross-entropy, logits traffic, the rank's parameters) both read: padded to a multiple of the
    convention's vocab_pad_multiple x tp where it pads (Megatron's make_vocab_size_divisible_by; 1 = no padding)."""
    multiple = conv.vocab_pad_multiple
    if multiple <= 1:
        return vocab
    unit = multiple * tp
    return -(-vocab // unit) * unit


def loss_logits(conv: Convention, tokens: float, vocab: float, tp: int) -> float:
    """Logits of one loss chunk on one GPU: split over TP under a vocab-parallel loss, whole where each rank holds
    them (logits_over_tp)."""
    return tokens / conv.loss_chunks * vocab / (tp if conv.logits_over_tp == "vocab_parallel" else 1)


def frozen_gathered_transient(conv: Convention, units: list[float]) -> float:
    """gathered_transient for units whose base weights are frozen (LoRA): a frozen parameter gets no gradient, so its
    unit's post_backward has no unsharded gradient and no reduce-scatter input (torch 2.13 FSDP2
    _fsdp_param_group.py post_backward reduces only the params with a .grad); what is left at its backward is its
    gathered parameters (`unsharded_param_bytes`) beside the prefetched unit before it. The adapters' own gradients
    are left out (rank x width per projection). Conventions that do not say unsharded_param_bytes keep
    gathered_transient."""
    if not conv.unsharded_param_bytes:
        return gathered_transient(conv, units)
    return max((conv.unsharded_param_bytes * p + conv.prefetched_bytes * (units[k - 1] if k else 0.0)
                for k, p in enumerate(units)), default=0.0)


def gathered_transient(conv: Convention, units: list[float]) -> float:
    """FSDP/ZeRO-3 bytes at the worst unit's backward peak: `gathered_layers` x `gathered_bytes` per parameter
    of that unit plus `prefetched_bytes` per parameter of the unit before it (`units`: per-GPU parameters of
    the stage's FSDP units in forward order; backward prefetches the previous one)."""
    return max((conv.gathered_layers * conv.gathered_bytes * p + conv.prefetched_bytes * (units[k - 1] if k else 0.0)
                for k, p in enumerate(units)), default=0.0)


def experts_in_units(card: FrameworkCard, ep: int, expert_dp: float) -> bool:
    """Whether a MoE layer's routed experts are parameters of an FSDP unit (gathered, reduce-scattered, their
    unsharded gradient held between micro-batches as the unit's others): not where the card's full_ep_experts says
    the framework leaves them out of fully_shard (ignored_params) and expert parallelism takes every rank of their
    data-parallel mesh (ep > 1, expert_dp 1: NeMo AutoModel's apply_fsdp without ep_shard). Their states are the
    rank's own either way (state_bytes over expert_dp 1: bf16 weights, their .grad, the optimizer's moments)."""
    facts = card.full_ep_experts
    return not (facts is not None and facts.ignored and ep > 1 and expert_dp == 1)


def accumulated_grad_bytes(card: FrameworkCard, micro_batches: int, sharded: bool, pp: int = 1,
                           defer: bool | None = None, frozen: bool = False,
                           reduce_fp32: bool | None = None) -> float:
    """Bytes per parameter of the unsharded gradient an FSDP unit holds between a step's micro-batches (the card's
    grad_accumulation: the trainer turns gradient sync off for all but the last, FSDP2 accumulates in reduce_dtype),
    over the rank's own parameters (its TP shard, its local experts whole), not their data-parallel shard, where
    holds_grads says the step holds them; 0 where the parameters are not sharded (the replicated gradient is itself
    the unsharded one) and for a LoRA job (`frozen`): its base weights take no gradient, and its adapters' unsharded
    gradients (well under 1% of the parameters) are left out. The card's bytes are its reduce_dtype's (fp32); with
    `reduce_fp32` False (the plan's grad_reduce_in_fp32: reduce_dtype bf16, the compute dtype) torch 2.13
    FSDPParam.init_dtype_attrs clamps reduce_dtype to None and to_accumulated_grad_if_needed keeps the bf16 gradient
    autograd accumulates in place: bf16 bytes."""
    if not sharded or frozen or not holds_grads(card, pp, micro_batches, defer):
        return 0.0
    if reduce_fp32 is False:
        return memory_card().precision.dtype_bytes["bf16"]
    return card.grad_accumulation.bytes_per_param


def holds_grads(card: FrameworkCard, pp: int, micro_batches: int, defer: bool | None = None,
                keep: bool = False) -> bool:
    """Whether an FSDP unit's gradient sync waits for the step's last backward, the unit holding its unsharded
    gradient meanwhile (the card's grad_accumulation): under pp > 1 where torch's PipelineStage defers it to the
    schedule's _post_backward (pipeline_held), with any number of micro-batches; else by the trainer's own loop, which
    changes nothing with one micro-batch (its only backward reduces). `defer` is the plan's defer_fsdp_grad_sync, that
    loop where the card names the knob (NeMo AutoModel); None, or a card without the knob: the card's `unsharded`.
    One fact for the memory (accumulated_grad_bytes) and the time (sharding_traffic.sharding_schedule: reduce-scatter
    once per step). `keep`: the job's keeps_units."""
    facts = card.grad_accumulation
    if facts is None:
        return False
    if pipeline_held(card, pp, keep):
        return True
    own = defer if defer is not None and facts.knob is not None else facts.unsharded
    return own and micro_batches > 1


def keeps_gathered(card: FrameworkCard, pp: int) -> bool:
    """Whether the units stay gathered across the step's micro-batches, all-gathered once per step: under torch's
    PipelineStage (no reshard after backward) where the forward does not reshard either (gathered_through_forward)."""
    return pipeline_held(card, pp) and card.grad_accumulation.gathered_through_forward


def keeps_units(job, plan) -> bool:
    """Whether the job's FSDP units stay gathered and unreduced from their first backward to the step's last micro-batch
    without PP, by the framework's own switch (Job.fsdp_keep_gathered, the card's grad_accumulation.keep_knob: NeMo
    AutoModel's model.backend.enable_fsdp_optimizations; components/moe/fsdp_mixin.py MoEFSDPSyncMixin
    prepare_for_grad_accumulation sets set_reshard_after_backward(False) and set_requires_gradient_sync(False) on every
    unit, prepare_for_final_backward both back on before the last micro-batch, recipes/llm/train_ft.py): with one
    micro-batch per step it changes nothing; under PP the pipeline stage holds them already (pipeline_held). Modelled
    on units resharded after their forward (zero_stage 3, which resolve holds a request asking for it to); a plan at
    another stage is timed and sized without it."""
    return (job.fsdp_keep_gathered and plan.pp == 1 and plan.zero_stage == 3
            and plan.num_microbatches(job.global_batch_size) > 1)


def pipeline_held(card: FrameworkCard, pp: int, keep: bool = False) -> bool:
    """Whether the stage's FSDP units stay gathered and hold their unsharded gradients from their first backward to
    the end of the step: pp > 1 on a framework whose card says its stages run in torch's PipelineStage over FSDP2
    (grad_accumulation.pipeline; torch/distributed/pipelining/stage.py backward_maybe_with_nosync, _post_backward); or
    without PP where the job's own switch does the same (`keep`: keeps_units)."""
    facts = card.grad_accumulation
    return facts is not None and ((pp > 1 and facts.pipeline) or keep)
