"""The layouts a framework can express for a job, enumerated over divisors only, with cheap bounds.

`recommend` (meshplan/search/) searches this space, defined here so it can be counted and tested on its own: a
`Layout` is the structural part of a plan (tp, pp, vpp, cp, ep, etp, dp and an uneven pipeline split when pp does not
divide the layers); the per-layout choices are the ZeRO / FSDP stage, the recompute mode and the micro-batch size.
World-size laws (cards/frameworks, shared/reference/frameworks.md section 8): Megatron family and DeepSpeed,
tp*pp*cp*dp == W with ep*etp dividing W/pp; torchtitan, the same product with ep dividing dp*cp*tp and no expert TP;
KempnerForge, ep takes ranks of its own, tp*pp*cp*dp*ep == W.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache, partial
from typing import NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic import mesh
from meshplan.arithmetic.lora import base_tensors
from meshplan.arithmetic.memory_states import (
    Convention,
    StateTensor,
    bytes_per_param,
    convention,
    memory_card,
    replicates_by_sharding,
    with_precision,
)
from meshplan.arithmetic.offload import offload_plan
from meshplan.arithmetic.pipeline_timeline import schedule_order
from meshplan.arithmetic.schedule import (
    VirtualSplit,
    accounted_counts,
    layout_problem,
    parse_layout,
)
from meshplan.check.split import (
    PipelineOption,
    megatron_uneven,
    model_pipeline_options,
    own_partition,
    pipeline_options,  # noqa: F401 (the search's space, as tests and bench import it from here)
    writes_layouts,
)
from meshplan.core.cancel import checkpoint
from meshplan.core.errors import MeshplanError
from meshplan.estimate.layer_records import scope_memo
from meshplan.estimate.memory import attention_switches
from meshplan.knowledge.adapter_knobs import default_render, missing_knob
from meshplan.knowledge.cards import FrameworkCard, load_card
from meshplan.knowledge.defaults_card import SearchKnobs
from meshplan.knowledge.gdn_config import pipeline_unit, split_layers
from meshplan.knowledge.model_counts import layer_params
from meshplan.request.resolve import (
    _cuda_graph_fields,
    _defer_grad_sync,
    _expandable_segments,
    _grad_reduce_overlap,
    _offload_fields,
    _precision_fields,
    _torch_compile,
)
from meshplan.rl.job import is_rl_request
from meshplan.rules.context import pads_every_cp_split
from meshplan.schema.choices import PipelineSchedule, Recompute
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan, degree_words
from meshplan.schema.request import Request

SEARCHED_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "zero_stage", "micro_batch_size", "recompute")
RECOMPUTE_ORDER: tuple[Recompute, ...] = ("none", "selective", "full")
_SCHEDULES: frozenset[str] = frozenset(get_args(PipelineSchedule))  # the pipeline_schedule values a Plan takes
DEFAULT_PLAN = Plan()  # every field at its default: what Layout.copied_plan copies where no search plan is at hand
_LAYOUT_LENGTHS: tuple[int, int] = tuple(  # type: ignore[assignment]
    getattr(m, name) for name in ("min_length", "max_length")
    for m in Plan.model_fields["pipeline_layout"].metadata if hasattr(m, name))  # the lengths a Plan's layout takes


# --------------------------------------------------------------------------- the search card


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchLimits(_Card):
    """The search's bounds: each counts work (estimates, GPU counts, searches), never time, so an answer is the same
    on every machine and under any load."""

    max_evaluations: int = Field(ge=1)
    absurd_max_evaluations: int = Field(ge=1)
    evaluations_source: str
    largest_cluster_gpus: int = Field(ge=1)
    largest_cluster_source: str
    min_gpus_search_limit: int = Field(ge=1)
    min_gpus_search_source: str
    min_gpus_max_counts: int = Field(ge=1)
    min_gpus_max_searches: int = Field(ge=1)
    min_gpus_work_source: str
    closest_layouts: int = Field(ge=1)


class SearchComparison(_Card):
    """Thresholds for comparing layouts, in the one meaning of "X% slower" (search.slower_by)."""

    agreement_tolerance: float = Field(ge=0, lt=1)
    agreement_source: str
    below_headroom_gain: float = Field(ge=0, lt=1)
    below_headroom_source: str


class SearchCard(_Card):
    description: str
    limits: SearchLimits
    comparison: SearchComparison


def search_card() -> SearchCard:
    return load_card("search", SearchCard)


def zero_ladder(card: FrameworkCard) -> tuple[int, ...]:
    """ZeRO / FSDP stages worth searching, most memory first: those with a byte preset (cards/memory.yaml),
    skipping a stage whose tensors are identical to a lower stage's (Megatron has no distinct stage 2). A ZeRO-0 run
    as fully_shard over a shard of one (memory_states.replicates_by_sharding: torchtitan 0.3) has ZeRO-3's tensors
    but shards them over one replica's ranks, not over dp: a stage of its own."""
    seen: list[tuple] = []
    stages: list[int] = []
    for stage in range(4):
        try:
            name, _, tensors = convention(card, stage)
        except MeshplanError:
            continue
        signature = (name, tuple((t.tensor_class, t.bytes, t.shard) for t in tensors),
                     replicates_by_sharding(card, stage))
        if signature in seen:
            continue
        seen.append(signature)
        stages.append(stage)
    return tuple(stages)


def request_zeros(card: FrameworkCard, fixed: Fixed) -> tuple[int, ...]:
    """The ZeRO stages a request leaves open: its zero_stage where it fixes one, else the framework's zero_ladder
    (what the search, the space's refusals and the RL host floor start from)."""
    if "zero_stage" in fixed:
        return (int(fixed.values["zero_stage"]),)  # type: ignore[call-overload]
    return zero_ladder(card)


def adapter_refused_zeros(job: Job, zeros: tuple[int, ...]) -> tuple[int, ...]:
    """The ZeRO stages of `zeros` that rule AD001 refuses on every layout of this job: the framework's adapter (the
    version and variant `render` writes by default, knowledge/adapter_knobs.missing_knob) has no key for the stage,
    on the variant a layout without and with model parallelism gets (torchtitan and KempnerForge ZeRO-1, SkyRL's
    ZeRO-0, verl's ZeRO-2). The search leaves them out and counts their plans under AD001 (SearchPlans.refused)."""
    refused = []
    for zero in zeros:
        probes = [Plan(tp=tp, pp=pp, zero_stage=zero) for tp, pp in ((1, 1), (2, 1), (1, 2))]
        targets = [default_render(job.card, job, plan) for plan in probes]
        if all(t is not None and missing_knob(job.card, *t, job, plan, frozenset({f"zero_{zero}"}))
               for t, plan in zip(targets, probes, strict=True)):
            refused.append(zero)
    return tuple(refused)


# --------------------------------------------------------------------------- arithmetic


@cache
def divisors(n: int) -> tuple[int, ...]:
    """Every divisor of n, ascending (trial division to sqrt(n): fast up to 2^40)."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return tuple(small + large[::-1])


# --------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """The structural part of a plan: degrees and the pipeline split (ordered by `order_key`)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int
    vpp: int = 1
    first: int | None = None
    last: int | None = None
    split: VirtualSplit | None = None  # a split first/last cannot say: embedding/loss counted, or a layout string
    schedule: str = ""  # a named pipeline_schedule (schedule_options); "": the framework's default

    def plan(self, *, zero_stage: int, recompute: Recompute, micro_batch_size: int, sequence_parallel: bool,
             cp_comm_type: str, moe_token_dispatcher: str = "alltoall", moe_a2a_overlap: bool = False,
             **carried: object) -> Plan:
        """The plan of this layout with the searched knobs, and `carried`: the request's fields the search keeps as
        given (Fixed.carried)."""
        return Plan(
            tp=self.tp, pp=self.pp, vpp=self.vpp, cp=self.cp, ep=self.ep, etp=self.etp, dp=self.dp,
            sequence_parallel=sequence_parallel, zero_stage=zero_stage, micro_batch_size=micro_batch_size,
            recompute=recompute, cp_comm_type=cp_comm_type,  # type: ignore[arg-type]
            moe_token_dispatcher=moe_token_dispatcher,  # type: ignore[arg-type]
            moe_a2a_overlap=moe_a2a_overlap, first_stage_layers=self.first, last_stage_layers=self.last,
            **(self.split.fields() if self.split is not None else {}),  # type: ignore[arg-type]
            pipeline_schedule=self.schedule or None,  # type: ignore[arg-type]
            **carried,  # type: ignore[arg-type]
        )

    def copied_plan(self, model: Plan | None, knobs: dict[str, object], sequence_parallel: bool,
                    tp_comm_overlap: bool) -> Plan | None:
        """plan(**knobs, sequence_parallel=..., tp_comm_overlap=..., cp_comm_type and carried as `model`'s), copied
        from `model` (another layout's plan built so, without a split) instead of validated again (about a quarter
        of the instructions): the same plan, field for field and in its fields set (a split's three fields join it
        as plan() passes them), where every value it takes from this layout is one validation returns unchanged
        (degrees ints >= 1, stage sizes ints >= 0 or None, a named schedule of PipelineSchedule, bools, a layout
        string of the lengths Plan allows; the knobs as SearchPlans.knobs makes them); None where one is not, or no
        model is given, for plan() to validate."""
        split = self.split.fields() if self.split is not None else {}
        layout = split.get("pipeline_layout")
        if (model is None or type(sequence_parallel) is not bool or type(tp_comm_overlap) is not bool
                or (self.schedule and self.schedule not in _SCHEDULES)
                or not all(type(v) is int and v >= 1 for v in (self.tp, self.pp, self.vpp, self.cp, self.ep,
                                                                self.etp, self.dp))
                or not all(v is None or (type(v) is int and v >= 0) for v in (self.first, self.last))
                or not all(type(split[name]) is bool for name in split if name != "pipeline_layout")
                or (layout is not None and not (type(layout) is str and _LAYOUT_LENGTHS[0] <= len(layout)
                                                <= _LAYOUT_LENGTHS[1]))):
            return None
        return model.copied({
            "tp": self.tp, "pp": self.pp, "vpp": self.vpp, "cp": self.cp, "ep": self.ep, "etp": self.etp,
            "dp": self.dp, "sequence_parallel": sequence_parallel, **knobs, "first_stage_layers": self.first,
            "last_stage_layers": self.last, **split, "pipeline_schedule": self.schedule or None,
            "tp_comm_overlap": tp_comm_overlap})

    def bubble_stages(self) -> float:
        """The steady-state bubble a bound may count, in stage-times: (pp - 1) / vpp, or none for a zero-bubble
        schedule (its weight gradients fill the bubble; pipeline_timeline replays what is left)."""
        return 0.0 if self.schedule in ZERO_BUBBLE_SCHEDULES else (self.pp - 1) / self.vpp

    def __hash__(self) -> int:
        """The dataclass's own hash (of the fields in order), computed once per object: the search hashes each
        layout many times (its caches are keyed by it) and a split's counts make that tuple long."""
        try:
            return self.__dict__["_hash"]
        except KeyError:
            value = hash((self.tp, self.pp, self.cp, self.ep, self.etp, self.dp, self.vpp, self.first, self.last,
                          self.split, self.schedule))
            object.__setattr__(self, "_hash", value)
            return value

    def __getstate__(self) -> dict:
        """The fields without the cached hash and base: a string's hash differs between processes."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_base")}

    def shape(self) -> tuple:
        """The degrees and the bubble a bound counts (bubble_stages): what the search's seed keys read of a layout
        (not its split, nor a schedule that leaves the bubble)."""
        return (self.tp, self.pp, self.cp, self.ep, self.etp, self.dp, self.vpp, self.bubble_stages())

    def order_key(self) -> tuple:
        """The fields in order, an absent split as none (sorting mixes first/last sizes with None)."""
        return (self.tp, self.pp, self.cp, self.ep, self.etp, self.dp, self.vpp, self.first or 0, self.last or 0,
                self.split.counts if self.split is not None else (), self.schedule)

    def __lt__(self, other: Layout) -> bool:
        return self.order_key() < other.order_key()

    def base(self) -> Layout:
        """The same layout without interleaving: every rank keeps its number of decoder layers (a virtual split's
        per-rank totals as first/last stage sizes), so its pipeline traffic bounds the interleaved one's, and so does
        its memory where the ranks keep the same layers (`own_memory`)."""
        if self.vpp == 1:
            return self
        hit = self.__dict__.get("_base")
        if hit is not None:
            return hit
        first, last = self.first, self.last
        if self.split is not None:
            counts = self.split.rank_counts(self.pp)
            first, last = (None, None) if len(set(counts)) == 1 else (counts[0], counts[-1])
        base = Layout(self.tp, self.pp, self.cp, self.ep, self.etp, self.dp, 1, first, last)
        object.__setattr__(self, "_base", base)  # once per object, like the hash
        return base

    def own_memory(self) -> Layout:
        """The layout whose first stage's memory floor bounds this one's: its base, except for a virtual split,
        whose ranks hold other layers than a first/last split of the same sizes (rank 0 of E+t | (tt|)*30 | mL over
        pp 8 holds layers 0, 8-9, 24-25, ..., not 0-7): on a model whose layers differ (dense and MoE) the base's
        floor could exceed its peak, so it is its own. The same holds of its base on such a model (Llama-4-Maverick's
        alternating layers over PP4 VPP12: rank 0 holds dense layers only), so the search takes it only where every
        rank holds layers of the same kinds in the same order (floors.own_memory)."""
        return self if self.split is not None else self.base()

    def short(self) -> str:
        parts = [*degree_words(self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp), f"DP{self.dp}"]
        if self.schedule:
            parts.append(self.schedule)
        return " ".join(parts)


# The schedules recommend tries beside a framework's default (where its card runs them and its adapter writes them):
# zero-bubble and DualPipeV; GPipe is never faster than 1F1B and holds more, and combined 1F1B is moe_a2a_overlap.
ZERO_BUBBLE_SCHEDULES = ("zero_bubble", "dualpipev")


def schedule_options(card: FrameworkCard, pp: int, vpp: int, fixed: Fixed) -> tuple[str, ...]:
    """The pipeline_schedule values the search tries for a layout ("" = the framework's default): the request's, or
    the default and each of ZERO_BUBBLE_SCHEDULES the framework runs at this vpp and its adapter renders."""
    if "pipeline_schedule" in fixed:
        return (str(fixed.values["pipeline_schedule"]),)
    if pp == 1 or vpp == 1 or card.adapter is None:
        return ("",)
    knob = card.adapter.versions[card.adapter.default_version].knobs["pipeline_schedule"]
    runs = [s for s in ZERO_BUBBLE_SCHEDULES if (s != "dualpipev" or vpp == 2)
            and schedule_order(s, vpp) in card.pipeline.schedules and (knob.values or {}).get(s) is not None]
    return ("", *runs)


OFFLOAD_FIELDS = ("activation_offload", "param_offload", "grad_offload", "optimizer_offload",
                  "optimizer_offload_fraction")
"""The offload knobs (meshplan/arithmetic/offload.py): the request's, in every plan the search ranks; what they move on
each ZeRO stage's engine is the card's offload section; a stage whose engine lacks one is refused by rule OF001."""

CARRIED_FIELDS = ("optimizer", "optimizer_state_dtype", "fp8_param_gather", "grad_reduce_in_fp32", "fp8_recipe",
                  "torch_compile", "expandable_segments", "defer_fsdp_grad_sync", "grad_reduce_overlap",
                  "attention_backend", "dropout", *OFFLOAD_FIELDS)
"""Plan fields the search never chooses: every ranked plan keeps them as the request resolves them (left out: the
framework's default, as `meshplan memory` and `throughput` take it). The optimizer is a training decision, not a
layout (Muon's memory and Newton-Schulz time are estimated for the optimizer asked for)."""

# never chosen, carried only when given: hybrid sharding's replicas (DP001); the layers per stage full recompute takes
# and how (Megatron's recompute_num_layers / recompute_method; RC001 refuses them at a lighter recompute);
# Megatron-Core's CUDA graphs (rules CG001-CG003; timed as eager, so they rank no plan apart)
GIVEN_ONLY_FIELDS = ("dp_replicate", "recompute_layers", "recompute_method", "cuda_graph_impl", "cuda_graph_modules")


@dataclass
class Fixed:
    """Request fields the user set: they constrain the search; the others are searched. `carried`: the plan fields
    the search keeps as the request resolves them (CARRIED_FIELDS), `given` the names of those the request set."""

    values: dict[str, object] = field(default_factory=dict)
    carried: dict[str, object] = field(default_factory=dict)
    given: frozenset[str] = frozenset()

    @classmethod
    def from_request(cls, req: Request, job: Job) -> Fixed:
        chosen = req.model_fields_set
        names = (*SEARCHED_FIELDS, "sequence_parallel", "cp_comm_type", "moe_token_dispatcher", "moe_a2a_overlap",
                 "tp_comm_overlap", "first_stage_layers", "last_stage_layers", "pipeline_schedule",
                 *SPLIT_FIELDS)
        values = {name: getattr(req, name) for name in names if name in chosen and getattr(req, name) is not None}
        given = frozenset(n for n in (*CARRIED_FIELDS, *GIVEN_ONLY_FIELDS)
                          if n in chosen and getattr(req, n) is not None)
        return cls(values, carried_fields(req, job), given)

    def allows(self, name: str, value: object) -> bool:
        return name not in self.values or self.values[name] == value

    def __contains__(self, name: str) -> bool:
        return name in self.values


@dataclass(frozen=True)
class Prefiltered:
    """A group of layouts dropped before evaluation, with the rule-like reason (attributed to a rule id
    by running check_config on `example`)."""

    reason: str
    example: Layout
    layouts: int


def carried_fields(req: Request, job: Job) -> dict[str, object]:
    """CARRIED_FIELDS as request.resolve fills them (precision, compile, offload at the request's ZeRO stage), from the
    request's `job` as resolved (its card, release and model: search_job's)."""
    card = job.card
    zero = card.defaults.zero_stage if req.zero_stage is None else req.zero_stage
    fields = {**_precision_fields(req, card, []), "torch_compile": _torch_compile(req, card, []),
              "expandable_segments": _expandable_segments(req, card, [], is_rl_request(req)),
              "defer_fsdp_grad_sync": _defer_grad_sync(req, card, [], job.framework_version, job.model.model_type),
              "grad_reduce_overlap": _grad_reduce_overlap(req, card, []),
              "attention_backend": req.attention_backend or "auto", "dropout": req.dropout,
              **_offload_fields(req, card.offload_at(zero), [], is_rl_request(req))}
    _cuda_graph_fields(req)  # refuses modules without a per-layer implementation, as resolve does
    given = {k: getattr(req, k) for k in GIVEN_ONLY_FIELDS if getattr(req, k) is not None}
    return {**{k: fields[k] for k in CARRIED_FIELDS}, **given}


def tp_splits_heads(job: Job, tp: int) -> bool:
    """Heads split evenly; KV groups a multiple or a divisor of tp (Megatron's TransformerConfig)."""
    arch = job.model
    g = arch.num_kv_heads
    return arch.num_attention_heads % tp == 0 and (g % tp == 0 or tp % g == 0)


SPLIT_FIELDS = ("pipeline_layout", "account_for_embedding", "account_for_loss")


def reference_split(arch: Architecture, fixed: Fixed) -> VirtualSplit | None:
    """The split of the bounds' single-stage references (search/bounds._per_token): none, but where the request's own
    pipeline layout places no MTP layer m on a model with MTP blocks (Megatron-Core then builds none:
    schedule.explicit_stages), one stage without them, so the references leave out the blocks and their depths'
    output layers as every layout they bound does (trained there, a reference over-counts the layouts' step)."""
    layout = fixed.values.get("pipeline_layout")
    if layout is None or not arch.num_mtp_layers or "m" in str(layout):
        return None
    return VirtualSplit((arch.num_layers,), layout="E" + "t" * split_layers(arch) + "L")


def given_options(num_layers: int, pp: int, fixed: Fixed, unit: int = 1, mtp_layers: int = 0
                  ) -> tuple[PipelineOption, ...]:
    """The request's own explicit layout (its vpp the layout's stages over pp) or embedding/loss accounting (at every
    vpp it divides): the split is kept as given; one Megatron-Core refuses is left out (rule PP009 says why, as
    `meshplan check` does at fixed degrees: schedule.layout_problem, so a layout of more decoder layers than the model
    has, whose spans ran past the model's layers in the floors, IndexError, is never searched). Each t and accounted
    layer is `unit` layers (a Gated DeltaNet hybrid's decoder layer: schedule.explicit_stages); `mtp_layers` the
    model's MTP layers, which a layout places all or none of."""
    layout = fixed.values.get("pipeline_layout")
    if layout is not None:
        stages = parse_layout(str(layout))
        if layout_problem(stages, pp, max(1, len(stages) // pp), num_layers // unit, mtp_layers):
            return ()
        counts = tuple(stage.count("t") * unit for stage in stages)
        return (PipelineOption(len(stages) // pp, None, None, VirtualSplit(counts, layout=str(layout))),)
    embedding, loss = bool(fixed.values.get("account_for_embedding")), bool(fixed.values.get("account_for_loss"))
    out = []
    for v in range(1, num_layers // unit // pp + 1):
        counts, problem = accounted_counts(num_layers // unit, pp, v, embedding, loss)
        if not problem:
            out.append(PipelineOption(v, None, None, VirtualSplit(tuple(n * unit for n in counts), embedding=embedding,
                                                                  loss=loss)))
    return tuple(out)


def _expert_options(job: Job, law: str, world: int, tp: int, pp: int, cp: int, dp: int,
                    kn: SearchKnobs, fixed: Fixed) -> Iterator[tuple[int, int]]:
    """(ep, etp) pairs the framework can express for this dense layout."""
    moe = job.model.moe
    if moe is None or not kn.ep:
        # Nothing to search; a fixed ep/etp is kept so that check_config can say why it is wrong.
        yield int(fixed.values.get("ep", 1)), int(fixed.values.get("etp", 1))  # type: ignore[call-overload]
        return
    etps = divisors(tp) if kn.etp else (1,)
    for ep in divisors(moe.num_experts):
        if not fixed.allows("ep", ep):
            continue
        for etp in etps:
            if not fixed.allows("etp", etp):
                continue
            if mesh.expert_grid_fits(law, world, tp, pp, cp, dp, ep, etp):
                yield ep, etp


SPACES_KEPT = 4
"""enumerate_layouts' results kept per request scope: one count's space is asked by refuse_impossible, split_space
and min-gpus' count checks in turn, and a min-gpus scan moves on to the next count (each space up to ~10^5 layouts)."""


def enumerate_layouts(job: Job, fixed: Fixed) -> tuple[list[Layout], list[Prefiltered]]:
    """Every layout of the framework's world-size law over divisors of the GPU count, respecting fixed fields.

    Layouts that break a cheap structural law (heads vs tp, seq_length vs cp, pp deeper than the
    model) are returned as `Prefiltered` groups instead, so the caller can count them under a rule id.

    Inside a shared_layers scope (one recommend or min-gpus request: one set of cards) the space is enumerated once
    per what it reads (space_key) and each caller gets its own lists of the same Layout objects (SPACES_KEPT kept).
    """
    layouts, dropped, _ = enumerate_space(job, fixed)
    return layouts, dropped


def enumerate_space(job: Job, fixed: Fixed) -> tuple[list[Layout], list[Prefiltered], tuple[LayoutRun, ...]]:
    """enumerate_layouts with the runs its layouts come in (LayoutRun: what the search's tiers and seeding read a run
    at a time instead of a layout at a time), from the same scope memo; none where no run holds more than one (ep,
    etp) (a dense model's space: a run then saves the seeding nothing, and the tiers and seeding read its layouts one
    at a time, tiers.split_space, seeding.sized)."""
    memo = scope_memo("layouts")
    key = space_key(job, fixed) if memo is not None else None
    if key is None:
        return _enumerate_layouts(job, fixed)
    hit = memo.get(key)  # type: ignore[union-attr]
    if hit is None:
        if len(memo) >= SPACES_KEPT:  # type: ignore[arg-type]
            memo.clear()  # type: ignore[union-attr]
        hit = memo[key] = (job.model, *_enumerate_layouts(job, fixed))  # type: ignore[index]
    return list(hit[1]), list(hit[2]), hit[3]


def space_key(job: Job, fixed: Fixed) -> tuple | None:
    """What enumerate_layouts reads: the job's framework (its card's law and knobs), GPU count, sequence length and
    model (by identity: the memo entry keeps it alive, so its id stays its own), and the fixed fields' values; None
    when a fixed value cannot be hashed (then it is enumerated afresh)."""
    key = (job.framework, job.num_gpus, job.seq_length, id(job.model), tuple(fixed.values.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _enumerate_layouts(job: Job, fixed: Fixed) -> tuple[list[Layout], list[Prefiltered], tuple[LayoutRun, ...]]:
    law = job.card.world_size_law
    kn = job.card.search
    arch = job.model
    W, L = job.num_gpus, arch.num_layers
    moe = arch.moe
    found: list[Layout] = []
    runs: list[tuple] = []  # found as variants' runs, in order: LayoutRun's fields
    keep_runs = moe is not None  # (a dense model's runs hold one (ep, etp) each: none kept)
    several = False  # whether a run holds more than one (ep, etp) (else no runs are returned: enumerate_space)
    dropped: dict[str, list] = {}

    def drop(reason: str, layout: Layout) -> None:
        entry = dropped.setdefault(reason, [layout, 0])
        entry[1] += 1

    ep_own = [1]
    if mesh.ep_has_own_ranks(law):  # search EP as an outer mesh dimension
        choices = divisors(moe.num_experts) if moe is not None and kn.ep else (int(fixed.values.get("ep", 1)),)  # type: ignore[call-overload]
        ep_own = [e for e in choices if W % e == 0 and fixed.allows("ep", e)]
    def choices(name: str, n: int) -> tuple[int, ...]:
        # A fixed value is tried even when it does not divide the GPUs, so a rule can say why it fails.
        return (int(fixed.values[name]),) if name in fixed else divisors(n)  # type: ignore[call-overload]

    fixed_split = None
    if "first_stage_layers" in fixed or "last_stage_layers" in fixed:
        fixed_split = (fixed.values.get("first_stage_layers"), fixed.values.get("last_stage_layers"))
    uneven_interleave = megatron_uneven(job.framework)
    layouts = writes_layouts(job.card) and fixed_split is None
    own = own_partition(job.card)
    given_split = any(fixed.values.get(name) for name in SPLIT_FIELDS)
    pads_cp = pads_every_cp_split(job.card)  # verl's, SkyRL's engines pad any length to the cp split: no CP001
    for ep_k in ep_own:
        rest = W // ep_k
        for tp in choices("tp", rest):
            tp_ok = tp_splits_heads(job, tp)
            for pp in choices("pp", max(1, rest // tp)):
                options = (given_options(L, pp, fixed, pipeline_unit(arch), arch.num_mtp_layers) if given_split else
                           model_pipeline_options(arch, pp, kn.vpp, uneven_interleave,  # type: ignore[arg-type]
                                                  fixed_split, layouts=layouts, own_partition=own))
                for cp in choices("cp", max(1, rest // (tp * pp))) if kn.cp or "cp" in fixed else (1,):
                    checkpoint()
                    dp = max(1, rest // (tp * pp * cp))
                    if rest % (tp * pp * cp) or not fixed.allows("dp", dp):
                        drop("world-size", Layout(tp=tp, pp=pp, cp=cp, ep=ep_k, etp=1,
                                                  dp=int(fixed.values.get("dp", dp))))  # type: ignore[call-overload]
                        continue
                    base = Layout(tp=tp, pp=pp, cp=cp, ep=ep_k, etp=1, dp=dp)
                    if not tp_ok:
                        drop("tp-heads", base)
                        continue
                    if pp > L or not options:
                        drop("pp-layers", base)
                        continue
                    if cp > 1 and job.seq_length % (2 * cp) and not pads_cp:
                        drop("cp-seq", base)
                        continue
                    if mesh.ep_has_own_ranks(law):
                        experts = ((ep_k, 1),)
                    else:
                        experts = tuple(_expert_options(job, law, W, tp, pp, cp, dp, kn, fixed))
                    if not experts:  # no (ep, etp) the law holds here: counted, so a rule can say why
                        drop("expert-grid", Layout(tp=tp, pp=pp, cp=cp, ep=int(fixed.values.get("ep", 1)),  # type: ignore[call-overload]
                                                   etp=int(fixed.values.get("etp", 1)), dp=dp))  # type: ignore[call-overload]
                        continue
                    if len(experts) > 1:
                        several = True
                    if "vpp" in fixed and all(fixed.values["vpp"] != o.vpp for o in options):
                        # A fixed interleaving the layers cannot fill: count it, so a rule can say why.
                        _, first, last, _ = options[0]
                        drop("pp-layers", Layout(tp=tp, pp=pp, cp=cp, ep=ep_k, etp=1, dp=dp,
                                                 vpp=int(fixed.values["vpp"]),  # type: ignore[call-overload]
                                                 first=first, last=last))
                        continue
                    for vpp, first, last, split in options:
                        if not fixed.allows("vpp", vpp):
                            continue
                        schedules = schedule_options(job.card, pp, vpp, fixed)  # once per option, not per ep
                        if keep_runs:
                            runs.append((len(found), experts, schedules))
                        found += variants(Layout(tp=tp, pp=pp, cp=cp, ep=1, etp=1, dp=dp, vpp=vpp, first=first,
                                                 last=last, split=split), experts, schedules)
    groups = [Prefiltered(reason, example, count) for reason, (example, count) in dropped.items()]
    return found, groups, tuple(LayoutRun._make(run) for run in runs) if several else ()


class LayoutRun(NamedTuple):
    """Layouts that differ only in their (ep, etp) and schedule: those of a list from `start`, one per (ep, etp) of
    `experts` and, within it, per schedule of `schedules`, in that order (variants' own); their degrees but ep and
    etp, and their pipeline but the schedule, are the same. enumerate_space makes its layouts so, one run per degrees
    and pipeline option, and the runs of one (tp, pp, cp) share their `experts`: the search's tiers split a run at
    once (tiers.split_space) and its seeding groups the runs of a block of them per degrees (seeding.sized). A tuple
    (made at C speed: DeepSeek-V3 on 2,048 H100 has some 7,000)."""

    start: int
    experts: tuple[tuple[int, int], ...]
    schedules: tuple[str, ...]

    @property
    def stop(self) -> int:
        return self.start + len(self.experts) * len(self.schedules)

    def at(self, expert: int, schedule: int) -> int:
        """The index in the list of the layout of experts[expert] and schedules[schedule]."""
        return self.start + expert * len(self.schedules) + schedule


def variants(template: Layout, experts: tuple[tuple[int, int], ...], schedules: tuple[str, ...]) -> list[Layout]:
    """The template's layouts at each (ep, etp) and schedule, in that order: each the template's fields with those
    three replaced, equal (and hashing equal) to the Layout built from them. A copy of the template's fields rather
    than Layout(...) per layout: a frozen dataclass sets each field through object.__setattr__, two thirds of
    enumerate_layouts on DeepSeek-V3 over 2,048 GPUs (42 K layouts: 60 -> 20 ms); Layout has no __post_init__ to run.
    Each dict is a copy of one combined table of the template's fields (cloned whole) with the three set in place, in
    the same order: dict(fields, ep=...) inserted the eleven fields one by one (some 3,000 instructions a layout
    more). Combined, not the template's own split table (its instance values): an attribute read specialises on a
    combined table's entry (LOAD_ATTR_WITH_HINT) and falls back to the generic lookup on a split one's, which cost the
    search more than the copy saved (DeepSeek-V3/2,048 +226 M). A dense model's layouts (one (ep, etp), a schedule or
    a few) are built as before, each from the template's fields at once: there the combined table is one dict more
    (Llama-3.1-70B/64 +6 to +13 M). The template is fresh (no cached hash or base among its fields)."""
    new, set_fields = object.__new__, object.__setattr__
    out = []
    if len(experts) == 1:
        fields = template.__dict__
        ep, etp = experts[0]
        for schedule in schedules:
            lay = new(Layout)
            set_fields(lay, "__dict__", dict(fields, ep=ep, etp=etp, schedule=schedule))
            out.append(lay)
        return out
    fields = dict(template.__dict__)
    for ep, etp in experts:
        for schedule in schedules:
            own = fields.copy()
            own["ep"], own["etp"], own["schedule"] = ep, etp, schedule
            lay = new(Layout)
            set_fields(lay, "__dict__", own)
            out.append(lay)
    return out


def within_nvlink(job: Job, layout: Layout) -> bool:
    """TP (and expert TP) inside one NVLink domain: the first tier of the search."""
    domain = mesh.job_domain(job)
    return mesh.tp_fits_domain(layout.tp, domain) and mesh.tp_fits_domain(layout.etp, domain)


def micro_batches(job: Job, layout: Layout, fixed: Fixed) -> tuple[int, ...]:
    """Micro-batch sizes that divide each data-parallel rank's share of the global batch."""
    if job.global_batch_size % layout.dp:
        return ()
    local = job.global_batch_size // layout.dp
    if "micro_batch_size" in fixed:
        mbs = int(fixed.values["micro_batch_size"])  # type: ignore[call-overload]
        return (mbs,) if local % mbs == 0 else ()
    return divisors(local)


def layout_sequence_parallel(job: Job, fixed: Fixed, sp: bool, lay: Layout) -> bool:
    """A layout's sequence parallelism as the search builds its plans and the refusal checks them (one home): the
    request's choice, else the framework's default `sp` where there is TP to pair it with and the card keeps it in a
    pipeline of the layout's pp."""
    if "sequence_parallel" in fixed:
        return sp
    return sp and lay.tp > 1 and job.card.defaults.sequence_parallel_in_pipeline(lay.pp)


# --------------------------------------------------------------------------- cheap bounds


def params_split(job: Job) -> tuple[int, int]:
    """(non-expert parameters, routed-expert parameters) of the whole model."""
    arch = job.model
    dense = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    routed = 0
    for i in range(arch.num_layers):
        parts = layer_params(arch, i)
        routed += parts["routed_experts"]
        dense += sum(v for k, v in parts.items() if k != "routed_experts")
    return dense, routed


def state_preset(job: Job, zero_stage: int, carried: dict[str, object]) -> tuple[Convention, list[StateTensor]]:
    """The byte preset an estimate takes for a plan with these carried fields (memory_states.with_precision: the
    precision knobs and torch.compile; its flash attention and dropout the carried backend's and dropout's, as every
    estimate reads them, estimate/memory.attention_switches, not the convention's), as the search's memory floors read
    it: Muon's one momentum counted on every parameter (it keeps Adam's two moments on the embedding, output layer,
    norms and biases: fewer bytes, so still a floor); a LoRA job's frozen base keeps its weights only; gradients
    freed before the backward where some layout frees them (torchtitan 0.3 with its CUDA graphs off,
    memory_states.cuda_graphs_off: the floors take the lesser)."""
    plan = Plan(zero_stage=zero_stage, **carried)  # type: ignore[arg-type]
    _, conv, tensors = with_precision(job, plan)
    flash, dropout = attention_switches(job, conv, plan)  # the carried backend and dropout, as the estimate reads them
    if (flash, dropout) != (conv.flash_attention, conv.dropout):
        conv = conv.model_copy(update={"flash_attention": flash, "dropout": dropout})
    if conv.grads_set_to_none_without_cuda_graphs:  # a layout that turns CUDA graphs off frees them: the lesser
        conv = conv.model_copy(update={"grads_set_to_none": True})
    if plan.optimizer == "muon":
        counts = memory_card().optimizers.moment_buffers
        kept = counts["muon"] / counts["adam"]
        tensors = [t.model_copy(update={"bytes": t.bytes * kept}) if t.role == "moments" else t for t in tensors]
    moved = offload_plan(job.card, plan).in_step  # what the step keeps in host memory (offload.offload_stage)
    if any(moved.values()):
        tensors = [t.model_copy(update={"bytes": t.bytes * (1.0 - moved.get(t.tensor_class, 0.0))}) for t in tensors]
    return conv, base_tensors(job, fp8_primary_weights(job, conv, tensors))


def fp8_primary_weights(job: Job, conv: Convention, tensors: list[StateTensor]) -> list[StateTensor]:
    """The floors' weight bytes where fp8 weights replace the unsharded bf16 ones (fp8_param_gather, Megatron-Bridge's
    default for delayed, tensorwise and mxfp8): the estimate adds conv.fp8_weight_bytes, then negative, per
    linear-layer parameter of the rank (memory_stage.model_states), which the floors leave out; it is taken off every
    parameter's unsharded weight here, or its sharded one where Megatron-FSDP shards the fp8 primary weights
    (Convention.fp8_weights_sharded) (the embedding's, norms' too: fewer bytes, so still a floor)."""
    if job.precision != "fp8" or conv.fp8_weight_bytes >= 0:
        return tensors
    shard = "none" if not conv.fp8_weights_sharded else "dp"  # Megatron-FSDP's: off the sharded bf16 weight
    return [t.model_copy(update={"bytes": t.bytes + conv.fp8_weight_bytes})
            if t.tensor_class == "weights" and t.shard == shard else t for t in tensors]


def states_lower_bound(job: Job, layout: Layout, zero_stage: int, split: tuple[int, int],
                       tensors: list[StateTensor] | None = None,
                       per_param: Callable[[int], float] | None = None) -> float:
    """Bytes of model states on the most loaded GPU can be no fewer than this: the average stage's share of
    the parameters (dense split tp ways, experts ep*etp ways) times the preset's bytes per parameter
    (cards/memory.yaml; `tensors`: state_preset's, else the framework's plain preset) with sharding over the largest
    group the framework could use. No activations. `per_param`: bytes_per_param of those tensors per shard size
    (a caller's memo of it: the search asks a few shard sizes of thousands of layouts)."""
    if tensors is None:
        tensors = state_preset(job, zero_stage, {})[1]
    if per_param is None:
        per_param = partial(bytes_per_param, tensors)
    dense, routed = split
    world = job.num_gpus
    dense_shard = layout.dp * layout.cp
    expert_shard = max(world // (layout.pp * layout.ep * layout.etp), dense_shard)
    dense_gpu = dense / (layout.pp * layout.tp)
    expert_gpu = routed / (layout.pp * layout.ep * layout.etp)
    return per_param(dense_shard) * dense_gpu + per_param(expert_shard) * expert_gpu


@dataclass
class Tiers:
    """A job's space as run_search splits it, the same at any memory budget: the layouts with TP inside the NVLink
    domain and across it, the plans considered, those counted rejected before the queue (a cheap law's groups, rule
    AD001's ZeRO stages), and the plans of the layouts across the domain."""

    inside: list[Layout]
    across: list[Layout]
    considered: int
    rejected: Counter
    across_plans: int
    # the runs each tier's layouts come in (LayoutRun: a run of the space whose (ep, etp) all fall in the tier, or
    # those of them that do): what the seeding reads instead of each layout (seeding.sized); None where the space has
    # no runs (enumerate_space: none holds more than one (ep, etp)), its layouts then read one at a time
    inside_runs: tuple[LayoutRun, ...] | None = None
    across_runs: tuple[LayoutRun, ...] | None = None
