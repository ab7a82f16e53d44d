"""A config meshplan renders, imported back: none of the keys meshplan itself wrote is 'meshplan cannot express'.

The DeepSpeed render writes zero_optimization.overlap_comm / contiguous_gradients (ZeRO-3) and the
activation_checkpointing section (recompute); importing that very JSON listed them under 'no meshplan field'. They
are what the estimate assumes (cards/frameworks/deepspeed.yaml read.said), and the import now says so."""

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
    if fields["zero_stage"] == 3:  # render writes overlap_comm true there: the note says the estimate assumes it
        assert "zero_optimization.overlap_comm = True" in notes and "meshplan's time model assumes it" in notes
    assert imported.request["zero_stage"] == fields["zero_stage"]


def test_overlap_comm_false_says_the_estimate_assumes_it_on_and_what_false_changes():
    rendered = api.render_config("deepspeed", parse_request(dict(DEEPSPEED[0], framework="deepspeed")))
    text = rendered.text.replace('"overlap_comm": true', '"overlap_comm": false')
    assert text != rendered.text
    imported = api.import_config(text, path="ds_config.json", framework="deepspeed")
    (note,) = [n for n in imported.notes if "overlap_comm = False" in n]
    assert "meshplan's time model assumes it" in note and "a longer step than meshplan predicts" in note
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
