"""The rollout phase's fixes work: RL005's (the rollout does not fit beside the trainer) and MEM002's where an RL job
peaks in its rollout name changes that, applied as `check --config` reads them (fix_changes, one request per
alternative), clear the rule without the engine then holding no sequence (RL006). A lower memory fraction that would
leave no KV cache is not offered (it was: "rollout_memory_fraction 0.36 (the KV cache shrinks to 0.0 GiB)"), nor a
larger rollout_tp alone, which splits the weights but not the fraction's budget, so lowers no peak."""

from __future__ import annotations

import re

import pytest

from meshplan import api
from meshplan.adapters.read.fixes import NO_FIX, fix_changes
from meshplan.core.errors import MeshplanError
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
    # fits, under the headroom; since rlloss59's loss path (8 B per logit kept in verl Megatron's update) the actor
    # update is over the headroom at any fraction (0.30: MEM002 too), so its fix names offload, not a fraction
    ({"rollout_tp": 4, "rollout_memory_fraction": 0.35}, "MEM002"),
])
def test_rollout_fixes_clear_the_rule_and_hold_a_sequence(extra, rule):
    req = {**QWEN_RL, **extra}
    found = errors(req)
    assert rule in found
    fixed = alternatives(found[rule].fix, req)
    assert rule == "MEM002" or any(
        "rollout_memory_fraction" in r and r["rollout_memory_fraction"] != req.get("rollout_memory_fraction")
        for r in fixed), found[rule].fix  # a fraction (with a rollout_tp where needed) is among them
    assert fixed, found[rule].fix
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


MINI = dict(model="qwen3-30b-a3b", framework="verl", gpu="h100", num_gpus=16, job="rl", prompts_per_step=256,
            samples_per_prompt=8, response_length=4096, tp=4, pp=2, vpp=8, etp=4, micro_batch_size=16)


def test_an_rl_update_s_schedule_runs_per_mini_batch_on_every_face():
    """verl runs Megatron-Core's schedule once per mini-batch: 4 prompts x 8 samples over dp 2 at micro-batch 16 is one
    micro-batch, which interleaving over pp 2 refuses (PP005). check said ok (it counted the step's 64), while memory
    and the RL recommend's update estimate raised PP005 from a derived job, with a global_batch_size fix; now every
    face names PP005 per mini-batch with a prompts_per_mini_batch fix, and that fix passes it."""
    req = {**MINI, "prompts_per_mini_batch": 4}
    found = errors(req)["PP005"]
    assert "1 micro-batches per mini-batch" in found.message and "prompts_per_mini_batch = 8" in found.fix
    for call in (api.estimate_memory, api.estimate_throughput):
        with pytest.raises(MeshplanError, match=r"PP005: .* per mini-batch .* prompts_per_mini_batch = 8"):
            call(Request(**req))
    assert "PP005" not in errors({**MINI, "prompts_per_mini_batch": 8})
    assert "PP005" not in errors(MINI)  # the whole step in one mini-batch: 128 micro-batches


def test_the_rl_actor_search_ranks_layouts_at_one_mini_batch():
    """The RL recommend's actor search is a training search at one mini-batch's sequences (rl/job.trainer_request), so
    the layouts it hands the RL ranking run the update's schedule: at the step's 2,048 sequences it handed one whose
    mini-batch interleaving refuses, and the RL ranking raised PP005 (a traceback)."""
    from meshplan.search.rl import _training

    req = Request(**{k: v for k, v in MINI.items() if k not in ("tp", "pp", "vpp", "etp", "micro_batch_size")},
                  prompts_per_mini_batch=4)
    assert _training(req).global_batch_size == 4 * 8
    rec = api.recommend(req)
    assert rec.candidates and all(4 * 8 % (c.plan.dp * c.plan.micro_batch_size) == 0 for c in rec.candidates)


def test_rl006s_phase_offload_names_the_fraction_the_freed_memory_needs():
    """SGLang's fraction is of the memory the trainer leaves free: RL006 named optimizer_offload=true ("more is free
    when the engine starts") for a Qwen3-30B-A3B verl job on 16 A100-40GB at fraction 0.5, and with it the engine still
    held no sequence (RL006 again, now asking 0.74). The offload is estimated before it is named, with the fraction it
    then needs; each alternative, applied, clears RL006."""
    fields = dict(model="qwen3-30b-a3b", framework="verl", gpu="a100-40gb", num_gpus=16, job="rl", tp=4, pp=2,
                  micro_batch_size=1, samples_per_prompt=8, prompts_per_mini_batch=16, param_offload=True,
                  optimizer_offload_fraction=0.5, rollout_engine="sglang")
    rl006 = next(f for f in api.check_config(Request(**fields)).findings if f.id == "RL006")
    assert "optimizer_offload=true with rollout_memory_fraction=" in rl006.fix
    for change in fix_changes(rl006.fix, fields):
        assert "RL006" not in {f.id for f in api.check_config(Request(**(fields | change))).findings}, change


DSV3_ROLLOUT = dict(model="deepseek-v3", framework="verl", gpu="h100", num_gpus=256, job="rl", algorithm="grpo",
                    tp=1, pp=16, ep=16, etp=1, first_stage_layers=4, last_stage_layers=1, recompute="full",
                    recompute_method="uniform", recompute_layers=1, param_offload=True, optimizer_offload=True,
                    micro_batch_size=1, prompts_per_step=512, prompts_per_mini_batch=128, samples_per_prompt=4,
                    prompt_length=2048, response_length=4096, rollout_memory_fraction=0.8, rollout_tp=32)


def test_rl004_names_no_node_sized_rollout_tp_whose_engine_cannot_start():
    """verl's run_deepseek671b_math_megatron_80gb.sh runs vLLM at rollout_tp=32 on 8-GPU nodes: RL004's fix was
    'rollout_tp in {1, 2, 4, 8}' and check --config wrote rollout_tp=1, where the engine needs 1,250 GiB per GPU
    (RL006 at each of them). Now the fix says none inside the node holds it and check --config writes no edit."""
    rl004 = next(f for f in api.check_config(Request(**DSV3_ROLLOUT)).findings if f.id == "RL004")
    assert rl004.fix.startswith("None of the rollout_tp inside the 8-GPU domain")
    assert "keep rollout_tp=32" in rl004.fix
    assert NO_FIX.search(rl004.fix)  # config_fixes reads no edit from it
    assert "RL006" in errors({**DSV3_ROLLOUT, "rollout_tp": 8})  # the largest size inside the node: no sequence


def test_rl004_names_the_node_sized_rollout_tps_that_hold_a_sequence():
    """Where sizes inside the node hold the engine, the fix names those, and the one check --config writes clears
    both RL004 and RL006."""
    fields = dict(model="qwen3-30b-a3b", framework="verl", gpu="h100", num_gpus=16, ep=8, job="rl",
                  samples_per_prompt=8, rollout_tp=16)
    rl004 = next(f for f in api.check_config(Request(**fields)).findings if f.id == "RL004")
    assert rl004.fix.startswith("Keep rollout_tp within the node (rollout_tp in {")
    [change] = fix_changes(rl004.fix, fields)
    assert change["rollout_tp"] <= 8
    assert not {"RL004", "RL006"} & set(errors({**fields, **change}))
