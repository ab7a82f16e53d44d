"""Scoring the production rows through meshplan.api as a user would: each mapped row's fit, rule errors, peak against
the measured one in the row's own convention, and tokens/s per GPU; then the summary over the rows. The method:
bench/production_configs.py.
"""

from __future__ import annotations

import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from production_mapping import all_knobs, map_row
from production_rows import (
    DATA_NAME,
    Mapping,
    load_rows,
    peak_convention,
    peak_moment,
    read_row,
    row_text,
    stated_memory_settings,
)
from production_sources import run_attention_kernel

from meshplan import api
from meshplan.arithmetic.flops import model_flops_per_token, noncausal_flops_per_token
from meshplan.arithmetic.memory_states import memory_card
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GB, GIB
from meshplan.estimate.memory import stage_allocated
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.published_runs import tflops_causal_full
from meshplan.request.resolve import resolve
from meshplan.rules.engine import memory_rules
from meshplan.schema.request import Request


@dataclass
class Score:
    mapping: Mapping
    group: str = ""  # dense | MoE | FSDP
    rule_errors: list[str] = field(default_factory=list)  # non-memory error ids of check_config
    memory_errors: list[str] = field(default_factory=list)
    refused: str | None = None  # an estimate a rule blocks (id: message)
    peak_bytes: int | None = None
    fits: bool | None = None
    measured_peak_bytes: float | None = None
    convention: str | None = None
    moment: str | None = None  # when the measured peak was read (production_rows.peak_moment)
    compared_peak_bytes: float | None = None
    measured_tps: float | None = None
    tps_basis: str | None = None
    predicted_tps: float | None = None
    throughput_skipped: str | None = None
    over: str | None = None  # a row that does not fit: its worst stage's terms (over_note)
    timed: tuple[Any, ...] | None = None  # (job, plan, attention kernel) the tokens/s was estimated with

    def predict_tps(self, constants: dict[str, float]) -> float | None:
        """The row's tokens/s per GPU with `constants` in place of the card's (leave one source out); None where it
        was not timed."""
        if self.timed is None:
            return None
        job, plan, kernel = self.timed
        cal = calibration(job.framework).with_overrides(**constants)
        return estimate_throughput(job, plan, cal, attention_kernel=kernel).tokens_per_s_per_gpu

    @property
    def peak_error(self) -> float | None:
        if self.measured_peak_bytes is None or self.compared_peak_bytes is None:
            return None
        return self.compared_peak_bytes / self.measured_peak_bytes - 1

    @property
    def tps_error(self) -> float | None:
        if self.measured_tps is None or self.predicted_tps is None:
            return None
        return self.predicted_tps / self.measured_tps - 1


def score_row(raw: dict[str, Any], mapping: Mapping) -> Score:
    """The row's verdicts through meshplan.api; an estimate that fails for a reason other than a rule is `refused`
    with that reason, never an exception."""
    score = Score(mapping)
    if mapping.request is None:
        return score
    row = read_row(raw)[0]
    try:
        return _score(row, mapping, score)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
        score.refused = f"the estimate failed on this row ({type(exc).__name__}: {exc})"
        return score


def _score(row: dict[str, Any], mapping: Mapping, score: Score) -> Score:
    req = mapping.request
    job, plan = resolve(req)
    score.group = "MoE" if job.model.moe is not None else ("FSDP" if plan.zero_stage == 3 else "dense")
    mem_ids = memory_rules()
    try:
        report = api.check_config(req)
    except MeshplanError as exc:
        score.refused = f"check refused: {exc}"
        return score
    for f in report.findings:
        if f.severity == "error":
            (score.memory_errors if f.id in mem_ids else score.rule_errors).append(f.id)
    try:
        memory = api.estimate_memory(req)
    except MeshplanError as exc:
        score.refused = str(exc).split("\n")[0]
        return score
    score.peak_bytes = memory.peak_bytes
    score.fits = memory.fit_bytes <= mapping.capacity_bytes  # the figure meshplan's own fit takes (memory.fit_figure)
    if not score.fits:
        score.over = over_note(memory.stages[memory.peak_stage], memory.fit_bytes - mapping.capacity_bytes)
        if memory.fit_basis == "allocated":
            score.over += "; allocated peak decides (expandable segments)"
        else:  # the reserved peak decides: say where the allocated one alone stands (the reserve's share of the miss)
            allocated = max(stage_allocated(s) for s in memory.stages)
            margin = (mapping.capacity_bytes - allocated) / GIB
            score.over += (f"; reserved peak decides (no expandable segments), the allocated {allocated / GIB:.1f} GiB "
                           + (f"is {margin:.1f} GiB under" if margin >= 0 else f"is over by {-margin:.1f} GiB"))
    measured = row["outcome"]["peak_memory_gb_per_gpu"]
    if measured is not None:
        score.measured_peak_bytes = measured * GB
        score.convention = peak_convention(row, job.framework)
        score.moment = peak_moment(row, job.framework)
        score.compared_peak_bytes = compared_peak(memory, score.convention, score.moment)
    _score_throughput(row, req, job, score)
    return score


def compared_peak(memory, convention: str, moment: str) -> float:
    """meshplan's figure for a measured peak of `convention` read at `moment` (production_rows.peak_convention,
    peak_moment): not stated, the device total; reserved, less the CUDA context; allocated, the worst stage's
    allocated peak less the context, found at its own moment (memory.stage_allocated), or, read after the first
    iteration, the worst stage's first_iteration_allocated_peak (its optimizer state allocated inside that step)."""
    context = memory_card().cuda_context_bytes
    if convention == "allocated" and moment == "first_iteration":
        return float(max(s.detail.get("first_iteration_allocated_peak", stage_allocated(s))
                         for s in memory.stages)) - context
    if convention == "allocated":
        return float(max(stage_allocated(s) for s in memory.stages)) - context
    return float(memory.peak_bytes) - (context if convention == "reserved" else 0)


def over_note(stage, over: int) -> str:
    """Why a row does not fit, in the estimate's own terms: its worst stage's model states, activations and the
    rest (the caching allocator's reserve apart), and by how much it is over."""
    g = lambda n: f"{n / GIB:.1f}"  # noqa: E731
    reserve = stage.detail.get("allocator_reserve", 0)
    return (f"over by {g(over)} GiB on stage {stage.stage} ({stage.layers} layers): weights {g(stage.weights_bytes)} + "
            f"grads {g(stage.gradients_bytes)} + optimizer {g(stage.optimizer_bytes)} + activations "
            f"{g(stage.activations_bytes)} + other {g(stage.other_bytes)} (allocator reserve {g(reserve)})")


def _score_throughput(row: dict[str, Any], req: Request, job, score: Score) -> None:
    out = row["outcome"]
    if row["category"] == "rl":
        score.throughput_skipped = "RL job: the step includes the rollout"
        return
    if "not absolute throughput" in row_text(row["flags"]["caveats"]).lower():
        score.throughput_skipped = "the source says: not absolute throughput"
        return
    if out["tokens_per_sec_per_gpu"] is not None:
        score.measured_tps, score.tps_basis = float(out["tokens_per_sec_per_gpu"]), "tokens/s"
    elif out["tflops_per_gpu"] is not None:
        # the run's TFLOP/s divided by its own release's formula: before its family halved the causal core, every
        # layer's core at all s keys and no MTP (published_runs.tflops_causal_full; flops.noncausal_flops_per_token)
        full = tflops_causal_full(row["framework"], row["source"].get("version_or_date"))
        per_token = (noncausal_flops_per_token if full else model_flops_per_token)(job.model, job.seq_length)
        score.measured_tps = float(out["tflops_per_gpu"]) * 1e12 / per_token
        score.tps_basis = "TFLOP/s (causal counted full)" if full else "TFLOP/s"
    else:
        score.throughput_skipped = "no throughput measured"
        return
    try:
        if kernel := run_attention_kernel(row):  # the run's own kernel, not the card's (RUN_ATTENTION_KERNELS)
            score.predicted_tps = estimate_throughput(*resolve(req), attention_kernel=kernel).tokens_per_s_per_gpu
        else:
            score.predicted_tps = api.estimate_throughput(req).tokens_per_s_per_gpu
        score.timed = (*resolve(req), kernel)
    except MeshplanError as exc:
        score.throughput_skipped = f"estimate refused: {str(exc).splitlines()[0]}"


# --------------------------------------------------------------------------- summary


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class Verdicts:
    """Fit verdicts of a set of rows: fits + does not fit + refused (a rule error blocks the estimate) = rows."""

    rows: int = 0
    fit: int = 0
    not_fit: int = 0
    refused: int = 0

    def add(self, score: Score) -> None:
        self.rows += 1
        if score.fits is None:
            self.refused += 1
        elif score.fits:
            self.fit += 1
        else:
            self.not_fit += 1


@dataclass
class Errors:
    """Median |error| over the rows that have one."""

    values: list[float] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float | None:
        return median([abs(v) for v in self.values])

    @property
    def signed(self) -> float | None:
        """Median signed error: a bias (a whole group predicted too slow or too fast) the |error| hides."""
        return median(self.values)


@dataclass
class Summary:
    total: int
    mapped: int
    exact: int  # mapped with every stated setting
    unmapped: dict[str, str]  # row id -> why
    stated: int  # rows with stated memory settings, mapped or not
    # "all", "exact" (every memory setting expressible), "nearest"; "ran": the rows of "all" that are evidence of a
    # run (production_rows.ran), without the recipes that publish no measurement
    fit: dict[str, Verdicts]
    rule_error_rows: dict[str, int]  # "all", "exact"
    rule_error_ids: dict[str, int]  # id -> rows
    memory_error_rows: int
    peaks: dict[str, Errors]  # "all", "exact"
    measured_peaks: int  # rows with a measured peak, mapped or not
    throughput: dict[str, Errors]  # "all", "dense", "MoE", "FSDP", "exact"
    throughput_skipped: dict[str, str]
    knob_rows: dict[str, int]  # knob -> rows that use it (mapped or not)
    knob_rows_mapped: dict[str, int]
    recommendations: list[str] = field(default_factory=list)  # stated, mapped rows in "all" but not in "ran"
    # mapped rows per reading of their inter_node text (production_rows.network_for): NETWORK_READ, or why the GPU
    # card's network stayed
    network_reads: dict[str, int] = field(default_factory=dict)


def summarise(rows: list[dict[str, Any]], scores: list[Score]) -> Summary:
    mapped = [s for s in scores if s.mapping.request is not None]
    fit = {"all": Verdicts(), "exact": Verdicts(), "nearest": Verdicts(), "ran": Verdicts()}
    peaks = {"all": Errors(), "exact": Errors()}
    tps = {k: Errors() for k in ("all", "dense", "MoE", "FSDP", "exact")}
    ids: Counter[str] = Counter()
    for s in mapped:
        m = s.mapping
        if m.stated_memory:
            fit["all"].add(s)
            fit["exact" if m.exact_for("memory") else "nearest"].add(s)
            if m.ran:
                fit["ran"].add(s)
        if s.peak_error is not None:
            peaks["all"].values.append(s.peak_error)
            if m.exact_for("memory"):
                peaks["exact"].values.append(s.peak_error)
        if s.tps_error is not None:
            for key in ("all", s.group) + (("exact",) if m.exact_for("time") else ()):
                tps[key].values.append(s.tps_error)
        ids.update(set(s.rule_errors))
    knob_rows: Counter[str] = Counter()
    knob_rows_mapped: Counter[str] = Counter()
    for row, s in zip(rows, scores, strict=True):
        if s.mapping.request is not None:
            knob_rows.update(list(s.mapping.knobs))
            knob_rows_mapped.update(list(s.mapping.knobs))
        else:
            knob_rows.update(list(all_knobs(row)))
    return Summary(
        total=len(rows), mapped=len(mapped), exact=sum(s.mapping.exact for s in mapped),
        unmapped={s.mapping.row_id: str(s.mapping.unmapped) for s in scores if s.mapping.request is None},
        stated=sum(stated_memory_settings(read_row(r)[0]) for r in rows), fit=fit,
        rule_error_rows={"all": sum(bool(s.rule_errors) for s in mapped),
                         "exact": sum(bool(s.rule_errors) and s.mapping.exact for s in mapped)},
        rule_error_ids=dict(ids.most_common()),
        memory_error_rows=sum(bool(s.memory_errors) for s in mapped),
        peaks=peaks, measured_peaks=sum(read_row(r)[0]["outcome"]["peak_memory_gb_per_gpu"] is not None for r in rows),
        throughput=tps,
        throughput_skipped={s.mapping.row_id: s.throughput_skipped for s in mapped if s.throughput_skipped},
        knob_rows=dict(knob_rows.most_common()), knob_rows_mapped=dict(knob_rows_mapped),
        recommendations=[s.mapping.row_id for s in mapped if s.mapping.stated_memory and not s.mapping.ran],
        network_reads=dict(Counter(s.mapping.network for s in mapped).most_common()),
    )

def run(validation: Path) -> tuple[list[dict[str, Any]], list[Score], Summary]:
    rows = load_rows(validation / DATA_NAME)
    with tempfile.TemporaryDirectory(prefix="meshplan-prodcfg-") as tmp:
        scores = [score_row(row, map_row(row, Path(tmp))) for row in rows]
    return rows, scores, summarise(rows, scores)
