"""LoRA on a model's multi-token-prediction blocks (arithmetic/lora.py mtp_adapters): Megatron-Bridge's LoRA matches a
bare target name against every module of the GPTModel, so the MTP block's layer (built from the decoder's last layer
spec) is adapted as a decoder layer is; PEFT on transformers' code builds no MTP block."""

from __future__ import annotations

import pytest

from meshplan.api import import_config
from meshplan.arithmetic.lora import lora_engine, total_adapter_params
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

R = 8
H, HEADS, V_HEAD, FFN, EXPERT_FFN = 7168, 128, 128, 18432, 2048  # DeepSeek-V3's config.json (cards/models)


def _pair(inputs: int, outputs: int) -> int:
    return R * (inputs + outputs)


# Megatron-Bridge's default four on MLA: linear_proj (heads x v_head_dim -> h), linear_fc1 (h -> 2 x ffn, one A) and
# linear_fc2 in the dense MLP, or in the shared expert and (one shared adapter per layer) the routed experts
PROJ = _pair(HEADS * V_HEAD, H)
DENSE = PROJ + _pair(H, 2 * FFN) + _pair(FFN, H)
MOE = PROJ + 2 * (_pair(H, 2 * EXPERT_FFN) + _pair(EXPERT_FFN, H))


def _job(framework: str, **fields):
    return resolve(Request(model="deepseek-v3", framework=framework, job="lora", lora_rank=R, global_batch_size=256,
                           **fields))


def test_bridge_adapts_deepseek_v3s_mtp_layer_as_its_last_decoder_layer():
    """DeepSeek-V3: 3 dense layers, 58 MoE layers and one MTP block whose layer is a MoE layer (megatron-core
    get_gpt_mtp_block_spec_for_backend: the decoder's layer_specs[-1]). On Megatron-Bridge's engine its adapters
    are counted beside the decoder's, on the pipeline rank that holds the MTP block; on verl's FSDP engine (PEFT on
    transformers' DeepseekV3, which builds no MTP block) none are (fails before: 3 x DENSE + 58 x MOE on Bridge,
    and the last stage's lora_adapter_params without the MTP layer's)."""
    job, plan = _job("megatron-bridge", num_gpus=256, pp=4, ep=8, first_stage_layers=15, last_stage_layers=14)
    engine = lora_engine(job.card, plan.zero_stage)
    assert total_adapter_params(job.model, job.lora, engine) == 3 * DENSE + (58 + 1) * MOE
    report = estimate_memory(job, plan)
    held = {s.stage: s.detail["lora_adapter_params"] for s in report.stages}
    assert held[0] == 3 * DENSE + 12 * MOE and held[1] == held[2] == 16 * MOE
    assert held[3] == 14 * MOE + MOE  # the last stage: its decoder layers and the MTP block's
    peft_job, peft_plan = _job("verl", num_gpus=64, zero_stage=3)
    peft_engine = lora_engine(framework_card("verl"), peft_plan.zero_stage)
    assert not peft_engine.adapts_mtp
    assert total_adapter_params(peft_job.model, peft_job.lora, peft_engine) == total_adapter_params(
        peft_job.model.model_copy(update={"num_mtp_layers": 0}), peft_job.lora, peft_engine)


@pytest.mark.parametrize(("pattern", "kept"), [("*.linear_proj", True), ("decoder.layers.*.linear_proj", False)])
def test_a_bridge_pattern_that_skips_the_mtp_block_is_said(pattern, kept):
    """'*.linear_proj' matches mtp.layers.0.mtp_model_layer.self_attention.linear_proj as Bridge's wildcard_match
    does; 'decoder.layers.*.linear_proj' does not, so on DeepSeek-V3 it adapts the decoder's linear_proj only, which
    meshplan (counting the MTP block's too) says and refuses an estimate from (fails before: read as linear_proj)."""
    text = ("from megatron.bridge.peft.lora import LoRA\n"
            "def deepseek_v3_peft_8gpu_h100_bf16_config() -> ConfigContainer:\n    cfg = _peft_common()\n"
            f"    cfg.peft = LoRA(dim=8, target_modules={[pattern]!r})\n    return cfg\n")
    back = import_config(text, path="r.py", framework="megatron-bridge")
    said = [u for u in back.unsupported if "MTP attention" in u]
    assert (not said) == kept, back.unsupported
    assert back.request["lora_targets"] == ["linear_proj"]


def test_the_mtp_layer_is_built_from_the_last_layer_spec_in_the_pinned_wheels():
    """The facts mtp_adapters reads, in megatron-core 0.19.2 and Megatron-Bridge 0.6.2 as pinned."""
    from framework_packages import wheel_tree

    core = wheel_tree("megatron-core") / "megatron" / "core"
    specs = (core / "models" / "gpt" / "gpt_layer_specs.py").read_text(encoding="utf-8")
    assert "transformer_layer_spec = spec.layer_specs[-1]" in specs
    assert "mtp_model_layer_spec=transformer_layer_spec" in specs
    mtp = (core / "transformer" / "multi_token_prediction.py").read_text(encoding="utf-8")
    assert "self.mtp_model_layer = build_module(" in mtp and "self.eh_proj = build_module(" in mtp
    assert "self.mtp = MultiTokenPredictionBlock(" in (core / "models" / "gpt" / "gpt_model.py").read_text()
    matcher = wheel_tree("megatron-bridge") / "megatron" / "bridge" / "peft" / "module_matcher.py"
    assert "if name == pattern or wildcard_match(pattern, full_name):" in matcher.read_text(encoding="utf-8")
