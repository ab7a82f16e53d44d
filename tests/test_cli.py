"""The meshplan command: JSON output, readable tables, clean errors and exit codes."""

import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver.exceptions import ToolError
from tree_under_test import tree_env

from meshplan import api
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.request.parse import parse_request


def test_describe_json(capsys):
    assert main(["describe", "meta-llama/Llama-3.1-8B", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_params"] == 8030261248
    for key in ("name", "hf_id", "total_params", "active_params", "mtp_params", "components"):
        assert key in out


def test_describe_prints_the_published_counts_source_whole(capsys):
    """`describe bloom-176b` printed 'published: 176,247,271,424' with no source: the source, in [brackets], began
    with a lower-case word ('bigscience/bloom model card ...') and the console took it for a markup tag and dropped
    it; every other source was cut at 100 characters mid-word ('... model card: 8B; archi]')."""
    from meshplan import api

    for key in ("bloom-176b", "llama-3.1-8b"):
        assert main(["describe", key]) == 0
        out = " ".join(capsys.readouterr().out.split())
        source = " ".join(api.describe_model(key).published["source"].split())
        assert f"[{source}]" in out


def test_models_json_lists_the_catalog(capsys):
    assert main(["models", "--json"]) == 0
    keys = {m["key"] for m in json.loads(capsys.readouterr().out)}
    assert {"llama-3.1-8b", "deepseek-v3", "gpt-oss-120b", "kimi-k2"} <= keys


def test_unknown_model_is_an_error_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "describe", "no-such-model"],
                          capture_output=True, text=True, env=tree_env())
    assert proc.returncode == 2
    assert "Unknown model 'no-such-model'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_reader_that_closes_the_pipe_ends_it_quietly():
    """`meshplan min-gpus ... | head -1` printed 'meshplan: [Errno 32] Broken pipe' and exited 2, as if the request
    were wrong; a reader gone before the answer is written now ends meshplan silently with the shell's SIGPIPE status
    (the read end is closed before meshplan writes, so the write always meets no reader). The JSON and min-gpus'
    lines are print's; the tables are rich's, whose own handler already ended quietly (exit 1)."""
    proc = subprocess.Popen([sys.executable, "-m", "meshplan.faces.cli", "describe", "llama-3.1-8b", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=tree_env())
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 141
    assert stderr == ""


def test_readable_table(capsys):
    assert main(["describe", "mixtral-8x7b"]) == 0
    out = capsys.readouterr().out
    assert "routed_experts" in out and "total" in out


def test_recommend_table_for_an_impossible_job_shows_the_closest_misses(capsys):
    assert main(["recommend", "llama-3.1-70b", "--num-gpus", "2"]) == 1  # nothing ranked: exit 1, like check
    out = capsys.readouterr().out
    assert "No layout fits" in out and "over by" in out
    assert re.search(r"smallest GPU count that fits: \d+", out)  # the count itself: tests/test_search.py


def test_closest_misses_that_differ_only_in_their_split_say_which_split(capsys, monkeypatch):
    """Llama-3.1-8B on 7 H100 at 131,072 tokens: the closest misses held two 'TP1 PP7 DP1' rows at micro-batch 1,
    ZeRO 3, full recompute (150.47 and 155.23 GiB) that differed only in first/last stage layers, and the table and
    the MCP summary (which named none of them) could not tell them apart. Both name the split where two rows would
    read alike (check/split.layout_cells)."""
    from meshplan.faces.mcp import tools

    monkeypatch.setenv("COLUMNS", "200")  # each row on one line (at 80 columns the layout cell wraps its split)
    args = dict(model="llama-3.1-8b", gpu="h100", num_gpus=7, seq_length=131072)
    assert main(["recommend", *(f"--{k.replace('_', '-')}={v}" for k, v in args.items() if k != "model"),
                 args["model"]]) == 1
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("TP1 PP7 DP1")]
    assert len(rows) == 2 and len(set(rows)) == 2 and all("first_stage_layers=" in row for row in rows), rows
    summary = tools.recommend_parallelism(**args).summary
    named = re.findall(r"TP1 PP7 DP1 first_stage_layers=\d+ last_stage_layers=\d+", summary)
    assert len(set(named)) == 2 and "TP1 PP1 DP7 (micro-batch 1" in summary, summary


def test_model_given_twice_must_agree(capsys):
    """The positional MODEL and --model used to disagree silently (the flag won)."""
    assert main(["memory", "llama-3.1-8b", "--model", "llama-3.1-70b", "--num-gpus", "8"]) == 2
    assert "Two different models given: MODEL 'llama-3.1-8b' and --model 'llama-3.1-70b'" in capsys.readouterr().err
    assert main(["describe", "llama-3.1-8b", "--model", "qwen3-8b"]) == 2
    assert "Two different models" in capsys.readouterr().err
    assert main(["memory", "llama-3.1-8b", "--model", "llama-3.1-8b", "--num-gpus", "8", "--json"]) == 0


def test_render_framework_given_twice_must_agree(capsys):
    assert main(["render", "megatron-core", "llama-3.1-8b", "--num-gpus", "8", "--framework", "verl"]) == 2
    assert "Two different frameworks given" in capsys.readouterr().err


def test_render_with_the_model_first_and_framework_as_a_flag_renders_it(capsys):
    """`render llama-3.1-8b --framework torchtitan` (recommend's flags line copied) took the model for FRAMEWORK and
    was refused; with --framework given, the first argument is the model: the same snippet as FRAMEWORK MODEL."""
    assert main(["render", "llama-3.1-8b", "--framework", "torchtitan", "--num-gpus", "8"]) == 0
    flagged = capsys.readouterr().out
    assert main(["render", "torchtitan", "llama-3.1-8b", "--num-gpus", "8"]) == 0
    assert flagged == capsys.readouterr().out and "torchtitan" in flagged and "TP1 PP1 DP8" in flagged
    assert main(["render", "llama-3.1-8b", "--framework", "torchtitan", "--model", "llama-3.1-70b"]) == 2
    assert "No adapter renders 'llama-3.1-8b'" in capsys.readouterr().err  # a model given twice: still refused


def test_render_with_the_model_first_says_framework_comes_first(capsys):
    """`render llama-3.1-8b` with no framework anywhere answers with the order, not 'A model is required'."""
    assert main(["render", "llama-3.1-8b"]) == 2
    assert "meshplan render FRAMEWORK llama-3.1-8b" in capsys.readouterr().err
    assert main(["render", "nanotron"]) == 2  # a framework, named as such: no word on the order
    assert "memory convention only" in (err := capsys.readouterr().err) and "comes first" not in err


def test_every_subcommand_help_renders(monkeypatch):
    """--help is built from the request fields' descriptions; argparse %-formats help text, so a '%' in a
    description (e.g. '30% more') must be escaped, or `meshplan <command> --help` dies with a traceback."""
    import argparse

    from meshplan.faces.cli import build_parser
    from meshplan.schema.request import Request

    monkeypatch.setattr(Request.model_fields["seq_length"], "description", "tokens per sample (30% more is 1.3x)")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        text = sub.format_help()
        assert "usage:" in text, name
        if any(a.dest == "seq_length" for a in sub._actions):
            assert "30% more" in text, name


def test_help_never_splits_a_framework_name_across_lines(monkeypatch, capsys):
    """argparse wraps on hyphens by default: at a narrow terminal 'nemo-automodel' came out as 'nemo-' / 'automodel'."""
    import pytest as _pytest

    from meshplan.faces.cli import main as cli_main

    monkeypatch.setenv("COLUMNS", "40")
    with _pytest.raises(SystemExit):
        cli_main(["render", "--help"])
    out = capsys.readouterr().out
    assert "nemo-automodel" in out and "megatron-bridge" in out
    assert not any(line.rstrip().endswith(("nemo-", "megatron-")) for line in out.splitlines())


def _batch_lines(monkeypatch, capsys, argv: list[str], lines: list[Any]) -> tuple[int, list[dict]]:
    text = "\n".join(json.dumps(line) for line in lines) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    code = main([*argv, "--batch", "-"])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_recommend_and_min_gpus_take_batch_lines_as_their_mcp_tools_take_arguments(monkeypatch, capsys):
    """`meshplan recommend --batch` answered "unknown flag '--batch' (did you mean '--global-batch-size'?)": only
    memory, throughput and check read request lines. Now recommend and min-gpus do too, each line's top_k / max_gpus
    taken as recommend_parallelism / minimum_gpus take them (over --top-k / --max-gpus), refused in their words."""
    ask = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8}
    code, out = _batch_lines(monkeypatch, capsys, ["recommend", "--top-k", "2"],
                             [{**ask, "top_k": 1}, ask, {**ask, "top_k": 0}])
    assert code == 2 and [line["line"] for line in out] == [1, 2, 3]
    assert {k: v for k, v in out[0].items() if k != "line"} == \
        api.recommend(parse_request(ask), top_k=1).model_dump(mode="json")
    assert len(out[1]["candidates"]) == 2  # --top-k for a line that names none
    with pytest.raises(ToolError) as refused:
        tools.recommend_parallelism(**ask, top_k=0)
    assert out[2]["error"] == str(refused.value)

    code, out = _batch_lines(monkeypatch, capsys, ["recommend"], [{**ask, "num_gpus": 2, "model": "llama-3.1-70b"}])
    assert code == 1 and out[0]["candidates"] == []  # nothing ranked: exit 1, as without --batch

    code, out = _batch_lines(monkeypatch, capsys, ["min-gpus", "--max-gpus", "64"],
                             [{"model": "llama-3.1-70b", "max_gpus": 8}, {"model": "llama-3.1-8b"}])
    assert code == 1 and out[0]["num_gpus"] is None and out[0]["searched_to"] == 8
    assert {k: v for k, v in out[1].items() if k != "line"} == \
        api.minimum_gpus(parse_request({"model": "llama-3.1-8b"}), max_gpus=64).model_dump(mode="json")


def test_the_readmes_catalog_counts_are_the_catalogs():
    """The README's tour said 'the catalog: 31 architectures' and its accuracy table '38 catalog models' when
    `meshplan models` listed 40; both now name the count the command prints."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    count = len(api.list_models())
    assert f"# the catalog: {count} models, exact counts" in readme
    assert f"| parameter counts, {count} catalog models" in readme


@pytest.mark.parametrize("argv", [
    # TP2 EP16 at ETP1: the row says 'TP2 PP1 EP16 DP8', and --tp 2 --ep 16 alone resolves etp=2 (WS002 at 16 GPUs)
    ["qwen3-30b-a3b", "--gpu", "h100", "--num-gpus", "16", "--framework", "megatron-bridge"],
    ["llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8", "--framework", "torchtitan"],  # a schedule beside the degrees
    ["qwen3-30b-a3b", "--gpu", "h100", "--num-gpus", "16", "--framework", "verl", "--job", "rl", "--algorithm", "grpo"],
])
def test_recommends_pick_is_printed_as_the_flags_that_check_it(capsys, argv):
    """The table names #1 in words ('TP2 PP1 EP16 DP8', ETP1 unsaid; 'pipeline_layout=...', 'flex MoE dispatcher'),
    and a user who typed them as flags got another plan (etp=tp, Megatron-Core's default) or a refusal. The CLI now
    prints #1 as the check line that asks for exactly it: run, it checks the same plan, which passes."""
    assert main(["recommend", *argv, "--top-k", "1", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]
    assert main(["recommend", *argv, "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("#1 as flags"))
    command = shlex.split(line.split(": ", 1)[1])
    assert command[:2] == ["meshplan", "check"] and "--etp" in command
    assert main([*command[1:], "--json"]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked["ok"] and checked["plan"] == best["plan"]


def test_the_flags_line_says_when_render_cannot_write_the_pick(capsys):
    """precision=fp8 on torchtitan: check passes and recommend ranks it, but render's torchtitan 0.3 command line has
    no fp8 key (a registry config's converter sets it) and refuses; the line said '(the same for memory, throughput
    and render torchtitan)'. It says render cannot write it, and why; the check line still checks the same plan."""
    argv = ["llama-3.1-8b", "--gpu", "gb200", "--num-gpus", "72", "--framework", "torchtitan", "--precision", "fp8"]
    assert main(["recommend", *argv, "--top-k", "1"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("#1 as flags"))
    assert line.startswith("#1 as flags (the same for memory and throughput; render torchtitan cannot write "
                           "precision=fp8 - fp8 in torchtitan is a model converter")
    command = shlex.split(line.split("): meshplan check ", 1)[1])
    assert main(["check", *command]) == 0
    capsys.readouterr()
    assert main(["render", "torchtitan", *command]) == 2
