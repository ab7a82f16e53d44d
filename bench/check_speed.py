"""Speed of check_config: structural rules only (what the search calls), the full check with the memory
estimate, and 1,000 `meshplan check --batch` lines through the CLI.

    python bench/check_speed.py
"""

from __future__ import annotations

import statistics
import time

from batch_timing import time_batch

from meshplan.check.config import check_config
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CASES = [
    Request(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, cp=2, seq_length=8192),
    Request(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, first_stage_layers=4,
            last_stage_layers=1),  # etp=1: the default etp=tp breaks the expert grid (WS002, no memory estimate)
    Request(model="mixtral-8x7b", num_gpus=64, pp=4, ep=8),
    Request(model="llama-3.1-70b", num_gpus=64, tp=8, seq_length=8192),  # MEM001: re-estimates neighbours
    Request(model="llama-3.1-8b", num_gpus=8, tp=3),  # structural errors
]


def per_call(fn, repeat: int) -> float:
    fn()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        samples.append((time.perf_counter() - start) / repeat)
    return statistics.median(samples)


def main() -> None:
    for req in CASES:
        job, plan = resolve(req)
        quick = per_call(lambda job=job, plan=plan: check_config(job, plan, include_memory=False), 500)
        full = per_call(lambda job=job, plan=plan: check_config(job, plan), 20)
        ids = sorted({f.id for f in check_config(job, plan).findings})
        print(f"{req.model:16s} {plan.short():28s} structural {quick * 1e6:7.1f} us"
              f"   full {full * 1e3:6.2f} ms   {ids}")
    lines = [CASES[i % len(CASES)].model_dump_json(exclude_none=True) for i in range(1000)]
    results, elapsed = time_batch("check", lines)
    print(f"check --batch: {len(results)} lines in {elapsed:.2f} s (process start included)")


if __name__ == "__main__":
    main()
