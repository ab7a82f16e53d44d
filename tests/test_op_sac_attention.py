"""torchtitan's op-level SAC keeps the outputs of the ops in its save list; before pytorch/torchtitan b39377f9f
(2025-12-01, first in v0.2.1) that list named the flash and efficient SDPA kernels but not cuDNN's, which torchtitan
0.1.x runs on Blackwell. So a 0.1 op-SAC run on a B200 recomputes its attention in the backward and keeps neither the
attention output nor its log-sum-exp (cards/frameworks/torchtitan.yaml recompute.unsaved_attention); 0.2.x and 0.3.0
keep them, as does 0.1 on Hopper (FlashAttention-2)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.knowledge.calibration import attention_fraction, calibration
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.hardware import get_gpu
from meshplan.schema.request import Request

LAYERS, HIDDEN, HEADS, TOKENS = 32, 4096, 32, 8192  # Llama-3-8B, one sequence of 8192 tokens per GPU


def _req(version: str, gpu: str = "b200", **extra) -> Request:
    return Request(model="llama-3-8b", gpu=gpu, num_gpus=8, gpus_per_node=8, seq_length=TOKENS, global_batch_size=8,
                   micro_batch_size=1, framework="torchtitan", zero_stage=3, recompute="selective",
                   selective_ac_option="op", torch_compile=True, framework_version=version, **extra)


@pytest.mark.parametrize(("release", "kernel", "recomputed"), [
    ("0.1.0", "cudnn", True), ("0.1.0", "flash_attn_2", False), ("0.2.2", "cudnn", False),
    ("0.3.0", "cudnn", False), ("0.1.0", None, False),
])
def test_the_card_reads_each_releases_save_list(release, kernel, recomputed):
    assert framework_card("torchtitan").recompute.recomputes_attention(release, kernel) is recomputed


def _layer_bytes(req: Request) -> float:
    return api.estimate_memory(req).stages[0].detail["layer_activations"]


def test_the_attention_output_and_log_sum_exp_are_not_kept():
    """Per layer, the bf16 attention output (tokens x hidden) and the fp32 log-sum-exp (tokens x heads)."""
    unkept = LAYERS * (2 * TOKENS * HIDDEN + 4 * TOKENS * HEADS)
    assert _layer_bytes(_req("0.2")) - _layer_bytes(_req("0.1")) == unkept
    # 0.1 with FlashAttention-2 (Hopper's kernel there, or the flash backend asked for on a B200) keeps them
    assert _layer_bytes(_req("0.1", attention_backend="flash")) == _layer_bytes(_req("0.2", attention_backend="flash"))
    assert _layer_bytes(_req("0.1", gpu="h100")) == _layer_bytes(_req("0.2", gpu="h100"))


def test_the_recompute_runs_the_attention_forward_again():
    """recompute_s grows by each layer's causal attention forward, 2 s^2 h FLOPs, at cuDNN's fraction of peak."""
    cal = calibration("torchtitan")
    fwd = 2 * TOKENS**2 * HIDDEN / (get_gpu("b200").bf16_flops * attention_fraction(cal, "cudnn", "blackwell"))
    old, new = (api.estimate_throughput(_req(v)).breakdown.recompute_s for v in ("0.2", "0.1"))
    assert new - old == pytest.approx(LAYERS * fwd, rel=1e-6)
