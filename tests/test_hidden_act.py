"""A config.json's hidden_act that transformers' ACT2FN does not know ("text") is refused on every face, naming the
activations transformers 5.9.0 knows (cards/model_families.yaml activations, with its source); it was read silently
and planned as any other model."""

from __future__ import annotations

import json

import pytest
from mcp_calls import call_tool

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.knowledge.catalog import families_card
from meshplan.schema.request import Request

CONFIG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
          "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
SAID = "hidden_act 'text' is no activation transformers knows: its MLP is built with ACT2FN[hidden_act], which takes"


def written(tmp_path, **keys) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG, **keys}), encoding="utf-8")
    return str(path)


def test_an_unknown_activation_is_refused_on_every_face(tmp_path, capsys):
    from meshplan.faces.report.page import answer

    path = written(tmp_path, hidden_act="text")
    with pytest.raises(MeshplanError) as exc:
        api.estimate_memory(Request(model=path, gpu="h100", num_gpus=8))
    assert f"{path}: {SAID}" in str(exc.value) and "silu" in str(exc.value)
    assert cli.main(["memory", path, "--gpu", "h100", "--num-gpus", "8"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert SAID in err and "Traceback" not in err
    said = call_tool("estimate_memory", {"model": path, "gpu": "h100", "num_gpus": 8})
    assert said.is_error and SAID in said.content[0].text
    error = answer({"config": json.dumps({**CONFIG, "hidden_act": "text"}), "gpu": "h100", "num_gpus": "8"})[2]
    assert error.startswith(f"pasted config.json: {SAID}")


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu_new", "relu2", "swish"])
def test_every_activation_transformers_knows_is_read(tmp_path, act):
    assert act in families_card().activations
    assert api.estimate_memory(Request(model=written(tmp_path, hidden_act=act), gpu="h100", num_gpus=8)).peak_bytes > 0


def test_gpt2s_activation_function_is_checked_too(tmp_path):
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 768, "n_layer": 2, "n_head": 12, "vocab_size": 50257,
                                "activation_function": "gelu_nw"}), encoding="utf-8")
    with pytest.raises(MeshplanError, match="activation_function 'gelu_nw' is no activation transformers knows"):
        api.describe_model(str(path))


def test_a_hybrids_mlp_hidden_act_is_checked_too(tmp_path, capsys):
    """NemotronHMLP builds ACT2FN[config.mlp_hidden_act] (its hidden_act is not the MLP's): an unknown one is refused
    by that key on the CLI as through the API; a known one is read as the MLP's activation (relu2 when left out)."""
    from test_hybrid_models import NEMOTRON_H_8B

    from meshplan.knowledge.model_config import architecture_from_config

    path = tmp_path / "nemotron_h.json"
    path.write_text(json.dumps({**NEMOTRON_H_8B, "mlp_hidden_act": "relu3"}), encoding="utf-8")
    said = "mlp_hidden_act 'relu3' is no activation transformers knows: its MLP is built with ACT2FN[mlp_hidden_act]"
    with pytest.raises(MeshplanError, match=said.replace("[", r"\[").replace("]", r"\]")):
        api.describe_model(str(path))
    assert cli.main(["memory", str(path), "--gpu", "h100", "--num-gpus", "8"]) == cli.EXIT_USAGE
    assert said in capsys.readouterr().err
    assert architecture_from_config({**NEMOTRON_H_8B, "mlp_hidden_act": "gelu"}).activation == "gelu"
    left_out = {k: v for k, v in NEMOTRON_H_8B.items() if k != "mlp_hidden_act"}
    assert architecture_from_config(left_out).activation == "relu2"
