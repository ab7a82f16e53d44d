"""Agreement between meshplan's check_config and the frameworks' own validators, per framework.

Generates layouts (valid and invalid), runs the real validators on them in the cached venv of
tests/framework_probes/harness.py, and prints, per framework: configs, framework rejections, agreement
rate, explained and unexplained disagreements, crashes of either side, and which validator stage
rejected how many layouts with which meshplan rule ids. Usage:

    python bench/validator_agreement.py [--cases 400] [--framework verl] [--show 5]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "framework_probes"))

import harness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=400, help="layouts per framework")
    parser.add_argument("--framework", action="append", choices=sorted(harness.FRAMEWORKS))
    parser.add_argument("--seed", type=int, default=1, help="the tests use seed 0")
    parser.add_argument("--show", type=int, default=3, help="disagreements to print per framework")
    args = parser.parse_args()
    print(f"{'framework':16} {'configs':>7} {'rejected':>8} {'agree':>6} {'rate':>7} {'explained':>9} "
          f"{'unexplained':>11} {'fw crash':>8} {'ours crash':>10} {'time':>6}")
    details = []
    for name in args.framework or sorted(harness.FRAMEWORKS):
        cases = harness.generate(name, args.cases, seed=args.seed)
        start = time.perf_counter()
        verdicts = harness.framework_verdicts(name, cases, timeout=3600)
        rows = harness.compare(name, cases, verdicts)
        s = harness.summary(rows)
        print(f"{name:16} {s['configs']:>7} {s['framework_rejects']:>8} {s['agree']:>6} {s['agreement']:>7.1%} "
              f"{s['explained']:>9} {s['unexplained']:>11} {s['crashes']:>8} {s['meshplan_crashes']:>10} "
              f"{time.perf_counter() - start:>5.0f}s")
        stages: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in rows:
            stages[r.framework_stage or "accepted"].update(r.errors or ["-"])
            stages[r.framework_stage or "accepted"]["layouts"] += 1
        bad = [r for r in rows if not r.agree and not r.explained_by]
        details.append((name, stages, bad, harness.sp_warning_rows(rows)))
    for name, stages, bad, sp in details:
        print(f"\n{name}: layouts per validator stage, and the meshplan rule ids that fired on them")
        for stage, ids in sorted(stages.items(), key=lambda kv: -kv[1]["layouts"]):
            n = ids.pop("layouts")
            print(f"  {n:>5}  {stage:26} " + " ".join(f"{k}:{v}" for k, v in sorted(ids.items())))
        if sp:
            print(f"  SP001 vs the framework's SP-off warning differ on {len(sp)} layouts")
        for row in bad[: args.show]:
            print("  " + row.describe().replace("\n", "\n  "))


if __name__ == "__main__":
    main()
