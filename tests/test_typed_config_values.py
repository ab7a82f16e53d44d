"""A ds_config's keys DeepSpeed validates by type (its pydantic config models) are read as DeepSpeed reads them: what
it takes, coerced alike ("yes" -> true, "2" -> 2), the rest refused naming the key and its forms on every face that
takes a ds_config (the api, the CLI, the MCP tools; the page takes a config.json only). "bf16": "yes" was read as
nothing and the job estimated in bf16 whatever the file said."""

from __future__ import annotations

import json

import pytest
from mcp_calls import call_tool
from pydantic import TypeAdapter, ValidationError

from meshplan import api
from meshplan.adapters.read.keys import read_section
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli

BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}


def ds(**keys) -> str:
    return json.dumps({**BATCH, **keys})


@pytest.mark.parametrize(("keys", "key", "forms"), [
    ({"bf16": "yes"}, 'bf16 = "yes"', "a JSON object or null"),
    ({"bf16": True}, "bf16 = true", "a JSON object or null"),
    ({"fp16": 1}, "fp16 = 1", "a JSON object there"),
    ({"fp16": None}, "fp16 = null", "a JSON object there"),
    ({"bf16": {"enabled": "text"}}, 'bf16.enabled = "text"', "true or false (or 0 / 1, or one of the strings"),
    ({"bf16": {"enabled": 2}}, "bf16.enabled = 2", "true or false"),
    ({"zero_optimization": 2}, "zero_optimization = 2", "a JSON object (or the deprecated true / false)"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage = 4", "one of 0, 1, 2, 3"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}},
     'zero_optimization.offload_param.device = "gpu"', 'one of "none", "cpu", "nvme"'),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "maybe"}}, 'zero_optimization.overlap_comm = "maybe"',
     "true, false or null"),
])
def test_a_value_deepspeed_refuses_is_refused_by_key_and_forms(keys, key, forms):
    with pytest.raises(MeshplanError) as exc:
        api.import_config(ds(**keys), path="ds.json")
    said = str(exc.value)
    assert said.startswith(f"ds.json:1 {key}: DeepSpeed takes {forms}") and "deepspeed.initialize" in said
    assert "Fix: Write " in said


@pytest.mark.parametrize(("keys", "field", "value"), [
    ({"bf16": {"enabled": "yes"}}, "precision", "bf16"),
    ({"bf16": {"enabled": 1}}, "precision", "bf16"),
    ({"bfloat16": {"enabled": "True"}}, "precision", "bf16"),
    ({"zero_optimization": {"stage": "2"}}, "zero_stage", 2),
    ({"zero_optimization": {"stage": 3.0}}, "zero_stage", 3),
    ({"zero_optimization": True}, "zero_stage", 1),  # the deprecated form: stage 1
    ({"zero_optimization": False}, "zero_stage", 0),
    ({"zero_optimization": {"stage": 2, "overlap_comm": "on"}}, "grad_reduce_overlap", True),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "param_offload", True),
])
def test_a_value_deepspeed_coerces_is_read_as_it_coerces_it(keys, field, value):
    imported = api.import_config(ds(**keys), path="ds.json")
    assert imported.request[field] == value


def test_fp16_enabled_in_any_form_deepspeed_takes_is_reported_and_bf16_off_is_said():
    for enabled in (True, "yes", 1, "ON"):
        imported = api.import_config(ds(fp16={"enabled": enabled}), path="ds.json")
        assert any("fp16 training" in u for u in imported.unsupported), enabled
        assert "precision" not in imported.request
    off = api.import_config(ds(bf16={"enabled": "no"}), path="ds.json")
    assert "precision" not in off.request
    assert any(a.startswith("precision = bf16: the file enables neither bf16 nor fp16 (ds.json:1 bf16.enabled = "
                            "false)") for a in off.assumed)
    on = api.import_config(ds(bf16={"enabled": True}), path="ds.json")
    assert on.sources["precision"] == "ds.json:1 bf16.enabled"


def test_the_cli_and_mcp_refuse_it_alike(tmp_path, capsys):
    text = ds(bf16="yes")
    path = tmp_path / "ds.json"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["check", "--config", str(path), "--model", "llama-3.1-8b", "--gpu", "h100"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f'{path}:1 bf16 = "yes": DeepSpeed takes a JSON object or null' in err and "Traceback" not in err
    for tool in ("check_config", "estimate_memory"):
        said = call_tool(tool, {"config_text": text, "model": "llama-3.1-8b", "gpu": "h100"})
        assert said.is_error and '<config_text>:1 bf16 = "yes": DeepSpeed takes a JSON object' in said.content[0].text


def test_the_card_bool_words_are_the_strings_pydantic_takes():
    """The refusal lists the card's bool_words; the reader validates with pydantic's bool: the two agree."""
    words = read_section("deepspeed").bool_words
    for word in words:
        assert TypeAdapter(bool).validate_python(word.upper()) in (True, False)
    for other in ("text", "2", "auto", "enable"):
        with pytest.raises(ValidationError):
            TypeAdapter(bool).validate_python(other)


@pytest.mark.parametrize(("written", "on"), [(True, True), (False, False), (1, True), (0, False), ("false", True),
                                             ("", False), ("no", True)])
def test_keys_deepspeed_reads_unvalidated_are_read_by_python_truth(written, on):
    """activation_checkpointing.cpu_checkpointing (and partition_activations, contiguous_memory_optimization,
    amp.enabled) are read with get_scalar_param, no type check, and tested by Python truth: "false" turns CPU
    checkpointing on in DeepSpeed, so it does here, and a string is said to be read so; nothing is refused."""
    imported = api.import_config(ds(activation_checkpointing={"cpu_checkpointing": written}), path="ds.json")
    assert imported.request.get("activation_offload", False) is on
    said = [a for a in imported.assumed if "cpu_checkpointing = " in a and "as DeepSpeed reads it" in a]
    assert bool(said) == isinstance(written, str), imported.assumed
    if said:
        assert said[0].startswith(f"ds.json:1 activation_checkpointing.cpu_checkpointing = {json.dumps(written)}: "
                                  f"read as {on}")
    amp = api.import_config(ds(amp={"enabled": written}), path="ds.json")
    assert not any("DeepSpeed takes" in u for u in amp.unsupported)
    assert bool([a for a in amp.assumed if "amp.enabled" in a]) == isinstance(written, str)
