"""verl's own 96 GB H20 scripts (examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh and
run_qwen3-235b_megatron_96gb.sh), as `meshplan import` reads them and a user checks them with --gpu h20: on verl's
default release they fit, on the allocated basis verl's RL workers run (expandable segments, the card's allocator),
and the actor update's allocated peak is under the H20 on the pre-expandable release too, where the default
allocator's reserve alone decides (bench/README.md RL rows)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.estimate.memory import stage_allocated
from meshplan.request.parse import parse_request

# the fields `meshplan import` reads from each script (its stated lines), with --gpu h20 (both set
# override_transformer_config.bias_activation_fusion=True, over the Qwen3-MoE provider's off in verl 0.9.1)
QWEN3_30B = {"model": "qwen3-30b-a3b", "framework": "verl", "gpu": "h20", "num_gpus": 8, "job": "rl",
             "algorithm": "dapo", "prompts_per_step": 512, "prompts_per_mini_batch": 128, "samples_per_prompt": 16,
             "prompt_length": 2048, "response_length": 8192, "micro_batch_size": 1, "tp": 1, "pp": 1, "cp": 1,
             "ep": 8, "etp": 1, "moe_token_dispatcher": "flex", "param_offload": True, "optimizer_offload": True,
             "optimizer_offload_fraction": 1.0, "rollout_engine": "vllm", "rollout_tp": 4,
             "rollout_memory_fraction": 0.7, "rollout_enforce_eager": True, "bias_activation_fusion": True}
QWEN3_235B = {"model": "qwen3-235b-a22b", "framework": "verl", "gpu": "h20", "num_gpus": 32, "job": "rl",
              "algorithm": "grpo", "prompts_per_step": 32, "prompts_per_mini_batch": 16, "samples_per_prompt": 8,
              "prompt_length": 2048, "response_length": 9632, "micro_batch_size": 1, "tp": 4, "pp": 8, "cp": 1,
              "ep": 4, "etp": 1, "moe_token_dispatcher": "flex", "account_for_embedding": True,
              "account_for_loss": True, "param_offload": True, "optimizer_offload": True,
              "optimizer_offload_fraction": 1.0, "rollout_engine": "vllm", "rollout_tp": 8,
              "rollout_memory_fraction": 0.85, "rollout_enforce_eager": True, "bias_activation_fusion": True}


@pytest.mark.parametrize("fields", [QWEN3_30B, QWEN3_235B], ids=["qwen3-30b-8xh20", "qwen3-235b-32xh20"])
def test_verl_s_own_96gb_scripts_fit_the_h20_as_verl_runs_them(fields):
    report = api.estimate_memory(parse_request(fields))
    assert report.plan.expandable_segments is True  # verl's workers set it for the training phases
    assert report.fit_basis == "allocated" and report.peak_phase == "actor_update"
    assert report.fits and report.fit_bytes <= report.capacity_bytes
    # the pre-expandable release (dpsk.md's 2025-08 runs): the same allocated peak, the reserved one decides
    old = api.estimate_memory(parse_request({**fields, "framework_version": "0.5.0", "expandable_segments": False}))
    allocated = max(stage_allocated(stage) for stage in old.stages)
    assert old.fit_basis == "reserved" and allocated < old.capacity_bytes
