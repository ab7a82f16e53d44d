"""How long `recommend` takes on the two jobs issue 5 sets targets for, and how much of the space it evaluates.
Targets: issue 5 (Llama 0.3 s) and issue 15 (DeepSeek-V3 1.5 s; issue 5 had set 2 s).

    python bench/recommend_speed.py [--repeat 3]

Reports the best of `--repeat` warm runs (card and model caches loaded once), as wall time and as CPU time
of this process (the machine is shared: CPU time is the figure that does not depend on other jobs), with
the number of layouts in the space and the memory / throughput estimates the search computed, and the load average
before and after (the figures are only comparable at a similar load).
"""

from __future__ import annotations

import argparse
import os
import time

from meshplan.schema.request import Request
from meshplan.search import recommend

CASES = [
    ("Llama-3.1-70B, 64 H100", Request(model="llama-3.1-70b", gpu="h100", num_gpus=64), 0.3),
    ("DeepSeek-V3, 2,048 H100, every knob open", Request(model="deepseek-v3", gpu="h100", num_gpus=2048), 1.5),
    ("Mixtral-8x7B, 64 H100", Request(model="mixtral-8x7b", gpu="h100", num_gpus=64), None),
    ("Llama-3.1-405B, 1,024 H100", Request(model="llama-3.1-405b", gpu="h100", num_gpus=1024), None),
    ("Llama-3.1-8B, 2^30 H100 (absurd)", Request(model="llama-3.1-8b", gpu="h100", num_gpus=2**30), None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min), {os.cpu_count()} CPUs")
    print("| job | target s | wall s (best) | CPU s (best) | layouts | estimates | #1 |")
    print("|---|---|---|---|---|---|---|")
    for name, req, target in CASES:
        recommend(req, top_k=1)  # warm the caches
        walls, cpus = [], []
        for _ in range(args.repeat):
            w, c = time.perf_counter(), time.process_time()
            rec = recommend(req)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        best = rec.candidates[0].plan.short() if rec.candidates else "none"
        print(f"| {name} | {target if target else '-'} | {min(walls):.3f} | {min(cpus):.3f} | {rec.considered:,} | "
              f"{rec.evaluated:,} | {best} |")
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")


if __name__ == "__main__":
    main()
