"""stage_time.stage_rows: a plan's stages computed once per distinct stage (uniform layers, no LoRA) are the same
numbers as every stage timed on its own, and alike stages are shared."""

from __future__ import annotations

import pytest

from meshplan.estimate import perf, stage_time
from meshplan.estimate.stage_time import uniform_layers
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
    if uniform_layers(job.model) and job.lora is None:
        assert counted < plan.pp  # the middle stages are one (interleaved: with each rank's own p2p)
    else:
        assert counted == plan.pp


def test_uniform_layers_reads_kinds_and_parameters():
    assert uniform_layers(resolve(Request(model="llama-3.1-70b", gpu="h100", num_gpus=8))[0].model)
    assert not uniform_layers(resolve(Request(model="deepseek-v3", gpu="h100", num_gpus=256))[0].model)  # dense first
