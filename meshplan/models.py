"""Model catalog, Hugging Face config.json ingestion and exact parameter counting.

A catalog card stores the fields of the model's own config.json, so a catalog entry and the same
model's config.json go through one parser (`architecture_from_config`) and can never disagree.
Counts are exact element counts of the checkpoint's tensors, by component, so every vendor's
"active" convention can be derived from one breakdown.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, TypeVar

from meshplan.cards import ModelCard, model_card, model_card_names
from meshplan.errors import MeshplanError, closest
from meshplan.schema import Architecture, ComponentCount, MLASpec, ModelReport, ModelSummary, MoESpec

T = TypeVar("T")

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


def _require(cfg: dict[str, Any], keys: list[str], model_type: str) -> None:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise MeshplanError(
            f"config.json of model_type {model_type!r} is missing required field(s): {', '.join(missing)}.",
            fix="Pass the model's complete Hugging Face config.json.",
        )


def _int(cfg: dict[str, Any], key: str, model_type: str) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MeshplanError(
            f"config.json field {key!r} of model_type {model_type!r} must be a non-negative integer, got {value!r}."
        )
    return value


def _moe_spec(cfg: dict[str, Any], model_type: str, num_layers: int) -> MoESpec | None:
    """Routed/shared experts and which layers are MoE, by each architecture's own rule."""
    if model_type in ("mixtral", "olmoe", "gpt_oss"):
        experts_key = "num_local_experts" if model_type != "olmoe" else "num_experts"
        _require(cfg, [experts_key, "num_experts_per_tok", "intermediate_size"], model_type)
        return MoESpec(
            num_experts=_int(cfg, experts_key, model_type),
            top_k=_int(cfg, "num_experts_per_tok", model_type),
            expert_ffn_hidden_size=_int(cfg, "intermediate_size", model_type),
            moe_layers=list(range(num_layers)),
            router_bias=model_type == "gpt_oss",
            expert_bias=model_type == "gpt_oss",
        )
    if model_type == "qwen3_moe":
        _require(cfg, ["num_experts", "num_experts_per_tok", "moe_intermediate_size"], model_type)
        step = cfg.get("decoder_sparse_step", 1) or 1
        dense_only = set(cfg.get("mlp_only_layers") or [])
        layers = [i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0]
        return MoESpec(
            num_experts=_int(cfg, "num_experts", model_type),
            top_k=_int(cfg, "num_experts_per_tok", model_type),
            expert_ffn_hidden_size=_int(cfg, "moe_intermediate_size", model_type),
            moe_layers=layers,
        )
    if model_type in ("llama4", "llama4_text"):
        _require(cfg, ["num_local_experts", "num_experts_per_tok", "intermediate_size"], model_type)
        step = cfg.get("interleave_moe_layer_step", 1) or 1
        layers = cfg.get("moe_layers")
        if layers is None:
            layers = list(range(step - 1, num_layers, step))
        return MoESpec(
            num_experts=_int(cfg, "num_local_experts", model_type),
            top_k=_int(cfg, "num_experts_per_tok", model_type),
            expert_ffn_hidden_size=_int(cfg, "intermediate_size", model_type),
            num_shared_experts=1,
            shared_expert_ffn_hidden_size=_int(cfg, "intermediate_size", model_type),
            moe_layers=list(layers),
        )
    if model_type in ("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe"):
        _require(cfg, ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"], model_type)
        first_dense = cfg.get("first_k_dense_replace", 0) or 0
        freq = cfg.get("moe_layer_freq", 1) or 1
        shared = cfg.get("n_shared_experts") or 0
        width = _int(cfg, "moe_intermediate_size", model_type)
        if "topk_method" in cfg:
            noaux = cfg["topk_method"] == "noaux_tc"
        else:  # transformers' DeepseekV3/Glm4Moe classes always carry e_score_correction_bias
            noaux = model_type in ("deepseek_v3", "kimi_k2", "glm4_moe")
        return MoESpec(
            num_experts=_int(cfg, "n_routed_experts", model_type),
            top_k=_int(cfg, "num_experts_per_tok", model_type),
            expert_ffn_hidden_size=width,
            num_shared_experts=shared,
            shared_expert_ffn_hidden_size=shared * width,
            moe_layers=[i for i in range(num_layers) if i >= first_dense and i % freq == 0],
            score_correction_bias=noaux,
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
    if model_type == "gpt2":
        _require(cfg, ["n_embd", "n_layer", "n_head", "vocab_size"], model_type)
        cfg.update(
            hidden_size=cfg["n_embd"],
            num_hidden_layers=cfg["n_layer"],
            num_attention_heads=cfg["n_head"],
            intermediate_size=cfg.get("n_inner") or 4 * cfg["n_embd"],
            max_position_embeddings=cfg.get("n_positions", 1024),
        )
    family = SUPPORTED_MODEL_TYPES[model_type]
    need = ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
    if family != "moe" or model_type in ("qwen3_moe", "llama4_text", "glm4_moe"):
        need.append("intermediate_size")
    _require(cfg, need, model_type)
    layers = _int(cfg, "num_hidden_layers", model_type)
    hidden = _int(cfg, "hidden_size", model_type)
    heads = _int(cfg, "num_attention_heads", model_type)
    if min(layers, hidden, heads) < 1:
        raise MeshplanError("num_hidden_layers, hidden_size and num_attention_heads must be positive.")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    dense_ffn = cfg.get("intermediate_size_mlp") if model_type == "llama4_text" else cfg.get("intermediate_size")
    moe = _moe_spec(cfg, model_type, layers)
    mla = None
    if family == "mla":
        _require(cfg, ["kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"], model_type)
        mla = MLASpec(
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
        )
        head_dim = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    if model_type in ("gpt_oss", "gpt2"):
        qkv_bias = o_bias = True
    elif model_type == "qwen2":
        qkv_bias, o_bias = True, False
    elif model_type == "glm4_moe":
        qkv_bias, o_bias = bool(cfg.get("attention_bias", False)), False
    else:
        qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
    if model_type in ("qwen3", "qwen3_moe"):
        qk_norm = "head"
    elif model_type == "olmoe":
        qk_norm = "full"
    elif model_type == "glm4_moe" and cfg.get("use_qk_norm"):
        qk_norm = "head"
    else:
        qk_norm = "none"  # llama4's qk norm is a weightless L2 norm
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "silu")
    gated = model_type not in ("gpt2", "nemotron")
    tied = cfg.get("tie_word_embeddings")
    if tied is None:
        tied = _TIED_DEFAULT.get(model_type, False)
    mtp = cfg.get("num_nextn_predict_layers") or 0 if model_type in ("deepseek_v3", "glm4_moe") else 0
    return Architecture(
        key=key,
        name=name or hf_id or cfg.get("_name_or_path") or f"{model_type} model",
        hf_id=hf_id,
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=dense_ffn or (moe.expert_ffn_hidden_size if moe else 4 * hidden),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=_int(cfg, "vocab_size", model_type),
        max_position_embeddings=cfg.get("max_position_embeddings"),
        tie_word_embeddings=bool(tied),
        gated_mlp=gated,
        activation=act,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=model_type == "gpt2" or bool(cfg.get("mlp_bias", False)),
        qk_norm=qk_norm,
        norm_type="layernorm" if model_type in _LAYERNORM_TYPES else "rmsnorm",
        norms_per_layer=_NORMS_PER_LAYER.get(model_type, 2),
        learned_position_embeddings=cfg["max_position_embeddings"] if model_type == "gpt2" else 0,
        attention_sinks=model_type == "gpt_oss",
        sliding_window=cfg.get("sliding_window"),
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
            "built (head_dim 128, 8 KV heads, SwiGLU FFN 3.5x hidden, vocab 128256). Pass a catalog key or a "
            "config.json for exact numbers."
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


def _generic_ffn(hidden: int) -> int:
    """Llama 3's FFN/hidden ratio (14336/4096 = 3.5), rounded to a multiple of 256."""
    return round(hidden * 3.5 / 256) * 256


def generic_architecture(size: float, label: str) -> Architecture:
    """A Llama-3-shaped dense model of about `size` parameters, with width/depth near Llama's ratio."""
    if not 1e7 <= size <= 1e14:
        raise MeshplanError(
            f"A generic model of {size:.3g} parameters is outside the supported 10M-100T range.",
            fix="Give a size such as '7B', '70B' or '1.5T', or a catalog model.",
        )
    vocab = 128256
    best: tuple[float, int, int] | None = None
    for hidden in range(512, 65537, 256):
        if hidden % 128:
            continue
        ffn = _generic_ffn(hidden)
        heads = hidden // 128
        kv = min(8, heads)
        per_layer = hidden * heads * 128 * 2 + 2 * hidden * kv * 128 + 3 * hidden * ffn + 2 * hidden
        layers = round((size - 2 * vocab * hidden) / per_layer)
        if layers < 2:
            continue
        params = layers * per_layer + 2 * vocab * hidden + hidden
        if abs(params - size) / size > 0.02:
            continue
        score = abs(math.log((hidden / layers) / 110.0))
        if best is None or score < best[0]:
            best = (score, hidden, layers)
    if best is None:
        raise MeshplanError(f"Could not shape a generic dense model of {size:.3g} parameters.")
    _, hidden, layers = best
    return Architecture(
        name=f"generic dense {label} (llama-shaped)",
        model_type="llama",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=_generic_ffn(hidden),
        num_attention_heads=hidden // 128,
        num_kv_heads=min(8, hidden // 128),
        head_dim=128,
        vocab_size=vocab,
        max_position_embeddings=131072,
        generic=True,
        origin=f"generic size {label}",
    )


# --------------------------------------------------------------------------- catalog and look-up


@cache
def _catalog_index() -> dict[str, str]:
    """Lower-cased key, hf_id and alias -> catalog key."""
    index: dict[str, str] = {}
    for key in model_card_names():
        card = model_card(key)
        for name in [card.key, card.hf_id, *card.aliases]:
            if name:
                index[name.lower()] = card.key
    return index


@cache
def catalog_architecture(key: str) -> Architecture:
    card = model_card(key)
    return architecture_from_config(card.config, name=card.name, key=card.key, hf_id=card.hf_id, origin="catalog")


def catalog_keys() -> list[str]:
    return model_card_names()


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a config.json safely: JSON only, size-capped, never executed, never fetched."""
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise MeshplanError(f"No config.json at {str(path)!r}.")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise MeshplanError(f"{str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes; that is not a config.json.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MeshplanError(f"{str(path)!r} is not valid JSON: {exc}.") from None
    if not isinstance(data, dict):
        raise MeshplanError(f"{str(path)!r} must hold a JSON object, not {type(data).__name__}.")
    return data


def _looks_like_path(name: str) -> bool:
    return name.endswith(".json") or ("/" in name and Path(name).exists()) or name.startswith((".", "~"))


@lru_cache(maxsize=256)
def resolve_model(name: str) -> Architecture:
    """A catalog key, HF id or alias (case-insensitive), a path to config.json, or a size such as '70B'."""
    if not isinstance(name, str) or not name.strip():
        raise MeshplanError("model must be a non-empty string.", fix="Try 'meshplan models' for the catalog.")
    name = name.strip()
    key = _catalog_index().get(name.lower())
    if key:
        return catalog_architecture(key)
    if _looks_like_path(name):
        path = Path(name).expanduser()
        return architecture_from_config(read_config_file(path), name=str(path), origin=f"config.json {path}")
    size = parse_size(name)
    if size is not None:
        return generic_architecture(size, name.upper().replace(" ", ""))
    hints = closest(name, list(_catalog_index()))
    hint_keys = list(dict.fromkeys(_catalog_index()[h] for h in hints))
    raise MeshplanError(
        f"Unknown model {name!r}.",
        fix=(f"Did you mean: {', '.join(hint_keys)}? " if hint_keys else "")
        + "Use a catalog key (meshplan models), a Hugging Face id, a path to a config.json, or a size like '70B'.",
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
