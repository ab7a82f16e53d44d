"""Where the reference model's weights are in an RL step's log-prob passes, as the frameworks place them.

verl's FSDP reference is CPU-offloaded (CPUOffload / CPUOffloadPolicy): in its log-prob pass each FSDP unit's shard is
copied to the GPU at its all-gather and freed at its reshard, so the pass holds the gathered units (the root's output
layer and norm, the running unit, the next one), never the whole shard; every FSDP forward holds those units
(cards/frameworks/verl.yaml rl.reference_pass_source).
"""

from __future__ import annotations

import pytest

from meshplan.estimate.memory import forward_gathered_bytes
from meshplan.knowledge.model_counts import layer_params
from meshplan.request.resolve import resolve
from meshplan.rl.engine import ENGINE_BYTES
from meshplan.rl.memory import rl_memory
from meshplan.schema.request import Request

BASE = dict(model="qwen3-8b", gpu="h100", job="rl")


def memory(framework: str, num_gpus: int, **fields):
    job, plan = resolve(Request(**BASE, framework=framework, num_gpus=num_gpus, **fields))
    report = rl_memory(job, plan)
    return job, plan, report, report.stages[0]


def phase(report, name: str):
    return next(p for p in report.phases if p.phase == name)


def test_a_forward_holds_the_root_the_running_unit_and_the_next_one():
    """Qwen3-8B (untied) under FSDP: the root [final norm, lm_head] gathered through the forward, beside the embedding
    unit running and the first decoder layer prefetched (the embedding is larger than any layer), 2 B each."""
    job, plan = resolve(Request(**BASE, framework="verl", num_gpus=16, zero_stage=3, algorithm="grpo"))
    arch = job.model
    assert not arch.tie_word_embeddings and plan.tp == 1
    vh, h = arch.vocab_size * arch.hidden_size, arch.hidden_size
    layer = sum(layer_params(arch, 0).values())
    assert vh > layer
    assert forward_gathered_bytes(job, plan) == [pytest.approx(2 * (vh + h) + 2 * vh + 2 * layer, rel=1e-9)]
    job, plan = resolve(Request(**BASE, framework="verl", num_gpus=16, zero_stage=1, tp=2, algorithm="grpo"))
    assert forward_gathered_bytes(job, plan) == [0.0]  # Megatron: the weights are not sharded


@pytest.mark.parametrize("num_gpus", [8, 64])
def test_verl_fsdp_reference_pass_holds_its_gathered_units_not_its_shard(num_gpus):
    """The log-prob phase is the resident states plus the gathered units (whatever the FSDP size), not plus the
    reference's whole bf16 shard (which is 1/8 of the model on 8 GPUs, 1/64 on 64: it was counted instead)."""
    job, plan, report, s = memory("verl", num_gpus, zero_stage=3, algorithm="grpo")
    log_prob = phase(report, "log_prob")
    gathered = forward_gathered_bytes(job, plan)[0]
    d = log_prob.detail
    assert d["gathered_units"] == int(gathered) > 0
    shard = ENGINE_BYTES * s.detail["weight_params"]
    rest = d["resident"] + d["forward_activations"] + d["fixed"] + d["cuda_graphs"]
    assert log_prob.peak_bytes == pytest.approx(rest + gathered, abs=8)
    assert abs(log_prob.peak_bytes - (rest + gathered + shard)) > shard / 2  # the shard is not on the GPU too
    assert any("one FSDP unit at a time" in a for a in report.assumptions)


def test_a_reference_loaded_back_whole_holds_its_shard_and_the_gathered_units():
    """SkyRL's FSDP reference (backload_to_gpu before its pass) is on the GPU whole in its pass, its forward gathering
    units as well."""
    job, plan, report, s = memory("skyrl", 16, zero_stage=3, algorithm="grpo")
    d = phase(report, "log_prob").detail
    shard = ENGINE_BYTES * s.detail["weight_params"]
    assert d["gathered_units"] == int(forward_gathered_bytes(job, plan)[0]) > 0
    assert d["policy_or_reference_weights"] == int(max(s.weights_bytes, shard))
    assert not any("one FSDP unit at a time" in a for a in report.assumptions)
