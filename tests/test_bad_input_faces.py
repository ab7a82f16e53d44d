"""The same bad input gets the same refusal, in the same words, on the CLI, the MCP tools (in process and over HTTP)
and the batch lines: the audit of session 48 found each of these worded one way on one face and another way (or
answered) on the next."""

from __future__ import annotations

import json
import socket

import pytest
from http_servers import free_port
from mcp_calls import call_tool
from test_mcp_protocol_edges import INIT, post, sse_data

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.faces.mcp.__main__ import main as mcp_main
from meshplan.schema.request import PATTERN_WORDS, Request

JOB = {"model": "llama-3.1-8b", "gpu": "h100"}
CLI_JOB = ["llama-3.1-8b", "--gpu", "h100"]


def cli_refusal(capsys, argv: list[str]) -> str:
    """The CLI's one-line refusal (exit 2, no traceback), without its 'meshplan: ' prefix."""
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("meshplan: "), err
    return err.strip().removeprefix("meshplan: ")


def mcp_refusal(tool: str, arguments: dict) -> str:
    """The tool's refusal, without the SDK's 'Error executing tool NAME: ' prefix."""
    result = call_tool(tool, arguments)
    assert result.is_error, result.content[0].text[:300]
    return result.content[0].text.removeprefix(f"Error executing tool {tool}: ")


@pytest.mark.parametrize(("argv", "tool", "arguments", "said"), [
    (["recommend", *CLI_JOB, "--num-gpus", "8", "--top-k", "0"], "recommend_parallelism",
     {**JOB, "num_gpus": 8, "top_k": 0}, "top_k: Input should be greater than or equal to 1 (got 0)"),
    # the CLI searched and listed 51 layouts where the tool refused more than 50
    (["recommend", *CLI_JOB, "--num-gpus", "8", "--top-k", "51"], "recommend_parallelism",
     {**JOB, "num_gpus": 8, "top_k": 51}, "top_k: Input should be less than or equal to 50 (got 51)"),
    (["min-gpus", *CLI_JOB, "--max-gpus", "0"], "minimum_gpus", {**JOB, "max_gpus": 0},
     "max_gpus: Input should be greater than or equal to 1 (got 0)"),
    (["report", *CLI_JOB, "--num-gpus", "8", "--recommend", "--top-k", "0", "--html", "{tmp}/plan.html"],
     "render_report", {**JOB, "num_gpus": 8, "recommend": True, "top_k": 0},
     "top_k: Input should be greater than or equal to 1 (got 0)"),
])
def test_an_option_out_of_its_bounds_is_refused_alike_on_cli_and_mcp(capsys, tmp_path, argv, tool, arguments, said):
    """--top-k and --max-gpus are checked against the tools' own option models (schema/options.py)."""
    cli_said = cli_refusal(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert cli_said == mcp_refusal(tool, arguments) == f"Invalid request: {said}."


@pytest.mark.parametrize("log", ["", "  \n\n"])
def test_an_empty_log_is_refused_alike_by_compare(capsys, tmp_path, log):
    """The tool's schema refused '' as 'String should have at least 1 character'; the CLI's reader said the log is
    empty (and a log of blank lines passed the schema to the reader)."""
    path = tmp_path / "run.log"
    path.write_text(log, encoding="utf-8")
    cli_said = cli_refusal(capsys, ["compare", *CLI_JOB, "--num-gpus", "8", "--log", str(path)])
    mcp_said = mcp_refusal("compare_run", {**JOB, "num_gpus": 8, "log_text": log})
    assert cli_said.replace(str(path), "<log_text>") == mcp_said
    assert mcp_said.startswith("<log_text>: the log is empty. Fix:")


def test_a_config_over_the_readers_limit_is_refused_alike(capsys, tmp_path):
    """config_text's schema bound (maxLength) worded the reader's limit as pydantic's 'String should have at most
    1048576 characters' with the text's head; the file on the CLI got the reader's limit and a count of 1,048,577
    whatever its length (the file is read one character past the limit)."""
    text = "# x\n" * ((1 << 18) + 1)
    path = tmp_path / "train.sh"
    path.write_text(text, encoding="utf-8")
    cli_said = cli_refusal(capsys, ["import", str(path)])
    mcp_said = mcp_refusal("estimate_memory", {"config_text": text, "gpu": "h100", "num_gpus": 8})
    assert cli_said.replace(str(path), "<config_text>") == mcp_said
    assert mcp_said.startswith("<config_text>: more than 1,048,576 characters; a configuration is at most that.")


MODEL_REQUIRED = "A model is required. Fix: Name the model"


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_model_is_a_model_not_given_on_every_face(capsys, tmp_path, blank):
    """MCP said "model must be a non-empty string" where the CLI's MODEL '' said a model is required."""
    assert cli_refusal(capsys, ["memory", blank, "--gpu", "h100"]).startswith(MODEL_REQUIRED)
    assert cli_refusal(capsys, ["memory", "--model", blank, "--gpu", "h100"]).startswith(MODEL_REQUIRED)
    assert mcp_refusal("estimate_memory", {"model": blank, "gpu": "h100"}).startswith(MODEL_REQUIRED)
    batch = tmp_path / "asks.jsonl"
    batch.write_text(json.dumps({"model": blank, "gpu": "h100"}) + "\n", encoding="utf-8")
    assert cli.main(["memory", "--batch", str(batch)]) == cli.EXIT_USAGE
    assert json.loads(capsys.readouterr().out)["error"].startswith(MODEL_REQUIRED)


@pytest.mark.parametrize("blank", ["", "   "])
def test_describe_of_a_blank_model_is_refused_in_the_same_words(capsys, blank):
    """describe said 'describe needs a model. Fix: meshplan describe llama-3.1-8b' (MODEL ''), 'model must be a
    non-empty string' (MODEL of spaces, and MCP's describe_model) where every other ask says a model is required."""
    assert cli_refusal(capsys, ["describe", blank]).startswith(MODEL_REQUIRED)
    assert cli_refusal(capsys, ["describe"]).startswith(MODEL_REQUIRED)
    assert mcp_refusal("describe_model", {"model": blank}).startswith(MODEL_REQUIRED)
    with pytest.raises(MeshplanError, match=r"^A model is required"):
        api.describe_model(blank)


@pytest.mark.parametrize(("tool", "field"), [("estimate_memory", "seq_length"), ("estimate_memory", "gpu"),
                                            ("recommend_parallelism", "top_k")])
def test_a_null_for_an_argument_with_a_default_is_the_argument_left_out_on_every_face(capsys, tmp_path, tool, field):
    """A batch line's (and the api's) null is a field left out; the MCP tools refused a null for an argument with a
    default, 'seq_length: Input should be a valid integer (got None)', where the batch line answered at 4096."""
    asked = {"model": "llama-3.1-8b", "num_gpus": 8, "global_batch_size": 64}
    result = call_tool(tool, {**asked, field: None})
    assert not result.is_error, result.content[0].text[:300]
    assert result.structured_content == call_tool(tool, asked).structured_content
    if tool == "estimate_memory":
        batch = tmp_path / "asks.jsonl"
        batch.write_text(json.dumps({**asked, field: None}) + "\n", encoding="utf-8")
        assert cli.main(["memory", "--batch", str(batch)]) == cli.EXIT_OK
        said = json.loads(capsys.readouterr().out)
        assert said["peak_bytes"] == result.structured_content["peak_bytes"]


@pytest.mark.parametrize("field", ["moe_routing_imbalance", "rollout_memory_fraction", "headroom",
                                   "optimizer_offload_fraction", "cpu_memory_per_node",
                                   "network_gbps_per_node"])
@pytest.mark.parametrize(("token", "shown"), [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf")])
def test_a_float_field_refuses_nan_and_infinity_as_not_finite(capsys, tmp_path, field, token, shown):
    """Python's json reads NaN and Infinity (a batch line here, an MCP call below): they were refused by a bound, in
    words that hid why ('less than or equal to 1024 (got nan)')."""
    batch = tmp_path / "asks.jsonl"
    batch.write_text(f'{{"model": "llama-3.1-8b", "num_gpus": 8, "{field}": {token}}}\n', encoding="utf-8")
    assert cli.main(["memory", "--batch", str(batch)]) == cli.EXIT_USAGE
    error = json.loads(capsys.readouterr().out)["error"]
    assert error == f"Invalid request: {field}: Input should be a finite number (got {shown})."


def test_nan_sent_over_http_is_refused_as_not_finite(http_server):
    """The MCP tools' own argument check (built from Request's fields) refuses it too, not only parse_request."""
    status, headers, _ = post(http_server, INIT)
    assert status == 200
    session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    post(http_server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    body = (b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "estimate_memory", "arguments": '
            b'{"model": "mixtral-8x7b", "num_gpus": 8, "moe_routing_imbalance": NaN}}}')
    status, _, text = post(http_server, body, session)
    result = sse_data(text)["result"]
    assert status == 200 and result["isError"]
    assert "moe_routing_imbalance: Input should be a finite number (got nan)." in result["content"][0]["text"]


def test_import_names_the_framework_a_misspelt_one_means_as_mcp_does(capsys):
    """`meshplan import --framework torchtitn` listed every framework without the near one; config_text's
    framework on MCP named it."""
    toml = "tests/configs/torchtitan_llama3_8b.toml"
    with pytest.raises(SystemExit) as exc:
        cli.main(["import", toml, "--framework", "torchtitn"])
    assert exc.value.code == cli.EXIT_USAGE
    assert "invalid choice 'torchtitn'; did you mean 'torchtitan'?" in capsys.readouterr().err
    with open(toml, encoding="utf-8") as handle:
        said = mcp_refusal("estimate_memory", {"config_text": handle.read(), "framework": "torchtitn", "num_gpus": 8})
    assert "Did you mean framework='torchtitan'?" in said


@pytest.fixture
def taken_port():
    """A loopback port a listening socket holds for the test."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield held.getsockname()[1]


@pytest.mark.parametrize("entry", ["meshplan", "meshplan-mcp"])
@pytest.mark.parametrize(("where", "said"), [
    ("taken", "the port is in use"),
    ("192.0.2.1", ""),  # TEST-NET-1 (RFC 5737): an address no machine of ours has
])
def test_serving_where_it_cannot_bind_is_a_refusal_not_a_claim(capsys, taken_port, entry, where, said):
    """uvicorn bound the socket after the server printed that it serves there, then logged its own 'ERROR: [Errno
    98] ... address already in use' and exited 3; now the bind comes first and is said as every refusal is."""
    host, port = ("127.0.0.1", taken_port) if where == "taken" else (where, free_port())
    argv = ["--http", "--host", host, "--port", str(port)]
    code = cli.main(["serve", *argv]) if entry == "meshplan" else mcp_main(argv)
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "server on" not in err and "Traceback" not in err, err
    assert err.startswith(f"{entry}: Cannot serve on {host}:{port}: {said}"), err
    fix = "Fix: Pass another --port" if where == "taken" else "Fix: Pass --host an address of this machine"
    assert fix in err


@pytest.mark.parametrize("entry", ["meshplan", "meshplan-mcp"])
@pytest.mark.parametrize(("flags", "named"), [
    (["--port", "9000"], "--port sets"),
    (["--host", "0.0.0.0", "--allowed-host", "box"], "--host and --allowed-host set"),
    (["--transport", "stdio", "--port", "9000"], "--port sets"),
])
def test_http_flags_on_a_stdio_server_are_refused(capsys, entry, flags, named):
    """`meshplan serve --port 9000` served on stdio and bound nothing, without a word."""
    code = cli.main(["serve", *flags]) if entry == "meshplan" else mcp_main(flags)
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "waiting for a client" not in err, err
    assert err.startswith(f"{entry}: {named} where the HTTP server binds, and this server runs on stdio"), err
    assert "Fix: Add --http" in err


@pytest.mark.parametrize("entry", ["meshplan", "meshplan-mcp"])
@pytest.mark.parametrize("flags", [["--http", "--transport", "stdio"], ["--transport", "stdio", "--http"]])
def test_two_transports_named_are_refused(capsys, entry, flags):
    """`serve --http --transport stdio` shared one argparse destination: the last flag won without a word."""
    code = cli.main(["serve", *flags]) if entry == "meshplan" else mcp_main(flags)
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "waiting for a client" not in err, err
    assert err.startswith(f"{entry}: --http and --transport stdio name two transports."), err


TITAN_TOML = "tests/configs/torchtitan_llama3_8b.toml"


@pytest.mark.parametrize("target", ["deepspeed", "megatron-core", "torchtitan"])
def test_render_reads_a_config_as_its_own_framework_on_cli_and_mcp(capsys, target):
    """`meshplan render deepspeed --config torchtitan.toml` read the TOML as a DeepSpeed file and refused it ('meshplan
    reads deepspeed from shell or json files'), where render_config with the same config_text read it as torchtitan's
    and wrote (or refused, by the target's rules) the plan for DeepSpeed: the CLI now reads it as MCP does."""
    with open(TITAN_TOML, encoding="utf-8") as handle:
        served = call_tool("render_config", {"config_text": handle.read(), "framework": target, "num_gpus": 8})
    code = cli.main(["render", target, "--config", TITAN_TOML, "--num-gpus", "8", "--json"])
    out, err = capsys.readouterr()
    assert "reads deepspeed from" not in err
    if served.is_error:  # refused by the target's rules, in the same words
        assert code == cli.EXIT_FINDINGS
        assert err.strip().removeprefix("meshplan: ") == served.content[0].text.removeprefix(
            "Error executing tool render_config: ")
    else:
        assert code == cli.EXIT_OK and json.loads(out)["text"] == served.structured_content["text"]


def test_batch_refuses_a_config_it_would_ignore(capsys, tmp_path):
    """`memory --config FILE --batch LINES` answered each line as if --config were not there."""
    batch = tmp_path / "asks.jsonl"
    batch.write_text('{"model": "llama-3.1-8b", "num_gpus": 8}\n', encoding="utf-8")
    said = cli_refusal(capsys, ["memory", "--config", TITAN_TOML, "--batch", str(batch)])
    assert said == (f"--batch takes every request from {batch}; --config {TITAN_TOML} would be ignored. Fix: Put the "
                    "fields in each JSON line, or drop --batch.")


def test_every_patterned_request_field_is_refused_in_words():
    """A field whose value must match a pattern has its words in PATTERN_WORDS (a new pattern without them would
    show the user its regular expression again)."""
    patterned = {name for name, field in Request.model_fields.items()
                 if any(getattr(m, "pattern", None) for m in field.metadata)}
    assert patterned == set(PATTERN_WORDS)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("framework_version", "banana",
     "a release number that starts with a digit (0.3, 0.19.2), main, or main@YYYY-MM-DD"),
    ("selective_ac_option", "0", "'op' or a whole number of blocks, 1 to 9999"),
])
def test_a_value_off_its_pattern_is_refused_in_words_on_cli_and_mcp(capsys, field, value, words):
    """'String should match pattern '^[0-9][0-9A-Za-z.+-]*$|^main$'' was the refusal on every face."""
    said = f"Invalid request: {field}: Input should be {words} (got {value!r})."
    flag = "--" + field.replace("_", "-")
    assert cli_refusal(capsys, ["memory", *CLI_JOB, "--framework", "torchtitan", flag, value]) == said
    assert mcp_refusal("estimate_memory", {**JOB, "framework": "torchtitan", field: value}) == said


def test_a_blank_model_beside_a_config_leaves_the_files_model(capsys):
    """With config_text, model '' overrode the file's model and the tool said a model is required; the CLI's MODEL ''
    beside --config was dropped and planned the file's."""
    with open(TITAN_TOML, encoding="utf-8") as handle:
        served = call_tool("estimate_memory", {"config_text": handle.read(), "model": "", "num_gpus": 8})
    assert not served.is_error, served.content[0].text
    for argv in (["memory", "", "--config", TITAN_TOML], ["memory", "--model", " ", "--config", TITAN_TOML]):
        assert cli.main([*argv, "--num-gpus", "8", "--json"]) == cli.EXIT_OK
        assert json.loads(capsys.readouterr().out)["peak_bytes"] == served.structured_content["peak_bytes"]
