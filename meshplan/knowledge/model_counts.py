"""Exact parameter counts of an `Architecture`: element counts of the checkpoint's tensors by component, so every
vendor's "active" convention can be derived from one breakdown; and the per-architecture cache the estimators'
per-layer tables use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from meshplan.core.units import plural
from meshplan.schema.model import Architecture, ComponentCount

T = TypeVar("T")


def _norm_params(arch: Architecture, width: int) -> int:
    return width * (2 if arch.norm_type == "layernorm" else 1)


def attention_params(arch: Architecture) -> int:
    """One layer's attention block: projections, biases, q/k norms, sinks (no input norm)."""
    h, a, d, g = arch.hidden_size, arch.num_attention_heads, arch.head_dim, arch.num_kv_heads
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_head_dim
        if m.q_lora_rank:
            q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk  # q_a, q_a_layernorm, q_b
        else:
            q = h * a * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # kv_a_proj_with_mqa, kv_a_layernorm
        kv += m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)  # kv_b_proj
        return q + kv + a * m.v_head_dim * h + indexer_params(arch)
    params = h * a * d + 2 * h * g * d + a * d * h
    if arch.attention_output_gate:  # Qwen3NextAttention.q_proj: heads x head_dim x 2, query and gate
        params += h * a * d + (a * d if arch.qkv_bias else 0)
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


def indexer_params(arch: Architecture) -> int:
    """One layer's DSA lightning indexer (DeepSeek-V3.2-Exp inference/model.py Indexer; transformers'
    DeepseekV32Indexer and Megatron-Core's DSAIndexer build the same): wq_b q_lora_rank -> heads x head_dim, wk
    hidden -> head_dim, k_norm a LayerNorm over head_dim (weight and bias), weights_proj hidden -> heads; no biases.
    0 without DSA."""
    d = arch.dsa
    if d is None or arch.mla is None:
        return 0
    return (arch.indexer_query_input * d.index_n_heads * d.index_head_dim + arch.hidden_size * d.index_head_dim
            + 2 * d.index_head_dim + arch.hidden_size * d.index_n_heads)


def mlp_params(arch: Architecture, width: int, bias: bool | None = None, hidden: int | None = None) -> int:
    """A (gated or plain) FFN of the given width, reading and writing `hidden` channels (default the model's hidden
    size; a latent MoE's routed experts read its latent size, MoESpec.expert_width)."""
    h = arch.hidden_size if hidden is None else hidden
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
    if moe.shared_expert_gate:
        params += arch.hidden_size  # Qwen2MoeSparseMoeBlock.shared_expert_gate: Linear(hidden, 1, bias=False)
    return params


def latent_proj_params(arch: Architecture) -> int:
    """A latent MoE layer's two projections (Megatron-Core MoELayer fc1_latent_proj hidden -> latent and
    fc2_latent_proj latent -> hidden, TELinear parallel_mode "duplicated", no bias in Nemotron 3); 0 without."""
    moe = arch.moe
    if moe is None or moe.latent_size is None:
        return 0
    return 2 * arch.hidden_size * moe.latent_size


def mamba_params(arch: Architecture) -> int:
    """One Mamba-2 mixer (transformers' NemotronHMamba2Mixer): in_proj to z, x, B, C and dt, the depthwise conv1d over
    x, B and C with its bias, dt_bias, A_log and D per head, the gated RMSNorm over the inner width, out_proj."""
    m = arch.mamba
    assert m is not None
    h, inner = arch.hidden_size, m.d_inner
    in_proj = h * (inner + m.conv_dim + m.num_heads) + (inner + m.conv_dim + m.num_heads if m.proj_bias else 0)
    conv = m.conv_dim * m.conv_kernel + (m.conv_dim if m.conv_bias else 0)
    return in_proj + conv + 3 * m.num_heads + inner + inner * h + (h if m.proj_bias else 0)


def mamba_linear_params(arch: Architecture) -> int:
    """The weights of a Mamba-2 mixer's two linear layers, in_proj and out_proj (what fp8 copies and Muon treat as
    matrices; the conv1d, the per-head vectors and the norm are not)."""
    m = arch.mamba
    assert m is not None
    return arch.hidden_size * (m.d_inner + m.conv_dim + m.num_heads) + m.d_inner * arch.hidden_size


def gdn_params(arch: Architecture) -> int:
    """One Gated DeltaNet mixer (transformers' Qwen3NextGatedDeltaNet, Megatron-Core's GatedDeltaNet): in_proj_qkvz
    and in_proj_ba (hidden -> q, k, v, z and beta, alpha per value head; Megatron-Core's one in_proj), the depthwise
    conv1d over q, k and v without bias, dt_bias and A_log per value head, the gated RMSNorm over one value head's
    width (shared by every head), out_proj; no biases."""
    g = arch.gdn
    assert g is not None
    return gdn_linear_params(arch) + g.conv_dim * g.conv_kernel + 2 * g.num_value_heads + g.value_head_dim


def gdn_linear_params(arch: Architecture) -> int:
    """The weights of a Gated DeltaNet mixer's linear layers, in_proj and out_proj (what fp8 copies and Muon treat as
    matrices; the conv1d, the per-head vectors and the norm are not)."""
    g = arch.gdn
    assert g is not None
    return arch.hidden_size * (g.in_proj_width + g.value_dim)


def layer_params(arch: Architecture, index: int) -> dict[str, int]:
    """Parameters of decoder layer `index`, by component (routed experts counted in full). A hybrid model's layer
    holds its one mixer (arch.layer_pattern) beside its norm."""
    kind = arch.layer_kind(index)
    out = {
        "attention": attention_params(arch) if kind in ("block", "*") else 0,
        "norms": arch.norms_per_layer * _norm_params(arch, arch.hidden_size),
        "dense_mlp": 0,
        "routed_experts": 0,
        "shared_experts": 0,
        "router": 0,
        "latent_proj": 0,
    }
    if kind == "M":
        out["mamba"] = mamba_params(arch)
    elif kind == "G":
        out["gdn"] = gdn_params(arch)
    elif kind == "*":
        return out
    elif arch.is_moe_layer(index):
        moe = arch.moe
        assert moe is not None
        out["routed_experts"] = moe.num_experts * expert_params(arch)
        if moe.shared_expert_ffn_hidden_size:
            out["shared_experts"] = mlp_params(arch, moe.shared_expert_ffn_hidden_size, bias=False)
        out["router"] = router_params(arch)
        out["latent_proj"] = latent_proj_params(arch)
    else:
        out["dense_mlp"] = mlp_params(arch, arch.ffn_hidden_size)
    return out


def expert_params(arch: Architecture) -> int:
    """One routed expert (at the latent width in a latent MoE)."""
    moe = arch.moe
    assert moe is not None
    return mlp_params(arch, moe.expert_ffn_hidden_size, bias=moe.expert_bias,
                      hidden=moe.expert_width(arch.hidden_size))


def mtp_block_layers(arch: Architecture) -> list[dict[str, int]]:
    """The decoder layers of one MTP block, by component (layer_params'): DeepSeek-V3's one layer like the last
    decoder layer; a hybrid's, one per character of its mtp_layer_pattern (Megatron-Core's MultiTokenPredictionLayer
    with mtp_hybrid_override_pattern builds a hybrid stack of those layers; transformers' NemotronH names them
    mtp.layers.0, .1, ...)."""
    if arch.mtp_layer_pattern is None:
        return [layer_params(arch, arch.num_layers - 1)]
    first = {kind: arch.layer_pattern.index(kind) for kind in set(arch.mtp_layer_pattern)}
    return [layer_params(arch, first[kind]) for kind in arch.mtp_layer_pattern]


def mtp_weight_blocks(arch: Architecture) -> int:
    """The MTP blocks that hold weights: one per depth, or one for all of them under mtp_use_repeated_layer
    (Megatron-Core's MultiTokenPredictionBlock builds a single MultiTokenPredictionLayer and applies it
    mtp_num_layers times)."""
    return min(arch.num_mtp_layers, 1) if arch.mtp_repeated_layer else arch.num_mtp_layers


def mtp_params(arch: Architecture) -> int:
    """MTP blocks (DeepSeek-V3's, Megatron-Core's MultiTokenPredictionLayer): the embedding's and the hidden state's
    norms (enorm, hnorm), eh_proj (2h->h), the block's decoder layers, the shared head's norm; each block holding
    weights once (mtp_weight_blocks)."""
    if not arch.num_mtp_layers:
        return 0
    h = arch.hidden_size
    per_block = 3 * _norm_params(arch, h) + 2 * h * h + sum(sum(p.values()) for p in mtp_block_layers(arch))
    return mtp_weight_blocks(arch) * per_block


def vision_layer_params(arch: Architecture) -> int:
    """One Llama4VisionEncoderLayer (transformers 5.9.0 models/llama4/modeling_llama4.py): q/k/v/o_proj h ->
    heads x head_dim (head_dim = h // heads) with biases, the MLP fc1 h -> intermediate and fc2 back, both with
    biases, and two LayerNorms (weight and bias)."""
    v = arch.vision
    if v is None:
        return 0
    h, width = v.hidden_size, v.num_heads * (v.hidden_size // v.num_heads)
    attention = 3 * (h * width + width) + width * h + h
    mlp = h * v.intermediate_size + v.intermediate_size + v.intermediate_size * h + h
    return attention + mlp + 2 * 2 * h


def vision_params(arch: Architecture) -> int:
    """Llama 4's vision tower and multi-modal projector, as transformers 5.9.0 builds them beside the text model
    (Llama4ForConditionalGeneration: vision_model, multi_modal_projector): Llama4VisionModel's patch embedding
    (Llama4UnfoldConvolution's linear, channels x patch^2 -> h, no bias), class embedding (h), positional
    embedding ((image // patch)^2 + 1 rows of h), layernorm_pre and layernorm_post, its encoder layers
    (vision_layer_params) and its vision_adapter (Llama4VisionPixelShuffleMLP's mlp: fc1 intermediate ->
    projector_input_dim, fc2 projector_output_dim -> projector_output_dim, no biases); then the projector's linear_1
    (vision_output_dim -> the text hidden size, no bias). 0 without a vision tower."""
    v = arch.vision
    if v is None:
        return 0
    h = v.hidden_size
    embeddings = v.num_channels * v.patch_size ** 2 * h + h + ((v.image_size // v.patch_size) ** 2 + 1) * h
    adapter = v.intermediate_size * v.projector_input_dim + v.projector_output_dim ** 2
    return (embeddings + 2 * 2 * h + v.num_layers * vision_layer_params(arch) + adapter
            + v.vision_output_dim * arch.hidden_size)


def count_components(arch: Architecture) -> list[ComponentCount]:
    h, v = arch.hidden_size, arch.vocab_size
    sums: dict[str, int] = {}
    for i in range(arch.num_layers):
        for comp, n in layer_params(arch, i).items():
            sums[comp] = sums.get(comp, 0) + n
    moe_layers = len(arch.moe.moe_layers) if arch.moe else 0
    kinds = arch.layer_pattern or ""
    inactive = 0
    if arch.moe:
        inactive = moe_layers * (arch.moe.num_experts - arch.moe.top_k) * expert_params(arch)
    embed = v * h + (_norm_params(arch, h) if arch.embedding_norm else 0)
    comps = [
        ComponentCount(name="embedding", params=embed, active_params=embed,
                       note="input embedding (vocab x hidden)" + (" and its norm" if arch.embedding_norm else "")),
    ]
    if arch.learned_position_embeddings:
        n = arch.learned_position_embeddings * h
        comps.append(ComponentCount(name="position_embedding", params=n, active_params=n, note="learned positions"))
    comps.append(
        ComponentCount(name="attention", params=sums["attention"], active_params=sums["attention"],
                       note=plural(kinds.count('*') if kinds else arch.num_layers, "layer")
                       + (", MLA" if arch.mla else "")
                       + (f", each with a DSA indexer of {indexer_params(arch):,}" if arch.dsa else ""))
    )
    if sums.get("mamba"):
        comps.append(ComponentCount(name="mamba", params=sums["mamba"], active_params=sums["mamba"],
                                    note=plural(kinds.count('M'), "Mamba-2 mixer")))
    if sums.get("gdn"):
        comps.append(ComponentCount(name="gated_deltanet", params=sums["gdn"], active_params=sums["gdn"],
                                    note=plural(kinds.count('G'), "Gated DeltaNet mixer")))
    if sums["dense_mlp"]:
        n_dense = kinds.count("-") if kinds else arch.num_layers - moe_layers
        comps.append(ComponentCount(name="dense_mlp", params=sums["dense_mlp"], active_params=sums["dense_mlp"],
                                    note=plural(n_dense, "dense FFN layer")))
    if arch.moe:
        routed = sums["routed_experts"]
        comps.append(ComponentCount(
            name="routed_experts", params=routed, active_params=routed - inactive,
            note=f"{plural(moe_layers, 'MoE layer')} x {arch.moe.num_experts} experts, top-{arch.moe.top_k} active"))
        if sums["shared_experts"]:
            comps.append(ComponentCount(name="shared_experts", params=sums["shared_experts"],
                                        active_params=sums["shared_experts"]))
        comps.append(ComponentCount(name="router", params=sums["router"], active_params=sums["router"]))
        if sums["latent_proj"]:
            comps.append(ComponentCount(name="latent_projections", params=sums["latent_proj"],
                                        active_params=sums["latent_proj"],
                                        note=f"fc1/fc2_latent_proj, hidden <-> latent {arch.moe.latent_size}"))
    final_norm = _norm_params(arch, h)
    comps.append(ComponentCount(name="norms", params=sums["norms"] + final_norm,
                                active_params=sums["norms"] + final_norm, note="per-layer norms and the final norm"))
    if not arch.tie_word_embeddings or arch.output_bias:
        head = (0 if arch.tie_word_embeddings else v * h) + (v if arch.output_bias else 0)
        comps.append(ComponentCount(name="lm_head", params=head, active_params=head,
                                    note="untied output layer" + (" with its bias" if arch.output_bias else "")))
    return comps



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

