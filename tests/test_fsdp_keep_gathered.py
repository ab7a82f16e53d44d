"""NeMo AutoModel's model.backend.enable_fsdp_optimizations (the job's fsdp_keep_gathered): without PP its MoE models'
MoEFSDPSyncMixin turns resharding after backward and the gradient sync off for every micro-batch but the last
(components/moe/fsdp_mixin.py), so each unit stays gathered from its first backward to the end of the step, as a
pipeline stage's do (cards/frameworks/nemo-automodel.yaml grad_accumulation keep_knob): the next forward gathers
nothing, the backward (zero_stage 3: resharded after each forward) gathers again, the memory walks the units held."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import keeps_units, pipeline_held
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory_terms import time_rank_parts
from meshplan.estimate.sharding_traffic import ShardUnit, exposed_by_schedule, exposed_sharding, sharding_schedule
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

# 8 micro-batches per step (256 over 16 data ranks at micro-batch 2)
MOE = dict(framework="nemo-automodel", model="qwen3-30b-a3b", num_gpus=16, gpu="h100", ep=8, micro_batch_size=2,
           global_batch_size=256, seq_length=4096, zero_stage=3, recompute="full")


def test_the_forward_gathers_once_per_step_and_the_backward_every_micro_batch():
    job, plan = resolve(Request(**MOE, fsdp_keep_gathered=True))
    assert job.fsdp_keep_gathered and keeps_units(job, plan)
    sched = sharding_schedule(job, plan)
    assert (sched.gather_each_microbatch, sched.regathered, sched.reduce_each_microbatch) == (False, True, False)
    plain = sharding_schedule(*resolve(Request(**MOE)))
    assert (plain.gather_each_microbatch, plain.regathered) == (True, True)
    layers = [ShardUnit(count=3, gather=2.0, reduce=3.0, fwd=1.0, bwd=4.0)]
    kept = exposed_by_schedule(layers, sched)
    # per micro-batch the backward's gathers alone (2: the first, then hidden); the forward's (4) once per step
    assert kept.micro == pytest.approx(exposed_sharding(layers, False, True, False))
    assert kept.step_gather == pytest.approx(exposed_sharding(layers, True, False, False))
    assert exposed_by_schedule(layers, plain).micro == pytest.approx(exposed_sharding(layers, True, True, False))


def test_it_moves_less_traffic_per_step():
    fast = api.estimate_throughput(Request(**MOE, fsdp_keep_gathered=True))
    slow = api.estimate_throughput(Request(**MOE))
    assert fast.breakdown.dp_comm_s < slow.breakdown.dp_comm_s
    assert fast.step_time_s < slow.step_time_s


def test_the_memory_holds_the_units_as_a_pipeline_stage_does():
    """Every unit of the rank gathered (bf16) at a middle micro-batch's backward, beside the held fp32 gradients: at a
    short sequence (the activations small) the peak rises by nearly the rank's whole unsharded parameters, less the
    few units the plain walk already holds gathered at its peak."""
    short = {**MOE, "micro_batch_size": 1, "global_batch_size": 128, "seq_length": 1024}
    job, plan = resolve(Request(**short, fsdp_keep_gathered=True))
    assert pipeline_held(job.card, plan.pp, keeps_units(job, plan))
    plain_job, plain_plan = resolve(Request(**short))
    assert not pipeline_held(plain_job.card, plain_plan.pp, keeps_units(plain_job, plain_plan))
    dense, experts = time_rank_parts(job, plan).held(range(job.model.num_layers), first=True, last=True, mtp=False)
    gathered = 2.0 * (dense + experts)  # bf16
    rise = (api.estimate_memory(Request(**short, fsdp_keep_gathered=True)).peak_bytes
            - api.estimate_memory(Request(**short)).peak_bytes)
    assert 0.75 * gathered < rise <= gathered


def test_one_micro_batch_changes_nothing():
    job, plan = resolve(Request(**{**MOE, "global_batch_size": 32}, fsdp_keep_gathered=True))
    assert not keeps_units(job, plan)
    assert sharding_schedule(job, plan) == sharding_schedule(*resolve(Request(**{**MOE, "global_batch_size": 32})))


@pytest.mark.parametrize(("fields", "words"), [
    (dict(framework="torchtitan"), "has no such setting"),
    (dict(model="llama-3.1-8b", ep=1), "dense model"),
    (dict(zero_stage=2), "zero_stage=2"),
    (dict(defer_fsdp_grad_sync=False), "defer_fsdp_grad_sync=false"),
])
def test_what_it_does_not_model_is_refused(fields, words):
    with pytest.raises(MeshplanError, match=words):
        resolve(Request(**{**MOE, **fields}, fsdp_keep_gathered=True))


def test_render_writes_it_and_the_reader_reads_it():
    text = api.render_config("nemo-automodel", Request(**MOE, fsdp_keep_gathered=True)).text
    assert "enable_fsdp_optimizations: true" in text
    assert api.import_config(text, path="r.yaml", framework="nemo-automodel").request["fsdp_keep_gathered"] is True
    assert "enable_fsdp_optimizations" not in api.render_config("nemo-automodel", Request(**MOE)).text
