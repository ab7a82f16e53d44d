"""Does meshplan order measured A/B comparisons the way they measured? (issue 15 item 7)

Data: ../shared/validation/pairwise_comparisons_dev.yaml: measured comparisons between configurations of
production_configs_dev.yaml (which layout won, by how much, how controlled the comparison was). Each comparison
lists its configurations as text lines ("label: value, value") and the production rows it links.

Method (nothing fitted, no per-pair constants, no table per comparison: every comparison of any file of this schema
is read by the same rules):
- Sides: each value of each config line (an "A vs B" line: one side per value, the words before each value added to
  the line's label; a half without words takes those of the line above). A side is built from the linked production
  row its label agrees with most (label_settings: layout degrees TP/PP/VP/CP/EP/DP/FSDP, length "16K", GPU count
  "(512 GPUs)" / "32K/32" / "8 GPUs" / a bare number, a GPU name, a precision, Megatron recompute modules "moe_act",
  "mla_up_proj+mlp", a switch "overlap on" and the knob the label or title names), with the settings the label states
  applied: dp re-derived when the layout or GPU count changes and the label leaves dp out, the global batch scaled to
  keep the row's tokens per step, a GPU outside the catalog taking its memory from the file's rows on it. The edited
  row is mapped by bench/production_configs.py's own map_row, so a side is the Request a user would pass, with the
  same knobs counted as that script counts them. A label that only takes a degree away ("no-CP": the source does
  not give the layout) is meshplan's own best layout with that degree fixed to 1 (api.recommend).
- What each value measures: the unit beside it ("ms" time, "GB" memory, "TFLOP/s" / "MFU" throughput), else the
  metric's part at that position; a metric that is a feasibility or a recommendation has no measured pair, and its
  linked rows' fit is checked instead.
- Pairs: an "A vs B" line's two values; else, per value position, each side against the reference of its GPU (a
  comparison across GPUs measures the GPU): the side that is a linked row as that row states it, else the first.
- Measured values are read from the config lines (the numbers after the colon; "+x%" relative to the reference
  line; "OOM").
- Predicted: model TFLOP/s per GPU (api.estimate_throughput: model FLOPs per step / step time / GPUs; same model
  and length on both sides makes this the tokens/s ratio, across lengths it is the metric the source reports),
  the step time for step-time pairs, api.estimate_memory's peak for memory pairs.
- Scored: ordered right = meshplan puts the measured winner ahead, over the pairs measured more than 5% apart;
  ratio error = predicted ratio / measured ratio - 1, the ratio oriented winner / loser (negative: meshplan
  understates the winner's margin). Why a pair is wrong: the step-time term (per model FLOP) that charges the
  measured winner most over the loser.
- Counted apart, never dropped: pairs whose sides meshplan maps to the same request (the knob that differs is one
  meshplan lacks: named), pairs with a side that does not map (the reason production_configs gives), and pairs
  scored with the nearest expressible settings (a side carries a knob of production_rows.KNOBS that changes
  the metric: named). Feasibility comparisons (a layout that ran vs "OOM") are checked as fit verdicts.

--json: {"apart", "ordered_right"} of the throughput pairs scored with every setting expressed, in sample and out
of sample (every pair under the fitted constants of bench/fitted_constants.py fitted without its rows' source).

Run: python bench/pairwise_comparisons.py [--rows] [--json] [--validation DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fitted_constants
import production_mapping as pmap  # bench scripts are not a package
import production_rows as prow
from pairwise_sides import (  # the label and value readers
    Side,
    _as_stated,
    label_settings,
    measured_value,
    measures,
    sides_of,
)

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

os.environ["MESHPLAN_CALIBRATION_FILE"] = ""  # the model's own numbers: a stored cluster factor never enters

DATA_NAME = "pairwise_comparisons_dev.yaml"
APART = 0.05  # pairs measured more than this apart are ordered (the threshold)
OFF = 0.20  # a pair ordered right but with a ratio error beyond this also says which term
TERMS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "dp_comm_s", "pp_comm_s", "bubble_s", "recompute_s",
         "other_s", "offload_s")


# --------------------------------------------------------------------------- building a side


def _gpu_memory(word: str, rows: dict[str, dict[str, Any]]) -> float | None:
    """The memory (GB, as the rows record it) of a GPU a label names: the catalog's, else a row of the file on it."""
    try:
        return round(get_gpu(word).memory_bytes / GIB)
    except MeshplanError:
        pass
    return next((r["hardware"]["gpu_memory_gb"] for r in rows.values()
                 if str(r["hardware"]["gpu_type"]).lower().startswith(word.lower())), None)


def _edit(row: dict[str, Any], stated: dict[str, Any], rows: dict[str, dict[str, Any]]) -> list[str]:
    """The row with the settings a label states: layout degrees, length (the global batch scaled to keep the row's
    tokens per step, as the sources scale it), GPU count, GPU, recompute; dp re-derived where the layout or GPU count
    changed and the label leaves dp out. Notes on what was derived."""
    p, w, hw, notes = row["parallelism"], row["workload"], row["hardware"], []
    before = (p["tp"], p["pp"], p["cp"], hw["num_gpus"])
    for key in ("tp", "pp", "vpp", "cp", "ep", "dp"):
        if key in stated:
            p[key] = stated[key]
    if "num_gpus" in stated:
        hw["num_gpus"] = stated["num_gpus"]
    if "seq_length" in stated and stated["seq_length"] != w["seq_length"] and w["seq_length"]:
        tokens = w["seq_length"] * (w["global_batch_size"] or 1)
        w["seq_length"] = stated["seq_length"]
        w["global_batch_size"] = max(1, tokens // w["seq_length"])
        w["tokens_per_step"] = w["seq_length"] * w["global_batch_size"]
        notes.append(f"global batch {w['global_batch_size']} (tokens per step kept)")
    if "gpu" in stated and not str(hw["gpu_type"]).lower().startswith(stated["gpu"].lower()):
        hw["gpu_type"], hw["gpu_memory_gb"] = stated["gpu"], _gpu_memory(stated["gpu"], rows)
    if "recompute" in stated:
        row["memory"]["recompute"] = stated["recompute"]
    if "dp" not in stated and (p["tp"], p["pp"], p["cp"], hw["num_gpus"]) != before and hw["num_gpus"]:
        p["dp"] = hw["num_gpus"] // ((p["tp"] or 1) * (p["pp"] or 1) * (p["cp"] or 1))
    return notes


@dataclass
class Built:
    """A side as a Request (or why not), with what it could not say."""

    request: Request | None = None
    unmapped: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    capacity_bytes: int | None = None


def build_side(side: Side, row: dict[str, Any] | None, workdir: Path, rows: dict[str, dict[str, Any]] | None = None,
               title: str = "") -> Built:
    """The side's Request: its linked row with the settings its label states, mapped by production_mapping.map_row;
    a switch the label turns on or off (the knob it names) set on the request; the best layout without a degree the
    label takes away."""
    if row is None:
        return Built(unmapped="the comparison links no row of the file")
    stated = label_settings(side.label, title)
    row = prow.read_row(row)[0]
    notes = _edit(row, stated, rows or {})
    if row["hardware"]["gpu_memory_gb"] is None:
        return Built(unmapped=f"GPU {stated.get('gpu')} named by the label: not in the catalog nor in any row")
    row["id"] = f"{row['id']}--{side.line}-{side.pick}"
    m = pmap.map_row(row, workdir)
    if m.request is None:
        return Built(unmapped=m.unmapped)
    request = m.request
    if "switch" in stated:
        knob, on = stated["switch"]
        if knob is None:
            return Built(unmapped=f"the switch {side.label!r} names no knob meshplan has")
        request = request.model_copy(update={knob: on})
    built = Built(request, None, dict(m.knobs), m.notes + notes, m.capacity_bytes)
    if side.best_without:
        return _best_without(built, side.best_without)
    return built


OPEN_FIELDS = ("tp", "pp", "vpp", "cp", "dp", "micro_batch_size", "recompute", "sequence_parallel",
               "first_stage_layers", "last_stage_layers", "pipeline_layout")


def _best_without(built: Built, degree: str) -> Built:
    """meshplan's best layout with `degree` 1, the rest of the layout open (the source does not give it)."""
    req = built.request.model_copy(update={**{f: None for f in OPEN_FIELDS}, degree: 1})
    rec = api.recommend(req, top_k=1)
    if not rec.candidates:
        return Built(unmapped=f"meshplan finds no layout with {degree}=1 that fits", knobs=built.knobs)
    plan = rec.candidates[0].plan
    fixed = {f: getattr(plan, f) for f in ("tp", "pp", "vpp", "cp", "dp", "micro_batch_size", "recompute",
                                          "sequence_parallel")}
    layout = " ".join(f"{k}={v}" for k, v in fixed.items())
    notes = [*built.notes, f"{degree}=1 side: meshplan's best layout ({layout})"]
    return Built(req.model_copy(update=fixed), None, built.knobs, notes, built.capacity_bytes)


# --------------------------------------------------------------------------- estimating and scoring


@dataclass
class Estimate:
    tflops: float | None = None  # model TFLOP/s per GPU
    step_s: float | None = None
    per_flop: dict[str, float] = field(default_factory=dict)  # step-time terms per model FLOP per GPU
    peak_bytes: int | None = None
    fits: bool | None = None
    refused: str | None = None


def estimate(built: Built, constants: dict[str, float] | None = None) -> Estimate:
    """The side's throughput and memory through meshplan.api; with `constants`, the step time under those fitted
    constants instead of the card's (leave one source out)."""
    out = Estimate()
    try:
        if constants:
            job, plan = resolve(built.request)
            tp = estimate_throughput(job, plan, calibration(job.framework).with_overrides(
                **fitted_constants.applicable(job.framework, constants)))
        else:
            tp = api.estimate_throughput(built.request)
        flops = tp.model_flops_per_step / built.request.num_gpus
        out.step_s, out.tflops = tp.step_time_s, flops / tp.step_time_s / 1e12
        out.per_flop = {t: getattr(tp.breakdown, t) / flops for t in TERMS}
        mem = api.estimate_memory(built.request)
        out.peak_bytes, out.fits = mem.peak_bytes, mem.peak_bytes <= built.capacity_bytes
    except MeshplanError as exc:
        out.refused = str(exc).splitlines()[0]
    return out


@dataclass
class PairScore:
    comparison: str
    a: str  # "label" of each side
    b: str
    about: str  # throughput | time | memory | fits
    status: str = "scored"  # scored | nearest | not expressible
    why_apart: str = ""  # the knob or reason (nearest, not expressible)
    measured: float | None = None  # ratio, oriented measured winner / loser (>= 1)
    predicted: float | None = None  # the same orientation
    winner: str = ""
    fits_right: bool | None = None  # fits pairs: both verdicts right
    driver: str = ""  # why meshplan orders it wrong (the term)
    notes: list[str] = field(default_factory=list)
    searched: bool = False  # a side is meshplan's best layout (the source does not give it)

    @property
    def apart(self) -> bool:
        return self.measured is not None and self.measured > 1 + APART

    @property
    def right(self) -> bool | None:
        if self.about == "fits":
            return self.fits_right
        if self.predicted is None or not self.apart:
            return None
        return self.predicted > 1

    @property
    def ratio_error(self) -> float | None:
        if self.predicted is None or self.measured is None:
            return None
        return self.predicted / self.measured - 1


def _ratio(about: str, x: float, y: float) -> float:
    """How much better x is than y (throughput: x/y; time and memory: lower is better, y/x)."""
    return x / y if about == "throughput" else y / x


def _driver(win: Estimate, lose: Estimate, charge_winner: bool) -> str:
    """The step-time term (per model FLOP, as a share of the loser's step) that charges the measured winner most
    over the loser (a pair ordered wrong, or a winner's margin understated), or the loser most over the winner (a
    margin overstated); every term that moves by more than 0.1% follows."""
    sign = 1 if charge_winner else -1
    total = sum(lose.per_flop.values())
    diff = {t[:-2]: (win.per_flop[t] - lose.per_flop[t]) / total for t in TERMS}
    term = max(diff, key=lambda t: sign * diff[t])
    moved = ", ".join(f"{t} {d:+.1%}" for t, d in diff.items() if abs(d) > 0.001)
    if not moved:
        return "meshplan predicts a tie: no step-time term differs by 0.1% of the step between the sides"
    whom = "winner" if charge_winner else "loser"
    return f"{term} charges the measured {whom} {sign * diff[term]:+.1%} more (winner - loser: {moved})"


def score_pair(cid: str, about: str, configs: list[str], sides: tuple[Side, Side], built: tuple[Built, Built],
               est: tuple[Estimate | None, Estimate | None]) -> PairScore:
    sa, sb = sides
    va, vb = measured_value(configs, sa, sa), measured_value(configs, sb, sa)
    la, lb = sa.label, sb.label
    if sa.best_without:
        la += f" ({sa.best_without}=1)"
    if sb.best_without:
        lb += f" ({sb.best_without}=1)"
    if "OOM" in (va, vb):
        about = "fits"
    out = PairScore(cid, la, lb, about, searched=bool(sa.best_without or sb.best_without))
    ba, bb = built
    for b in (ba, bb):
        out.notes += [n for n in b.notes if n not in out.notes]
    if about != "fits":
        ra = _ratio(about, float(va), float(vb))
        out.measured, out.winner = max(ra, 1 / ra), (la if ra >= 1 else lb)
    unmapped = [b.unmapped for b in (ba, bb) if b.request is None]
    if unmapped:
        out.status, out.why_apart = "not expressible", f"does not map: {unmapped[0]}"
        return out
    if ba.request == bb.request:
        out.status = "not expressible"
        out.why_apart = "a setting meshplan lacks: both sides are the same request"
        return out
    effect = "memory" if about in ("memory", "fits") else "time"
    knobs = sorted({k for b in (ba, bb) for k in b.knobs if effect in prow.KNOBS[k][0]})
    if knobs:
        out.status, out.why_apart = "nearest", ", ".join(knobs)
    ea, eb = est
    if ea.refused or eb.refused:
        out.status, out.why_apart = "not expressible", f"estimate refused: {ea.refused or eb.refused}"
        return out
    if about == "fits":
        out.fits_right = ea.fits == (va != "OOM") and eb.fits == (vb != "OOM")
        return out
    pa, pb = {"throughput": (ea.tflops, eb.tflops), "time": (ea.step_s, eb.step_s),
              "memory": (ea.peak_bytes, eb.peak_bytes)}[about]
    pred = _ratio(about, float(pa), float(pb))
    a_wins = _ratio(about, float(va), float(vb)) >= 1
    out.predicted = pred if a_wins else 1 / pred
    error = out.ratio_error
    if about != "memory" and (out.right is False or abs(error) > OFF):
        win, lose = (ea, eb) if a_wins else (eb, ea)
        out.driver = _driver(win, lose, charge_winner=out.right is False or error < 0)
    return out


def pairs_of(c: dict[str, Any], sides: list[Side], built: list[Built], own: dict[str, Request | None],
             rows: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, int, int]]:
    """(what it measures, side index, side index) of each pair, the reference first: on an "A vs B" line its two
    values; else, per value position, each side against the reference of its GPU (a comparison across GPUs measures
    the GPU): the side that is a linked row as the row states it (the same request), else the first."""
    kinds = measures(c)
    out: list[tuple[str, int, int]] = []
    by_line: dict[int, list[int]] = {}
    for i, s in enumerate(sides):
        by_line.setdefault(s.line, []).append(i)
    vs_lines = {ln for ln, idx in by_line.items() if len(idx) > 1 and re.search(r"\svs\.?\s", c["configs"][ln])}
    for ln in sorted(vs_lines):
        a, b = by_line[ln][:2]
        out.append((kinds[0] if kinds else "throughput", a, b))
    for pos, kind in enumerate(kinds):
        group: dict[str, list[int]] = {}
        for i, s in enumerate(sides):
            if s.line in vs_lines or s.pick != pos:
                continue
            row = (rows or {}).get(s.entry or "") or {"hardware": {}}
            gpu = label_settings(s.label).get("gpu") or str(row["hardware"].get("gpu_type")).split("-")[0]
            group.setdefault(gpu.lower(), []).append(i)
        for idx in group.values():
            ref = next((i for i in idx if built[i].request is not None and built[i].request in own.values()),
                       next((i for i in idx if _as_stated(sides[i], rows or {})), idx[0]))
            out += [(kind or "throughput", ref, i) for i in idx if i != ref]
    return out


@dataclass
class Result:
    pairs: list[PairScore]
    feasibility: list[tuple[str, str, bool | None, str]]  # (comparison, row, predicted to fit, why not known)
    not_measured: dict[str, str]
    out_of_sample: list[PairScore] = field(default_factory=list)  # the pairs under constants fitted without them
    constants: dict[str, dict[str, float]] = field(default_factory=dict)  # comparison -> the constants it was under


def _own(c: dict[str, Any], rows: dict[str, dict[str, Any]], tmp: Path) -> dict[str, Request | None]:
    return {e: pmap.map_row(rows[e], tmp).request for e in c.get("entry_ids") or [] if e in rows}


def run(validation: Path, held: dict[str, dict[str, float]] | None = None) -> Result:
    """Every comparison of the file scored from its rows' own fields; with `held` ({source: the fitted constants
    fitted without it}), each pair also under the constants fitted without its linked rows' source."""
    comparisons = yaml.safe_load((validation / DATA_NAME).read_text(encoding="utf-8")) or []
    rows = {r["id"]: r for r in prow.load_rows(validation / prow.DATA_NAME) if isinstance(r, dict) and "id" in r}
    result = Result([], [], {})
    with tempfile.TemporaryDirectory(prefix="meshplan-pairwise-") as tmp:
        for c in comparisons:
            if not measures(c):
                result.not_measured[c["id"]] = f"the metric ({c.get('metric')}) is no measured value: the linked " \
                                               "rows' fit is checked instead"
                for e in c.get("entry_ids") or []:
                    m = pmap.map_row(rows[e], Path(tmp)) if e in rows else None
                    fits = None if m is None or m.request is None else estimate(
                        Built(m.request, None, m.knobs, [], m.capacity_bytes)).fits
                    why = "not a row of the file" if m is None else (m.unmapped or ", ".join(m.knobs))
                    result.feasibility.append((c["id"], e, fits, why))
                continue
            try:
                _score_comparison(c, rows, Path(tmp), result, held)
            except (ValueError, KeyError, TypeError, IndexError) as exc:  # a line the readers cannot take: its reason
                result.not_measured[c["id"]] = f"its configs cannot be read as sides ({type(exc).__name__}: {exc})"
    return result


def _score_comparison(c: dict[str, Any], rows: dict[str, dict[str, Any]], tmp: Path, result: Result,
                      held: dict[str, dict[str, float]] | None) -> None:
    sides = sides_of(c, rows)
    title = str(c.get("title") or "")
    built = [build_side(s, rows.get(s.entry or ""), tmp, rows, title) for s in sides]
    own = _own(c, rows, tmp)
    pairs = pairs_of(c, sides, built, own, rows)
    est = [estimate(b) if b.request is not None else None for b in built]
    for kind, i, j in pairs:
        result.pairs.append(score_pair(c["id"], kind, c["configs"], (sides[i], sides[j]), (built[i], built[j]),
                                       (est[i], est[j])))
    if held is None:
        return
    sources = {prow.source_key(rows[e]) for e in own}
    constants = next((held[s] for s in sorted(sources) if s in held), None)
    if constants:
        result.constants[c["id"]] = constants
        est = [estimate(b, constants) if b.request is not None else None for b in built]
    for kind, i, j in pairs:
        result.out_of_sample.append(score_pair(c["id"], kind, c["configs"], (sides[i], sides[j]),
                                               (built[i], built[j]), (est[i], est[j])))


# --------------------------------------------------------------------------- summary and report


@dataclass
class Tally:
    pairs: int = 0
    apart: int = 0
    right: int = 0
    errors: list[float] = field(default_factory=list)

    def add(self, p: PairScore) -> None:
        self.pairs += 1
        if p.right is not None:
            self.apart += 1
            self.right += p.right
        if p.ratio_error is not None:
            self.errors.append(p.ratio_error)

    def text(self) -> str:
        share = f"{self.right / self.apart:.0%}" if self.apart else "-"
        med = (f"median {statistics.median(self.errors):+.1%}, median |.| "
               f"{statistics.median(map(abs, self.errors)):.1%}") if self.errors else "-"
        return (f"{self.pairs} pairs; ordered right {self.right} of {self.apart} more than 5% apart ({share}); "
                f"ratio error {med}")


def summarise(result: Result) -> dict[str, Tally]:
    tallies = {k: Tally() for k in ("throughput scored", "throughput scored, sides given", "throughput scored+nearest",
                                    "memory scored+nearest", "fits")}
    for p in result.pairs:
        if p.status == "not expressible":
            continue
        if p.about in ("throughput", "time"):
            if p.status == "scored":
                tallies["throughput scored"].add(p)
                if not p.searched:
                    tallies["throughput scored, sides given"].add(p)
            tallies["throughput scored+nearest"].add(p)
        else:
            tallies["memory scored+nearest" if p.about == "memory" else "fits"].add(p)
    return tallies


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if pct else f"{x:.3f}"


def print_rows(result: Result) -> None:
    print(f"{'comparison':27s} {'A vs B':44s} {'about':10s} {'meas':>6s} {'pred':>6s} {'error':>7s} ok  status")
    for p in result.pairs:
        ok = {True: "yes", False: "NO", None: "-"}[p.right]
        pair = f"{p.a} vs {p.b}"[:44]
        line = (f"{p.comparison:27s} {pair:44s} {p.about:10s} {_fmt(p.measured):>6s} {_fmt(p.predicted):>6s} "
                f"{_fmt(p.ratio_error, True):>7s} {ok:3s} {p.status}")
        if p.why_apart:
            line += f" ({p.why_apart[:110]})"
        print(line)
        if p.winner:
            print(f"{'':28s}measured winner: {p.winner}")
        if p.driver:
            print(f"{'':28s}{'wrong' if p.right is False else 'off'}: {p.driver}")
        for n in p.notes:
            print(f"{'':28s}note: {n[:150]}")
    for cid, row, fits, why in result.feasibility:
        print(f"{cid:27s} {row:44s} fits       predicted {'fits' if fits else 'not to fit' if fits is False else '-'}"
              f" (it ran){' | ' + why if why else ''}")


def print_summary(result: Result) -> None:
    tallies = summarise(result)
    status = {s: sum(p.status == s for p in result.pairs) for s in ("scored", "nearest", "not expressible")}
    print(f"pairs {len(result.pairs)}: scored {status['scored']}, scored with the nearest expressible settings "
          f"{status['nearest']}, not expressible {status['not expressible']}")
    for name, t in tallies.items():
        print(f"  {name:26s} {t.text()}")
    for p in result.pairs:
        if p.right is False:
            print(f"  wrong: {p.comparison} {p.a} vs {p.b}: {p.driver or 'fit verdicts'}")
    apart: dict[str, int] = {}
    for p in result.pairs:
        if p.status == "not expressible":
            apart[p.why_apart] = apart.get(p.why_apart, 0) + 1
    for why, n in apart.items():
        print(f"  not expressible ({n}): {why}")
    for cid, why in result.not_measured.items():
        fits = [f for c, _, f, _ in result.feasibility if c == cid]
        print(f"  not a measured pair: {cid}: {why}: {sum(f is True for f in fits)} of {len(fits)} predicted to fit")


def headline(pairs: list[PairScore]) -> dict[str, int]:
    """The pairs --json reports: the throughput pairs scored with every setting expressed, measured more than 5%
    apart, and how many of them meshplan orders right."""
    t = Tally()
    for p in pairs:
        if p.status == "scored" and p.about in ("throughput", "time"):
            t.add(p)
    return {"apart": t.apart, "ordered_right": t.right}


def json_report(validation: Path) -> dict[str, Any]:
    """{"apart", "ordered_right"} in sample, and out of sample: every pair under the fitted constants
    (bench/fitted_constants.py: gemm_peak_fraction, the MoE constants, the eager pass count) fitted without its rows'
    source."""
    rows = prow.load_rows(validation / prow.DATA_NAME)
    held = fitted_constants.held_out(validation, {prow.source_key(r) for r in rows if isinstance(r, dict)})
    result = run(validation, held)
    return {**headline(result.pairs), "pairs": len(result.pairs),
            "out_of_sample": {**headline(result.out_of_sample), "constants_by_comparison": result.constants}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=prow.DEFAULT_VALIDATION)
    parser.add_argument("--rows", action="store_true", help="print every pair")
    parser.add_argument("--json", action="store_true", help="the figures in and out of sample, as JSON")
    args = parser.parse_args()
    if args.json:
        print(json.dumps(json_report(args.validation), indent=1))
        return 0
    result = run(args.validation)
    if args.rows:
        print_rows(result)
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
