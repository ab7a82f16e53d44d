"""verl 0.9.1's and SkyRL 0.4.0's Megatron engines take low-precision Adam moments and gradients. verl 0.9.1's
Megatron engine takes bf16 Adam moments and a bf16 gradient buffer through its precision-aware
optimizer (optim.use_precision_aware_optimizer with exp_avg_dtype / exp_avg_sq_dtype / main_grads_dtype: verl
utils/megatron/optimizer.py init_megatron_optim_config, workers/engine/megatron/transformer_impl.py
_resolve_override_ddp_config). The rules (PR001, PR004) used to refuse both as 'verl has no low-precision Adam
moments' / 'cannot reduce gradients in bf16'; now they pass where verl runs them, are rendered and read back, and
are refused with verl's own reason where it does not (fp16 / fp8 moments, outside the distributed optimizer). The FSDP
engines' bf16 gradient reduction is their MixedPrecisionPolicy's reduce_dtype: tests/test_fsdp_reduce_dtype.py."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.parse import parse_plan
from meshplan.adapters.read import import_config
from meshplan.adapters.render import render
from meshplan.check.config import check_config
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

MOE = dict(model="qwen3-30b-a3b", framework="verl", num_gpus=16, ep=8, global_batch_size=256)


def _errors(**fields) -> dict[str, str]:
    job, plan = resolve(Request(**{**MOE, **fields}))
    return {f.id: f"{f.message} {f.fix}" for f in check_config(job, plan, include_memory=False).findings
            if f.severity == "error"}


def test_bf16_moments_and_gradients_pass_at_zero_1_and_are_refused_where_verl_cannot_run_them():
    assert not {"PR001", "PR004"} & set(_errors(zero_stage=1, optimizer_state_dtype="bf16", grad_reduce_in_fp32=False))
    fp16 = _errors(zero_stage=1, optimizer_state_dtype="fp16")["PR001"]
    assert "fp32 or bf16" in fp16 and "McoreOptimizerConfig" in fp16
    assert "zero_stage=1" in _errors(zero_stage=0, optimizer_state_dtype="bf16")["PR001"]
    grads = _errors(zero_stage=0, grad_reduce_in_fp32=False)["PR004"]
    assert "zero_stage 1 only" in grads and "distributed optimizer" in grads
    assert "PR001" in _errors(zero_stage=3, optimizer_state_dtype="bf16")  # verl's zero_stage 3: its FSDP engine


@pytest.mark.parametrize("variant,prefix", [("megatron", "actor_rollout_ref.actor.optim."), (None, "optim.")])
def test_render_writes_verls_keys_and_reads_them_back(variant, prefix):
    """The RL trainer (actor_rollout_ref.actor.optim.*) and the SFT trainer's Megatron engine (optim.*)."""
    fields = {**MOE, "optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}
    if variant == "megatron":
        fields |= {"job": "rl", "samples_per_prompt": 8}
    job, plan = resolve(Request(**fields))
    result = render("verl", job, plan, variant=variant)
    for key, value in (("use_precision_aware_optimizer", "true"), ("exp_avg_dtype", "bf16"),
                       ("exp_avg_sq_dtype", "bf16"), ("main_grads_dtype", "bf16")):
        assert f"{prefix}{key}={value}" in result.text, result.text
    parsed = parse_plan("verl", result.variant, result.text, job.model.num_layers)
    assert (parsed["optimizer_state_dtype"], parsed["grad_reduce_in_fp32"]) == ("bf16", False)
    imported = import_config(result.text, "run.sh")
    assert imported.request["optimizer_state_dtype"] == "bf16" and imported.request["grad_reduce_in_fp32"] is False
    plain = render("verl", *resolve(Request(**{**fields, "optimizer_state_dtype": None,
                                               "grad_reduce_in_fp32": None})), variant=variant)
    assert "precision_aware" not in plain.text  # fp32 moments and gradients: verl's defaults, nothing written


def test_import_reads_the_dtypes_only_under_verls_switch():
    """verl passes the dtypes to Megatron-Core only with actor.optim.use_precision_aware_optimizer; the switch set
    through override_optimizer_config (its CPU optimizer's, run_qwen3moe-30b_megatron_96gb.sh) keeps fp32."""
    head = ("python3 -m verl.trainer.main_ppo model_engine=megatron trainer.nnodes=2 trainer.n_gpus_per_node=8 "
            "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B "
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8 ")
    off = import_config(head + "actor_rollout_ref.actor.optim.exp_avg_dtype=bf16 "
                               "actor_rollout_ref.actor.optim.main_grads_dtype=bf16\n", "run.sh")
    assert "optimizer_state_dtype" not in off.request and "grad_reduce_in_fp32" not in off.request
    assert sum("precision-aware optimizer, which the file leaves off" in n for n in off.notes) == 2, off.notes
    override = import_config(head + "+actor_rollout_ref.actor.optim.override_optimizer_config."
                                    "use_precision_aware_optimizer=True\n", "run.sh")
    assert "optimizer_state_dtype" not in override.request
    assert not any("use_precision_aware_optimizer" in u for u in override.unsupported), override.unsupported
    assert any("keeps fp32 moments and gradients" in n for n in override.notes)


def test_bf16_moments_are_estimated_on_verl_as_on_megatron_core():
    """One arithmetic for the precision-aware optimizer's states whatever the framework (Megatron-Core's defaults,
    store_param_remainders among them: verl leaves them): the moments and master weights of a sharded parameter
    halve."""
    def optimizer_bytes(framework: str, dtype: str | None) -> int:
        fields = {**MOE, "framework": framework, "zero_stage": 1, "optimizer_state_dtype": dtype}
        return api.estimate_memory(Request(**fields)).stages[0].optimizer_bytes

    assert optimizer_bytes("verl", "bf16") == optimizer_bytes("megatron-core", "bf16")
    assert optimizer_bytes("verl", "bf16") * 2 == optimizer_bytes("verl", None)


@pytest.mark.parametrize("variant,prefix", [("rl", "trainer.policy.megatron_config."), ("sft", "megatron_config.")])
def test_skyrl_writes_megatrons_kwargs_and_reads_them_back(variant, prefix):
    """SkyRL 0.4.0 hands optimizer_config_kwargs to Megatron-Core's OptimizerConfig, its dtype names coerced
    (optimizer_dtype.py: fp8 moments as uint8), and ddp_config.grad_reduce_in_fp32 to its DDP config."""
    fields = dict(model="qwen3-30b-a3b", framework="skyrl", num_gpus=16, ep=8, global_batch_size=128,
                  optimizer_state_dtype="fp8", grad_reduce_in_fp32=False)
    if variant == "rl":
        fields |= {"job": "rl", "samples_per_prompt": 8}
    job, plan = resolve(Request(**fields))
    assert not {"PR001", "PR004"} & {f.id for f in check_config(job, plan, include_memory=False).findings}
    result = render("skyrl", job, plan, variant=variant)
    for key, value in (("optimizer_config_kwargs.use_precision_aware_optimizer", "true"),
                       ("optimizer_config_kwargs.exp_avg_dtype", "fp8"),
                       ("optimizer_config_kwargs.exp_avg_sq_dtype", "fp8"),
                       ("ddp_config.grad_reduce_in_fp32", "false")):
        assert f"{prefix}{key}={value}" in result.text, result.text
    parsed = parse_plan("skyrl", result.variant, result.text, job.model.num_layers)
    assert (parsed["optimizer_state_dtype"], parsed["grad_reduce_in_fp32"]) == ("fp8", False)
    imported = import_config(result.text, "run.sh")
    assert imported.request["optimizer_state_dtype"] == "fp8" and imported.request["grad_reduce_in_fp32"] is False


@pytest.mark.parametrize("variant,prefix", [("rl", "trainer.policy.megatron_config."), ("sft", "megatron_config.")])
def test_skyrl_fp8_is_written_not_left_to_bf16(variant, prefix):
    """SkyRL's render left precision=fp8 out of the command (its MegatronConfig.fp8 / fp8_recipe were never written):
    the plan was timed in fp8 and the run would train in bf16. Now the format and the recipe are written, read back
    and imported; rowwise, which Megatron-Core has no recipe for, is refused (PR003) with the nearest it runs."""
    fields = dict(model="qwen3-30b-a3b", framework="skyrl", num_gpus=16, ep=8, pp=2, global_batch_size=128,
                  precision="fp8", fp8_recipe="blockwise")
    if variant == "rl":
        fields |= {"job": "rl", "samples_per_prompt": 8}
    job, plan = resolve(Request(**fields))
    result = render("skyrl", job, plan, variant=variant)
    assert f"{prefix}fp8=hybrid" in result.text and f"{prefix}fp8_recipe=blockwise" in result.text, result.text
    assert parse_plan("skyrl", result.variant, result.text, job.model.num_layers)["fp8_recipe"] == "blockwise"
    imported = import_config(result.text, "run.sh")
    assert (imported.request["precision"], imported.request["fp8_recipe"]) == ("fp8", "blockwise")
    rowwise = resolve(Request(**{**fields, "fp8_recipe": "rowwise"}))
    assert "fp8_recipe=blockwise" in {f.id: f.fix for f in check_config(*rowwise, include_memory=False).findings}[
        "PR003"]


def test_verl_cpu_optimizer_and_deepep_switches_are_said_not_unknown():
    """verl's run_qwen3moe-30b_megatron_96gb.sh sets the CPU optimizer's switches through override_optimizer_config
    and the flex dispatcher's older DeepEP switch: import said 'no meshplan field' for each, though render writes the
    first two and the third is the flex dispatcher meshplan reads from moe_token_dispatcher_type."""
    opt = "+actor_rollout_ref.actor.optim.override_optimizer_config."
    text = ("python3 -m verl.trainer.main_ppo model_engine=megatron trainer.nnodes=1 trainer.n_gpus_per_node=8 "
            "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B "
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8"
            f" {opt}optimizer_offload_fraction=1.0 {opt}optimizer_cpu_offload=True"
            f" {opt}overlap_cpu_optimizer_d2h_h2d=True"
            " +actor_rollout_ref.actor.megatron.override_transformer_config.moe_token_dispatcher_type=flex"
            " +actor_rollout_ref.actor.megatron.override_transformer_config.moe_enable_deepep=True\n")
    imported = import_config(text, "run.sh")
    assert not any(k in u for u in imported.unsupported for k in ("optimizer_cpu_offload", "d2h_h2d", "deepep")), \
        imported.unsupported
    assert sum(any(k in n for k in ("optimizer_cpu_offload =", "d2h_h2d =", "moe_enable_deepep =")) for n in
               imported.notes) == 3, imported.notes
    assert imported.request["moe_token_dispatcher"] == "flex" and imported.request["optimizer_offload_fraction"] == 1.0
