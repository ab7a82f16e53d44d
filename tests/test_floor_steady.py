"""The first-stage floor's steady range (search/plans.SearchPlans.steady_floor, issue 23's speed work): where the
floor cannot fall as the micro-batch grows, a micro-batch over the budget settles every larger one of the range
(over_from, all_over), and zero_needs answers exactly as the plain walk over each ZeRO stage's floors, on sampled
layouts of dense, MoE, MLA, long-context, offloaded, expandable-segment and FSDP2 jobs at budgets from tight to full;
below pp micro-batches (m < pp) a MoE floor can fall, so the range leaves it out."""

from __future__ import annotations

import itertools
import random

import pytest
from test_memory_fit import REQUESTS

from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.floors import layout_floor
from meshplan.search.plans import FLOOR_MARGIN
from meshplan.search.space import Fixed, enumerate_layouts

GIB = 1 << 30
CASES = [*REQUESTS, Request(model="deepseek-v3", num_gpus=256, framework="megatron-bridge", gpu="h100"),
         Request(model="kimi-k2", num_gpus=256, gpu="h100")]


def searches(req: Request):
    """The request's job, its layouts, and searches of it at budgets from a quarter of the GPU to all of it."""
    job, _ = search_job(req)
    fixed = Fixed.from_request(req)
    layouts, _ = enumerate_layouts(job, fixed)
    engine = default_engine(job.framework)
    for part in (0.25, 0.5, 0.75, 1.0):
        yield job, layouts, BestFirstSearch.for_job(job, fixed, engine, 1,
                                                    budget_bytes=int(part * job.gpu.memory_bytes))


def plain_needs(search, lay, mbs) -> tuple[int, ...]:
    """zero_needs without the steady range: each ZeRO stage's floors walked one by one."""
    n_r = len(search.recomputes)
    own = lay.own_memory()
    return tuple(next((i for i, r in enumerate(search.recomputes) if search.floor_fits(own, zero, r, mbs)), n_r)
                 if search.states_bound(own, zero) <= search.budget
                 and search.floor_fits(own, zero, search.recomputes[-1], mbs) else n_r for zero in search.zeros)


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_zero_needs_with_the_steady_range_equal_the_plain_walk(req):
    settled = 0
    for _job, layouts, search in searches(req):
        rng = random.Random(len(req.model) + search.budget)
        for lay in rng.sample(layouts, min(60, len(layouts))):
            sizes = list(search.sizes(lay))
            rng.shuffle(sizes)  # any order the queue pops them in
            for mbs in sizes:
                assert search.zero_needs(lay, mbs) == plain_needs(search, lay, mbs), (req, lay, mbs, search.budget)
            settled += len(search.all_over(lay.own_memory()))
    assert settled  # the steady range settled some micro-batches without their floors


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_the_floor_does_not_fall_as_the_micro_batch_grows_in_the_steady_range(req):
    _job, layouts, search = next(searches(req))
    rng = random.Random(7)
    for lay in rng.sample(layouts, min(40, len(layouts))):
        own = lay.own_memory()
        steady = [mbs for mbs in search.sizes(own) if search.steady_floor(own, mbs)]
        for zero in search.zeros:
            for recompute in search.recomputes:
                floors = [search.floor_bytes(own, zero, recompute, mbs) for mbs in steady]
                assert floors == sorted(floors), (req, own, zero, recompute, steady)


def test_below_pp_micro_batches_a_floor_can_fall_so_the_range_leaves_them_out():
    """The in-flight count min(m, pp) = m = local / mbs falls as the micro-batch grows; what a layer saves once per
    micro-batch whatever its tokens then counts fewer times, and the floor can fall (Moonlight-16B-A3B with SkyRL,
    PP8: lower at 256 sequences a micro-batch than at 128)."""
    job, layouts, search = next(searches(REQUESTS[-1]))
    fell = []
    for lay in layouts:
        own = lay.own_memory()
        below = [mbs for mbs in search.sizes(own) if 1 < job.global_batch_size // (mbs * own.dp) < own.pp]
        assert not any(search.steady_floor(own, mbs) for mbs in below)
        for zero in search.zeros:
            for recompute in search.recomputes:
                floors = [search.floor_bytes(own, zero, recompute, mbs) for mbs in below]
                fell += [own for a, b in itertools.pairwise(floors) if b < a]
    assert fell


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_the_layout_floor_is_under_every_micro_batch_and_recompute_floor_to_the_last_bit(req):
    """floors.layout_floor (SearchPlans.layout_over) settles a layout's ZeRO stage at every micro-batch and recompute
    with no margin: it must be at most each first-stage floor exactly, not within a rounding; and where every stage is
    over it, all_over holds every micro-batch, those below the steady range too."""
    whole = 0
    for _job, layouts, search in searches(req):
        rng = random.Random(11 + search.budget)
        for lay in rng.sample(layouts, min(40, len(layouts))):
            own = lay.own_memory()
            for zero in search.zeros:
                low = layout_floor(search.job, own, zero, search.presets[zero], memo=search.floor_parts,
                                   reserved=not search.fixed.carried.get("expandable_segments"))
                assert all(low <= search.floor_bytes(own, zero, recompute, mbs)
                           for recompute in search.recomputes for mbs in search.sizes(own)), (req, own, zero)
            if all(search.layout_over(own, zero) for zero in search.zeros):
                assert search.all_over(own) == frozenset(search.sizes(own))
                whole += 1
    assert whole or req.num_gpus < 256  # on the largest jobs, some layouts settled whole by the layout floor


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_over_from_finds_the_first_micro_batch_a_plain_scan_finds(req):
    """over_from doubles then halves over the steady range instead of a floor per micro-batch: on sampled layouts at
    budgets from tight to full it names the micro-batch the plain ascending scan names."""
    for _job, layouts, search in searches(req):
        limit = search.budget * (1.0 + FLOOR_MARGIN)
        rng = random.Random(13 + search.budget)
        for lay in rng.sample(layouts, min(40, len(layouts))):
            own = lay.own_memory()
            for zero in search.zeros:
                plain = next((mbs for mbs in search.sizes(own) if search.steady_floor(own, mbs)
                              and search.floor_bytes(own, zero, search.recomputes[-1], mbs) > limit), 0)
                assert search.over_from(own, zero) == plain, (req, own, zero, search.budget)
