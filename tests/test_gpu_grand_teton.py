"""The Grand Teton H100 (96 GB HBM2e, 500 W) torchtitan's 2024-12 and 2025-06 benchmarks ran on: its own catalog
part, so those rows are timed at its bandwidth and its (bounded) peak, not the 700 W H100 SXM's."""

from __future__ import annotations

import pytest
from layer_time_spy import first_layer_time

from meshplan.estimate.layer_records import LayerTime
from meshplan.knowledge.hardware import get_gpu
from meshplan.schema.request import Request

NVL_BF16, SXM_BF16 = 835.5e12, 989.4e12  # H100 NVL and H100 SXM dense BF16, the bounds torchtitan's footnote gives


def test_part_reads_the_benchmark_docs_figures():
    gt = get_gpu("H100-96GB-HBM2e")
    assert gt.key == "h100-96gb-hbm2e" and gt.arch == "hopper"
    assert gt.hbm_bandwidth == 2.4e12
    assert NVL_BF16 < gt.bf16_flops < SXM_BF16
    assert gt.bf16_flops == pytest.approx((NVL_BF16 + SXM_BF16) / 2, rel=1e-4)
    assert gt.fp8_flops == pytest.approx((1670.5e12 + 1978.9e12) / 2, rel=1e-4)
    assert gt.memory_bytes == 96 * 2**30 and gt.nvlink_domain == 8
    assert get_gpu("h100-grand-teton") is gt


def _layers(gpu: str) -> LayerTime:
    return first_layer_time(Request(model="llama-3.1-8b", gpu=gpu, num_gpus=8, framework="torchtitan", seq_length=8192,
                                    global_batch_size=16, micro_batch_size=2, recompute="selective"))


def test_layer_time_scales_by_the_parts_own_peak_and_bandwidth():
    """Same job, same kernels: the eager memory-bound passes take 3.35 / 2.4 the H100 SXM's time, the GEMMs and the
    attention 989.4 / 912.4 (every GEMM's efficiency depends on its shape only)."""
    sxm, gt = _layers("h100"), _layers("h100-96gb-hbm2e")
    peak = get_gpu("h100").bf16_flops / get_gpu("h100-96gb-hbm2e").bf16_flops
    assert gt.elementwise == pytest.approx(sxm.elementwise * 3.35e12 / 2.4e12)
    assert gt.attention == pytest.approx(sxm.attention * peak)
    assert gt.gemm == pytest.approx(sxm.gemm * peak)
    assert gt.compute > sxm.compute * peak  # the memory-bound share grows faster than the peak ratio
