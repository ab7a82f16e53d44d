"""Loads the YAML cards (the repo's cards/ folder, installed as `meshplan.cards_data`) and validates them.

Cards are the single source of truth for the knowledge meshplan uses; a malformed card must fail
loudly, naming the file, the key and what is wrong, instead of producing a wrong number later.
Each card is parsed once per process (cached).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from meshplan.core.card_files import card_names, card_root, framework_names
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.allocator_card import AllocatorFacts, AllocatorSetting
from meshplan.knowledge.fsdp_card import GradAccumulationFacts
from meshplan.knowledge.lora_card import LoraEngine
from meshplan.knowledge.moe_card import FlexDispatcherEngines, MoeDispatch, MoeExpertWeights, MoeHostSyncs
from meshplan.knowledge.offload_card import EngineOffload
from meshplan.knowledge.precision_card import MixedPrecisionPresets
from meshplan.knowledge.read_card import ReadSection, RegistryEntry
from meshplan.knowledge.rl_card import RLCard
from meshplan.knowledge.tp_card import MoeTensorParallel, OutputHeadTp, TpInputLinears, TpOverlapFacts
from meshplan.schema.choices import FRAMEWORKS, Engine, Fp8Recipe, Recompute
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.model import Architecture

T = TypeVar("T", bound=BaseModel)

# libyaml's parser when PyYAML was built with it: the same safe loader (same resolvers, same values), ~10x
# faster, which is most of what the first estimate of a process pays to read the rules card.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class CardError(MeshplanError):
    """A card file that does not match its schema."""


def card_text(name: str) -> str:
    """Raw YAML of one card (what MCP resources serve)."""
    if name not in card_names():
        raise CardError(f"No card named {name!r}.", fix=f"Known cards: {', '.join(card_names())}.")
    return card_root().joinpath(*f"{name}.yaml".split("/")).read_text(encoding="utf-8")


@cache
def read_card(name: str) -> Any:
    """Parsed YAML of one card, cached."""
    text = card_text(name)
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise CardError(f"cards/{name}.yaml is not valid YAML: {exc}") from None


def _format_validation(name: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors()[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  key {where}: {err['msg']} (got {err.get('input')!r:.80})")
    return f"cards/{name}.yaml does not match its schema:\n" + "\n".join(lines)


def validate_card(name: str, data: Any, schema: type[T]) -> T:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise CardError(_format_validation(name, exc)) from None


_cache: dict[tuple[str, type], Any] = {}


def load_card(name: str, schema: type[T]) -> T:
    """One card, validated against `schema`, cached per (card, schema)."""
    key = (name, schema)
    if key not in _cache:
        _cache[key] = validate_card(name, read_card(name), schema)
    return _cache[key]


_checked: dict[Callable[..., None], Any] = {}  # per check: the loaded card it last passed


def checked_once(card: T, check: Callable[[T], None]) -> T:
    """`card` (load_card's) once `check` passes on it (raising CardError where the card does not hold what the code
    needs), run once per loaded card: load_card caches it, and a reloaded card is a new object, checked again."""
    if _checked.get(check) is not card:
        check(card)
        _checked[check] = card
    return card


# --------------------------------------------------------------------------- card schemas owned here


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PublishedCounts(_Card):
    total: int | None = Field(None, description="Published total, as rounded by its authors")
    total_rounding: int | None = Field(None, description="Half a unit of the last published digit")
    non_embedding: int | None = Field(None, description="Published total without embedding and head")
    non_embedding_rounding: int | None = None
    active: int | None = None
    active_rounding: int | None = None
    active_convention: (
        Literal["active", "active_excl_input_embedding", "active_non_embedding"] | None
    ) = None
    tolerance_note: str | None = Field(
        None, description="Why the exact count sits outside the rounding (e.g. a vision tower in the total)"
    )
    extra_tolerance: int = Field(0, ge=0, description="Params the published total counts that we do not")
    active_tolerance_note: str | None = None
    active_extra_tolerance: int = Field(0, ge=0)
    text: str
    source: str


class ModelCard(_Card):
    key: str
    name: str
    hf_id: str | None = None
    aliases: list[str] = []
    family: str
    config: dict[str, Any] = Field(description="Hugging Face config.json fields (the text part for multimodal)")
    published: PublishedCounts
    sources: list[str]
    notes: list[str] = []


class HardwareCard(_Card):
    description: str
    gpus: list[GpuSpec]


def model_card_names() -> list[str]:
    return [n.split("/", 1)[1] for n in card_names() if n.startswith("models/")]


def model_card(key: str) -> ModelCard:
    card = load_card(f"models/{key}", ModelCard)
    if card.key != key:
        raise CardError(f"cards/models/{key}.yaml: key {card.key!r} does not match its file name {key!r}.")
    return card


# --------------------------------------------------------------------------- framework cards
# Everything meshplan assumes about a framework is in its card (cards/frameworks/<name>.yaml; the checklist for
# adding one is cards/frameworks/README.md). The code reads these fields and never tests a framework's name.

WorldSizeLaw = Literal["megatron", "torchtitan", "kempnerforge"]  # mesh.py implements each law
# the byte presets of cards/memory.yaml
MemoryConvention = Literal["megatron", "megatron_fsdp", "deepspeed", "fsdp2", "fsdp2_chunked_loss", "fsdp2_hf",
                          "fsdp2_automodel", "fsdp2_kempnerforge", "nanotron"]
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)

# The knobs an adapter section must account for in every version (a key, or `instead` saying what to do).
ADAPTER_KNOBS: tuple[str, ...] = (
    "tp", "pp", "vpp", "cp", "cp_comm_type", "ep", "etp", "sequence_parallel", "zero_0", "zero_1",
    "zero_2", "zero_3", "recompute_none", "recompute_selective", "recompute_full", "recompute_layers",
    "selective_ac_option", "recompute_method", "recompute_modules", "uneven_pp",
    "micro_batch_size", "global_batch_size", "fp8", "moe_flex_dispatcher", "moe_a2a_overlap", "torch_compile",
    "tp_comm_overlap", "pipeline_layout",
    "account_for_embedding",
    "account_for_loss", "activation_offload", "param_offload", "grad_offload", "optimizer_offload",
    "optimizer_offload_fraction",
    "optimizer", "optimizer_state_dtype", "fp8_param_gather", "grad_reduce_fp32", "grad_reduce_bf16", "fp8_delayed",
    "fp8_tensorwise", "fp8_rowwise", "fp8_blockwise", "fp8_mxfp8",
    "lora_rank", "lora_targets", "attention_backend", "dropout", "pipeline_schedule", "dp_replicate",
)


class AdapterKnob(_Card):
    key: str | None = Field(description="The framework's name for this knob; null when it has none")
    instead: str | None = Field(None, description="What to use when the framework lacks the knob (or a value); "
                                                 "beside a key, the caveat the skill guide prints with it")
    values: dict[str, str | None] | None = Field(
        None, description="A knob with a vocabulary (attention_backend, pipeline_schedule): the framework's value for "
                          "each of meshplan's; "
                          "null where the framework has none (refused with 'instead')")
    reason: str | None = Field(None, description="A missing knob a request gets when it leaves the field out "
                                                 "(REASON_KNOBS): what the run does instead, the words of the note "
                                                 "that says so (no final period)")

    @model_validator(mode="after")
    def _missing_says_instead(self) -> AdapterKnob:
        if (self.key is None or None in (self.values or {}).values()) and not self.instead:
            raise ValueError("a missing knob (key: null) or value (null) needs 'instead'")
        if self.reason is not None and (self.key is not None or self.reason.endswith(".")):
            raise ValueError("'reason' belongs to a missing knob (key: null) and ends without a period")
        return self


# Knobs a request that leaves its field out gets: one missing (key null) needs its `reason`, which request.resolve
# tells that request (recompute left out: full where checkpointing cannot be turned off, SkyRL's main_sft at ZeRO-3).
REASON_KNOBS = ("recompute_none",)


class AdapterVersion(_Card):
    format: str
    knobs: dict[str, AdapterKnob]

    @model_validator(mode="after")
    def _every_knob(self) -> AdapterVersion:
        unknown, missing = set(self.knobs) - set(ADAPTER_KNOBS), set(ADAPTER_KNOBS) - set(self.knobs)
        if unknown or missing:
            raise ValueError(f"unknown knobs {sorted(unknown)}, missing {sorted(missing)}; knobs are "
                             f"{', '.join(ADAPTER_KNOBS)}")
        return self


class AdapterSection(_Card):
    """What meshplan.adapters renders for the framework: variants, versions and each version's keys."""

    variants: dict[str, str] = Field(description="Variant name -> what it renders")
    default_version: str
    versions: dict[str, AdapterVersion]
    variant_knobs: dict[str, dict[str, AdapterKnob]] = Field(
        default_factory=dict, description="Per-variant overrides of the version's knobs (e.g. verl's FSDP backend)"
    )
    sources: list[str]

    @model_validator(mode="after")
    def _consistent(self) -> AdapterSection:
        if self.default_version not in self.versions:
            raise ValueError(f"default_version {self.default_version!r} is not in versions "
                             f"({', '.join(self.versions)})")
        for variant, knobs in self.variant_knobs.items():
            unknown = sorted(set(knobs) - set(ADAPTER_KNOBS))
            if variant not in self.variants or unknown:
                raise ValueError(f"variant_knobs.{variant}: unknown variant or knob ({unknown})")
        for table in [*self.variant_knobs.values(), *(v.knobs for v in self.versions.values())]:
            if any(k in table and table[k].key is None and not table[k].reason for k in REASON_KNOBS):
                raise ValueError(f"a missing {' or '.join(REASON_KNOBS)} needs 'reason' (what the run does instead)")
        return self

    def renders(self, knob: str) -> bool:
        """Whether the default version writes this knob (a key, not `instead`)."""
        return self.versions[self.default_version].knobs[knob].key is not None


class FrameworkDefaults(_Card):
    zero_stage: int = Field(ge=0, le=3)
    sequence_parallel_when_tp: bool = True
    sequence_parallel_off_for: list[Literal["moe", "tied_embeddings", "pipeline"]] = Field(
        default_factory=list, description="Models the framework turns sequence parallelism off for, whatever tp, and "
                                          "`pipeline`: off in every pipeline stage (pp > 1) (its why in "
                                          "sequence_parallel_why)")
    sequence_parallel_why: str | None = None
    etp: Literal["tp", 1] = Field(1, description="An MoE model's expert TP when the request leaves etp unset")
    etp_why: str | None = None
    etp_recipes: str | None = Field(
        None, description="What the framework's own MoE recipes set instead of the default, as resolve()'s etp note "
                          "says it (its files cited in etp_why)")
    fp8_recipe: Fp8Recipe | None = Field(
        None, description="The FP8 recipe the framework runs when precision=fp8 leaves fp8_recipe out (None: it has no "
                          "fp8 recipe choice meshplan models)")
    fp8_recipe_why: str | None = None

    @model_validator(mode="after")
    def _claim_has_why(self) -> FrameworkDefaults:
        if self.etp != 1 and not self.etp_why:
            raise ValueError("etp: tp needs etp_why (the framework source that defaults it so)")
        if self.etp_recipes and self.etp != "tp":
            raise ValueError("etp_recipes qualifies an etp: tp default; with etp: 1 there is nothing to qualify")
        if self.fp8_recipe is not None and not self.fp8_recipe_why:
            raise ValueError("fp8_recipe needs fp8_recipe_why (the framework source that defaults it so)")
        if self.sequence_parallel_off_for and not self.sequence_parallel_why:
            raise ValueError("sequence_parallel_off_for needs sequence_parallel_why (the framework source)")
        return self

    def sequence_parallel_with_tp(self, arch: Architecture, pp: int = 1) -> bool:
        """Whether the framework runs sequence parallelism beside TP > 1 for this model at this pipeline degree (a
        request that leaves sequence_parallel out gets it): sequence_parallel_when_tp, unless the model is of a kind
        it turns it off for, or its pipeline stages run without it."""
        off = (("moe" in self.sequence_parallel_off_for and arch.is_moe)
               or ("tied_embeddings" in self.sequence_parallel_off_for and arch.tie_word_embeddings))
        return self.sequence_parallel_when_tp and not off and self.sequence_parallel_in_pipeline(pp)

    def sequence_parallel_in_pipeline(self, pp: int) -> bool:
        """False where the framework turns sequence parallelism off in its pipeline stages and pp > 1."""
        return pp == 1 or "pipeline" not in self.sequence_parallel_off_for


class EngineFacts(_Card):
    """Which engine runs the model at each ZeRO stage (the engines rules.yaml's `backends` name), and the byte
    convention of ZeRO-3 where it is not the card's memory_convention."""

    by_zero_stage: dict[int, Engine]
    zero3_memory_convention: MemoryConvention | None = None
    ulysses: list[Engine] = []  # engines whose cp is Ulysses sequence parallelism: all-to-alls, any cp_comm_type
    why: str

    @model_validator(mode="after")
    def _every_stage(self) -> EngineFacts:
        if set(self.by_zero_stage) != set(ZERO_STAGES):
            raise ValueError(f"by_zero_stage needs exactly the stages {list(ZERO_STAGES)}, "
                             f"got {sorted(self.by_zero_stage)}")
        return self


class MemoryFix(_Card):
    """How far MEM001's fix may raise zero_stage on this framework (null: the fix never changes it)."""

    highest_zero_stage: int | None = Field(ge=0, le=3)
    highest_zero_stage_with_pp: int | None = Field(None, ge=0, le=3)
    why: str


class FrameworkLimits(_Card):
    """Combinations the framework refuses that the layout-fitting code must avoid (rules.yaml reports them)."""

    moe_with_pipeline: bool = True
    why: str | None = None

    @model_validator(mode="after")
    def _claim_has_why(self) -> FrameworkLimits:
        if not self.moe_with_pipeline and not self.why:
            raise ValueError("a limit needs a why (the framework source that imposes it)")
        return self


class RecomputeSemantics(_Card):
    """What the framework's own `selective` recompute saves (activations.py models each): Megatron-Core's
    core-attention recompute, or torchtitan's op-level SAC (outputs of the compute-intensive ops kept except
    every second mm)."""

    selective: Literal["core_attention", "op_sac"] = "core_attention"
    source: str | None = None


class CompileSemantics(_Card):
    """What the framework's torch.compile switch compiles: its decoder blocks (or the whole model) and its loss
    function (cards/memory.yaml compile: the bytes each changes)."""

    default: bool = False  # the framework's own default (a request that leaves torch_compile out gets it)
    blocks: bool = True
    loss: bool = False
    # the routed experts' activation (and routing-weight multiply) is one fused kernel even in eager blocks
    experts_fused: bool = False
    source: str


class AttentionSemantics(_Card):
    """Which attention kernel the framework runs on each GPU generation (cards/calibration.yaml attention_kernels: the
    fraction of peak each reaches): `kernel` maps an arch (cards/hardware.yaml) or "default" to a kernel name;
    `by_version` gives the same map for releases (a version prefix) that chose differently; `by_engine` the map of an
    engine that runs one kernel in every release; `mla_backend` the backend a multi-latent-attention model runs."""

    kernel: dict[str, str] = Field(default_factory=dict)
    by_version: dict[str, dict[str, str]] = Field(default_factory=dict)
    by_engine: dict[Engine, dict[str, str]] = Field(
        default_factory=dict, description="An engine whose map holds in every release and for every model (verl's "
                                          "FSDP engine: Hugging Face flash_attention_2); the others follow the release")
    mla_backend: Literal["flash", "fused"] | None = Field(
        None, description="The attention_backend a model with multi-latent attention (Q/K and V head dims differ, "
                          "which FlashAttention-2 refuses) runs on the engines by_engine leaves out, in every release "
                          "(its kernel: backends); None: it follows the release's map")
    backends: dict[Literal["flash", "fused"], str] = Field(default_factory=dict,
        description="The kernel (cards/calibration.yaml attention_kernels) each attention_backend the framework can be "
                    "told to run is; one left out: the shared fraction")
    source: str

    @model_validator(mode="after")
    def _mla_backend_has_a_kernel(self) -> AttentionSemantics:
        if self.mla_backend is not None and self.mla_backend not in self.backends:
            raise ValueError(f"mla_backend {self.mla_backend!r} needs its kernel in backends")
        return self

    def kernel_for(self, version: str | None, arch: str | None, *, engine: str | None = None,
                   mla: bool = False) -> str | None:
        """The kernel a release runs on `arch`: the engine's own map (by_engine), else mla_backend's kernel for an MLA
        model, else the longest matching version prefix's map, else `kernel`."""
        table = self.kernel
        if engine in self.by_engine:
            table = self.by_engine[engine]  # type: ignore[index]
        elif mla and self.mla_backend is not None:
            return self.backends.get(self.mla_backend)
        elif version:
            for prefix in sorted(self.by_version, key=len, reverse=True):
                if version == prefix or version.startswith(prefix + "."):
                    table = self.by_version[prefix]
                    break
        return table.get(arch or "", table.get("default"))


class SearchKnobs(_Card):
    """The knobs `recommend` opens on this framework; tp, pp, dp and the ZeRO stages of cards/memory.yaml are
    always searched. Whether the flex MoE dispatcher is searched follows the adapter (FrameworkCard.flex_dispatcher)."""

    vpp: bool
    cp: bool
    ep: bool
    etp: bool
    recompute: list[Recompute] = Field(min_length=1)
    source: str


class MemoryReportFacts(_Card):
    """Which peak the framework's own benchmark harness publishes: the memory report of the training log it reads
    (the moment) and its basis. A measured peak that harness took is compared with meshplan's figure at that moment."""

    harness: str = Field(description="The harness's path in the framework's repository, as a measured row's source "
                                     "names it")
    moment: Literal["first_iteration", "steady"] = Field(
        description="first_iteration: the peak up to the end of iteration 1, whose step allocates a lazily built "
                    "optimizer state (stage detail first_iteration_allocated_peak); steady: a later iteration's")
    basis: Literal["allocated", "reserved"]
    source: str


# How an engine runs its optimizer step on CUDA, which decides the step's own temporaries (cards/memory.yaml
# optimizer_steps, memory_states.optimizer_step_temporaries)
OptimizerImplementation = Literal["fused", "foreach", "for_loop", "megatron_distributed", "deepspeed_zero"]


class OptimizerStepFacts(_Card):
    """Which optimizer implementation each engine of the framework builds on CUDA when its config leaves the choice
    to the default (Adam/AdamW)."""

    by_engine: dict[Engine, OptimizerImplementation]
    source: str


class MoeRoutingFacts(_Card):
    """How the framework says 'balanced routing' (Job.moe_routing_imbalance 1.0), and why meshplan does not write it:
    the rendered config's note on routing imbalance."""

    force_balance_key: str = Field(description="The framework's switch that forces balanced routing")
    note: str = Field(description="What a rendered MoE config says about routing; {imbalance} is the estimate's")
    source: str


class MuonFacts(_Card):
    """How the framework runs Muon's Newton-Schulz orthogonalization (meshplan/arithmetic/muon.py times it)."""

    tp_mode: Literal["blockwise", "duplicated", "distributed"] = Field(
        description="A tensor-parallel matrix: blockwise (each rank orthogonalizes its own shard), duplicated (each "
                    "rank all-gathers it and orthogonalizes the whole matrix), distributed (the iteration split "
                    "over the TP ranks)")
    ns_steps: int = Field(ge=1, description="Newton-Schulz iterations per matrix per step")
    split_qkv: bool = Field(description="The fused QKV weight orthogonalized as separate Q, K and V blocks per "
                                        "query group")
    source: str


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
           "default)")


class Zero3Prefetch(_Card):
    """How a ZeRO-3 engine prefetches the next parameters (DeepSpeed's PartitionedParameterCoordinator): after it has
    gathered one submodule's parameters it all-gathers the next ones of the trace, up to prefetch_bucket_size elements
    (at least one parameter), only while the gathered parameters stay under max_live_parameters elements; the
    parameter after one at least that large is gathered when its submodule starts, its all-gather exposed whole.
    Each submodule's parameters are gathered in their own collective (fetch_sub_module), not one per layer."""

    max_live_parameters: float = Field(gt=0, description="stage3_max_live_parameters default, elements")
    prefetch_bucket_size: float = Field(ge=0, description="stage3_prefetch_bucket_size default, elements")
    source: str


class FrameworkAliases(_Card):
    """Other names published runs give the framework besides its name and display name, with where they come from."""

    words: list[str] = Field(min_length=1)
    source: str


class FrameworkCard(_Card):
    """What meshplan assumes about one training framework, each claim with its source."""

    model_config = ConfigDict(extra="forbid")  # a misspelt or unknown section is a CardError, never ignored

    name: str
    display_name: str
    aliases: FrameworkAliases | None = None
    version: str
    world_size_law: WorldSizeLaw
    memory_convention: MemoryConvention
    memory_convention_by_version: dict[str, MemoryConvention] = Field(
        default_factory=dict, description="Releases whose byte convention differs from memory_convention (a version "
                                          "prefix, e.g. '0.2' for torchtitan's unchunked loss), each with its why "
                                          "in memory_convention_why")
    memory_convention_why: str | None = None
    engine: EngineFacts
    defaults: FrameworkDefaults
    memory_fix: MemoryFix
    limits: FrameworkLimits = FrameworkLimits()
    recompute: RecomputeSemantics = RecomputeSemantics()
    compile: CompileSemantics | None = Field(None, description="torch.compile's scope; None: no compile switch")
    attention: AttentionSemantics | None = Field(
        None, description="The attention kernel per GPU generation; None: the shared attention_peak_fraction")
    estimated_versions: list[str] = Field(
        default_factory=list, description="Older releases meshplan estimates (memory, step time) but writes no config "
                                          "for (a rendered config uses an adapter version)")
    oldest_release: str | None = Field(
        None, description="The oldest release the card's facts stand for (meshplan/knowledge/releases.py; older: "
                          "refused); absent: the series of the oldest known release")
    oldest_release_why: str | None = None
    offload: dict[Engine, EngineOffload] = Field(
        default_factory=dict, description="Offload semantics per engine; an engine left out has no offload"
    )
    moe_routing: MoeRoutingFacts | None = Field(
        None, description="Absent: the framework has no switch forcing balanced routing; renders say nothing")
    allocator: AllocatorFacts | None = Field(
        None, description="Absent: the framework launches with PyTorch's default allocator (no expandable segments)")
    memory_report: MemoryReportFacts | None = Field(
        None, description="Absent: no harness of the framework publishes peaks (a measured row says its own moment)")
    optimizer_step: OptimizerStepFacts | None = Field(
        None, description="Absent: the step's implementation was not read; counted as fused (no temporaries)")
    tp_overlap: TpOverlapFacts = TpOverlapFacts(base="fraction", source="not read: the calibration's tp_overlap")
    moe_host_syncs: MoeHostSyncs | None = Field(None, description="Absent: Megatron-Core's one per MoE layer forward")
    moe_expert_weights: MoeExpertWeights | None = Field(None, description="Absent: read in place by the grouped GEMM")
    output_head_tp: OutputHeadTp | None = Field(None, description="Absent: the head vocabulary-parallel over TP")
    tp_input_linears: TpInputLinears | None = Field(
        None, description="Absent: a TP pair's input is gathered once and its gradient reduced once, each way")
    moe_tp: MoeTensorParallel | None = Field(
        None, description="Absent: Megatron-Core's cut (shared experts over TP, routed experts over ETP, the TP ranks' "
                          "tokens split into the EP group)")
    muon: MuonFacts | None = Field(None, description="Absent: the framework runs no Muon meshplan can time")
    grad_accumulation: GradAccumulationFacts | None = Field(
        None, description="Absent: no unsharded gradient is held between a step's micro-batches (each backward "
                          "reduce-scatters, or the gradients are not sharded)")
    zero3_prefetch: Zero3Prefetch | None = Field(
        None, description="Absent: a ZeRO-3 / FSDP unit's all-gather is prefetched behind the unit before it whatever "
                          "its size (FSDP2, Megatron-FSDP)")
    pipeline: PipelineFacts = Field(MEGATRON_PIPELINE, description="Absent: Megatron-Core's schedules")
    mixed_precision_presets: MixedPrecisionPresets | None = Field(
        None, description="Absent: the framework registers no named mixed-precision presets")
    lora: dict[Engine, LoraEngine] = Field(
        default_factory=dict, description="LoRA per engine; an engine left out runs no LoRA job (rule LORA001)")
    moe_dispatch: MoeDispatch | None = Field(None, description="Absent: the all-to-all dispatcher runs as asked")
    flex_dispatcher_engines: FlexDispatcherEngines | None = Field(
        None, description="Absent: only Megatron-Core's engine runs the flex dispatcher (rule EP007)")
    rl: RLCard | None = Field(None, description="Absent: the framework runs no RL job")
    ds_config_keys: list[str] = Field(
        default_factory=list, description="The ds_config keys meshplan writes that DeepSpeed accepts, from its source "
                                          "(the adapter tests check a rendered config against them)")
    megatron_deepspeed_flags: list[str] = Field(
        default_factory=list, description="Megatron-DeepSpeed's command-line flags meshplan writes, from its "
                                          "arguments.py (not on PyPI: the adapter tests check against this list)")
    search: SearchKnobs
    read: ReadSection | None = Field(None, description="Absent: meshplan reads none of the framework's files")
    registry: dict[str, RegistryEntry] = Field(default_factory=dict, description="Catalog models by registry name")
    adapter: AdapterSection | None = Field(
        None, description="Absent: meshplan estimates the framework but writes no config for it"
    )
    cannot_run: dict[str, str] = Field(
        default_factory=dict, description="A card without an adapter: the adapter knobs (ADAPTER_KNOBS) the framework "
                                          "cannot run, each with what to use instead (rules RC003, RC005, NT001)")
    sources: list[str]
    notes: list[str] = []

    @model_validator(mode="after")
    def _cannot_run_names_knobs(self) -> FrameworkCard:
        if set(self.cannot_run) - set(ADAPTER_KNOBS) or (self.cannot_run and self.adapter is not None):
            raise ValueError("cannot_run names adapter knobs, on a card without an adapter (whose knobs say it)")
        return self

    @model_validator(mode="after")
    def _rl_offload_covers_engines(self) -> FrameworkCard:
        """The framework's own offload around a colocated rollout says what it does on every engine it trains on."""
        if self.rl is not None and self.rl.colocated_offload:
            missing = set(self.engine.by_zero_stage.values()) - set(self.rl.colocated_offload_states)
            if missing:
                raise ValueError(f"rl.colocated_offload_states lacks the engines {sorted(missing)}")
        return self

    @property
    def renderable(self) -> bool:
        """Whether meshplan writes a config for it: its card has an adapter section."""
        return self.adapter is not None

    @property
    def moe_whole_over_tp(self) -> bool:
        """TP leaves the MoE block whole (moe_tp): every TP rank runs it on the whole micro-batch."""
        return self.moe_tp is not None and self.moe_tp.whole_over_tp

    @property
    def flex_dispatcher(self) -> bool:
        """Megatron-Core's flex MoE token dispatcher (DeepEP / HybridEP): where the adapter renders it."""
        return self.adapter is not None and self.adapter.renders("moe_flex_dispatcher")

    def known_versions(self) -> list[str]:
        """The releases meshplan knows for this framework: the card's own and the adapter's."""
        return sorted({self.version, *(self.adapter.versions if self.adapter else ()), *self.estimated_versions})

    def convention_for(self, version: str | None) -> MemoryConvention:
        """The byte convention of a release: the longest matching prefix in memory_convention_by_version, else the
        card's memory_convention."""
        if version:
            for prefix in sorted(self.memory_convention_by_version, key=len, reverse=True):
                if version == prefix or version.startswith(prefix + "."):
                    return self.memory_convention_by_version[prefix]
        return self.memory_convention

    def engine_at(self, zero_stage: int) -> Engine:
        return self.engine.by_zero_stage[zero_stage]

    def allocator_for(self, rl: bool) -> AllocatorSetting | None:
        """How the launcher of an RL job (`rl`) or a training job sets the allocator (None: PyTorch's default)."""
        return None if self.allocator is None else self.allocator.for_job(rl)

    def offload_at(self, zero_stage: int) -> EngineOffload | None:
        """The offload semantics of the engine this ZeRO stage runs (None: that engine offloads nothing)."""
        return self.offload.get(self.engine_at(zero_stage))


def framework_card(name: str) -> FrameworkCard:
    card = _framework_cards.get(name)  # once checked (the search asks hundreds of thousands of times)
    if card is not None:
        return card
    if name not in framework_names():
        raise CardError(f"No framework card {name!r}.", fix=f"Known: {', '.join(framework_names())}.")
    card = load_card(f"frameworks/{name}", FrameworkCard)
    if card.name != name:
        raise CardError(f"cards/frameworks/{name}.yaml: name {card.name!r} does not match its file name.")
    _framework_cards[name] = card
    return card


_framework_cards: dict[str, FrameworkCard] = {}


def rl_card(framework: str) -> RLCard | None:
    """The framework's `rl` section; None when it runs no RL job."""
    return framework_card(framework).rl


def rl_frameworks() -> list[str]:
    """The frameworks that run RL jobs."""
    return [f for f in FRAMEWORKS if rl_card(f) is not None]
