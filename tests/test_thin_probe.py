"""The thinner-headroom probe (search/impossible.fastest_below_headroom) reuses the ranked search's estimates and
memos (run_search's `share`); what it answers must be what a search at full capacity with nothing shared answers:
the fastest layout that fits the GPU, at least below_headroom_gain faster than the best ranked one, and over the
ranked budget. Held here on sampled requests with headrooms where it matters (0.2, 0.3), on MoE jobs near capacity,
and on small jobs against the exhaustive oracle at the full capacity; a reuse of a budget-dependent memo fails it."""

import math

import pytest
from test_search_oracle import sampled_request

import meshplan.search.engine as search_engine
from meshplan.core.errors import MeshplanError
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k, ranking
from meshplan.search.engine import run_search
from meshplan.search.impossible import fastest_below_headroom
from meshplan.search.policy import SLOWER, search_comparison
from meshplan.search.ranking import recommend
from meshplan.search.space import within_nvlink

NEAR_CAPACITY = [  # MoE jobs whose fastest layouts fit only with a thin headroom
    (Request(model="qwen3-30b-a3b", num_gpus=8, gpu="h100"), 2),
    (Request(model="qwen3-30b-a3b", num_gpus=8, gpu="h100", headroom=0.3), 2),
    (Request(model="mixtral-8x7b", num_gpus=8, gpu="h100", headroom=0.2), 3),
    (Request(model="deepseek-v2-lite", num_gpus=16, gpu="a100-80gb", framework="megatron-core", headroom=0.3), 2),
    (Request(model="moonlight-16b-a3b", num_gpus=16, gpu="a100-80gb", framework="skyrl", headroom=0.2), 2),
    # (its probe names TP1 EP8 DP8; it keeps the sample's named probes at its share since OLMoE on one B200 with
    # torchtitan names none: its ZeRO 0, faster as DDP in the thin headroom, is fully_shard over one rank on 0.3.0,
    # ZeRO 3's plan)
    (Request(model="qwen3-30b-a3b", num_gpus=8, gpu="h100", headroom=0.2), 2),
]


def headroom_requests(count: int) -> list[tuple[Request, int]]:
    """Sampled requests (tests/test_search_oracle.py's sampler) with the headroom 0.1, 0.2 or 0.3 in turn."""
    return [(req.model_copy(update={"headroom": (0.1, 0.2, 0.3)[seed % 3]}), top_k)
            for seed in range(count) for req, top_k in [sampled_request(seed)]]


def probes(monkeypatch, req: Request, top_k: int):
    """recommend's probe call: (its arguments, its answer), or None where the request is refused up front."""
    seen = []

    def spy(job, fixed, engine, search):
        thin = fastest_below_headroom(job, fixed, engine, search)
        seen.append(((job, fixed, engine, search), thin))
        return thin

    monkeypatch.setattr(ranking, "fastest_below_headroom", spy)
    try:
        recommend(req, top_k=top_k)
    except MeshplanError:
        return None
    finally:
        monkeypatch.undo()
    return seen[0]


def plain_probe(job, fixed, engine, search):
    """The probe's question asked of a fresh search at full capacity: nothing shared with the ranked search."""
    if search.budget >= job.gpu.memory_bytes or search.stopped_by_budget:
        return None
    cutoff = math.inf
    if search.found:
        cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain)
    plain, _ = run_search(job, fixed, engine, 1, [], job.gpu.memory_bytes, cutoff=cutoff)
    if not plain.found or plain.stopped_by_budget:
        return None
    fastest = min(plain.found, key=lambda f: f.time)
    return fastest if fastest.memory.peak_bytes > search.budget else None


def same_answer(thin, plain) -> bool:
    if thin is None or plain is None:
        return thin is plain
    return (thin.plan, thin.time, thin.memory.peak_bytes) == (plain.plan, plain.time, plain.memory.peak_bytes)


def compare(monkeypatch, requests) -> tuple[int, int, list]:
    """Per request the probe against the plain search: (requests compared, probes that named a layout, mismatches)."""
    compared, named, wrong = 0, 0, []
    for req, top_k in requests:
        seen = probes(monkeypatch, req, top_k)
        if seen is None:
            continue
        args, thin = seen
        compared += 1
        named += thin is not None
        if not same_answer(thin, plain_probe(*args)):
            wrong.append(req)
    return compared, named, wrong


@pytest.mark.parametrize("part", range(2))
def test_the_probe_answers_as_a_plain_search_at_full_capacity(monkeypatch, part):
    """In two parts (each a test of its own, which pytest-xdist's workers share): every other request of the 48
    sampled and the near-capacity ones, from the part-th."""
    everyone = headroom_requests(48) + NEAR_CAPACITY
    requests = everyone[part::2]
    compared, named, wrong = compare(monkeypatch, requests)
    assert not wrong, wrong
    # the sample keeps the probe's answers meaningful: at least 40 compared and 10 named in all, each part holding its
    # share of those, so the parts together hold them too
    share = len(requests) / len(everyone)
    assert compared >= 40 * share and named >= 10 * share, (compared, named)


def test_a_search_whose_counts_are_unread_finds_the_same_without_counting(monkeypatch):
    """The probe reads only what its search ranks, so that search skips the counts (run_search tallied=False: the dead
    seeds are not settled, the queue not drained): on the requests where the probe searches, it ranks the same plans
    and stops the same way as the same search counting, and counts none of what it left behind."""
    compared = left = 0
    for req, top_k in headroom_requests(12) + NEAR_CAPACITY:
        seen = probes(monkeypatch, req, top_k)
        if seen is None:
            continue
        (job, fixed, engine, search), _ = seen
        if search.budget >= job.gpu.memory_bytes or search.stopped_by_budget:
            continue
        cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain) \
            if search.found else math.inf
        counting, _ = run_search(job, fixed, engine, 1, [], job.gpu.memory_bytes, share=search, cutoff=cutoff)
        quiet, _ = run_search(job, fixed, engine, 1, [], job.gpu.memory_bytes, share=search, cutoff=cutoff,
                              tallied=False)
        assert [(f.plan, f.time, f.memory.peak_bytes) for f in quiet.found] == \
            [(f.plan, f.time, f.memory.peak_bytes) for f in counting.found], req
        assert quiet.stopped_by_budget == counting.stopped_by_budget, req
        assert quiet.rejected[SLOWER] == 0 and not quiet.heap and not quiet.dead and not quiet.beyond_cutoff, req
        compared += 1
        left += counting.rejected[SLOWER] > 0
    assert compared >= 8 and left >= 4  # and on several, the counting search had plans left to count


def test_a_budget_dependent_memo_shared_with_the_probe_is_caught(monkeypatch):
    """The comparison above is not vacuous: a probe that kept the ranked search's floor verdicts (zero_needs' memo,
    one of the headroom's budget, not of the full capacity) names other layouts, or none, on several of the same
    requests."""
    real_for_job = search_engine.BestFirstSearch.for_job.__func__
    mismatches = 0
    for req, top_k in headroom_requests(24):
        seen = probes(monkeypatch, req, top_k)
        if seen is None:
            continue
        args, _ = seen
        ranked = args[3]

        def leaky(cls, *a, _ranked=ranked, **k):
            search = real_for_job(cls, *a, **k)
            search.floor_needs = _ranked.floor_needs
            return search

        monkeypatch.setattr(search_engine.BestFirstSearch, "for_job", classmethod(leaky))
        leaked = fastest_below_headroom(*args)
        monkeypatch.undo()
        mismatches += not same_answer(leaked, plain_probe(*args))
    assert mismatches >= 3


@pytest.mark.parametrize("seed", [7, 8, 16, 17, 19, 20, 22, 23, 26, 42, 0, 1, 2, 4])
def test_the_probe_finds_the_oracles_fastest_at_full_capacity(monkeypatch, seed):
    """Against the exhaustive oracle at headroom 0 (every plan inside the NVLink domain estimated): where the oracle's
    fastest is under the probe's cutoff, the probe names a layout of that step time, or none only where every layout
    of that time keeps the headroom; where none is under it, the probe names none inside the domain. The seeds are
    the sample's requests where the probe names a layout, and four where it names none."""
    req, top_k = headroom_requests(seed + 1)[seed]
    seen = probes(monkeypatch, req, top_k)
    if seen is None:
        return
    (job, _, _, search), thin = seen
    if search.budget >= job.gpu.memory_bytes:
        assert thin is None
        return
    cutoff = math.inf
    if search.found:
        cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain)
    rows = exhaustive_top_k(req.model_copy(update={"headroom": 0.0}), 100)
    under = [r for r in rows if r.step_time_s <= cutoff]
    if not under:
        assert thin is None or not within_nvlink(job, thin.plan), (seed, req)
        return
    best = under[0].step_time_s
    if thin is not None:
        assert thin.time == pytest.approx(best, rel=1e-12), (seed, req)
    else:
        ties = [r for r in under if r.step_time_s == pytest.approx(best, rel=1e-12)]
        assert all(r.peak_bytes <= search.budget for r in ties), (seed, req)
