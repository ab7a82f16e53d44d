"""Beside config_text, an MCP argument the client sent overrides the file whatever its value, as a CLI flag does, and
one it left out does not: the tools are handed the arguments sent, never the schema's defaults.

The tools once got every argument filled with its default and took "equal to the default" for "left out", so
seq_length=4096 sent beside the GPT-3 175B script (which sets 2048) kept the file's 2048 on MCP where
`meshplan min-gpus --config ... --seq-length 4096` used 4096: the two faces gave different answers.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcp_calls import call_tool, call_tools
from pydantic import BaseModel

from meshplan.faces import cli
from meshplan.faces.mcp import tools

GPT3_SCRIPT = Path(__file__).parent / "configs" / "megatron_gpt3_175b.sh"  # --seq-length 2048
DEEPSPEED_JSON = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}'


def test_the_tool_is_handed_the_arguments_sent_and_no_default():
    class Arguments(BaseModel):
        seq_length: int = 4096
        framework: str = "megatron-core"
        config_text: str | None = None

    handed: list[dict] = []
    call = tools.strict_arguments(lambda **args: handed.append(args), Arguments)
    call(seq_length=4096, framework=None, config_text="x")  # the default sent; a null is left out
    call()
    assert handed == [{"seq_length": 4096, "config_text": "x"}, {}]


def test_a_sent_seq_length_at_its_default_overrides_the_file():
    text = GPT3_SCRIPT.read_text()
    assert tools.to_request({"config_text": text, "seq_length": 4096}).seq_length == 4096
    assert tools.to_request({"config_text": text}).seq_length == 2048
    assert tools.to_request({"config_text": text, "seq_length": None}).seq_length == 2048  # null: left out


def _cli_min_gpus(capsys, *flags: str) -> dict:
    cli.main(["min-gpus", "--config", str(GPT3_SCRIPT), *flags, "--json"])
    return json.loads(capsys.readouterr().out)


def test_min_gpus_with_seq_length_4096_beside_the_gpt3_script_agrees_between_cli_and_mcp(capsys):
    text = GPT3_SCRIPT.read_text()
    sent, left_out = call_tools(("minimum_gpus", {"config_text": text, "seq_length": 4096}),
                                ("minimum_gpus", {"config_text": text}))
    on_cli = _cli_min_gpus(capsys, "--seq-length", "4096")
    assert not sent.is_error and not left_out.is_error
    mcp = sent.structured_content
    assert (mcp["num_gpus"], mcp["candidate"], mcp["rationale"]) == \
        (on_cli["num_gpus"], on_cli["candidate"], on_cli["rationale"])
    assert mcp["num_gpus"] is None and "SQ001" in mcp["rationale"]  # 4096 is past GPT-3's 2048 positions
    file_own = _cli_min_gpus(capsys)  # the file's 2048, on both faces, when seq_length is left out
    assert left_out.structured_content["num_gpus"] == file_own["num_gpus"] == 128
    assert left_out.structured_content["candidate"]["plan"] == file_own["candidate"]["plan"]


def test_a_sent_framework_at_its_default_is_honoured(capsys, tmp_path):
    """framework="megatron-core" sent beside a DeepSpeed JSON is the caller's choice: refused in the CLI's words
    (`--framework megatron-core --config ds.json`), not replaced by the file's own framework."""
    path = tmp_path / "ds_config.json"
    path.write_text(DEEPSPEED_JSON)
    assert cli.main(["check", "--config", str(path), "--model", "llama-3.1-8b", "--num-gpus", "8",
                     "--framework", "megatron-core", "--json"]) == 2
    on_cli = capsys.readouterr().err
    result = call_tool("check_config", {"model": "llama-3.1-8b", "num_gpus": 8, "config_text": DEEPSPEED_JSON,
                                        "framework": "megatron-core"})
    said = result.content[0].text
    assert result.is_error and "reads megatron-core from shell or yaml files, not from a json file" in said
    assert said.split(": ", 2)[-1] in on_cli


def test_a_framework_left_out_or_null_lets_the_reader_detect_the_file():
    """The bug the old default filter guarded against: the framework's default, megatron-core, read a DeepSpeed JSON
    as a Megatron script. Left out (or null) it is not sent, and the file is read as DeepSpeed's."""
    for extra in ({}, {"framework": None}):
        result = call_tool("check_config", {"model": "llama-3.1-8b", "num_gpus": 8, "config_text": DEEPSPEED_JSON,
                                            **extra})
        assert not result.is_error and result.structured_content["framework"] == "deepspeed"
        assert result.structured_content["plan"]["zero_stage"] == 3
