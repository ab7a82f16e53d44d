"""search/tier_floor.py: a lower bound of the step time of every plan of a tier, from its TP traffic alone, which
lets run_search leave a tier unseeded when the bound is over its cutoff (the thinner-headroom probe's). The bound is
held under the estimate of sampled plans of the TP-across-domains tier (dense and MoE, every TP overlap mode), and the
skip changes no answer."""

from __future__ import annotations

import random

import pytest

import meshplan.search.engine as search_engine
import meshplan.search.impossible as impossible
from meshplan.arithmetic.comm import links
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, recommend, search_job
from meshplan.search.engine import across_floor, split_space
from meshplan.search.space import Fixed
from meshplan.search.tier_floor import exposed_share, tier_floor, tp_step_floor

JOBS = [Request(model="llama-3.1-8b", num_gpus=32, framework="megatron-core", gpu="h100"),
        Request(model="llama-3.1-8b", num_gpus=32, framework="megatron-core", gpu="h100", tp_comm_overlap=True),
        Request(model="deepseek-v2-lite", num_gpus=32, framework="torchtitan", gpu="h100", tp_comm_overlap=True,
                torch_compile=True),
        Request(model="llama-3.1-8b", num_gpus=128, framework="nanotron", gpu="a100-80gb"),
        Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100", seq_length=8192),
        Request(model="qwen3-30b-a3b", num_gpus=64, framework="megatron-bridge", gpu="h100"),
        Request(model="mixtral-8x7b", num_gpus=32, framework="deepspeed", gpu="h100")]


@pytest.mark.parametrize("req", JOBS, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}-{r.tp_comm_overlap}")
def test_the_tier_floor_is_under_the_estimate_of_every_sampled_plan_across_the_domain(req):
    """tp_step_floor of a layout across the NVLink domain is at most the estimated step time of its plans (sampled:
    layout, micro-batch, ZeRO stage, recompute), and tier_floor at most every layout's; the bound is a real one (most
    sampled plans' floors are over half their exposed TP seconds)."""
    job, _ = search_job(req)
    engine = default_engine(job.framework)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), engine, 1)
    tiers = split_space(search)
    assert tiers.across
    cal = calibration(job.framework)
    lk = links(job.gpu, job.gpus_per_node, cal)
    share = exposed_share(job.card, search.tp_overlap, cal)
    tier = tier_floor(job, tiers.across, search.sizes, search.tp_overlap)
    rng = random.Random(7)
    timed = tight = 0
    for lay in rng.sample(tiers.across, min(40, len(tiers.across))):
        sizes = search.sizes(lay)
        if not sizes:
            continue
        mbs = rng.choice(sizes)
        floor = tp_step_floor(job, lay, (mbs,), lk, share)
        assert tier <= tp_step_floor(job, lay, sizes, lk, share) <= floor
        for zero in search.zeros:
            recompute = rng.choice(search.recomputes)
            try:
                report = engine.throughput(job, search.plan(lay, zero, recompute, mbs))
            except MeshplanError:  # a plan the rules refuse has no step time to hold the bound under
                continue
            assert floor <= report.step_time_s * (1.0 + 1e-12), (lay, mbs, zero, recompute, floor, report)
            timed += 1
            tight += floor > 0.5 * report.breakdown.tp_comm_s
    assert timed >= 5 and tight > timed // 2


def test_the_fraction_mode_counts_only_its_exposed_share():
    # DeepSpeed's TP path is the calibrated fraction (1 - tp_overlap of tp_comm exposed); the modes that work out what
    # each GEMM hides keep the whole of tp_comm in compute + exposed TP (nanotron's local_shard among them)
    assert exposed_share(framework_card("deepspeed"), False, calibration("deepspeed")) == pytest.approx(
        1.0 - calibration("deepspeed").tp_overlap)
    assert exposed_share(framework_card("nanotron"), False, calibration("nanotron")) == 1.0
    assert exposed_share(framework_card("megatron-core"), True, calibration("megatron-core")) == 1.0
    assert exposed_share(framework_card("torchtitan"), False, calibration("torchtitan")) == 1.0


def test_a_lora_job_has_no_tier_floor():
    req = Request(model="llama-3.1-8b", num_gpus=32, framework="megatron-bridge", gpu="h100", lora_rank=16)
    job, _ = search_job(req)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)
    assert tier_floor(job, split_space(search).across, search.sizes, search.tp_overlap) == 0.0


def test_skipping_the_tier_changes_no_answer(monkeypatch):
    """DeepSeek-V3 on 2,048 H100: the thinner-headroom probe's cutoff is under the TP-across tier's floor, so the probe
    leaves that tier unseeded; the answer (ranked rows, rejected counts, the probe's layout) and the probe's own
    counts are the same as with the tier seeded and searched (a floor of 0)."""
    req = Request(model="deepseek-v3", num_gpus=2048, gpu="h100")
    probes: list[dict] = []
    real_run = impossible.run_search

    def run(*args, **kwargs):
        probe = real_run(*args, **kwargs)
        probes.append(dict(probe[0].rejected))
        return probe

    monkeypatch.setattr(impossible, "run_search", run)
    skipped = [0]
    real_floor = search_engine.across_floor

    def floor(search, tiers):
        value = real_floor(search, tiers)
        skipped[0] += value > search.cutoff
        return value

    monkeypatch.setattr(search_engine, "across_floor", floor)
    # the probe run even where the ranked search's record proves it empty (impossible.below_settled): its tier skip
    monkeypatch.setattr(impossible, "below_settled", lambda *args: False)
    fast = recommend(req).model_dump()
    assert skipped[0] == 1 and len(probes) == 1
    monkeypatch.setattr(search_engine, "across_floor", lambda search, tiers: 0.0)
    seeded = recommend(req).model_dump()
    assert fast == seeded and probes[0] == probes[1]


def test_an_engine_other_than_the_cost_model_gets_no_floor():
    req = Request(model="llama-3.1-8b", num_gpus=32, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    engine = default_engine(job.framework)
    engine.terms = None
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), engine, 1)
    assert across_floor(search, split_space(search)) == 0.0
