"""Schemas of the two knowledge cards, cards/strategies.yaml and cards/pitfalls.yaml.

The skill documents render their tables from these cards (meshplan/faces/docs.py) and the search compares
its answer with the decision tables (meshplan/search/strategies.py), so every row is typed here and every
row carries the source it came from. A row that names a model, a GPU count and a layout is a
`CheckedLayout`: the tests run it through check_config and estimate_memory, and the docs show the
tool's predicted memory and throughput next to it.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.knowledge.cards import load_card
from meshplan.schema.choices import FRAMEWORKS, Framework, Precision, Recompute
from meshplan.schema.plan import degree_words


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _nonempty(text: str, what: str) -> str:
    if not text.strip():
        raise ValueError(f"{what} must not be empty")
    return text


class Layout(_Card):
    """A parallel layout as the cards write it; dp is always derived from the GPU count."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    etp: int = Field(1, ge=1)
    sequence_parallel: bool | None = None
    zero_stage: int | None = Field(None, ge=0, le=3)
    micro_batch_size: int = Field(1, ge=1)
    recompute: Recompute = "none"
    first_stage_layers: int | None = Field(None, ge=1)
    last_stage_layers: int | None = Field(None, ge=1)

    def short(self) -> str:
        parts = degree_words(self.tp, self.pp, self.vpp, self.cp, self.ep, self.etp)
        if self.first_stage_layers or self.last_stage_layers:
            parts.append(f"(first {self.first_stage_layers}, last {self.last_stage_layers} layers)")
        return " ".join(parts)


class CheckedLayout(_Card):
    """A concrete job + layout that the tests validate with check_config and estimate_memory."""

    model: str = Field(description="Catalog key")
    gpu: str = "h100"
    num_gpus: int = Field(ge=1)
    seq_length: int = Field(4096, ge=1)
    global_batch_size: int | None = Field(None, ge=1)
    framework: Framework = "megatron-core"
    precision: Precision = "bf16"
    gpus_per_node: int | None = Field(
        None, ge=1, description="GPUs per node where the source's nodes differ from the GPU's usual node "
                                "(KempnerForge's H200 nodes of 4): which groups stay on NVLink; None: the GPU's node")
    layout: Layout

    def request_fields(self) -> dict:
        """The request fields (see meshplan.schema.request.Request) this row stands for."""
        lay = self.layout
        fields = {
            "model": self.model, "gpu": self.gpu, "num_gpus": self.num_gpus, "seq_length": self.seq_length,
            "framework": self.framework, "precision": self.precision, "tp": lay.tp, "pp": lay.pp,
            "vpp": lay.vpp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp,
            "micro_batch_size": lay.micro_batch_size, "recompute": lay.recompute,
        }
        if self.global_batch_size is not None:
            fields["global_batch_size"] = self.global_batch_size
        if self.gpus_per_node is not None:
            fields["gpus_per_node"] = self.gpus_per_node
        if lay.sequence_parallel is not None:
            fields["sequence_parallel"] = lay.sequence_parallel
        if lay.zero_stage is not None:
            fields["zero_stage"] = lay.zero_stage
        if lay.first_stage_layers is not None:
            fields["first_stage_layers"] = lay.first_stage_layers
        if lay.last_stage_layers is not None:
            fields["last_stage_layers"] = lay.last_stage_layers
        return fields


class _Sourced(_Card):
    source: str

    @model_validator(mode="after")
    def _has_source(self):
        _nonempty(self.source, "source")
        return self


class RecipeGap(_Card):
    """The figures a `differs_from_search` reason rests on, as bench/recipes_agreement.py --gaps derived them on
    `derived`: the recipe's step with its degrees pinned and the search's best knobs, and the search's free pick with
    its step, at the global batch the search compares layouts on. tests/test_recipe_gaps.py reruns the bench's
    evaluation on every explained row and fails where the pick or either step has moved, so the notes SKILL.md shows
    cannot go stale."""

    derived: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    recipe_s: float = Field(gt=0)
    pick: str = Field(min_length=1, description="The search's pick, as Plan.short() names it")
    pick_s: float = Field(gt=0)

    def words(self) -> str:
        """The sentence the skill pages lead the reason with."""
        return (f"Derived by bench/recipes_agreement.py --gaps on {self.derived}: with its degrees and the search's "
                f"best knobs the recipe takes {self.recipe_s:.2f} s a step against {self.pick_s:.2f} s for the "
                f"search's pick, {self.pick}.")


class DiffersFromSearch(_Sourced):
    """Why a recipe is predicted more than 15% slower than the search's top pick for its job.

    "X% slower" has one meaning everywhere (meshplan.search.slower_by): the share of the pick's tokens/s/GPU the
    recipe loses, 1 - recipe / pick, at the same global batch; the 15% is cards/search.yaml agreement_tolerance.
    `reason` says what the recipe's authors optimised for and which term of meshplan's cost model
    (meshplan/estimate/perf.py, meshplan/arithmetic/comm.py, cards/calibration.yaml) does not capture it, or is likely
    wrong; `source` names where the recipe's side comes from. bench/recipes_agreement.py counts a
    row that is off by more than 15% as explained only when it carries this.
    """

    reason: str
    gap: RecipeGap | None = None

    @property
    def text(self) -> str:
        """The reason as the skill pages give it: the derived figures first, where the row carries them."""
        return self.reason if self.gap is None else f"{self.gap.words()} {self.reason}"

    @model_validator(mode="after")
    def _has_reason(self):
        _nonempty(self.reason, "reason")
        return self


class SizeRow(_Sourced):
    """Dense decision table: a parameter range and the layout to start from."""

    id: str
    min_params_b: float = Field(ge=0, description="Lower bound, billions of parameters (inclusive)")
    max_params_b: float = Field(gt=0, description="Upper bound, billions (exclusive)")
    gpus: str = Field(description="Typical GPU count, as text (e.g. '16-64')")
    start: str = Field(description="The starting point in words (e.g. 'TP 4-8 + PP 2-4 + DP')")
    layout: Layout = Field(description="The concrete starting layout suggest() adapts to a job")
    why: str
    example: CheckedLayout | None = None
    differs_from_search: DiffersFromSearch | None = None

    @model_validator(mode="after")
    def _explains_an_example(self):
        if self.differs_from_search is not None and self.example is None:
            raise ValueError(f"{self.id}: differs_from_search needs an example to differ")
        return self


class MoEModelRow(_Sourced):
    """MoE decision table: a published recipe for a named model, checked by the tool."""

    id: str
    notes: str = ""
    recipe: CheckedLayout
    differs_from_search: DiffersFromSearch | None = None


class MoESizeRow(_Sourced):
    """MoE decision table by total size, for models without a named recipe."""

    id: str
    min_params_b: float = Field(ge=0)
    max_params_b: float = Field(gt=0)
    start: str
    layout: Layout


class TopologyRow(_Sourced):
    id: str
    situation: str
    advice: str


class SeqRow(_Sourced):
    id: str
    min_seq: int = Field(ge=0, description="Inclusive lower bound, tokens")
    max_seq: int | None = Field(None, description="Exclusive upper bound, tokens (None: no bound)")
    advice: str
    cp: int = Field(1, ge=1, description="Context-parallel size to start from")
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] | None = None


class WorkedExample(_Sourced):
    id: str
    title: str
    kind: Literal["3d", "4d", "moe", "fsdp", "long-context"]
    description: str
    job: CheckedLayout
    differs_from_search: DiffersFromSearch | None = None


class Tradeoff(_Sourced):
    dimension: str
    splits: str
    communication: str
    saves: str
    use_when: str
    avoid_when: str


class Correction(_Sourced):
    """A statement in a seed document that is wrong, what is right, and why."""

    id: str
    seed: str = Field(description="Seed file (../shared/reference/seeds/) or guide that says it")
    claim: str
    correct: str
    why: str


class WorkflowStep(_Card):
    step: int = Field(ge=1)
    action: str
    tool: str = Field(description="The MCP tool (or CLI command) that does it")
    read: str = Field(description="What to look at in the result")


class StrategiesCard(_Card):
    description: str
    dense_by_size: list[SizeRow]
    moe_by_model: list[MoEModelRow]
    moe_by_size: list[MoESizeRow]
    topology: list[TopologyRow]
    sequence_length: list[SeqRow]
    examples: list[WorkedExample]
    tradeoffs: list[Tradeoff]
    workflow: list[WorkflowStep]
    corrections: list[Correction]

    @model_validator(mode="after")
    def _consistent(self):
        ids = [r.id for r in (*self.dense_by_size, *self.moe_by_model, *self.moe_by_size, *self.topology,
                              *self.sequence_length, *self.examples, *self.corrections)]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate row ids: {dupes}")
        for rows in (self.dense_by_size, self.moe_by_size):
            _check_ranges(rows)
        seqs = sorted(self.sequence_length, key=lambda r: r.min_seq)
        if seqs and seqs[0].min_seq != 0:
            raise ValueError("sequence_length rows must start at 0 tokens")
        for a, b in pairwise(seqs):
            if a.max_seq != b.min_seq:
                raise ValueError(f"sequence_length rows {a.id} and {b.id} leave a gap or overlap")
        if seqs and seqs[-1].max_seq is not None:
            raise ValueError("the last sequence_length row must have no upper bound")
        steps = [s.step for s in self.workflow]
        if steps != list(range(1, len(steps) + 1)):
            raise ValueError(f"workflow steps must be numbered 1..n in order, got {steps}")
        return self


def _check_ranges(rows: list) -> None:
    """Size rows must tile [0, inf) without gaps, so every model lands in exactly one row."""
    ordered = sorted(rows, key=lambda r: r.min_params_b)
    if not ordered:
        raise ValueError("a size table needs at least one row")
    if ordered[0].min_params_b != 0:
        raise ValueError(f"size rows must start at 0B, first starts at {ordered[0].min_params_b}B")
    for a, b in pairwise(ordered):
        if a.max_params_b != b.min_params_b:
            raise ValueError(f"size rows {a.id} and {b.id} leave a gap or overlap")


class Pitfall(_Sourced):
    id: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    title: str
    area: Literal["memory", "throughput", "config", "correctness"]
    frameworks: list[str] = Field(default_factory=list, description="Empty: every framework")
    symptom: str
    cause: str
    fix: str
    rule_ids: list[str] = Field(default_factory=list, description="cards/rules.yaml ids that catch it")

    @model_validator(mode="after")
    def _known_frameworks(self):
        unknown = sorted(set(self.frameworks) - set(FRAMEWORKS))
        if unknown:
            raise ValueError(f"unknown frameworks {unknown}; known: {list(FRAMEWORKS)}")
        return self


class OomStep(_Sourced):
    """One rung of the out-of-memory ladder: cheapest fix first."""

    step: int = Field(ge=1)
    action: str
    saves: str = Field(description="Which memory term it shrinks, and by how much")
    costs: str = Field(description="What it costs in time or constraints")
    request_change: str = Field(description="How to try it with the tools (request fields)")


class PitfallsCard(_Card):
    description: str
    pitfalls: list[Pitfall]
    oom_ladder: list[OomStep]

    @model_validator(mode="after")
    def _unique(self):
        ids = [p.id for p in self.pitfalls]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate pitfall ids: {dupes}")
        steps = [s.step for s in self.oom_ladder]
        if steps != list(range(1, len(steps) + 1)):
            raise ValueError(f"oom_ladder steps must be numbered 1..n in order, got {steps}")
        return self


def strategies_card() -> StrategiesCard:
    return load_card("strategies", StrategiesCard)


def pitfalls_card() -> PitfallsCard:
    return load_card("pitfalls", PitfallsCard)
