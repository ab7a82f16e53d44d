"""RL jobs (meshplan/rollout.py): the request fields, their defaults from the framework cards, the engine's memory."""

from __future__ import annotations

import pytest

from meshplan.errors import MeshplanError
from meshplan.request import parse_request, resolve
from meshplan.rollout import engine_weight_bytes, kv_bytes_per_token, rl_card

GRPO = {"model": "qwen3-30b-a3b", "num_gpus": 16, "ep": 8, "job": "rl", "samples_per_prompt": 8,
        "prompts_per_step": 64}


def rl(framework: str = "verl", **fields):
    return resolve(parse_request({**GRPO, "framework": framework, **fields}))


def test_defaults_are_each_frameworks_own_and_noted():
    job, plan = rl("verl")
    assert (plan.rollout_engine, plan.rollout_tp, plan.rollout_dp, plan.rollout_ep) == ("vllm", 2, 1, 1)
    assert plan.rollout_memory_fraction == 0.5 and plan.placement == "colocated" and plan.rollout_gpus == 16
    assert (job.rl.prompt_length, job.rl.response_length, job.rl.algorithm) == (512, 512, "grpo")
    assert "rollout_memory_fraction not given: 0.5, the verl default." in job.notes
    job, plan = rl("skyrl")
    assert (plan.rollout_tp, plan.rollout_memory_fraction, job.rl.response_length) == (1, 0.8, 1024)
    job, _ = resolve(parse_request({"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 8, "job": "rl"}))
    assert job.rl.samples_per_prompt == 5 and job.rl.prompts_per_step == 1024


def test_the_trainer_step_is_prompts_x_samples_of_prompt_plus_response():
    job, plan = rl(response_length=4096, prompt_length=1024)
    assert job.seq_length == 5120 and job.global_batch_size == 64 * 8 and plan.dp == 16
    job, _ = rl(prompts_per_step=None, global_batch_size=256)
    assert job.rl.prompts_per_step == 32
    job, _ = rl(seq_length=6144, response_length=4096)
    assert job.rl.prompt_length == 2048
    training, plan = resolve(parse_request({"model": "qwen3-30b-a3b", "num_gpus": 16, "ep": 8, "framework": "verl"}))
    assert training.rl is None and plan.rollout_tp is None


def test_separate_placement_takes_the_rollout_gpus_out_of_num_gpus():
    job, plan = rl(placement="separate", rollout_gpus=4, ep=4)
    assert job.num_gpus == 12 and plan.rollout_gpus == 4 and plan.dp == 12


@pytest.mark.parametrize("fields, words", [
    ({"framework": "megatron-core"}, "megatron-core runs no RL job"),
    ({"job": "sft"}, "not for job=sft"),
    ({"framework": "skyrl", "rollout_engine": "sglang"}, "skyrl runs no sglang rollout engine"),
    ({"placement": "separate"}, "placement separate needs rollout_gpus"),
    ({"placement": "separate", "rollout_gpus": 16}, "leaves no GPU"),
    ({"seq_length": 4096, "prompt_length": 512, "response_length": 512}, "is not prompt_length [+] response_length"),
    ({"global_batch_size": 100}, "is not prompts_per_step x samples_per_prompt"),
])
def test_bad_rl_requests_are_clear_errors(fields, words):
    base = {**GRPO, "framework": "verl", **fields}
    with pytest.raises(MeshplanError, match=words):
        resolve(parse_request(base))


def test_rl_fields_imply_an_rl_job():
    job, _ = resolve(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "rollout_tp": 4}))
    assert job.rl is not None and "job not given: rl, as rollout_tp is given." in job.notes


def test_engine_weights_and_kv_per_token_are_exact():
    job, plan = rl(rollout_tp=4)
    arch = job.model  # Qwen3-30B-A3B: 48 layers, 4 KV heads of 128
    assert kv_bytes_per_token(arch, 4) == 2 * 2 * 1 * 128 * 48  # K and V, one head per TP rank
    assert kv_bytes_per_token(arch, 8) == kv_bytes_per_token(arch, 4)  # heads replicated past 4
    assert kv_bytes_per_token(arch, 2) == 2 * 2 * 2 * 128 * 48
    dsv3 = resolve(parse_request({"model": "deepseek-v3", "framework": "verl", "num_gpus": 8, "job": "rl"}))[0].model
    assert kv_bytes_per_token(dsv3, 8) == 2 * (512 + 64) * 61  # MLA latent + rope key, whole on every rank
    ep = plan.model_copy(update={"rollout_tp": 2, "rollout_dp": 4, "rollout_ep": 8})
    no_ep = plan.model_copy(update={"rollout_tp": 2, "rollout_dp": 4, "rollout_ep": 1})
    assert engine_weight_bytes(arch, ep) < engine_weight_bytes(arch, no_ep)  # experts over 8 ranks, not 2


def test_cards_state_each_engines_memory_fraction():
    assert rl_card("verl").engines["vllm"].memory_fraction_of == "total"
    assert rl_card("verl").engines["sglang"].memory_fraction_of == "free"
    assert set(rl_card("skyrl").engines) == {"vllm"}
    assert rl_card("megatron-core") is None
