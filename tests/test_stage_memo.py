"""stage_time.stage_once inside a shared_layers scope: a stage's row once per what stage_time reads but its p2p
(stage_key), the same row as stage_time's own for every stage of a scope whichever came before, and with its own
p2p; stage_rows' plans alike in a stage share it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.arithmetic.mesh import Group
from meshplan.estimate import perf, stage_time
from meshplan.estimate.layer_records import shared_layers
from meshplan.estimate.memory_terms import time_rank_parts
from meshplan.estimate.sharding_traffic import ShardingSchedule
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.request import Request

BASE = dict(model="llama-3.1-8b", gpu="h100", num_gpus=32, framework="torchtitan", zero_stage=3, tp=2, pp=4, cp=2)
STAGE = 1  # a middle stage: neither the embedding's nor the head's


def _inputs():
    job, plan = resolve(Request(**BASE))
    return perf.step_terms(job, plan).inputs


def _perturbed(inp):
    """(stage, layers, inputs) with one thing stage_time reads changed at a time (`seen`: each its own); the inputs
    some of them need to move the row (a selective recompute, a layer with CP traffic) are _bases'."""
    layers, tr = inp.pipeline.layers(STAGE), inp.traffic

    def with_inp(**changes):
        return STAGE, layers, replace(inp, seen={}, **changes)

    def with_plan(**changes):
        return with_inp(plan=inp.plan.model_copy(update=changes))

    head = inp.pipeline.head_rank
    return {
        "layers": (STAGE, layers[:-1], inp),
        "first": (0, inp.pipeline.layers(0), inp),
        "head stage": (head, inp.pipeline.layers(head), inp),
        "layer time": with_inp(dense=replace(inp.dense, gemm=inp.dense.gemm * 2)),
        "recompute": with_plan(recompute="full"),
        "tp": with_inp(plan=inp.plan.model_copy(update={"tp": 4}),  # and the rank's parameters it reads through
                       parts=time_rank_parts(inp.job, inp.plan.model_copy(update={"tp": 4}))),
        "host sync": with_inp(host_sync=0.9),
        "sharding schedule": with_inp(sharding=ShardingSchedule(True, True, True, True)),
        "dense group": with_inp(traffic=replace(tr, dense=Group(tr.dense.size * 2, tr.dense.stride), seen={})),
        "links": with_inp(traffic=replace(tr, lk=replace(tr.lk, intra_bw=tr.lk.intra_bw / 4), seen={})),
        "framework": with_inp(job=carry_cards(inp.job.model_copy(update={"framework": "deepspeed"}))),
        "p2p": with_inp(pp_comm=tuple(3 * x for x in inp.pp_comm)),  # not in the key: redone with_p2p
    }


def _bases(inp):
    """(stage, inputs, other inputs) where some inputs are read only beside others: the recompute modules under
    selective recompute, the recomputed layers under full recompute, the CP group with CP traffic per layer (and
    windows that hide each micro-batch's sharding traffic), the head's seconds on its stage."""

    def with_plan(base, **changes):
        return replace(base, seen={}, plan=base.plan.model_copy(update=changes))

    selective = replace(inp, seen={}, plan=inp.plan.model_copy(update={"recompute": "selective"}))
    full = replace(inp, seen={}, plan=inp.plan.model_copy(update={"recompute": "full"}))
    slow = replace(inp.traffic, lk=replace(inp.traffic.lk, intra_bw=inp.traffic.lk.intra_bw / 30), seen={})
    with_cp = replace(inp, seen={}, dense=replace(inp.dense, cp=1e-3, cp_fwd=5e-4), traffic=slow,
                      sharding=ShardingSchedule(True, True, True, True))
    return {
        "recompute modules": (STAGE, selective, replace(selective, seen={}, recompute=inp.recompute._replace(
            selective="core_attention", modules=("core_attn", "mlp")))),
        "recompute layers": (STAGE, full, replace(full, seen={}, plan=full.plan.model_copy(
            update={"recompute_layers": 2, "recompute_method": "block"}))),
        "recompute method": (STAGE, with_plan(full, recompute_layers=2, recompute_method="block"),
                             with_plan(full, recompute_layers=2, recompute_method="uniform")),
        "cp group": (STAGE, with_cp, replace(with_cp, seen={}, plan=inp.plan.model_copy(update={"cp": 16}))),
        "head seconds": (inp.pipeline.head_rank, inp, replace(inp, seen={}, head=inp.head * 3)),
    }


@pytest.mark.parametrize("name", list(_perturbed(_inputs())) + list(_bases(_inputs())))
def test_each_input_it_reads_gives_its_own_row(name):
    inp = _inputs()
    layers = inp.pipeline.layers(STAGE)
    if name in _bases(inp):
        s, inp, other = _bases(inp)[name]
        layers = other_layers = inp.pipeline.layers(s)
        base_s = s
    else:
        base_s = STAGE
        s, other_layers, other = _perturbed(inp)[name]
    base = stage_time.stage_time(base_s, layers, inp)
    alone = stage_time.stage_time(s, other_layers, other)
    assert alone != base  # the input moves the row
    with shared_layers():
        assert stage_time.stage_once(base_s, layers, inp) == base
        assert stage_time.stage_once(s, other_layers, other) == alone  # not the base's entry
        assert stage_time.stage_once(base_s, layers, inp) == base


def test_plans_alike_in_a_stage_share_it(record_calls):
    job, plan = resolve(Request(**BASE))
    interleaved = plan.model_copy(update={"vpp": 2})  # the same layers per rank in two chunks, other p2p
    alone = perf.step_terms(job, interleaved).rows
    computed = record_calls(stage_time, "stage_time")
    with shared_layers():
        perf.step_terms(job, plan)
        first = len(computed)
        assert perf.step_terms(job, interleaved).rows == alone
    assert 0 < first and len(computed) == first
    perf.step_terms(job, plan)  # outside a scope: computed
    assert len(computed) == 2 * first


def test_layers_not_alike_lora_and_muon_are_computed(record_calls):
    computed = record_calls(stage_time, "stage_time")
    cases = [dict(model="deepseek-v3", gpu="h100", num_gpus=1024, tp=2, pp=16, ep=32, etp=1,
                  framework="megatron-core", first_stage_layers=3, last_stage_layers=2),
             dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, pp=4, framework="megatron-bridge", lora_rank=16)]
    for case in cases:
        job, plan = resolve(Request(**case))
        with shared_layers():
            computed.clear()
            perf.step_terms(job, plan)
            once = len(computed)
            perf.step_terms(job, plan)
        assert len(computed) == 2 * once
