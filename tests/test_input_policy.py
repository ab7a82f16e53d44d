"""What every face accepts as input (issue 27): one strict type policy, ASCII digits only, bounded and de-duplicated
lists, one headroom policy for check, memory and recommend, and recompute_modules refused alike where they would be
ignored. Each item goes through meshplan.api, the CLI (flags and --batch) and the MCP tools."""

from __future__ import annotations

import json
from typing import get_args

import pytest
from mcp import Client

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.faces.mcp.server import app
from meshplan.request.parse import ascii_float, ascii_int, parse_request
from meshplan.schema.choices import RecomputeModule
from meshplan.schema.request import Request

L8B = {"model": "llama-3.1-8b", "num_gpus": 8, "global_batch_size": 64}
# 70B on 64 GPUs at TP8 PP2: fits with 37% of the H100 free (the command)
L70B = {"model": "llama-3.1-70b", "num_gpus": 64, "tp": 8, "pp": 2}


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _mcp(tool: str, args: dict) -> tuple[bool, str, dict | None]:
    async with Client(app) as client:
        result = await client.call_tool(tool, args)
    text = result.content[0].text if result.content else ""
    return result.is_error, text, result.structured_content


def _batch(tmp_path, command: str, lines: list[dict], capsys) -> list[dict]:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    main([command, "--batch", str(path)])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# --------------------------------------------------------------------------- strict types


@pytest.mark.parametrize("field,value", [("num_gpus", True), ("num_gpus", "8"), ("num_gpus", 8.0),
                                         ("sequence_parallel", "true"), ("sequence_parallel", 1),
                                         ("headroom", "0.2"), ("recompute_modules", "mlp")])
def test_api_and_parser_refuse_another_json_type(field, value):
    with pytest.raises(MeshplanError, match=f"Invalid request: {field}: Input should be a valid"):
        parse_request({**L8B, field: value})
    with pytest.raises(ValueError):
        Request(**{**L8B, field: value})  # the Python face: the model itself is strict


def test_a_float_field_takes_an_integer():
    assert parse_request({**L8B, "headroom": 0}).headroom == 0.0


def test_batch_lines_are_strict(tmp_path, capsys):
    out = _batch(tmp_path, "memory", [{**L8B, "num_gpus": "8"}, {**L8B, "num_gpus": True}, L8B], capsys)
    assert ["error" in line for line in out] == [True, True, False]
    assert "num_gpus: Input should be a valid integer (got '8')" in out[0]["error"]


@pytest.mark.anyio
@pytest.mark.parametrize("value", [True, "8", 8.5])
async def test_mcp_refuses_what_its_integer_schema_refuses(value):
    error, text, _ = await _mcp("estimate_memory", {**L8B, "num_gpus": value})
    assert error and "num_gpus" in text and "valid integer" in text


# --------------------------------------------------------------------------- ASCII digits


@pytest.mark.parametrize("text", ["٨", "８", "²", "8.0", "1_000", ""])
def test_cli_integers_are_ascii_digits(text):
    with pytest.raises(ValueError, match="ASCII digits"):
        ascii_int(text)


def test_cli_numbers_are_ascii_digits_and_name_the_character():
    assert (ascii_int(" 12 "), ascii_float(".5"), ascii_float("1e3"), ascii_float("2")) == (12, 0.5, 1000.0, 2.0)
    for text in ("٠.٥", "nan", "inf"):
        with pytest.raises(ValueError, match="ASCII digits"):
            ascii_float(text)
    with pytest.raises(ValueError, match=r"'٨' \(U\+0668\) is not an ASCII digit"):
        ascii_int("٨")


def test_cli_flag_with_another_scripts_digit_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ended:
        main(["memory", "llama-3.1-8b", "--num-gpus", "٨"])
    assert ended.value.code == 2
    assert "argument --num-gpus: expected an integer written in ASCII digits" in capsys.readouterr().err


def test_a_model_size_is_ascii_digits():
    assert api.describe_model("70B").generic
    with pytest.raises(MeshplanError, match="Unknown model"):
        api.describe_model("٧٠B")


# --------------------------------------------------------------------------- recompute_modules


def test_recompute_modules_are_bounded_and_each_given_once():
    with pytest.raises(MeshplanError, match=f"at most {len(get_args(RecomputeModule))} items"):  # one of each module
        parse_request({**L8B, "recompute_modules": ["mlp"] * 200_000})
    with pytest.raises(MeshplanError, match=r"each name at most once \('mlp' given more than once\)"):
        parse_request({**L8B, "recompute_modules": ["mlp", "core_attn", "mlp"]})
    with pytest.raises(MeshplanError, match="each name at most once"):
        parse_request({**L8B, "lora_targets": ["linear_qkv", "linear_qkv"]})
    with pytest.raises(MeshplanError, match=r"recompute_modules\.0: Input should be"):
        parse_request({**L8B, "recompute_modules": ["attention"]})


@pytest.mark.anyio
async def test_mcp_schema_bounds_recompute_modules():
    async with Client(app) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    schema = tools["estimate_memory"].input_schema["properties"]["recompute_modules"]
    assert schema["uniqueItems"] is True
    assert schema["anyOf"][0]["maxItems"] == len(get_args(RecomputeModule))


@pytest.mark.anyio
async def test_recompute_modules_with_no_recompute_is_refused_alike_on_every_face():
    """RC004 blocks an estimate: memory and throughput refuse what check reports, rather than ignore the modules."""
    fields = {**L8B, "recompute": "none", "recompute_modules": ["mlp"]}
    req = parse_request(fields)
    for run in (api.estimate_memory, api.estimate_throughput):
        with pytest.raises(MeshplanError, match="RC004: recompute_modules=mlp with recompute=none"):
            run(req)
    report = api.check_config(req)
    assert not report.ok and "RC004" in [f.id for f in report.findings]
    assert main(["memory", "llama-3.1-8b", "--num-gpus", "8", "--recompute", "none",
                 "--recompute-modules", "mlp"]) == 2
    error, text, _ = await _mcp("estimate_memory", fields)
    assert error and "RC004" in text


def test_recompute_modules_alone_mean_selective():
    from meshplan.request.resolve import resolve

    job, plan = resolve(parse_request({**L8B, "recompute_modules": ["mlp"]}))
    assert plan.recompute == "selective" and any(n.startswith("recompute not given: selective") for n in job.notes)
    assert api.estimate_memory(parse_request({**L8B, "recompute_modules": ["mlp"]})).fits


# --------------------------------------------------------------------------- one headroom policy


@pytest.mark.anyio
async def test_an_asked_headroom_is_required_by_check_and_memory_on_every_face():
    """37% free: fits the GPU, not the 50% the request asks to keep; recommend's threshold is the same one."""
    from meshplan.search.policy import headroom_for

    plain = api.estimate_memory(parse_request(L70B))
    free = plain.headroom_bytes / plain.capacity_bytes
    assert plain.fits and 0.3 < free < 0.5
    req = parse_request({**L70B, "headroom": 0.5})
    memory = api.estimate_memory(req)
    assert not memory.fits and memory.headroom_bytes == plain.headroom_bytes
    check = api.check_config(req)
    (mem001,) = [f for f in check.findings if f.id == "MEM001"]
    assert not check.ok and "that headroom=0.5 leaves of 79.6 GiB" in mem001.message
    assert headroom_for(req) == 0.5
    assert main(["check", "llama-3.1-70b", "--num-gpus", "64", "--tp", "8", "--pp", "2", "--headroom", "0.5"]) == 1
    _, _, structured = await _mcp("estimate_memory", {**L70B, "headroom": 0.5})
    assert structured["fits"] is False
    _, _, structured = await _mcp("check_config", {**L70B, "headroom": 0.5})
    assert structured["ok"] is False
    # a headroom the layout keeps: ok; without one, fits means within the GPU and MEM002 warns under its 10%
    assert api.check_config(parse_request({**L70B, "headroom": 0.3})).ok


def test_mem002_reads_the_asked_headroom():
    from meshplan.check.memory import headroom_threshold
    from meshplan.search.policy import min_headroom_fraction

    assert headroom_threshold(None) == min_headroom_fraction() == 0.10
    assert headroom_threshold(0.25) == 0.25
    # no headroom asked: 8B on 8 H100s with bf16 Adam moments keeps 6% free, MEM002 warns at the default 10%
    tight = {**L8B, "optimizer_state_dtype": "bf16"}
    report = api.check_config(parse_request(tight))
    assert report.ok and 0 < report.memory.headroom_bytes / report.memory.capacity_bytes < 0.10
    assert [f.id for f in report.findings] == ["MEM002"]
    # the request's own threshold: 0.05 is kept (no warning), 0 asks for nothing, 0.2 is not kept (MEM001)
    assert [f.id for f in api.check_config(parse_request({**tight, "headroom": 0.05})).findings] == []
    assert [f.id for f in api.check_config(parse_request({**tight, "headroom": 0.0})).findings] == []
    assert [f.id for f in api.check_config(parse_request({**tight, "headroom": 0.2})).findings] == ["MEM001"]
