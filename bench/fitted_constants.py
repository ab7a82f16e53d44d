"""Every fitted constant of cards/calibration.yaml, the data it was fitted on, and the same fit without one source
(leave one source out, issue 24 item 3): the benches score each held row under the constants fitted on every other
publication, beside the card's (in sample).

The fitted constants (a card entry with a `fitted` field, and a framework whose values were fitted; a test holds this
list to the card) and how each is refitted here:
- `gemm_peak_fraction` (the shared value: every framework but nanotron): the Megatron-family pool, Megatron-Bridge's
  published table (bench/bridge_published.py, the recipes' pipeline splits from meshplan/knowledge/published_runs.py)
  and the classic tables (bench/throughput_accuracy.py: Korthikanti 2022 Table 5, Narayanan 2021 Table 1, the
  Megatron-Core H100 table of Megatron-LM's README, Megatron-LM's functional-test golden values); a grid on the
  pool's median |log error| of tokens/s per GPU, the MoE constants at the card's values.
- `moe_gemm_half_ridges`, `moe_host_sync_s`: bench/moe_fit.py's pool (Bridge's table and the dev set's MoE rows), its
  grid, under the gemm_peak_fraction fitted without the same source.
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

Run: python bench/fitted_constants.py [--validation DIR]   (prints each constant's value per held source)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
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
    how = {"gemm_peak_fraction": "refit on the Megatron pool without the held source",
           "moe_gemm_half_ridges": "refit (bench/moe_fit.py) without the held source",
           "moe_host_sync_s": "refit (bench/moe_fit.py) without the held source",
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


# --------------------------------------------------------------------------- the Megatron pool and its GEMM fit


@cache
def megatron_pool() -> tuple[moe_fit.Row, ...]:
    """The rows gemm_peak_fraction was fitted on, each with its publication."""
    rows = [moe_fit.Row("bridge", f"{r['release']} {r['system']} {r['model']} {r['precision']}", job.model.name, job,
                        plan, float(r["tokens_per_s_per_gpu"])) for r, job, plan in bp.cases()]
    rows += [moe_fit.Row("classic", f"{c.source} {c.job.model.name}", c.job.model.name, c.job, c.plan, c.measured_tps,
                         CLASSIC_PUBLICATIONS[c.source]) for c in classic_cases() + golden_cases(DEFAULT_VALIDATION)]
    return tuple(rows)


@cache
def gemm_table() -> tuple[tuple[float | None, ...], ...]:
    """log(predicted / measured) of every pool row (columns) at every GEMM_GRID value (rows); None where refused."""
    table = []
    for g in GEMM_GRID:
        row = []
        for r in megatron_pool():
            try:
                cal = calibration(r.job.framework).with_overrides(gemm_peak_fraction=g)
                row.append(math.log(estimate_throughput(r.job, r.plan, cal).tokens_per_s_per_gpu / r.measured_tps))
            except MeshplanError:
                row.append(None)
        table.append(tuple(row))
    return tuple(table)


def fit_gemm(without: str | None = None) -> float:
    """gemm_peak_fraction fitted on the pool without the rows of publication `without` (None: all of them)."""
    keep = [r.publication != without for r in megatron_pool()]
    table = gemm_table()

    def loss(i: int) -> float:
        errs = [abs(e) for e, k in zip(table[i], keep, strict=True) if k and e is not None]
        return statistics.median(errs) if errs else math.inf
    return GEMM_GRID[min(range(len(GEMM_GRID)), key=lambda i: (loss(i), i))]


# --------------------------------------------------------------------------- the MoE constants under that GEMM value


@cache
def moe_pool(validation: Path) -> tuple[moe_fit.Row, ...]:
    return tuple(moe_fit.rows(validation))


@cache
def moe_table(validation: Path, gemm: float) -> list[list[float | None]]:
    return moe_fit.error_table(list(moe_pool(validation)), gemm_peak_fraction=gemm)


def fit_moe(validation: Path, gemm: float, without: str | None = None) -> dict[str, float]:
    data = moe_pool(validation)
    best = moe_fit.fit_on(moe_table(validation, gemm), [r.publication != without for r in data])
    return moe_fit.grid()[best]


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
    gemm = fit_gemm(source)
    values |= {"gemm_peak_fraction": gemm, **fit_moe(validation, gemm, source)}
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


def pool_errors(source: str) -> tuple[int, float, str, str]:
    """A publication of the Megatron pool: its rows, gemm_peak_fraction fitted without it, and its median |error| of
    tokens/s per GPU under the card's value (in sample) and under that one (out of sample)."""
    cols = [j for j, r in enumerate(megatron_pool()) if r.publication == source]
    held = fit_gemm(source)

    def median_abs(g: float) -> str:
        row = gemm_table()[GEMM_GRID.index(g)]
        errs = [abs(math.exp(row[j]) - 1) for j in cols if row[j] is not None]
        return f"{statistics.median(errs):.1%}" if errs else "-"
    return len(cols), held, median_abs(calibration().gemm_peak_fraction), median_abs(held)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=prow.DEFAULT_VALIDATION)
    args = ap.parse_args()
    print("| constant | framework | held out how |")
    print("|---|---|---|")
    for f in fitted_constants():
        print(f"| {f.name} | {f.framework or 'shared'} | {f.held_out} |")
    print(f"card: {card_values()}; refit on every source: gemm {fit_gemm()}, "
          f"MoE {fit_moe(args.validation, fit_gemm())}")
    print("| held source (Megatron pool) | rows | gemm_peak_fraction without it | in sample | out of sample |")
    print("|---|---|---|---|---|")
    for source in sorted({r.publication for r in megatron_pool()}):
        print(f"| {source} | " + " | ".join(str(x) for x in pool_errors(source)) + " |")
    sources = {r.publication for r in megatron_pool()} | {r.publication for r in moe_pool(args.validation)}
    for source, values in held_out(args.validation, sources | {EAGER_SOURCE}).items():
        print(f"without {source}: {values}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
