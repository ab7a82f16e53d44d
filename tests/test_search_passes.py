"""The passes a recommend or min-gpus runs give the answers of the separate, full passes (issue 23's speed work): the
thinner-headroom probe skips the shapes whose seed keys are all over its cutoff by a lower bound of them
(BestFirstSearch.seed_floor) instead of computing every key."""

from __future__ import annotations

import math

import pytest
from test_search_oracle import sampled_request

from meshplan.core.errors import MeshplanError
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, recommend, search_job
from meshplan.search.engine import split_space
from meshplan.search.estimators import ideal_time
from meshplan.search.space import Fixed

JOBS = [Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100"),
        Request(model="qwen3-30b-a3b", num_gpus=12, framework="megatron-bridge", gpu="a100-80gb", seq_length=32768),
        Request(model="llama-3.1-8b", num_gpus=16, framework="torchtitan", gpu="h100", global_batch_size=64)]


@pytest.mark.parametrize("req", JOBS, ids=lambda r: r.model)
def test_the_seed_floor_bounds_every_seed_key_of_the_layout(req):
    job, _ = search_job(req)
    fixed = Fixed.from_request(req)
    engine = default_engine(job.framework)
    search = BestFirstSearch.for_job(job, fixed, engine, 1)
    tiers = split_space(search)
    ideal = ideal_time(job, engine)
    checked = 0
    for layouts in (tiers.inside, tiers.across):
        seeds = search.sized(layouts)
        for lay, sizes, _ in seeds.layouts:
            if not sizes:
                continue
            rate = search.seed_rate(lay, sizes[0], {})
            floor = search.seed_floor(lay, sizes, rate[1])
            assert 0.0 <= floor <= min(search.seed_keys(lay, sizes, ideal, rate)), (lay, sizes)
            checked += floor > 0.0  # 0 where the reference cannot be timed (bounds._per_token)
    assert checked > 50


def test_the_probe_with_the_seed_floor_answers_as_the_probe_computing_every_key(monkeypatch):
    """On sampled requests (the oracle test's sampler) with headrooms that leave layouts below them, the whole answer
    is the same with the seed floor and with it disabled (every key computed), and the floor skipped shapes."""
    skipped = [0]
    real = BestFirstSearch.seed_floor

    def counting(self, lay, sizes, per_token):
        value = real(self, lay, sizes, per_token)
        skipped[0] += value > self.cutoff
        return value

    compared = 0
    for seed in range(40):
        req, top_k = sampled_request(seed)
        req = req.model_copy(update={"headroom": (0.1, 0.25, 0.4)[seed % 3]})
        monkeypatch.setattr(BestFirstSearch, "seed_floor", counting)
        try:
            fast = recommend(req, top_k=top_k).model_dump(mode="json")
        except MeshplanError:
            continue
        monkeypatch.setattr(BestFirstSearch, "seed_floor", lambda *_: -math.inf)
        assert recommend(req, top_k=top_k).model_dump(mode="json") == fast, (seed, req)
        compared += 1
    assert compared >= 20 and skipped[0] > 0
