"""`render` through its faces: a layout that breaks a rule is refused (unless forced), a misspelt framework
names only the renderable ones, override values read back unchanged, and the snippet carries the model's
own architecture flags or says which ones to add.

Faces: `meshplan.api.render_config`, the CLI through `meshplan.cli.main`, and the MCP tool function.
"""

from __future__ import annotations

import pytest
from mcp.server.mcpserver.exceptions import ToolError
from meshplan.adapters.parse import shell_tokens
from meshplan.adapters.render import TARGETS, RefusedLayout, dotlist_value, hydra_value, render
from meshplan.mcp_server import tools

from meshplan import api
from meshplan.cli import main
from meshplan.errors import MeshplanError
from meshplan.memory import estimate_memory
from meshplan.request import resolve
from meshplan.rulebook import gib
from meshplan.schema import Request

TP3 = dict(model="llama-3.1-8b", num_gpus=8, tp=3)  # dp = 8/3: WS001, and 32 heads / 3: TP001
TITAN_70B = dict(model="llama-3.1-70b", num_gpus=8)  # one 70B replica per GPU: far over 80 GB
LOW_HEADROOM = dict(model="qwen3-30b-a3b", num_gpus=16, tp=1, pp=2, ep=8, global_batch_size=256)  # 8.1% free


def _mcp(framework: str, **fields):
    """The MCP tool as the server calls it: every argument present, the optional ones at their defaults."""
    return tools.render_config(framework=framework, variant=None, version=None, force=fields.pop("force", False),
                               **fields)


# --------------------------------------------------------------------------- 1. rule errors refuse the render


def test_a_layout_the_framework_rejects_is_refused_with_each_finding_and_its_fix():
    with pytest.raises(RefusedLayout) as exc:
        api.render_config("megatron-core", Request(**TP3))
    ids = [f.id for f in exc.value.findings]
    assert {"WS001", "TP001"} <= set(ids) and all(f.severity == "error" for f in exc.value.findings)
    text = str(exc.value)
    for finding in exc.value.findings:
        assert f"{finding.id} (error): {finding.message} Fix: {finding.fix}" in text
    assert "tp*pp*cp = 3*1*1 = 3" in text and "tp in {1, 2, 4, 8} works" in text
    assert "megatron-core would reject it" in text and "--force" in text and "force=true" in text


def test_a_layout_that_does_not_fit_is_refused_with_its_peak_against_the_capacity():
    with pytest.raises(RefusedLayout) as exc:
        api.render_config("torchtitan", Request(**TITAN_70B))
    assert [f.id for f in exc.value.findings] == ["MEM001"]
    report = estimate_memory(*resolve(Request(framework="torchtitan", **TITAN_70B)))
    assert report.peak_bytes > 3 * report.capacity_bytes  # about 267 GiB against 79.6 GiB
    assert (f"it does not fit: a peak of {gib(report.peak_bytes)} per GPU (stage {report.peak_stage}) against "
            f"{gib(report.capacity_bytes)} of memory") in str(exc.value)


def test_force_renders_the_refused_layout_with_the_findings_as_warnings():
    result = api.render_config("megatron-core", Request(**TP3), force=True)
    assert "--tensor-model-parallel-size 3" in result.text
    assert result.warnings[0].startswith("Rendered because force was given")
    assert any(w.startswith("WS001 (error): ") and "Fix: Use num_gpus = 6 or 9" in w for w in result.warnings)


def test_low_headroom_renders_with_a_warning_and_the_same_snippet_as_the_adapter():
    result = api.render_config("megatron-core", Request(**LOW_HEADROOM))
    assert [w.split(" ", 1)[0] for w in result.warnings] == ["MEM002"]
    assert "(8.1%) free" in result.warnings[0] and "Fix: " in result.warnings[0]
    job, plan = resolve(Request(framework="megatron-core", **LOW_HEADROOM))
    assert result.text == render("megatron-core", job, plan).text


def test_cli_refuses_with_exit_1_and_the_fixes_and_renders_with_force(capsys):
    args = ["render", "megatron-core", "llama-3.1-8b", "--num-gpus", "8", "--tp", "3"]
    assert main(args) == 1
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "WS001 (error)" in err and "Fix: Use num_gpus = 6 or 9" in err and "TP001 (error)" in err
    assert err.rstrip().endswith("pass --force (MCP: force=true).")
    assert main([*args, "--force"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/usr/bin/env bash") and "--tensor-model-parallel-size 3" in out
    assert "# warning: WS001 (error)" in err


def test_cli_says_how_far_a_layout_is_over_memory(capsys):
    assert main(["render", "torchtitan", "llama-3.1-70b", "--num-gpus", "8"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "MEM001 (error): needs " in err and "it does not fit: a peak of " in err


def test_cli_plain_output_shows_warnings_and_notes_on_stderr_and_keeps_stdout_the_snippet(capsys):
    assert main(["render", "megatron-core", "qwen3-30b-a3b", "--num-gpus", "16", "--tp", "1", "--pp", "2",
                 "--ep", "8", "--global-batch-size", "256"]) == 0
    out, err = capsys.readouterr()
    job, plan = resolve(Request(framework="megatron-core", **LOW_HEADROOM))
    assert out == render("megatron-core", job, plan).text
    lines = err.splitlines()
    assert lines[0].startswith("# warning: MEM002 (warning): only ")
    assert any(line.startswith("# note: Data, tokenizer, optimizer") for line in lines)
    assert all(line.startswith(("# warning: ", "# note: ")) for line in lines)


def test_mcp_refuses_with_the_same_text_and_renders_with_force():
    with pytest.raises(RefusedLayout) as refused:
        api.render_config("megatron-core", Request(**TP3))
    with pytest.raises(ToolError) as exc:
        _mcp("megatron-core", **TP3)
    assert str(exc.value) == str(refused.value)
    answer = _mcp("megatron-core", force=True, **TP3)
    assert any(w.startswith("TP001 (error)") for w in answer.warnings) and "warning(s)" in answer.summary


# --------------------------------------------------------------------------- 4. a misspelt framework


def test_a_misspelt_framework_suggests_the_closest_and_lists_only_renderable_ones(capsys):
    assert main(["render", "megatrom-core", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean 'megatron-core'?" in err
    assert f"meshplan renders: {', '.join(TARGETS)}." in err
    assert "models/" not in err and "calibration" not in err and err.count("\n") == 1
    with pytest.raises(MeshplanError, match="Did you mean 'torchtitan'"):
        api.render_config("torchtitn", Request(model="llama-3.1-8b"))


def test_render_targets_are_the_cards_with_an_adapter_section_in_schema_order():
    assert TARGETS == ("megatron-bridge", "megatron-core", "verl", "skyrl", "torchtitan", "kempnerforge", "deepspeed")
    with pytest.raises(MeshplanError, match="memory convention only") as exc:
        api.render_config("nanotron", Request(model="llama-3.1-8b"))
    assert "Did you mean" not in str(exc.value)


# --------------------------------------------------------------------------- 3. override values read back unchanged


@pytest.mark.parametrize("text,hydra,dotlist", [
    # Hydra keeps a backslash inside quotes unless a run of them ends at a quote; it was doubled before.
    ("C:\\models\\llama", "'C:\\models\\llama'", '"C:\\\\models\\\\llama"'),
    ("end\\", "'end\\\\'", '"end\\\\"'),
    ("it's", "'it\\'s'", '"it\'s"'),
    ("x\\'y", "'x\\\\\\'y'", '"x\\\\\'y"'),
    ("${oops}", "'\\${oops}'", '"\\\\${oops}"'),  # OmegaConf would resolve an interpolation
    ("org/model with space", "'org/model with space'", '"org/model with space"'),
    ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B"),
    ("null", "'null'", '"null"'),
    ("on", "'on'", '"on"'),  # YAML 1.1 reads a bare on as true
    ("NaN", "'NaN'", '"NaN"'),  # Hydra reads a bare nan as a float
])
def test_override_values_are_quoted_the_way_each_reader_reads_them(text, hydra, dotlist):
    assert hydra_value(text) == hydra and dotlist_value(text) == dotlist


def test_a_backslash_in_a_model_path_reaches_verl_and_skyrl_once():
    job, plan = resolve(Request(framework="verl", model="llama-3.1-8b", num_gpus=8, tp=2))
    job = job.model_copy(update={"model": job.model.model_copy(update={"hf_id": "C:\\models\\llama"})})
    assert "actor_rollout_ref.model.path='C:\\models\\llama'" in shell_tokens(render("verl", job, plan).text)
    assert 'trainer.policy.model.path="C:\\\\models\\\\llama"' in shell_tokens(render("skyrl", job, plan).text)
