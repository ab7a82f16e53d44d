"""The passes a recommend or min-gpus runs give the answers of the separate, full passes (issue 23's speed work): the
thinner-headroom probe skips the shapes whose seed keys are all over its cutoff by a lower bound of them
(BestFirstSearch.seed_floor) instead of computing every key, and min-gpus settles a count with recommend's ranked rows
only (no probe, decision table or nothing-fits scan: it reads none of them)."""

from __future__ import annotations

import gc
import math

import pytest
from test_search_oracle import sampled_request

import meshplan.search.gpu_count as gpu_count
import meshplan.search.ranking as ranking
from meshplan.core.errors import MeshplanError
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, minimum_gpus, recommend, search_job
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


@pytest.mark.parametrize("req", [*JOBS, Request(model="qwen3-8b", num_gpus=16, framework="skyrl", gpu="h100")],
                         ids=lambda r: f"{r.model}-{r.framework}")
def test_the_space_split_counts_per_dp_what_each_layout_counts(req):
    # split_space counts the plans of each dp once (plans_of and refused_plans read only a layout's micro-batches):
    # the same totals as adding them layout by layout, the refused ZeRO stages' included (AD001: torchtitan's ZeRO-1,
    # SkyRL's ZeRO-0)
    job, _ = search_job(req)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req), default_engine(job.framework), 1)
    tiers = split_space(search)
    layouts = [*tiers.inside, *tiers.across]
    assert tiers.across_plans == sum(search.plans_of(lay) for lay in tiers.across)
    refused = sum(search.refused_plans(lay) for lay in layouts)
    assert tiers.rejected["AD001"] == refused
    assert tiers.considered - sum(n for k, n in tiers.rejected.items() if k != "AD001") == (
        sum(search.plans_of(lay) for lay in layouts) + refused)
    assert refused > 0 or job.framework not in ("torchtitan", "skyrl")


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


def test_recommends_rows_only_are_its_full_answers_rows():
    """rows_only (what min-gpus asks for at each count) ranks the same rows with the same counts."""
    compared = 0
    for seed in range(24):
        req, top_k = sampled_request(seed)
        try:
            full = recommend(req, top_k=top_k)
        except MeshplanError:
            continue
        rows = recommend(req, top_k=top_k, rows_only=True)
        assert rows.candidates == full.candidates, (seed, req)
        assert (rows.considered, rows.rejected, rows.global_batch_size) == (
            full.considered, full.rejected, full.global_batch_size), (seed, req)
        if full.candidates:  # the nothing-fits answer estimates the closest misses, and counts them
            assert rows.evaluated == full.evaluated, (seed, req)
        assert rows.best_below_headroom is None and rows.decision_table == ""
        compared += 1
    assert compared >= 12


def test_min_gpus_settles_a_count_without_recommends_probe_or_table(monkeypatch):
    """min-gpus reads only the ranked rows of recommend at a count: the thinner-headroom probe, the decision table and
    the nothing-fits answer do not run, and its candidate is recommend's full answer's #1 there."""
    req = Request(model="mixtral-8x22b", gpu="h100", seq_length=4096)
    for name in ("fastest_below_headroom", "decision_table", "explain_impossible"):
        monkeypatch.setattr(ranking, name, lambda *_, _name=name, **__: pytest.fail(f"{_name} ran"))
    result = minimum_gpus(req)
    monkeypatch.undo()
    assert result.num_gpus is not None and result.candidate is not None
    there = recommend(req.model_copy(update={"num_gpus": result.num_gpus}), top_k=1)
    assert there.candidates[0] == result.candidate


def test_min_gpus_scans_with_the_cyclic_collector_paused_and_restores_it(monkeypatch):
    """The scan's floors (fits_somewhere) run with the collector paused, as recommend's search does; it is on after."""
    seen = []
    real = gpu_count.fits_somewhere
    monkeypatch.setattr(gpu_count, "fits_somewhere", lambda *a: seen.append(gc.isenabled()) or real(*a))
    assert gc.isenabled()
    result = minimum_gpus(Request(model="llama-3.1-8b", gpu="h100", seq_length=4096), max_gpus=64)
    assert result.num_gpus is not None and seen and not any(seen) and gc.isenabled()
