"""What a recipe file sets for the optimizer and the gradient buffer, carried with its pipeline split
(published_runs.RECIPE_OPTIMIZERS): Megatron-Bridge's Kimi-K2 recipes train with Muon (dist_muon, one fp32 momentum),
so the recipe's own pipelines fit on 256 H100 where Adam's second moment does not (issue 23's recipe comparison).
A test of the bench too: bench/recommend_vs_recipes.py runs the top pick and the recipe rows with those fields."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.knowledge.published_runs import BRIDGE, RECIPE_SPLITS, recipe_optimizer
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import recommend_vs_recipes as rvr


def test_kimi_k2_recipe_splits_carry_muon_and_fp32_grads():
    kimi = [s for s in RECIPE_SPLITS if s.model == "kimi-k2" and s.repo == BRIDGE]
    assert kimi and all(recipe_optimizer(s) == {"optimizer": "muon", "grad_reduce_in_fp32": True} for s in kimi)
    qwen = [s for s in RECIPE_SPLITS if s.model == "qwen3-235b-a22b"]
    assert qwen and all(recipe_optimizer(s) == {} for s in qwen)  # Adam, fp32 grads: meshplan's defaults


def test_bench_runs_the_top_pick_and_the_recipe_rows_with_the_recipes_optimizer():
    assert rvr.job_fields("kimi-k2") == {"optimizer": "muon", "grad_reduce_in_fp32": True}
    assert rvr.job_fields("qwen3-235b-a22b") == {}
    # every DeepSeek-V3 recipe file (the h100 recipe and the perf recipes built on it): bf16 moments, bf16 grads
    assert rvr.job_fields("deepseek-v3") == {"optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}
    rows = rvr.recipe_pipelines("kimi-k2")
    assert rows and all(f["optimizer"] == "muon" and "pipeline_layout" in f for _, f in rows)


# the helper's pp4 row (16, 16, 16, 13) at TP8 EP64 on 256 H100: expert-dp = 256 / (pp * ep) = 1, so every routed
# expert's states stay on its GPU
PP4 = dict(model="kimi-k2", framework="megatron-bridge", gpu="h100", num_gpus=256, seq_length=4096,
           global_batch_size=4096, micro_batch_size=1, tp=8, pp=4, ep=64, etp=1, zero_stage=1, recompute="selective",
           pipeline_layout="Et*16|t*16|t*16|t*13L", grad_reduce_in_fp32=True)


def test_kimi_k2_recipe_pipeline_fits_with_the_recipes_muon_not_with_adam():
    adam = api.estimate_memory(Request(**PP4))
    muon = api.estimate_memory(Request(**{**PP4, **recipe_optimizer(
        next(s for s in RECIPE_SPLITS if s.model == "kimi-k2" and s.pp == 4 and s.vpp == 1))}))
    assert not adam.fits and muon.fits
    # a 16-layer MoE stage: Muon drops Adam's second fp32 moment (4 B) on its routed experts, unsharded (expert-dp 1)
    experts = 16 * 384 * 3 * 7168 * 2048 / 64
    saved = adam.stages[1].optimizer_bytes - muon.stages[1].optimizer_bytes
    assert saved == pytest.approx(4 * experts, rel=0.03)  # plus the stage's attention and shared experts / dp


def test_memory_report_states_muons_one_momentum():
    adam = api.estimate_memory(Request(model="llama-3.1-8b", num_gpus=8))
    muon = api.estimate_memory(Request(model="llama-3.1-8b", num_gpus=8, optimizer="muon"))
    assert not any(a.startswith("Optimizer muon") for a in adam.assumptions)
    assert any(a.startswith("Optimizer muon: one fp32 momentum") for a in muon.assumptions)
