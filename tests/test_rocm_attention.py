"""MI300X (cdna3) attention: the kernel each framework's library really runs on ROCm (CK's FMHA for Transformer
Engine and the flash-attn package, AOTriton for torch SDPA; never cuDNN) and its fraction, labelled assumed."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.core.card_files import framework_names
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.knowledge.calibration import attention_fraction_assumed, calibration, calibration_card
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CUDA_ONLY = {"cudnn", "flash_attn_2"}


def _request(gpu: str, framework: str, **kw) -> Request:
    return Request(model="llama-3.1-8b", gpu=gpu, num_gpus=8, framework=framework, **kw)


@pytest.mark.parametrize(("framework", "kernel"), [
    ("megatron-core", "ck_fmha"), ("megatron-bridge", "ck_fmha"), ("nemo-automodel", "ck_fmha"),
    ("nanotron", "ck_fmha"), ("deepspeed", "ck_fmha"), ("torchtitan", "aotriton"), ("kempnerforge", "aotriton")])
def test_auto_runs_the_rocm_kernel_on_cdna3_and_the_cuda_one_on_hopper(framework, kernel):
    """Transformer Engine's fused attention on ROCm is CK first (ROCm/TransformerEngine fused_attn.cpp), the
    flash-attn package CK, torch SDPA AOTriton (preferred_rocm_fa_library). Fails before: 'cudnn' / 'flash_attn_2'
    on cdna3."""
    att = framework_card(framework).attention
    assert att.kernel_for(None, "cdna3") == kernel
    assert att.kernel_for(None, "hopper") in (CUDA_ONLY | {None})  # NVIDIA GPUs keep their names


def test_release_engine_and_backend_maps_are_read_through_on_arch():
    tt = framework_card("torchtitan").attention
    assert tt.kernel_for("0.1.0", "cdna3") == "aotriton" and tt.kernel_for("0.1.0", "hopper") == "flash_attn_2"
    verl = framework_card("verl").attention
    assert verl.kernel_for("0.5.0", "cdna3") == "ck_fmha" and verl.kernel_for("0.5.0", "hopper") == "cudnn"
    assert verl.kernel_for(None, "cdna3", engine="fsdp") == "ck_fmha"
    assert verl.kernel_for(None, "cdna3", mla=True) == "ck_fmha"  # mla_backend fused: TE's, CK on ROCm
    auto = framework_card("nemo-automodel").attention
    assert auto.backend_kernel("fused", "cdna3") == "ck_fmha"  # te
    assert auto.backend_kernel("flash", "cdna3") == "aotriton"  # sdpa
    assert auto.backend_kernel("flash", "hopper") == "flash_attn_2"


def test_no_card_names_a_cuda_kernel_on_cdna3():
    """Every map and backend of every framework card, read on cdna3, names a kernel that runs on ROCm, save
    KempnerForge's sdpa_backend cudnn, which finds no ROCm kernel (its card says so)."""
    kernels = set(calibration_card().attention_kernels)
    for name in framework_names():
        att = framework_card(name).attention
        if att is None:
            continue
        assert {k for table in att.on_arch.values() for k in table.values()} <= kernels, name
        tables = [att.kernel, *att.by_version.values(), *att.by_engine.values()]
        picked = {att.on_gpu(t.get("cdna3", t.get("default")), "cdna3") for t in tables}
        picked |= {att.backend_kernel(b, "cdna3") for b in att.backends if (name, b) != ("kempnerforge", "fused")}
        assert not picked & CUDA_ONLY, (name, picked)


def test_the_rocm_fractions_are_labelled_assumed_and_keep_the_shared_value():
    """No published measured fraction of MI300X peak for CK's or AOTriton's training pass was found: each takes
    attention_peak_fraction there, flagged assumed; the NVIDIA kernels' figures are not."""
    cal = calibration()
    for kernel in ("ck_fmha", "aotriton"):
        assert attention_fraction_assumed(kernel, "cdna3")
        assert not attention_fraction_assumed(kernel, "hopper")
    assert not attention_fraction_assumed("cudnn", "hopper") and not attention_fraction_assumed(None, "cdna3")
    job, _ = resolve(_request("mi300x", "megatron-core"))
    assert attention_efficiency(job, cal, zero_stage=1) == ("ck_fmha", cal.attention_peak_fraction)


@pytest.mark.parametrize(("framework", "kernel"), [("megatron-core", "ck_fmha"), ("torchtitan", "aotriton")])
def test_throughput_report_names_the_rocm_kernel_and_says_its_fraction_is_assumed(framework, kernel):
    """The throughput report's words on MI300X: the kernel in the GEMM/attention assumption and the auto note, the
    fraction called assumed, and the band listing it unvalidated. Fails before: 'flash attention (cudnn) at 0.50'."""
    report = api.estimate_throughput(_request("mi300x", framework))
    line = next(a for a in report.assumptions if a.startswith("GEMM time"))
    assert f"flash attention ({kernel}) at 0.50 of peak" in line
    assert f"assumed: no published measured fraction of peak for {kernel} on cdna3" in line
    assert any(f"({kernel} on cdna3;" in a for a in report.assumptions)
    assert not any("cudnn" in a for a in report.assumptions)
    assert f"{kernel} attention on cdna3 (fraction assumed)" in report.error_band.unvalidated
    h100 = api.estimate_throughput(_request("h100", framework))
    line = next(a for a in h100.assumptions if a.startswith("GEMM time"))
    assert "flash attention (cudnn) at 0.50 of peak" in line and "assumed" not in line
    assert not any("fraction assumed" in t for t in h100.error_band.unvalidated)
