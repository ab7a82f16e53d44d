"""A server must not read its own files for a remote caller (core/server_files.py).

Over HTTP a request's paths (a model's config.json, a launch script, the file a pasted script names) name files on
the server: each is refused with an error that holds nothing of the file, unless the operator opened a folder with
--allow-server-files (resolved: no '..' or symlink out of it). Over stdio and the CLI the caller is the machine's
user and its paths are read as given.
"""

from __future__ import annotations

import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from http_servers import serving
from mcp import Client, StdioServerParameters
from tree_under_test import tree_env

from meshplan import api
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError

pytestmark = pytest.mark.anyio

REFUSED = "this server reads no file of its own for a caller over HTTP"
SECRET = "s3cret-marker"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
          "intermediate_size": 8192, "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 8,
          "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
          "hidden_act": "silu"}
# KempnerForge's slurm launch (tests/test_import_launch_configs.py KF_SCRIPT) naming its TOML by an absolute path
KF_SCRIPT = """#!/bin/bash
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
srun --kill-on-bad-exit=1 uv run python scripts/train.py {toml}
"""
KF_TOML = """[model]
dim = 4096
n_layers = 32
n_heads = 32
n_kv_heads = 8
vocab_size = 128256
ffn_dim_multiplier = 1.3
norm_type = "rmsnorm"
activation = "silu"
max_seq_len = 4096
rope_theta = 500000.0
tie_embeddings = false

[train]
batch_size = 8
seq_len = 4096

[distributed]
dp_shard = -1
"""


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """An open folder holding a config.json and two ways out of it; a secret file and a config.json outside it."""
    root = tmp_path_factory.mktemp("server-files")
    allowed, outside = root / "allowed", root / "outside"
    (allowed / "model").mkdir(parents=True)
    outside.mkdir()
    (allowed / "model" / "config.json").write_text(json.dumps(CONFIG))
    (outside / "config.json").write_text(json.dumps(CONFIG))
    (outside / "secret.json").write_text(f'{{"{SECRET}": 1, oops}}')  # invalid JSON: a parse position to leak
    (outside / "7b.toml").write_text(KF_TOML)
    (allowed / "escape.json").symlink_to(outside / "config.json")
    (allowed / "escape").symlink_to(outside)
    return {"allowed": allowed, "outside": outside}


def _error(fn, *args) -> str:
    with pytest.raises(MeshplanError) as caught:
        fn(*args)
    return str(caught.value)


# --------------------------------------------------------------------------- the policy, in-process


def test_a_remote_caller_s_paths_are_refused_without_reading_them(files):
    secret = str(files["outside"] / "secret.json")
    local = _error(api.describe_model, secret)  # the machine's own user: read, and the parse error says where
    assert "is not valid JSON" in local and "line 1" in local
    with server_files.remote():
        for model in (secret, str(files["allowed"] / "model"), "model/config.json", "~/config.json", "./model",
                      str(files["outside"] / "missing.json"), str(files["outside"] / "x.sh")):
            text = _error(api.describe_model, model)
            assert REFUSED in text and "config_text" in text and "--allow-server-files" in text, text
            assert SECRET not in text and "line 1" not in text and "column" not in text
        # a missing file and an existing one are refused alike: whether a path exists is not said
        assert _error(api.describe_model, "/no/such/dir/x").replace("/no/such/dir/x", "P") == \
            _error(api.describe_model, str(files["outside"])).replace(str(files["outside"]), "P")
        assert api.describe_model("llama-3.1-8b").total_params == 8_030_261_248  # names stay names
        assert api.describe_model("70B").generic
    assert api.describe_model(str(files["allowed"] / "model")).total_params > 0  # the policy ends with its scope


def test_the_opt_in_folder_is_read_and_nothing_resolved_out_of_it(files):
    allowed = files["allowed"]
    expected = api.describe_model(str(allowed / "model")).total_params
    with server_files.remote([allowed]):
        assert api.describe_model(str(allowed / "model")).total_params == expected
        assert api.describe_model("model").total_params == expected  # relative: from the open folder
        assert api.describe_model("model/config.json").total_params == expected
        for out in ("escape.json", "escape/config.json", "../outside/config.json", str(files["outside"])):
            assert REFUSED in _error(api.describe_model, out), out


def test_a_pasted_script_naming_a_server_file_is_refused_over_http(files):
    script = KF_SCRIPT.format(toml=files["outside"] / "7b.toml")
    assert api.import_config(script).request["model"] == "llama-3-8b"  # locally the named TOML is read
    with server_files.remote():
        assert REFUSED in _error(api.import_config, script)
    with server_files.remote([files["allowed"]]):
        assert REFUSED in _error(api.import_config, script)


def test_the_page_reads_a_pasted_config_json_as_text_but_no_path_typed_as_the_model(files):
    from meshplan.faces.report.page import PASTED, answer

    with server_files.remote():
        _, shown, error = answer({"config": json.dumps(CONFIG), "num_gpus": "8", "gpu": "h100"})
        assert not error and json.loads(shown)["model"] == PASTED
        _, _, error = answer({"model": str(files["outside"] / "secret.json"), "num_gpus": "8"})
        assert REFUSED in error and SECRET not in error


def test_the_flag_is_refused_on_stdio_and_must_name_a_folder(tmp_path):
    from meshplan.faces.cli import build_parser
    from meshplan.faces.mcp.server import run

    assert build_parser().parse_args(["serve", "--allow-server-files", "x"]).allow_server_files == ["x"]
    with pytest.raises(MeshplanError, match="--allow-server-files opens a folder to an HTTP server's remote callers"):
        run(transport="stdio", allow_server_files=[str(tmp_path)])
    with pytest.raises(MeshplanError, match="not a folder on this machine"):
        run(transport="http", port=1, allow_server_files=[str(tmp_path / "none")])


# --------------------------------------------------------------------------- over the wire


async def _call(url: str, tool: str, args: dict) -> tuple[bool, str]:
    async with Client(url) as client:
        result = await client.call_tool(tool, args)
    return result.is_error, result.content[0].text


async def test_over_http_a_path_is_refused_and_config_text_works(http_server, files):
    failed, text = await _call(http_server, "describe_model", {"model": str(files["outside"] / "secret.json")})
    assert failed and REFUSED in text and SECRET not in text and "column" not in text
    failed, text = await _call(http_server, "estimate_memory", {"model": str(files["allowed"] / "model"),
                                                                "num_gpus": 8})
    assert failed and REFUSED in text
    script = KF_SCRIPT.format(toml=files["outside"] / "7b.toml")
    failed, text = await _call(http_server, "check_config", {"config_text": script})
    assert failed and REFUSED in text
    ds_config = json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
                            "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}})
    failed, text = await _call(http_server, "check_config", {"config_text": ds_config, "model": "llama-3.1-8b",
                                                             "num_gpus": 8})
    assert not failed, text


async def test_over_http_a_config_json_is_sent_as_text(http_server):
    """A model's config.json travels as its text, as model or as config_text, and reads as the same model; bad JSON
    is refused in the words a config.json file gets (a position in the caller's own text, no server path)."""
    expected = api.describe_model(json.dumps(CONFIG)).total_params
    for args in ({"model": json.dumps(CONFIG)}, {"config_text": json.dumps(CONFIG)}):
        failed, text = await _call(http_server, "estimate_memory", {**args, "num_gpus": 8, "tp": 2})
        assert not failed and "pasted config.json" in text, text
    failed, text = await _call(http_server, "describe_model", {"model": json.dumps(CONFIG)})
    assert not failed and (f"{expected:,}" in text or str(expected) in text), text
    for tool, args in (("estimate_memory", {"config_text": json.dumps(CONFIG)[:-1], "num_gpus": 8}),
                       ("describe_model", {"model": json.dumps(CONFIG)[:-1]})):
        failed, text = await _call(http_server, tool, args)
        end = len(json.dumps(CONFIG))
        assert failed and text.endswith("'pasted config.json' is not valid JSON: Expecting ',' delimiter: line 1 "
                                        f"column {end} (char {end - 1}). Fix: Fix the JSON there."), text


def test_over_http_the_page_takes_a_pasted_config_json_and_refuses_a_path(http_server, files):
    page = http_server.removesuffix("mcp")

    def post(form: dict[str, str]) -> str:
        body = urllib.parse.urlencode(form).encode()
        with urllib.request.urlopen(urllib.request.Request(page, data=body, method="POST"), timeout=120) as reply:
            return reply.read().decode()

    assert "pasted config.json with TP" in post({"config": json.dumps(CONFIG), "num_gpus": "8", "gpu": "h100"})
    refused = post({"model": str(files["outside"] / "secret.json"), "num_gpus": "8"})
    assert "reads no file of its own" in refused and SECRET not in refused


async def test_over_http_the_opt_in_folder_is_read_and_a_symlink_out_refused(files, tmp_path):
    argv = [sys.executable, "-m", "meshplan.faces.cli", "serve", "--transport", "http", "--allow-server-files",
            str(files["allowed"]), "--port"]
    with serving(argv, tmp_path) as port:
        url = f"http://127.0.0.1:{port}/mcp"
        for model in ("model", str(files["allowed"] / "model" / "config.json")):
            failed, text = await _call(url, "describe_model", {"model": model})
            assert not failed and "parameters" in text, text
        for model in ("escape.json", "escape/secret.json", str(files["outside"] / "secret.json")):
            failed, text = await _call(url, "describe_model", {"model": model})
            assert failed and REFUSED in text and SECRET not in text, text


async def test_over_stdio_a_path_is_read_as_given(files, tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"], cwd=str(tmp_path),
                                   env=tree_env({}))
    async with Client(params) as client:
        result = await client.call_tool("describe_model", {"model": str(files["outside"] / "config.json")})
        assert not result.is_error, result.content[0].text
