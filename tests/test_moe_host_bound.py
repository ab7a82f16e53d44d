"""An MoE layer's forward no faster than the host issues it: the dispatcher's device-to-host read of the routing
counts leaves the host no lead once per MoE layer forward, so the GPU work between two syncs takes at least the
host's time to launch its kernels (framework card moe_layer_launches, counted from Megatron-Core's code; each at
cards/calibration.yaml grouped_gemm_launch_s): the count, the wait and what full recompute repeats."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.estimate.layer_time import host_wait, layer_time, overlapped_twin
from meshplan.estimate.moe_time import host_bound_forward, layer_launches
from meshplan.estimate.perf import step_terms
from meshplan.estimate.recompute import recompute_time
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

# Megatron-Bridge's Qwen3-30B-A3B performance preset on 8 B200 (Q/K norm, no shared expert, 128 experts, EP8)
Q30 = dict(model="qwen3-30b-a3b", gpu="b200", num_gpus=8, seq_length=4096, global_batch_size=512,
           micro_batch_size=1, framework="megatron-bridge", ep=8, etp=1, dp=8)


def job_plan(**fields):
    return resolve(Request(**{**Q30, **fields}))


def test_the_count_adds_the_card_parts_the_model_and_plan_run():
    job, plan = job_plan(precision="bf16")
    facts = job.card.moe_layer_launches
    base = facts.attention + facts.qk_norm + facts.router + facts.experts
    assert layer_launches(job, plan) == base + facts.dispatcher["alltoall"]
    flex = plan.model_copy(update={"moe_token_dispatcher": "flex"})
    assert layer_launches(job, flex) == base + facts.dispatcher["flex"]


def test_fp8_adds_the_quantized_inputs_at_the_recipes_kernels_and_the_padding():
    bf16 = layer_launches(*job_plan(precision="bf16"))
    job, plan = job_plan(precision="fp8", fp8_recipe="tensorwise")
    facts = job.card.moe_layer_launches
    assert layer_launches(job, plan) == bf16 + facts.fp8_padding + 3 * facts.quantized  # amax, scale, cast each
    job, plan = job_plan(precision="fp8", fp8_recipe="mxfp8")
    assert layer_launches(job, plan) == bf16 + facts.fp8_padding + 1 * facts.quantized


def test_mla_and_a_shared_expert_count_their_own():
    job, plan = job_plan(model="deepseek-v3", num_gpus=64, ep=64, dp=64, precision="bf16")
    facts = job.card.moe_layer_launches
    assert job.model.mla is not None and job.model.moe.shared_expert_ffn_hidden_size > 0
    assert layer_launches(job, plan) == (facts.attention + facts.latent_attention + facts.router
                                         + facts.dispatcher["alltoall"] + facts.experts + facts.shared_expert)


def test_no_count_where_the_card_has_none():
    job, plan = job_plan(precision="bf16", framework="torchtitan")
    assert job.card.moe_layer_launches is None
    assert layer_launches(job, plan) == 0.0
    assert step_terms(job, plan).ctx.layer_launches == 0.0


def test_the_wait_is_the_host_time_beyond_the_gpu_work():
    job, plan = job_plan(precision="fp8", fp8_recipe="tensorwise")
    ctx = step_terms(job, plan).ctx
    host = (ctx.layer_launches + ctx.expert_launches[0]) * ctx.cal.grouped_gemm_launch_s
    assert host_bound_forward(ctx, 0.0) == pytest.approx(host)
    assert host_bound_forward(ctx, host / 4) == pytest.approx(3 * host / 4)
    assert host_bound_forward(ctx, 2 * host) == 0.0


def test_the_forward_all_to_alls_and_the_overlapped_backward_hide_it():
    job, plan = job_plan(precision="bf16")
    ctx = step_terms(job, plan).ctx
    assert ctx.a2a_steady_share == 0.0
    assert host_wait(ctx, 1e-4, 5.0, 0.0) == host_bound_forward(ctx, 1e-4)  # no overlap: the backward hides nothing
    assert host_wait(ctx, 1e-4, 0.0, 4e-4) == host_bound_forward(ctx, 1e-4 + 2e-4)  # half the EP seconds forward
    steady = dataclasses.replace(ctx, a2a_steady_share=0.5)
    assert host_wait(steady, 1e-4, 2e-4, 0.0) == host_bound_forward(ctx, 1e-4 + 1e-4)
    assert host_wait(dataclasses.replace(ctx, layer_launches=0.0), 0.0, 0.0, 0.0) == 0.0


def test_layer_time_adds_the_wait_to_compute_and_full_recompute_repeats_it():
    job, plan = job_plan(precision="fp8", fp8_recipe="tensorwise", micro_batch_size=1)
    ctx = step_terms(job, plan).ctx
    slow = dataclasses.replace(ctx, cal=ctx.cal.with_overrides(grouped_gemm_launch_s=1e-3))
    lt = layer_time(slow, True)
    assert lt.host_fwd > 0.0
    assert lt.compute == pytest.approx(lt.gemm + lt.attention + lt.elementwise + lt.overhead + lt.host_fwd)
    without = dataclasses.replace(lt, host_fwd=0.0)
    assert recompute_time(lt, "full", slow.cal) - recompute_time(without, "full", slow.cal) == pytest.approx(
        lt.host_fwd)
    assert layer_time(slow, False).host_fwd == 0.0  # a dense layer has no dispatcher sync


def test_the_overlapped_twin_works_the_wait_out_as_layer_time_does():
    job, plan = job_plan(precision="bf16", moe_a2a_overlap=True)
    ctx = step_terms(job, plan).ctx
    slow = dataclasses.replace(ctx, cal=ctx.cal.with_overrides(grouped_gemm_launch_s=1e-3))
    plain = layer_time(dataclasses.replace(slow, plan=slow.plan.model_copy(update={"moe_a2a_overlap": False}),
                                           a2a_steady_share=0.0), True)
    twin = overlapped_twin(slow, plain)
    direct = layer_time(slow, True)
    assert twin.host_fwd == pytest.approx(direct.host_fwd) and twin.ep == pytest.approx(direct.ep)
    assert direct.host_fwd < plain.host_fwd  # the other chunk's backward runs beside the forward
