"""The floor of a plan's once-per-step DP term (estimate/sync_floor.py), which the search adds to its pipeline bounds:
never over the estimate's own term, less the share of the first rank's compute that may hide it; exact where nothing
hides it; none for LoRA (issue 23: the search's bounds must never over-count)."""

from __future__ import annotations

import math
import random

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import stage_layers, step_terms
from meshplan.estimate.sync_floor import StageSync, SyncFloor, sync_floor, synced_keys, unraised_from
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search import search_job

JOBS = [
    (Request(model="llama-3.1-70b", num_gpus=64, gpu="h100", framework="megatron-core"),
     [dict(tp=8, pp=1, dp=8), dict(tp=4, pp=4, dp=4), dict(tp=8, pp=2, vpp=5, dp=4), dict(tp=2, pp=2, cp=2, dp=8)]),
    (Request(model="deepseek-v3", num_gpus=1024, gpu="h100", framework="megatron-bridge"),
     [dict(tp=2, pp=8, ep=64, dp=64), dict(tp=2, pp=4, vpp=8, cp=2, ep=32, etp=2, dp=64)]),
    (Request(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="torchtitan"),
     [dict(tp=1, pp=1, dp=16), dict(tp=2, pp=2, dp=4)]),
    (Request(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="deepspeed"),
     [dict(tp=1, pp=1, dp=16), dict(tp=2, pp=1, dp=8)]),
    (Request(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="nanotron"),
     [dict(tp=1, pp=1, dp=16), dict(tp=2, pp=2, dp=4)]),
]


def cases():
    for req, grids in JOBS:
        for grid in grids:
            for zero in (0, 1, 2, 3):
                for recompute in ("none", "full"):
                    yield req, Plan(**grid, zero_stage=zero, recompute=recompute, micro_batch_size=1,
                                    sequence_parallel=grid["tp"] > 1)


def test_the_dp_floor_is_under_the_estimates_dp_term_less_what_the_first_rank_hides():
    """exposed DP term >= seconds - hidden x (the first rank's compute + recompute per micro-batch), on dense and MoE
    jobs of five frameworks at every ZeRO stage (all-reduce, reduce-scatter and all-gather, FSDP, nanotron's
    all-reduce after the backward), with pipelines, virtual stages, CP and EP; and the floor is not empty."""
    checked = positive = 0
    for req, plan in cases():
        job, _ = search_job(req)
        try:
            terms = step_terms(job, plan)
        except MeshplanError:  # a rule refuses the plan: no estimate to stand under
            continue
        floor = sync_floor(job, plan, stage_layers(job, plan).layers(0))
        first = terms.rows[0]
        least = floor.seconds - floor.hidden * (first.compute + first.recompute)
        assert least <= terms.dp_exposed * (1.0 + 1e-9) + 1e-15, (req.framework, plan, floor, terms.dp_exposed)
        checked += 1
        positive += least > 0.0
    assert checked > 60 and positive > 10


def test_the_dp_floor_is_the_dp_term_where_nothing_hides_it():
    """nanotron's ZeRO-1 all-reduces the gradients after the backward and gathers the parameters after the step
    (zero_grad_overlap and param_gather_overlap 0, cards/calibration.yaml): on one stage the floor is the estimate's
    DP term itself."""
    job, _ = search_job(Request(model="llama-3.1-8b", num_gpus=16, gpu="h100", framework="nanotron"))
    plan = Plan(tp=1, pp=1, dp=16, zero_stage=1, micro_batch_size=1)
    terms = step_terms(job, plan)
    floor = sync_floor(job, plan, stage_layers(job, plan).layers(0))
    assert floor.hidden == 0.0 and terms.dp_exposed > 0.0
    assert floor.seconds == pytest.approx(terms.dp_exposed, rel=1e-12)


def test_no_dp_floor_for_lora():
    """A LoRA job reduces its adapters' gradients, not the layers': no floor from the layers' parameters."""
    job, _ = search_job(Request(model="llama-3.1-8b", num_gpus=8, gpu="h100", framework="megatron-bridge",
                                lora_rank=16))
    plan = Plan(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    assert sync_floor(job, plan, stage_layers(job, plan).layers(0)) == SyncFloor()


def test_a_key_at_or_over_its_unraised_floor_is_kept_and_the_rest_raised_as_without_it():
    """unraised_from: a pipeline bound at or over its micro-batch count's floor is one some ZeRO stage raises nothing
    (synced_keys without the floor gives it back to the last bit), one well under it is raised by every stage, and
    synced_keys given the floors gives every key it gives without them; a stage whose DP traffic nothing hides
    (hidden 0) raises every key, so it sets no floor."""
    rng = random.Random(23)
    checked = kept = 0
    for _ in range(300):
        syncs = tuple(StageSync(rng.choice((0.0, rng.uniform(0.0, 0.05))), rng.choice((0.0, rng.uniform(0.0, 2.0))),
                                rng.choice((0.0, rng.uniform(0.01, 0.5)))) for _ in range(rng.randint(1, 4)))
        ms = [rng.choice((1, 2, 3, 8, 31, 64)) for _ in range(5)]
        floors = unraised_from(ms, syncs)
        for m, floor in zip(ms, floors, strict=True):
            if all(seconds > 0.0 and hidden <= 0.0 for _, seconds, hidden in syncs):
                assert floor == math.inf
            if math.isfinite(floor):
                assert synced_keys([floor], [m], syncs) == [floor]
                if floor > 0.0:  # (a floor is where some stage stops raising: a key well under it, every one does)
                    assert synced_keys([floor * 0.99], [m], syncs)[0] > floor * 0.99
        pipes = [rng.choice((0.0, rng.uniform(0.0, 10.0), floor, math.nextafter(floor, 0.0) if floor > 0.0 else 0.0))
                 if math.isfinite(floor) else rng.uniform(0.0, 10.0) for floor in floors]
        assert synced_keys(pipes, ms, syncs, False, floors) == synced_keys(pipes, ms, syncs)
        checked += len(pipes)
        kept += sum(pipe >= floor for pipe, floor in zip(pipes, floors, strict=True))
    assert checked == 1500 and kept > 200
