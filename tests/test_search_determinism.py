"""The answer is a pure function of the request (issue 23): no clock decides what recommend or min-gpus return, so
the same request gets the same layouts on every machine, under any load, on every call."""

import time

import pytest

from meshplan import api
from meshplan.schema.request import Request


def _jumping(monkeypatch):
    """Every clock the standard library offers jumps by three hours at each reading: a search bounded by any of them
    would stop at its first check."""
    for name in ("perf_counter", "monotonic", "time", "process_time"):
        real = getattr(time, name)
        ticks = [0]

        def jump(real=real, ticks=ticks):
            ticks[0] += 1
            return real() + 3 * 3600.0 * ticks[0]

        monkeypatch.setattr(time, name, jump)


REQUESTS = [
    Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, seq_length=8192),
    Request(model="mixtral-8x7b", gpu="h100", num_gpus=64),
    Request(model="llama-3.1-70b", gpu="h100", num_gpus=2),  # nothing fits: the nothing-fits scan runs too
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.model}-{r.num_gpus}")
def test_recommend_ignores_every_clock(monkeypatch, req):
    calm = api.recommend(req).model_dump(mode="json")
    _jumping(monkeypatch)
    assert api.recommend(req).model_dump(mode="json") == calm


def test_min_gpus_ignores_every_clock(monkeypatch):
    req = Request(model="mixtral-8x22b", gpu="h100")
    calm = api.minimum_gpus(req).model_dump(mode="json")
    _jumping(monkeypatch)
    assert api.minimum_gpus(req).model_dump(mode="json") == calm


def test_three_identical_calls_give_identical_candidates_for_a_big_moe_job():
    """Issue 23: DeepSeek-V3 on 1,024 H100 with Megatron-Bridge returned three different top layouts on three identical
    calls (the search stopped on a 4 s clock)."""
    req = Request(model="deepseek-v3", framework="megatron-bridge", gpu="h100", num_gpus=1024, seq_length=4096,
                  global_batch_size=4096)
    answers = [api.recommend(req).model_dump(mode="json") for _ in range(3)]
    assert answers[0]["candidates"] and answers[0] == answers[1] == answers[2]
    assert not any("budget" in w for w in answers[0]["warnings"])
