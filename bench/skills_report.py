"""Skills and cards: how long `meshplan docs` takes, what the tools say about every checked table row,
and how many skill evals hold. Run: python bench/skills_report.py

Prints one line per checked row (validity, worst-stage memory and headroom, predicted tokens/s/GPU, MFU)
so the decision tables' recipes can be read against the estimators at a glance.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from meshplan.faces import docs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    start = time.perf_counter()
    drift = docs.render_all(check=True)
    first = time.perf_counter() - start
    start = time.perf_counter()
    docs.render_all(check=True)
    warm = time.perf_counter() - start
    print(f"meshplan docs --check: {first:.2f} s cold, {warm:.2f} s warm; files out of date: {len(drift)}")

    print(f"\n{'row':32s} {'layout':44s} {'ok':3s} {'peak GiB':>9s} {'headroom':>8s} {'tok/s/GPU':>10s} {'MFU':>5s}")
    for rid, row in docs.checked_rows():
        n = docs.row_numbers(row)
        head = 1 - n.peak_bytes / n.capacity_bytes
        layout = f"{row.num_gpus}x{row.gpu} {row.layout.short()}"[:44]
        print(f"{rid:32s} {layout:44s} {'yes' if n.ok else 'NO':3s} {n.peak_bytes / 2**30:9.1f} {head:8.0%} "
              f"{n.tokens_per_s_per_gpu:10,.0f} {n.mfu:5.0%}")

    from test_evals import _answer, check, load_evals

    items = load_evals()
    passed, failed = 0, []
    start = time.perf_counter()
    for i, item in enumerate(items):
        try:
            result = _answer(i)
            for spec in item["checks"]:
                check(result, spec)
            passed += 1
        except Exception as exc:  # a report, not a test: count and name every failure
            failed.append(f"{item['id']}: {str(exc).splitlines()[0][:160]}")
    print(f"\nevals: {passed}/{len(items)} hold ({time.perf_counter() - start:.1f} s)")
    for line in failed:
        print("  FAILED", line)


if __name__ == "__main__":
    main()
