"""The pipeline chains the step-time bounds take on an uneven split (search/rank_chains.py) as the search keeps them:
flat tuples per layout shape (flat_stages), each (shape, rate's references) worked out once (light_stages) and read by
stages_bound. Each figure is the same float, to the last bit, as the definition from the ranks' loads: a rank's least
time per token its layers of each kind times the reference's parts (bounds.token_parts), in that order; the earlier
ranks' the same of their summed loads, over vpp; the bound the largest chain of each stages, their least, at most
the cap. The chains' order is free: stages_bound's result reads none of it."""

from __future__ import annotations

from test_search_bounds_hold import uneven_layouts

from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.rank_chains import RankLoad, stages_bound
from meshplan.search.space import Fixed

# MoE jobs whose uneven splits leave light last ranks: dense first layers, MTP, an output layer on its own rank.
JOBS = [(Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100"), 5),
        (Request(model="kimi-k2", num_gpus=256, gpu="h100"), 97)]


def least(load: RankLoad, parts: tuple[float, ...]) -> tuple[float, float, float]:
    dense, moe, dense_rec, moe_rec, head, cp = parts
    return (load.dense * dense + load.moe * moe + load.dense_decoder * dense_rec + load.moe_decoder * moe_rec
            + load.head * head + load.layers * cp, load.moe_layers, float(load.moe))


def defined_light(search, lay, rate) -> tuple | None:
    """light_ranks from the ranks' loads, as the definition has it (each chain's parts from its loads)."""
    ranks = search.last_ranks(lay)
    if ranks is None:
        return None
    _, per_token, exposed, refs = rate
    parts = search.token_parts(refs)
    model = search.job.model
    n_moe = len(model.moe.moe_layers) if model.moe is not None else 0
    light = []
    for last_load, chains in ranks.stages:
        last = least(last_load, parts)
        if (lay.pp * last[0] < per_token or (exposed and lay.pp * last[1] < 1.0)
                or (search.moe_sync_s() and lay.pp * last[2] < n_moe)):
            light.append((last, sorted((*least(load, parts), *(x / lay.vpp for x in least(before, parts)))
                                       for load, before in chains)))
    return tuple(light) or None


def defined_bound(m, pp, vpp, whole, light, weights, cap) -> float:
    """stages_bound from its definition: per stages the largest of m x whole/pp, each chain and the last rank's."""
    w0, w1, w2 = weights
    for (l0, l1, l2), chains in light:
        bound = max([m * whole / pp, (m - 1.0 / vpp) * (w0 * l0 + w1 * l1 + w2 * l2) + whole / vpp]
                    + [m * (w0 * a + w1 * ms + w2 * mo) + w0 * a_b + w1 * ms_b + w2 * mo_b
                       for a, ms, mo, a_b, ms_b, mo_b in chains])
        cap = min(cap, bound)
    return cap


def test_the_kept_chains_are_the_loads_chains_to_the_last_bit():
    """On every stride-th uneven layout of MoE jobs at its seed rate: light_ranks is the definition's (each float
    equal, the chains as a set), and stages_bound its bound at each micro-batch size, weighed as stretch weighs."""
    checked = 0
    for req, stride in JOBS:
        job, _ = search_job(req)
        search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)
        for lay, sizes in uneven_layouts(search, stride):
            rate = search.token_rate(lay, sizes[0], search.recomputes[0])
            kept, defined = search.light_ranks(lay, rate), defined_light(search, lay, rate)
            assert (kept is None) == (defined is None), lay
            if kept is None:
                continue
            assert [(last, sorted(chains)) for last, chains in kept] == list(defined), lay
            for mbs in sizes:
                m, whole, tokens = search.microbatches(lay, mbs), rate[1] * mbs, float(mbs)
                for weights in ((tokens, 0.0, 0.0), (tokens, 0.3 * tokens * rate[2], 1e-4)):
                    cap = whole / lay.pp * (m + lay.bubble_stages())
                    assert stages_bound(m, lay.pp, lay.vpp, whole, kept, weights, cap) == \
                        defined_bound(m, lay.pp, lay.vpp, whole, defined, weights, cap), (lay, mbs, weights)
            checked += 1
    assert checked > 20
