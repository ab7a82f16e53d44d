"""A Gated DeltaNet hybrid's config.json (model_type qwen3_next: Qwen3-Next; Qwen3.5's language model, qwen3_5_moe_text
and qwen3_5_text) read as transformers' Qwen3NextConfig and Qwen3NextForCausalLM (Qwen3_5MoeTextConfig,
Qwen3_5TextConfig) build it, written as the layer pattern Megatron-Core's hybrid model takes (Symbols in
megatron/core/ssm/mamba_hybrid_layer_allocation.py, core_v0.19.0: G a Gated DeltaNet, * attention, - MLP, E MoE),
so the hybrid machinery (knowledge/hybrid_config.py's pattern, estimate/hybrid_time.py) plans it. Kept apart from
model_config.py, which hands it its field reader.

Each Qwen3NextDecoderLayer is two of those layers: its token mixer with its input norm (Qwen3NextGatedDeltaNet on a
"linear_attention" layer, G; Qwen3NextAttention, gated, with q/k norms and partial rotary, on a "full_attention" one,
*) and its MLP with its post-attention norm (Qwen3NextSparseMoeBlock, E, where (i + 1) % decoder_sparse_step == 0
and i is not in mlp_only_layers; else Qwen3NextMLP, -). Megatron-Bridge's Qwen3NextBridge builds the same layers as
a GPTModel's TransformerLayers (experimental_attention_variant gated_delta_net, linear_attention_freq), one per
decoder layer: the parameters, FLOPs and activations are the pattern's, only the pipeline's unit differs (rule
PP017 holds a pipeline split to whole decoder layers). Megatron-LM's pretrain_gpt.py builds the same GPTModel
(--experimental-attention-variant gated_delta_net), which meshplan renders for megatron-core.
"""

from __future__ import annotations

from typing import Any

from meshplan.knowledge.calibration import calibration_card
from meshplan.schema.model import Architecture, GatedDeltaNetSpec, MoESpec

# Each decoder layer (Qwen3NextDecoderLayer; Megatron-Bridge's TransformerLayer) is this many pattern layers: its
# mixer and its MLP or MoE (decoder_pattern)
PATTERN_LAYERS_PER_DECODER_LAYER = 2


def decoder_layers(pattern_layers: int) -> int:
    """The decoder layers `pattern_layers` whole pattern layers make (Megatron-Bridge's count of a split)."""
    return pattern_layers // PATTERN_LAYERS_PER_DECODER_LAYER


def pipeline_unit(arch: Architecture) -> int:
    """The model's layers one layer of Megatron-Core's pipeline split is: a Gated DeltaNet hybrid's decoder layer (the
    GPTModel's TransformerLayer: what a pipeline_model_parallel_layout's t names and what account_for_embedding /
    account_for_loss_in_pipeline_split weigh the embedding and the loss as, get_num_layers_to_build) is two pattern
    layers; any other model's layer is one."""
    return PATTERN_LAYERS_PER_DECODER_LAYER if arch.gdn is not None and arch.layer_pattern is not None else 1


def split_layers(arch: Architecture) -> int:
    """The layers Megatron-Core's pipeline split counts for the model (a layout's t, the accounting's units): a Gated
    DeltaNet hybrid's decoder layers, any other model's layers."""
    return arch.num_layers // pipeline_unit(arch)


def cuts_a_decoder_layer(pattern_layers: int) -> bool:
    """Whether a stage or chunk of `pattern_layers` pattern layers ends inside a decoder layer
    (arithmetic/schedule.decoder_layer_cut: rule PP017's and render's decoder_split's test)."""
    return pattern_layers % PATTERN_LAYERS_PER_DECODER_LAYER != 0


def decoder_flags(pattern: str, position: int, letters: str) -> list[int]:
    """Per decoder layer of a Gated DeltaNet hybrid's pattern (two letters each: mixer, MLP), 1 where the letter at
    `position` is one of `letters`: the per-layer lists Megatron-Core's GPTModel path reads (linear_attention_freq's
    1 a Gated DeltaNet layer, moe_layer_freq's 1 an MoE layer)."""
    return [1 if k in letters else 0 for k in pattern[position::PATTERN_LAYERS_PER_DECODER_LAYER]]


def decoder_pattern_from_flags(linear: list[int], moe: list[int]) -> str:
    """The hybrid pattern of a GPTModel's per-decoder-layer lists (decoder_flags read back): G or * then E or -."""
    return "".join(("G" if la else "*") + ("E" if e else "-") for la, e in zip(linear, moe, strict=True))


# Qwen3NextConfig's layer_types names
_MIXERS = {"linear_attention": "G", "full_attention": "*"}
# The config classes' defaults for the keys a config.json may omit (transformers 5.9.0 configuration_qwen3_next.py,
# qwen3_5_moe/configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig, qwen3_5/configuration_qwen3_5.py Qwen3_5TextConfig).
# Qwen3.5's decoder layers take no decoder_sparse_step or mlp_only_layers: every layer of the MoE model is
# Qwen3_5MoeSparseMoeBlock, every layer of the dense one Qwen3_5MLP(intermediate_size)
_GDN = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "head_dim": 256, "partial_rotary_factor": 0.25,
        "full_attention_interval": 4}
_DEFAULTS = {
    "qwen3_next": {**_GDN, "decoder_sparse_step": 1},
    "qwen3_5_moe_text": {**_GDN, "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
                         "num_attention_heads": 16, "num_key_value_heads": 2, "moe_intermediate_size": 512,
                         "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256},
    "qwen3_5_text": {**_GDN, "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
                     "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4},
}
GDN_MODEL_TYPES = frozenset(_DEFAULTS)
# Qwen3.5's published checkpoints: a vision-language config whose text_config is the language model
MULTIMODAL_WRAPPERS = {"qwen3_5_moe": "qwen3_5_moe_text", "qwen3_5": "qwen3_5_text"}


def mixer_kinds(f: Any) -> list[str]:
    """Each decoder layer's mixer: layer_types as given, else every full_attention_interval-th layer full attention
    (Qwen3NextConfig.__post_init__); G or *."""
    layers = f.int("num_hidden_layers")
    kinds = f.cfg.get("layer_types")
    if kinds is None:
        interval = f.int("full_attention_interval", "num_hidden_layers", lo=1)
        return ["G" if (i + 1) % interval else "*" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= set(_MIXERS):
        raise f.fail(f"layer_types must list {layers} entries, each 'linear_attention' or 'full_attention'.")
    return [_MIXERS[k] for k in kinds]


def decoder_pattern(f: Any) -> str:
    """The hybrid pattern of a Gated DeltaNet config: per decoder layer its mixer's letter then E (sparse MoE block)
    or - (dense MLP), Qwen3NextDecoderLayer's rule (mlp_only_layers, decoder_sparse_step, num_experts > 0); Qwen3.5's
    layers are all one or the other (no step, no mlp_only_layers: their defaults)."""
    layers = f.int("num_hidden_layers")
    step = f.int("decoder_sparse_step", lo=1, hi=layers, why="at most num_hidden_layers", default=1)
    dense = set(f.layer_list("mlp_only_layers", layers) or [])
    experts = f.int("num_experts", default=0) or 0
    return "".join(mixer + ("E" if i not in dense and experts > 0 and (i + 1) % step == 0 else "-")
                   for i, mixer in enumerate(mixer_kinds(f)))


def read_gdn_names(model_type: str, cfg: dict[str, Any]) -> None:
    """The config class's defaults copied under the names the reader asks for."""
    for key, value in _DEFAULTS[model_type].items():
        cfg.setdefault(key, value)


def gdn_spec(f: Any) -> GatedDeltaNetSpec:
    """The Gated DeltaNet mixer; the value heads a multiple of the key heads (q and k are repeated to the value heads,
    Megatron-Core's _prepare_input_for_gated_delta_rule repeat_interleave); its chunk length FLA's kernel's, which no
    config states (cards/calibration.yaml gdn_kernel)."""
    keys = f.int("linear_num_key_heads", "num_attention_heads")
    values = f.int("linear_num_value_heads", "num_attention_heads")
    if values % keys:
        raise f.fail(f"linear_num_value_heads = {values} is not a multiple of linear_num_key_heads = {keys}.",
                     fix="Use value heads that are a multiple of the key heads (Qwen3-Next: 32 and 16).")
    return GatedDeltaNetSpec(num_key_heads=keys, num_value_heads=values,
                             key_head_dim=f.int("linear_key_head_dim", "head_dim"),
                             value_head_dim=f.int("linear_value_head_dim", "head_dim"),
                             conv_kernel=f.int("linear_conv_kernel_dim", lo=1, hi=64,
                                               why="a causal conv1d a few tokens wide"),
                             chunk_size=calibration_card().gdn_kernel.chunk_size)


def gdn_moe(f: Any, pattern: str) -> MoESpec | None:
    """Qwen3NextSparseMoeBlock on the E layers: num_experts SwiGLU experts of moe_intermediate_size, top
    num_experts_per_tok, one shared expert of shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate),
    a Linear(hidden, 1) (Qwen2-MoE's block)."""
    layers = [i for i, kind in enumerate(pattern) if kind == "E"]
    if not layers:
        return None
    experts = f.int("num_experts")
    top_k = f.int("num_experts_per_tok", lo=1, hi=experts,
                  why=f"a token cannot use more than the num_experts = {experts} experts there are")
    shared = f.int("shared_expert_intermediate_size", "intermediate_size", default=0) or 0
    return MoESpec(num_experts=experts, top_k=top_k,
                   expert_ffn_hidden_size=f.int("moe_intermediate_size", "intermediate_size"),
                   num_shared_experts=1 if shared else 0, shared_expert_ffn_hidden_size=shared,
                   shared_expert_gate=bool(shared), moe_layers=layers)


def gdn_architecture(arch: Architecture, f: Any) -> Architecture:
    """The architecture model_config read with the hybrid's own parts: the pattern (two layers per decoder layer),
    the Gated DeltaNet mixer, the MoE, one norm per pattern layer, gated attention with q/k norms per head (its
    partial rotary embedding as read)."""
    pattern = decoder_pattern(f)
    return arch.model_copy(update={
        "num_layers": len(pattern), "layer_pattern": pattern, "gdn": gdn_spec(f) if "G" in pattern else None,
        "moe": gdn_moe(f, pattern), "norms_per_layer": 1, "qk_norm": "head", "attention_output_gate": True,
        # its MTP block, where a request trains one (config.json states no depth; Megatron-Bridge's qwen3_next recipes
        # set mtp_num_layers 1): one full-attention decoder layer with the last layer's MLP (the checkpoint's
        # mtp.layers.0, a Qwen3NextDecoderLayer of layer_type full_attention in vLLM's Qwen3NextMTP)
        "mtp_layer_pattern": "*" + pattern[-1]})
