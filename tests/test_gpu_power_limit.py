"""A B200 run under a 750 W power limit (torchao's B200 training benchmarks, copied by torchtitan's mxfp8.md as
"8x power limited B200") is its own catalog part, b200-750w, whose peaks are read linearly in board power between
NVIDIA's two ratings of the same Blackwell package (B100 at 700 W, B200 at 1,000 W); the bench scores a row that
states the limit on that part, and a limit the catalog has no part for on the rated part, with a knob saying so.

A test of the bench itself where it reads rows: it imports the bench's modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from layer_time_spy import first_layer_time

from meshplan.estimate.layer_records import LayerTime
from meshplan.knowledge.hardware import get_gpu
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_rows as prow

# NVIDIA's ratings of the Blackwell package: (board W, BF16, FP8, FP32 dense FLOP/s)
B100 = (700, 1.75e15, 3.5e15, 60e12)
B200 = (1000, 2.25e15, 4.5e15, 80e12)


def _at(watts: int, i: int) -> float:
    return B100[i] + (B200[i] - B100[i]) * (watts - B100[0]) / (B200[0] - B100[0])


def test_peaks_are_read_between_the_two_ratings():
    limited, rated = get_gpu("b200-750w"), get_gpu("b200")
    assert (limited.power_limit_w, rated.power_limit_w) == (750, 1000)
    assert rated.bf16_flops == B200[1] and rated.fp8_flops == B200[2] and rated.fp32_flops == B200[3]
    assert limited.bf16_flops == pytest.approx(_at(750, 1), rel=1e-4)
    assert limited.fp8_flops == pytest.approx(_at(750, 2), rel=1e-4)
    assert limited.fp32_flops == pytest.approx(_at(750, 3), rel=1e-3)
    # the same board: a power limit lowers clocks, not SMs, memory or links
    for field in ("arch", "sm_count", "memory_bytes", "hbm_bandwidth", "intra_node_bandwidth", "nvlink_domain",
                  "network_bandwidth", "fp8_recipes", "fp8_any_layout"):
        assert getattr(limited, field) == getattr(rated, field), field
    assert get_gpu("b200-power-limited") is limited


def _layers(gpu: str) -> LayerTime:
    return first_layer_time(Request(model="llama-3-8b", gpu=gpu, num_gpus=8, framework="torchtitan", seq_length=8192,
                                    global_batch_size=8, micro_batch_size=1, recompute="selective"))


def test_the_limited_part_runs_its_gemms_at_its_own_peak():
    rated, limited = _layers("b200"), _layers("b200-750w")
    ratio = B200[1] / get_gpu("b200-750w").bf16_flops
    assert limited.gemm == pytest.approx(rated.gemm * ratio)
    assert limited.attention == pytest.approx(rated.attention * ratio)
    assert limited.elementwise == pytest.approx(rated.elementwise)  # HBM-bound passes: the same memory


@pytest.mark.parametrize(("gpu_type", "key", "knob"), [
    ("B200-180GB (power limited to 750 W)", "b200-750w", False),
    ("B200-180GB, 750W", "b200-750w", False),
    ("B200-180GB", "b200", False),
    ("B200-180GB (1000 W)", "b200", False),
    ("B200-180GB (power limited to 600 W)", "b200", True),
])
def test_the_bench_scores_a_stated_limit_on_its_part(gpu_type, key, knob):
    gpu, capacity, knobs = prow.gpu_for({"gpu_type": gpu_type, "gpu_memory_gb": 180})
    assert gpu == key and capacity == get_gpu("b200").memory_bytes
    assert ("gpu_power_limit" in knobs) is knob
    if knob:
        assert "600 W" in knobs["gpu_power_limit"] and "1000 W" in knobs["gpu_power_limit"]


def test_a_part_without_a_stated_rating_is_taken_as_named():
    """The Grand Teton H100 rows state 500W in their gpu_type; that part's card states no rating, so they stay on it."""
    gpu, _, knobs = prow.gpu_for({"gpu_type": "H100-96GB-HBM2e (500W, Grand Teton)", "gpu_memory_gb": 96})
    assert gpu == "h100-96gb-hbm2e" and not knobs
