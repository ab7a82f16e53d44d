"""Megatron-Bridge LoRA target_modules that are wildcards over module paths, read as Bridge matches them.

Megatron-Bridge 0.6.2 (peft/module_matcher.py ModuleMatcher.match) adapts a module when a target_modules entry equals
its name or matches its full path by peft/utils.py wildcard_match: `re.compile("^" + pattern.replace("*", "(.*)") +
"$")`, so '*' is any text and '.' any character. The PEFT walks each model chunk before it is wrapped (training/
setup.py _create_peft_pre_wrap_hook), so paths start at the GPTModel: decoder.layers.<i>.self_attention.linear_qkv,
decoder.layers.<i>.mlp.linear_fc1 (a dense MLP), mlp.shared_experts.linear_fc1, mlp.experts.linear_fc1 (the grouped
routed experts), <i> the layer's index within its pipeline stage. verl's and SkyRL's Megatron engines build the same
LoRA. meshplan adapts a target on every decoder layer the model has it in (arithmetic/lora.py layer_adapters), so a
pattern set is read as the targets it adapts there, and one that adapts a target in some of those places only (one
layer's, the dense MLPs' but not the experts', the decoder's but not the MTP block's: a bare name matches both,
decoder.layers.* only the decoder's) is said and refused an estimate (keys.py read_patterns, lora_keys.py
patterns_on_model, LORA_NOT_MODELLED).
"""

from __future__ import annotations

import re

from meshplan.arithmetic.lora import MAMBA_TARGETS, model_targets
from meshplan.arithmetic.lora import MEGATRON_TARGETS as TARGETS
from meshplan.schema.model import Architecture

ATTENTION = "decoder.layers.{i}.self_attention.{t}"
MLP_PLACES = {"dense MLP": "decoder.layers.{i}.mlp.{t}", "shared experts": "decoder.layers.{i}.mlp.shared_experts.{t}",
              "routed experts": "decoder.layers.{i}.mlp.experts.{t}"}
"""Where a Megatron-Core GPT layer holds each target (megatron-core 0.19.2 TransformerLayer self_attention / mlp;
MoELayer shared_experts and experts, TEGroupedMLP's linear_fc1 / linear_fc2)."""
OTHER_PLACES = {"router": "decoder.layers.{i}.mlp.router", "output layer": "output_layer"}
"""Modules Bridge's LoRA also adapts when an entry matches them (peft/lora.py LoRA.transform: LoRATopKRouter for a
MoE router, a linear adapter for the output layer's ColumnParallelLinear), which meshplan counts no adapter on."""
MTP_LAYER = "mtp.layers.{i}.mtp_model_layer."
"""Where a model's MTP block holds its layer (megatron-core 0.19.2 GPTModel.mtp, a MultiTokenPredictionBlock whose
layers each build mtp_model_layer from the decoder's last layer spec): its targets sit under this path as a decoder
layer's under decoder.layers.<i>., and Bridge's LoRA adapts them when an entry matches (arithmetic/lora.py
mtp_adapters)."""
LAYER_INDICES = (0, 1, 7, 10, 123)
"""Layer indices a pattern is tried at: one that matches a place at all of them names no layer (its '*' takes the
index); one that matches at some only names layers."""
MLP_TARGETS = ("linear_fc1", "linear_fc2")
MIXER = "decoder.layers.{i}.mixer.{t}"
"""Where a hybrid's Mamba-2 layer holds in_proj and out_proj (megatron-core MambaLayer.mixer, a MambaMixer; its
attention and MLP layers are TransformerLayers, their linears where a GPT layer's are)."""


def wildcard_match(pattern: str, path: str) -> bool:
    """Megatron-Bridge 0.6.2 peft/utils.py wildcard_match, as it is ('.' is a regex dot)."""
    return re.compile("^" + pattern.replace("*", "(.*)") + "$").match(path) is not None


def places(target: str) -> dict[str, str]:
    """The places a target's module sits in a decoder layer, each a path template."""
    if target in MAMBA_TARGETS:
        return {"Mamba-2 mixer": MIXER}
    return dict(MLP_PLACES) if target in MLP_TARGETS else {"attention": ATTENTION}


def mtp_places(target: str) -> dict[str, str]:
    """The same places in an MTP block's layer ('MTP attention', 'MTP routed experts', ...)."""
    return {f"MTP {place}": path.replace("decoder.layers.{i}.", MTP_LAYER) for place, path in places(target).items()}


def is_pattern(name: str) -> bool:
    """Whether a target_modules entry is a Bridge path pattern (not a bare Megatron name, not a Hugging Face
    projection): it matches some target's module path, or another module's Bridge adapts (OTHER_PLACES)."""
    paths = [path.format(i=0, t=t) for t in TARGETS for path in places(t).values()]
    return name not in TARGETS and any(wildcard_match(name, path) for path in
                                       paths + [path.format(i=0) for path in OTHER_PLACES.values()])


def pattern_places(patterns: list[str]) -> tuple[dict[str, set[str]], list[str]]:
    """({target: the places the patterns adapt on every layer}, the patterns that adapt a place on some layers
    only)."""
    every: dict[str, set[str]] = {}
    some: list[str] = []
    for pattern in patterns:
        for target in TARGETS:
            for place, path in {**places(target), **mtp_places(target)}.items():
                hits = [wildcard_match(pattern, path.format(i=i, t=target)) for i in LAYER_INDICES]
                if all(hits):
                    every.setdefault(target, set()).add(place)
                elif any(hits) and pattern not in some:
                    some.append(pattern)
    return every, some


def other_places(patterns: list[str]) -> list[str]:
    """The modules outside meshplan's targets the patterns adapt too (OTHER_PLACES)."""
    return [name for name, path in OTHER_PLACES.items()
            if any(wildcard_match(p, path.format(i=i)) for p in patterns for i in LAYER_INDICES)]


def model_places(arch: Architecture, target: str) -> set[str]:
    """The places the model holds a target in (those meshplan counts adapters in on the Bridge engines): attention
    for an attention target the model has (arithmetic/lora.py model_targets: MLA's linears with MLA, linear_qkv
    without); linear_fc1 / linear_fc2 in its dense MLPs, its shared experts and its routed experts, where it has
    each; and the same in its MTP blocks' layers, each the last decoder layer's kind (mtp_places)."""
    if target in MAMBA_TARGETS:  # no MTP block holds a Mamba-2 layer (Nemotron 3 Super's is '*E')
        return {"Mamba-2 mixer"} if target in model_targets(arch) else set()
    if target not in MLP_TARGETS:
        held = {"attention"} if target in model_targets(arch) else set()
        return held | ({"MTP attention"} if held and arch.num_mtp_layers else set())
    moe_layers = [i for i in range(arch.num_layers) if arch.is_moe_layer(i)]
    dense = "-" in arch.layer_pattern if arch.layer_pattern is not None else len(moe_layers) < arch.num_layers
    out = {"dense MLP"} if dense else set()  # a hybrid's MLP layers ('-'), not its Mamba-2 or attention layers
    if moe_layers:
        assert arch.moe is not None
        out.add("routed experts")
        if arch.moe.shared_expert_ffn_hidden_size:
            out.add("shared experts")
    if arch.num_mtp_layers:
        last = arch.num_layers - 1
        block = arch.mtp_layer_pattern or ("E" if arch.is_moe_layer(last) else "-")  # a hybrid's: its own kinds
        mtp = ({"routed experts", "shared experts"} & out if "E" in block else set()) | \
            ({"dense MLP"} if "-" in block else set())
        out |= {f"MTP {place}" for place in mtp}
    return out

