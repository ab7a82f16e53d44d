"""verl's attention kernel follows what verl runs (cards/frameworks/verl.yaml attention): auto in Megatron-Core up to
0.5 (Transformer Engine's pick: cuDNN on Hopper, FlashAttention-2 on Ampere), flash forced since 0.6
(FlashAttention-2), fused for MLA models in every release (FlashAttention-2 refuses Q/K and V head dims that
differ), and the FSDP engine's Hugging Face flash_attention_2 in every release; a run gets the release of its date
(meshplan/knowledge/published_runs.py release_ran, which the bench gives each verl row)."""

from __future__ import annotations

import pytest

from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.compute_card import AttentionSemantics
from meshplan.knowledge.published_runs import release_ran
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CAL = calibration("verl")
PEAK = CAL.attention_peak_fraction  # the fused class: cuDNN takes it on every generation
FA2_HOPPER = 0.35  # cards/calibration.yaml attention_kernels.flash_attn_2.by_arch.hopper


def _resolve(model: str = "qwen3-30b-a3b", gpu: str = "h20", **fields):
    base = dict(model=model, gpu=gpu, num_gpus=8, framework="verl", tp=1, pp=1, ep=8, etp=1, seq_length=4096,
                micro_batch_size=1, global_batch_size=64)
    return resolve(Request(**{**base, **fields}))


def _auto(job, plan):
    return attention_efficiency(job, CAL, None, plan.attention_backend, plan.zero_stage)


@pytest.mark.parametrize("version,gpu,expected", [
    ("0.5.0", "h20", ("cudnn", PEAK)),  # Megatron-Core auto: Transformer Engine prefers cuDNN on Hopper
    ("0.5.0", "a100-80gb", ("flash_attn_2", PEAK)),  # ... and FlashAttention-2 below it (Ampere: the shared fraction)
    (None, "h20", ("flash_attn_2", FA2_HOPPER)),  # 0.9.1 (the card's): attention_backend flash since 0.6
    ("0.9.1", "h100", ("flash_attn_2", FA2_HOPPER)),
])
def test_the_kernel_of_each_release_on_the_megatron_engine(version, gpu, expected):
    job, plan = _resolve(gpu=gpu, framework_version=version)
    assert plan.zero_stage == 1 and _auto(job, plan) == expected


@pytest.mark.parametrize("version", [None, "0.5.0"])
def test_mla_runs_fused_in_every_release(version):
    """DeepSeek-V3 (Q/K 192, V 128): cuDNN at the fused fraction, before 0.6 (config_converter's fused) and after
    (the flash default leaves Transformer Engine no backend; verl's recipe sets fused)."""
    job, plan = _resolve(model="deepseek-v3", gpu="h100", num_gpus=64, ep=8, pp=8, framework_version=version)
    assert job.model.mla is not None
    assert plan.attention_backend == "fused" and _auto(job, plan) == ("cudnn", PEAK)
    assert any(n.startswith("attention_backend not given: fused (cudnn on hopper)") for n in job.notes)
    auto = plan.model_copy(update={"attention_backend": "auto"})  # a plan built without resolve: the card's auto
    assert _auto(job, auto) == ("cudnn", PEAK)


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("version", [None, "0.5.0"])
def test_the_fsdp_engine_runs_flash_attention_2_in_every_release(model, version):
    job, plan = _resolve(model=model, gpu="h100", zero_stage=3, ep=1, framework_version=version)
    assert _auto(job, plan) == ("flash_attn_2", FA2_HOPPER)
    assert any("auto, what verl picks by itself (flash_attn_2 on hopper" in n for n in job.notes)


def test_the_release_moves_the_step_time():
    """The same job: FlashAttention-2 (0.35 of peak) makes the current release's attention slower than 0.5's cuDNN."""
    old = estimate_throughput(*_resolve(framework_version="0.5.0"))
    new = estimate_throughput(*_resolve())
    assert new.step_time_s > old.step_time_s


@pytest.mark.parametrize("variant,zero_stage,model", [("megatron", 1, "qwen3-30b-a3b"), ("fsdp", 3, "qwen3-30b-a3b"),
                                                      ("megatron", 1, "qwen2.5-7b")])
def test_the_rendered_config_runs_the_timed_kernel(variant, zero_stage, model):
    """auto renders no backend, so verl's own default runs (engine/megatron.yaml attention_backend flash; the FSDP
    engine's attn_implementation flash_attention_2): the kernel that default is, is the one timed. An explicit
    backend renders verl's key and is timed as that backend's kernel."""
    card = framework_card("verl").attention
    extra = {"ep": 1} if zero_stage == 3 or model == "qwen2.5-7b" else {}
    job, plan = _resolve(model=model, zero_stage=zero_stage, **extra)
    text = render("verl", job, plan, variant=variant).text
    assert "attention_backend" not in text and "attn_implementation" not in text
    assert parse_plan("verl", variant, text, job.model.num_layers)["attention_backend"] == "auto"
    assert _auto(job, plan)[0] == card.backends["flash"]
    job, plan = _resolve(model=model, zero_stage=zero_stage, attention_backend="flash", **extra)
    text = render("verl", job, plan, variant=variant).text
    assert ("attention_backend=flash" if variant == "megatron" else "attn_implementation=flash_attention_2") in text
    assert _auto(job, plan) == ("flash_attn_2", FA2_HOPPER)


def test_an_mla_model_renders_the_fused_backend_it_is_timed_with():
    """verl's flash default leaves Transformer Engine no kernel for DeepSeek-V3's head dims, so the plan and its render
    say fused, as verl's DeepSeek-V3 recipe sets it (an auto plan built without resolve renders it too); read back,
    the plan is timed the same."""
    job, plan = _resolve(model="deepseek-v3", gpu="h100", num_gpus=64, ep=8, pp=8,
                         first_stage_layers=7, last_stage_layers=6)
    for p in (plan, plan.model_copy(update={"attention_backend": "auto"})):
        text = render("verl", job, p, variant="megatron").text
        assert "actor.megatron.override_transformer_config.attention_backend=fused" in text
        parsed = parse_plan("verl", "megatron", text, job.model.num_layers)["attention_backend"]
        assert parsed == "fused" and framework_card("verl").attention.backends[parsed] == _auto(job, p)[0] == "cudnn"
        assert estimate_throughput(job, p.model_copy(update={"attention_backend": parsed})).step_time_s == \
            estimate_throughput(job, p).step_time_s
    job, plan = _resolve(model="deepseek-v3", gpu="h100", zero_stage=3, ep=1)  # FSDP: Hugging Face pads V for FA2
    assert "attn_implementation" not in render("verl", job, plan, variant="fsdp").text


def test_an_mla_backend_needs_its_kernel():
    with pytest.raises(ValueError, match="mla_backend 'fused' needs its kernel in backends"):
        AttentionSemantics(mla_backend="fused", backends={"flash": "flash_attn_2"}, source="x")


@pytest.mark.parametrize("when,version", [("2025-08", "0.5.0"), ("2025-09-23", "0.5.0"), ("2025-09-24", None),
                                          ("2025-10", None), (None, None)])
def test_each_verl_run_gets_the_release_of_its_date(when, version):
    assert release_ran("verl", when) == version
    assert version is None or version in framework_card("verl").known_versions()
