"""Megatron-DeepSpeed's own defaults (lane mdsds54): its pretrain_gpt.py trains with --attention-dropout and
--hidden-dropout 0.1 and CoreAttention (the scores materialised) unless a flag says otherwise (megatron/arguments.py
4efb479; cards/frameworks/deepspeed.yaml read.absent_by_variant). The megatron-deepspeed render writes the attention
and dropout the estimate times, the snippet and a user's script read back what they run, and the estimate of a
script is the estimate of that run; the plain ds_config variant still refuses what it cannot say."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.parse import parse_plan, shell_tokens
from meshplan.adapters.render import render
from meshplan.arithmetic.memory_states import convention
from meshplan.core.errors import MeshplanError
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.estimate.memory import attention_switches
from meshplan.knowledge.calibration import calibration
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(framework="deepspeed", model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2, global_batch_size=64,
            micro_batch_size=1, recompute="none")
SWITCH, DROPOUTS = "--use-flash-attn-v2", ("--attention-dropout", "--hidden-dropout")


def _render(**fields):
    job, plan = resolve(Request(**{**BASE, **fields}))
    return job, plan, render("deepspeed", job, plan, variant="megatron-deepspeed")


def _flags(text: str) -> list[str]:
    return shell_tokens(text.split("pretrain_gpt.py", 1)[1])


@pytest.mark.parametrize("fields", [{}, {"dropout": True}, {"attention_backend": "flash"},
                                    {"attention_backend": "unfused"},
                                    {"attention_backend": "unfused", "dropout": True}])
def test_the_script_states_the_attention_and_dropout_the_estimate_times(fields):
    """Written either way, as the estimate reads them (memory.attention_switches: auto and a dropout left out are the
    deepspeed memory convention's flash and no dropout), since Megatron-DeepSpeed left to itself runs neither."""
    job, plan, result = _render(**fields)
    flash, dropout = attention_switches(job, convention(job.card, plan.zero_stage)[1], plan)
    tokens = _flags(result.text)
    assert (SWITCH in tokens) == flash
    for flag in DROPOUTS:
        assert tokens[tokens.index(flag) + 1] == ("0.1" if dropout else "0.0")
    assert not any(t.startswith("--use-flash-attn") and t != SWITCH for t in tokens)


@pytest.mark.parametrize("fields", [{}, {"dropout": True}, {"attention_backend": "flash"},
                                    {"attention_backend": "unfused", "dropout": True}])
def test_render_parse_gives_the_same_request(fields):
    """The snippet reads back to the plan's fields; auto, which Megatron-DeepSpeed's own default is not, is written
    out as the switch the estimate runs and reads back as that backend, with the same estimate."""
    job, plan, result = _render(**fields)
    parsed = parse_plan("deepspeed", result.variant, result.text, job.model.num_layers)
    flash, dropout = attention_switches(job, convention(job.card, plan.zero_stage)[1], plan)
    expected = plan.attention_backend if plan.attention_backend != "auto" else ("flash" if flash else "unfused")
    assert parsed["attention_backend"] == expected
    assert parsed.get("dropout", False) == dropout
    again = resolve(Request(**{**BASE, **fields, "attention_backend": parsed["attention_backend"],
                               "dropout": parsed.get("dropout", plan.dropout)}))
    assert api.estimate_memory(parse_request({**BASE, **fields})).peak_bytes == \
        api.estimate_memory(parse_request({**BASE, "attention_backend": again[1].attention_backend,
                                           "dropout": again[1].dropout})).peak_bytes


def _without(text: str, *flags: str) -> str:
    lines = [line for line in text.splitlines() if line.strip().rstrip(" \\").split(" ")[0] not in flags]
    if lines[-1].endswith("\\"):
        lines[-1] = lines[-1].rstrip(" \\")
    return "\n".join(lines) + "\n"


def test_a_snippet_without_the_flags_reads_as_megatron_deepspeed_runs_it():
    """parse reads what the framework runs where a flag is left out: no flash switch is CoreAttention (unfused), a
    dropout flag missing is 0.1, whatever the other one says."""
    job, _, result = _render()
    bare = parse_plan("deepspeed", "megatron-deepspeed", _without(result.text, SWITCH, *DROPOUTS),
                      job.model.num_layers)
    assert (bare["attention_backend"], bare["dropout"]) == ("unfused", True)
    half = parse_plan("deepspeed", "megatron-deepspeed", _without(result.text, "--hidden-dropout"),
                      job.model.num_layers)
    assert (half["attention_backend"], half["dropout"]) == ("flash", True)


@pytest.mark.parametrize("cut,add,attention,dropout", [
    ((SWITCH, *DROPOUTS), None, "unfused", True),
    ((SWITCH, "--hidden-dropout"), None, "unfused", True),
    ((SWITCH,), "--use-flash-attn-triton", "flash", False),
    ((SWITCH,), "--use-flash-attn", "flash", False),
    ((), None, "flash", False),
])
def test_a_users_script_is_read_and_estimated_as_the_run_it_launches(cut, add, attention, dropout):
    """`meshplan import` / check / estimate of a Megatron-DeepSpeed script: each flag left out at the framework's
    default, said with its source, and the estimate of the file is the estimate of that run."""
    _, _, result = _render()
    text = _without(result.text, *cut)
    if add:
        text = text.replace("  --bf16 \\\n", f"  --bf16 \\\n  {add} \\\n")
    imported = api.import_config(text, path="run.sh", framework="deepspeed")
    assert (imported.request["attention_backend"], imported.request["dropout"]) == (attention, dropout)
    if SWITCH in cut and add is None:
        assert "CoreAttention" in imported.sources["attention_backend"]
    if "--hidden-dropout" in cut:
        assert "0.1" in imported.sources["dropout"] and "read.absent_by_variant" in imported.sources["dropout"]
    request = api.request_from_config(imported, {"model": "llama-3.1-8b", "gpu": "h100"})
    stated = parse_request({**BASE, "attention_backend": attention, "dropout": dropout})
    assert api.estimate_memory(request).peak_bytes == api.estimate_memory(stated).peak_bytes


def test_the_estimate_honours_the_request_and_check_lets_both_through():
    """Unfused attention keeps the scores (Megatron-Core's non-flash numbers, the one home), dropout on adds its masks;
    rule AT001 no longer flags them on DeepSpeed (its megatron-deepspeed variant writes them), fused it does."""
    peaks = {}
    for fields in ({}, {"dropout": True}, {"attention_backend": "unfused"},
                   {"attention_backend": "unfused", "dropout": True}):
        request = parse_request({**BASE, **fields})
        peaks[tuple(fields.items())] = api.estimate_memory(request).peak_bytes
        assert not [f for f in api.check_config(request).findings if f.id == "AT001"]
    assert peaks[()] < peaks[(("dropout", True),)] < peaks[(("attention_backend", "unfused"),)] \
        < peaks[(("attention_backend", "unfused"), ("dropout", True))]
    assert [f for f in api.check_config(parse_request({**BASE, "attention_backend": "fused"})).findings
            if f.id == "AT001"]


@pytest.mark.parametrize("fields", [{"dropout": True}, {"attention_backend": "unfused"}])
def test_the_plain_ds_config_still_refuses_them(fields):
    job, plan = resolve(Request(**{**BASE, "tp": 1, "pp": 1, **fields}))
    with pytest.raises(MeshplanError) as err:
        render("deepspeed", job, plan, variant="config")
    assert "cannot express" in str(err.value) and "megatron-deepspeed" in (err.value.fix or "")


def test_left_out_the_notes_say_what_megatron_deepspeed_would_run():
    job, _ = resolve(Request(**BASE))
    attention = next(n for n in job.notes if n.startswith("attention_backend not given"))
    dropout = next(n for n in job.notes if n.startswith("dropout not given"))
    assert "flash attention (flash_attn_2 on hopper) as the deepspeed memory convention" in attention
    assert "runs unfused attention" in attention
    assert "megatron-deepspeed script runs it on" in dropout


@pytest.mark.parametrize("gpu,fraction", [("h100", 0.35), ("a100", None)])
def test_the_flash_the_script_runs_is_timed_as_flashattention_2(gpu, fraction):
    """--use-flash-attn-v2 (and a ds_config's Hugging Face flash / sdpa) is FlashAttention-2: auto and flash are timed
    at its fraction for the GPU (cards/calibration.yaml attention_kernels.flash_attn_2; Ampere: the shared
    attention_peak_fraction), not the fused Hopper class."""
    job, plan = resolve(Request(**{**BASE, "gpu": gpu}))
    cal = calibration()
    expected = cal.attention_peak_fraction if fraction is None else fraction
    for backend in ("auto", "flash"):
        assert attention_efficiency(job, cal, backend=backend, zero_stage=plan.zero_stage) == ("flash_attn_2",
                                                                                               expected)
    core, _ = resolve(Request(**{**BASE, "gpu": gpu, "framework": "megatron-core"}))
    assert attention_efficiency(core, cal, backend="auto", zero_stage=1)[0] != "flash_attn_2" or gpu == "a100"
