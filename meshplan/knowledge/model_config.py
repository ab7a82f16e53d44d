"""A Hugging Face config.json (a file or a catalog card's copy of it) read into the `Architecture` meshplan computes
with, every field checked against its bound in cards/model_shapes.yaml before any computation sees it.

A catalog card stores the fields of the model's own config.json, so a catalog entry and the same model's
config.json go through one parser (`architecture_from_config`) and can never disagree.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import Field

from meshplan.core import server_files
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import _Card, load_card
from meshplan.knowledge.families_card import unknown_activation
from meshplan.knowledge.gdn_config import GDN_MODEL_TYPES, MULTIMODAL_WRAPPERS, gdn_architecture, read_gdn_names
from meshplan.knowledge.hybrid_config import hybrid_architecture, read_hybrid_names
from meshplan.knowledge.vision_config import llama4_vision_tower
from meshplan.schema.model import Architecture, DSASpec, MLASpec, MoESpec, RopeSpec

_MISSING = object()

# model_type -> family of parser. Every other key of a config is read by its HF name.
SUPPORTED_MODEL_TYPES = {
    "llama": "dense",
    "mistral": "dense",
    "qwen2": "dense",
    "qwen3": "dense",
    "phi3": "dense",
    "glm4": "dense",
    "gemma2": "dense",
    "gemma3_text": "dense",
    "nemotron": "dense",
    "gpt2": "gpt2",
    "bloom": "classic",
    "gptj": "classic",
    "gpt_neox": "classic",
    "mixtral": "moe",
    "qwen3_moe": "moe",
    "qwen2_moe": "moe",
    "olmoe": "moe",
    "gpt_oss": "moe",
    "minimax_m2": "moe",
    "llama4": "moe",
    "llama4_text": "moe",
    "glm4_moe": "moe",
    "deepseek_v2": "mla",
    "deepseek_v3": "mla",
    "deepseek_v32": "mla",  # DeepSeek-V3's layers with DSA's indexer beside MLA (_dsa_spec)
    "kimi_k2": "mla",
    "nemotron_h": "hybrid",  # knowledge/hybrid_config.py
    "qwen3_next": "hybrid",  # knowledge/gdn_config.py: Gated DeltaNet and gated attention, each beside an MoE
    "qwen3_5_moe_text": "hybrid",  # Qwen3.5's language models, the same layers (knowledge/gdn_config.py)
    "qwen3_5_text": "hybrid",
}

# Families whose layers meshplan has no mechanism for: refused naming the layer kind, never timed as attention
_UNMODELLED_LAYERS = {
    "jamba": "Mamba state-space layers",
    "falcon_h1": "Mamba-2 state-space mixers beside attention",
    "kimi_linear": "Kimi Delta Attention linear-attention layers", "minimax": "lightning (linear) attention layers"}

# Defaults of each transformers config class for the keys their config.json may omit.
_TIED_DEFAULT = {"gemma2": True, "gemma3_text": True, "gpt2": True, "bloom": True}
# Gemma3TextConfig.__init__ (transformers models/gemma3/configuration_gemma3.py): Gemma 3's multimodal config.json
# gives its text_config only the keys that differ (no vocab_size, hidden_activation, eps, rope_theta, window pattern)
_KEY_DEFAULTS = {"gemma3_text": {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "sliding_window": 4096,
    "sliding_window_pattern": 6},
    # Glm4Config (models/glm4/configuration_glm4.py): partial_rotary_factor 0.5 set in __post_init__, eps 1.5625e-7
    "glm4": {"partial_rotary_factor": 0.5, "rms_norm_eps": 1.5625e-07}}
# GPT-J: one ln_1 feeds attention and MLP alike; GLM-4: post_self_attn_layernorm and post_mlp_layernorm besides
_NORMS_PER_LAYER = {"gemma2": 4, "gemma3_text": 4, "glm4": 4, "gptj": 1}
_LAYERNORM_TYPES = {"gpt2", "nemotron", "bloom", "gptj", "gpt_neox"}
# The GPT-2-era families that name their shapes their own way (transformers' BloomConfig, GPTJConfig attribute maps)
_CLASSIC_NAMES = {"bloom": {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads"},
                  "gptj": {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
                           "n_inner": "intermediate_size", "n_positions": "max_position_embeddings"}}


# --------------------------------------------------------------------------- shape bounds


class ShapeBound(_Card):
    min: int
    max: int
    why: str


class GenericShape(_Card):
    """The Llama-3 shape of a model known only by its size; each number carries its `_why` in the card."""

    head_dim: int = Field(ge=1)
    head_dim_why: str
    heads_multiple: int = Field(ge=1)
    heads_multiple_why: str
    kv_heads: int = Field(ge=1)
    kv_heads_why: str
    ffn_ratio: float = Field(gt=0)
    ffn_ratio_why: str
    ffn_multiple: int = Field(ge=1)
    ffn_multiple_why: str
    hidden_per_layer: float = Field(gt=0)
    hidden_per_layer_why: str
    vocab_size: int = Field(ge=1)
    vocab_size_why: str
    max_position_embeddings: int = Field(ge=1)
    max_position_embeddings_why: str
    size_tolerance: float = Field(gt=0, lt=1)
    size_tolerance_why: str
    min_layers: int = Field(ge=1)
    min_layers_why: str


class ModelShapesCard(_Card):
    description: str
    bounds: dict[str, ShapeBound]
    generic: GenericShape


def shapes_card() -> ModelShapesCard:
    return load_card("model_shapes", ModelShapesCard)


def _show(value: Any) -> str:
    """A field's value as config.json writes it, short enough to echo in an error."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {int(value.bit_length() * math.log10(2)) + 1}-digit integer"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Reads one config's fields, each checked against its bound (cards/model_shapes.yaml), so a bad value
    is refused with the field, the value and the allowed range before any computation sees it."""

    def __init__(self, cfg: dict[str, Any], where: str):
        self.cfg = cfg
        self.where = where
        self.bounds = shapes_card().bounds

    def fail(self, message: str, fix: str | None = None) -> MeshplanError:
        return MeshplanError(f"{self.where}: {message}",
                             fix=fix or "Pass the model's real Hugging Face config.json, or a catalog model.")

    def int(self, key: str, bound: str | None = None, *, default: Any = _MISSING, lo: int | None = None,
            hi: int | None = None, why: str | None = None) -> Any:
        """The integer at `key`, within the card's bound `bound` (default: the key) narrowed by lo/hi."""
        value = self.cfg.get(key)
        if value is None:
            if default is _MISSING:
                raise self.fail(f"required field {key!r} is missing.")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "a boolean" if isinstance(value, bool) else type(value).__name__
            raise self.fail(f"{key} must be an integer, got {_show(value)} ({kind}).")
        spec = self.bounds.get(bound or key)
        low = max(lo if lo is not None else -math.inf, spec.min if spec else -math.inf)
        high = min(hi if hi is not None else math.inf, spec.max if spec else math.inf)
        if not low <= value <= high:
            reason = why or (spec.why if spec else None)
            raise self.fail(f"{key} = {_show(value)} is out of range: allowed {low:,} to {high:,}."
                            + (f" {reason[0].upper()}{reason[1:]}." if reason else ""))
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(f"{key} must be true or false, got {_show(value)}.")
        return value

    def text(self, key: str) -> str | None:
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, str):
            raise self.fail(f"{key} must be a string, got {_show(value)}.")
        return value

    def layer_list(self, key: str, num_layers: int) -> list[int] | None:
        """A list of distinct layer indices, each in 0..num_layers-1 (None when absent)."""
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.fail(f"{key} must be a list of layer indices, got {_show(value)}.")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < num_layers:
                raise self.fail(f"{key} holds {_show(item)}: allowed layer indices 0 to {num_layers - 1:,} "
                                f"(num_hidden_layers = {num_layers:,}).")
        return sorted(set(value))


def _require(cfg: dict[str, Any], keys: list[str], model_type: str) -> None:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise MeshplanError(
            f"config.json of model_type {model_type!r} is missing required field(s): {', '.join(missing)}.",
            fix="Pass the model's complete Hugging Face config.json.",
        )


def _experts(f: _Fields, experts_key: str, width_key: str) -> tuple[int, int, int]:
    """Routed experts, top-k (at most the experts, so active never exceeds total) and the expert width."""
    experts = f.int(experts_key, "num_experts")
    top_k = f.int("num_experts_per_tok", lo=1, hi=experts,
                  why=f"a token cannot use more than the {experts_key} = {experts} experts there are")
    return experts, top_k, f.int(width_key, "intermediate_size")


def _groups(f: _Fields, experts: int, top_k: int, method: str | None) -> dict[str, int]:
    """n_group / topk_group (DeepSeek-V2/V3 group-limited routing: a token's top_k experts come from at most
    topk_group of n_group equal, contiguous groups), checked as Megatron-Core's TransformerConfig does; transformers'
    DeepSeek-V2 'greedy' method ignores them."""
    groups = f.int("n_group", default=1, lo=1, hi=experts, why="at most the routed experts")
    chosen = f.int("topk_group", default=1, lo=1, hi=groups, why=f"at most n_group = {groups}")
    if method == "greedy" or groups == 1:
        return {}
    if experts % groups:
        raise f.fail(f"n_group = {groups} does not divide the {experts} routed experts into equal groups.",
                     fix=f"Use an n_group that divides {experts}.")
    if top_k > chosen * (experts // groups):
        raise f.fail(f"num_experts_per_tok = {top_k} exceeds the {chosen * (experts // groups)} experts in "
                     f"topk_group = {chosen} groups of {experts // groups}.",
                     fix="Raise topk_group or lower num_experts_per_tok.")
    return {"num_groups": groups, "group_topk": chosen}


def _real(f: _Fields, key: str, value: Any, lo: float, hi: float, *, above: bool = True) -> float:
    """A finite number in (lo, hi] (or [lo, hi] when not `above`), else an error naming the key and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise f.fail(f"{key} must be a number, got {_show(value)}.")
    if not (lo < value if above else lo <= value) or value > hi:  # exact for ints of any size
        raise f.fail(f"{key} = {_show(value)} is out of range: allowed {'above' if above else 'from'} {lo:g} "
                     f"to {hi:g}.")
    return float(value)


def _rope_spec(cfg: dict[str, Any], model_type: str, f: _Fields) -> RopeSpec | None:
    """rope_theta, rope_scaling and partial_rotary_factor as config.json (or transformers 5's rope_parameters)
    states them; None for learned absolute positions. Only the adapters read it: it changes no count."""
    if model_type in ("gpt2", "bloom"):  # learned positions, ALiBi: no rotary embedding
        return None
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise f.fail(f"rope_parameters must be an object, got {_show(params)}.")
    params = params or {}
    scaling = cfg.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise f.fail(f"rope_scaling must be an object or null, got {_show(scaling)}.")
    scaling = {**params, **(scaling or {})}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is not None and not isinstance(kind, str):
        raise f.fail(f"rope_scaling.rope_type must be a string, got {_show(kind)}.")
    kind = None if kind in (None, "default") else kind
    if model_type == "phi3" and kind in ("su", "yarn"):  # Phi3Config.convert_rope_params_to_dict: both mean longrope
        kind = "longrope"
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    fraction = cfg.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    if fraction is None and model_type == "minimax_m2" and cfg.get("rotary_dim") is not None:
        # MiniMax-M2's config.json states rotary_dim (64 of head_dim 128); transformers' MiniMaxM2RotaryEmbedding
        # rotates head_dim * partial_rotary_factor dims, the same share
        fraction = f.int("rotary_dim", "head_dim") / f.int("head_dim", default=128)

    def real(name: str, hi: float = 1e6, above: bool = True) -> float | None:
        value = scaling.get(name)
        return None if value is None or kind is None else _real(f, f"rope_scaling.{name}", value, 0, hi, above=above)

    original = scaling.get("original_max_position_embeddings")
    truncate = scaling.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise f.fail(f"rope_scaling.truncate must be true or false, got {_show(truncate)}.")
    return RopeSpec(
        theta=None if theta is None else _real(f, "rope_theta", theta, 0, 1e12),
        fraction=1.0 if fraction is None else _real(f, "partial_rotary_factor", fraction, 0, 1),
        scaling=kind,
        factor=real("factor"),
        original_max_position_embeddings=None if original is None or kind is None else int(
            _real(f, "rope_scaling.original_max_position_embeddings", original, 1, 1 << 40, above=False)),
        low_freq_factor=real("low_freq_factor"),
        high_freq_factor=real("high_freq_factor"),
        beta_fast=real("beta_fast"),
        beta_slow=real("beta_slow"),
        mscale=real("mscale", 1e3, above=False),
        mscale_all_dim=real("mscale_all_dim", 1e3, above=False),
        truncate=truncate if kind is not None else None,
    )


def _norm_eps(cfg: dict[str, Any], f: _Fields) -> float | None:
    """The norm epsilon under whichever name the model family uses; None when the config omits it."""
    for key in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "layernorm_epsilon"):
        if cfg.get(key) is not None:
            return _real(f, key, cfg[key], 0, 0.1)
    return None


# transformers 5.9.0 models/gpt_oss/configuration_gpt_oss.py GptOssConfig swiglu_limit=7.0 (GptOssExperts.limit; its
# alpha 1.702 is the modeling code's own)
GPT_OSS_SWIGLU_LIMIT = 7.0


def _swiglu_limit(cfg: dict[str, Any], model_type: str, f: _Fields) -> float | None:
    """gpt-oss's GLU clamp (its config's swiglu_limit, GptOssConfig's default where the file omits it); None for
    every other family, whose activation is hidden_act's."""
    if model_type != "gpt_oss":
        return None
    value = cfg.get("swiglu_limit")
    return GPT_OSS_SWIGLU_LIMIT if value is None else _real(f, "swiglu_limit", value, 0, 1e4)


def _moe_spec(cfg: dict[str, Any], model_type: str, num_layers: int, f: _Fields) -> MoESpec | None:
    """Routed/shared experts and which layers are MoE, by each architecture's own rule."""
    if model_type in ("mixtral", "olmoe", "gpt_oss", "minimax_m2"):
        experts_key = "num_local_experts" if model_type != "olmoe" else "num_experts"
        _require(cfg, [experts_key, "num_experts_per_tok", "intermediate_size"], model_type)
        experts, top_k, width = _experts(f, experts_key, "intermediate_size")
        return MoESpec(
            num_experts=experts,
            top_k=top_k,
            expert_ffn_hidden_size=width,
            moe_layers=list(range(num_layers)),
            router_bias=model_type == "gpt_oss",
            expert_bias=model_type == "gpt_oss",
            # MiniMaxM2SparseMoeBlock: e_score_correction_bias buffer added to the sigmoid scores (always built)
            score_correction_bias=model_type == "minimax_m2",
        )
    if model_type in ("qwen3_moe", "qwen2_moe"):
        _require(cfg, ["num_experts", "num_experts_per_tok", "moe_intermediate_size"]
                 + (["shared_expert_intermediate_size"] if model_type == "qwen2_moe" else []), model_type)
        step = f.int("decoder_sparse_step", default=1, lo=1, hi=num_layers, why="at most num_hidden_layers")
        dense_only = set(f.layer_list("mlp_only_layers", num_layers) or [])
        layers = [i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0]
        experts, top_k, width = _experts(f, "num_experts", "moe_intermediate_size")
        if model_type == "qwen3_moe":
            return MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width, moe_layers=layers)
        # Qwen2MoeSparseMoeBlock (transformers models/qwen2_moe/modular_qwen2_moe.py): one shared expert
        # Qwen2MoeMLP(shared_expert_intermediate_size) whose output is scaled by sigmoid(shared_expert_gate(x)),
        # a Linear(hidden_size, 1, bias=False), beside the routed experts
        shared = f.int("shared_expert_intermediate_size", "intermediate_size")
        return MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width, num_shared_experts=1,
                       shared_expert_ffn_hidden_size=shared, shared_expert_gate=True, moe_layers=layers)
    if model_type in ("llama4", "llama4_text"):
        _require(cfg, ["num_local_experts", "num_experts_per_tok", "intermediate_size"], model_type)
        step = f.int("interleave_moe_layer_step", default=1, lo=1, hi=num_layers, why="at most num_hidden_layers")
        layers = f.layer_list("moe_layers", num_layers)
        if layers is None:
            layers = list(range(step - 1, num_layers, step))
        experts, top_k, width = _experts(f, "num_local_experts", "intermediate_size")
        # Llama4TextMoe.router is Llama4Router(nn.Linear) whose forward returns (router_scores, router_logits)
        # (transformers 5.9.0 models/llama4/modeling_llama4.py)
        return MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width, num_shared_experts=1,
                       shared_expert_ffn_hidden_size=width, moe_layers=layers, router_returns_tuple=True)
    if model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe"):
        _require(cfg, ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"], model_type)
        first_dense = f.int("first_k_dense_replace", default=0, lo=0, hi=num_layers, why="at most num_hidden_layers")
        freq = f.int("moe_layer_freq", default=1, lo=1, hi=num_layers, why="at most num_hidden_layers")
        shared = f.int("n_shared_experts", "num_shared_experts", default=0)
        experts, top_k, width = _experts(f, "n_routed_experts", "moe_intermediate_size")
        if "topk_method" in cfg:
            noaux = cfg["topk_method"] == "noaux_tc"
        else:  # transformers' DeepseekV3/Glm4Moe classes always carry e_score_correction_bias
            noaux = model_type in ("deepseek_v3", "deepseek_v32", "kimi_k2", "glm4_moe")
        return MoESpec(
            num_experts=experts,
            top_k=top_k,
            expert_ffn_hidden_size=width,
            num_shared_experts=shared,
            shared_expert_ffn_hidden_size=shared * width,
            moe_layers=[i for i in range(num_layers) if i >= first_dense and i % freq == 0],
            score_correction_bias=noaux,
            # DeepseekV2Moe.gate is nn.Linear(hidden_size, n_routed_experts, bias=False) (transformers 5.9.0
            # models/deepseek_v2); DeepseekV3/Glm4Moe build a TopkRouter holding a bare weight
            router_linear=model_type == "deepseek_v2",
            **_groups(f, experts, top_k, f.text("topk_method")),
        )
    return None


def _supported_config(config: Any) -> tuple[str, dict[str, Any]]:
    """The config's model_type and a copy of its fields (Llama 4's text model read from its text_config), or an
    error naming the model types meshplan parses."""
    if not isinstance(config, dict):
        raise MeshplanError("A config.json must be a JSON object.")
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):  # a list or object here is no type to look up
        raise MeshplanError(f"The config.json's model_type must be a string, got {_show(model_type)}.",
                            fix="Write the model's Hugging Face model_type as a string: one of "
                                f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}.")
    if model_type in ("llama4", "gemma3") and isinstance(config.get("text_config"), dict):
        model_type = f"{model_type}_text"
        config = {**config["text_config"], "model_type": model_type}
    kinds = config.get("attn_type_list") if model_type == "minimax_m2" else None  # MiniMax: 0 lightning, 1 softmax
    if model_type in _UNMODELLED_LAYERS or (isinstance(kinds, list) and any(k != 1 for k in kinds)):
        raise MeshplanError(
            f"model_type {model_type!r} has {_UNMODELLED_LAYERS['minimax' if kinds else model_type]}, which meshplan "
            "does not model (it times softmax attention, MLA and MLP/MoE layers only).",
            fix="Plan it with a framework's own tools, or pass a softmax-attention model.")
    if model_type in MULTIMODAL_WRAPPERS:
        raise MeshplanError(
            f"model_type {model_type!r} is Qwen3.5's vision-language model: meshplan does not count or time its vision "
            "tower (vision_config), which the frameworks that load the model hold beside the language model.",
            fix=f"To plan the language model alone, pass its text_config as the config.json (its model_type "
                f"{MULTIMODAL_WRAPPERS[model_type]!r}).")
    if model_type is None:  # a hand-written config: the type decides how its fields are read
        raise MeshplanError("The config.json states no model_type, which decides how its fields are read.",
                            fix="Add the model's Hugging Face model_type: one of "
                                f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}.")
    if model_type not in SUPPORTED_MODEL_TYPES:
        text = config.get("text_config")
        text_type = text.get("model_type") if isinstance(text, dict) else None
        if text_type in SUPPORTED_MODEL_TYPES:  # a vision-language wrapper (llava, qwen2_vl, ...) of a known text model
            raise MeshplanError(
                f"model_type {model_type!r} is a vision-language model: meshplan does not count or time its vision "
                "tower (vision_config), which the frameworks that load the model hold beside the language model.",
                fix=f"To plan the language model alone, pass its text_config as the config.json (its model_type "
                    f"{text_type!r}).")
        raise MeshplanError(
            f"Unsupported model_type {model_type!r} in config.json.",
            fix=f"Supported model types: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}.",
        )
    return model_type, {**_KEY_DEFAULTS.get(model_type, {}), **config}


def _read_gpt2_names(cfg: dict[str, Any], f: _Fields) -> None:
    """GPT-2's config names its shapes n_embd, n_layer, ...: copy them under the names every other family uses."""
    _require(cfg, ["n_embd", "n_layer", "n_head", "vocab_size"], "gpt2")
    n_embd = f.int("n_embd", "hidden_size")
    cfg.update(
        hidden_size=n_embd,
        num_hidden_layers=f.int("n_layer", "num_hidden_layers"),
        num_attention_heads=f.int("n_head", "num_attention_heads"),
        intermediate_size=f.int("n_inner", "intermediate_size", default=None) or 4 * n_embd,
        max_position_embeddings=f.int("n_positions", "max_position_embeddings", default=1024),
    )


def _read_classic_names(model_type: str, cfg: dict[str, Any], f: _Fields) -> None:
    """BLOOM's and GPT-J's own names copied under the common ones; the FFN is 4 x hidden where no width is given
    (BLOOM has none: BloomMLP dense_h_to_4h); GPT-J's rotary_dim and GPT-NeoX's rotary_pct / rotary_emb_base as
    partial_rotary_factor / rope_theta."""
    for theirs, ours in _CLASSIC_NAMES.get(model_type, {}).items():
        if cfg.get(ours) is None and cfg.get(theirs) is not None:
            cfg[ours] = cfg[theirs]
    _require(cfg, ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"], model_type)
    if cfg.get("intermediate_size") is None:
        cfg["intermediate_size"] = 4 * f.int("hidden_size")
    if model_type == "gptj" and cfg.get("rotary_dim") is not None:
        head = f.int("hidden_size") // max(1, f.int("num_attention_heads"))
        cfg.setdefault("partial_rotary_factor", min(1.0, f.int("rotary_dim") / max(1, head)))
    if model_type == "gpt_neox":
        cfg.setdefault("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
        cfg.setdefault("rope_theta", cfg.get("rotary_emb_base", 10000))


def _required_keys(model_type: str) -> list[str]:
    """The fields every config of this model type must give (a MoE family's FFN width may be its experts')."""
    need = ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
    if (SUPPORTED_MODEL_TYPES[model_type] != "moe" and model_type != "qwen3_5_moe_text") or model_type in (
            "qwen3_moe", "qwen2_moe", "llama4_text", "glm4_moe"):
        need.append("intermediate_size")
    return need


def _kv_heads(f: _Fields, heads: int) -> int:
    """num_key_value_heads (default: one per attention head), which must divide the attention heads."""
    kv_heads = f.int("num_key_value_heads", default=heads, lo=1, hi=heads,
                     why=f"at most num_attention_heads = {heads}")
    if heads % kv_heads:
        raise f.fail(f"num_key_value_heads = {kv_heads} does not divide num_attention_heads = {heads}: "
                     f"allowed {', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}.")
    return kv_heads


def _mla_spec(cfg: dict[str, Any], model_type: str, f: _Fields) -> MLASpec | None:
    """Multi-head latent attention's ranks and head dims (the mla family); None for every other model."""
    if SUPPORTED_MODEL_TYPES[model_type] != "mla":
        return None
    _require(cfg, ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"], model_type)
    return MLASpec(
        q_lora_rank=f.int("q_lora_rank", "lora_rank", default=None),
        kv_lora_rank=f.int("kv_lora_rank", "lora_rank"),
        qk_nope_head_dim=f.int("qk_nope_head_dim", "head_dim"),
        qk_rope_head_dim=f.int("qk_rope_head_dim", "head_dim"),
        v_head_dim=f.int("v_head_dim", "head_dim"),
    )


def _dsa_spec(cfg: dict[str, Any], model_type: str, f: _Fields, mla: MLASpec | None) -> DSASpec | None:
    """DeepSeek-V3.2's indexer shapes (index_n_heads, index_head_dim, index_topk); None for every other model. Its
    wq_b reads MLA's q latent (DeepSeek's Indexer: Linear(q_lora_rank, n_heads * head_dim)), so a q_lora_rank is
    required, and its head carries the rotary dims (qk_rope_head_dim of it rotate)."""
    if model_type != "deepseek_v32":
        return None
    _require(cfg, ["index_n_heads", "index_head_dim", "index_topk", "q_lora_rank"], model_type)
    assert mla is not None
    head = f.int("index_head_dim", "head_dim", lo=mla.qk_rope_head_dim,
                 why=f"the indexer head carries the qk_rope_head_dim = {mla.qk_rope_head_dim} rotary dims")
    return DSASpec(index_n_heads=f.int("index_n_heads", "num_attention_heads"), index_head_dim=head,
                   index_topk=f.int("index_topk", "max_position_embeddings"))


def _head_dim(cfg: dict[str, Any], f: _Fields, *, hidden: int, heads: int, mla: MLASpec | None) -> int:
    """The query/key head width: MLA's nope + rope dims, else head_dim as given, else hidden_size / heads."""
    if mla is not None:
        return mla.qk_head_dim
    if cfg.get("head_dim") is not None:
        return f.int("head_dim")
    if hidden % heads:
        raise f.fail(f"hidden_size = {hidden} is not divisible by num_attention_heads = {heads}, and no head_dim "
                     "is given: the head width hidden_size / num_attention_heads is not a whole number.",
                     fix="Give head_dim, or a num_attention_heads that divides hidden_size.")
    return hidden // heads


class _BlockOptions(NamedTuple):
    """The per-layer switches of a model family that change counts or rendering, named as `Architecture` names
    them."""

    qkv_bias: bool
    o_bias: bool
    qk_norm: str
    activation: str
    gated_mlp: bool
    tie_word_embeddings: bool
    num_mtp_layers: int
    mlp_bias: bool


def _block_options(model_type: str, f: _Fields) -> _BlockOptions:
    """Biases, q/k norm, activation, gating, tied embeddings and MTP blocks, by each family's own rule (the config's
    flags where the family reads them)."""
    if model_type in ("gpt_oss", "gpt2", "bloom"):
        qkv_bias = o_bias = True
    elif model_type in ("gptj", "phi3", "minimax_m2"):
        qkv_bias = o_bias = False  # GPTJAttention, Phi3Attention, MiniMaxM2Attention: bias=False, no config key
    elif model_type == "gpt_neox":
        qkv_bias = o_bias = f.flag("attention_bias", True)
    elif model_type == "qwen2":
        qkv_bias, o_bias = True, False
    elif model_type == "qwen2_moe":  # Qwen2MoeConfig.qkv_bias (default true; older config.json files omit it)
        qkv_bias, o_bias = f.flag("qkv_bias", True), False
    elif model_type == "glm4_moe":
        qkv_bias, o_bias = f.flag("attention_bias", False), False
    elif model_type == "glm4":  # Glm4Attention (GlmAttention): q/k/v bias=attention_bias (default true), o_proj none
        qkv_bias, o_bias = f.flag("attention_bias", True), False
    else:
        qkv_bias = o_bias = f.flag("attention_bias", False)
    if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):  # Gemma3Attention: q_norm, k_norm over head_dim
        qk_norm = "head"
    elif model_type in ("olmoe", "minimax_m2"):  # MiniMaxM2Attention is FlexOlmo's (Olmo2's): norms over all heads
        qk_norm = "full"
    elif model_type == "glm4_moe" and f.flag("use_qk_norm", False):
        qk_norm = "head"
    else:
        qk_norm = "none"  # llama4's qk norm is a weightless L2 norm
    classic = SUPPORTED_MODEL_TYPES[model_type] in ("gpt2", "classic")
    act = ((model_type == "gemma3_text" and f.text("hidden_activation")) or f.text("hidden_act")
           or f.text("activation_function") or ("gelu" if classic else "silu"))
    _known_activation(f, model_type, act)
    gated = not classic and model_type != "nemotron"
    tied = f.flag("tie_word_embeddings", _TIED_DEFAULT.get(model_type, False))
    mtp = f.int("num_nextn_predict_layers", default=0) if model_type in ("deepseek_v3", "deepseek_v32",
                                                                          "glm4_moe") else 0
    return _BlockOptions(qkv_bias=qkv_bias, o_bias=o_bias, qk_norm=qk_norm, activation=act, gated_mlp=gated,
                         tie_word_embeddings=tied, num_mtp_layers=mtp,
                         mlp_bias=classic or (model_type not in ("phi3", "glm4") and f.flag("mlp_bias", False)))


def _known_activation(f: _Fields, model_type: str, act: str) -> None:
    """An activation transformers' ACT2FN does not know is refused naming those it knows (families_card)."""
    key = next((k for k in ("hidden_activation", "hidden_act", "activation_function")
                if f.cfg.get(k) == act and (k != "hidden_activation" or model_type == "gemma3_text")), "hidden_act")
    if (error := unknown_activation(key, act, f.where)) is not None:
        raise error


# Which layers a family's transformers 5.9.0 config windows where its config.json gives no layer_types (its
# configuration_<type>.py __post_init__; the modeling code reads sliding_window only on those layers): gpt_oss and
# gemma2 every even-indexed layer ((i + 1) % 2), gemma3_text all but each sliding_window_pattern-th (default 6),
# qwen2 and qwen3 the layers from max_window_layers on (default 28), qwen2_moe the even-indexed layers below it;
# mistral, mixtral, phi3 and qwen3_moe window every layer (their attention takes config.sliding_window whatever
# layer_types says). A family missing here has no window in transformers: its sliding_window is not read.
_WINDOW_RULE = {"gpt_oss": "alternate", "gemma2": "alternate", "gemma3_text": "pattern", "qwen2": "from_max",
                "qwen3": "from_max", "qwen2_moe": "even_below_max", "mistral": "every", "mixtral": "every",
                "phi3": "every", "qwen3_moe": "every"}
# Qwen2Config, Qwen3Config, Qwen3MoeConfig and Qwen2MoeConfig keep sliding_window only where use_sliding_window
# (default false; Qwen2.5's config.json states a window of 131,072 beside false, which is no window)
_WINDOW_SWITCHED = {"qwen2", "qwen3", "qwen3_moe", "qwen2_moe"}
# The families whose config takes a layer_types list (the others window every layer whatever it says)
_LAYER_TYPES_READ = {"gpt_oss", "gemma2", "gemma3_text", "qwen2", "qwen3", "qwen2_moe"}


def _chunked_attention(model_type: str, f: _Fields) -> tuple[int | None, int | None]:
    """(chunk, chunked layers) as transformers 5.9.0's Llama4TextConfig lays them out (configuration_llama4.py
    __post_init__): attention_chunk_size (default 8192; null: none) on the layers layer_types marks
    'chunked_attention', else those no_rope_layers marks 1 (RoPE), else all but each no_rope_layer_interval-th
    (default 4: (i + 1) % 4 != 0); the modeling code masks those layers with create_chunked_causal_mask and the
    others causally. The chunked count is None where every layer is chunked; (None, None) where none is."""
    if model_type != "llama4_text":
        return None, None
    chunk = f.int("attention_chunk_size", "max_position_embeddings", default=8192) \
        if f.cfg.get("attention_chunk_size", 8192) is not None else None
    if chunk is None:
        return None, None
    layers = f.int("num_hidden_layers")
    kinds, rope = f.cfg.get("layer_types"), f.cfg.get("no_rope_layers")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {"chunked_attention",
                                                                                       "full_attention"}:
            raise f.fail(f"layer_types must list {layers} entries, each 'chunked_attention' or 'full_attention', "
                         f"got {_show(kinds)}.")
        chunked = kinds.count("chunked_attention")
    elif rope:  # an empty list falls back to the interval, as the config does
        if not isinstance(rope, list) or len(rope) != layers or not set(rope) <= {0, 1}:
            raise f.fail(f"no_rope_layers must list {layers} entries of 0 or 1, got {_show(rope)}.")
        chunked = sum(rope)
    else:
        interval = f.int("no_rope_layer_interval", "num_hidden_layers", default=4, lo=1)
        chunked = sum(1 for i in range(layers) if (i + 1) % interval)
    if not chunked:
        return None, None
    return chunk, (None if chunked == layers else chunked)


def _sliding_window(model_type: str, f: _Fields) -> tuple[int | None, int | None]:
    """(window, windowed layers) as the family's transformers config applies them (_WINDOW_RULE): the layers a
    layer_types list marks 'sliding_attention' where the family reads one, else the family's own rule; (None, None)
    where no layer slides. The windowed count is None where every layer slides."""
    rule = _WINDOW_RULE.get(model_type)
    if rule is None or (model_type in _WINDOW_SWITCHED and not f.flag("use_sliding_window", False)):
        return None, None
    window = f.int("sliding_window", "max_position_embeddings", default=None)
    if window is None:
        return None, None
    layers = f.int("num_hidden_layers")
    kinds = f.cfg.get("layer_types") if model_type in _LAYER_TYPES_READ else None
    if kinds is not None:
        allowed = {"sliding_attention", "full_attention"}
        if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= allowed:
            raise f.fail(f"layer_types must list {layers} entries, each 'sliding_attention' or 'full_attention', got "
                         f"{_show(kinds)}.")
        windowed = kinds.count("sliding_attention")
    elif rule == "every":
        return window, None
    elif rule == "alternate":
        windowed = (layers + 1) // 2
    elif rule == "pattern":
        pattern = f.int("sliding_window_pattern", "num_hidden_layers", lo=1)
        windowed = sum(1 for i in range(layers) if (i + 1) % pattern)
    else:
        first_full = f.int("max_window_layers", "num_hidden_layers", default=28, lo=0)
        windowed = (max(0, layers - first_full) if rule == "from_max"
                    else sum(1 for i in range(min(first_full, layers)) if i % 2 == 0))
    return (window, windowed) if windowed else (None, None)


def _display_name(cfg: dict[str, Any], model_type: str, name: str | None, hf_id: str | None) -> str:
    path_name = cfg.get("_name_or_path")
    return name or hf_id or (path_name if isinstance(path_name, str) and path_name else f"{model_type} model")


def architecture_from_config(
    config: dict[str, Any], *, name: str | None = None, key: str | None = None, hf_id: str | None = None,
    origin: str = "config.json",
) -> Architecture:
    """Parse a Hugging Face config.json (as a dict) into the shapes meshplan computes with. The fields are read in
    a fixed order, so a config with several bad fields is refused for the same one every time."""
    model_type, cfg = _supported_config(config)
    where = origin.removeprefix("config.json ") if origin.startswith("config.json ") else origin
    f = _Fields(cfg, f"cards/models/{key}.yaml" if origin == "catalog" and key else where)
    if model_type == "gpt2":
        _read_gpt2_names(cfg, f)
    elif SUPPORTED_MODEL_TYPES[model_type] == "classic":
        _read_classic_names(model_type, cfg, f)
    elif model_type == "nemotron_h":
        read_hybrid_names(cfg, f)
    elif model_type in GDN_MODEL_TYPES:
        read_gdn_names(model_type, cfg)
    _require(cfg, _required_keys(model_type), model_type)
    layers = f.int("num_hidden_layers")
    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    kv_heads = _kv_heads(f, heads)
    vocab = f.int("vocab_size")
    dense_key = "intermediate_size_mlp" if model_type == "llama4_text" else "intermediate_size"
    dense_ffn = f.int(dense_key, "intermediate_size", default=None)
    positions = f.int("max_position_embeddings", default=None)
    sliding, windowed = _sliding_window(model_type, f)
    chunk, chunked = _chunked_attention(model_type, f)
    moe = _moe_spec(cfg, model_type, layers, f)
    mla = _mla_spec(cfg, model_type, f)
    dsa = _dsa_spec(cfg, model_type, f, mla)
    head_dim = _head_dim(cfg, f, hidden=hidden, heads=heads, mla=mla)
    options = _block_options(model_type, f)
    arch = Architecture(
        key=key,
        name=_display_name(cfg, model_type, name, hf_id),
        hf_id=hf_id,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=dense_ffn or (moe.expert_ffn_hidden_size if moe else 4 * hidden),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=positions,
        **options._asdict(),
        norm_type="layernorm" if model_type in _LAYERNORM_TYPES else "rmsnorm",
        norms_per_layer=_NORMS_PER_LAYER.get(model_type, 2),
        learned_position_embeddings=positions if model_type == "gpt2" else 0,
        attention_sinks=model_type == "gpt_oss",
        swiglu_limit=_swiglu_limit(cfg, model_type, f),
        alibi=model_type == "bloom",
        parallel_attention=model_type == "gptj" or (model_type == "gpt_neox" and f.flag("use_parallel_residual",
                                                                                        True)),
        embedding_norm=model_type == "bloom",
        output_bias=model_type == "gptj",
        sliding_window=sliding,
        sliding_window_layers=windowed,
        attention_chunk_size=chunk,
        chunked_attention_layers=chunked,
        rope=_rope_spec(cfg, model_type, f),
        norm_eps=_norm_eps(cfg, f),
        moe=moe,
        mla=mla,
        dsa=dsa,
        origin=origin,
        vision=llama4_vision_tower(config, lambda c, w: _Fields(c, f"{f.where} {w}")),
    )
    if model_type in GDN_MODEL_TYPES:
        return gdn_architecture(arch, f)
    return hybrid_architecture(arch, f, _groups) if model_type == "nemotron_h" else arch


# --------------------------------------------------------------------------- config.json files

MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; refuse anything that is clearly not one


def _config_path(path: Path) -> Path:
    """The config.json a model path names (a folder: the config.json in it); for a remote caller inside the folders it
    may read, the file itself too (a config.json symlinked out of the folder is refused, core/server_files.py)."""
    path = server_files.server_path(path, "model")
    if server_files.is_dir(path):  # is_dir: a MeshplanError is a ValueError, which the try below reads as no file
        path = server_files.server_path(path / "config.json", "model")
    try:
        if path.is_file():
            return path
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        pass
    raise MeshplanError(f"No config.json at {str(path)[:200]!r}.",
                        fix="Give the path of a model's Hugging Face config.json or of the folder that holds it, its "
                        "text itself (a JSON object), a catalog key (meshplan models) or a size such as '70B'.")


def _too_large(path: Path) -> MeshplanError:
    return MeshplanError(f"{str(path)[:200]!r} is more than {MAX_CONFIG_BYTES:,} bytes; a config.json is a few KB.",
                         fix="Pass the model's Hugging Face config.json, or the folder that holds it.")


def _config_bytes(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise _too_large(path)
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise MeshplanError(f"Cannot read {str(path)!r}: {exc.strerror or exc}.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise _too_large(path)
    return raw


NOT_A_MODEL_CONFIG = ("A model path is a Hugging Face config.json; a framework's config or launch script (TOML, YAML, "
                      "shell) is read as --config FILE on the CLI, config_text on MCP.")


def _parse_config(raw: bytes, path: Path | str) -> dict[str, Any]:
    """The config.json's object; `path` is the file, or CONFIG_TEXT_NAME for a config.json sent as text."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: also ints over 4300 digits
        meant_json = raw.lstrip()[:1] == b"{"  # a config.json with a slip, else another kind of file
        raise MeshplanError(f"{str(path)!r} is not valid JSON: {str(exc)[:200]}.",
                            fix="Fix the JSON there." if meant_json else NOT_A_MODEL_CONFIG) from None
    if not isinstance(data, dict):
        raise MeshplanError(f"{str(path)!r} must hold a JSON object, not {type(data).__name__}.")
    return data


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a config.json safely: JSON only, size-capped, never executed, never fetched."""
    path = _config_path(path)
    return _parse_config(_config_bytes(path), path)


_config_cache: dict[tuple[str, str], Architecture] = {}
_CONFIG_CACHE_SIZE = 256


def architecture_from_file(path: Path) -> Architecture:
    """A config.json's architecture, cached by path and content hash: an edited file is parsed again, an
    unchanged one gives the same object (which the estimators' per-architecture caches key on)."""
    path = _config_path(path)
    return _cached_architecture(_config_bytes(path), path)


CONFIG_TEXT_NAME = "pasted config.json"  # the model's name, and its errors' subject, when its config.json came as text


def is_config_text(model: str) -> bool:
    """Whether a request's model is a config.json's text (a JSON object) rather than a name or a path: what a caller
    over HTTP sends, where a path names the server's file (core/server_files.py), and what the web page's paste is."""
    return model.lstrip().startswith("{")


MODEL_CONFIG_KEY = re.compile(r'"(model_type|architectures)"\s*:')  # keys no framework config meshplan reads has


def is_model_config_json(text: str) -> bool:
    """Whether a pasted config (MCP's config_text) is a Hugging Face config.json: a JSON object naming model_type or
    architectures, read as the model, not as a framework's config. Told by its keys' text, not by parsing, so a
    config.json with a slip is refused in the words a config.json file gets, not as a broken DeepSpeed JSON."""
    return is_config_text(text) and MODEL_CONFIG_KEY.search(text) is not None


def architecture_from_text(text: str) -> Architecture:
    """The architecture of a config.json sent as its text, read as architecture_from_file reads the file (the same
    size cap, JSON errors and model_type checks), named CONFIG_TEXT_NAME; cached by content."""
    raw = text.encode("utf-8")
    if len(raw) > MAX_CONFIG_BYTES:
        raise _too_large(Path(CONFIG_TEXT_NAME))
    return _cached_architecture(raw, CONFIG_TEXT_NAME)


def _cached_architecture(raw: bytes, source: Path | str) -> Architecture:
    """The architecture of a config.json's bytes from `source` (its file, or CONFIG_TEXT_NAME), one object per source
    and content (which the estimators' per-architecture caches key on)."""
    key = (str(source), hashlib.sha256(raw).hexdigest())
    arch = _config_cache.get(key)
    if arch is None:
        origin = f"config.json {source}" if isinstance(source, Path) else source
        arch = architecture_from_config(_parse_config(raw, source), name=str(source), origin=origin)
        if len(_config_cache) >= _CONFIG_CACHE_SIZE:
            _config_cache.clear()
        _config_cache[key] = arch
    return arch

