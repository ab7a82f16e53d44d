"""stage_time.stage_rows: a plan's stages computed once per distinct stage (uniform layers, or layers alike within
each kind; no LoRA) are the same numbers as every stage timed on its own, and alike stages are shared."""

from __future__ import annotations

import pytest

from meshplan.estimate import perf, stage_time
from meshplan.estimate.stage_time import kinds_alike, uniform_layers
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CASES = [
    dict(model="llama-3.1-70b", gpu="h100", num_gpus=64, tp=4, pp=8, vpp=2, framework="megatron-core"),
    dict(model="llama-3.1-70b", gpu="h100", num_gpus=64, tp=8, pp=4, framework="megatron-core",
         first_stage_layers=18, last_stage_layers=18, recompute="full", recompute_layers=2,
         recompute_method="block"),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=1, pp=4, framework="torchtitan", zero_stage=3),
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=32, tp=2, pp=4, ep=4, etp=1, framework="megatron-core"),
    dict(model="deepseek-v3", gpu="h100", num_gpus=1024, tp=2, pp=16, ep=32, etp=1, framework="megatron-core",
         first_stage_layers=3, last_stage_layers=2),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, pp=4, framework="megatron-bridge", lora_rank=16),
    dict(model="llama-3.1-70b", gpu="h100", num_gpus=64, tp=8, pp=8, framework="nanotron"),  # per-layer p2p sync
]


def one_by_one(inputs):
    return [stage_time.stage_time(s, inputs.pipeline.layers(s), inputs) for s in range(inputs.plan.pp)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-pp{c['pp']}-{c['framework']}")
def test_shared_stages_are_each_stage_timed_alone(case, record_calls):
    job, plan = resolve(Request(**case))
    timed = record_calls(stage_time, "stage_time")
    terms = perf.step_terms(job, plan)
    counted = len(timed)
    assert terms.rows == one_by_one(terms.inputs)
    if (uniform_layers(job.model) or kinds_alike(terms.inputs.parts, job.model)) and job.lora is None:
        assert counted < plan.pp  # the middle stages are one (interleaved: with each rank's own p2p)
    else:
        assert counted == plan.pp


def test_uniform_layers_reads_kinds_and_parameters():
    assert uniform_layers(resolve(Request(model="llama-3.1-70b", gpu="h100", num_gpus=8))[0].model)
    assert not uniform_layers(resolve(Request(model="deepseek-v3", gpu="h100", num_gpus=256))[0].model)  # dense first


def test_kinds_alike_reads_each_kinds_parameter_rows():
    """DeepSeek-V3's layers are not uniform (three dense, then MoE) but alike within each kind, as the rank's
    parameter table has them (both of its TP cuts of the MoE block); a table whose MoE layers differ is not."""
    from meshplan.estimate.memory_terms import param_table_for

    job, plan = resolve(Request(model="deepseek-v3", gpu="h100", num_gpus=256))
    parts = perf.time_rank_parts(job, plan)
    assert not uniform_layers(job.model) and kinds_alike(parts, job.model)
    whole = parts._replace(table=param_table_for(job.model, True))
    assert whole.table is not parts.table and kinds_alike(whole, job.model)

    class Table:  # the same rows but the last MoE layer's experts
        tp_sharded, replicated, experts = parts.table.tp_sharded, parts.table.replicated, list(parts.table.experts)

    odd = Table()
    odd.experts[-1] += 1
    assert not kinds_alike(parts._replace(table=odd), job.model)
