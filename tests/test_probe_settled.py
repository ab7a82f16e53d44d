"""The thinner-headroom probe is left out only where the ranked search's own record proves it would find nothing
(search/impossible.py below_settled): on sampled requests, at several headrooms and with the cutoff recommend uses
and wider ones, a proof is never given where the probe, run anyway, ranks a plan; and the answers recommend gives are
the probe's (Qwen3-30B-A3B on 8 H100 keeps its warning, Llama-3.1-70B on 64 H100 is proven and says nothing)."""

import random

import pytest
from test_search_oracle import sampled_request

from meshplan.core.errors import MeshplanError
from meshplan.schema.request import Request
from meshplan.search import recommend
from meshplan.search.engine import run_search
from meshplan.search.estimators import default_engine
from meshplan.search.impossible import below_settled
from meshplan.search.job import search_job
from meshplan.search.policy import headroom_for, memory_budget, search_comparison
from meshplan.search.space import Fixed


def proof_and_probe(req: Request, widen: float = 1.0) -> tuple[bool, bool] | None:
    """(below_settled, whether the probe ranks a plan) for a request at recommend's cutoff times `widen`; None where
    recommend runs no probe (nothing ranked, no headroom, the search out of its budget) or refuses the request."""
    try:
        job, _ = search_job(req)
        fixed = Fixed.from_request(req, job)
        engine = default_engine(job.framework)
        search, _ = run_search(job, fixed, engine, 5, [], memory_budget(job, headroom_for(req)),
                               recorded=True)
    except MeshplanError:
        return None
    if not search.found or search.stopped_by_budget or search.budget >= job.gpu.memory_bytes:
        return None
    cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain) * widen
    settled = below_settled(job, fixed, engine, search, cutoff)
    probe, _ = run_search(job, fixed, engine, 1, [], job.gpu.memory_bytes, share=search, cutoff=cutoff,
                          counted=False, tallied=False)
    return settled, bool(probe.found) or probe.stopped_by_budget


@pytest.mark.parametrize(("widen", "outcomes"), [(1.0, {True, False}), (1.1, {True, False}), (1.3, {False})])
def test_no_proof_where_the_probe_ranks_a_plan(widen, outcomes):
    """A proof is never given where the probe ranks a plan. At recommend's cutoff and a wider one both outcomes occur
    over the sample; at 1.3 x the cutoff the fastest ranked row (which fits at capacity too) is under it, so every
    probe ranks a plan and none may be proven."""
    seen = set()
    for seed in range(24):
        req, _ = sampled_request(seed)
        headroom = random.Random(seed).choice((0.05, 0.1, 0.3))
        got = proof_and_probe(req.model_copy(update={"headroom": headroom}), widen)
        if got is None:
            continue
        settled, ranked = got
        assert not (settled and ranked), f"seed {seed}: proven empty, but the probe ranks a plan"
        seen.add(settled)
    assert seen == outcomes


def test_the_probe_still_names_a_much_faster_thin_layout():
    """Qwen3-30B-A3B on 8 H100 (tests/test_recommend_policy.py): the probe's plan, so no proof."""
    req = Request(model="qwen3-30b-a3b", num_gpus=8)
    assert proof_and_probe(req) == (False, True)
    assert recommend(req, top_k=2).best_below_headroom is not None


def test_a_proof_leaves_the_answer_as_the_probe_gives_it():
    """Llama-3.1-70B on 64 H100: proven (the probe at full capacity finds nothing at 85% of the best row's time)."""
    req = Request(model="llama-3.1-70b", num_gpus=64, gpu="h100")
    assert proof_and_probe(req) == (True, False)
    rec = recommend(req)
    assert rec.candidates and rec.best_below_headroom is None
