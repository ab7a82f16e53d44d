"""The command line as a person meets it: batch files, the MCP server in a terminal, tables at 80 columns
and in a pipe, --help and --version, and usage errors that list only the values that apply."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tree_under_test import tree_env

from meshplan import __version__, api
from meshplan.faces.cli import ECHO_CHARS, MAX_LINE_CHARS, main
from meshplan.knowledge.hardware import gpu_catalog
from meshplan.schema.request import Request

GOOD = {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2}
CHECK_FAILS = {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 3}  # TP001: 32 heads over tp=3


def _batch(tmp_path: Path, capsys, command: str, lines: list[str]) -> tuple[int, list[dict]]:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code = main([command, "--batch", str(path)])
    return code, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# --------------------------------------------------------------------------- --batch


def test_batch_answers_every_input_line_in_order_with_its_number(tmp_path, capsys):
    lines = [json.dumps(GOOD), "", "not json", "[1, 2]", json.dumps({"model": "llama-3.1-8b", "tpp": 2}),
             "   ", json.dumps(GOOD)]
    code, out = _batch(tmp_path, capsys, "memory", lines)
    assert code == 2  # some lines failed
    assert [o["line"] for o in out] == [1, 2, 3, 4, 5, 6, 7]
    assert "peak_bytes" in out[0] and "peak_bytes" in out[6] and out[0]["plan"]["tp"] == 2
    assert "Blank line" in out[1]["error"] and "Blank line" in out[5]["error"]
    assert "Not JSON" in out[2]["error"] and "'not json'" in out[2]["error"]
    assert "JSON object" in out[3]["error"]
    assert "Unknown field 'tpp'" in out[4]["error"] and "'tp'" in out[4]["error"]


def test_batch_refuses_a_field_given_twice_with_two_values(tmp_path, capsys):
    """{"num_gpus": 8, "num_gpus": 16} was answered at 16 (json keeps the last value): two answers to one question."""
    code, out = _batch(tmp_path, capsys, "memory", ['{"model": "llama-3.1-8b", "num_gpus": 8, "num_gpus": 16}',
                                                    '{"model": "llama-3.1-8b", "num_gpus": 8, "num_gpus": 8}'])
    assert code == 2 and out[0]["error"].startswith("num_gpus is given twice, as 8 and 16.")
    assert out[1]["plan"]["dp"] == 8  # the same value twice says one thing


def test_batch_file_it_cannot_read_is_named_with_the_fix(tmp_path, capsys):
    """--batch naming a folder printed a bare '[Errno 21] Is a directory'."""
    assert main(["memory", "--batch", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"Cannot read the batch file {tmp_path}: Is a directory." in err and "Fix: Pass --batch a file" in err


def test_batch_exit_status_all_good_is_0_and_a_failed_check_is_1(tmp_path, capsys):
    code, out = _batch(tmp_path, capsys, "throughput", [json.dumps(GOOD)] * 2)
    assert code == 0 and [o["line"] for o in out] == [1, 2]
    code, out = _batch(tmp_path, capsys, "check", [json.dumps(GOOD), json.dumps(CHECK_FAILS)])
    assert code == 1
    assert out[0]["ok"] is True and out[1]["ok"] is False
    assert "TP001" in {f["id"] for f in out[1]["findings"]}
    # A bad line outranks a failed check: 2.
    code, out = _batch(tmp_path, capsys, "check", [json.dumps(CHECK_FAILS), "{"])
    assert code == 2 and out[1]["line"] == 2 and "error" in out[1]


def test_batch_never_echoes_a_huge_line_whole(tmp_path, capsys):
    huge = json.dumps({"model": "x" * (3 * MAX_LINE_CHARS)})
    not_json = "y" * (MAX_LINE_CHARS // 2)  # under the cap: parsed, and the error quotes only its start
    deep = "[" * 100_000  # json's recursion limit, not a traceback
    code, out = _batch(tmp_path, capsys, "memory", [huge, not_json, deep, json.dumps(GOOD)])
    assert code == 2 and [o["line"] for o in out] == [1, 2, 3, 4]
    assert f"{len(huge):,} characters" in out[0]["error"]
    for o in out[:3]:
        assert len(o["error"]) < ECHO_CHARS + 400, o["error"][:500]
    assert "peak_bytes" in out[3]


def test_batch_reads_stdin_and_refuses_flags_it_would_ignore(tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(GOOD) + "\n\n"))
    assert main(["memory", "--batch", "-"]) == 2
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["line"] for o in out] == [1, 2] and "peak_bytes" in out[0] and "Blank line" in out[1]["error"]
    assert main(["memory", "llama-3.1-8b", "--tp", "2", "--batch", "-"]) == 2
    assert "--batch takes every request" in capsys.readouterr().err


def test_batch_through_a_real_process_matches_line_numbers():
    proc = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "check", "--batch", "-"],
                          input=json.dumps(CHECK_FAILS) + "\n\n" + json.dumps(GOOD) + "\n",
                          capture_output=True, text=True, timeout=60, env=tree_env())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [json.loads(line)["line"] for line in proc.stdout.splitlines()] == [1, 2, 3]


# --------------------------------------------------------------------------- serve in a terminal


def _serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "meshplan.faces.cli", "serve", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tree_env())


def _stop(proc: subprocess.Popen, ready: str, timeout: float = 60) -> tuple[int, str, str]:
    """Wait until stderr says `ready`, send one SIGINT with stdin still open, and collect what came out."""
    seen, deadline = "", time.monotonic() + timeout
    while ready not in seen and time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stderr.readline()
    assert ready in seen, seen
    time.sleep(0.5)  # let the server reach its read loop
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("still running 5 s after the first Ctrl-C")
    out, err = proc.stdout.read(), seen + proc.stderr.read()
    proc.stdin.close()
    return code, out, err


def test_serve_on_stdio_says_what_it_waits_for_and_stops_on_the_first_ctrl_c():
    code, out, err = _stop(_serve(), "waiting for a client's JSON-RPC on stdin")
    assert code in (0, 130)
    assert "meshplan MCP server on stdio: waiting for a client's JSON-RPC on stdin; Ctrl-C to stop" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert out == ""  # stdout is the JSON-RPC wire: nothing else goes there


@pytest.mark.parametrize("http", [("--transport", "http"), ("--http",)], ids=["transport", "http-flag"])
def test_serve_over_http_prints_its_url_and_stops_on_ctrl_c(http):
    # `meshplan serve --http` (the short form the project's guide names) starts the same HTTP server
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = _stop(_serve(*http, "--port", str(port)), "Ctrl-C to stop")
    assert f"http://127.0.0.1:{port}/mcp" in err
    assert code in (0, 130) and "Traceback" not in err and out == ""


def test_meshplan_mcp_entry_point_stops_cleanly_too():
    proc = subprocess.Popen([sys.executable, "-m", "meshplan.faces.mcp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tree_env())
    code, out, err = _stop(proc, "waiting for a client's JSON-RPC")
    assert code in (0, 130) and "Traceback" not in err and out == ""


# --------------------------------------------------------------------------- tables at 80 columns


@pytest.fixture
def piped80(monkeypatch):
    """Output as a pipe sees it (capsys is not a terminal) at 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


def _table_lines(out: str, first_header: str) -> list[str]:
    """The header, the rule under it and the rows (a row starts with its rank or continues a wrapped cell)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first_header))
    end = next((i for i in range(start + 2, len(lines)) if not re.match(r"[\d ]", lines[i])), len(lines))
    return lines[start:end]


def test_recommend_table_fits_80_columns_with_whole_headers(piped80, capsys):
    assert main(["recommend", "mixtral-8x7b", "--num-gpus", "64"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    header = next(line for line in out.splitlines() if line.startswith("#"))
    assert header.split() == ["#", "layout", "mbs", "ZeRO", "recompute", "peak", "GiB", "tokens/s/GPU", "MFU",
                              "step", "s"]
    table = _table_lines(out, "#")
    assert len(table) >= 3
    for line in table:
        assert len(line.rstrip()) <= 80, line


def test_recommend_plain_output_states_what_it_compared_at(piped80, capsys):
    assert main(["recommend", "llama-3.1-8b", "--num-gpus", "8", "--seq-length", "8192",
                 "--global-batch-size", "256", "--gpu", "h200", "--framework", "torchtitan",
                 "--headroom", "0.2"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("compared at:"))
    assert "sequence length 8,192" in line and "global batch 256 sequences (2.1M tokens)" in line
    assert "(h200)" in line and "torchtitan" in line and "20% of GPU memory kept free" in line
    assert main(["recommend", "llama-3.1-8b", "--num-gpus", "8"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("compared at:"))
    assert "sequence length 4,096" in line and "(h100)" in line and "megatron-core" in line
    assert "10% of GPU memory kept free (MEM002 default)" in line


def _recommend(capsys, *args: str) -> tuple[dict, str]:
    """The same question asked with --json and in plain text: the report and the text a person reads. Both go through
    the CLI whole (its parser, its request, its printing); the plain-text ask is handed the search's answer to the
    --json ask when its request and top_k are the same (compared, not assumed), so the search runs once, not twice:
    what is compared is how each face prints one answer."""
    asked: list[tuple[Request, int, object]] = []
    real = api.recommend

    def once(req: Request, top_k: int = 5):
        for seen, k, result in asked:
            if seen == req and k == top_k:
                return result
        result = real(req, top_k=top_k)
        asked.append((req, top_k, result))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "recommend", once)
        main(["recommend", *args, "--json"])
        report = json.loads(capsys.readouterr().out)
        main(["recommend", *args])
    assert len(asked) == 1  # the plain-text ask was the same question
    return report, capsys.readouterr().out


def _folded(row: dict, plan: dict) -> str:
    """How the table names an equivalent: its degrees, its micro-batch and each knob that differs from its row's."""
    from meshplan.check.split import split_words
    from meshplan.schema.plan import Plan

    labels = {"zero_stage": "ZeRO", "recompute": "recompute", "sequence_parallel": "SP",
              "moe_token_dispatcher": "dispatcher"}
    knobs = [f"{label} {plan[k]}" for k, label in labels.items() if plan[k] != row[k]]
    split = [split_words(Plan(**plan)).replace(", ", " ")] if split_words(Plan(**plan)) != split_words(Plan(**row)) \
        else []
    return " ".join([f"{Plan(**plan).short()} mbs {plan['micro_batch_size']}", *knobs, *split])


def _with_inert_twins(monkeypatch) -> None:
    """api.recommend with each of the first three rows folding a twin the cost model cannot tell apart for a real
    reason, estimated: the row's plan with the flex MoE dispatcher, which a dense model never runs. The search meets
    no clones of its own any more (a ZeRO stage that shards nothing at its layout is one plan it offers once,
    tests/test_zero_one_plan.py), so the table's folding is fed them here."""
    from meshplan.search import search_job
    from meshplan.search.estimators import default_engine

    real = api.recommend

    def folding(req: Request, top_k: int = 5):
        rec = real(req, top_k=top_k)
        job, _ = search_job(req)
        engine = default_engine(job.framework)
        for row in rec.candidates[:3]:
            twin = row.plan.model_copy(update={"moe_token_dispatcher": "flex"})
            assert engine.throughput(job, twin).step_time_s == row.throughput.step_time_s  # the same numbers
            assert engine.memory(job, twin).peak_bytes == row.memory.peak_bytes
            row.equivalents = [twin]
        return rec

    monkeypatch.setattr(api, "recommend", folding)


def test_recommend_table_shows_every_folded_equivalent_under_its_row(piped80, capsys, monkeypatch):
    _with_inert_twins(monkeypatch)
    report, out = _recommend(capsys, "llama-3.1-8b", "--num-gpus", "4", "--framework", "megatron-core")
    table = _table_lines(out, "#")
    assert all(len(line.rstrip()) <= 80 for line in table) and "…" not in out
    rows: list[list[str]] = []  # each ranked row with the lines printed under it
    for line in table[2:]:
        if re.match(r"\s*\d", line):
            rows.append([line])
        else:
            rows[-1].append(line)
    assert [int(r[0].split()[0]) for r in rows] == [c["rank"] for c in report["candidates"]]
    assert sum(1 for c in report["candidates"] if c["equivalents"]) == 3  # the rows fed a twin show it
    for row, candidate in zip(rows, report["candidates"], strict=True):
        also = " ".join(" ".join(row).split()).partition("= also: ")[2]  # wrapped lines joined back
        assert also == ", ".join(_folded(candidate["plan"], p) for p in candidate["equivalents"]), row
        if also:  # one compact block under the row, continuation lines under its first item
            block = next(i for i, line in enumerate(row) if "= also: " in line)
            assert row[block].index("= also: ") == 3 and all(line.startswith(" " * 11) for line in row[block + 1:])


def test_folded_equivalents_wrap_between_items_and_are_never_cut():
    from meshplan.faces.display import _wrap_items

    items = ["TP1 PP4 CP2 EP16 DP8 mbs 2", "TP1 PP4 CP4 EP16 DP4 mbs 4", "TP1 PP4 CP8 EP16 DP2 mbs 8"]
    assert _wrap_items("   = also: ", items, 80) == [
        "   = also: TP1 PP4 CP2 EP16 DP8 mbs 2, TP1 PP4 CP4 EP16 DP4 mbs 4,",
        "           TP1 PP4 CP8 EP16 DP2 mbs 8"]
    assert _wrap_items("   = also: ", items, 40) == [
        "   = also: TP1 PP4 CP2 EP16 DP8 mbs 2,", "           TP1 PP4 CP4 EP16 DP4 mbs 4,",
        "           TP1 PP4 CP8 EP16 DP2 mbs 8"]
    # Narrower than one item: each item whole on its own line, never split or cut.
    assert _wrap_items("= also: ", items[:2], 20) == ["= also: TP1 PP4 CP2 EP16 DP8 mbs 2,",
                                                     "        TP1 PP4 CP4 EP16 DP4 mbs 4"]
    assert _wrap_items("= also: ", items[:1], 80) == ["= also: TP1 PP4 CP2 EP16 DP8 mbs 2"]


def _candidate(rank: int, plan, peak_gib: float):
    from meshplan.schema.reports import Candidate, MemorySummary, ThroughputBreakdown, ThroughputReport

    tput = ThroughputReport(model="m", framework="megatron-core", plan=plan, step_time_s=100.0 + rank,
                            tokens_per_s_per_gpu=395.0, tokens_per_s=1.0, mfu=0.5, model_flops_per_step=1.0,
                            breakdown=ThroughputBreakdown(compute_s=1.0), assumptions=[])
    memory = MemorySummary(peak_bytes=int(peak_gib * (1 << 30)), peak_stage=0, capacity_bytes=40 << 30, fits=True,
                           headroom_bytes=1 << 30)
    return Candidate(rank=rank, plan=plan, memory=memory, throughput=tput, rationale="")


def test_rows_and_folded_plans_that_differ_only_in_their_split_say_which_split():
    """Llama-3.1-70B on 96 A100-40GB ranked TP4 PP12 CP2 DP1 twice (first/last 7/3, then 5/5: 33.5 and 29.4 GiB)
    and the table printed two identical rows; a split spelt as a layout was folded as 'also:' the row itself."""
    from meshplan.check.split import layout_cells
    from meshplan.faces.display import _folded
    from meshplan.schema.plan import Plan

    base = {"tp": 4, "pp": 12, "cp": 2, "dp": 1, "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}
    uneven = Plan(**base, first_stage_layers=7, last_stage_layers=3)
    even_ends = Plan(**base, first_stage_layers=5, last_stage_layers=5)
    other = Plan(**{**base, "zero_stage": 3}, first_stage_layers=5, last_stage_layers=5)
    rows = [_candidate(1, uneven, 33.5), _candidate(2, even_ends, 29.4), _candidate(3, other, 27.9)]
    assert layout_cells([c.plan for c in rows]) == ["TP4 PP12 CP2 DP1 first_stage_layers=7 last_stage_layers=3",
                                  "TP4 PP12 CP2 DP1 first_stage_layers=5 last_stage_layers=5",
                                  "TP4 PP12 CP2 DP1"]  # ZeRO 3 tells the third apart already
    row = Plan(tp=1, pp=3, vpp=2, dp=4, first_stage_layers=10, last_stage_layers=8)
    spelt = row.model_copy(update={"first_stage_layers": None, "last_stage_layers": None,
                                   "pipeline_layout": "Et*5|(t*5|)*4t*3L"})
    assert _folded(row, spelt) == 'TP1 PP3 VPP2 DP4 mbs 1 pipeline_layout="Et*5|(t*5|)*4t*3L"'
    assert _folded(row, row.model_copy(update={"cp": 2, "dp": 2, "micro_batch_size": 2})) == \
        "TP1 PP3 VPP2 CP2 DP2 mbs 2"


def test_the_below_headroom_line_takes_its_numbers_from_the_report():
    from meshplan.faces.display import below_headroom_line
    from meshplan.schema.plan import Plan
    from meshplan.schema.reports import Candidate, MemorySummary, ThroughputBreakdown, ThroughputReport

    gib = 1 << 30
    plan = Plan(tp=2, pp=8, ep=4, etp=2, dp=4, micro_batch_size=4, zero_stage=3, recompute="full")
    tput = ThroughputReport(model="m", framework="megatron-core", plan=plan, step_time_s=1.0,
                            tokens_per_s_per_gpu=1619.6, tokens_per_s=1.0, mfu=0.2, model_flops_per_step=1.0,
                            breakdown=ThroughputBreakdown(compute_s=1.0), assumptions=[])
    memory = MemorySummary(peak_bytes=61 * gib, peak_stage=0, capacity_bytes=64 * gib, fits=True,
                           headroom_bytes=3 * gib)
    thin = Candidate(rank=1, plan=plan, memory=memory, throughput=tput, rationale="")
    # 3 of 64 GiB free is 4.6875%: rounded down to 0.046 (0.047 would not rank it).
    assert below_headroom_line(thin, 0.1) == (
        "not ranked, under the 0.1 headroom: TP2 PP8 EP4 ETP2 DP4 (mbs 4, ZeRO 3, recompute full) at 1,620 "
        "tokens/s/GPU with 3.0 GiB (4.7%) free; --headroom 0.046 would rank it")
    assert "under the 0.1 headroom" in below_headroom_line(thin, None)  # MEM002's default


def _below_headroom_block(out: str) -> list[str]:
    """The lines of the "not ranked, under the ... headroom" note (continuation lines are indented)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("not ranked, under the "))
    end = next(i for i in range(start + 1, len(lines) + 1) if i == len(lines) or not lines[i].startswith("  "))
    return lines[start:end]


def test_recommend_names_the_fastest_layout_under_the_headroom_and_the_headroom_that_ranks_it(piped80, capsys):
    from meshplan.schema.plan import Plan
    from meshplan.schema.reports import MemorySummary
    from meshplan.search import headroom_that_ranks

    # Nothing keeps 10% free: the line stands where the table would, and its --headroom really ranks it first.
    report, out = _recommend(capsys, "llama-3.1-70b", "--num-gpus", "16")
    assert report["candidates"] == [] and out.splitlines()[2].startswith("not ranked, under")  # after compared at
    thin = report["best_below_headroom"]
    block = _below_headroom_block(out)
    assert all(len(line) <= 80 for line in block)
    free = thin["memory"]["headroom_bytes"]
    share = free / thin["memory"]["capacity_bytes"]
    assert " ".join(" ".join(block).split()) == (
        f"not ranked, under the 0.1 headroom: TP4 PP4 VPP10 DP1 (mbs 1, ZeRO 1, recompute full) at "
        f"{thin['throughput']['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU with {free / (1 << 30):.1f} GiB "
        f"({share:.1%}) free; --headroom {headroom_that_ranks(MemorySummary(**thin['memory'])):g} would rank it")
    assert "877 tokens/s/GPU with 0.3 GiB (0.4%) free; --headroom 0.003" in " ".join(block)
    assert main(["recommend", "llama-3.1-70b", "--num-gpus", "16", "--headroom", "0.001", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["candidates"][0]["plan"] == thin["plan"]
    # Ranked layouts and a much faster one under the headroom: the line follows the table.
    report, out = _recommend(capsys, "qwen3-30b-a3b", "--num-gpus", "8")
    plan = report["best_below_headroom"]["plan"]
    block = _below_headroom_block(out)
    assert block[0].startswith(f"not ranked, under the 0.1 headroom: {Plan(**plan).short()} "
                               f"(mbs {plan['micro_batch_size']}, ZeRO {plan['zero_stage']}")
    assert all(len(line) <= 80 for line in block)
    lines = out.splitlines()
    table = _table_lines(out, "#")
    start = next(i for i, line in enumerate(lines) if line.startswith("#"))
    assert lines.index(block[0]) == start + len(table)  # by position: two rows may fold identical equivalents
    # No such layout, no line.
    report, out = _recommend(capsys, "mixtral-8x7b", "--num-gpus", "64")
    assert report["best_below_headroom"] is None and "not ranked, under" not in out


def test_models_never_cut_an_id_at_80_columns_or_wider(monkeypatch, capsys):
    from meshplan import api

    models = api.list_models()
    for width in ("80", "60", "200"):
        monkeypatch.setenv("COLUMNS", width)
        assert main(["models"]) == 0
        out = capsys.readouterr().out
        assert "…" not in out, width
        words = set(out.split())
        for m in models:
            assert m.key in words and (not m.hf_id or m.hf_id in words), (width, m.key)
        if width == "80":
            assert max(len(line.rstrip()) for line in out.splitlines()) <= 80
        if width == "200":  # room for one row per model, with the config's model_type
            assert "deepseek_v3" in out and any(line.split()[:2] == ["deepseek-v3", "deepseek-ai/DeepSeek-V3"]
                                                for line in out.splitlines() if line.strip())


# --------------------------------------------------------------------------- --help and --version


def _help_blocks(text: str) -> dict[str, str]:
    """Each option of a --help text with its help, keyed by its long flag."""
    blocks: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"^  (-\w, )?(--[\w-]+)", line)
        if match:
            current = match.group(2)
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


@pytest.mark.parametrize("command", ["memory", "throughput", "check", "recommend", "serve", "describe"])
def test_help_shows_a_default_or_the_choices_of_every_flag(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    blocks = _help_blocks(capsys.readouterr().out)
    switches = {"--help", "--json", "--batch"}  # no value to default (--batch: documented by its help)
    flags = [f for f in blocks if f not in switches]
    assert flags
    for flag in flags:
        text = blocks[flag]
        assert "default" in text or "{" in text or "required" in text, text
    if command in ("memory", "recommend"):
        assert {"--" + name.replace("_", "-") for name in Request.model_fields} <= set(blocks)
        assert "(default: h100)" in blocks["--gpu"] and "(default: 4096)" in blocks["--seq-length"]
        assert "{bf16,fp8}" in blocks["--precision"] and "megatron-core" in blocks["--framework"]
    if command == "recommend":
        assert "(default: 5)" in blocks["--top-k"]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"meshplan {__version__}"


# --------------------------------------------------------------------------- errors list what applies


def test_an_invalid_choice_lists_that_flags_choices_and_a_guess_not_the_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["memory", "llama-3.1-8b", "--recompute", "ful"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "--recompute" in err and "did you mean 'full'" in err and "none, selective, full" in err
    assert "usage:" not in err and "--moe-token-dispatcher" not in err and len(err.splitlines()) <= 2


def test_a_misspelt_command_names_the_command(capsys):
    with pytest.raises(SystemExit):
        main(["recomend", "llama-3.1-8b"])
    err = capsys.readouterr().err
    assert "did you mean 'recommend'" in err and "usage:" not in err


def test_an_unknown_gpu_lists_the_gpu_keys_only(capsys):
    assert main(["memory", "llama-3.1-8b", "--gpu", "h1000"]) == 2
    err = capsys.readouterr().err
    assert "Unknown GPU 'h1000'" in err and "h100" in err
    assert all(key in err for key in gpu_catalog())
    assert "megatron-core" not in err  # not the other flags' values


def test_ctrl_c_during_a_command_is_a_short_message_not_a_traceback(monkeypatch, capsys):
    from meshplan import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "estimate_memory", interrupted)
    assert main(["memory", "llama-3.1-8b"]) == 130
    assert capsys.readouterr().err.strip() == "meshplan: interrupted"


def test_serve_help_mentions_the_url_form(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "http://HOST:PORT/mcp" in capsys.readouterr().out
