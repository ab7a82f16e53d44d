"""Every fitted constant of cards/calibration.yaml, the data it was fitted on, and the same fit without one source
(leave one source out, issue 24 item 3): the benches score each held row under the constants fitted on every other
publication, beside the card's (in sample).

The fitted constants (a card entry with a `fitted` field, and a framework whose values were fitted; a test holds this
list to the card) and how each is refitted here:
- `gemm_peak_fraction` (the shared value: every framework but nanotron), `moe_gemm_half_ridges`, `moe_host_sync_s`:
  one fit of the three on one pool, the union of the Megatron-family pool (Megatron-Bridge's published table,
  bench/bridge_published.py, the recipes' pipeline splits from meshplan/knowledge/published_runs.py, and the classic
  tables of bench/throughput_accuracy.py: Korthikanti 2022 Table 5, Narayanan 2021 Table 1, the Megatron-Core H100
  table of Megatron-LM's README, Megatron-LM's functional-test golden values) and bench/moe_fit.py's MoE pool (Bridge's
  MoE rows, the dev set's MoE rows), each measured row once: the least median |log error| of tokens/s per GPU over
  the grid GEMM_GRID x moe_fit.GRID (14 x 15 x 25 points; ties to the lowest GEMM value, then ridges, then sync).
  Fitting them one after the other (the GEMM value under the card's MoE constants, then the MoE constants under it)
  fitted the card, not the data: each fit moves with where the other stands, and alternating the two did not settle
  and landed on different values from different starts. A dense row reads no MoE constant, so it is estimated once
  per GEMM value; every (row, point) is estimated once into one error table (joint_table, kept under the temporary
  folder keyed by a hash of the cards, meshplan's sources and the pool), and each held-out fit is the same argmin
  over that table's columns without the held publication's rows: no refit, a subset.
- `eager_elementwise_passes`: fitted on one pair of one publication (torchtitan's 2024-12 benchmark, eager against
  compiled blocks). Without it no source identifies an eager framework's pass count; the held rows are scored with
  the only other fit of eager kernels' elementwise passes, nanotron's (`frameworks.nanotron.elementwise_passes`,
  fitted on the Ultra-Scale Playbook sweep).
- The Ultra-Scale Playbook constants (`gemm_half_dim`, `layer_overhead_s`, `network_efficiency`, `ring_nic_scaling`,
  `pp_overlap` and nanotron's own values): one publication, the sweep (bench/throughput_accuracy.py --fit). No row of
  the production or pairwise files comes from it, so they are out of sample there as they stand; within the sweep
  the held-out check is by groups (throughput_accuracy.py --fit half), there being no second source to leave out.

`held_out(validation, sources)`: {source: the constants fitted without it} for the sources named (those of the rows a
bench scores); a source that fed no fit gets the card's values (nothing to refit). Each split refits the same
constants: no per-row, per-model or per-source value.

Run: python bench/fitted_constants.py [--validation DIR] [--jobs N]   (prints each constant's value per held source,
and the pool's median |error| in sample and held out; --jobs builds the error table over N processes)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bridge_published as bp
import moe_fit
import production_rows as prow
from throughput_accuracy import DEFAULT_VALIDATION, classic_cases, golden_cases

from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration, calibration_card

# The publication each classic table comes from (its rows are held out together with the dev rows citing it; the
# dev rows' key is production_rows.source_key: their citation's repository and document).
CLASSIC_PUBLICATIONS = {
    "Korthikanti T5": "Korthikanti et al. 2022 (arXiv 2205.05198) Table 5",
    "Narayanan T1": "Narayanan et al. 2021 (arXiv 2104.04473) Table 1",
    "MCore H100 table": "NVIDIA/Megatron-LM README.md",
    "Megatron golden": "NVIDIA/Megatron-LM tests/functional_tests golden values",
}
GEMM_GRID = [round(0.60 + 0.02 * i, 2) for i in range(14)]
EAGER = "eager_elementwise_passes"
EAGER_SOURCE = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
PLAYBOOK = "Ultra-Scale Playbook nanotron sweep"


@dataclass(frozen=True)
class Fitted:
    """A fitted constant: its name, the framework whose card values it is (None: the shared value), what it was
    fitted on, and how the benches hold it out."""

    name: str
    framework: str | None
    data: str
    held_out: str


def fitted_constants() -> list[Fitted]:
    """Every fitted constant of the card: the shared entries with a `fitted` field, and a framework's values whose
    summary says they were fitted (nanotron's, less those its source derives: read from nanotron's code)."""
    card = calibration_card()
    joint = "refit with the other two on the joint pool without the held source"
    how = {"gemm_peak_fraction": joint, "moe_gemm_half_ridges": joint, "moe_host_sync_s": joint,
           EAGER: "its one source held: nanotron's fitted eager pass count"}
    out = [Fitted(name, None, str(c.fitted), how.get(name, f"one source ({PLAYBOOK}): out of sample elsewhere; "
                                                            "held-out groups: throughput_accuracy.py --fit half"))
           for name, c in card.constants.items() if c.fitted]
    for fw, override in card.frameworks.items():
        if override.summary.lower().startswith("fitted"):  # nanotron's; the others name the shared fit only
            out += [Fitted(name, fw, override.summary, f"one source ({PLAYBOOK}): throughput_accuracy.py --fit half")
                    for name in override.values if name not in {"grad_accum_bytes_per_param",
                                                                "cross_entropy_bytes_per_logit", "param_gather_overlap",
                                                                "zero_grad_allreduce", "zero_grad_overlap"}]
    return out


# --------------------------------------------------------------------------- the Megatron pool


@cache
def megatron_pool() -> tuple[moe_fit.Row, ...]:
    """The rows gemm_peak_fraction was fitted on, each with its publication."""
    rows = [moe_fit.Row("bridge", f"{r['release']} {r['system']} {r['model']} {r['precision']}", job.model.name, job,
                        plan, float(r["tokens_per_s_per_gpu"])) for r, job, plan in bp.fit_cases()]
    rows += [moe_fit.Row("classic", f"{c.source} {c.job.model.name}", c.job.model.name, c.job, c.plan, c.measured_tps,
                         CLASSIC_PUBLICATIONS[c.source]) for c in classic_cases() + golden_cases(DEFAULT_VALIDATION)]
    return tuple(rows)


# --------------------------------------------------------------------------- one fit of the three constants


@cache
def moe_pool(validation: Path) -> tuple[moe_fit.Row, ...]:
    return tuple(moe_fit.rows(validation))


@cache
def joint_pool(validation: Path) -> tuple[moe_fit.Row, ...]:
    """The union of the two pools, each measured row once (Bridge's MoE rows are in both)."""
    seen: set[tuple[str, str, str, float]] = set()
    out = []
    for r in megatron_pool() + moe_pool(validation):
        key = (r.source, r.name, r.publication, r.measured_tps)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return tuple(out)


def joint_grid() -> list[dict[str, float]]:
    """Every (gemm_peak_fraction, moe_gemm_half_ridges, moe_host_sync_s) point: GEMM_GRID x moe_fit.grid(), the GEMM
    value outermost (the order ties are broken in: the lowest GEMM value, then ridges, then sync)."""
    return [{"gemm_peak_fraction": g, **ov} for g in GEMM_GRID for ov in moe_fit.grid()]


def row_errors(r: moe_fit.Row) -> list[float | None]:
    """log(predicted / measured) of one row at every joint_grid() point, None where refused. A dense row does not
    read the MoE constants: it is estimated once per GEMM value and repeated over the MoE points."""
    moe_points = moe_fit.grid() if r.job.model.moe is not None else [{}]
    out: list[float | None] = []
    for g in GEMM_GRID:
        errs: list[float | None] = []
        for ov in moe_points:
            try:
                cal = calibration(r.job.framework).with_overrides(gemm_peak_fraction=g, **ov)
                errs.append(math.log(estimate_throughput(r.job, r.plan, cal).tokens_per_s_per_gpu / r.measured_tps))
            except MeshplanError:
                errs.append(None)
        out += errs if r.job.model.moe is not None else errs * len(moe_fit.grid())
    return out


def table_key(pool: tuple[moe_fit.Row, ...]) -> str:
    """A hash of what the error table depends on: the cards, meshplan's sources, the pool's rows and the grid."""
    root = Path(__file__).resolve().parents[1]
    text = re.sub(r"meshplan-moefit-\w+", "", repr((pool, joint_grid())))  # moe_fit.rows' temporary folder
    h = hashlib.sha256(text.encode())
    for path in sorted([*(root / "cards").rglob("*.yaml"), *(root / "meshplan").rglob("*.py")]):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()[:20]


def error_columns(pool: Sequence[moe_fit.Row], jobs: int = 1) -> list[list[float | None]]:
    """row_errors of each pool row, in the pool's order: in this process, or over `jobs` forked worker processes
    (each row is estimated apart from the others, so the table is the same; the full grid is some 270,000
    estimates, a quarter of an hour of one core)."""
    if jobs <= 1:
        return [row_errors(r) for r in pool]
    with multiprocessing.get_context("fork").Pool(jobs) as workers:
        return workers.map(row_errors, pool, chunksize=1)


@cache
def joint_table(validation: Path, jobs: int = 1) -> tuple[tuple[float | None, ...], ...]:
    """log(predicted / measured) of every joint_pool() row (columns) at every joint_grid() point (rows), each (row,
    point) estimated once (over `jobs` processes: error_columns); kept under the system's temporary folder, keyed by
    table_key, for the next run."""
    pool = joint_pool(validation)
    path = Path(tempfile.gettempdir()) / f"meshplan-joint-fit-{table_key(pool)}.json"
    if path.exists():
        return tuple(tuple(row) for row in json.loads(path.read_text()))
    table = tuple(zip(*error_columns(pool, jobs), strict=True))
    part = path.with_suffix(f".{os.getpid()}.part")  # another run may read it meanwhile: renamed when whole
    part.write_text(json.dumps(table))
    part.replace(path)
    return table


def joint_point(table: Sequence[Sequence[float | None]], keep: list[bool]) -> int:
    """The point (index into the table's rows) with the least median |log error| over the kept columns; ties go to
    the lowest index. One argmin over the whole grid: no start, no alternation."""
    return moe_fit.fit_on(table, keep)


def fit_joint(validation: Path, without: str | None = None) -> dict[str, float]:
    """gemm_peak_fraction, moe_gemm_half_ridges and moe_host_sync_s fitted together on the joint pool without the
    rows of publication `without` (None: all of them)."""
    keep = [r.publication != without for r in joint_pool(validation)]
    return joint_grid()[joint_point(joint_table(validation), keep)]


# --------------------------------------------------------------------------- leave one source out


def card_values() -> dict[str, float]:
    cal = calibration()
    return {k: getattr(cal, k) for k in ("gemm_peak_fraction", "moe_gemm_half_ridges", "moe_host_sync_s", EAGER)}


def fed(validation: Path, source: str) -> bool:
    """Whether `source` is among the publications some fitted constant was fitted on."""
    return (source == EAGER_SOURCE or any(r.publication == source for r in megatron_pool())
            or any(r.publication == source for r in moe_pool(validation)))


def without(validation: Path, source: str) -> dict[str, float]:
    """The fitted constants fitted on every publication but `source` (the card's values where it fed none)."""
    values = card_values()
    if not fed(validation, source):
        return values
    values |= fit_joint(validation, source)
    if source == EAGER_SOURCE:
        values[EAGER] = calibration("nanotron").elementwise_passes
    return values


def held_out(validation: Path, sources: set[str]) -> dict[str, dict[str, float]]:
    """{source: the constants fitted without it} for each of `sources` some fit used (the others are in sample as
    they stand and are left out of the answer)."""
    return {s: without(validation, s) for s in sorted(sources) if fed(validation, s)}


def applicable(framework: str, constants: dict[str, float]) -> dict[str, float]:
    """The held-out constants a framework's estimate takes: not those its own card values override (nanotron's own
    fit of the GEMM fraction stays)."""
    own = calibration_card().frameworks.get(framework)
    return {k: v for k, v in constants.items() if own is None or k not in own.values}


def card_point() -> int | None:
    """The card's values' index in joint_grid(), None where they are off the grid."""
    card = {k: v for k, v in card_values().items() if k != EAGER}
    return next((i for i, p in enumerate(joint_grid()) if all(math.isclose(p[k], card[k]) for k in p)), None)


def pool_errors(validation: Path, source: str) -> tuple[int, str, str, str]:
    """A publication of the joint pool: its rows, the three constants fitted without it, and its median |error| of
    tokens/s per GPU under the card's values (in sample) and under those (out of sample)."""
    cols = [j for j, r in enumerate(joint_pool(validation)) if r.publication == source]
    held = fit_joint(validation, source)

    def median_abs(point: int | None) -> str:
        row = joint_table(validation)[point] if point is not None else []
        errs = [abs(math.exp(row[j]) - 1) for j in cols if row and row[j] is not None]
        return f"{statistics.median(errs):.1%}" if errs else "-"
    return len(cols), show(held), median_abs(card_point()), median_abs(joint_grid().index(held))


def pooled_report(validation: Path) -> list[str]:
    """Median |error| of tokens/s per GPU over the joint pool, all rows, MoE and dense: in sample under the card's
    values and under the fit on every source, and out of sample (each row under the constants fitted without its
    publication: leave one source out)."""
    pool, table, grid = joint_pool(validation), joint_table(validation), joint_grid()
    without = {s: joint_point(table, [r.publication != s for r in pool]) for s in {r.publication for r in pool}}
    held = [table[without[r.publication]][j] for j, r in enumerate(pool)]
    groups = {"all": [True] * len(pool), "MoE": [r.job.model.moe is not None for r in pool]}
    groups["dense"] = [not m for m in groups["MoE"]]

    def cell(errs: Sequence[float | None], keep: list[bool]) -> str:
        kept = [abs(math.exp(e) - 1) for e, k in zip(errs, keep, strict=True) if k and e is not None]
        return f"{statistics.median(kept):.1%} ({len(kept)})" if kept else "-"
    card, every = card_point(), joint_point(table, [True] * len(pool))
    lines = ["| pool rows | in sample (card) | in sample (fit on every source: " + show(grid[every]) + ") "
             "| leave one source out |", "|---|---|---|---|"]
    for name, keep in groups.items():
        lines.append(f"| {name} | {cell(table[card], keep) if card is not None else '-'} | "
                     f"{cell(table[every], keep)} | {cell(held, keep)} |")
    return lines


def show(values: dict[str, float]) -> str:
    return (f"gemm {values['gemm_peak_fraction']:g}, half_ridges {values['moe_gemm_half_ridges']:g}, "
            f"sync {values['moe_host_sync_s'] * 1e3:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=prow.DEFAULT_VALIDATION)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes that build the error table (default 1)")
    args = ap.parse_args()
    joint_table(args.validation, args.jobs)  # built once (or read from the temporary folder); every fit reads it
    print("| constant | framework | held out how |")
    print("|---|---|---|")
    for f in fitted_constants():
        print(f"| {f.name} | {f.framework or 'shared'} | {f.held_out} |")
    pool = joint_pool(args.validation)
    every = fit_joint(args.validation)
    print(f"joint pool: {len(pool)} rows ({sum(r.job.model.moe is not None for r in pool)} MoE); card: "
          f"{card_values()}; fitted on every source: {show(every)}")
    print("| held source | rows | fitted without it | in sample (card) | out of sample |")
    print("|---|---|---|---|---|")
    for source in sorted({r.publication for r in pool}):
        print(f"| {source} | " + " | ".join(str(x) for x in pool_errors(args.validation, source)) + " |")
    print("\n".join(pooled_report(args.validation)))
    for source, values in held_out(args.validation, {r.publication for r in pool} | {EAGER_SOURCE}).items():
        print(f"without {source}: {values}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
