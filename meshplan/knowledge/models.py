"""Model catalog, Hugging Face config.json ingestion and exact parameter counting.

A catalog card stores the fields of the model's own config.json, so a catalog entry and the same
model's config.json go through one parser (`architecture_from_config`) and can never disagree.
Counts are exact element counts of the checkpoint's tensors, by component, so every vendor's
"active" convention can be derived from one breakdown.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field

from meshplan.core.errors import MeshplanError, closest
from meshplan.knowledge.cards import ModelCard, _Card, load_card, model_card, model_card_names
from meshplan.schema.contract import Architecture, ComponentCount, MLASpec, ModelReport, ModelSummary, MoESpec, RopeSpec

T = TypeVar("T")

_MISSING = object()
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; refuse anything that is clearly not one

# model_type -> family of parser. Every other key of a config is read by its HF name.
SUPPORTED_MODEL_TYPES = {
    "llama": "dense",
    "mistral": "dense",
    "qwen2": "dense",
    "qwen3": "dense",
    "gemma2": "dense",
    "nemotron": "dense",
    "gpt2": "gpt2",
    "mixtral": "moe",
    "qwen3_moe": "moe",
    "olmoe": "moe",
    "gpt_oss": "moe",
    "llama4": "moe",
    "llama4_text": "moe",
    "glm4_moe": "moe",
    "deepseek_v2": "mla",
    "deepseek_v3": "mla",
    "kimi_k2": "mla",
}

# Defaults of each transformers config class for the keys their config.json may omit.
_TIED_DEFAULT = {"gemma2": True, "gpt2": True}
_NORMS_PER_LAYER = {"gemma2": 4}
_LAYERNORM_TYPES = {"gpt2", "nemotron"}


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
    if model_type == "gpt2":
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
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    fraction = cfg.get("partial_rotary_factor", params.get("partial_rotary_factor"))

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


def _moe_spec(cfg: dict[str, Any], model_type: str, num_layers: int, f: _Fields) -> MoESpec | None:
    """Routed/shared experts and which layers are MoE, by each architecture's own rule."""
    if model_type in ("mixtral", "olmoe", "gpt_oss"):
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
        )
    if model_type == "qwen3_moe":
        _require(cfg, ["num_experts", "num_experts_per_tok", "moe_intermediate_size"], model_type)
        step = f.int("decoder_sparse_step", default=1, lo=1, hi=num_layers, why="at most num_hidden_layers")
        dense_only = set(f.layer_list("mlp_only_layers", num_layers) or [])
        layers = [i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0]
        experts, top_k, width = _experts(f, "num_experts", "moe_intermediate_size")
        return MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width, moe_layers=layers)
    if model_type in ("llama4", "llama4_text"):
        _require(cfg, ["num_local_experts", "num_experts_per_tok", "intermediate_size"], model_type)
        step = f.int("interleave_moe_layer_step", default=1, lo=1, hi=num_layers, why="at most num_hidden_layers")
        layers = f.layer_list("moe_layers", num_layers)
        if layers is None:
            layers = list(range(step - 1, num_layers, step))
        experts, top_k, width = _experts(f, "num_local_experts", "intermediate_size")
        return MoESpec(
            num_experts=experts,
            top_k=top_k,
            expert_ffn_hidden_size=width,
            num_shared_experts=1,
            shared_expert_ffn_hidden_size=width,
            moe_layers=layers,
        )
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe"):
        _require(cfg, ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"], model_type)
        first_dense = f.int("first_k_dense_replace", default=0, lo=0, hi=num_layers, why="at most num_hidden_layers")
        freq = f.int("moe_layer_freq", default=1, lo=1, hi=num_layers, why="at most num_hidden_layers")
        shared = f.int("n_shared_experts", "num_shared_experts", default=0)
        experts, top_k, width = _experts(f, "n_routed_experts", "moe_intermediate_size")
        if "topk_method" in cfg:
            noaux = cfg["topk_method"] == "noaux_tc"
        else:  # transformers' DeepseekV3/Glm4Moe classes always carry e_score_correction_bias
            noaux = model_type in ("deepseek_v3", "kimi_k2", "glm4_moe")
        return MoESpec(
            num_experts=experts,
            top_k=top_k,
            expert_ffn_hidden_size=width,
            num_shared_experts=shared,
            shared_expert_ffn_hidden_size=shared * width,
            moe_layers=[i for i in range(num_layers) if i >= first_dense and i % freq == 0],
            score_correction_bias=noaux,
            **_groups(f, experts, top_k, f.text("topk_method")),
        )
    return None


def architecture_from_config(
    config: dict[str, Any], *, name: str | None = None, key: str | None = None, hf_id: str | None = None,
    origin: str = "config.json",
) -> Architecture:
    """Parse a Hugging Face config.json (as a dict) into the shapes meshplan computes with."""
    if not isinstance(config, dict):
        raise MeshplanError("A config.json must be a JSON object.")
    model_type = config.get("model_type")
    if model_type == "llama4" and isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "model_type": "llama4_text"}
        model_type = "llama4_text"
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise MeshplanError(
            f"Unsupported model_type {model_type!r} in config.json.",
            fix=f"Supported model types: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}.",
        )
    cfg = dict(config)
    where = origin.removeprefix("config.json ") if origin.startswith("config.json ") else origin
    f = _Fields(cfg, f"cards/models/{key}.yaml" if origin == "catalog" and key else where)
    if model_type == "gpt2":
        _require(cfg, ["n_embd", "n_layer", "n_head", "vocab_size"], model_type)
        n_embd = f.int("n_embd", "hidden_size")
        cfg.update(
            hidden_size=n_embd,
            num_hidden_layers=f.int("n_layer", "num_hidden_layers"),
            num_attention_heads=f.int("n_head", "num_attention_heads"),
            intermediate_size=f.int("n_inner", "intermediate_size", default=None) or 4 * n_embd,
            max_position_embeddings=f.int("n_positions", "max_position_embeddings", default=1024),
        )
    family = SUPPORTED_MODEL_TYPES[model_type]
    need = ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
    if family != "moe" or model_type in ("qwen3_moe", "llama4_text", "glm4_moe"):
        need.append("intermediate_size")
    _require(cfg, need, model_type)
    layers = f.int("num_hidden_layers")
    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", default=heads, lo=1, hi=heads,
                     why=f"at most num_attention_heads = {heads}")
    if heads % kv_heads:
        raise f.fail(f"num_key_value_heads = {kv_heads} does not divide num_attention_heads = {heads}: "
                     f"allowed {', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)}.")
    vocab = f.int("vocab_size")
    dense_key = "intermediate_size_mlp" if model_type == "llama4_text" else "intermediate_size"
    dense_ffn = f.int(dense_key, "intermediate_size", default=None)
    positions = f.int("max_position_embeddings", default=None)
    sliding = f.int("sliding_window", "max_position_embeddings", default=None)
    moe = _moe_spec(cfg, model_type, layers, f)
    mla = None
    if family == "mla":
        _require(cfg, ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"], model_type)
        mla = MLASpec(
            q_lora_rank=f.int("q_lora_rank", "lora_rank", default=None),
            kv_lora_rank=f.int("kv_lora_rank", "lora_rank"),
            qk_nope_head_dim=f.int("qk_nope_head_dim", "head_dim"),
            qk_rope_head_dim=f.int("qk_rope_head_dim", "head_dim"),
            v_head_dim=f.int("v_head_dim", "head_dim"),
        )
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    elif cfg.get("head_dim") is not None:
        head_dim = f.int("head_dim")
    elif hidden % heads:
        raise f.fail(f"hidden_size = {hidden} is not divisible by num_attention_heads = {heads}, and no head_dim "
                     "is given: the head width hidden_size / num_attention_heads is not a whole number.",
                     fix="Give head_dim, or a num_attention_heads that divides hidden_size.")
    else:
        head_dim = hidden // heads
    if model_type in ("gpt_oss", "gpt2"):
        qkv_bias = o_bias = True
    elif model_type == "qwen2":
        qkv_bias, o_bias = True, False
    elif model_type == "glm4_moe":
        qkv_bias, o_bias = f.flag("attention_bias", False), False
    else:
        qkv_bias = o_bias = f.flag("attention_bias", False)
    if model_type in ("qwen3", "qwen3_moe"):
        qk_norm = "head"
    elif model_type == "olmoe":
        qk_norm = "full"
    elif model_type == "glm4_moe" and f.flag("use_qk_norm", False):
        qk_norm = "head"
    else:
        qk_norm = "none"  # llama4's qk norm is a weightless L2 norm
    act = f.text("hidden_act") or f.text("activation_function") or "silu"
    gated = model_type not in ("gpt2", "nemotron")
    tied = f.flag("tie_word_embeddings", _TIED_DEFAULT.get(model_type, False))
    mtp = f.int("num_nextn_predict_layers", default=0) if model_type in ("deepseek_v3", "glm4_moe") else 0
    path_name = cfg.get("_name_or_path")
    return Architecture(
        key=key,
        name=name or hf_id or (path_name if isinstance(path_name, str) and path_name else f"{model_type} model"),
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
        tie_word_embeddings=tied,
        gated_mlp=gated,
        activation=act,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=model_type == "gpt2" or f.flag("mlp_bias", False),
        qk_norm=qk_norm,
        norm_type="layernorm" if model_type in _LAYERNORM_TYPES else "rmsnorm",
        norms_per_layer=_NORMS_PER_LAYER.get(model_type, 2),
        learned_position_embeddings=positions if model_type == "gpt2" else 0,
        attention_sinks=model_type == "gpt_oss",
        sliding_window=sliding,
        rope=_rope_spec(cfg, model_type, f),
        norm_eps=_norm_eps(cfg, f),
        moe=moe,
        mla=mla,
        num_mtp_layers=mtp,
        origin=origin,
    )


# --------------------------------------------------------------------------- counting


def _norm_params(arch: Architecture, width: int) -> int:
    return width * (2 if arch.norm_type == "layernorm" else 1)


def attention_params(arch: Architecture) -> int:
    """One layer's attention block: projections, biases, q/k norms, sinks (no input norm)."""
    h, a, d, g = arch.hidden_size, arch.num_attention_heads, arch.head_dim, arch.num_kv_heads
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk  # q_a, q_a_layernorm, q_b
        else:
            q = h * a * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # kv_a_proj_with_mqa, kv_a_layernorm
        kv += m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)  # kv_b_proj
        return q + kv + a * m.v_head_dim * h
    params = h * a * d + 2 * h * g * d + a * d * h
    if arch.qkv_bias:
        params += a * d + 2 * g * d
    if arch.o_bias:
        params += h
    if arch.qk_norm == "head":
        params += 2 * d
    elif arch.qk_norm == "full":
        params += a * d + g * d
    if arch.attention_sinks:
        params += a
    return params


def mlp_params(arch: Architecture, width: int, bias: bool | None = None) -> int:
    """A (gated or plain) FFN of the given width."""
    h = arch.hidden_size
    mats = 3 if arch.gated_mlp else 2
    params = mats * h * width
    if arch.mlp_bias if bias is None else bias:
        params += (2 if arch.gated_mlp else 1) * width + h
    return params


def router_params(arch: Architecture) -> int:
    moe = arch.moe
    assert moe is not None
    params = arch.hidden_size * moe.num_experts
    if moe.router_bias:
        params += moe.num_experts
    if moe.score_correction_bias:
        params += moe.num_experts
    return params


def layer_params(arch: Architecture, index: int) -> dict[str, int]:
    """Parameters of decoder layer `index`, by component (routed experts counted in full)."""
    out = {
        "attention": attention_params(arch),
        "norms": arch.norms_per_layer * _norm_params(arch, arch.hidden_size),
        "dense_mlp": 0,
        "routed_experts": 0,
        "shared_experts": 0,
        "router": 0,
    }
    if arch.is_moe_layer(index):
        moe = arch.moe
        assert moe is not None
        out["routed_experts"] = moe.num_experts * mlp_params(
            arch, moe.expert_ffn_hidden_size, bias=moe.expert_bias
        )
        if moe.shared_expert_ffn_hidden_size:
            out["shared_experts"] = mlp_params(arch, moe.shared_expert_ffn_hidden_size, bias=False)
        out["router"] = router_params(arch)
    else:
        out["dense_mlp"] = mlp_params(arch, arch.ffn_hidden_size)
    return out


def expert_params(arch: Architecture) -> int:
    """One routed expert."""
    assert arch.moe is not None
    return mlp_params(arch, arch.moe.expert_ffn_hidden_size, bias=arch.moe.expert_bias)


def mtp_params(arch: Architecture) -> int:
    """DeepSeek-V3 style MTP block: two norms, eh_proj (2h->h), a decoder layer, the shared head's norm."""
    if not arch.num_mtp_layers:
        return 0
    h = arch.hidden_size
    last = layer_params(arch, arch.num_layers - 1)
    per_block = 3 * _norm_params(arch, h) + 2 * h * h + sum(last.values())
    return arch.num_mtp_layers * per_block


def count_components(arch: Architecture) -> list[ComponentCount]:
    h, v = arch.hidden_size, arch.vocab_size
    sums: dict[str, int] = {}
    for i in range(arch.num_layers):
        for comp, n in layer_params(arch, i).items():
            sums[comp] = sums.get(comp, 0) + n
    moe_layers = len(arch.moe.moe_layers) if arch.moe else 0
    inactive = 0
    if arch.moe:
        inactive = moe_layers * (arch.moe.num_experts - arch.moe.top_k) * expert_params(arch)
    comps = [
        ComponentCount(name="embedding", params=v * h, active_params=v * h, note="input embedding (vocab x hidden)"),
    ]
    if arch.learned_position_embeddings:
        n = arch.learned_position_embeddings * h
        comps.append(ComponentCount(name="position_embedding", params=n, active_params=n, note="learned positions"))
    comps.append(
        ComponentCount(name="attention", params=sums["attention"], active_params=sums["attention"],
                       note=f"{arch.num_layers} layers" + (", MLA" if arch.mla else ""))
    )
    if sums["dense_mlp"]:
        n_dense = arch.num_layers - moe_layers
        comps.append(ComponentCount(name="dense_mlp", params=sums["dense_mlp"], active_params=sums["dense_mlp"],
                                    note=f"{n_dense} dense FFN layers"))
    if arch.moe:
        routed = sums["routed_experts"]
        comps.append(ComponentCount(
            name="routed_experts", params=routed, active_params=routed - inactive,
            note=f"{moe_layers} MoE layers x {arch.moe.num_experts} experts, top-{arch.moe.top_k} active"))
        if sums["shared_experts"]:
            comps.append(ComponentCount(name="shared_experts", params=sums["shared_experts"],
                                        active_params=sums["shared_experts"]))
        comps.append(ComponentCount(name="router", params=sums["router"], active_params=sums["router"]))
    final_norm = _norm_params(arch, h)
    comps.append(ComponentCount(name="norms", params=sums["norms"] + final_norm,
                                active_params=sums["norms"] + final_norm, note="per-layer norms and the final norm"))
    if not arch.tie_word_embeddings:
        comps.append(ComponentCount(name="lm_head", params=v * h, active_params=v * h, note="untied output layer"))
    return comps


def _component(comps: list[ComponentCount], name: str) -> ComponentCount | None:
    return next((c for c in comps if c.name == name), None)


def describe_architecture(arch: Architecture, published: dict | None = None) -> ModelReport:
    comps = count_components(arch)
    total = sum(c.params for c in comps)
    active = sum(c.active_params for c in comps)
    emb = sum(c.params for c in comps if c.name in ("embedding", "position_embedding"))
    head = (_component(comps, "lm_head") or ComponentCount(name="lm_head", params=0, active_params=0)).params
    input_emb = _component(comps, "embedding").params  # type: ignore[union-attr]
    assumptions = [
        "Exact element counts from the config: every weight matrix, bias and norm of the checkpoint.",
        "total excludes multi-token-prediction (MTP) blocks; mtp_params reports them separately.",
        "active = total minus the unused routed experts (num_experts - top_k) of every MoE layer.",
        "active_params_excl_input_embedding = active - vocab*hidden (DeepSeek, gpt-oss convention).",
        "active_params_non_embedding = active minus input embedding and untied head (Moonlight, GLM convention).",
    ]
    if arch.tie_word_embeddings:
        assumptions.append("Embeddings are tied: the output layer reuses the input embedding, counted once.")
    if arch.generic:
        assumptions.append(
            "Generic model: no real config was given, so a Llama-3-shaped dense model of about this size was "
            f"built ({arch.num_attention_heads} heads of {arch.head_dim} over {arch.num_kv_heads} KV heads, SwiGLU "
            f"FFN {arch.ffn_hidden_size:,}, vocab {arch.vocab_size:,}; the shaping rules are in "
            "cards/model_shapes.yaml). Pass a catalog key or a config.json for exact numbers."
        )
    if arch.key and arch.origin == VARIANT_ORIGIN.format(key=arch.key):
        assumptions.append(
            f"{arch.name.split(' (architecture of ')[0]} is not in the catalog under that name: it is read as a "
            f"fine-tuned variant of {arch.hf_id or arch.key} (catalog card {arch.key}), whose architecture and "
            "parameter count a fine-tune keeps."
        )
    return ModelReport(
        name=arch.name,
        key=arch.key,
        hf_id=arch.hf_id,
        model_type=arch.model_type,
        origin=arch.origin,
        generic=arch.generic,
        total_params=total,
        active_params=active,
        active_params_excl_input_embedding=active - input_emb,
        active_params_non_embedding=active - emb - head,
        non_embedding_params=total - emb - head,
        mtp_params=mtp_params(arch),
        components=comps,
        architecture=arch,
        published=published,
        assumptions=assumptions,
    )


def per_architecture(build: Callable[[Architecture], T], limit: int = 256) -> Callable[[Architecture], T]:
    """Cache `build(arch)` per Architecture object: the estimators' per-layer tables are rebuilt only for a
    new model. Architectures are pydantic models (not hashable), and resolve_model returns one object per name,
    so identity is the key; the object itself is kept so a recycled id() can never return a stale table."""
    cache: dict[int, tuple[Architecture, T]] = {}

    def get(arch: Architecture) -> T:
        hit = cache.get(id(arch))
        if hit is not None and hit[0] is arch:
            return hit[1]
        if len(cache) > limit:
            cache.clear()
        value = build(arch)
        cache[id(arch)] = (arch, value)
        return value

    return get


def total_params(arch: Architecture) -> int:
    return sum(c.params for c in count_components(arch))


# --------------------------------------------------------------------------- generic models by size

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmbt]?)\s*(?:params?)?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> float | None:
    """'70B', '7e9', '1.5T', '350M' -> parameter count; None when the text is not a size."""
    match = _SIZE_RE.match(text)
    if not match:
        return None
    value = float(match.group(1)) * _SCALE[match.group(2).lower()]
    return value


def _generic_shape(hidden: int, layers: int, label: str) -> Architecture:
    """The Llama-3-shaped dense model of this width and depth (numbers and their reasons: cards/model_shapes.yaml)."""
    g = shapes_card().generic
    heads = hidden // g.head_dim
    return Architecture(
        name=f"generic dense {label} (llama-shaped)",
        model_type="llama",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=round(hidden * g.ffn_ratio / g.ffn_multiple) * g.ffn_multiple,
        num_attention_heads=heads,
        num_kv_heads=min(g.kv_heads, heads),
        head_dim=g.head_dim,
        vocab_size=g.vocab_size,
        max_position_embeddings=g.max_position_embeddings,
        generic=True,
        origin=f"generic size {label}",
    )


@cache
def _generic_widths() -> list[tuple[int, int, int]]:
    """(hidden, params of one layer, params outside the layers) for every width a generic model may take:
    whole groups of `heads_multiple` heads of `head_dim`, up to the hidden_size bound."""
    g, bounds = shapes_card().generic, shapes_card().bounds
    step = g.head_dim * g.heads_multiple
    out = []
    for hidden in range(step, bounds["hidden_size"].max + 1, step):
        one = _generic_shape(hidden, 1, "")
        per_layer = sum(layer_params(one, 0).values())
        out.append((hidden, per_layer, total_params(one) - per_layer))
    return out


def _size_text(size: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if size >= scale:
            return f"{size / scale:.3g}{unit}"
    return f"{size:.3g}"


def generic_architecture(size: float, label: str) -> Architecture:
    """A Llama-3-shaped dense model of about `size` parameters: heads in groups of 8 (TP 1/2/4/8 valid), 8 KV
    heads, and the width/depth ratio nearest Llama 3's among the shapes within the size tolerance."""
    g, max_layers = shapes_card().generic, shapes_card().bounds["num_hidden_layers"].max
    widths = _generic_widths()
    smallest = widths[0][1] * g.min_layers + widths[0][2]
    largest = widths[-1][1] * max_layers + widths[-1][2]
    if not (math.isfinite(size) and smallest * (1 - g.size_tolerance) <= size <= largest * (1 + g.size_tolerance)):
        raise MeshplanError(
            f"A generic model of {label} parameters is outside the range meshplan can shape: "
            f"{_size_text(smallest)} to {_size_text(largest)} (a Llama-3-shaped model with {g.heads_multiple} "
            f"heads of {g.head_dim} and vocab {g.vocab_size:,} at its smallest, the hidden-size and layer bounds "
            "at its largest).",
            fix="Give a size such as '7B', '70B' or '1.5T', a catalog model, or a config.json.",
        )
    best: tuple[float, int, int] | None = None
    for hidden, per_layer, fixed in widths:
        fewest = max(g.min_layers, math.ceil((size * (1 - g.size_tolerance) - fixed) / per_layer))
        most = min(max_layers, math.floor((size * (1 + g.size_tolerance) - fixed) / per_layer))
        if fewest > most:
            continue
        # Within the tolerance, the depth with the most factors of two (70B: 80 layers, as Llama 3 70B), so
        # pipeline stages of 2, 4 and 8 split it evenly; then the one nearest the size.
        layers = max(range(fewest, most + 1),
                     key=lambda n: ((n & -n).bit_length(), -abs(fixed + n * per_layer - size)))
        score = abs(math.log(hidden / layers / g.hidden_per_layer))
        if best is None or score < best[0]:
            best = (score, hidden, layers)
    if best is None:
        raise MeshplanError(
            f"No Llama-3-shaped dense model comes within {g.size_tolerance:.0%} of {label} parameters.",
            fix="Give a slightly different size, a catalog model, or a config.json.",
        )
    return _generic_shape(best[1], best[2], label)


# --------------------------------------------------------------------------- catalog and look-up

# Fine-tuned variants share their base model's architecture: "-Instruct", "-Base", "-Chat", Gemma's "-it".
_VARIANT_RE = re.compile(r"[-_](instruct|base|chat|it)(?=$|[-_.])", re.IGNORECASE)


def _without_variant(name: str) -> tuple[str, list[str]]:
    """'meta-llama/llama-3.1-8b-instruct' -> ('meta-llama/llama-3.1-8b', ['instruct'])."""
    return _VARIANT_RE.sub("", name), [m.group(1) for m in _VARIANT_RE.finditer(name)]


@cache
def _catalog_index() -> dict[str, str]:
    """Lower-cased key, hf_id and alias, and the repository name of each id without its organisation
    ('meta-llama-3-70b' for meta-llama/Meta-Llama-3-70B) when only one card has it -> catalog key."""
    index: dict[str, str] = {}
    bare: dict[str, set[str]] = {}
    for key in model_card_names():
        card = model_card(key)
        for name in [card.key, card.hf_id, *card.aliases]:
            if name:
                index[name.lower()] = card.key
                if "/" in name:
                    bare.setdefault(name.rsplit("/", 1)[1].lower(), set()).add(card.key)
    for name, keys in bare.items():
        if len(keys) == 1 and name not in index:
            index[name] = next(iter(keys))
    return index


@cache
def _variant_index() -> dict[str, str]:
    """Every catalog name with its variant words removed -> catalog key (names two cards share are left out)."""
    found: dict[str, set[str]] = {}
    for name, key in _catalog_index().items():
        found.setdefault(_without_variant(name)[0], set()).add(key)
    return {name: next(iter(keys)) for name, keys in found.items() if len(keys) == 1}


@cache
def catalog_architecture(key: str) -> Architecture:
    card = model_card(key)
    return architecture_from_config(card.config, name=card.name, key=card.key, hf_id=card.hf_id, origin="catalog")


VARIANT_ORIGIN = "catalog card {key}, read as a fine-tuned variant"


def _variant_architecture(key: str, requested: str) -> Architecture:
    """The catalog architecture under the name asked for, saying which card it comes from: a fine-tune keeps
    its base model's shapes and parameter count, so the card's counts and published figures apply."""
    arch = catalog_architecture(key)
    return arch.model_copy(update={
        "name": f"{requested} (architecture of {arch.name})",
        "origin": VARIANT_ORIGIN.format(key=key),
    })


def catalog_keys() -> list[str]:
    return model_card_names()


def _config_path(path: Path) -> Path:
    try:
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return path
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        pass
    raise MeshplanError(f"No config.json at {str(path)[:200]!r}.")


def _config_bytes(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise MeshplanError(f"{str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes; that is not a config.json.")
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise MeshplanError(f"Cannot read {str(path)!r}: {exc.strerror or exc}.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise MeshplanError(f"{str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes; that is not a config.json.")
    return raw


def _parse_config(raw: bytes, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: also ints over 4300 digits
        raise MeshplanError(f"{str(path)!r} is not valid JSON: {str(exc)[:200]}.") from None
    if not isinstance(data, dict):
        raise MeshplanError(f"{str(path)!r} must hold a JSON object, not {type(data).__name__}.")
    return data


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a config.json safely: JSON only, size-capped, never executed, never fetched."""
    path = _config_path(path)
    return _parse_config(_config_bytes(path), path)


_config_cache: dict[tuple[str, str], Architecture] = {}
_CONFIG_CACHE_SIZE = 256


def _config_architecture(path: Path) -> Architecture:
    """A config.json's architecture, cached by path and content hash: an edited file is parsed again, an
    unchanged one gives the same object (which the estimators' per-architecture caches key on)."""
    path = _config_path(path)
    raw = _config_bytes(path)
    key = (str(path), hashlib.sha256(raw).hexdigest())
    arch = _config_cache.get(key)
    if arch is None:
        arch = architecture_from_config(_parse_config(raw, path), name=str(path), origin=f"config.json {path}")
        if len(_config_cache) >= _CONFIG_CACHE_SIZE:
            _config_cache.clear()
        _config_cache[key] = arch
    return arch


def _looks_like_path(name: str) -> bool:
    if name.endswith(".json") or name.startswith((".", "~")):
        return True
    try:
        return "/" in name and Path(name).exists()
    except (OSError, ValueError):
        return False


def resolve_model(name: str) -> Architecture:
    """A catalog key, HF id or alias (case-insensitive, Instruct/Base/Chat variants included), a path to a
    config.json (re-read when the file changes), or a size such as '70B'."""
    if not isinstance(name, str) or not name.strip():
        raise MeshplanError("model must be a non-empty string.", fix="Try 'meshplan models' for the catalog.")
    name = name.strip()
    key = _catalog_index().get(name.lower())
    if key:
        return catalog_architecture(key)
    if _looks_like_path(name):
        try:
            path = Path(name).expanduser()
        except RuntimeError as exc:  # '~user' for a user this machine does not know
            raise MeshplanError(f"Cannot expand the home directory in {name[:200]!r}: {exc}",
                                fix="Give the config.json path without '~', or a catalog key.") from exc
        return _config_architecture(path)
    return _resolve_name(name)


@lru_cache(maxsize=256)
def _resolve_name(name: str) -> Architecture:
    """A variant of a catalog model or a size; one object per name, so per-architecture caches hit."""
    key = _variant_index().get(_without_variant(name.lower())[0])
    if key:
        return _variant_architecture(key, name)
    size = parse_size(name)
    if size is not None:
        return generic_architecture(size, name.upper().replace(" ", ""))
    hints = closest(name, list(_catalog_index()))
    hint_keys = list(dict.fromkeys(_catalog_index()[h] for h in hints))
    raise MeshplanError(
        f"Unknown model {name!r}.",
        fix=(f"Did you mean: {', '.join(hint_keys)}? " if hint_keys else "")
        + "Use a catalog key (meshplan models), a Hugging Face id (Instruct/Base/Chat variants of catalog models "
        "included), a path to a config.json, or a size like '70B'.",
    )


def published_for(arch: Architecture) -> dict | None:
    if not arch.key:
        return None
    return model_card(arch.key).published.model_dump(exclude_none=True)


def published_mismatches(report: ModelReport) -> list[str]:
    """Where the exact counts fall outside the rounding of the published ones (empty = all agree)."""
    pub = report.published or {}
    active_by_convention = {
        "active": report.active_params,
        "active_excl_input_embedding": report.active_params_excl_input_embedding,
        "active_non_embedding": report.active_params_non_embedding,
    }
    checks = [
        ("total", report.total_params, pub.get("total"), pub.get("total_rounding", 0) + pub.get("extra_tolerance", 0)),
        ("non_embedding", report.non_embedding_params, pub.get("non_embedding"), pub.get("non_embedding_rounding", 0)),
        (
            pub.get("active_convention", "active"),
            active_by_convention[pub.get("active_convention", "active")],
            pub.get("active"),
            pub.get("active_rounding", 0) + pub.get("active_extra_tolerance", 0),
        ),
    ]
    return [
        f"{what}: exact {exact:,} vs published {published:,} (allowed +-{allowed:,})"
        for what, exact, published, allowed in checks
        if published is not None and abs(exact - published) > allowed
    ]


def describe_model(name: str) -> ModelReport:
    arch = resolve_model(name)
    return describe_architecture(arch, published_for(arch))


def model_summaries() -> list[ModelSummary]:
    out = []
    for key in catalog_keys():
        card: ModelCard = model_card(key)
        report = describe_architecture(catalog_architecture(key))
        out.append(ModelSummary(key=key, name=card.name, hf_id=card.hf_id, model_type=report.model_type,
                                family=card.family, total_params=report.total_params,
                                active_params=report.active_params))
    return out
