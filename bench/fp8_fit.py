"""Refit cards/calibration.yaml `fp8_gemm_relative_efficiency` on the FP8 rows that may be fitted, with each source
left out.

The constant is the share of the BF16 GEMM efficiency an FP8 GEMM reaches against the FP8 peak; every FP8 row reads
it, and nothing else does, so its pool is the FP8 rows: Megatron-Bridge's published table (bench/bridge_published.py
fit_cases: its GB300/B300 rows held out of every fit) and the dev set's FP8 rows (../shared/validation
production_configs_dev.yaml, every group), each measured row once. The other constants stay at the card's
(gemm_peak_fraction and the MoE pair were fitted with these rows in their pool: bench/fitted_constants.py). The fit is
the least median |log error| of tokens/s per GPU over GRID; each row is estimated once per grid point into one error
table, and each held-out fit is the argmin over that table without the held publication's rows (moe_fit.held_out's
way). The held-out probe (bench/data/held_out_probe) is never read here.

Run: python bench/fp8_fit.py [--validation DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bridge_published as bp
import moe_fit
import production_mapping as pmap
import production_rows as prow
import production_scoring as pscore

NAME = "fp8_gemm_relative_efficiency"
GRID = [round(0.60 + 0.025 * i, 3) for i in range(17)]  # 0.60 .. 1.00


def rows(validation: Path) -> list[moe_fit.Row]:
    """The FP8 rows a fit may read: the Bridge table's (fit_cases) and the dev set's that meshplan times."""
    out = [moe_fit.Row("bridge", f"{r['release']} {r['system']} {r['model']} {r['precision']}", job.model.name, job,
                       plan, float(r["tokens_per_s_per_gpu"]))
           for r, job, plan in bp.fit_cases() if job.precision == "fp8"]
    with tempfile.TemporaryDirectory(prefix="meshplan-fp8fit-") as tmp:  # config.json-built models live here
        for row in prow.load_rows(validation / prow.DATA_NAME):
            s = pscore.score_row(row, pmap.map_row(row, Path(tmp)))
            if s.measured_tps is None or s.predicted_tps is None:
                continue
            job, plan = resolve(s.mapping.request)
            if job.precision != "fp8":
                continue
            out.append(moe_fit.Row("dev", s.mapping.row_id, job.model.name, job, plan, s.measured_tps,
                                   prow.source_key(row)))
    return out


def error_table(data: list[moe_fit.Row]) -> list[list[float | None]]:
    """log(predicted / measured) of every row (columns) at every GRID value (rows of the table); None where refused."""
    table = []
    for value in GRID:
        line: list[float | None] = []
        for r in data:
            try:
                cal = calibration(r.job.framework).with_overrides(**{NAME: value})
                line.append(math.log(estimate_throughput(r.job, r.plan, cal).tokens_per_s_per_gpu / r.measured_tps))
            except MeshplanError:
                line.append(None)
        table.append(line)
    return table


def errors(table: list[list[float | None]], at: int, keep: list[bool]) -> list[float]:
    return [e for e, k in zip(table[at], keep, strict=True) if k and e is not None]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=prow.DEFAULT_VALIDATION)
    args = ap.parse_args()
    data = rows(args.validation)
    table = error_table(data)
    everyone = [True] * len(data)
    card = getattr(calibration("megatron-bridge"), NAME)
    at_card = min(range(len(GRID)), key=lambda i: abs(GRID[i] - card))
    best = moe_fit.fit_on(table, everyone)
    print(f"{len(data)} FP8 rows ({sum(r.source == 'bridge' for r in data)} Bridge table, "
          f"{sum(r.source == 'dev' for r in data)} dev set)")
    print("| value | all | Bridge table | dev set |")
    print("|---|---|---|---|")
    for i, value in enumerate(GRID):
        mark = " (card)" if i == at_card else " (fit)" if i == best else ""
        print(f"| {value:.3f}{mark} | {moe_fit.pct(errors(table, i, everyone))} | "
              f"{moe_fit.pct(errors(table, i, [r.source == 'bridge' for r in data]))} | "
              f"{moe_fit.pct(errors(table, i, [r.source == 'dev' for r in data]))} |")
    print(f"fitted on every row: {GRID[best]:.3f}")
    print("| held-out source | rows | fitted on the others | held out: at that fit | at the all-rows fit |")
    print("|---|---|---|---|---|")
    pooled_out: list[float] = []
    pooled_in: list[float] = []
    for source in sorted({r.publication for r in data}):
        held = [r.publication == source for r in data]
        fit = moe_fit.fit_on(table, [not h for h in held])
        out, inside = errors(table, fit, held), errors(table, best, held)
        pooled_out += out
        pooled_in += inside
        print(f"| {source} | {len(out)} | {GRID[fit]:.3f} | {moe_fit.pct(out)} | {moe_fit.pct(inside)} |")
    print(f"leave one source out, pooled: {moe_fit.pct(pooled_out)} (in sample {moe_fit.pct(pooled_in)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
