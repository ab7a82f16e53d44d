"""stage_time.stage_sharding inside a shared_layers scope: once per what it reads (sharding_key), the same figure as
computed alone for every plan of a scope, whichever plans came before; plans differing only in what it does not read
share it."""

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

BASE = dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="torchtitan", zero_stage=3, tp=2, pp=2)
# each differs from BASE (or from the one before) in one thing the sharding figure reads, or in one it does not
VARIANTS = [
    {},
    dict(pp=4),  # other layers per stage
    dict(pp=4, vpp=2),  # other chunks, same layers per rank: shared
    dict(micro_batch_size=2),  # other windows
    dict(recompute="full"),  # other backward windows
    dict(tp=4),  # other shards, other DP group
    dict(tp=1, pp=1),  # one stage: tied-embedding unit rules
    dict(framework="megatron-core", grad_reduce_in_fp32=True),
    dict(framework="megatron-core", grad_reduce_in_fp32=False),  # other bytes per gradient element
    dict(sequence_parallel=False),
    dict(num_gpus=32),  # other DP group
    dict(framework="megatron-core", pp=2),  # Megatron-FSDP
    dict(framework="deepspeed", pp=1, tp=1),  # ZeRO-3 with its live-parameter limit
    dict(model="qwen3-30b-a3b", num_gpus=32, ep=4, etp=1),  # MoE: the expert-DP group
    dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=32, etp=1, framework="megatron-core",
         first_stage_layers=3, last_stage_layers=2),  # layers not alike: read by index
]


def _jobs():
    return [resolve(Request(**{**BASE, **v})) for v in VARIANTS]


def _sharding(rows):
    return [row.sharding for row in rows]


def test_memoised_figure_is_each_plans_own():
    jobs = _jobs()
    alone = [_sharding(perf.step_terms(job, plan).rows) for job, plan in jobs]
    assert any(any(s.micro or s.step_gather or s.step_reduce for s in figs) for figs in alone)
    with shared_layers():
        for _ in range(2):  # the second pass reads every entry back
            shared = [_sharding(perf.step_terms(job, plan).rows) for job, plan in jobs]
            assert shared == alone


def test_plans_alike_in_what_it_reads_share_one(record_calls):
    computed = record_calls(stage_time, "_stage_sharding")
    one = resolve(Request(**{**BASE, "pp": 4}))
    other = resolve(Request(**{**BASE, "pp": 4, "vpp": 2}))  # the same layers per rank, in two chunks
    with shared_layers():
        perf.step_terms(*one)
        first = len(computed)
        perf.step_terms(*other)
    assert first > 0
    assert len(computed) == first  # every stage of the interleaved plan read back
    computed.clear()
    perf.step_terms(*one)  # outside a scope: computed
    assert len(computed) == first


def test_key_reads_layers_by_index_only_where_they_differ():
    job, plan = resolve(Request(**{**BASE, **VARIANTS[-1]}))
    terms = perf.step_terms(job, plan)
    inp = terms.inputs
    kinds = stage_time.stage_kinds(1, inp.pipeline.layers(1), inp)
    stage = stage_time.StageShards(inp.pipeline.layers(1), kinds, {False: (1.0, 2.0), True: (1.0, 2.0)}, False,
                                   False)
    assert stage_time.sharding_key(stage, inp)[0] == tuple(inp.pipeline.layers(1))
    job, plan = resolve(Request(**BASE))
    inp = perf.step_terms(job, plan).inputs
    stage = stage_time.StageShards(inp.pipeline.layers(1), [False] * len(inp.pipeline.layers(1)),
                                   {False: (1.0, 2.0)}, False, True)
    assert stage_time.sharding_key(stage, inp)[0] == len(inp.pipeline.layers(1))


def _stage_and_inputs(**fields):
    """The head stage of a two-stage FSDP plan, made to expose its traffic (every unit gathered and reduced each
    micro-batch over slow links, short backward windows), so each input below moves the figure; `fields`: the
    request's, changed from BASE."""
    job, plan = resolve(Request(**(BASE | fields)))
    inp = perf.step_terms(job, plan).inputs
    layers = inp.pipeline.layers(1)
    kinds = stage_time.stage_kinds(1, layers, inp)
    windows = {k: (f, b / 2) for k, (f, b) in stage_time.layer_sums(len(layers), kinds, inp).windows.items()}
    traffic = replace(inp.traffic, lk=replace(inp.traffic.lk, intra_bw=inp.traffic.lk.intra_bw / 30), seen={})
    inp = replace(inp, sharding=ShardingSchedule(True, True, True, True), traffic=traffic, seen={},
                  plan=plan.model_copy(update={"fp8_param_gather": True}) if not fields else plan)
    return stage_time.StageShards(layers, kinds, windows, False, True), inp


def _perturbed(st, inp):
    """One input stage_sharding reads changed at a time (`seen`: each StageInputs its own)."""
    tr = inp.traffic

    def with_inp(**changes):
        return st, replace(inp, seen={}, **changes)

    def with_plan(**changes):
        return with_inp(plan=inp.plan.model_copy(update=changes))

    return {
        "windows": (st._replace(windows={k: (f * 2, b) for k, (f, b) in st.windows.items()}), inp),
        "first": (st._replace(first=True), inp),
        "head_stage": (st._replace(head_stage=False), inp),
        "layers": (st._replace(layers=st.layers[:-1], kinds=st.kinds[:-1]), inp),
        "head": with_inp(head=inp.head * 3),
        "dense group": with_inp(traffic=replace(tr, dense=Group(tr.dense.size * 2, tr.dense.stride), seen={})),
        "links": with_inp(traffic=replace(tr, lk=replace(tr.lk, intra_bw=tr.lk.intra_bw / 4), seen={})),
        "schedule": with_inp(sharding=ShardingSchedule(True, True, False, True)),
        "tp": with_inp(plan=inp.plan.model_copy(update={"tp": 4}),  # and the rank's parameters it reads through
                       parts=time_rank_parts(inp.job, inp.plan.model_copy(update={"tp": 4}))),
        "grad_reduce_in_fp32": with_plan(grad_reduce_in_fp32=False),
        "framework": with_inp(job=carry_cards(inp.job.model_copy(update={"framework": "deepspeed"}))),
        "precision": with_inp(job=inp.job.model_copy(update={"precision": "fp8"})),
    }


@pytest.mark.parametrize("name", list(_perturbed(*_stage_and_inputs())))
def test_each_input_it_reads_is_in_the_key(name):
    st, inp = _stage_and_inputs()
    changed_st, changed_inp = _perturbed(st, inp)[name]
    base = stage_time.stage_sharding(st, inp)  # outside a scope: computed
    alone = stage_time.stage_sharding(changed_st, changed_inp)
    assert alone != base  # the input moves the figure
    with shared_layers():
        assert stage_time.stage_sharding(st, inp) == base
        assert stage_time.stage_sharding(changed_st, changed_inp) == alone  # not the base's entry


def test_fp8_param_gather_is_in_the_key():
    st, inp = _stage_and_inputs()
    fp8 = replace(inp, job=inp.job.model_copy(update={"precision": "fp8"}), seen={})
    bf16_gather = replace(fp8, plan=fp8.plan.model_copy(update={"fp8_param_gather": False}), seen={})
    base, alone = stage_time.stage_sharding(st, fp8), stage_time.stage_sharding(st, bf16_gather)
    assert alone != base
    with shared_layers():
        assert stage_time.stage_sharding(st, fp8) == base
        assert stage_time.stage_sharding(st, bf16_gather) == alone


def test_the_fp8_recipe_is_in_the_key():
    """Left out, fp8_param_gather is the framework's default for the recipe (memory_states.fp8_param_gather): on
    Megatron-FSDP under Megatron-Bridge's tensorwise preset the units gather one byte, under blockwise two, so the
    recipe alone moves the figure and the memo keeps them apart."""
    st, tensorwise = _stage_and_inputs(framework="megatron-bridge", tp=1, precision="fp8", fp8_recipe="tensorwise")
    assert tensorwise.plan.fp8_param_gather is None
    blockwise = replace(tensorwise, plan=tensorwise.plan.model_copy(update={"fp8_recipe": "blockwise"}), seen={})
    base, alone = stage_time.stage_sharding(st, tensorwise), stage_time.stage_sharding(st, blockwise)
    assert alone != base
    with shared_layers():
        assert stage_time.stage_sharding(st, tensorwise) == base
        assert stage_time.stage_sharding(st, blockwise) == alone
