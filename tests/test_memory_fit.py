"""The search's fit-only memory path (estimate/memory.memory_fit, issue 23's speed work) gives estimate_memory's
verdict: on sampled plans of dense, MoE, MLA, long-context, offloaded, expandable-segment and FSDP2 jobs, at budgets
either side of each report's figure, whichever stage it asks first; and recommend answers the same with it as from the
full reports (candidates, rejections, estimates counted, the closest misses of an impossible request, RL jobs)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory, memory_fit, memory_terms
from meshplan.estimate.memory_stage import stage_fit, stage_memory
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, recommend, search_job
from meshplan.search.space import Fixed, enumerate_layouts, micro_batches

GIB = 1 << 30
REQUESTS = [
    Request(model="llama-3.1-8b", num_gpus=16, framework="megatron-core", gpu="h100"),
    Request(model="qwen3-30b-a3b", num_gpus=16, framework="megatron-bridge", gpu="h100"),
    Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="a100-80gb"),
    Request(model="llama-3.1-8b", num_gpus=16, framework="megatron-core", gpu="h100", seq_length=131072,
            global_batch_size=16),
    Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", gpu="h100", optimizer_offload_fraction=1,
            cpu_memory_per_node=400),
    Request(model="qwen3-8b", num_gpus=8, framework="torchtitan", gpu="h100", expandable_segments=True),
    Request(model="moonlight-16b-a3b", num_gpus=16, framework="skyrl", gpu="a100-80gb"),
]


def sampled_plans(req: Request, count: int, seed: int):
    """(job, plan) pairs drawn from the request's searched space: layouts, ZeRO stages, recomputes, micro-batches."""
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    rng = random.Random(seed)
    for lay in rng.sample(layouts, min(count, len(layouts))):
        sizes = micro_batches(job, lay, fixed) or (1,)
        key = (lay, rng.choice(search.zeros), rng.choice(search.recomputes), rng.choice(sizes))
        yield job, search.plan(*key)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.model}-{r.framework}")
def test_the_fit_path_gives_the_reports_verdict_and_figures(req):
    checked = over = 0
    for job, plan in sampled_plans(req, 40, seed=len(req.model)):
        try:
            report = estimate_memory(job, plan)
        except MeshplanError as exc:
            with pytest.raises(type(exc)) as raised:
                memory_fit(job, plan, job.gpu.memory_bytes)
            assert str(raised.value) == str(exc)
            continue
        host = report.host_bytes_per_node
        n = len(report.stages)
        for budget in (report.fit_bytes - 1, report.fit_bytes, job.gpu.memory_bytes, report.fit_bytes // 2):
            for limit in (None, host, host - 1):
                for first in (0, n - 1, n // 2, n):
                    verdict = memory_fit(job, plan, budget, limit, first)
                    fits = report.fit_bytes <= budget and (limit is None or host <= limit)
                    assert verdict.complete == fits, (plan, budget, limit, first)
                    if fits:  # every stage evaluated: the report's own figures, its peak among them (the oracle's)
                        assert (verdict.figure, verdict.host_per_node, verdict.peak, verdict.over) == (
                            report.fit_bytes, host, report.peak_bytes, None)
                    else:  # stopped at a stage over: floors of the report's figures, one of them over
                        assert verdict.figure <= report.fit_bytes and verdict.host_per_node <= host
                        assert 0 < verdict.peak <= report.peak_bytes
                        assert verdict.figure > budget or (limit is not None and verdict.host_per_node > limit)
                        assert 0 <= verdict.over < n
                        over += 1
        checked += 1
    assert checked >= 10 and over > 0


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.model}-{r.framework}")
def test_a_plan_the_structural_rules_pass_needs_no_second_look(req):
    """The search passes `checked` where check_config (structural rules only) found no error on the exact plan: then
    no blocking rule fires (the estimators' require_estimable runs the same rules' errors) and the verdict is the
    same; where it found one, the estimate is refused."""
    passed = refused = 0
    for job, plan in sampled_plans(req, 40, seed=len(req.model) + 1):
        ok = not any(f.severity == "error" for f in check_config(job, plan, include_memory=False).findings)
        try:
            verdict = memory_fit(job, plan, job.gpu.memory_bytes)
        except MeshplanError:
            assert not ok, plan
            refused += 1
            continue
        assert ok, plan
        assert memory_fit(job, plan, job.gpu.memory_bytes, None, 0, True) == verdict
        passed += 1
    assert passed >= 5


def without_fit_path(engine):
    return dataclasses.replace(engine, memory_fit=None)


def answer(rec) -> dict:
    """What a recommendation says, the rationale and every number."""
    return rec.model_dump(mode="json")


@pytest.mark.parametrize("req", [
    Request(model="llama-3.1-70b", num_gpus=16, framework="megatron-core", gpu="h100"),
    Request(model="qwen3-30b-a3b", num_gpus=16, framework="megatron-core", gpu="h100", seq_length=32768),
    Request(model="deepseek-v2-lite", num_gpus=8, framework="torchtitan", gpu="a100-80gb"),
    Request(model="llama-3.1-70b", num_gpus=4, framework="megatron-core", gpu="h100"),  # impossible, on floors
    Request(model="qwen3-30b-a3b", num_gpus=4, gpu="h100", seq_length=32768, global_batch_size=4),
    Request(model="qwen3-8b", num_gpus=4, gpu="h100", seq_length=131072, global_batch_size=4),  # on estimates
    Request(model="llama-3.1-8b", num_gpus=8, gpu="h100", optimizer_offload_fraction=1, cpu_memory_per_node=200),
    Request(model="llama-3.1-70b", num_gpus=16, gpu="h100", headroom=0.4),  # the thinner-headroom probe
], ids=lambda r: f"{r.model}-{r.num_gpus}")
def test_recommend_answers_the_same_with_the_fit_path_as_from_full_reports(req):
    job, _ = search_job(req)
    counted = {"fit": 0, "report": 0}
    engine = default_engine(job.framework)
    fit, memory = engine.memory_fit, engine.memory

    def counting_fit(*args):
        counted["fit"] += 1
        return fit(*args)

    def counting_memory(*args):
        counted["report"] += 1
        return memory(*args)

    fast = dataclasses.replace(engine, memory_fit=counting_fit, memory=counting_memory)
    assert answer(recommend(req, top_k=3, engine=fast)) == answer(recommend(req, top_k=3,
                                                                            engine=without_fit_path(engine)))
    assert counted["fit"] > 0  # the path under test was taken


def test_an_rl_recommendation_is_the_same_with_the_fit_path(monkeypatch):
    from meshplan import api
    from meshplan.search import ranking

    req = Request(model="qwen3-8b", num_gpus=16, framework="verl", job="rl", algorithm="grpo", gpu="h100")
    fast = answer(api.recommend(req, top_k=2))
    monkeypatch.setattr(ranking, "default_engine", lambda framework: without_fit_path(default_engine(framework)))
    assert answer(api.recommend(req, top_k=2)) == fast


def test_a_verdict_at_one_budget_settles_another_only_where_it_can():
    """A search at another budget sharing the caches (the thinner-headroom probe) reads a verdict where it settles its
    own budget and evaluates again where it does not, counting the plan's memory estimate once per job."""
    req = REQUESTS[0]
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    tight = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1, budget_bytes=1 * GIB)
    roomy = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    roomy.caches = tight.caches.shared()
    layouts, _ = enumerate_layouts(job, fixed)
    lay = next(lay for lay in layouts if lay.pp > 1)
    key = (lay, tight.zeros[0], tight.recomputes[-1], 1)
    report = estimate_memory(job, tight.plan(*key))
    assert report.fit_bytes > 1 * GIB and report.fits  # over the tight budget, within the full one
    assert not tight.fit_verdict(key, None)
    assert not tight.caches.verdicts[key].complete and tight.calls["memory"] == 1
    assert roomy.fit_verdict(key, None) and roomy.caches.verdicts[key].complete
    assert roomy.caches.verdicts[key].figure == report.fit_bytes and roomy.calls["memory"] == 0
    assert tight.missed == [key] and tight.near == []  # within capacity: not a near miss once its report is built


@pytest.mark.parametrize("req", [
    Request(model="qwen3-30b-a3b", num_gpus=8, gpu="h100", seq_length=131072, global_batch_size=8),
    Request(model="qwen3-8b", num_gpus=4, gpu="h100", seq_length=131072, global_batch_size=4),
], ids=lambda r: f"{r.model}-{r.num_gpus}")
def test_the_near_misses_of_a_search_are_the_same_from_verdicts_as_from_reports(req):
    """Where nothing fits, `near` (the closest misses the answer names) holds the same plans, figures and order when
    the search settled them by verdicts as when it built every report, with the same estimates counted."""
    from meshplan.search.engine import run_search

    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    fast, _ = run_search(job, fixed, engine, 3, [])
    full, _ = run_search(job, fixed, without_fit_path(engine), 3, [])
    assert fast.caches.verdicts and not full.caches.verdicts
    assert not fast.found and fast.near
    assert [(over, plan, mem.fit_bytes) for over, plan, mem in fast.near] == [
        (over, plan, mem.fit_bytes) for over, plan, mem in full.near]
    assert (fast.memory_calls, fast.rejected) == (full.memory_calls, full.rejected)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.model}-{r.framework}")
def test_stage_fit_reads_the_stage_reports_figures(req):
    """memory_fit reads each stage through memory_stage.stage_fit, the report's figures without the report: its
    total, allocated peak, host bytes and peak moment are stage_memory's, on offloaded, FSDP2-walked and
    expandable-segment jobs alike."""
    checked = 0
    for job, plan in sampled_plans(req, 20, seed=len(req.model) + 1):
        try:
            terms = memory_terms(job, plan, [])
        except MeshplanError:
            continue
        for rank, chunks in enumerate(terms.pipeline.chunks):
            row = stage_memory(terms, rank, chunks)
            stage = row.memory
            assert stage_fit(terms, rank, chunks) == (stage.total_bytes, stage.detail["allocated_peak"],
                                                      stage.host_bytes, row.moment), (plan, rank)
            checked += 1
    assert checked >= 10
