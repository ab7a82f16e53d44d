"""The rollout phase's fixes work: RL005's (the rollout does not fit beside the trainer) and MEM002's where an RL job
peaks in its rollout name changes that, applied as `check --config` reads them (fix_changes, one request per
alternative), clear the rule without the engine then holding no sequence (RL006). A lower memory fraction that would
leave no KV cache is not offered (it was: "rollout_memory_fraction 0.36 (the KV cache shrinks to 0.0 GiB)"), nor a
larger rollout_tp alone, which splits the weights but not the fraction's budget, so lowers no peak."""

from __future__ import annotations

import re

import pytest

from meshplan import api
from meshplan.adapters.read.fixes import fix_changes
from meshplan.schema.request import Request

QWEN_RL = dict(model="qwen3-30b-a3b", framework="verl", gpu="h100", num_gpus=16, job="rl", algorithm="grpo", tp=4,
               pp=2, vpp=8, etp=4, micro_batch_size=64, recompute="full")


def errors(req: dict) -> dict:
    return {f.id: f for f in api.check_config(Request(**req)).findings}


def alternatives(fix: str, req: dict) -> list[dict]:
    out = []
    for alternative in re.split(r",?\s+or\s+", fix):
        change = (fix_changes(alternative, req) or [{}])[0]
        if change:
            out.append({**req, **change})
    return out


@pytest.mark.parametrize("extra, rule", [
    ({}, "RL005"),  # default fraction, rollout_tp 2: no fraction alone holds a sequence, rollout_tp 4 with one does
    ({"rollout_memory_fraction": 0.36}, "RL005"),
    ({"rollout_tp": 4}, "RL005"),  # a lower fraction alone
    ({"rollout_tp": 4, "rollout_memory_fraction": 0.35}, "MEM002"),  # fits, under the headroom: the rollout's levers
])
def test_rollout_fixes_clear_the_rule_and_hold_a_sequence(extra, rule):
    req = {**QWEN_RL, **extra}
    found = errors(req)
    assert rule in found
    fixed = alternatives(found[rule].fix, req)
    assert any("rollout_memory_fraction" in r and r["rollout_memory_fraction"] != req.get("rollout_memory_fraction")
               for r in fixed), found[rule].fix  # a fraction (with a rollout_tp where needed) is among them
    for changed in fixed:
        after = errors(changed)
        assert rule not in after, (changed, after[rule].message)
        assert "RL006" not in after or "RL006" in found, (changed, after["RL006"].message)  # none brought in


def test_no_fraction_that_leaves_no_kv_cache():
    fix = errors({**QWEN_RL, "rollout_memory_fraction": 0.36})["RL005"].fix
    assert "0.0 GiB" not in fix and "halves the engine's weights" not in fix
    assert "rollout_tp=4 with rollout_memory_fraction=" in fix


def test_training_peak_keeps_the_layout_changes():
    """A training job's MEM002 keeps its layout changes (micro-batch, recompute, pp/tp): the rollout's are for RL."""
    fix = errors(dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, pp=2, micro_batch_size=2, recompute="none",
                      seq_length=4096))["MEM002"].fix
    assert "micro_batch_size=1" in fix and "rollout" not in fix
