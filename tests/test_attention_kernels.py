"""Attention kernel per framework release and GPU generation, and its fraction of peak in the step time."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.flops import Shard, attention_core_flops
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import attention_fraction, calibration, calibration_card
from meshplan.knowledge.cards import CardError, framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _job(gpu: str, framework: str = "torchtitan", version: str | None = None, seq: int = 32768):
    return resolve(Request(model="llama-3.1-8b", gpu=gpu, num_gpus=8, framework=framework, framework_version=version,
                           seq_length=seq, global_batch_size=8, micro_batch_size=1, recompute="full"))


def test_kernel_for_picks_the_release_then_the_arch():
    tt = framework_card("torchtitan").attention
    assert tt.kernel_for(None, "hopper") == "cudnn"  # 0.3.0: cuDNN first on every GPU
    assert tt.kernel_for("0.2.2", "hopper") == "cudnn"
    assert tt.kernel_for("0.1.0", "hopper") == "flash_attn_2"  # before v0.2.0: torch's flash backend first
    assert tt.kernel_for("0.1.0", "blackwell") == "cudnn"  # ... except on B200 (torchtitan 3b85aa31f)
    assert tt.kernel_for("0.1.0", None) == "flash_attn_2"  # a GPU without an arch takes the default
    te = framework_card("megatron-core").attention
    assert te.kernel_for(None, "hopper") == "cudnn" and te.kernel_for(None, "ampere") == "flash_attn_2"
    assert framework_card("nanotron").attention.kernel_for(None, "hopper") == "flash_attn_2"


def test_attention_fraction_reads_the_kernel_table_else_the_shared_constant():
    cal = calibration()
    kernels = calibration_card().attention_kernels
    assert attention_fraction(cal, "flash_attn_2", "hopper") == 0.35 == kernels["flash_attn_2"].by_arch["hopper"]
    assert attention_fraction(cal, "flash_attn_2", "ampere") == cal.attention_peak_fraction  # not listed
    assert attention_fraction(cal, "cudnn", "blackwell") == cal.attention_peak_fraction
    assert attention_fraction(cal, None, "hopper") == cal.attention_peak_fraction  # a card without attention
    assert attention_fraction(cal, "cudnn", None) == cal.attention_peak_fraction
    with pytest.raises(CardError, match="attention kernel"):
        attention_fraction(cal, "flash_attn_9", "hopper")


def test_every_kernel_a_card_names_is_in_the_table():
    from meshplan.core.card_files import framework_names

    kernels = set(calibration_card().attention_kernels)
    for name in framework_names():
        section = framework_card(name).attention
        if section is None:
            continue
        for table in (section.kernel, *section.by_version.values(), section.backends, section.model_kernels,
                      *section.on_arch.values()):
            assert set(table.values()) <= kernels, name


@pytest.mark.parametrize("backend", ["auto", "flash", "fused"])
def test_a_model_whose_attention_the_framework_builds_runs_that_kernel_whatever_the_backend(backend):
    """Megatron-Bridge builds Gemma 2's core attention itself (Gemma2FlexDotProductAttention: torch FlexAttention) and
    torchtitan 0.2.x its Llama 4 (attn_type flex): both are timed at FlexAttention's fraction (0.38 of H100 peak),
    whatever attention_backend says, where Megatron-Core (TE) keeps cuDNN. Fails before: Bridge's Gemma 2 at cudnn's
    0.50 (auto, fused) or FA2's 0.35 (flash)."""
    cal = calibration()
    bridge, _ = resolve(Request(model="gemma-2-27b", framework="megatron-bridge", gpu="h100", num_gpus=64, tp=8,
                                attention_backend=backend))
    assert attention_efficiency(bridge, cal, backend=backend, zero_stage=1) == ("flex_attention", 0.38)
    core, _ = resolve(Request(model="gemma-2-27b", framework="megatron-core", gpu="h100", num_gpus=64, tp=8))
    assert attention_efficiency(core, cal, zero_stage=1)[0] == "cudnn"
    titan, _ = resolve(Request(model="llama-4-scout", framework="torchtitan", framework_version="0.2.2", gpu="h100",
                               num_gpus=64))
    assert attention_efficiency(titan, cal, zero_stage=3) == ("flex_attention", 0.38)


def test_flex_fraction_follows_from_the_cited_ratios():
    """FlexAttention's fractions are FA2's (or the shared fused one on Ampere, where FA2 takes it) scaled by the PyTorch
    team's measured ratios, a training step's attention being 1 forward + 2.5 forward-equivalents of backward."""
    cal, flex = calibration(), calibration_card().attention_kernels["flex_attention"].by_arch
    fa2_hopper = calibration_card().attention_kernels["flash_attn_2"].by_arch["hopper"]
    assert flex["hopper"] == round(fa2_hopper * 3.5 / (1 / 1.25 + 2.5 / 1.03), 2)
    assert flex["ampere"] == round(cal.attention_peak_fraction * 3.5 / (1 / 0.90 + 2.5 / 0.85), 2)


def test_gemma2_on_bridge_runs_its_windows_in_flex_blocks():
    """Bridge's Gemma 2 windows are block masks of 128 x 128 (create_block_mask's default): a windowed layer computes
    the key blocks its query block overlaps, more than the window's keys exactly, so its attention core costs more than
    cuDNN's exact count at the same fraction would."""
    from meshplan.arithmetic.flops import tiled_window_keys, window_attended_keys

    assert calibration_card().attention_kernels["flex_attention"].tiles_for(128) == (128, 128)
    assert tiled_window_keys(8192, 4096, 128, 128) > window_attended_keys(8192, 4096)


def test_torchtitan_0_1_times_attention_at_the_fa2_fraction_exactly():
    """Llama-3.1-8B, 32K, one sequence per GPU: compute differs from 0.3.0 by the attention alone, and the attention
    is 3.5 x forward FLOPs / (peak x the kernel's fraction), 32 layers."""
    old_job, plan = _job("h100", version="0.1.0")
    new_job, new_plan = _job("h100")
    assert old_job.framework_version == "0.1.0" and new_job.framework_version is None
    cal = calibration("torchtitan")
    assert attention_efficiency(old_job, cal) == ("flash_attn_2", 0.35)
    kernel, new_fraction = attention_efficiency(new_job, cal)
    assert kernel == "cudnn"
    arch = old_job.model
    fwd = attention_core_flops(arch, Shard(tokens=32768, tp=1, ep=1, etp=1, sp=False), 32768)
    assert fwd == 2.0 * 32768 * 16384 * arch.num_attention_heads * 2 * arch.head_dim
    per_layer = 3.5 * fwd / old_job.gpu.bf16_flops
    old = estimate_throughput(old_job, plan)
    new = estimate_throughput(new_job, new_plan)
    assert old.breakdown.compute_s - new.breakdown.compute_s == pytest.approx(
        arch.num_layers * per_layer * (1 / 0.35 - 1 / new_fraction))
    # Full recompute repeats the attention forward (1/3.5 of it), at the same fraction.
    assert old.breakdown.recompute_s - new.breakdown.recompute_s == pytest.approx(
        arch.num_layers * per_layer / 3.5 * (1 / 0.35 - 1 / new_fraction))
    assert any("flash_attn_2" in a and "0.35" in a for a in old.assumptions)


def test_same_step_on_ampere_whichever_kernel():
    """On A100 FlashAttention-2 and cuDNN both take attention_peak_fraction: the release does not matter."""
    a = estimate_throughput(*_job("a100", version="0.1.0"))
    b = estimate_throughput(*_job("a100"))
    assert a.step_time_s == pytest.approx(b.step_time_s)


def test_estimate_only_release_is_accepted_and_an_unknown_one_refused():
    from meshplan.core.errors import MeshplanError

    job, _ = _job("h100", version="0.1")
    assert job.framework_version == "0.1.0"
    assert any("0.1.0: estimated only" in n for n in job.notes)
    with pytest.raises(MeshplanError, match=r"0\.0\.9"):
        _job("h100", version="0.0.9")
