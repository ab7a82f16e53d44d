"""LoRA on the routed experts' 3D weights through Hugging Face PEFT's target_parameters (verl's FSDP engine,
model.target_parameters): planned as PEFT's ParamWrapper runs it (arithmetic/param_wrapper.py, whose counts
tests/test_lora_targets.py holds to PEFT and FlopCounterMode), refused on every other engine (LORA004) and on a model
without routed experts (LORA005). Each test fails before lora_target_parameters existed (the request refused it)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.param_wrapper import param_wrapper_flops, param_wrapper_params
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model
from meshplan.schema.request import Request

BOTH = ["gate_up_proj", "down_proj"]
BASE = dict(model="qwen3-30b-a3b", framework="verl", gpu="h200", num_gpus=8, seq_length=2048, global_batch_size=64,
            micro_batch_size=1, zero_stage=3, job="lora", lora_rank=16, recompute="none")


def _pair(**extra):
    """The same LoRA job without and with ParamWrappers on `extra`'s weights."""
    return Request(**{**BASE, **extra}), Request(**{**BASE, **extra, "lora_target_parameters": BOTH})


def test_adapters_are_one_rank_r_adapter_per_expert_on_each_wrapped_weight():
    """r x E x (in + out) per wrapped weight of every MoE layer (lora_A in x rE, lora_B rE x out), counted with the
    adapters' every state: Qwen3-30B-A3B, 48 MoE layers of 128 experts, h 2048, expert ffn 768, gated."""
    plain, wrapped = (api.estimate_memory(r).stages[0] for r in _pair())
    added = wrapped.detail["lora_adapter_params"] - plain.detail["lora_adapter_params"]
    assert added == 48 * 128 * 16 * ((2048 + 2 * 768) + (768 + 2048))
    assert added == param_wrapper_params(resolve_model("qwen3-30b-a3b"), 16)
    assert wrapped.gradients_bytes > plain.gradients_bytes and wrapped.optimizer_bytes > plain.optimizer_bytes


def test_each_forward_keeps_w_plus_delta_of_every_expert_until_the_backward():
    """Without recompute every MoE layer holds its experts' W + delta (bf16, the weights' size) for the backward, and
    the wrapped GEMMs keep their inputs, which frozen experts do not (activations.frozen_linear_bytes): the dispatched
    copies (2048 tokens x top-8) h wide and the fc2 input expert-ffn wide, bf16."""
    plain, wrapped = (api.estimate_memory(r).stages[0] for r in _pair())
    assert wrapped.activations_bytes - plain.activations_bytes == 48 * 2 * 128 * (2 * 768 * 2048 + 768 * 2048) \
        + 48 * 2 * 2048 * 8 * (2048 + 768)


def test_model_flops_add_the_expert_weight_gradients_and_the_delta_einsum_per_micro_batch():
    """Per token the wrapped experts' weight gradients, per micro-batch the delta's einsum and its two gradients."""
    plain, wrapped = (api.estimate_throughput(r) for r in _pair(micro_batch_size=2))
    per_token, per_batch = param_wrapper_flops(resolve_model("qwen3-30b-a3b"), 16)
    assert wrapped.model_flops_per_step - plain.model_flops_per_step == pytest.approx(
        per_token * 2048 * 64 + per_batch * 64 / 2, rel=1e-12)
    assert wrapped.step_time_s > plain.step_time_s


def test_one_weight_wraps_only_that_weight():
    one = Request(**{**BASE, "lora_target_parameters": ["down_proj"]})
    plain = api.estimate_memory(Request(**BASE)).stages[0]
    got = api.estimate_memory(one).stages[0]
    assert got.detail["lora_adapter_params"] - plain.detail["lora_adapter_params"] == 48 * 128 * 16 * (768 + 2048)


@pytest.mark.parametrize("extra, engine", [({"zero_stage": 1}, "verl's megatron engine"),
                                            ({"framework": "megatron-bridge", "zero_stage": 1}, "megatron engine"),
                                            ({"framework": "skyrl", "recompute": "full"}, "SkyRL's fsdp engine")])
def test_an_engine_without_peft_target_parameters_is_refused_with_lora004(extra, engine):
    req = Request(**{**BASE, **extra, "lora_target_parameters": ["down_proj"]})
    with pytest.raises(MeshplanError, match=f"LORA004: lora_target_parameters down_proj on .*{engine}") as exc:
        api.estimate_memory(req)
    assert "verl (fsdp engine)" in exc.value.fix
    assert "LORA004" in [f.id for f in api.check_config(req).findings]


def test_a_model_without_routed_experts_is_refused_with_lora005():
    req = Request(**{**BASE, "model": "llama-3.1-8b", "lora_target_parameters": BOTH})
    with pytest.raises(MeshplanError, match=r"LORA005: .*Llama-3\.1-8B: the model has no MoE layer"):
        api.estimate_memory(req)


def test_the_field_is_a_lora_field():
    """Given alone it makes the job LoRA; beside job=sft it is refused; a weight the experts lack is refused."""
    req = Request(**{k: v for k, v in BASE.items() if k not in ("job", "lora_rank")}, lora_target_parameters=BOTH)
    assert api.estimate_memory(req).stages[0].detail["lora_adapter_params"] > 0
    with pytest.raises(MeshplanError, match="not for job=sft"):
        api.estimate_memory(Request(**{**BASE, "job": "sft", "lora_rank": None, "lora_target_parameters": BOTH}))
    with pytest.raises(Exception, match="gate_proj"):
        Request(**{**BASE, "lora_target_parameters": ["gate_proj"]})


@pytest.mark.parametrize("variant", ["fsdp", "sft-fsdp"])
def test_render_writes_target_parameters_and_import_reads_them_back(variant):
    """verl's FSDP engine: model.target_parameters named by the weights (PEFT matches them as the last part of
    mlp.experts.<name>), read back as the same lora_target_parameters (fails before: render wrote none, import
    refused the key)."""
    req = Request(**{**BASE, "recompute": "full", "lora_target_parameters": ["down_proj"]})
    rendered = api.render_config("verl", req, variant=variant)
    assert "model.target_parameters=[down_proj]" in rendered.text
    back = api.request_from_config(api.import_config(rendered.text, path="run.sh", framework="verl"), {"gpu": "h200"})
    assert back.lora_target_parameters == ["down_proj"] and back.lora_rank == 16
