"""verl's packaged trainer config holds ~/models/deepseek-llm-7b-chat in place of a model path (the card's
read.placeholder_model, with its source), which its examples' Hydra configs (examples/sglang_multiturn/config/*)
inherit: the import says it is that placeholder and asks for the model, where check refused it as a path with no
config.json. Given the model beside the file, the file is checked."""

from __future__ import annotations

from mcp_calls import call_tool

from meshplan import api
from meshplan.adapters.read.keys import read_section
from meshplan.faces import cli

YAML = """actor_rollout_ref:
  model:
    path: ~/models/deepseek-llm-7b-chat
  rollout:
    name: sglang
data:
  train_batch_size: 256
"""
SAID = "actor_rollout_ref.model.path = ~/models/deepseek-llm-7b-chat is verl's packaged placeholder path"


def test_the_placeholder_is_said_and_the_model_asked_for_on_every_face(tmp_path, capsys):
    assert read_section("verl").placeholder_model == "~/models/deepseek-llm-7b-chat"
    imported = api.import_config(YAML, path="ppo.yaml", framework="verl")
    assert "model" not in imported.request
    assert any(SAID in said and "pass the model (--model" in said for said in imported.unresolved)
    path = tmp_path / "ppo.yaml"
    path.write_text(YAML, encoding="utf-8")
    assert cli.main(["check", "--config", str(path), "--gpu", "h100"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert SAID in err and "no config.json" not in err
    said = call_tool("check_config", {"config_text": YAML, "framework": "verl", "gpu": "h100"})
    assert said.is_error and SAID in said.content[0].text
    assert cli.main(["check", "--config", str(path), "--gpu", "h100", "--model", "qwen2.5-7b"]) in (
        cli.EXIT_OK, cli.EXIT_FINDINGS)
    assert SAID not in capsys.readouterr().err


def test_another_model_path_is_read_as_before():
    text = YAML.replace("~/models/deepseek-llm-7b-chat", "Qwen/Qwen2.5-7B-Instruct")
    assert api.import_config(text, path="ppo.yaml", framework="verl").request["model"] == "Qwen/Qwen2.5-7B-Instruct"
