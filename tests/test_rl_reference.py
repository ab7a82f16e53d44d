"""The RL step's memory under the FSDP engines (ZeRO-3 on verl and SkyRL), as their workers hold it: the reference model
is FSDP-wrapped as the actor is, so each GPU holds its shard of the bf16 weights (verl's on the host always, its
CPUOffload; SkyRL's on the GPU unless colocate_all offloads it), and the actor's gradients are freed by the update's
last optimizer.zero_grad(), so between phases they are on neither the GPU nor the host (cards/frameworks/verl.yaml and
skyrl.yaml rl.trainer_memory_source). Under Megatron the reference takes the actor's TP/PP/EP, unsharded over DP, and
the gradient buffer stays."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.mesh import ranks_per_node
from meshplan.request.resolve import resolve
from meshplan.rl.engine import ENGINE_BYTES
from meshplan.rl.memory import rl_memory
from meshplan.schema.request import Request
from meshplan.search.job import search_job
from meshplan.search.rl import _training
from meshplan.search.space import Fixed, params_split
from meshplan.search.zero_stages import least_offloaded_state_bytes

BASE = dict(model="qwen3-8b", gpu="h100", num_gpus=16, job="rl", algorithm="grpo")


def memory(framework: str, **fields):
    job, plan = resolve(Request(**BASE, framework=framework, **fields))
    report = rl_memory(job, plan)
    return job, plan, report, report.stages[0]


def phase(report, name: str):
    return next(p for p in report.phases if p.phase == name)


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_under_fsdp_a_gpu_holds_its_shard_of_the_reference_weights(framework):
    """ZeRO-3 over 16 GPUs: the weights a GPU holds are 1/16 of the model's (the reference read 2 B x the unsharded
    count: 16x too much); under Megatron (ZeRO-1, TP 2) all its TP shard's."""
    _, plan, _, s = memory(framework, zero_stage=3)
    assert plan.dp * plan.cp == 16
    assert s.detail["weight_params"] == pytest.approx(s.detail["params_on_gpu"] / 16, rel=1e-6)
    _, _, _, s = memory(framework, zero_stage=1, tp=2)
    assert s.detail["weight_params"] == s.detail["params_on_gpu"]


def test_verl_fsdp_keeps_its_reference_shard_on_the_host_without_param_offload():
    """verl builds the FSDP reference with CPUOffload(offload_params=True): its shard is on the host whatever
    param_offload says, and not on the GPU between phases (it was counted unsharded on the GPU, 16 GB of an 8B model
    in the rollout, and no host)."""
    job, plan, report, s = memory("verl", zero_stage=3)
    assert not plan.param_offload and not plan.optimizer_offload
    ref = ENGINE_BYTES * s.detail["weight_params"]
    assert report.host_bytes_per_node == pytest.approx(ref * ranks_per_node(job), rel=1e-6)
    assert phase(report, "rollout").detail["reference_resident"] == 0


def test_fsdp_gradients_are_neither_resident_nor_on_the_host_between_phases():
    """verl's FSDP actor: without the phase offloads the GPU keeps its weights and optimizer through the rollout, not
    its gradients; with them the host takes the weights, optimizer and reference shard, not the gradients."""
    _, _, report, s = memory("verl", zero_stage=3)
    assert s.gradients_bytes > 0
    assert phase(report, "rollout").detail["trainer_resident"] == pytest.approx(s.weights_bytes + s.optimizer_bytes,
                                                                                rel=1e-6)
    job, _, report, s = memory("verl", zero_stage=3, param_offload=True, optimizer_offload=True)
    held = s.weights_bytes + s.optimizer_bytes + ENGINE_BYTES * s.detail["weight_params"]
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)


def test_skyrl_colocate_all_offloads_the_fsdp_states_without_gradients_and_the_reference_shard():
    job, plan, report, s = memory("skyrl", zero_stage=3)
    assert plan.placement == "colocated"
    held = s.weights_bytes + s.optimizer_bytes + ENGINE_BYTES * s.detail["weight_params"]
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)


def test_skyrl_placed_apart_swaps_the_policy_and_the_reference_through_the_host():
    """Placed apart, SkyRL still keeps the policy and the reference on the same GPUs (placement.colocate_policy_ref,
    on by default) and offloads the one not running (worker_dispatch._should_manage_offload): the log-prob passes
    find none of the actor's states resident (weights and, with offload_after_step, the optimizer on the host; FSDP's
    gradients freed), the update finds the reference on the host. With offload_after_step off the optimizer stays."""
    job, plan, report, s = memory("skyrl", zero_stage=3, placement="separate", rollout_gpus=8)
    assert plan.optimizer_offload
    assert phase(report, "log_prob").detail["resident"] == 0
    assert phase(report, "actor_update").detail["reference_resident"] == 0
    ref = ENGINE_BYTES * s.detail["weight_params"]
    held = s.weights_bytes + s.optimizer_bytes + ref
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)
    _, _, kept, s = memory("skyrl", zero_stage=3, placement="separate", rollout_gpus=8, optimizer_offload=False)
    assert phase(kept, "log_prob").detail["resident"] == pytest.approx(s.optimizer_bytes, rel=1e-6)


def test_megatron_keeps_its_gradient_buffer_between_phases_unless_an_offload_releases_it():
    """verl's Megatron actor keeps its gradient buffer on the GPU; param_offload releases it (storage resized to 0,
    megatron_utils.offload_megatron_model_to_cpu): off the GPU, and not on the host either (it was counted there)."""
    _, _, report, s = memory("verl", zero_stage=1, tp=2)
    assert s.gradients_bytes > 0
    assert phase(report, "rollout").detail["trainer_resident"] == pytest.approx(
        s.weights_bytes + s.gradients_bytes + s.optimizer_bytes, rel=1e-6)
    job, _, report, s = memory("verl", zero_stage=1, tp=2, param_offload=True)
    assert phase(report, "rollout").detail["trainer_resident"] == pytest.approx(s.optimizer_bytes, rel=1e-6)
    held = s.weights_bytes + ENGINE_BYTES * s.detail["weight_params"]  # the actor's and the reference's weights
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)


def test_skyrl_colocate_all_on_megatron_releases_the_gradients_and_copies_the_rest():
    """SkyRL's Megatron offload_to_cpu: parameters and optimizer to the host, the gradient buffers released
    (Megatron-Core offload_grad_buffers, no host copy)."""
    job, _, report, s = memory("skyrl", zero_stage=1, tp=2)
    assert s.gradients_bytes > 0
    assert phase(report, "rollout").detail["trainer_resident"] == 0
    held = s.weights_bytes + s.optimizer_bytes + ENGINE_BYTES * s.detail["weight_params"]
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)


def test_skyrl_fsdp_without_offload_after_step_keeps_the_optimizer_on_the_gpu():
    """SkyRL's FSDP strategy offloads the optimizer around the rollout only with offload_after_step (the
    optimizer_offload knob, manual_offload_optimizer): without it colocate_all moves the weights and the reference, the
    optimizer stays resident. The Megatron workers offload it either way, so there the knob is one RL step."""
    job, _, report, s = memory("skyrl", zero_stage=3, optimizer_offload=False)
    assert phase(report, "rollout").detail["trainer_resident"] == pytest.approx(s.optimizer_bytes, rel=1e-6)
    held = s.weights_bytes + ENGINE_BYTES * s.detail["weight_params"]
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)
    on = memory("skyrl", zero_stage=1, tp=2)[2]
    off = memory("skyrl", zero_stage=1, tp=2, optimizer_offload=False)[2]
    assert off.host_bytes_per_node == on.host_bytes_per_node and off.peak_bytes == on.peak_bytes


def test_the_floor_is_what_the_framework_copies_and_a_zero3_layout_reaches_it():
    """search/rl.py's host floor under SkyRL's colocate_all: at ZeRO-3 what its own offload copies is the fp32
    weights, 4 B per parameter (the optimizer only with offload_after_step, the gradients never), at ZeRO-1 the bf16
    weights and the optimizer; and the ZeRO-3 layout over every GPU without offload_after_step takes exactly the
    floor's host: the floor is a floor of the rl_host_bytes figure, and a tight one."""
    from meshplan.rl.memory import least_framework_host

    req = Request(**BASE, framework="skyrl")
    job, base = resolve(req)
    training = _training(req)
    trainer, _ = search_job(training)
    fixed = Fixed.from_request(training, trainer)
    params = sum(params_split(trainer))
    assert least_offloaded_state_bytes(trainer, (3,), fixed.carried) == pytest.approx(4 * params, rel=1e-9)
    assert least_offloaded_state_bytes(trainer, (1,), fixed.carried) > 4 * params
    states = least_offloaded_state_bytes(trainer, (0, 1, 3), fixed.carried)
    floor = least_framework_host(job, base, states, params)
    _, _, report, _ = memory("skyrl", zero_stage=3, optimizer_offload=False)
    assert floor <= report.host_bytes_per_node <= floor * 1.001
