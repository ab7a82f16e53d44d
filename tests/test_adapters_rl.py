"""Proof that RL job renderings (rollout section, n, batch sizes, lengths, offloads, critic only for PPO) use only keys
the pinned verl 0.9.1 (Hydra composes its packaged ppo_trainer.yaml) and SkyRL 0.4.0 (its config dataclasses) accept,
and that the values read back are the plan's."""

from __future__ import annotations

import json
import subprocess

import pytest
from framework_packages import venv_python, wheel_tree
from framework_source import SourceTree
from test_adapters_frameworks import COMPOSE, _walk

from meshplan.adapters.parse import overrides, shell_tokens
from meshplan.adapters.render import render
from meshplan.core.errors import MeshplanError
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

GRPO = {"model": "qwen3-30b-a3b", "num_gpus": 16, "ep": 8, "etp": 1, "job": "rl", "samples_per_prompt": 8,
        "prompts_per_step": 64, "response_length": 4096, "rollout_tp": 4, "rollout_memory_fraction": 0.7,
        "param_offload": True, "optimizer_offload": True}  # no grad_offload: verl 0.9.1 has none
JOBS = [  # (framework, variant, request fields)
    ("verl", "megatron", {**GRPO, "framework": "verl"}),
    ("verl", "megatron", {**GRPO, "framework": "verl", "algorithm": "ppo", "rollout_engine": "sglang",
                          "rollout_enforce_eager": True}),
    ("verl", "megatron", {**GRPO, "framework": "verl", "algorithm": "dapo", "rollout_tp": 2, "rollout_dp": 4,
                          "rollout_ep": 8, "optimizer_offload_fraction": 1.0}),
    ("verl", "fsdp", {**GRPO, "framework": "verl", "zero_stage": 3, "ep": 1, "etp": None}),
    ("verl", "fsdp", {**GRPO, "framework": "verl", "algorithm": "ppo", "zero_stage": 3, "ep": 1, "etp": None}),
    # LoRA on the routed experts: PEFT's target_parameters, which verl 0.9.1's packaged YAML does not declare
    ("verl", "fsdp", {**GRPO, "framework": "verl", "zero_stage": 3, "ep": 1, "etp": None, "lora_rank": 16,
                      "lora_target_parameters": ["gate_up_proj", "down_proj"]}),
    ("skyrl", "rl", {**GRPO, "framework": "skyrl", "param_offload": None, "rollout_enforce_eager": True}),
    # PPO on SkyRL's FSDP strategy: its Megatron one trains no critic (utils.py validate_megatron_cfg)
    ("skyrl", "fsdp", {**GRPO, "framework": "skyrl", "algorithm": "ppo", "param_offload": None, "ep": 1,
                       "etp": None, "placement": "separate", "rollout_gpus": 8}),
]

def renderings(framework: str):
    out = recommended() if framework == "verl" else []
    for fw, variant, fields in JOBS:
        if fw == framework:
            job, plan = resolve(parse_request({k: v for k, v in fields.items() if v is not None}))
            out.append((job, plan, render(fw, job, plan, variant=variant)))
    return out

def recommended():
    """recommend's #1 for GRPO on Qwen3-30B-A3B with verl on 16 H100 (issue 16), rendered."""
    from meshplan import api

    req = parse_request({"model": "qwen3-30b-a3b", "framework": "verl", "num_gpus": 16, "job": "rl",
                         "samples_per_prompt": 8, "prompts_per_step": 64, "response_length": 4096})
    job, _ = resolve(req)
    plan = api.recommend(req, top_k=1).candidates[0].plan
    return [(job, plan, render("verl", job, plan, variant="megatron"))]


def test_rl_renderings_carry_the_rollout_and_drop_the_critic_unless_ppo():
    for job, plan, result in renderings("verl"):
        keys = overrides(shell_tokens(result.text))
        assert keys["actor_rollout_ref.rollout.tensor_model_parallel_size"] == str(plan.rollout_tp)
        assert keys["actor_rollout_ref.rollout.n"] == str(job.rl.samples_per_prompt)
        assert keys["data.train_batch_size"] == str(job.rl.prompts_per_step)
        assert keys["actor_rollout_ref.rollout.name"] == plan.rollout_engine
        assert any(k.startswith("critic.") for k in keys) == (job.rl.algorithm == "ppo")
    for job, plan, result in renderings("skyrl"):
        keys = overrides(shell_tokens(result.text))
        assert keys["generator.inference_engine.num_engines"] == str(plan.rollout_gpus // plan.rollout_tp)
        assert keys["trainer.placement.colocate_all"] == str(plan.placement == "colocated").lower()
        assert ("trainer.critic.model.path" in keys) == (job.rl.algorithm == "ppo")

CRITIC_AS_ACTOR = {  # verl 0.9.1: the critic's own key for each the actor's plan sets (their defaults differ)
    "megatron": {"actor_rollout_ref.actor.megatron.param_offload": "critic.megatron.param_offload",
                 "actor_rollout_ref.actor.megatron.optimizer_offload": "critic.megatron.optimizer_offload"},
    "fsdp": {"actor_rollout_ref.actor.fsdp_config.param_offload": "critic.fsdp.param_offload",
             "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "critic.fsdp.optimizer_offload",
             "actor_rollout_ref.model.enable_gradient_checkpointing": "critic.model.enable_gradient_checkpointing"},
}


def test_verls_critic_is_rendered_as_the_actors_plan():
    """PPO's critic is estimated as the actor's plan (its offloads, its recompute), so its keys say so: verl's
    packaged critic keeps its states on the GPU and checkpoints the FSDP model whatever the actor's are set to, and
    the rendered critic ran resident where meshplan counted it offloaded."""
    seen = set()
    for job, plan, result in renderings("verl"):
        keys = overrides(shell_tokens(result.text))
        if job.rl.algorithm != "ppo":
            continue
        seen.add(result.variant)
        for actor, critic in CRITIC_AS_ACTOR[result.variant].items():
            assert keys.get(critic) == keys.get(actor), (critic, keys.get(critic), keys.get(actor))
        assert plan.param_offload and plan.optimizer_offload and keys[critic] is not None
    assert seen == {"megatron", "fsdp"}


def test_skyrls_critic_is_rendered_as_the_policys_plan():
    """SkyRL's critic (FSDP) takes the policy's sequence parallel size, shard group, offloads and reduce dtype in
    its own CriticConfig keys: left at their defaults it ran another plan than the one meshplan estimated."""
    pairs = {"trainer.policy.sequence_parallel_size": "trainer.critic.sequence_parallel_size",
             "trainer.policy.fsdp_config.fsdp_size": "trainer.critic.fsdp_config.fsdp_size",
             "trainer.policy.fsdp_config.cpu_offload": "trainer.critic.fsdp_config.cpu_offload",
             "trainer.policy.optimizer_config.offload_after_step": "trainer.critic.optimizer_config.offload_after_step"}
    ppo = [(plan, overrides(shell_tokens(result.text))) for job, plan, result in renderings("skyrl")
           if job.rl.algorithm == "ppo"]
    assert ppo
    for plan, keys in ppo:
        for policy, critic in pairs.items():
            assert keys.get(critic) == keys.get(policy), (critic, keys.get(critic), keys.get(policy))
        assert keys["trainer.critic.sequence_parallel_size"] == str(plan.cp)


def test_skyrls_critic_lines_are_the_policys_in_their_order():
    """The critic's CriticConfig lines are the policy's FSDP lines written again under trainer.critic, one loop
    (adapters/rl.skyrl_overrides): same keys, same values, same order, the reduce dtype included, for PPO at cp 1
    and 2, with and without each offload and an fp32 or bf16 reduce; GRPO writes none."""
    base = {"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 16, "job": "rl", "samples_per_prompt": 8,
            "prompts_per_step": 64, "response_length": 2048, "zero_stage": 3}
    seen = set()
    for algorithm, cp, offload, reduce32 in [("ppo", 1, False, False), ("ppo", 2, True, True),
                                             ("ppo", 2, False, True), ("grpo", 1, True, False)]:
        job, plan = resolve(parse_request({**base, "algorithm": algorithm, "cp": cp, "param_offload": offload,
                                           "optimizer_offload": offload, "grad_reduce_in_fp32": reduce32}))
        lines = [t.split("=", 1) for t in shell_tokens(render("skyrl", job, plan, variant="fsdp").text)
                 if t.startswith(("trainer.policy.", "trainer.critic.")) and "=" in t]
        fsdp = [(k, v) for k, v in lines if not k.startswith(("trainer.policy.model.", "trainer.critic.model."))]
        policy = [(k.removeprefix("trainer.policy."), v) for k, v in fsdp if k.startswith("trainer.policy.")]
        critic = [(k.removeprefix("trainer.critic."), v) for k, v in fsdp if k.startswith("trainer.critic.")]
        assert critic == (policy if algorithm == "ppo" else []), (algorithm, cp, offload, reduce32)
        seen |= {k for k, _ in critic}
    assert {"sequence_parallel_size", "fsdp_config.fsdp_size", "fsdp_config.cpu_offload",
            "fsdp_config.mixed_precision.reduce_dtype", "optimizer_config.offload_after_step"} <= seen


def test_verl_separate_placement_is_refused_with_the_reason():
    job, plan = resolve(parse_request({**GRPO, "framework": "verl", "placement": "separate", "rollout_gpus": 8}))
    with pytest.raises(MeshplanError, match="one-step-off"):
        render("verl", job, plan, variant="megatron")

PROBES = ["actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.n",
          "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.expert_parallel_size",
          "actor_rollout_ref.rollout.name", "data.max_response_length", "algorithm.adv_estimator",
          "actor_rollout_ref.actor.megatron.param_offload", "critic.megatron.param_offload",
          "critic.megatron.optimizer_offload", "critic.fsdp.param_offload", "critic.fsdp.optimizer_offload",
          "critic.model.enable_gradient_checkpointing"]

@pytest.mark.slow
def test_verl_rl_overrides_compose_with_the_packaged_yaml():
    python = venv_python("hydra", ["hydra-core==1.3.2"], python_version="3.11")
    config_dir = wheel_tree("verl") / "verl" / "trainer" / "config"
    results = renderings("verl")
    jobs = []
    for _, _, result in results:
        tokens = shell_tokens(result.text)
        jobs.append(["ppo_trainer", tokens[tokens.index("verl.trainer.main_ppo") + 1:], PROBES])
    proc = subprocess.run([str(python), "-c", COMPOSE, str(config_dir)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    for (job, plan, result), answer in zip(results, answers, strict=True):
        assert answer["ok"], f"{answer.get('error')}\n{result.text}"
        values = answer["values"]
        assert values["actor_rollout_ref.rollout.tensor_model_parallel_size"] == plan.rollout_tp
        assert values["actor_rollout_ref.rollout.n"] == job.rl.samples_per_prompt
        assert values["actor_rollout_ref.rollout.gpu_memory_utilization"] == plan.rollout_memory_fraction
        assert values["actor_rollout_ref.rollout.expert_parallel_size"] == plan.rollout_ep
        assert values["actor_rollout_ref.rollout.name"] == plan.rollout_engine
        assert values["data.max_response_length"] == job.rl.response_length
        assert values["algorithm.adv_estimator"] == ("gae" if job.rl.algorithm == "ppo" else "grpo")
        if job.rl.algorithm == "ppo":  # the critic composed with the actor's offloads (and FSDP's checkpointing)
            engine = "megatron" if result.variant == "megatron" else "fsdp"
            assert values[f"critic.{engine}.param_offload"] == plan.param_offload
            assert values[f"critic.{engine}.optimizer_offload"] == plan.optimizer_offload
            if engine == "fsdp":
                assert values["critic.model.enable_gradient_checkpointing"] == (plan.recompute == "full")

@pytest.mark.slow
def test_skyrl_rl_keys_exist_in_its_config_dataclasses():

    tree = SourceTree(wheel_tree("skyrl"))
    megatron = SourceTree(wheel_tree("megatron-core"), wheel_tree("megatron-bridge"))
    transformer = set(megatron.fields("megatron.core.transformer.transformer_config", "TransformerConfig"))
    optimizer = set(megatron.fields("megatron.core.optimizer.optimizer_config", "OptimizerConfig"))
    for _, _, result in renderings("skyrl"):
        keys = overrides(shell_tokens(result.text))
        assert keys and not any(k.startswith("+") for k in keys)
        for key in keys:
            _walk(tree, "skyrl.train.config.config", "SkyRLTrainConfig", key, transformer, optimizer)


def _dataclass_defaults(path, cls: str) -> dict:
    import ast

    tree = ast.parse(path.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {s.target.id: ast.literal_eval(s.value) for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and isinstance(s.value, ast.Constant)}


@pytest.mark.slow
def test_rl_card_defaults_are_the_pinned_packages_own():
    import yaml

    from meshplan.knowledge.cards import rl_card

    config = wheel_tree("verl") / "verl" / "trainer" / "config"
    rollout = yaml.safe_load((config / "rollout" / "rollout.yaml").read_text())
    data = yaml.safe_load((config / "data" / "legacy_data.yaml").read_text())
    d = rl_card("verl").defaults
    assert (d.memory_fraction, d.rollout_tp, d.rollout_dp, d.rollout_ep, d.samples_per_prompt, d.max_num_seqs,
            d.max_num_batched_tokens) == (rollout["gpu_memory_utilization"], rollout["tensor_model_parallel_size"],
                                          rollout["data_parallel_size"], rollout["expert_parallel_size"],
                                          rollout["n"], rollout["max_num_seqs"], rollout["max_num_batched_tokens"])
    assert (d.prompts_per_step, d.prompt_length, d.response_length) == (
        data["train_batch_size"], data["max_prompt_length"], data["max_response_length"])
    source = wheel_tree("skyrl") / "skyrl" / "train" / "config" / "config.py"
    engine = _dataclass_defaults(source, "InferenceEngineConfig")
    d = rl_card("skyrl").defaults
    assert (d.memory_fraction, d.rollout_tp, d.rollout_dp, d.rollout_ep, d.max_num_seqs, d.max_num_batched_tokens,
            d.engine) == (engine["gpu_memory_utilization"], engine["tensor_parallel_size"],
                          engine["data_parallel_size"], engine["expert_parallel_size"], engine["max_num_seqs"],
                          engine["max_num_batched_tokens"], engine["backend"])
    assert d.samples_per_prompt == _dataclass_defaults(source, "GeneratorConfig")["n_samples_per_prompt"]
    assert d.response_length == _dataclass_defaults(source, "SamplingParams")["max_generate_length"]
    trainer = _dataclass_defaults(source, "TrainerConfig")
    assert (d.prompts_per_step, d.prompt_length) == (trainer["train_batch_size"], trainer["max_prompt_length"])


VERL_DEPRECATED_ULYSSES = """python3 -m verl.trainer.main_ppo \\
  actor_rollout_ref.model.path=Qwen/Qwen3-8B \\
  trainer.nnodes=2 trainer.n_gpus_per_node=8 \\
  actor_rollout_ref.actor.strategy=fsdp2 \\
  actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 \\
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 \\
  data.train_batch_size=64
"""


def test_verl_fsdp_ulysses_goes_to_each_engines_own_key():
    """verl 0.9.1 builds each FSDP engine from an EngineConfig: the actor's and the reference's fsdp_config, the
    critic's critic.fsdp (workers/config/critic.py; its deprecated top-level ulysses_sequence_parallel_size is copied
    nowhere, so writing it left the critic at Ulysses 1 beside an actor at cp). The deprecated actor key, which 0.9.1
    still copies into the actor's and reference's fsdp_config (and the legacy worker read), is read as cp."""
    from meshplan import api

    job, plan = resolve(parse_request({"framework": "verl", "model": "qwen3-8b", "num_gpus": 16, "zero_stage": 3,
                                       "cp": 4, "job": "rl", "algorithm": "ppo"}))
    o = overrides(shell_tokens(render("verl", job, plan).text))
    assert {k: o.get(f"{k}.ulysses_sequence_parallel_size") for k in (
        "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")} == dict.fromkeys(
        ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"), "4")
    assert "critic.ulysses_sequence_parallel_size" not in o
    imported = api.import_config(VERL_DEPRECATED_ULYSSES, framework="verl")
    assert imported.sources["cp"].endswith("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    assert api.request_from_config(imported, {"gpu": "h100"}).cp == 4


def test_skyrls_phase_optimizer_offload_renders_no_in_step_cpu_optimizer():
    """SkyRL's RL trainer offloads the optimizer between phases by default (offload_after_step, the plan's
    optimizer_offload); Megatron-Core's in-step CPU optimizer is optimizer_offload_fraction's alone (cards/frameworks/
    skyrl.yaml offload). Every default SkyRL Megatron RL config was rendered with optimizer_cpu_offload=true and
    optimizer_offload_fraction=1.0, a CPU Adam step the estimate never timed, and read back as fraction 1.0; verl's
    adapter guarded its two call sites itself. megatron_cpu_optimizer now reads the engine's offload section."""
    from meshplan import api
    from meshplan.request.resolve import resolve
    from meshplan.schema.request import Request

    fields = dict(model="mistral-7b", gpu="h200", num_gpus=8, framework="skyrl", job="rl", samples_per_prompt=4)
    request = Request(**fields)
    assert resolve(request)[1].optimizer_offload  # SkyRL's offload_after_step default
    text = api.render_config("skyrl", request).text
    assert "optimizer_cpu_offload" not in text and "optimizer_offload_fraction" not in text
    back = api.request_from_config(api.import_config(text, path="run.sh", framework="skyrl"),
                                   {k: fields[k] for k in ("model", "gpu", "num_gpus")})
    assert resolve(back)[1].optimizer_offload_fraction == 0.0
    share = api.render_config("skyrl", Request(**fields, optimizer_offload_fraction=0.5)).text
    assert "optimizer_config_kwargs.optimizer_offload_fraction=0.5" in share
