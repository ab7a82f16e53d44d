"""How long `recommend` and `min-gpus` take on the jobs issue 23 sets targets for, and how much of the space they
evaluate. Targets (issue 23, medians of 5 on the 2-core machine, idle): Llama-3.1-70B on 64 H100 <= 0.15 s,
DeepSeek-V3 on 2,048 H100 <= 0.5 s, Kimi-K2 on 256 H100 <= 1 s, GRPO Qwen3-30B-A3B on 16 H100 (verl) <= 1 s,
min-gpus Kimi-K2 <= 1 s; MCP server start to its first tools/list answer <= 0.8 s (bench/mcp_speed.py's launch).

    python bench/recommend_speed.py [--repeat 5] [--only NAME]

Reports the median of `--repeat` warm runs (card and model caches loaded once), as wall time and as CPU time of this
process (the machine is shared: CPU time is the figure that depends least on other jobs), with the number of
layouts in the space, the memory / throughput estimates the search computed and its #1, whether the target is met
(by the CPU median, since the wall time on a loaded machine measures the queue for a CPU; the MCP row by its wall
time, the target's own figure), and the load average before and after (the figures are only comparable at a similar
load). The MCP row launches `python -m meshplan.faces.mcp` (the installed meshplan, or the checkout PYTHONPATH names:
bench/mcp_speed.child_env) and times it to the answer of its first tools/list (wall), with the server's CPU time from
start-up to exit. No clock bounds the search, so the answers do not depend on the
machine; only these times do.
"""

from __future__ import annotations

import argparse
import heapq
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from meshplan import api
from meshplan.schema.request import Request

H100 = dict(gpu="h100")
CASES: list[tuple[str, Callable[[], object], float | None]] = [
    ("recommend Llama-3.1-70B, 64 H100",
     lambda: api.recommend(Request(model="llama-3.1-70b", num_gpus=64, **H100)), 0.15),
    ("recommend DeepSeek-V3, 2,048 H100",
     lambda: api.recommend(Request(model="deepseek-v3", num_gpus=2048, **H100)), 0.5),
    ("recommend Kimi-K2, 256 H100",
     lambda: api.recommend(Request(model="kimi-k2", num_gpus=256, **H100)), 1.0),
    ("recommend GRPO Qwen3-30B-A3B, 16 H100 (verl)",
     lambda: api.recommend(Request(model="qwen3-30b-a3b", num_gpus=16, framework="verl", job="rl", algorithm="grpo",
                                   **H100)), 1.0),
    ("min-gpus Kimi-K2, H100",
     lambda: api.minimum_gpus(Request(model="kimi-k2", **H100)), 1.0),
    ("recommend DeepSeek-V3, 1,024 H100, Megatron-Bridge, 4K x 4,096",
     lambda: api.recommend(Request(model="deepseek-v3", num_gpus=1024, framework="megatron-bridge", seq_length=4096,
                                   global_batch_size=4096, **H100)), None),
    ("min-gpus DeepSeek-V3, H100",
     lambda: api.minimum_gpus(Request(model="deepseek-v3", **H100)), None),
    ("recommend Llama-3.1-8B, 2^30 H100 (absurd)",
     lambda: api.recommend(Request(model="llama-3.1-8b", num_gpus=2**30, **H100)), None),
    # a user's sweep (issue 23, lane sweep41): FSDP2's backward walk per stage; the first two fit nowhere (the
    # thinner-headroom probe and the GPU-count scan run), the third stops at the search's estimate budget
    ("recommend Qwen3-235B-A22B, 16 B200, torchtitan (none fits)",
     lambda: api.recommend(Request(model="qwen3-235b-a22b", num_gpus=16, framework="torchtitan", gpu="b200")), None),
    ("recommend BLOOM-176B, 16 H100, verl (none fits)",
     lambda: api.recommend(Request(model="bloom-176b", num_gpus=16, framework="verl", **H100)), None),
    ("recommend Qwen3-30B-A3B, 64 H20, NeMo AutoModel",
     lambda: api.recommend(Request(model="qwen3-30b-a3b", num_gpus=64, framework="nemo-automodel", gpu="h20")), None),
]


def describe(result: object) -> tuple[str, str, str]:
    """(layouts, estimates, #1) of a Recommendation or a MinimumGpus."""
    if hasattr(result, "considered"):
        best = result.candidates[0].plan.short() if result.candidates else "none"
        return f"{result.considered:,}", f"{result.evaluated:,}", best
    best = result.candidate.plan.short() if result.candidate else "none"
    return f"{result.counts_checked} counts", "-", f"{result.num_gpus} GPUs: {best}"


MCP_TARGET = 0.8  # s, MCP server start to its first tools/list answer


def met(seconds: float, target: float | None) -> str:
    return "-" if target is None else ("yes" if seconds <= target else "no")


def mcp_row(repeat: int) -> str:
    """The MCP server launched `repeat` times: start to first tools/list (wall), and its CPU time start-up to exit."""
    from mcp_speed import launch_to_tools_list

    with tempfile.TemporaryDirectory() as cwd:  # launched from outside the repo, as mcp_speed does
        launches = [launch_to_tools_list(cwd) for _ in range(repeat)]
    wall, cpu = statistics.median(w for w, _ in launches), statistics.median(c for _, c in launches)
    return (f"| MCP server start to first tools/list | {MCP_TARGET} | {wall:.3f} | {cpu:.3f} (to exit) | - | - | - | "
            f"{met(wall, MCP_TARGET)} |")  # the target's own figure; on a loaded machine it also times the queue


def reference_loop() -> float:
    """CPU s of a fixed pure-Python workload like the search's own (heap pushes and pops of tuples, dict gets and
    sets, float arithmetic): the same on every machine, so a figure measured on another machine compares through it
    (the search's times scale with the interpreter's speed, not with the core count). Median of 5."""
    def once() -> float:
        start = time.process_time()
        heap: list = []
        memo: dict = {}
        total = 0.0
        for i in range(200_000):
            key = (i * 7919) % 10_007
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = 1.0 + key * 0.5 / (i + 1.0)
            total += hit * 1.000001
            heapq.heappush(heap, (total % 97.0, i, key))
            if len(heap) > 64:
                heapq.heappop(heap)
        return time.process_time() - start
    return statistics.median(once() for _ in range(5))


WARM_UP = Request(model="llama-3.1-8b", num_gpus=8, **H100)  # another request: loads the cards, not this one's memos


def first_ask(index: int) -> float:
    """CPU s of case `index` asked once in a fresh process whose cards are loaded by another request (WARM_UP): what a
    user's first ask of it costs, with none of the per-job memos a repeat in the same process finds (the rules' kept
    verdicts, the estimates' per-layout terms)."""
    out = subprocess.run([sys.executable, __file__, "--first-ask", str(index)], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return float(out.stdout.strip().splitlines()[-1])


def first_ask_child(index: int) -> float:
    api.recommend(WARM_UP)
    start = time.process_time()
    CASES[index][1]()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--first-ask", type=int, default=None, help=argparse.SUPPRESS)  # one child run (first_ask)
    args = parser.parse_args()
    if args.first_ask is not None:
        print(first_ask_child(args.first_ask))
        return
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min), {os.cpu_count()} CPUs")
    print(f"machine reference: {reference_loop():.3f} s CPU (bench/recommend_speed.py reference_loop: compare machines "
          "by it)")
    print("| job | target s | wall s (median) | CPU s (median) | CPU s, first ask (median) | layouts | estimates | #1 "
          "| met |")
    print("|---|---|---|---|---|---|---|---|---|")
    for index, (name, call, target) in enumerate(CASES):
        if args.only.lower() not in name.lower():
            continue
        first = statistics.median(first_ask(index) for _ in range(args.repeat))
        call()  # warm the caches
        walls, cpus = [], []
        for _ in range(args.repeat):
            w, c = time.perf_counter(), time.process_time()
            result = call()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        layouts, estimates, best = describe(result)
        cpu = statistics.median(cpus)
        print(f"| {name} | {target if target else '-'} | {statistics.median(walls):.3f} | "
              f"{cpu:.3f} | {first:.3f} | {layouts} | {estimates} | {best} | {met(max(cpu, first), target)} |",
              flush=True)
    if args.only.lower() in "mcp server start":
        print(mcp_row(args.repeat), flush=True)
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")


if __name__ == "__main__":
    main()
