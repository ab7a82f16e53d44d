"""Megatron-LM's own dropout (lane mcoredrop54): pretrain_gpt.py trains with --attention-dropout and --hidden-dropout
0.1 unless a flag says otherwise (megatron/core/transformer/transformer_config.py hidden_dropout / attention_dropout
0.1, the flags ArgumentGroupFactory makes of them; cards/frameworks/megatron-core.yaml read.absent_by_variant). The
megatron-core render writes both, the snippet and a user's script read back what they run, and the estimate of a
script is the estimate of that run. Megatron-Bridge's model bridges set dropout 0.0: its reading is not changed."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.parse import parse_plan, shell_tokens
from meshplan.adapters.render import render
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(framework="megatron-core", model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2,
            global_batch_size=64, micro_batch_size=1, recompute="none")
DROPOUTS = ("--attention-dropout", "--hidden-dropout")


def _render(**fields):
    job, plan = resolve(Request(**{**BASE, **fields}))
    return job, plan, render("megatron-core", job, plan)


def _without(text: str, *flags: str) -> str:
    """The script with the lines that start with `flags` left out."""
    lines = [line for line in text.splitlines() if line.strip().rstrip(" \\").split(" ")[0] not in flags]
    if lines[-1].endswith("\\"):
        lines[-1] = lines[-1].rstrip(" \\")
    return "\n".join(lines) + "\n"


def _with_values(text: str, attention: str, hidden: str) -> str:
    """The script with both dropout flags set to the given values."""
    out = []
    for line in text.splitlines():
        word = line.strip().rstrip(" \\").split(" ")[0]
        if word in DROPOUTS:
            tail = " \\" if line.rstrip().endswith("\\") else ""
            line = f"{line[:len(line) - len(line.lstrip())]}{word} {attention if word == DROPOUTS[0] else hidden}{tail}"
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("dropout", [None, False, True])
def test_the_script_states_both_dropouts_the_estimate_times(dropout):
    """Written either way (0.0 where the plan runs without dropout), since Megatron-LM left to itself runs 0.1."""
    fields = {} if dropout is None else {"dropout": dropout}
    _, plan, result = _render(**fields)
    tokens = shell_tokens(result.text.split("pretrain_gpt.py", 1)[1])
    for flag in DROPOUTS:
        assert tokens[tokens.index(flag) + 1] == ("0.1" if plan.dropout else "0.0")


@pytest.mark.parametrize("dropout", [False, True])
def test_render_parse_and_import_give_the_dropout_back(dropout):
    """render -> parse (the snippet) and render -> import (the script read as a user's) give the plan's dropout."""
    job, _, result = _render(dropout=dropout)
    assert parse_plan("megatron-core", result.variant, result.text, job.model.num_layers).get("dropout",
                                                                                               False) is dropout
    imported = api.import_config(result.text, path="run.sh", framework="megatron-core")
    assert imported.request["dropout"] is dropout


@pytest.mark.parametrize("cut,values,expected", [
    (DROPOUTS, None, True),
    (("--hidden-dropout",), ("0", "0"), True),
    (("--attention-dropout",), ("0", "0"), True),
    ((), ("0", "0"), False),
    ((), ("0.0", "0.1"), True),
    ((), ("0.1", "0"), True),
])
def test_a_users_script_is_read_and_estimated_as_the_run_it_launches(cut, values, expected):
    """`meshplan import` / check / estimate of a Megatron-LM script: a dropout flag left out runs at 0.1, whatever
    the other says (said with its source); both at 0 is off; the estimate of the file is the estimate of that run."""
    _, _, result = _render()
    text = _without(_with_values(result.text, *values) if values else result.text, *cut)
    imported = api.import_config(text, path="run.sh", framework="megatron-core")
    assert imported.request["dropout"] is expected
    if cut:
        assert "0.1" in imported.sources["dropout"] and "read.absent_by_variant" in imported.sources["dropout"]
        assert imported.defaults["dropout"] is True
    parsed = parse_plan("megatron-core", "pretrain_gpt", text, 32)
    assert parsed.get("dropout", False) is expected
    request = api.request_from_config(imported, {"model": "llama-3.1-8b", "gpu": "h100"})
    stated = parse_request({**BASE, **{k: imported.request[k] for k in ("tp", "pp", "zero_stage",
                                                                         "sequence_parallel")},
                            "dropout": expected})
    assert api.estimate_memory(request).peak_bytes == api.estimate_memory(stated).peak_bytes


def test_dropout_left_out_adds_its_masks_to_the_estimate():
    """The script without dropout flags is estimated heavier than the same script at 0 (the masks it keeps)."""
    _, _, result = _render()
    bare = api.request_from_config(api.import_config(_without(result.text, *DROPOUTS), path="run.sh",
                                                     framework="megatron-core"),
                                   {"model": "llama-3.1-8b", "gpu": "h100"})
    off = api.request_from_config(api.import_config(_with_values(result.text, "0", "0"), path="run.sh",
                                                    framework="megatron-core"),
                                  {"model": "llama-3.1-8b", "gpu": "h100"})
    assert api.estimate_memory(bare).peak_bytes > api.estimate_memory(off).peak_bytes


def test_left_out_the_note_says_what_a_megatron_lm_script_would_run():
    job, _ = resolve(Request(**BASE))
    dropout = next(n for n in job.notes if n.startswith("dropout not given"))
    assert "dropout not given: off" in dropout and "pretrain_gpt script runs it on" in dropout


def test_megatron_bridge_keeps_dropout_off_where_the_recipe_says_nothing():
    """Megatron-Bridge's model bridges set hidden_dropout 0.0 (llama_bridge.py): no absent default there."""
    job, _ = resolve(Request(**{**BASE, "framework": "megatron-bridge"}))
    dropout = next(n for n in job.notes if n.startswith("dropout not given"))
    assert "dropout not given: off" in dropout and "script runs it on" not in dropout
