"""The attention kernel a published run used, where the framework card it is scored with would pick another:
perf.estimate_throughput(attention_kernel=...), the Triton FlashAttention entry, and LLM Foundry's rows reading it."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.flops import Shard, attention_core_flops
from meshplan.core.errors import MeshplanError
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import attention_fraction, calibration
from meshplan.knowledge.published_runs import attention_kernel_of_run
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _job(gpu: str):
    return resolve(Request(model="llama-3.1-8b", gpu=gpu, num_gpus=8, framework="torchtitan", seq_length=32768,
                           global_batch_size=8, micro_batch_size=1, recompute="full"))


def test_triton_fraction_is_fa2s_over_its_measured_margin():
    """FA2 paper section 4.1: FA2 ~1.4x Triton's speed forward, 2x backward; a training step is 1 + 2.5 forward
    units, so Triton takes (1.4 + 2.5 x 2) / 3.5 of FA2's time."""
    cal = calibration()
    margin = (1.4 + 2.5 * 2.0) / 3.5
    assert attention_fraction(cal, "triton_flash_attn", "hopper") == 0.19 == round(0.35 / margin, 2)
    assert attention_fraction(cal, "triton_flash_attn", "ampere") == 0.27 == round(
        cal.attention_peak_fraction / margin, 2)


def test_override_times_attention_at_that_kernel_exactly():
    job, plan = _job("h100")
    cal = calibration("torchtitan")
    card_kernel, card_fraction = attention_efficiency(job, cal)
    assert card_kernel == "cudnn" and attention_efficiency(job, cal, "triton_flash_attn") == ("triton_flash_attn", 0.19)
    fwd = attention_core_flops(job.model, Shard(tokens=32768, tp=1, ep=1, etp=1, sp=False), 32768)
    per_layer = 3.5 * fwd / job.gpu.bf16_flops
    card = estimate_throughput(job, plan)
    run = estimate_throughput(job, plan, attention_kernel="triton_flash_attn")
    layers = job.model.num_layers
    assert run.breakdown.compute_s - card.breakdown.compute_s == pytest.approx(
        layers * per_layer * (1 / 0.19 - 1 / card_fraction))
    assert run.breakdown.recompute_s - card.breakdown.recompute_s == pytest.approx(  # full recompute: one forward
        layers * per_layer / 3.5 * (1 / 0.19 - 1 / card_fraction))
    assert any("triton_flash_attn" in a and "0.19" in a for a in run.assumptions)
    assert estimate_throughput(job, plan, attention_kernel="cudnn").step_time_s == pytest.approx(card.step_time_s)


def test_unknown_kernel_is_refused_with_the_table():
    job, plan = _job("a100")
    with pytest.raises(MeshplanError, match="attention_kernels"):
        estimate_throughput(job, plan, attention_kernel="flash_attn_9")


def test_llm_foundry_benchmark_rows_ran_triton():
    foundry = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
    titan = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
    assert attention_kernel_of_run(foundry) == "triton_flash_attn"
    assert attention_kernel_of_run(titan) is None
