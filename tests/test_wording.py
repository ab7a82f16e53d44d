"""What a newcomer reads (issue 27): labelled peaks, hints that name the failing rule and real commands, numbers
worded so they never mislead (percentages, token counts, plurals), a "did you mean" only when the name is close,
commands that say what they checked, decision-table layouts that pass the rules when typed in, and tables that are
not wrapped when piped. Each on every face where it is reachable: the CLI, MCP and `meshplan.api`.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from tree_under_test import tree_env

from meshplan import api
from meshplan.adapters.render import RefusedLayout
from meshplan.check.config import check_structure
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib, percent, plural, si_count
from meshplan.faces import display, docs
from meshplan.faces.cli import build_parser, main
from meshplan.faces.mcp.server import app
from meshplan.request.parse import parse_request, unknown_field_error
from meshplan.request.resolve import resolve
from meshplan.schema.reports import Recommendation
from meshplan.schema.request import Request
from meshplan.search.answer import keeps

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _mcp(tool: str, args: dict) -> tuple[bool, dict | None, str]:
    async with Client(app) as client:
        result = await client.call_tool(tool, args)
    return result.is_error, result.structured_content, result.content[0].text if result.content else ""


# --------------------------------------------------------------------------- 1. render names which peak is which


TORCHTITAN_70B = {"model": "llama-3.1-70b", "num_gpus": 8, "framework": "torchtitan"}


def test_a_refused_render_labels_the_reserved_and_the_allocated_peak(capsys):
    memory = api.check_config(parse_request(TORCHTITAN_70B)).memory
    assert memory is not None and memory.fit_basis == "allocated" and memory.fit_bytes != memory.peak_bytes
    allocated = f"an allocated peak of {gib(memory.fit_bytes)} per GPU"
    reserved = f"{gib(memory.peak_bytes)} reserved, but with expandable segments the allocated peak decides the fit"
    with pytest.raises(RefusedLayout) as exc:
        api.render_config("torchtitan", parse_request(TORCHTITAN_70B))
    assert allocated in str(exc.value) and reserved in str(exc.value)
    assert main(["render", "torchtitan", "llama-3.1-70b", "--num-gpus", "8"]) == 1
    err = capsys.readouterr().err
    assert allocated in err and reserved in err
    # Without expandable segments the reserved peak decides, and says so.
    decides = r"a reserved peak of [\d.]+ GiB per GPU \(stage 0, which decides the fit\)"
    with pytest.raises(RefusedLayout, match=decides):
        api.render_config("torchtitan", parse_request({**TORCHTITAN_70B, "expandable_segments": False}))


def test_the_check_table_labels_the_peak(capsys):
    assert main(["check", "llama-3.1-70b", "--framework", "torchtitan", "--num-gpus", "8"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("memory:"))
    assert " reserved on stage 0 " in line and "the allocated peak" in line and "decides" in line


@pytest.mark.anyio
async def test_mcp_summaries_label_the_peaks_and_count_over_from_the_one_that_decides():
    memory = api.estimate_memory(parse_request(TORCHTITAN_70B))
    failed, data, _ = await _mcp("estimate_memory", TORCHTITAN_70B)
    labelled = f"peak {gib(memory.peak_bytes)} reserved (allocated {gib(memory.fit_bytes)}"
    assert not failed and labelled in data["summary"]
    assert f"does NOT fit: {gib(memory.fit_bytes - memory.capacity_bytes)} over" in data["summary"]
    failed, data, _ = await _mcp("check_config", TORCHTITAN_70B)
    assert not failed and f"Peak memory {gib(memory.peak_bytes)} reserved (allocated" in data["summary"]


# --------------------------------------------------------------------------- 2. hints, headers and numbers


HOST_SHORT = {"model": "llama-3.1-8b", "framework": "torchtitan", "num_gpus": 8, "param_offload": True,
              "cpu_memory_per_node": 16}


@pytest.mark.anyio
async def test_the_next_step_names_the_memory_rule_that_failed(capsys):
    report = api.check_config(parse_request(HOST_SHORT))
    assert {f.id for f in report.findings if f.severity == "error"} == {"MEM003"}
    assert report.next_steps and "MEM003" in report.next_steps[-1] and "MEM001" not in " ".join(report.next_steps)
    args = ["check", "llama-3.1-8b", "--framework", "torchtitan", "--num-gpus", "8", "--param-offload", "true",
            "--cpu-memory-per-node", "16"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "fix of MEM003" in out and "MEM001" not in out
    failed, data, _ = await _mcp("check_config", HOST_SHORT)
    assert not failed and "MEM001" not in " ".join(data["next_steps"]) and "MEM003" in data["next_steps"][0]


@pytest.mark.anyio
async def test_a_layout_the_gpu_count_does_not_divide_is_named_as_such(capsys):
    shown = "TP3 PP1 DP2 (6 GPUs: the GPU count does not divide into this layout, WS001)"
    assert main(["check", "llama-3.1-8b", "--num-gpus", "8", "--tp", "3"]) == 1
    assert shown in capsys.readouterr().out.splitlines()[0]
    failed, data, _ = await _mcp("check_config", {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 3})
    assert not failed and shown in data["summary"]
    with pytest.raises(RefusedLayout, match=re.escape(shown)):
        api.render_config("megatron-core", parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "tp": 3}))
    # A layout that divides is named by its degrees alone.
    assert main(["check", "llama-3.1-8b", "--num-gpus", "8", "--tp", "2"]) in (0, 1)
    assert "TP2 PP1 DP4:" in capsys.readouterr().out.splitlines()[0]


def _commands() -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return set(sub.choices)


def test_every_command_a_hint_names_exists():
    """Every `meshplan X` in code, cards, skills and the README (hints, next steps, fixes, docs) names a subcommand."""
    named: dict[str, set[str]] = {}
    files = [*(ROOT / "meshplan").rglob("*.py"), *(ROOT / "cards").rglob("*.yaml"), *(ROOT / "skills").rglob("*.md"),
             ROOT / "README.md"]
    for path in files:
        text = path.read_text(encoding="utf-8")
        for word in re.findall(r"`meshplan ([a-z][a-z_-]*)", text) + re.findall(r"run '(?:meshplan) ([a-z-]+)", text):
            named.setdefault(word, set()).add(str(path.relative_to(ROOT)))
    assert {"check", "recommend", "render"} <= set(named)  # the scan reads what it should
    unknown = {word: sorted(where) for word, where in named.items() if word not in _commands()}
    assert not unknown, unknown


def test_next_steps_name_real_commands():
    for fields in (HOST_SHORT, {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 3}, {"model": "llama-3.1-8b"}):
        for step in api.check_config(parse_request(fields)).next_steps:
            for word in re.findall(r"`meshplan ([a-z-]+)", step):
                assert word in _commands(), step


@pytest.mark.parametrize("fields", [
    {"model": "llama-3.1-8b", "num_gpus": 8, "framework": "verl", "zero_stage": 3, "precision": "fp8"},
    {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2},
])
def test_checks_ok_promises_a_render_only_where_render_writes_it(fields):
    """check said 'meshplan render writes it in the framework's own keys' beside a layout render refuses (verl has no
    fp8 training key: render's refusal alone, AD001 holds the layout's own knobs): now it says render's refusal."""
    req = parse_request(fields)
    report = api.check_config(req)
    assert report.ok
    try:
        api.render_config(fields.get("framework", "megatron-core"), req)
    except MeshplanError as exc:
        assert f"`meshplan render` refuses it: {exc.reason.rstrip('.')}" in report.next_steps[-1]
        assert "writes it" not in report.next_steps[-1]
    else:
        assert "`meshplan render` writes it in the framework's own keys" in report.next_steps[-1]


@pytest.mark.parametrize(("fraction", "text"), [
    (0.1, "10%"), (0.032, "3.2%"), (0.999999, "99.9999%"), (0.9999, "99.99%"), (1 - 1e-12, ">99.999999%"),
    (1e-12, "<0.000001%"), (0.0, "0%"), (1.0, "100%"), (0.5, "50%"),
])
def test_a_percentage_never_rounds_onto_an_end_it_does_not_reach(fraction, text):
    assert percent(fraction) == text


def test_headroom_and_tokens_are_worded_sanely():
    assert keeps(0.999999) == "keeps 99.9999% of GPU memory free"
    assert si_count(4 * 1024 * 1024, "tokens") == "4.19M tokens"
    assert si_count(1_024_000.5e6, "tokens") == "1.02T tokens"
    assert si_count(999_999, "tokens") == "1M tokens" and si_count(512, "tokens") == "512 tokens"
    assert si_count(2_097_152, "tokens") == "2.1M tokens"
    req = parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "headroom": 0.999999})
    rec = Recommendation.model_construct(global_batch_size=250_000_000, num_gpus=8, framework="megatron-core")
    line = display.compared_at(rec, req)
    assert "99.9999% of GPU memory kept free" in line and "100%" not in line
    assert "(1.02T tokens)" in line and "M tokens" not in line


def test_given_gpus_per_node_are_the_nodes_not_a_split_with_idle_gpus():
    """recommend --gpus-per-node 4 on 32 H100 said '8 nodes x 4 (4 of each 8-GPU node idle)': the request's nodes
    hold 4 GPUs; the idle GPUs are only those of a count that fills no whole node (launch_gpus_per_node)."""
    rec = Recommendation.model_construct(global_batch_size=1024, num_gpus=32, framework="megatron-core",
                                         gpus_per_node=4)
    line = display.compared_at(rec, parse_request({"model": "llama-3.1-70b", "num_gpus": 32, "gpus_per_node": 4}))
    assert "32 x NVIDIA H100 SXM5 80GB (h100) as 8 nodes x 4, " in line and "idle" not in line
    rec = Recommendation.model_construct(global_batch_size=1032, num_gpus=12, framework="megatron-core",
                                         gpus_per_node=4)
    line = display.compared_at(rec, parse_request({"model": "llama-3.1-70b", "num_gpus": 12}))
    assert "as 3 nodes x 4 (4 of each 8-GPU node idle)" in line


def test_counts_agree_in_number(capsys):
    assert (plural(1, "count"), plural(2, "count"), plural(1000, "count")) == ("1 count", "2 counts", "1,000 counts")
    assert main(["min-gpus", "llama-3.1-8b", "--tp", "8"]) == 0
    out = capsys.readouterr().out
    assert "checked 1 count from 8 to 8" in out and "1 counts" not in out


ONE_GPU = {"model": "olmoe-1b-7b", "gpu": "h200", "framework": "torchtitan"}  # fits one H200: min-gpus answers 1


@pytest.mark.anyio
async def test_one_gpu_is_one_gpu_on_every_face(capsys):
    """min-gpus said 'needs at least 1 GPUs' (MCP), 'up to 1 GPUs' (CLI) and recommend 'on 1 GPUs', '1 GPUs do
    not hold the row's layout': a count of one is singular wherever a GPU count is written."""
    cli = ["--model", ONE_GPU["model"], "--gpu", ONE_GPU["gpu"], "--framework", ONE_GPU["framework"]]
    assert main(["min-gpus", *cli, "--max-gpus", "1"]) == 0
    assert main(["recommend", *cli, "--num-gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "smallest GPU count: 1 x" in out and "up to 1 GPU," in out and "on 1 GPU (torchtitan)" in out
    assert "1 GPU does not hold" in out and not re.search(r"\b1 GPUs", out)
    failed, answer, _ = await _mcp("minimum_gpus", ONE_GPU)
    assert not failed and answer["num_gpus"] == 1 and "needs at least 1 GPU to keep" in answer["summary"]
    failed, answer, _ = await _mcp("recommend_parallelism", {**ONE_GPU, "num_gpus": 1})
    assert not failed and "on 1 GPU (torchtitan)" in answer["summary"]
    assert not re.search(r"\b1 GPUs", json.dumps(answer))


@pytest.mark.parametrize("name", ["bogus", "foo", "xyz", "zzzz_qqq"])
@pytest.mark.anyio
async def test_an_unrelated_name_gets_no_guess(name, tmp_path, capsys):
    assert "Did you mean" not in str(unknown_field_error(name, Request.model_fields))
    with pytest.raises(MeshplanError) as exc:
        parse_request({"model": "llama-3.1-8b", name: 8})
    assert f"Unknown field {name!r}" in str(exc.value) and "Did you mean" not in str(exc.value)
    batch = tmp_path / "lines.jsonl"
    batch.write_text(json.dumps({"model": "llama-3.1-8b", name: 8}) + "\n")
    assert main(["memory", "--batch", str(batch)]) == 2
    assert "Did you mean" not in capsys.readouterr().out
    failed, _, text = await _mcp("estimate_memory", {"model": "llama-3.1-8b", name: 8})
    assert failed and name in text and "Did you mean" not in text


@pytest.mark.parametrize(("typed", "meant"), [("num_gpu", "num_gpus"), ("seq_len", "seq_length"), ("tpp", "tp"),
                                              ("headrom", "headroom"), ("gpus_total", "num_gpus")])
def test_a_close_name_still_gets_its_guess(typed, meant):
    assert f"Did you mean {meant!r}?" in str(unknown_field_error(typed, Request.model_fields))


# --------------------------------------------------------------------------- 3. commands that say what they did


def test_docs_check_says_what_it_checked(capsys):
    assert main(["docs", "--check"]) == 0
    out = capsys.readouterr().out
    assert f"checked {len(docs.skill_pages())} skill pages under skills/" in out and "up to date" in out


def test_an_empty_batch_says_so(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["check", "--batch", str(empty)]) == 0  # no line failed
    out, err = capsys.readouterr()
    assert out == "" and "is empty: no request to answer" in err and "empty.jsonl" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["memory", "--batch", "-"]) == 0
    assert "stdin is empty" in capsys.readouterr().err


# --------------------------------------------------------------------------- 4. decision-table layouts typed back in


LAYOUT_TOKEN = re.compile(r"^(TP|PP|VPP|CP|EP|ETP|DP)(\d+)$")


def typed_fields(text: str) -> dict:
    """The request fields a reader types for a decision table's layout column ('TP2 PP16 EP64 ETP1 (first 3, last 2
    layers) DP32 (expert-DP 1), full recompute')."""
    fields: dict = {}
    main_part = text
    if text.endswith(" recompute"):
        main_part, _, recompute = text.rpartition(", ")
        fields["recompute"] = recompute.removesuffix(" recompute")
    if split := re.search(r"\(first (\d+), last (\d+) layers\)", main_part):
        fields["first_stage_layers"], fields["last_stage_layers"] = int(split[1]), int(split[2])
    for token in re.sub(r"\([^)]*\)", " ", main_part).split():
        match = LAYOUT_TOKEN.match(token)
        assert match, (text, token)
        fields[match[1].lower()] = int(match[2])
    return fields


def test_every_decision_table_layout_passes_the_rules_when_typed_in():
    """An agent types the table's layout column (plus the row's model, GPUs and framework) into the tools: what it
    gets must pass check's structural rules, with no knob the column leaves out (ETP1 under TP2 on Megatron)."""
    rows = docs.checked_rows()
    assert any(rid == "deepseek-v3" for rid, _ in rows)
    for rid, row in rows:
        column = docs._layout(row, docs.row_numbers(row))
        typed = {"model": row.model, "gpu": row.gpu, "num_gpus": row.num_gpus, "framework": row.framework,
                 "seq_length": row.seq_length, **typed_fields(column)}
        job, plan = resolve(parse_request(typed))
        errors = [f"{f.id}: {f.message}" for f in check_structure(job, plan) if f.severity == "error"]
        assert not errors, (rid, column, errors)
        assert plan.etp == row.layout.etp, (rid, column)


def test_the_moe_size_table_names_etp_where_its_layout_sets_it():
    from meshplan.knowledge.tables import strategies_card

    for row in strategies_card().moe_by_size:
        if row.layout.etp != row.layout.tp and row.layout.ep > 1:
            assert f"ETP {row.layout.etp}" in row.start, row.id


# --------------------------------------------------------------------------- 5. piped output is not wrapped


def test_piped_tables_are_not_wrapped_at_80_columns(tmp_path):
    env = tree_env({k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")})
    out = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "check", "llama-3.1-8b", "--num-gpus", "8",
                          "--tp", "3"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stderr
    report = api.check_config(parse_request({"model": "llama-3.1-8b", "num_gpus": 8, "tp": 3}))
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line[:2] in ("WS", "TP", "SP")}
    for f in report.findings:  # each finding on one line, its message and fix whole
        assert f.message in rows[f.id] and f.fix in rows[f.id], rows.get(f.id)
    assert max(len(line.rstrip()) for line in out.stdout.splitlines()) > 80


def test_selective_recompute_words_name_the_modules_the_plan_recomputes():
    """A recompute_modules list without core_attn stores core attention's tensors: the memory report must not say
    it recomputes them (it did, whatever the list)."""
    from meshplan import api
    from meshplan.schema.request import Request

    def words(modules):
        report = api.estimate_memory(Request(model="llama-3.1-8b", num_gpus=8, gpu="h100", framework="megatron-core",
                                             tp=2, recompute="selective", recompute_modules=modules))
        return next(a for a in report.assumptions if a.startswith("Recompute selective"))

    assert "core attention recomputed" in words(None)
    without = words(["layernorm", "mlp"])
    assert "layernorm, mlp recomputed" in without and "core attention's tensors are stored" in without
    assert "core attention recomputed" not in without
    assert "stored" not in words(["core_attn", "mlp"]).split("(")[1].replace("not stored", "")


def test_selective_recompute_time_words_name_the_modules_the_time_reruns():
    """The throughput report's selective-recompute line names the modules the step time reruns
    (memory.selective_modules, what recompute.recompute_time sums); it said 'core attention' whatever the list."""
    from meshplan import api
    from meshplan.schema.request import Request

    def words(modules):
        report = api.estimate_throughput(Request(model="llama-3.1-8b", num_gpus=8, gpu="h100",
                                                 framework="megatron-core", tp=2, recompute="selective",
                                                 recompute_modules=modules))
        return next(a for a in report.assumptions if a.startswith("Recompute selective"))

    assert words(["layernorm", "mlp"]).endswith("(layernorm, mlp).")
    assert "core_attn" not in words(["layernorm", "mlp"])
    assert "(core_attn)" in words(None)  # Megatron's default list
