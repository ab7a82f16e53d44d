"""Speed of the memory estimator: one in-process estimate, and 1,000 batch lines through the CLI.

Targets (issue 3): one estimate well under 5 ms; `meshplan memory --batch` over 1,000 lines in < 3 s.

    python bench/memory_speed.py
"""

from __future__ import annotations

import json
import statistics
import time

from batch_timing import time_batch

from meshplan import api
from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CASES = [
    Request(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, seq_length=8192),
    # etp=1 as in the recipe (cards/strategies.yaml): left out, it defaults to tp=2 and the expert grid
    # etp*ep*pp = 2048 does not divide 1,024 GPUs (WS002, which stops the estimate).
    Request(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, recompute="full"),
    Request(model="qwen3-30b-a3b", num_gpus=16, tp=2, ep=8, vpp=1),
    Request(model="llama-3.1-8b", num_gpus=8, framework="torchtitan"),
]


def per_call_ms(fn, repeat: int = 300) -> tuple[float, float]:
    fn()  # warm caches (cards, model tables)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), sorted(samples)[int(0.99 * len(samples)) - 1]


def main() -> None:
    for req in CASES:
        job, plan = resolve(req)
        core = per_call_ms(lambda job=job, plan=plan: estimate_memory(job, plan))
        full = per_call_ms(lambda req=req: api.estimate_memory(req))
        print(f"{req.model:>15} {plan.short():<28} estimate_memory p50 {core[0]:.3f} ms p99 {core[1]:.3f} ms; "
              f"api (resolve + estimate) p50 {full[0]:.3f} ms")
    lines = []
    for i in range(1000):
        req = CASES[i % len(CASES)].model_dump(exclude_none=True)
        req["micro_batch_size"] = 1 + i % 4
        lines.append(json.dumps(req))
    results, elapsed = time_batch("memory", lines)
    errors = sum("error" in r for r in results)
    print(f"batch: {len(results)} lines in {elapsed:.2f} s wall (process start included), {errors} errors")


if __name__ == "__main__":
    main()
