"""attention_backend and dropout (issue 14): Request/Plan fields, what each changes in memory and time, the framework
keys each renders to and reads back from, the refusals with the nearest knob, and one answer on every face."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.core.errors import MeshplanError
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.estimate.memory import estimate_memory
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, global_batch_size=8, micro_batch_size=1, recompute="none")


def _resolve(**fields):
    return resolve(Request(**{**BASE, **fields}))


def test_left_out_is_the_framework_default_and_noted():
    job, plan = _resolve()
    assert plan.attention_backend == "auto" and plan.dropout is None
    assert any(n.startswith("attention_backend not given: auto") and "cudnn on hopper" in n for n in job.notes)
    assert any(n.startswith("dropout not given: off") for n in job.notes)
    job, plan = _resolve(attention_backend="unfused", dropout=True)
    assert (plan.attention_backend, plan.dropout) == ("unfused", True)
    assert not any("attention_backend not given" in n or "dropout not given" in n for n in job.notes)


def test_unfused_adds_the_scores_of_every_layer_exactly():
    """One stage, no recompute: unfused minus auto is num_layers x the per-layer score tensors (activations.py,
    Korthikanti's 5as^2b with dropout, 2as^2b softmax output without) less flash's fp32 log-sum-exp (4as)."""
    job, plan = _resolve(dp=8)
    arch = job.model
    s, a = job.seq_length, arch.num_attention_heads
    auto = estimate_memory(job, plan).stages[0].activations_bytes
    for dropout, per_score in ((False, 2), (True, 5)):
        unfused = estimate_memory(job, plan.model_copy(update={"attention_backend": "unfused", "dropout": dropout}))
        drop = estimate_memory(job, plan.model_copy(update={"dropout": dropout})).stages[0].activations_bytes
        assert unfused.stages[0].activations_bytes - drop == arch.num_layers * (per_score * a * s * s - 4 * a * s)
    for backend in ("flash", "fused"):
        assert estimate_memory(job, plan.model_copy(update={"attention_backend": backend})).stages[
            0].activations_bytes == auto


def test_dropout_adds_the_hidden_masks_under_flash():
    """Flash attention keeps no scores, so dropout on adds only the hidden-dropout masks (1 B per element, the
    embedding's and two per layer)."""
    job, plan = _resolve(dp=8)
    h, t = job.model.hidden_size, job.seq_length
    off = estimate_memory(job, plan).stages[0].activations_bytes
    on = estimate_memory(job, plan.model_copy(update={"dropout": True})).stages[0].activations_bytes
    assert on - off == (2 * job.model.num_layers + 1) * t * h


def test_the_backend_picks_the_kernel_that_times_attention():
    job, plan = _resolve(dp=8)
    cal = calibration(job.framework)
    assert attention_efficiency(job, cal, None, "auto")[0] == "cudnn"  # TE on Hopper (megatron-core.yaml)
    assert attention_efficiency(job, cal, None, "fused")[0] == "cudnn"
    assert attention_efficiency(job, cal, None, "flash") == ("flash_attn_2", 0.35)
    auto = estimate_throughput(job, plan)
    flash = estimate_throughput(job, plan.model_copy(update={"attention_backend": "flash"}))
    unfused = estimate_throughput(job, plan.model_copy(update={"attention_backend": "unfused"}))
    assert unfused.step_time_s > flash.step_time_s > auto.step_time_s
    assert estimate_throughput(job, plan.model_copy(update={"attention_backend": "fused"})).step_time_s == \
        auto.step_time_s


ROUND_TRIP = [("megatron-core", None, {}), ("megatron-bridge", "python", {}), ("megatron-bridge", "run_recipe", {}),
              ("verl", "megatron", {"tp": 2}), ("verl", "fsdp", {"zero_stage": 3}), ("skyrl", "rl", {"tp": 2}),
              ("kempnerforge", None, {})]


@pytest.mark.parametrize("framework,variant,extra", ROUND_TRIP)
@pytest.mark.parametrize("backend", ["flash", "unfused", "auto"])
def test_round_trip_through_the_framework_keys(framework, variant, extra, backend):
    dropout = framework not in ("kempnerforge",) and variant != "fsdp" and backend == "unfused"
    job, plan = _resolve(framework=framework, attention_backend=backend, dropout=dropout or None, **extra)
    result = render(framework, job, plan, variant=variant)
    parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
    assert parsed["attention_backend"] == backend
    assert parsed.get("dropout", None) == (True if dropout else None)


def test_the_keys_as_written():
    job, plan = _resolve(attention_backend="unfused", dropout=True)
    text = render("megatron-core", job, plan).text
    assert "--attention-backend unfused" in text and "--attention-dropout 0.1" in text
    assert "--hidden-dropout 0.1" in text
    job, plan = _resolve()  # Megatron-LM's own default is 0.1: a plan without dropout says 0.0
    assert "--attention-dropout 0.0" in render("megatron-core", job, plan).text
    job, plan = _resolve(framework="megatron-bridge", attention_backend="flash")
    text = render("megatron-bridge", job, plan, variant="python").text
    assert "cfg.model.attention_backend = AttnBackend.flash" in text and "import AttnBackend" in text
    assert "model.attention_backend=flash" in render("megatron-bridge", job, plan, variant="run_recipe").text
    job, plan = _resolve(framework="kempnerforge", attention_backend="unfused")
    assert 'sdpa_backend = "math"' in render("kempnerforge", job, plan).text
    job, plan = _resolve(framework="verl", attention_backend="unfused", zero_stage=3)
    assert "override_config.attn_implementation=eager" in render("verl", job, plan, variant="fsdp").text
    job, plan = _resolve(framework="skyrl", attention_backend="flash", zero_stage=3)
    assert "trainer.flash_attn=true" in render("skyrl", job, plan, variant="fsdp").text.lower()


@pytest.mark.parametrize("framework,variant,fields,nearest", [
    ("torchtitan", None, {"attention_backend": "flash"}, "attention_backend=auto"),
    ("torchtitan", None, {"dropout": True}, "dropout=false"),
    ("kempnerforge", None, {"dropout": True}, "dropout=false"),
    ("verl", "fsdp", {"attention_backend": "fused", "zero_stage": 3}, "attention_backend=flash"),
    ("skyrl", "fsdp", {"attention_backend": "unfused", "zero_stage": 3}, "strategy megatron"),
    ("deepspeed", None, {"attention_backend": "unfused"}, "megatron-core"),
])
def test_refused_with_the_nearest(framework, variant, fields, nearest):
    job, plan = _resolve(framework=framework, **fields)
    with pytest.raises(MeshplanError) as err:
        render(framework, job, plan, variant=variant)
    assert "cannot express" in str(err.value) and nearest in (err.value.fix or "")


def test_every_face_reads_the_fields():
    """The CLI flags and MCP arguments come from Request: the same request through parse_request (what every face
    calls) gives the estimate the plan fields give."""
    args = {**BASE, "dp": 8, "attention_backend": "unfused", "dropout": True}
    report = api.estimate_memory(parse_request(args))
    job, plan = _resolve(dp=8, attention_backend="unfused", dropout=True)
    assert report.peak_bytes == estimate_memory(job, plan).peak_bytes
    with pytest.raises(MeshplanError):
        parse_request({**args, "attention_backend": "triton"})
