"""A model's config.json sent as its text is the model on every face (knowledge/model_config.architecture_from_text):
the api's and the CLI's model, MCP's model or config_text, the page's paste. It reads as the same file would, and is
refused in the same words, named 'pasted config.json' (no path: over HTTP a path names the server's file)."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from mcp import Client, StdioServerParameters
from tree_under_test import tree_env

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.faces.mcp.tools import read_config, to_request
from meshplan.knowledge.model_config import CONFIG_TEXT_NAME, MAX_CONFIG_BYTES, is_model_config_json
from meshplan.schema.request import Request

pytestmark = pytest.mark.anyio

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
          "intermediate_size": 8192, "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 8,
          "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False}
TEXT = json.dumps(CONFIG, indent=2)


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _error(model: str) -> str:
    with pytest.raises(MeshplanError) as caught:
        api.describe_model(model)
    return str(caught.value)


def test_the_text_reads_as_the_file_does(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(TEXT)
    from_file, from_text = api.describe_model(str(path)), api.describe_model(TEXT)
    assert from_text.total_params == from_file.total_params == 1_137_772_544
    assert from_text.name == CONFIG_TEXT_NAME
    memory = api.estimate_memory(Request(model=TEXT, num_gpus=8, tp=2))
    assert memory.model == CONFIG_TEXT_NAME
    assert memory.stages[0].total_bytes == api.estimate_memory(Request(model=str(path), num_gpus=8, tp=2)) \
        .stages[0].total_bytes


def test_bad_text_is_refused_as_the_file_is(tmp_path):
    path = tmp_path / "config.json"
    for text in ('{"model_type": "llama",', '{"model_type": "mamba"}', '{"model_type": "llama"}', "{}"):
        path.write_text(text)
        assert _error(text) == _error(str(path)).replace(repr(str(path)), repr(CONFIG_TEXT_NAME)), text
    assert _error('{"model_type": "llama",').startswith("'pasted config.json' is not valid JSON: Expecting")
    big = '{"model_type": "llama", "x": "' + "a" * MAX_CONFIG_BYTES + '"}'
    assert _error(big).startswith("'pasted config.json' is more than 1,048,576 bytes")


def test_config_text_takes_a_config_json_as_the_model():
    assert is_model_config_json(TEXT) and is_model_config_json('{"model_type": "llama",')
    assert not is_model_config_json('{"zero_optimization": {"stage": 1}}') and not is_model_config_json("model_type: x")
    assert to_request({"config_text": TEXT, "num_gpus": 8}).model == TEXT
    assert read_config({"config_text": TEXT}) is None  # no framework config to answer in the keys of
    # a model given beside it wins, as over a framework config's fields
    assert to_request({"config_text": TEXT, "model": "llama-3.1-8b", "num_gpus": 8}).model == "llama-3.1-8b"
    # told it is TOML, it is no config.json: the TOML reader's words
    with pytest.raises(MeshplanError):
        to_request({"config_text": TEXT, "config_format": "toml"})


def test_the_cli_takes_the_text_as_model():
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["describe", TEXT, "--json"])
    assert code == 0 and json.loads(out.getvalue())["total_params"] == 1_137_772_544
    with redirect_stdout(io.StringIO()), redirect_stderr(err := io.StringIO()):
        code = cli.main(["memory", "--model", TEXT[:-2], "--num-gpus", "8"])
    assert code != 0 and "'pasted config.json' is not valid JSON" in err.getvalue()


async def test_over_stdio_model_and_config_text_take_the_text(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"], cwd=str(tmp_path),
                                   env=tree_env({}))
    async with Client(params) as client:
        answers = [await client.call_tool("estimate_memory", {**args, "num_gpus": 8, "tp": 2})
                   for args in ({"model": TEXT}, {"config_text": TEXT})]
        assert not any(a.is_error for a in answers), [a.content[0].text for a in answers]
        assert answers[0].structured_content == answers[1].structured_content
        assert answers[0].structured_content["model"] == CONFIG_TEXT_NAME
        bad = await client.call_tool("check_config", {"config_text": '{"model_type": "mamba"}', "num_gpus": 8})
        assert bad.is_error and "Unsupported model_type 'mamba' in config.json" in bad.content[0].text


def test_a_config_json_read_as_a_framework_config_is_named_a_model(tmp_path):
    """`--config config.json` (or api.import_config) was told the file is 'not a deepspeed ds_config'."""
    path = tmp_path / "config.json"
    path.write_text(TEXT)
    with pytest.raises(MeshplanError, match=r"a Hugging Face config\.json .*, a model, not a framework's config"):
        api.import_file(str(path))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = cli.main(["memory", "--config", str(path), "--num-gpus", "8"])
    assert code != 0 and "Pass it as the model: --model FILE" in err.getvalue()
