"""FLOP counts: Megatron's model-FLOP formula (for MFU) and the per-rank GEMM shapes (for time).

Two different questions, two functions. `model_flops_per_token` answers "how much useful work is a
token?" the way Megatron-LM's `num_floating_point_operations` does today (causal attention halved,
GQA, SwiGLU, top-k routed + shared experts, MLA, MTP, logits), so our MFU is comparable with
Megatron-Bridge's published numbers. `layer_gemms` answers "which matrix products does one rank
run?", because the achievable fraction of peak depends on those shapes, not on the FLOP total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshplan.schema.model import Architecture

# --------------------------------------------------------------------------- Megatron's model FLOPs


def _mlp_widths(arch: Architecture) -> tuple[float, float]:
    """(dense-layer width, MoE-layer width) of the FFN a token passes through, SwiGLU counted as 1.5x."""
    gated = 1.5 if arch.gated_mlp else 1.0
    dense = arch.ffn_hidden_size * gated
    if arch.moe is None:
        return dense, dense
    moe = (arch.moe.expert_ffn_hidden_size * arch.moe.top_k + arch.moe.shared_expert_ffn_hidden_size) * gated
    return dense, moe


def window_attended_keys(seq_length: float, window: int) -> float:
    """Keys a query attends to on average in a causal sliding-window layer of `window` tokens (itself included):
    min(position, window) over the sequence, w - w(w - 1) / 2s while w < s, else the causal half s/2 as full
    attention is counted. Megatron-Bridge's own count (training/utils/flop_utils.py calculate_swa_context, v0.5.0 on;
    its window is window_size[0] + window_size[1] + 1, the gpt-oss bridge's (sliding_window - 1, 0))."""
    s, w = float(seq_length), float(window)
    return w - w * (w - 1) / (2 * s) if w < s else s / 2


def tiled_window_keys(seq_length: float, window: int, block_m: int, block_n: int) -> float:
    """Keys per query a flash kernel computes in a causal sliding-window layer, whole tiles: query block m (block_m
    rows) runs key blocks floor((m block_m - (window - 1)) / block_n) (at least 0) to the one holding its last row
    (FlashAttention-2 compute_attn_1rowblock's n_block_min / n_block_max), block_n keys each, masked or not; the mean
    over the sequence's rows. Past the first blocks that is block_m + block_n x ceil((window - 1) / block_n): a
    128-token window on 128 x 128 tiles computes 256 keys a query where it attends 128."""
    s = float(seq_length)
    if window >= s:
        return window_attended_keys(s, window)
    blocks = math.ceil(s / block_m)

    def block(m: int) -> tuple[float, int, int]:
        """(rows, first key block, keys per row) of query block m."""
        first = max(0, (m * block_m - (window - 1)) // block_n)
        last = min(math.ceil(s / block_n), math.ceil((m + 1) * block_m / block_n))
        return min(block_m, s - m * block_m), first, (last - first) * block_n

    total = 0.0
    for m in range(blocks):
        rows, first, keys = block(m)
        total += rows * keys
        # from here every full block runs the same tiles, where a query block spans whole key blocks (each block
        # then moves both bounds by block_m / block_n); else the key blocks alternate and each is counted
        if first > 0 and block_m % block_n == 0 and m * block_m + 2 * block_m <= s:
            full = math.floor(s / block_m) - m - 1
            total += full * block_m * keys
            for tail in range(m + 1 + full, blocks):
                rows, _, keys = block(tail)
                total += rows * keys
            break
    return total / s


def chunk_attended_keys(seq_length: float, chunk: int) -> float:
    """Keys a query attends to on average in a chunked layer of `chunk` tokens (Llama 4's iRoPE RoPE layers:
    transformers masking_utils chunked_overlay, kv // chunk == q // chunk, under the causal mask): query i (1-based)
    sees ((i - 1) mod c) + 1 keys, so s = qc + r averages (q c(c + 1)/2 + r(r + 1)/2) / s while c < s, else the
    causal half s/2 as full attention is counted."""
    s, c = float(seq_length), float(chunk)
    if c >= s:
        return s / 2
    whole = math.floor(s / c)
    rest = s - whole * c
    return (whole * c * (c + 1) / 2 + rest * (rest + 1) / 2) / s


def attended_keys(arch: Architecture, seq_length: float, tiles: tuple[int, int] | None = None) -> float:
    """Keys a query attends to on average over the model's layers: s/2 in a full causal layer, window_attended_keys
    in each of its windowed ones (Architecture.windowed_layers), chunk_attended_keys in each chunked one
    (Architecture.chunked_layers). The one count every attention-core FLOP reads: the model FLOPs (MFU), the core's
    time and its weight-gradient share. `tiles` (the core's time only): the (block_m, block_n) a flash kernel runs a
    window with, the windowed layers at the whole tiles it computes (tiled_window_keys)."""
    full = seq_length / 2
    local, span = arch.local_attention
    if not local:
        return full
    assert span is not None
    if arch.windowed_layers:
        keys = (tiled_window_keys(seq_length, span, *tiles) if tiles is not None
                else window_attended_keys(seq_length, span))
    else:
        keys = chunk_attended_keys(seq_length, span)
    return (full * (arch.num_layers - local) + keys * local) / arch.num_layers


def _attention_per_layer(arch: Architecture, seq_length: int) -> float:
    """Megatron's self-attention term per token per layer, already x6 (fwd + wgrad + dgrad, FMA = 2), averaged over
    the layers: its core (the s-part) at the keys a query attends to (attended_keys), so windowed layers count their
    window as Megatron-Bridge's flop_utils counts them (transformer_flops' swa_core, v0.5.0 on; Megatron-LM's
    num_floating_point_operations, d98e8a6, counts every layer full)."""
    h, a = arch.hidden_size, arch.num_attention_heads
    s = 2 * attended_keys(arch, seq_length)  # the full causal count's s, or what the windows leave of it
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_head_dim
        q_term = h * a * qk if not m.q_lora_rank else m.q_lora_rank * (h + a * qk + 1)
        per_token = (
            q_term
            + m.kv_lora_rank * (h + a * (m.qk_nope_head_dim + m.v_head_dim) + 1)
            + h * m.qk_rope_head_dim
            + a * m.v_head_dim * h
            + s * a * qk / 2  # causal: only half of the score matrix is computed
            + s * a * m.v_head_dim / 2
        )
        return 6 * per_token
    q = arch.head_dim * a
    g = arch.num_kv_heads
    gate = 6 * h * q if arch.attention_output_gate else 0  # transformer_flops' gate_projection_size (x3 x2)
    return 12 * h * h * ((1 + g / a + s / h / 2) * (q / h)) + gate


def model_flops_per_token(arch: Architecture, seq_length: int, mtp_layers: int | None = None) -> float:
    """Model FLOPs of one training token (forward + backward), Megatron-LM's current formula.

    Source: NVIDIA/Megatron-LM megatron/training/training.py `num_floating_point_operations`
    (causal halving since 2025-03). A DSA model (DeepSeek-V3.2) counts as its MLA: that function has no DSA term
    (d98e8a6: DSA is no linear-attention variant, so it takes the multi_latent_attention branch, dense causal, no
    indexer), so its MFU divides by DeepSeek-V3's model FLOPs while the step runs the sparse core. MTP blocks
    (default: the architecture's) repeat the last layer's type and add their norms and 2h->h projection. Vocabulary
    is used unpadded.
    """
    if arch.layer_pattern is not None:  # a hybrid: Megatron-LM's hybrid_flops
        return hybrid_flops_per_token(arch, seq_length, arch.num_mtp_layers if mtp_layers is None else mtp_layers)
    mtp = arch.num_mtp_layers if mtp_layers is None else mtp_layers
    h = arch.hidden_size
    n_moe = len(arch.moe.moe_layers) if arch.moe else 0
    n_dense = arch.num_layers - n_moe
    last_is_moe = arch.is_moe_layer(arch.num_layers - 1)
    n_moe += mtp if last_is_moe else 0
    n_dense += 0 if last_is_moe else mtp
    dense_w, moe_w = _mlp_widths(arch)
    mlp = 12 * h * (dense_w * n_dense + moe_w * n_moe)
    attention = _attention_per_layer(arch, seq_length) * (arch.num_layers + mtp)
    mtp_extra = 6 * mtp * (3 * h + 2 * h * h)
    logits = 6 * h * arch.vocab_size * (mtp + 1)
    return float(mlp + attention + mtp_extra + logits)


def mamba_scan_flops(arch: Architecture) -> float:
    """Forward FLOPs per token of one Mamba-2 layer's scan as Megatron-LM's hybrid_flops counts them
    (mamba_layer_flops: 7 d N, d = 2h): no weight's GEMM, so a LoRA job's frozen base runs its backward in full
    (lora.frozen_flops_per_token); 0 without Mamba-2 layers."""
    return 7 * 2 * arch.hidden_size * arch.mamba.state_size if arch.mamba is not None else 0.0


def gdn_layer_flops(arch: Architecture) -> float:
    """Forward FLOPs per token of one Gated DeltaNet layer as Megatron-LM counts them for MFU
    (megatron/training/training.py gdn_layer_flops, core_v0.19.0): 2 x (in_proj h(2 qk + 2 v + 2 heads_v), conv1d
    kernel x (2 qk + v), the gated delta rule 4 x heads_v x d_v^2 (KK^T, VK^T, S(a(I - bKK^T)), SQ), out_proj h v);
    0 without Gated DeltaNet layers."""
    g = arch.gdn
    if g is None:
        return 0.0
    h = arch.hidden_size
    return 2.0 * (h * g.in_proj_width + g.conv_kernel * g.conv_dim + 4 * g.num_value_heads * g.value_head_dim ** 2
                  + h * g.value_dim)


def hybrid_flops_per_token(arch: Architecture, seq_length: int, mtp_depths: int = 0) -> float:
    """Model FLOPs of one training token of a hybrid model (forward + backward), as Megatron-LM counts them for MFU:
    megatron/training/training.py num_floating_point_operations -> hybrid_flops (d98e8a6), per token. Per layer kind:
    attention 4hp(h + hg/a) + 2shp (p = heads x head_dim / h; causal halving cancels the FMA's 2), MLP 4fh (x1.5
    gated), MoE 4h(f_e top-k + f_shared), Mamba-2 mamba_layer_flops: in_proj 2h(2d + 2GN + heads), scan 7dN, out_proj
    2dh, with d = 2h as Megatron takes it whatever the heads x head_dim (Nemotron-H's are 2h; Nemotron 3 Nano's are
    not); a latent MoE's routed experts at the latent width L plus its projections 4hL (moe_layer_flops); logits
    2hV for the model and each MTP depth, whose block's layers are counted once per depth as
    hybrid_layer_allocation.get_hybrid_layer_counts counts them (its eh_proj not); a Gated DeltaNet layer
    gdn_layer_flops, gated attention's gate as transformer_flops counts it for a GPTModel; all x3. The vocabulary
    unpadded, as model_flops_per_token takes it."""
    m, h, s = arch.mamba, arch.hidden_size, seq_length
    pattern = arch.layer_pattern or ""
    gated = 1.5 if arch.gated_mlp else 1.0
    p = arch.head_dim * arch.num_attention_heads / h
    attention = 4 * h * p * (h + h * arch.num_kv_heads / arch.num_attention_heads) + 2 * s * h * p
    mlp = 4 * arch.ffn_hidden_size * h * gated
    if arch.attention_output_gate:  # the gate's share of linear_qkv (transformer_flops' gate_projection_size)
        attention += 2 * h * p * h
    mamba = 0.0
    if m is not None:
        d_in = 2 * h
        mamba = 2 * h * (2 * d_in + 2 * m.n_groups * m.state_size + m.num_heads) + mamba_scan_flops(arch) \
            + 2 * d_in * h
    moe = 0.0
    if arch.moe is not None:
        e = arch.moe
        moe = 4 * (e.expert_width(h) * e.expert_ffn_hidden_size * e.top_k + h * e.shared_expert_ffn_hidden_size) \
            * gated + (4 * h * e.latent_size if e.latent_size else 0)
    pattern += (arch.mtp_layer_pattern or "") * mtp_depths
    forward = (pattern.count("*") * attention + pattern.count("-") * mlp + pattern.count("M") * mamba
               + pattern.count("G") * gdn_layer_flops(arch) + pattern.count("E") * moe
               + 2 * h * arch.vocab_size * (1 + mtp_depths))
    return 3.0 * forward


def _core_flops_per_key(arch: Architecture) -> float:
    """The attention core's FLOPs (softmax(QK^T)V, no weights) per token per layer per attended key, forward and
    backward: 6 x 2 x heads x (QK width + V width) / 2 as Megatron's attention term has it."""
    if arch.mla is not None:
        m = arch.mla
        return 6 * arch.num_attention_heads * (m.qk_head_dim + m.v_head_dim)
    return 12 * arch.head_dim * arch.num_attention_heads


def causal_core_flops(arch: Architecture, seq_length: int) -> float:
    """The attention core's FLOPs per token per layer, forward and backward, at the keys a query attends to
    (attended_keys: the causal half, or a window): the s-part of Megatron's attention term (_attention_per_layer).
    What the weight gradients' share leaves out."""
    return _core_flops_per_key(arch) * attended_keys(arch, seq_length)


def weight_gradient_share(arch: Architecture, seq_length: int) -> float:
    """The weight gradients' share of the model's backward FLOPs: each linear's backward runs a data-gradient GEMM
    and a weight-gradient GEMM of its forward's FLOPs each, the attention core (softmax(QK^T)V, no weights) two
    data-gradient passes, so W is linear / (2 x (linear + core)) of the backward. The terms are Megatron's
    (model_flops_per_token; the core is the s-part of its attention term, causal)."""
    core = causal_core_flops(arch, seq_length)
    total = model_flops_per_token(arch, seq_length, mtp_layers=0)
    return max(0.0, total - core * arch.num_layers) / (2 * total)


def model_flops_per_step(arch: Architecture, seq_length: int, global_batch_size: int) -> float:
    return model_flops_per_token(arch, seq_length) * seq_length * global_batch_size


def noncausal_flops_per_token(arch: Architecture, seq_length: int) -> float:
    """The pre-2025 convention (full s^2 attention at every layer, windows too), used by nanotron, the playbook and
    older papers: the model FLOPs with each layer's core at all s keys in place of the keys it attends to."""
    full = _core_flops_per_key(arch) * seq_length * arch.num_layers
    return model_flops_per_token(arch, seq_length, mtp_layers=0) - causal_core_flops(arch, seq_length) \
        * arch.num_layers + full


# --------------------------------------------------------------------------- verl's own FLOP count

# verl's flops_counter (volcengine/verl f6f910069 verl/utils/flops_counter.py FlopsCounter.estimate_func): the
# formula each Hugging Face model_type is counted by; any other model_type is counted 0 ("MFU will always be zero")
VERL_FLOPS_FORMULA = {**dict.fromkeys(("llama", "qwen2", "qwen2_vl", "qwen2_5_vl", "qwen3", "minicpmv", "minicpmo",
                                       "mistral"), "dense"),
                      "qwen2_moe": "moe", "qwen3_moe": "moe", "deepseek_v3": "deepseek_v3"}


def verl_flops(arch: Architecture, tokens: float, squares: float) -> float | None:
    """The forward + backward FLOPs verl's flops_counter counts for sequences of `tokens` tokens in all whose squared
    lengths sum to `squares` (volcengine/verl f6f910069 verl/utils/flops_counter.py: _estimate_qwen2_flops,
    _estimate_qwen2_moe_flops, _estimate_deepseek_v3_flops): 6 N tokens + 12 squares x (head width x heads) x layers,
    N every layer's linear weights a token passes (q, k, v, o; SwiGLU's three matrices of the dense width, or of top-k
    routed experts' with the router's h x E, DeepSeek-V3's shared experts and MLA's projections too) plus the
    embedding and the output layer (2 V h, the lookup counted as a matmul), attention at every key (non-causal),
    DeepSeek-V3's at the query head's width (qk_nope + qk_rope) for both of its products. None where verl counts the
    model_type 0 (gemma3's windows, which verl counts, are not read here: None)."""
    formula = VERL_FLOPS_FORMULA.get(arch.model_type)
    if formula is None:
        return None
    h, heads, layers = arch.hidden_size, arch.num_attention_heads, arch.num_layers
    embeddings = 2 * arch.vocab_size * h
    if formula == "deepseek_v3":
        mla, moe = arch.mla, arch.moe
        if mla is None or moe is None:
            return None
        q_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        attn = h * heads * q_head if mla.q_lora_rank is None else h * mla.q_lora_rank + heads * q_head * mla.q_lora_rank
        attn += h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        attn += heads * (q_head - mla.qk_rope_head_dim + mla.v_head_dim) * mla.kv_lora_rank
        attn += heads * mla.v_head_dim * h
        moe_layers = len(moe.moe_layers)
        experts = moe.expert_ffn_hidden_size * moe.top_k + moe.shared_expert_ffn_hidden_size
        routed = h * moe.num_experts + h * experts * 3
        weights = (routed + attn) * moe_layers + (h * arch.ffn_hidden_size * 3 + attn) * (layers - moe_layers)
        return 6 * (weights + embeddings) * tokens + 12 * squares * q_head * heads * layers
    attn = h * (2 * heads * arch.head_dim + 2 * arch.num_kv_heads * arch.head_dim)
    if formula == "moe":
        if arch.moe is None:
            return None
        mlp = h * arch.moe.top_k * arch.moe.expert_ffn_hidden_size * 3 + h * arch.moe.num_experts
    else:
        mlp = h * arch.ffn_hidden_size * 3
    return 6 * ((mlp + attn) * layers + embeddings) * tokens + 12 * squares * arch.head_dim * heads * layers


# --------------------------------------------------------------------------- per-rank GEMM shapes


@dataclass(frozen=True)
class Gemm:
    """One matrix product of the forward pass on one rank: (m x k) @ (k x n), run `count` times."""

    name: str
    m: float
    n: float
    k: float
    count: float = 1.0
    fp8: bool = True  # runs in FP8 under an FP8 recipe (transformer linears; not logits or router)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Shard:
    """How one rank's slice of a layer is cut: the layout terms the GEMM shapes depend on."""

    tokens: float  # tokens a rank's attention/MLP GEMMs see per micro-batch (b*s/cp, gathered over SP)
    tp: int
    ep: int
    etp: int
    sp: bool
    moe_whole: bool = False  # TP leaves the MoE block whole (the card's moe_tp): each TP rank runs it on every token

    def moe_view(self) -> Shard:
        """The shard an MoE block's router, experts and dispatcher see: this one, or where TP leaves the block whole
        (KempnerForge) the one of tp 1 without sequence parallelism (the same tokens, every weight whole)."""
        return replace(self, tp=1, sp=False, moe_whole=False) if self.moe_whole and self.tp > 1 else self

    @property
    def moe_tokens(self) -> float:
        """Tokens one rank routes per micro-batch: its sequence shard under SP, else every token."""
        return self.tokens / self.tp if self.sp or self.tp == 1 else self.tokens


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def attention_gemms(arch: Architecture, sh: Shard) -> list[Gemm]:
    h, a, t, T = arch.hidden_size, arch.num_attention_heads, sh.tp, sh.tokens
    heads = a / t
    if arch.mla is not None:
        m = arch.mla
        qk = m.qk_head_dim
        out = []
        if m.q_lora_rank:
            # Megatron-Core keeps the down-projections replicated across TP ranks.
            out += [Gemm("q_down", T, m.q_lora_rank, h), Gemm("q_up", T, heads * qk, m.q_lora_rank)]
        else:
            out.append(Gemm("q_proj", T, heads * qk, h))
        out += [
            Gemm("kv_down", T, m.kv_lora_rank + m.qk_rope_head_dim, h),
            Gemm("kv_up", T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
            Gemm("attn_out", T, h, heads * m.v_head_dim),
        ]
        # DSA's absorbed MLA folds kv_up into the query and the output (W_UK, W_UV per head): the same FLOPs per token
        return out + indexer_gemms(arch, sh)
    d = arch.head_dim
    kv_local = _ceil_div(arch.num_kv_heads, t) * d  # KV heads are replicated when there are fewer than TP ranks
    gate = heads * d if arch.attention_output_gate else 0  # linear_qkv also yields the output gate (Qwen3-Next)
    return [
        Gemm("qkv", T, heads * d + gate + 2 * kv_local, h),
        Gemm("attn_out", T, h, heads * d),
    ]


def dsa_attended_keys(seq_length: int, topk: int) -> float:
    """Keys a query attends to on average under DeepSeek Sparse Attention: min(position, index_topk), the position
    uniform over the causal sequence. s/2 while s <= topk (the causal half, as Megatron counts dense attention: no
    speed-up), topk - topk^2 / 2s beyond (topk itself as s grows: the paper's O(Lk) core)."""
    s, k = float(seq_length), float(topk)
    return s / 2 if s <= k else k - k * k / (2 * s)


def _attended_head_flops(arch: Architecture, sh: Shard, seq_length: int) -> float:
    """2 x each query's attended keys (dsa_attended_keys) x this rank's heads, per token: the FLOPs per dim of a
    product over the sparse core's (query head, attended key) pairs, which its scores and output and the indexer
    loss's target all run."""
    d = arch.dsa
    assert d is not None
    return 2.0 * sh.tokens * dsa_attended_keys(seq_length, d.index_topk) * (arch.num_attention_heads / sh.tp)


def dsa_core_flops(arch: Architecture, sh: Shard, seq_length: int) -> float:
    """Forward FLOPs of DSA's sparse attention core on one rank. Megatron-Core runs DSA on MLA absorbed
    (AbsorbedMLASelfAttention: W_UK folded into the query, MQA over the latent, W_UV after the core; NVIDIA/Megatron-LM
    d98e8a6 experimental_attention_variant/absorbed_mla.py, the paper's 'MQA mode of MLA'): each query head scores
    kv_lora + rope dims and sums kv_lora value dims per attended key (dsa_attended_keys)."""
    m = arch.mla
    assert m is not None
    return _attended_head_flops(arch, sh, seq_length) * (2 * m.kv_lora_rank + m.qk_rope_head_dim)


def indexer_score_flops(arch: Architecture, sh: Shard, seq_length: int) -> float:
    """Forward FLOPs of the lightning indexer's scores on one rank: every query against every preceding key (causal,
    s/2 on average) over index_n_heads heads of index_head_dim, then the ReLU'd scores weighted and summed over the
    heads (one FMA per head and pair). Every TP rank computes all heads on the sequence gathered over SP: the
    indexer's linears are duplicated (Megatron-Core DSAIndexer, parallel_mode "duplicated"), so no 1/tp."""
    d = arch.dsa
    assert d is not None
    return 2.0 * sh.tokens * (seq_length / 2) * d.index_n_heads * (d.index_head_dim + 1)


def dsa_loss_target_flops(arch: Architecture, sh: Shard, seq_length: int) -> float:
    """Forward FLOPs of the indexer loss's target on one rank: the main attention's scores (absorbed query against
    the latent key, kv_lora + rope dims per head) over the attended keys, summed over this rank's heads into the
    distribution the indexer's KL is taken against (the paper's sparse stage: the selected keys only; Megatron-Core
    dsa_indexer_use_sparse_loss)."""
    m = arch.mla
    assert m is not None
    return _attended_head_flops(arch, sh, seq_length) * (m.kv_lora_rank + m.qk_rope_head_dim)


def indexer_gemms(arch: Architecture, sh: Shard) -> list[Gemm]:
    """The indexer's three linears on one rank, whole on every TP rank over the tokens gathered over SP (Megatron-Core
    DSAIndexer: linear_wq_b q latent -> heads x head_dim, linear_wk hidden -> head_dim, linear_weights_proj hidden ->
    heads, all parallel_mode "duplicated"); none without DSA."""
    d, m = arch.dsa, arch.mla
    if d is None or m is None:
        return []
    return [Gemm("indexer_wq_b", sh.tokens, d.index_n_heads * d.index_head_dim, arch.indexer_query_input),
            Gemm("indexer_wk", sh.tokens, d.index_head_dim, arch.hidden_size),
            Gemm("indexer_weights_proj", sh.tokens, d.index_n_heads, arch.hidden_size, fp8=False)]


def attention_core_flops(arch: Architecture, sh: Shard, seq_length: int,
                         tiles: tuple[int, int] | None = None) -> float:
    """Forward FLOPs of causal softmax(QK^T)V on one rank: each query sees attended_keys keys on average (s/2, or
    a window's in windowed layers: flash kernels skip the tiles a window masks, so the window's FLOPs are what runs,
    in whole tiles where `tiles` gives the kernel's); DSA's sparse core where the model has it (dsa_core_flops; the
    indexer is indexer_score_flops)."""
    if arch.dsa is not None and arch.mla is not None:
        return dsa_core_flops(arch, sh, seq_length)
    heads = arch.num_attention_heads / sh.tp
    if arch.mla is not None:
        m = arch.mla
        width = m.qk_head_dim + m.v_head_dim
    else:
        width = 2 * arch.head_dim
    return 2.0 * sh.tokens * attended_keys(arch, seq_length, tiles) * heads * width


def mlp_gemms(arch: Architecture, sh: Shard, width: int, name: str, count: float = 1.0, rows: float | None = None,
              tp: int | None = None, hidden: int | None = None) -> list[Gemm]:
    """An FFN's two GEMMs reading and writing `hidden` channels (default the model's; a latent MoE's routed experts
    read its latent size)."""
    t = sh.tp if tp is None else tp
    T = sh.tokens if rows is None else rows
    h = arch.hidden_size if hidden is None else hidden
    up = (2 if arch.gated_mlp else 1) * width / t
    return [
        Gemm(f"{name}_fc1", T, up, h, count),
        Gemm(f"{name}_fc2", T, h, width / t, count),
    ]


def moe_gemms(arch: Architecture, sh: Shard) -> list[Gemm]:
    """Router, the local experts (balanced routing) and the shared experts of one MoE layer, as the block's shard cuts
    them (Shard.moe_view); a latent MoE's two projections over the tokens the rank routes, its experts at the latent
    width (Megatron-Core MoELayer.preprocess / postprocess)."""
    moe = arch.moe
    assert moe is not None
    sh = sh.moe_view()
    local_tokens = sh.moe_tokens
    # The ep*etp ranks of an expert block pool their tokens; each expert gets its top-k share of them.
    rows = sh.ep * sh.etp * local_tokens * moe.top_k / moe.num_experts
    out = [Gemm("router", local_tokens, moe.num_experts, arch.hidden_size, fp8=False)]
    if moe.latent_size:  # fc1_latent_proj before the dispatch, fc2_latent_proj after the combine: whole on each rank
        out += [Gemm("latent_down", local_tokens, moe.latent_size, arch.hidden_size),
                Gemm("latent_up", local_tokens, arch.hidden_size, moe.latent_size)]
    out += mlp_gemms(arch, sh, moe.expert_ffn_hidden_size, "expert", count=moe.num_experts / sh.ep, rows=rows,
                     tp=sh.etp, hidden=moe.expert_width(arch.hidden_size))
    if moe.shared_expert_ffn_hidden_size:
        out += mlp_gemms(arch, sh, moe.shared_expert_ffn_hidden_size, "shared_expert")
    return out


def logits_gemm(arch: Architecture, sh: Shard, vocab: int) -> Gemm:
    """The output layer's GEMM over `vocab` rows (the vocabulary the framework builds: memory_states.built_vocab)."""
    return Gemm("logits", sh.tokens, vocab / sh.tp, arch.hidden_size, fp8=False)
