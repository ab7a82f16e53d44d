"""sharding_floor.sharding_floor: the least seconds per micro-batch a ZeRO-2/3 / FSDP plan's slowest stage takes for
its sharding traffic, at any recompute (the traffic each micro-batch moves, averaged over the pipeline's ranks); and
the search's use of it (engine.carry): a ZeRO stage whose traffic alone is slower than the ranked plans is never
estimated, and the ranked plans are those of a search without it."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.estimate import perf, stage_time
from meshplan.estimate.sharding_floor import sharding_floor
from meshplan.estimate.sharding_traffic import (
    exposed_by_schedule,
    grad_reduce_bytes,
    param_gather_bytes,
    shard_units,
)
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import default_engine, search_job
from meshplan.search.engine import run_search
from meshplan.search.space import Fixed

LLAMA = dict(model="llama-3.1-70b", gpu="h100", num_gpus=64, zero_stage=3, tp=1, cp=4, pp=1)
# ZeRO-3 / FSDP plans of several frameworks, one stage and pipelines (a mean over the ranks), dense and MoE
PLANS = [
    LLAMA,
    dict(LLAMA, framework="torchtitan"),
    dict(LLAMA, framework="deepspeed", cp=1, tp=4),  # a dense layer's weights gathered one by one
    dict(LLAMA, pp=2, cp=2),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="torchtitan", zero_stage=3, tp=2, pp=1),
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=32, framework="torchtitan", zero_stage=3, ep=4, etp=1),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="deepspeed", zero_stage=2),
]


def test_one_stage_floor_is_the_traffic_its_units_move():
    """One stage holding the whole model: the figure is exposed_sharding of its units with nothing to hide behind
    (every window 0), i.e. every all-gather and reduce-scatter a micro-batch moves."""
    job, plan = resolve(Request(**LLAMA))
    inp = perf.step_terms(job, plan).inputs
    arch = job.model
    layers = inp.pipeline.layers(0)
    stage = stage_time.StageShards(layers, stage_time.stage_kinds(0, layers, inp), {False: (0.0, 0.0)}, True, True)
    prefetch = framework_card(job.framework).zero3_prefetch
    units = shard_units(stage, parts=inp.parts, plan=plan, arch=arch, head=0.0, traffic=inp.traffic,
                        grad_bytes=grad_reduce_bytes(plan, inp.ctx.cal), weight_bytes=param_gather_bytes(job, plan),
                        max_live=prefetch.max_live_parameters if prefetch else None)
    moved = exposed_by_schedule(units, inp.sharding).micro
    assert moved > 0
    assert sharding_floor(job, plan) == pytest.approx(moved, rel=1e-12)


@pytest.mark.parametrize("fields", PLANS, ids=lambda f: f"{f['model']}-{f.get('framework', 'default')}")
def test_floor_is_under_the_slowest_stage_at_every_recompute(fields):
    """m x the figure is at most m x the slowest stage (the step's floor without its once-per-step terms) at every
    recompute, and it reads no recompute."""
    floors = set()
    for recompute in ("none", "selective", "full"):
        job, plan = resolve(Request(**fields, recompute=recompute))
        terms = perf.step_terms(job, plan)
        floor = sharding_floor(job, plan)
        floors.add(floor)
        assert floor > 0
        assert terms.m * floor <= terms.m * terms.rows[terms.worst].total * (1 + 1e-12)
    assert len(floors) == 1


def test_no_traffic_per_micro_batch_no_floor():
    """ZeRO-1 moves its traffic once per step: nothing per micro-batch."""
    job, plan = resolve(Request(**dict(LLAMA, zero_stage=1, tp=8, pp=4, cp=1)))
    assert sharding_floor(job, plan) == 0.0


def _search(engine):
    req = Request(model="llama-3.1-70b", num_gpus=64, gpu="h100")
    job, _ = search_job(req)
    search, _ = run_search(job, Fixed.from_request(req, job), engine, 5, [])
    return search


def test_a_zero_stage_slower_by_its_traffic_alone_is_never_estimated():
    """Llama-3.1-70B on 64 H100: its ZeRO-3 layouts' FSDP gathers per micro-batch make most of them several times
    slower than the ranked plans. None whose sharding bound is over the last ranked plan gets a memory or step
    estimate (without the bound, the NEED, STAIRCASE and STEP levels estimated hundreds); the ranked plans and their
    numbers are those of a search without the bound."""
    engine = default_engine("megatron-core")
    search = _search(engine)
    last = search.found[-1].time
    caches = search.caches
    estimated = set(caches.memory) | set(caches.verdicts) | set(caches.terms) | set(caches.throughput)
    over = [key for key in estimated if search.sharding_bound(key[0], key[1], key[3]) > last * 1.001]
    assert not over
    plain = _search(dataclasses.replace(engine, sharding_floor=None))
    assert [(f.time, f.plan) for f in plain.found] == [(f.time, f.plan) for f in search.found]
    assert plain.evaluations > search.evaluations
    plain_estimated = (set(plain.caches.memory) | set(plain.caches.verdicts) | set(plain.caches.terms)
                       | set(plain.caches.throughput))
    assert sum(search.sharding_bound(key[0], key[1], key[3]) > last * 1.001 for key in plain_estimated) > 100
