"""A config meshplan renders, imported back: none of the keys meshplan itself wrote is 'meshplan cannot express'.

The DeepSpeed render writes zero_optimization.contiguous_gradients (ZeRO-3) and the activation_checkpointing section
(recompute); importing that very JSON listed them under 'no meshplan field'. They are what the estimate assumes
(cards/frameworks/deepspeed.yaml read.said), and the import now says so. zero_optimization.overlap_comm (written at
ZeRO 1-3) is read into grad_reduce_overlap."""

from __future__ import annotations

import pytest
from test_adapters import CASES

from meshplan import api
from meshplan.adapters.render import render
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

SUFFIX = {"json": "json", "yaml": "yaml", "toml": "toml", "python": "py", "shell": "sh", "hydra": "sh"}

DEEPSPEED = [
    dict(model="llama-3.1-8b", num_gpus=8, zero_stage=3),
    dict(model="llama-3.1-8b", num_gpus=8, zero_stage=3, recompute="full"),
    dict(model="llama-3.1-8b", num_gpus=8, zero_stage=3, optimizer_offload_fraction=1.0),
    dict(model="llama-3.1-8b", num_gpus=8, zero_stage=2, recompute="full"),
]


@pytest.mark.parametrize("fields", DEEPSPEED, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()
                                                                    if k not in ("model", "num_gpus")))
def test_a_deepspeed_render_imports_with_nothing_meshplan_wrote_left_unexpressed(fields):
    rendered = api.render_config("deepspeed", parse_request({**fields, "framework": "deepspeed"}))
    imported = api.import_config(rendered.text, path="ds_config.json", framework="deepspeed")
    assert not imported.unsupported, imported.unsupported
    notes = " ".join(imported.notes)
    if fields["zero_stage"] == 3:  # the note says the estimate assumes the contiguous buffer
        assert "zero_optimization.contiguous_gradients = True" in notes
    assert imported.request["grad_reduce_overlap"] is True  # render writes overlap_comm as the plan times it
    assert imported.request["zero_stage"] == fields["zero_stage"]


@pytest.mark.parametrize("stage", [2, 3])
def test_overlap_comm_false_is_read_into_grad_reduce_overlap(stage):
    rendered = api.render_config("deepspeed", parse_request(dict(DEEPSPEED[0], zero_stage=stage,
                                                                 framework="deepspeed")))
    text = rendered.text.replace('"overlap_comm": true', '"overlap_comm": false')
    assert text != rendered.text
    imported = api.import_config(text, path="ds_config.json", framework="deepspeed")
    assert imported.request["grad_reduce_overlap"] is False
    assert not imported.unsupported


@pytest.mark.parametrize("framework,variant,fields", CASES, ids=[f"{c[0]}-{c[1] or 'default'}-{c[2]['model']}"
                                                                   for c in CASES])
def test_every_framework_render_imports_with_nothing_meshplan_wrote_left_unexpressed(framework, variant, fields):
    """test_adapters' render cases, imported back by the framework's reader: the flex dispatcher's backend (verl,
    SkyRL) and the fine-grained offload's module list (Megatron-Core, Megatron-Bridge) were 'no meshplan field'."""
    job, plan = resolve(Request(framework=framework, **fields))
    result = render(framework, job, plan, variant=variant)
    imported = api.import_config(result.text, path=f"rendered.{SUFFIX[result.format]}", framework=framework)
    assert not imported.unsupported, imported.unsupported


A2A_OVERLAP = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, seq_length=8192, global_batch_size=256, tp=2,
                   ep=16, etp=1, moe_token_dispatcher="flex", moe_a2a_overlap=True)


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_the_ep_overlap_render_imports_with_delay_wgrad_compute_said(framework):
    """moe_a2a_overlap renders as overlap_moe_expert_parallel_comm with delay_wgrad_compute (which Megatron-Core
    asserts the overlap beside); importing that file listed delay_wgrad_compute as 'no meshplan field' (the card's
    read.said now says it is part of the overlap meshplan reads)."""
    job, plan = resolve(Request(framework=framework, **A2A_OVERLAP))
    result = render(framework, job, plan)
    imported = api.import_config(result.text, path=f"rendered.{SUFFIX[result.format]}", framework=framework)
    assert not imported.unsupported, imported.unsupported
    assert imported.request["moe_a2a_overlap"] is True
    assert any("delay_wgrad_compute" in n.replace("-", "_") and "moe_a2a_overlap" in n for n in imported.notes)


def test_the_megatron_deepspeed_moe_render_imports_with_its_switches_said():
    """An MoE job on DeepSpeed renders Megatron-DeepSpeed's launch line with --no-pipeline-parallel (pp=1) and
    --create-moe-param-group; importing it listed both as 'no meshplan field' (the card's read.said now says them)."""
    job, plan = resolve(Request(framework="deepspeed", model="qwen3-30b-a3b", num_gpus=16, ep=8, zero_stage=2,
                                recompute="full", micro_batch_size=2, global_batch_size=256))
    result = render("deepspeed", job, plan)
    assert "--no-pipeline-parallel" in result.text and "--create-moe-param-group" in result.text
    imported = api.import_config(result.text, path=f"rendered.{SUFFIX[result.format]}", framework="deepspeed")
    assert not imported.unsupported, imported.unsupported
    assert (imported.request["ep"], imported.request["pp"]) == (8, 1)
