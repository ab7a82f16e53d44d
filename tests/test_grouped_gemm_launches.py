"""The routed experts' grouped GEMM no faster than the host launches it (Transformer Engine GroupedLinear: one cuBLAS
GEMM per local expert and pass, and per-expert FP8 quantize kernels; framework card grouped_gemm_launches,
cards/calibration.yaml grouped_gemm_launch_s): the launch counts, the floor, and what it leaves in the step."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.arithmetic.gemm import gemm_terms
from meshplan.estimate.layer_time import layer_gemms, layer_time
from meshplan.estimate.moe_time import backward_launch_wait, expert_launch_floor, expert_launches
from meshplan.estimate.perf import estimate_throughput, step_terms
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

# Megatron-Bridge's Qwen3-30B-A3B performance preset on 8 B200 (128 experts, EP8: 16 local experts)
Q30 = dict(model="qwen3-30b-a3b", gpu="b200", num_gpus=8, seq_length=4096, global_batch_size=512,
           micro_batch_size=1, framework="megatron-bridge", ep=8, etp=1, dp=8)


def job_plan(**fields):
    return resolve(Request(**{**Q30, **fields}))


@pytest.mark.parametrize("fields,per_expert", [
    (dict(precision="bf16"), (2, 4)),  # fc1 and fc2: forward; data and weight gradients: backward
    (dict(precision="fp8", fp8_recipe="tensorwise"), (2 + 2 * 3, 4 + 2 * 3)),  # amax, scale, cast per tensor
    (dict(precision="fp8", fp8_recipe="mxfp8"), (2 + 2, 4 + 2)),  # one quantize kernel per tensor
    (dict(precision="fp8", fp8_recipe="delayed"), (2, 4)),  # one fused cast for every expert
])
def test_launches_per_local_expert(fields, per_expert):
    job, plan = job_plan(**fields)
    local = job.model.moe.num_experts / plan.ep
    assert local == 16
    assert expert_launches(job, plan) == (local * per_expert[0], local * per_expert[1])


def test_more_expert_parallelism_fewer_launches():
    job, plan = job_plan(precision="bf16")
    wide = plan.model_copy(update={"ep": 64, "dp": 64})
    assert expert_launches(job, wide) == tuple(n * 8 / 64 for n in expert_launches(job, plan))


def test_a_grouped_gemm_of_one_kernel_has_no_floor():
    job, plan = job_plan(precision="bf16", framework="torchtitan")
    assert job.card.grouped_gemm_launches is None
    assert expert_launches(job, plan) == (0.0, 0.0)


def test_the_forward_takes_the_longer_of_its_gpu_time_and_its_launches():
    job, plan = job_plan(precision="fp8", fp8_recipe="tensorwise")
    ctx = step_terms(job, plan).ctx
    launch = ctx.cal.grouped_gemm_launch_s
    fwd, _ = ctx.expert_launches
    assert fwd == 16 * 8
    # a forward under its launches: floored to them, the backward's two thirds kept
    gpu = 3 * 0.5 * fwd * launch
    total, forward = expert_launch_floor(ctx, gpu)
    assert total == pytest.approx(fwd * launch + 2 * gpu / 3) and forward == pytest.approx(fwd * launch)
    assert total - forward == pytest.approx(2 * gpu / 3)  # the one split layer_time reads, no 2/3 of its own
    # a forward over them: unchanged, a third of it forward
    big = 3 * 2 * fwd * launch
    assert expert_launch_floor(ctx, big) == (big, big / 3)


def test_the_backward_waits_only_for_what_its_other_work_does_not_hide():
    job, plan = job_plan(precision="bf16")
    ctx = step_terms(job, plan).ctx
    launches = ctx.expert_launches[1] * ctx.cal.grouped_gemm_launch_s
    assert backward_launch_wait(ctx, 0.0) == pytest.approx(launches)
    assert backward_launch_wait(ctx, launches / 4) == pytest.approx(3 * launches / 4)
    assert backward_launch_wait(ctx, 2 * launches) == 0.0


def expert_forward(ctx) -> float:
    """The forward seconds of the routed experts' GEMMs on the GPU (a third of their three passes)."""
    gemms = layer_gemms(ctx, True)
    terms = gemm_terms(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    return sum(t for g, t in zip(gemms, terms, strict=True) if g.name.startswith("expert_")) / 3


def test_the_moe_layer_gemm_time_gains_what_the_floor_adds():
    job, plan = job_plan(precision="fp8", fp8_recipe="mxfp8")
    ctx = step_terms(job, plan).ctx
    floored = layer_time(ctx, True)
    plain = layer_time(dataclasses.replace(ctx, expert_launches=(0.0, 0.0)), True)
    launch = ctx.cal.grouped_gemm_launch_s
    # 16 experts' 4 forward launches (1.9 ms) over micro-batch 1's forward expert GEMMs (0.2 ms)
    assert expert_forward(ctx) < ctx.expert_launches[0] * launch
    assert floored.fwd_compute - plain.fwd_compute == pytest.approx(
        ctx.expert_launches[0] * launch - expert_forward(ctx), rel=1e-9)
    backward = plain.gemm + plain.attention + plain.elementwise - plain.fwd_compute
    wait = backward_launch_wait(ctx, backward)
    assert floored.gemm - plain.gemm == pytest.approx(floored.fwd_compute - plain.fwd_compute + wait)
    dense = layer_time(ctx, False)
    assert dense.gemm == layer_time(dataclasses.replace(ctx, expert_launches=(0.0, 0.0)), False).gemm


def test_the_step_slows_by_the_launches_at_small_micro_batches():
    job, plan = job_plan(precision="fp8", fp8_recipe="mxfp8")
    cal = calibration(job.framework)
    with_floor = estimate_throughput(job, plan, cal).step_time_s
    without = estimate_throughput(job, plan, cal.with_overrides(grouped_gemm_launch_s=0.0)).step_time_s
    assert with_floor > without
    # micro-batch 4 puts four times the rows under the same launches: the floor weighs less per token
    job4, plan4 = job_plan(precision="fp8", fp8_recipe="mxfp8", micro_batch_size=4)
    with4 = estimate_throughput(job4, plan4, cal).step_time_s
    without4 = estimate_throughput(job4, plan4, cal.with_overrides(grouped_gemm_launch_s=0.0)).step_time_s
    assert with4 / without4 < with_floor / without


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_rl_megatron_engines_launch_as_megatron_core_and_their_fsdp_engines_do_not(framework):
    """verl's and SkyRL's Megatron engines build Megatron-Core's TEGroupedMLP (their cards' grouped_gemm_launches,
    engines [megatron]); their FSDP engines train transformers' MoE block, which the counts do not cover."""
    common = dict(Q30, gpu="h100", precision="fp8", fp8_recipe="tensorwise")
    core_job, core_plan = job_plan(**{**common, "framework": "megatron-core", "zero_stage": 1})
    job, plan = job_plan(**{**common, "framework": framework, "zero_stage": 1})
    assert job.card.engine.by_zero_stage[plan.zero_stage] == "megatron"
    assert expert_launches(job, plan) == expert_launches(core_job, core_plan) == (16 * 8, 16 * 10)
    fsdp = {k: v for k, v in common.items() if k not in ("ep", "etp")}
    job3, plan3 = job_plan(**{**fsdp, "framework": framework, "zero_stage": 3, "ep": 1, "etp": None})
    assert job3.card.engine.by_zero_stage[plan3.zero_stage] == "fsdp"
    assert expert_launches(job3, plan3) == (0.0, 0.0)
