"""Time `render` for every adapter target on one plan (Llama-3.1-70B, 64 H100, TP4 PP4): ms per call."""

from __future__ import annotations

import time

from meshplan.adapters.render import TARGETS, render
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def main(n: int = 200) -> None:
    for framework in TARGETS:
        job, plan = resolve(Request(framework=framework, model="llama-3.1-70b", num_gpus=64, tp=4, pp=4,
                                    global_batch_size=512))
        render(framework, job, plan)  # templates load once per process
        start = time.perf_counter()
        for _ in range(n):
            render(framework, job, plan)
        print(f"{framework:16s} {(time.perf_counter() - start) / n * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
