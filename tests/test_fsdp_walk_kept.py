"""The FSDP2 walk's exact shortcuts (estimate/fsdp_walk.py): prefix_sums / suffix_sums give bit for bit the sum() they
stand for, and a walk kept once per search (scope_memo 'fsdp_walks', 'fsdp_layer_units') is the walk worked out alone,
for plans that share a stage's units but differ in what else the walk reads (micro-batches, the batch, recompute)."""

from __future__ import annotations

import random
from itertools import product

import pytest

from meshplan.estimate.fsdp_walk import prefix_sums, suffix_sums
from meshplan.estimate.layer_records import scope_memo, shared_layers
from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def run_lists(seed: int) -> list[list[float]]:
    """Lists of values in runs of equal ones (a stage's uniform layers between an embedding and an output unit), with
    the values whose sums round, 0.0 and -0.0, and ints among floats."""
    rng = random.Random(seed)
    pool = [0.1, 1e9 / 3, 0.0, -0.0, 3, 7.0, 1e6 / 7, 2.0 ** 60 + 1]
    out = []
    for _ in range(300):
        values: list[float] = []
        while len(values) < rng.randint(0, 50):
            values += [rng.choice([*pool, rng.random() * 10 ** rng.randint(0, 12)])] * rng.randint(1, 20)
        out.append(values)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_the_prefix_and_suffix_sums_are_the_sums_bit_for_bit(seed):
    for values in run_lists(seed):
        after, before = suffix_sums(values), prefix_sums(values)
        for k in range(len(values) + 1):
            assert (repr(after[k]), type(after[k])) == (repr(sum(values[k:])), type(sum(values[k:]))), (values, k)
            assert (repr(before[k]), type(before[k])) == (repr(sum(values[:k])), type(sum(values[:k]))), (values, k)


def plans_sharing_units(fields: dict, changes: dict[str, tuple]) -> tuple[object, list]:
    """A job and its plan under every combination of `changes`: fields the walk reads beside the units (the held
    gradients' switch, the schedule's runs) and one it does not read (the dispatcher), so some share a walk."""
    job, plan = resolve(Request(**fields))
    plans = [plan.model_copy(update=dict(zip(changes, values, strict=True))) for values in product(*changes.values())]
    return job, plans


# Stages that walk the same units with the gradient sync deferred or not and one or more schedule runs per step (the
# held gradients and the sharded gradients absent at the peak): a key that left either out would hand one plan
# another's walk (NeMo AutoModel at pp = 2, whose pipeline stage holds its units).
SHARED_UNITS = [
    (dict(model="qwen3-30b-a3b", framework="nemo-automodel", gpu="h100", num_gpus=16, tp=1, pp=2, ep=4, zero_stage=3,
          micro_batch_size=1, global_batch_size=64),
     dict(defer_fsdp_grad_sync=(True, False), pipeline_microbatches=(None, 4, 8),
          moe_token_dispatcher=("alltoall", "allgather"))),
]


@pytest.mark.parametrize("case", range(len(SHARED_UNITS)))
def test_a_walk_kept_by_the_search_is_the_walk_worked_out_alone(case):
    job, plans = plans_sharing_units(*SHARED_UNITS[case])
    alone = [estimate_memory(job, plan).model_dump_json() for plan in plans]
    with shared_layers():  # as inside a search: each plan's walk looked up among the ones before it
        walks = scope_memo("fsdp_walks")
        kept = [estimate_memory(job, plan).model_dump_json() for plan in plans[::-1]]
        assert len(walks) < sum(plan.pp for plan in plans)  # some stages share a walk
    assert kept[::-1] == alone
