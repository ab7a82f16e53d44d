"""MI300X (cdna3) attention: the kernel each framework's library really runs on ROCm (CK's FMHA for Transformer
Engine and the flash-attn package, AOTriton for torch SDPA; never cuDNN) and its fraction: CK's derived from AMD's
published forward and backward rates (measured), AOTriton's taken from it and labelled assumed."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.core.card_files import framework_names
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.knowledge.calibration import (
    attention_fraction,
    attention_fraction_assumed,
    attention_fraction_measured,
    calibration,
    calibration_card,
)
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.hardware import get_gpu
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


def test_ck_fraction_on_cdna3_is_derived_from_the_measured_rates():
    """CK's MI300X fraction is the training pass's, per measured shape 3.5 / (peak / fwd + 2.5 peak / bwd) (the
    forward's FLOPs at the forward rate, the backward's 2.5x at the backward rate), the median over the shapes: 0.34
    from aiter's table, not the shared 0.50; not labelled assumed. Fails before: 0.50, assumed."""
    cal = calibration()
    rates = attention_fraction_measured("ck_fmha", "cdna3")
    assert rates is not None and rates.gpu == "mi300x" and len(rates.forward_tflops) == len(rates.backward_tflops) == 12
    peak = get_gpu("mi300x").bf16_flops / 1e12
    pairs = zip(rates.forward_tflops, rates.backward_tflops, strict=True)
    per_shape = sorted(3.5 / (peak / f + 2.5 * peak / b) for f, b in pairs)
    expected = (per_shape[5] + per_shape[6]) / 2
    assert attention_fraction(cal, "ck_fmha", "cdna3") == pytest.approx(expected)
    assert round(expected, 2) == 0.34 and all(0.32 < x < 0.36 for x in per_shape)
    assert not attention_fraction_assumed("ck_fmha", "cdna3")
    assert attention_fraction_measured("ck_fmha", "hopper") is None
    assert attention_fraction_measured("cudnn", "cdna3") is None
    job, _ = resolve(_request("mi300x", "megatron-core"))
    assert attention_efficiency(job, cal, zero_stage=1) == ("ck_fmha", pytest.approx(expected))


def test_aotriton_on_cdna3_takes_ck_measured_fraction_labelled_assumed():
    """No published MI300X training figure for AOTriton: it takes CK's measured fraction (its forward measured below
    CK's, so a ceiling), flagged assumed; off cdna3 neither kernel is assumed. Fails before: 0.50, above CK's."""
    cal = calibration()
    assert attention_fraction_assumed("aotriton", "cdna3") and not attention_fraction_assumed("aotriton", "hopper")
    assert attention_fraction(cal, "aotriton", "cdna3") == attention_fraction(cal, "ck_fmha", "cdna3")
    assert attention_fraction(cal, "aotriton", "cdna3") < cal.attention_peak_fraction
    assert not attention_fraction_assumed("cudnn", "hopper") and not attention_fraction_assumed(None, "cdna3")
    assert calibration_card().attention_kernels["aotriton"].assumed_from == "ck_fmha"


def test_throughput_report_names_the_rocm_kernel_and_where_its_fraction_comes_from():
    """The throughput report's words on MI300X: CK's fraction called measured with the table it comes from, and the
    band not listing it unvalidated; AOTriton's called assumed, taking CK's, and the band listing it. H100 keeps
    cuDNN at 0.50, neither. Fails before: 'at 0.50 of peak (assumed: ...)' for both."""
    report = api.estimate_throughput(_request("mi300x", "megatron-core"))
    line = next(a for a in report.assumptions if a.startswith("GEMM time"))
    assert "flash attention (ck_fmha) at 0.34 of peak" in line and "(measured: AMD's aiter FMHA table" in line
    assert "assumed" not in line and "cudnn" not in " ".join(report.assumptions)
    assert not any("ck_fmha" in t for t in report.error_band.unvalidated)
    report = api.estimate_throughput(_request("mi300x", "torchtitan"))
    line = next(a for a in report.assumptions if a.startswith("GEMM time"))
    assert "flash attention (aotriton) at 0.34 of peak" in line
    assert "assumed: no published measured fraction of peak for aotriton on cdna3; ck_fmha's fraction there" in line
    assert any("(aotriton on cdna3;" in a for a in report.assumptions)
    assert "aotriton attention on cdna3 (fraction assumed)" in report.error_band.unvalidated
    h100 = api.estimate_throughput(_request("h100", "megatron-core"))
    line = next(a for a in h100.assumptions if a.startswith("GEMM time"))
    assert "flash attention (cudnn) at 0.50 of peak" in line and "assumed" not in line and "measured:" not in line
    assert not any("fraction assumed" in t for t in h100.error_band.unvalidated)


def test_a_card_giving_an_arch_two_bases_is_refused():
    """A kernel whose arch is both measured and given a figure (or assumed), whose assumed_from names no kernel, or
    whose measured rates do not pair shape by shape, is a card error, not a silent pick of one."""
    from meshplan.knowledge import calibration as calibration_module
    from meshplan.knowledge.cards import CardError

    card = calibration_card()
    ck = card.attention_kernels["ck_fmha"]
    for bad in (ck.model_copy(update={"by_arch": {"cdna3": 0.5}}), ck.model_copy(update={"assumed_on": ["cdna3"]}),
                ck.model_copy(update={"assumed_from": "no_such_kernel"}),
                ck.model_copy(update={"measured": {"cdna3": ck.measured["cdna3"].model_copy(
                    update={"backward_tflops": ck.measured["cdna3"].backward_tflops[:-1]})}})):
        kernels = {**card.attention_kernels, "ck_fmha": bad}
        with pytest.raises(CardError, match="ck_fmha"):
            calibration_module._matches(card.model_copy(update={"attention_kernels": kernels}))
    calibration_module._matches(card)
