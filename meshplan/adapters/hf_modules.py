"""The nn.Linear modules transformers builds for a model, by full module name, each with the LoRA target it is part of:
what Hugging Face PEFT's target_modules and exclude_modules are matched against (peft 0.18.1 tuners/tuners_utils.py
check_target_module_exists), so a file's all-linear less some modules, or a regular expression it excludes, is read
as the targets it leaves in every place the model holds them (adapters/read/lora_keys.py exclusions_applied).

The names are transformers 5.9.0's (models/llama, qwen2, qwen3, mistral, gemma2, qwen2_moe, qwen3_moe, mixtral,
olmoe, gpt_oss, deepseek_v2, deepseek_v3, glm4_moe, llama4), checked against the modules it builds on the meta device
by tests/test_lora_exclusions.py: a decoder layer is model.layers.<i> with self_attn and mlp (Llama 4: feed_forward),
its shared experts mlp.shared_experts (the DeepSeek family) or shared_expert (Qwen2-MoE, Llama 4); the routed experts
are two 3D parameters, no nn.Linear. Llama4ForConditionalGeneration, which verl's and SkyRL's FSDP engines build for a
config with a vision_config, holds the text model under language_model. and the tower under vision_model."""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshplan.arithmetic.lora import mla_linears
from meshplan.schema.model import Architecture

LLAMA4 = ("llama4", "llama4_text")
"""The model types whose layer names its MLP feed_forward and whose router is Llama4Router (an nn.Linear whose forward
returns a tuple, MoESpec.router_returns_tuple)."""
SHARED_EXPERT = ("qwen2_moe", *LLAMA4)
"""The model types whose shared experts are one module named shared_expert (Qwen2MoeSparseMoeBlock, Llama4TextMoe);
the DeepSeek family's is shared_experts."""
VISION_TOWER = "vision tower"
"""The place of every linear under vision_model. and the projector (HfLinear.place), which an exclusion may leave out
whole (LoraSpec.vision)."""
VISION_NO_TARGET = ("mlp.fc1", "mlp.fc2")
"""A vision encoder layer's linears beside its attention (Llama4VisionMLP), which no LoRA target name matches."""


@dataclass(frozen=True)
class HfLinear:
    """One nn.Linear of the built model: its full module name, the LoRA target it is (part of), None for a linear no
    target names (the vision tower's MLP, patch embedding, pixel-shuffle MLP and projector, Llama 4's router), and
    the place it sits in, as a message names it."""

    path: str
    target: str | None
    place: str


def hf_linears(arch: Architecture, vision_built: bool) -> list[HfLinear]:
    """Every nn.Linear of the model as transformers builds it (the output head left out, as PEFT's all-linear leaves
    it), in the order the model holds them: the tower first where the engine builds it (vision_built)."""
    text = "language_model.model.layers" if vision_built and arch.vision is not None else "model.layers"
    mlp = "feed_forward" if arch.model_type in LLAMA4 else "mlp"
    shared = "shared_expert" if arch.model_type in SHARED_EXPERT else "shared_experts"
    out = _vision(arch) if vision_built and arch.vision is not None else []
    for i in range(arch.num_layers):
        attn = f"{text}.{i}.self_attn"
        if arch.mla is None:
            out += [HfLinear(f"{attn}.{p}", "linear_qkv", "attention") for p in ("q_proj", "k_proj", "v_proj")]
        else:
            out += [HfLinear(f"{attn}.{name}", a.target, "attention")
                    for a, name in zip(mla_linears(arch), _mla_names(arch), strict=True)]
        out.append(HfLinear(f"{attn}.o_proj", "linear_proj", "attention"))
        if arch.is_moe_layer(i):
            assert arch.moe is not None
            if arch.moe.router_linear or arch.moe.router_returns_tuple:
                name = "router" if arch.model_type in LLAMA4 else "gate"
                out.append(HfLinear(f"{text}.{i}.{mlp}.{name}", "router" if arch.moe.router_linear else None,
                                    "router"))
            if arch.moe.shared_expert_ffn_hidden_size:
                out += _mlp(f"{text}.{i}.{mlp}.{shared}", "shared experts")
            if arch.moe.shared_expert_gate:
                out.append(HfLinear(f"{text}.{i}.{mlp}.shared_expert_gate", "shared_expert_gate",
                                    "shared expert gate"))
        else:
            out += _mlp(f"{text}.{i}.{mlp}", "dense MLP")
    return out


def _mla_names(arch: Architecture) -> list[str]:
    """MLA's module names in mla_linears' order (transformers' DeepseekV2/V3 attention)."""
    assert arch.mla is not None
    q = ["q_a_proj", "q_b_proj"] if arch.mla.q_lora_rank else ["q_proj"]
    return [*q, "kv_a_proj_with_mqa", "kv_b_proj"]


def _mlp(prefix: str, place: str) -> list[HfLinear]:
    return [HfLinear(f"{prefix}.gate_proj", "linear_fc1", place), HfLinear(f"{prefix}.up_proj", "linear_fc1", place),
            HfLinear(f"{prefix}.down_proj", "linear_fc2", place)]


def _vision(arch: Architecture) -> list[HfLinear]:
    """Llama4VisionModel's linears: the patch embedding's, each encoder layer's attention (q/k/v_proj, o_proj: what
    linear_qkv and linear_proj name, arithmetic/lora.py vision_adapters) and MLP, the pixel-shuffle MLP
    (vision_adapter.mlp), and the projector's linear_1."""
    assert arch.vision is not None
    out = [HfLinear("vision_model.patch_embedding.linear", None, VISION_TOWER)]
    for i in range(arch.vision.num_layers):
        layer = f"vision_model.model.layers.{i}"
        out += [HfLinear(f"{layer}.self_attn.{p}", "linear_qkv", VISION_TOWER)
                for p in ("q_proj", "k_proj", "v_proj")]
        out.append(HfLinear(f"{layer}.self_attn.o_proj", "linear_proj", VISION_TOWER))
        out += [HfLinear(f"{layer}.{name}", None, VISION_TOWER) for name in VISION_NO_TARGET]
    return [*out, HfLinear("vision_model.vision_adapter.mlp.fc1", None, VISION_TOWER),
            HfLinear("vision_model.vision_adapter.mlp.fc2", None, VISION_TOWER),
            HfLinear("multi_modal_projector.linear_1", None, VISION_TOWER)]


def peft_matches(names: str | list[str], path: str) -> bool:
    """Whether a target_modules or exclude_modules value matches a module's full name as PEFT matches it: a string is
    a regular expression full-matched on the name; a list entry is the name itself or its last dotted parts."""
    if isinstance(names, str):
        return re.fullmatch(names, path) is not None
    return path in names or any(path.endswith(f".{name}") for name in names)
