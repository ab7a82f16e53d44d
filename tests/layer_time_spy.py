"""The first decoder layer's LayerTime of a throughput estimate, caught as perf.estimate_throughput computes it: the
GPU-part tests (tests/test_gpu_grand_teton.py, tests/test_gpu_power_limit.py) compare one job's layer on two parts."""

from __future__ import annotations

from meshplan.estimate import perf
from meshplan.estimate.layer_records import LayerTime
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def first_layer_time(req: Request) -> LayerTime:
    """perf.layer_time's first answer while the request's throughput is estimated (the function put back after)."""
    seen: list[LayerTime] = []
    original = perf.layer_time

    def spy(ctx, moe):
        seen.append(original(ctx, moe))
        return seen[-1]

    perf.layer_time = spy
    try:
        perf.estimate_throughput(*resolve(req))
    finally:
        perf.layer_time = original
    return seen[0]
