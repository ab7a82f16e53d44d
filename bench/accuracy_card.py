"""Regenerate cards/accuracy.yaml: the error meshplan measured in each regime, from the bench scripts themselves.

Every measured run the bench scores is taken from the script that scores it, by import, with the script's own
cases and comparison:
- bench/throughput_accuracy.py: the playbook nanotron sweep (all `ok` rows), the classic tables and the two
  Megatron golden 7B runs (tokens/s per GPU);
- bench/bridge_published.py: Megatron-Bridge's published runs (tokens/s per GPU);
- bench/production_configs.py: the measured rows of production_configs_dev.yaml (tokens/s per GPU and peaks);
- bench/memory_accuracy.py: the playbook sweep's first-stage peaks and the Megatron functional tests' last-stage
  peaks (the same quantities and conventions that script compares);
- bench/rl_jobs.py: verl's RL runs (step seconds; the DeepSeek-V3 peak).
Each run is classified with meshplan.estimate.accuracy.regime_name and terms (the same functions every report uses), and
per regime the card gets the median |error|, the median signed error (bias; > 0 = meshplan predicts too high),
the run count and the scripts and sets they came from; per term, how many measured runs exercise it. Regimes
meshplan has words for but no run measured are listed with runs 0 and the reason. Nothing is fitted or typed.
Each source's pooled figure is checked against the figure its own script prints, so the card cannot drift from
bench/README.md silently.

Run: python bench/accuracy_card.py [--validation DIR] [--check]   (--check: compare with the card, write nothing)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bridge_published
import memory_accuracy
import production_mapping
import production_rows
import production_scoring
import rl_jobs
import throughput_accuracy

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.accuracy import LABELS, Kind, regime_label, regime_name, terms
from meshplan.estimate.memory import stage_allocated
from meshplan.request.resolve import resolve
from meshplan.schema.plan import Job, Plan

os.environ["MESHPLAN_CALIBRATION_FILE"] = ""  # the model's own numbers: a stored cluster factor never enters

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "cards" / "accuracy.yaml"
GIB = 1 << 30
GB = 10**9


@dataclass
class Run:
    kind: Kind
    script: str
    set: str
    job: Job
    plan: Plan
    error: float  # predicted / measured - 1


def _close(a: float, b: float, what: str) -> None:
    if abs(a - b) > 1e-6:
        raise SystemExit(f"{what}: pooled here {a:.6f}, the script says {b:.6f}: the two have drifted apart")


def throughput_runs(validation: Path) -> list[Run]:
    out: list[Run] = []
    ta = "bench/throughput_accuracy.py"
    for cases, name in ((throughput_accuracy.sweep_cases(validation), "playbook nanotron sweep, ok rows"),
                        (throughput_accuracy.classic_cases() + throughput_accuracy.golden_cases(validation),
                         "classic tables + Megatron golden 7B")):
        preds = throughput_accuracy.predict(cases, None)
        runs = [Run("throughput", ta, name, c.job, c.plan, p / c.measured_tps - 1)
                for c, p in zip(cases, preds, strict=True) if p == p]
        summary = throughput_accuracy.summarize(cases, preds)
        _close(statistics.median(abs(r.error) for r in runs), summary["median_abs_err"], name)
        out += runs
    bridge, _ = bridge_published.megatron_rows()
    preds = throughput_accuracy.predict(bridge, None)
    out += [Run("throughput", "bench/bridge_published.py", "Megatron-Bridge published runs", c.job, c.plan,
                p / c.measured_tps - 1) for c, p in zip(bridge, preds, strict=True) if p == p]
    return out


def production_runs(validation: Path) -> list[Run]:
    # production_scoring.run, keeping its temporary folder (a row's config.json) while the rows are classified
    rows = production_rows.load_rows(validation / production_rows.DATA_NAME)
    out: list[Run] = []
    name = "production_configs_dev.yaml measured rows"
    with tempfile.TemporaryDirectory(prefix="meshplan-accuracy-") as tmp:
        scores = [production_scoring.score_row(row, production_mapping.map_row(row, Path(tmp))) for row in rows]
        for s in scores:
            if s.mapping.request is None:
                continue
            job, plan = resolve(s.mapping.request)
            if s.tps_error is not None:
                out.append(Run("throughput", "bench/production_configs.py", name, job, plan, s.tps_error))
            if s.peak_error is not None:
                out.append(Run("memory", "bench/production_configs.py", name, job, plan, s.peak_error))
    summary = production_scoring.summarise(rows, scores)
    tps = [abs(r.error) for r in out if r.kind == "throughput"]
    _close(statistics.median(tps), summary.throughput["all"].median, "production tokens/s")
    peaks = [abs(r.error) for r in out if r.kind == "memory"]
    _close(statistics.median(peaks), summary.peaks["all"].median, "production peaks")
    return out


class _Recorder:
    """meshplan.api as bench/rl_jobs.py calls it, keeping each request and report so each run can be classified."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, object]] = []

    def estimate_memory(self, req):
        report = api.estimate_memory(req)
        self.calls.append(("memory", req, report))
        return report

    def estimate_throughput(self, req):
        report = api.estimate_throughput(req)
        self.calls.append(("throughput", req, report))
        return report


def rl_runs(validation: Path) -> list[Run]:
    recorder = _Recorder()
    real, rl_jobs.api = rl_jobs.api, recorder
    try:
        res = rl_jobs.run(validation)
    finally:
        rl_jobs.api = real
    name, script = "verl RL runs (production_configs_dev.yaml, verl one_step_off.md)", "bench/rl_jobs.py"
    out: list[Run] = []
    # each measured step: the recorded throughput call whose rounded step is the one rl_jobs reports for it
    scored = [d for d in res["rows"].values() if "not_scored" not in d]
    measured = [(d["step_s"], d["step_measured_s"]) for d in scored if d["step_measured_s"]]
    measured += [(p["step_s"], p["step_measured_s"]) for p in res["one_step_off"].values() if isinstance(p, dict)]
    for step_s, meas in measured:
        call = next(c for c in recorder.calls if c[0] == "throughput" and round(c[2].step_time_s) == step_s)
        job, plan = resolve(call[1])
        # as throughput (steps per second), like every other throughput run: > 0 = predicted too fast
        out.append(Run("throughput", script, name, job, plan, meas / call[2].step_time_s - 1))
    for d in (d for d in scored if d["peak_measured_gb"]):
        call = next(c for c in recorder.calls if c[0] == "memory" and round(c[2].peak_bytes / GB, 1) == d["peak_gb"])
        job, plan = resolve(call[1])
        out.append(Run("memory", script, name, job, plan, call[2].peak_bytes / (d["peak_measured_gb"] * GB) - 1))
    return out


def memory_runs(validation: Path) -> list[Run]:
    """The two sets bench/memory_accuracy.py scores, compared as it compares them: its run() gives the check, over
    the same estimates (each computed once, here), so what is checked is the two scorings (the rows kept, the stage
    read, the measured column, the error), not estimate_memory against itself."""
    context = memory_card().cuda_context_bytes
    script = "bench/memory_accuracy.py"
    out: list[Run] = []
    playbook = "playbook nanotron sweep, first stage, ok rows"
    playbook_estimates = list(memory_accuracy.playbook_estimates(validation))
    for row, job, plan, report in playbook_estimates:
        if row["status"] != "ok" or report is None:
            continue
        measured = float(row["gpu_memory_GB_reported"]) * GIB
        predicted = report.stages[0].total_bytes - context
        out.append(Run("memory", script, playbook, job, plan, predicted / measured - 1))
    megatron = "Megatron-LM functional tests, last stage"
    megatron_estimates = list(memory_accuracy.megatron_estimates(validation))
    for row, job, plan, report in megatron_estimates:
        if isinstance(report, str):  # skipped, or refused by a rule
            continue
        last = report.stages[-1]
        predicted = stage_allocated(last) - context
        measured = float(row["mem_maxalloc_GiB_max"]) * GIB
        out.append(Run("memory", script, megatron, job, plan, predicted / measured - 1))
    figures = memory_accuracy.run(validation, False, False, playbook_estimates, megatron_estimates)
    for name, key in ((playbook, "playbook sweep (first stage, ok rows)"),
                      (megatron, "megatron functional tests (last stage, all kept rows)")):
        mine = statistics.median(abs(r.error) for r in out if r.set == name)
        _close(mine * 100, figures[key]["median_abs_pct"], name)
    return out


def figures(runs: list[Run], kind: Kind) -> dict:
    by_regime: dict[str, list[Run]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for r in runs:
        if r.kind != kind:
            continue
        by_regime[regime_name(r.job, r.plan, kind)].append(r)
        for t in terms(r.job, r.plan, kind):
            counts[t] += 1
    regimes: dict[str, dict] = {}
    for name in [*LABELS[kind], *sorted(set(by_regime) - set(LABELS[kind]))]:
        group = by_regime.get(name, [])
        label = regime_label(name, kind)
        if not group:
            regimes[name] = {"label": label, "runs": 0,
                             "unvalidated": "no measured run in this regime (none of the bench sets has one)"}
            continue
        sources: dict[tuple[str, str], int] = defaultdict(int)
        for r in group:
            sources[(r.script, r.set)] += 1
        regimes[name] = {
            "label": label,
            "median_error": round(statistics.median(abs(r.error) for r in group), 4),
            "bias": round(statistics.median(r.error for r in group), 4),
            "runs": len(group),
            "sources": [{"script": s, "set": n, "runs": k} for (s, n), k in sorted(sources.items())],
        }
    return {"regimes": regimes, "terms": dict(sorted(counts.items()))}


HEADER = """\
# The error meshplan measured in each regime, and how many measured runs exercise each term of an estimate.
# GENERATED by bench/accuracy_card.py from the bench scripts (never edit by hand: re-run it after a change to
# the cost model or the data). meshplan/estimate/accuracy.py reads it: every throughput and memory report carries its
# regime's band (error_band) and the terms no run here exercised (unvalidated).
"""


def build(validation: Path) -> dict:
    runs = throughput_runs(validation) + production_runs(validation) + memory_runs(validation) + rl_runs(validation)
    return {
        "description": "Median |predicted / measured - 1| and median signed error (bias: > 0 predicts too high) per "
                       "regime, over every measured run the bench scripts score; terms: measured runs exercising "
                       "each term (absent: none).",
        "generated_by": "bench/accuracy_card.py",
        "measured": dt.datetime.now(dt.UTC).date().isoformat(),
        "throughput": figures(runs, "throughput"),
        "memory": figures(runs, "memory"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=production_rows.DEFAULT_VALIDATION)
    ap.add_argument("--check", action="store_true", help="Compare the figures with the card; write nothing")
    args = ap.parse_args(argv)
    card = build(args.validation)
    for kind in ("throughput", "memory"):
        print(f"{kind}:")
        for name, r in card[kind]["regimes"].items():
            if r["runs"]:
                print(f"  {name:34s} {r['runs']:5d} runs  median |err| {r['median_error']:6.1%}  "
                      f"bias {r['bias']:+6.1%}")
            else:
                print(f"  {name:34s}     0 runs  unvalidated")
    if args.check:
        old = yaml.safe_load(CARD.read_text(encoding="utf-8"))
        same = all(old[k] == card[k] for k in ("throughput", "memory"))
        print("card up to date" if same else "card differs: run python bench/accuracy_card.py")
        return 0 if same else 1
    CARD.write_text(HEADER + yaml.safe_dump(card, sort_keys=False, width=120, allow_unicode=True), encoding="utf-8")
    print(f"wrote {CARD.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
