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
from meshplan.knowledge.adapter_card import ADAPTER_KNOBS, AdapterSection
from meshplan.knowledge.allocator_card import AllocatorFacts, AllocatorSetting
from meshplan.knowledge.compute_card import AttentionSemantics, CompileSemantics, EagerModelCode, RecomputeSemantics
from meshplan.knowledge.defaults_card import FrameworkDefaults, FrameworkLimits, MemoryFix, SearchKnobs
from meshplan.knowledge.engine_card import (
    EngineFacts,
    GradAccumulationPasses,
    MemoryConvention,
    OptimizerStepFacts,
    VisionTowerEngines,
)
from meshplan.knowledge.fsdp_card import FullEpExperts, GradAccumulationFacts, ShardingOverlapOff, Zero3Prefetch
from meshplan.knowledge.lora_card import LoraEngine
from meshplan.knowledge.moe_card import (
    FlexBackends,
    FlexDispatcherEngines,
    GroupedGemmLaunches,
    MoeDispatch,
    MoeExpertWeights,
    MoeHostSyncs,
    MoeRoutingFacts,
)
from meshplan.knowledge.muon_card import MuonFacts
from meshplan.knowledge.offload_card import EngineOffload
from meshplan.knowledge.pipeline_card import MEGATRON_PIPELINE, PipelineFacts
from meshplan.knowledge.precision_card import MixedPrecisionPresets
from meshplan.knowledge.read_card import ReadSection, RegistryEntry, TomlModel
from meshplan.knowledge.release_card import DATE, ChangeName, ReleaseChange
from meshplan.knowledge.release_lines import longest_line
from meshplan.knowledge.rl_card import RLCard
from meshplan.knowledge.tp_card import MoeTensorParallel, OutputHeadTp, TpInputLinears, TpOverlapFacts
from meshplan.schema.choices import FRAMEWORKS, Engine
from meshplan.schema.hardware import GpuSpec

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


class MemoryLogFacts(_Card):
    """Which peak the framework's training log reports in every run, whatever launched it (a measured row that quotes
    the log and does not say which peak is this one)."""

    basis: Literal["allocated", "reserved"]
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
    eager_model_code: EagerModelCode | None = Field(
        None, description="The engines that train transformers' modeling code eagerly; None: none (fused kernels, or "
                          "the compile section's eager blocks)")
    attention: AttentionSemantics | None = Field(
        None, description="The attention kernel per GPU generation; None: the shared attention_peak_fraction")
    estimated_versions: list[str] = Field(
        default_factory=list, description="Older releases meshplan estimates (memory, step time) but writes no config "
                                          "for (a rendered config uses an adapter version)")
    oldest_release: str | None = Field(
        None, description="The oldest release the card's facts stand for (meshplan/knowledge/releases.py; older: "
                          "refused); absent: the series of the oldest known release")
    oldest_release_why: str | None = None
    release_changes: list[ReleaseChange] = Field(
        default_factory=list, description="The dated changes of the framework's code the estimate reads "
                                          "(knowledge/release_card.py): a job on an older release, or on a main "
                                          "snapshot dated before one, runs without it")
    oldest_snapshot: str | None = Field(
        None, pattern=DATE, description="The oldest day a framework_version main@YYYY-MM-DD may name (the card's "
                                        "facts less its release_changes since that day stand for it); None: no "
                                        "snapshot is estimated")
    oldest_snapshot_why: str | None = None
    offload: dict[Engine, EngineOffload] = Field(
        default_factory=dict, description="Offload semantics per engine; an engine left out has no offload"
    )
    moe_routing: MoeRoutingFacts | None = Field(
        None, description="Absent: the framework has no switch forcing balanced routing; renders say nothing")
    allocator: AllocatorFacts | None = Field(
        None, description="Absent: the framework launches with PyTorch's default allocator (no expandable segments)")
    memory_report: MemoryReportFacts | None = Field(
        None, description="Absent: no harness of the framework publishes peaks (a measured row says its own moment)")
    memory_log: MemoryLogFacts | None = Field(
        None, description="Absent: the training log's peak was not read (a row that does not say which peak it is "
                          "stays 'not stated')")
    optimizer_step: OptimizerStepFacts | None = Field(
        None, description="Absent: the step's implementation was not read; counted as fused (no temporaries)")
    grad_accumulation_pass: GradAccumulationPasses | None = Field(
        None, description="Absent: every ZeRO stage takes the calibration's grad_accum_bytes_per_param per micro-batch")
    tp_overlap: TpOverlapFacts = TpOverlapFacts(base="fraction", source="not read: the calibration's tp_overlap")
    moe_host_syncs: MoeHostSyncs | None = Field(None, description="Absent: Megatron-Core's one per MoE layer forward")
    moe_expert_weights: MoeExpertWeights | None = Field(None, description="Absent: read in place by the grouped GEMM")
    grouped_gemm_launches: GroupedGemmLaunches | None = Field(
        None, description="Absent: the routed experts' grouped GEMM is one kernel per pass (no per-expert launches)")
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
    full_ep_experts: FullEpExperts | None = Field(
        None, description="Absent: the routed experts are parameters of an FSDP unit at any expert_dp (torchtitan's "
                          "experts' fully_shard over the edp mesh; a MoE layer's one unit elsewhere)")
    zero3_prefetch: Zero3Prefetch | None = Field(
        None, description="Absent: a ZeRO-3 / FSDP unit's all-gather is prefetched behind the unit before it whatever "
                          "its size (FSDP2, Megatron-FSDP)")
    sharding_overlap_off: ShardingOverlapOff | None = Field(
        None, description="Absent: the framework has no overlap switch, or where its per-unit transfers run with it "
                          "off was not read (timed as overlapped, said in the DP assumption)")
    pipeline: PipelineFacts = Field(MEGATRON_PIPELINE, description="Absent: Megatron-Core's schedules")
    mixed_precision_presets: MixedPrecisionPresets | None = Field(
        None, description="Absent: the framework registers no named mixed-precision presets")
    lora: dict[Engine, LoraEngine] = Field(
        default_factory=dict, description="LoRA per engine; an engine left out runs no LoRA job (rule LORA001)")
    moe_dispatch: MoeDispatch | None = Field(None, description="Absent: the all-to-all dispatcher runs as asked")
    flex_dispatcher_engines: FlexDispatcherEngines | None = Field(
        None, description="Absent: only Megatron-Core's engine runs the flex dispatcher (rule EP007)")
    flex_backends: FlexBackends | None = Field(
        None, description="The flex dispatcher backends each release takes and the GPUs each runs on (rule EP013); "
                          "absent: the adapter knob's values alone (moe_flex_backend)")
    rl: RLCard | None = Field(None, description="Absent: the framework runs no RL job")
    vision_tower: VisionTowerEngines | None = Field(
        None, description="Absent: no engine of the framework builds a multimodal model's vision tower")
    ds_config_keys: list[str] = Field(
        default_factory=list, description="The ds_config keys meshplan writes that DeepSpeed accepts, from its source "
                                          "(the adapter tests check a rendered config against them)")
    megatron_deepspeed_flags: list[str] = Field(
        default_factory=list, description="Megatron-DeepSpeed's command-line flags meshplan writes, from its "
                                          "arguments.py (not on PyPI: the adapter tests check against this list)")
    search: SearchKnobs
    read: ReadSection | None = Field(None, description="Absent: meshplan reads none of the framework's files")
    registry: dict[str, RegistryEntry] = Field(default_factory=dict, description="Catalog models by registry name")
    flavors: dict[str, TomlModel] = Field(
        default_factory=dict, description="Catalog models by the [model] name and flavor of the framework's TOML "
                                          "releases (torchtitan 0.2.x's, which train llama3 debugmodel where a "
                                          "TOML names no model)")
    flavors_source: str = ""
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

    @model_validator(mode="after")
    def _one_entry_per_change(self) -> FrameworkCard:
        names = [c.change for c in self.release_changes]
        if len(names) != len(set(names)):
            raise ValueError("release_changes names a change twice (one home for each)")
        return self

    def release_change(self, name: ChangeName) -> ReleaseChange | None:
        """The card's dated change of that name (release_changes), None where its code never changed it."""
        return next((c for c in self.release_changes if c.change == name), None)

    def keys_setting(self, field: str) -> list[str]:
        """The keys of the framework's own files that set a request field (its read.keys), none without a reader."""
        return [] if self.read is None else [key for key, name in self.read.keys.items() if name == field]

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
        by_version = self.memory_convention_by_version
        line = longest_line(version, by_version) if by_version else None  # (no card has one yet: none to match)
        return self.memory_convention if line is None else by_version[line]

    def engine_at(self, zero_stage: int) -> Engine:
        return self.engine.by_zero_stage[zero_stage]

    def eager_model_at(self, zero_stage: int) -> bool:
        """Whether the engine this ZeRO stage runs trains transformers' modeling code eagerly (eager_model_code:
        verl's and SkyRL's FSDP engines), not Megatron-Core's layers and their fusion switches."""
        return self.eager_model_code is not None and self.engine_at(zero_stage) in self.eager_model_code.engines

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
