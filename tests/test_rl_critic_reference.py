"""Where the reference model's weights and PPO's critic are in an RL step, as the frameworks place them.

verl's FSDP reference is CPU-offloaded (CPUOffload / CPUOffloadPolicy): in its log-prob pass each FSDP unit's shard is
copied to the GPU at its all-gather and freed at its reshard, so the pass holds the gathered units (the root's output
layer and norm, the running unit, the next one), never the whole shard; every FSDP forward holds those units
(cards/frameworks/verl.yaml rl.reference_pass_source). With the rollout placed apart SkyRL runs PPO's critic as its own
Ray actor group on GPUs of its own (trainer.py build_models, colocate_all False), never swapped through the host; verl
keeps it in the actor's resource pool (one_step_off_policy main_ppo.py): skyrl.yaml / verl.yaml
rl.critic_placement_source.
"""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.mesh import ranks_per_node
from meshplan.core.errors import MeshplanError
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


def test_skyrl_ppo_placed_apart_puts_the_critic_on_gpus_of_its_own():
    """24 GPUs, 8 for the rollout: the policy (and reference) on 8, the critic on 8 of its own. The actor's GPUs hold
    no critic in any phase; the critic's update is on its own pool, as large as the actor's update alone; the host
    holds none of it (the critic is never offloaded there)."""
    job, plan, report, s = memory("skyrl", 24, zero_stage=3, algorithm="ppo", placement="separate", rollout_gpus=8)
    assert job.num_gpus == 8 and plan.dp * plan.cp == 8
    assert any("the critic on 8 of its own" in n for n in job.notes)
    assert phase(report, "actor_update").detail["critic_resident"] == 0
    assert phase(report, "log_prob").detail["resident"] == 0
    critic = phase(report, "critic_update")
    assert critic.pool == "critic" and critic.peak_bytes == s.total_bytes
    ref = ENGINE_BYTES * s.detail["weight_params"]
    held = s.weights_bytes + s.optimizer_bytes + ref  # the policy's and the reference's, no critic
    assert report.host_bytes_per_node == pytest.approx(held * ranks_per_node(job), rel=1e-6)


def test_verl_ppo_placed_apart_keeps_the_critic_beside_the_actor():
    """verl maps the critic to the actor's trainer pool: it stays on the actor's GPUs, which take every trainer GPU."""
    job, _, report, s = memory("verl", 24, zero_stage=3, algorithm="ppo", placement="separate", rollout_gpus=8)
    assert job.num_gpus == 16
    resident = phase(report, "actor_update").detail["critic_resident"]
    assert resident == pytest.approx(s.weights_bytes + s.optimizer_bytes, abs=8)
    assert phase(report, "critic_update").pool == "trainer"


def test_skyrl_ppo_colocated_keeps_the_critic_on_the_shared_gpus():
    job, _, report, _ = memory("skyrl", 16, zero_stage=3, algorithm="ppo")
    assert job.num_gpus == 16 and phase(report, "critic_update").pool == "trainer"


@pytest.mark.parametrize("face", ["api", "cli"])
def test_an_odd_split_between_policy_and_critic_is_refused_clearly(face, capsys):
    args = dict(framework="skyrl", num_gpus=15, zero_stage=3, algorithm="ppo", placement="separate", rollout_gpus=4)
    if face == "api":
        with pytest.raises(MeshplanError, match=r"15 - rollout_gpus 4 = 11 GPUs cannot be split evenly"):
            api.estimate_memory(Request(**BASE, **args))
        return
    from meshplan.faces.cli import main

    argv = ["memory", "qwen3-8b", "--job", "rl", *[x for k, v in args.items() for x in (f"--{k.replace('_', '-')}",
                                                                                       str(v))]]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "cannot be split evenly between the policy and PPO's critic" in err and "Traceback" not in err


def test_the_rendered_critic_takes_the_policys_gpus_and_the_step_counts_them():
    """SkyRL's config gives the critic the policy's node count and GPUs per node (one node of 8 each here); tokens per
    GPU count the policy's, the critic's and the rollout's GPUs: the whole num_gpus."""
    req = Request(**BASE, framework="skyrl", num_gpus=24, zero_stage=3, algorithm="ppo", placement="separate",
                  rollout_gpus=8)
    text = api.render_config("skyrl", req, force=True).text
    text = text.replace(" ", "")
    for key in ("policy_num_nodes=1", "policy_num_gpus_per_node=8", "critic_num_nodes=1", "critic_num_gpus_per_node=8"):
        assert f"trainer.placement.{key}" in text  # 8 + 8 + the rollout's 8, not a 16-GPU policy and critic
    report = api.estimate_throughput(req)
    assert report.tokens_per_s_per_gpu == pytest.approx(report.tokens_per_s / 24, rel=1e-9)


def test_the_rendered_files_header_and_a_refusal_name_the_jobs_gpus_not_the_trainers():
    """SkyRL PPO placed apart on 24 GPUs rendered '# Qwen3-8B on 8 x NVIDIA H100 ...' (the trainer's share), and a
    refused layout of it said 'on 8 x': both name the job's 24 with its pools."""
    req = Request(**BASE, framework="skyrl", num_gpus=24, zero_stage=3, algorithm="ppo", placement="separate",
                  rollout_gpus=8)
    header = api.render_config("skyrl", req, force=True).text.splitlines()[1]
    assert header.startswith("# Qwen3-8B on 24 (the trainer's 8, PPO's critic 8, the rollout engine's 8) x ")
    with pytest.raises(MeshplanError, match=r"on 24 \(the trainer's 8, PPO's critic 8, the rollout engine's 8\) x"):
        api.render_config("skyrl", req.model_copy(update={"micro_batch_size": 64, "recompute": "none"}))
    colocated = api.render_config("verl", Request(**BASE, framework="verl", num_gpus=8, param_offload=True,
                                                  optimizer_offload=True), force=True)
    assert colocated.text.splitlines()[1].startswith("# Qwen3-8B on 8 x ")


def test_min_gpus_counts_the_critics_gpus_beside_the_policys_and_the_rollouts():
    """The smallest SkyRL PPO job placed apart: each trainer count is taken twice (policy, critic) plus the rollout's,
    and the plan it answers is the RL recommend's #1 at that count, whose policy has half of what the rollout
    leaves."""
    fields = dict(model="qwen2.5-7b", framework="skyrl", job="rl", algorithm="ppo", zero_stage=3, gpu="h100",
                  placement="separate", rollout_gpus=8)
    result = api.minimum_gpus(Request(**fields))
    assert result.num_gpus is not None and (result.num_gpus - 8) % 2 == 0
    plan = result.candidate.plan
    assert plan.dp * plan.cp * plan.tp * plan.pp == (result.num_gpus - 8) // 2
    assert api.recommend(Request(**fields, num_gpus=result.num_gpus), top_k=1).candidates[0].plan == plan


def test_skyrl_trains_ppos_critic_only_on_its_fsdp_strategy():
    """SkyRL's validate_megatron_cfg refuses a critic: PPO there takes zero_stage 3 (FSDP) when left out, noted, and
    recommend ranks only FSDP layouts; a Megatron zero_stage is refused with the reason. verl trains a critic on
    both."""
    job, plan = resolve(Request(**BASE, framework="skyrl", num_gpus=16, algorithm="ppo"))
    assert plan.zero_stage == 3 and any("critic only on its fsdp engine" in n for n in job.notes)
    rec = api.recommend(Request(**BASE, framework="skyrl", num_gpus=16, algorithm="ppo"), top_k=3)
    assert rec.candidates and {c.plan.zero_stage for c in rec.candidates} == {3}
    with pytest.raises(MeshplanError, match="runs only on its fsdp engine, not on zero_stage 1's megatron"):
        api.estimate_memory(Request(**BASE, framework="skyrl", num_gpus=16, algorithm="ppo", zero_stage=1))
    _, plan = resolve(Request(**BASE, framework="skyrl", num_gpus=16, algorithm="grpo"))
    assert plan.zero_stage == 1  # no critic: SkyRL's default strategy
    _, plan = resolve(Request(**BASE, framework="verl", num_gpus=16, algorithm="ppo"))
    assert plan.zero_stage == 1


def test_the_critics_zero_stage_is_said_with_its_reason_not_as_the_requests():
    """SkyRL PPO's zero_stage 3 is the resolver's (the critic trains only on FSDP), which the search keeps. Before:
    recommend dropped its note with the searched fields' defaults (its rows all ZeRO 3, no word why), and min-gpus
    said 'Fixed by the request: zero_stage=3' of a request that set no zero_stage."""
    fields = dict(BASE, framework="skyrl", algorithm="ppo", prompts_per_step=16, samples_per_prompt=4)
    note = "zero_stage not given: 3, as skyrl trains PPO's critic only on its fsdp engine."
    assert note in api.recommend(Request(**fields, num_gpus=8), top_k=1).assumptions
    said = api.minimum_gpus(Request(**fields)).assumptions
    assert note in said and not any(a.startswith("Fixed by the request") for a in said)
    said = api.minimum_gpus(Request(**fields, zero_stage=3)).assumptions
    assert "Fixed by the request: zero_stage=3." in said and note not in said
