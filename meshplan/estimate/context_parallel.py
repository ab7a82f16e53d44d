"""Context parallelism's exposed traffic per layer: the K/V ring, Ulysses' all-to-alls, the all-gather, and the
hierarchical a2a+p2p, as Transformer Engine runs each beside the attention it feeds; torch's context_parallel ring as
torchtitan runs it (torch_ring_time: its copies and merges on the compute stream too); and DeepSpeed-Ulysses as
verl's and SkyRL's FSDP engines run it (rules/context.runs_ulysses), which the search's CP references read through
the same function."""

from __future__ import annotations

from meshplan.arithmetic.activations import ulysses_heads
from meshplan.arithmetic.comm import alltoall_time, p2p_time, ring_time
from meshplan.arithmetic.mesh import Group, hierarchical_cp_groups, mesh_groups
from meshplan.estimate.layer_records import BF16, FORWARD_AND_BACKWARD, LayerContext
from meshplan.schema.model import Architecture

# Ring attention (Transformer Engine AttnFuncWithCPAndKVP2P): each of the c-1 ring steps sends the K/V block on
# forward, K/V and dK/dV (one buffer of both) on backward, while the step's attention runs on the block at hand.
CP_RING_TRANSFERS_FORWARD = 1.0
CP_RING_TRANSFERS_BACKWARD = 2.0


# torch's context_parallel ring (TorchRingCp: _templated_ring_attention and its backward, the card's engine.torch_cp),
# HBM bytes per element its elementwise ops move on the compute stream, on the busiest rank (the last CP rank: every
# step i >= 1 runs all its queries, so its merges and dK/dV updates are whole, not partial), by tensor and pass. Per
# element of K and V (bf16 2 B, fp32 4 B): forward .contiguous() and each step's torch.cat read 2 and write 2, c of them
# (one copy, c-1 cats); backward fp32 zeros 4, .contiguous() 4, step 0's += 10 (read 4 + 2, write 4) and the cat of
# the fp32 dK/dV 8, the final bf16 cast 6, c-1 cats of K/V 4 each, and each step i >= 1's _partial_update (+= on the
# half: read 2 + 1, write 2; torch.cat: read 4, write 4) 13 and the fp32 cat 8.
TORCH_CP_KV_FWD_PER_STEP = 4.0
TORCH_CP_KV_BWD_FIXED = 4.0 + 4.0 + 10.0 + 8.0 + 6.0
TORCH_CP_KV_BWD_PER_STEP = 4.0 + 13.0 + 8.0
# Per element of the attention output: step 0's cast to fp32 (read 2, write 4) and the result's cast back (read 4,
# write 2); each step i >= 1 its cast 6, out - block_out 12, sigmoid(...) x that 8 and out - the product 12.
TORCH_CP_OUT_FWD_FIXED = 6.0 + 6.0
TORCH_CP_OUT_FWD_PER_STEP = 6.0 + 12.0 + 8.0 + 12.0
# Per element of the query: backward fp32 zeros 4, step 0's dQ += 10, the final bf16 cast 6; each step i >= 1's += 10.
TORCH_CP_Q_BWD_FIXED = 4.0 + 10.0 + 6.0
TORCH_CP_Q_BWD_PER_STEP = 10.0
FP32 = 4.0

# Transformer Engine's p2p ring (AttnFuncWithCPAndKVP2P, NVIDIA/TransformerEngine v2.3 5de3e148
# transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py), bf16 in Megatron-Core's sbhd, causal
# with DualChunkSwap (rank r holds chunks r and 2c-1-r): ring step 0 runs its own two chunks causally, steps 1..r the
# whole q against the first K/V half, steps r+1..c-1 the second q half against the whole K/V (backward: steps
# i >= c-1-r whole q and first K/V half, the rest second q half and whole K/V). Besides each step's kernel, the compute
# stream copies and merges whole tensors or their halves (in sbhd a half is a contiguous view, so no .contiguous()
# copies): a copy reads and writes bf16, a merge x.add_(y) reads two and writes one (flash_attn_fwd_out_correction's
# out.add_(out_step x exp(lse_step - lse)) too: the log-sum-exp it reads, one value a row and head, is left out, as are
# the double-precision lse merges on it, a few percent of these bytes).
TE_RING_COPY = 2 * BF16
TE_RING_MERGE = 3 * BF16


def kv_width(arch: Architecture, tp: int) -> float:
    """K plus V elements per token held by one TP rank (what CP exchanges). MLA sends its up-projected per-head K
    (nope + rope) and V, not the compressed latent: Megatron-Core's MLASelfAttention hands the expanded key and value
    to TE's DotProductAttention, whose CP ring concatenates k and v into one send buffer."""
    if arch.mla is not None and arch.dsa is not None:
        # DSA on absorbed MLA (Megatron-Core DSAttention, cp_comm_type allgather only) gathers the one latent key,
        # kv_lora + rope wide, whose first kv_lora dims are the value (core_attention(value=None)), and the indexer's
        # key: whole on every TP rank
        m = arch.mla
        return m.kv_lora_rank + m.qk_rope_head_dim + arch.dsa.index_head_dim
    if arch.mla is not None:
        m = arch.mla
        return arch.num_attention_heads / tp * (m.qk_head_dim + m.v_head_dim)
    return 2 * (-(-arch.num_kv_heads // tp)) * arch.head_dim


def q_out_width(arch: Architecture, tp: int) -> float:
    """Query plus attention-output elements per token on one TP rank (what Ulysses re-shards besides K/V)."""
    heads = arch.num_attention_heads / tp
    if arch.mla is not None:
        m = arch.mla
        return heads * (m.qk_head_dim + m.v_head_dim)
    return 2 * heads * arch.head_dim


def te_ring_pass_bytes(c: int, rank: int) -> tuple[float, float, float, float]:
    """Bytes per element of CP rank `rank`'s whole chunk that Transformer Engine's causal p2p ring of `c` ranks moves
    on the compute stream besides its attention kernels, as (attention output forward, K/V forward, dQ backward,
    dK/dV backward) (TE_RING_*): forward k and v cat into the first send buffer; the output merged after the ring,
    step 0's out_per_step scaled into it (flash_attn_fwd_out_correction_init, a copy's traffic), each later step's
    added, whole for steps 1..rank, its second half for the rest. Backward K/V copied into the send buffer; each
    step's dq_ copied or added into dq, dkv_ into the dK/dV buffer that travels with K/V, whole or half as the
    step's chunks (AttnFuncWithCPAndKVP2P.backward's branches, bf16: no fp32 accumulator)."""
    out = TE_RING_COPY + sum(TE_RING_MERGE * (1.0 if i <= rank else 0.5) for i in range(1, c))
    dq = dkv = 0.0
    for i in range(c):
        whole_q = i >= c - rank - 1
        if i > c - rank - 1:
            dq += TE_RING_MERGE
        elif i == c - rank - 1:
            dq += TE_RING_COPY if rank == c - 1 else (TE_RING_COPY + TE_RING_MERGE) / 2
        else:
            dq += (TE_RING_MERGE if i > 0 else TE_RING_COPY) / 2
        if i == c - 1:
            dkv += (TE_RING_MERGE + TE_RING_COPY) / 2 if rank == 0 else TE_RING_MERGE
        elif whole_q:
            dkv += (TE_RING_COPY if i == 0 and rank == c - 1 else TE_RING_MERGE) / 2
        else:
            dkv += TE_RING_MERGE if i > 0 else TE_RING_COPY
    return out, TE_RING_COPY, dq, TE_RING_COPY + dkv


def te_ring_passes(ctx: LayerContext, c: int) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's Transformer Engine p2p ring passes per micro-batch at HBM bandwidth
    (te_ring_pass_bytes), on the rank with the most of each (the ranks meet again at the next collective): the
    attention output and dQ at the query heads' widths (MLA: v_head_dim and qk_head_dim), K/V at kv_width. The
    ranks' chunks hold the same elements under a2a+p2p, its all-to-all trading tokens for heads; (0, 0) for one
    rank."""
    if c <= 1:
        return 0.0, 0.0
    arch, tp = ctx.arch, ctx.plan.tp
    heads = arch.num_attention_heads / tp
    out = heads * (arch.mla.v_head_dim if arch.mla is not None else arch.head_dim)
    q = heads * (arch.mla.qk_head_dim if arch.mla is not None else arch.head_dim)
    kv = kv_width(arch, tp)
    fwd = bwd = 0.0
    for rank in range(c):
        out_b, kv_fwd_b, dq_b, dkv_b = te_ring_pass_bytes(c, rank)
        fwd = max(fwd, out * out_b + kv * kv_fwd_b)
        bwd = max(bwd, q * dq_b + kv * dkv_b)
    tokens = ctx.shard.tokens
    return tokens * fwd / ctx.hbm, tokens * bwd / ctx.hbm


def ring_exposed(hop_s: float, steps: int, attention_fwd: float, attention_bwd: float,
                 overlap: float = 1.0) -> tuple[float, float]:
    """(forward, forward + backward) exposed seconds of a K/V ring of `steps` ranks: in each of the steps-1 ring steps
    the next block's transfer runs while the current block's attention computes, so each step exposes only what the
    transfer takes beyond `overlap` (cp_overlap) of that step's attention. Causal load balancing (TE's DualChunkSwap:
    each rank holds chunks i and 2c-1-i) gives every step the same attention work, 1/steps of the rank's."""
    if steps <= 1:
        return 0.0, 0.0
    fwd = (steps - 1) * max(0.0, CP_RING_TRANSFERS_FORWARD * hop_s - overlap * attention_fwd / steps)
    bwd = (steps - 1) * max(0.0, CP_RING_TRANSFERS_BACKWARD * hop_s - overlap * attention_bwd / steps)
    return fwd, fwd + bwd


def ulysses_widths(arch: Architecture, degree: int, v_pad: bool) -> tuple[float, float, float, float]:
    """Elements per token of q, k, v and the attention output that one rank re-shards between sequence and heads:
    every head of its tokens (no TP on those engines), K/V at ulysses_heads; MLA's per-head K (nope + rope) and V
    as the Hugging Face attention hands them to flash attention (`v_pad`: V, and so the output, padded to the QK
    head width first, the convention's mla_v_pad; the output is sliced back only after its all-to-all)."""
    if arch.mla is not None:
        m = arch.mla
        qk = arch.num_attention_heads * m.qk_head_dim
        v = qk if v_pad else arch.num_attention_heads * m.v_head_dim
        return qk, qk, v, v
    heads, kv = arch.num_attention_heads * arch.head_dim, ulysses_heads(arch.num_kv_heads, degree) * arch.head_dim
    return heads, kv, kv, heads


def ulysses_time(ctx: LayerContext) -> float:
    """Forward seconds of one layer's Ulysses all-to-alls per micro-batch (the backward runs the same ones on the
    gradients: SeqAllToAll's backward): verl's and SkyRL's _ulysses_flash_attention_forward sends q, k and v through
    one all-to-all each (gather_seq_scatter_heads) before flash attention and its output through another after
    (gather_heads_scatter_seq), one after another on the compute stream, nothing overlapped."""
    group = mesh_groups(ctx.plan, law=ctx.law).cp
    tokens, lk = ctx.shard.tokens, ctx.lk
    return sum(alltoall_time(tokens * width * BF16, group.size, group.stride, lk)
               for width in ulysses_widths(ctx.arch, ctx.plan.cp, ctx.mla_v_pad))


def torch_ring_time(ctx: LayerContext, attention_fwd: float, attention_fwd_bwd: float) -> tuple[float, float]:
    """(forward, forward + backward) seconds one layer's torch context_parallel ring adds per micro-batch beside its
    attention (the card's engine.torch_cp, TorchRingCp; the plan's cp_comm_type is not read: torch's rotate method,
    ALL_GATHER by default, is): the elementwise copies, fp32 casts, log-sum-exp merges and dK/dV accumulations it runs
    on the compute stream at HBM bandwidth (TORCH_CP_*, on the last CP rank); the K/V all-gather, issued before step
    0's attention and exposed only beyond it (1/c of the rank's attention: the head-tail balance gives every step the
    same work), forward and again backward; each step's fp32 dK/dV permute hidden behind the next step's attention
    backward but the last, waited with nothing after it. K and V at the query heads' width where the release repeats
    them before SDPA (LayerContext.kv_repeated)."""
    plan, arch, lk = ctx.plan, ctx.arch, ctx.lk
    c = plan.cp
    heads = arch.num_attention_heads / plan.tp
    kv = 2 * heads * arch.head_dim if ctx.kv_repeated else kv_width(arch, plan.tp)  # K + V elements per token
    out = heads * (arch.mla.v_head_dim if arch.mla is not None else arch.head_dim)
    q = heads * (arch.mla.qk_head_dim if arch.mla is not None else arch.head_dim)
    tokens, steps = ctx.shard.tokens, c - 1
    fwd_bytes = tokens * (kv * TORCH_CP_KV_FWD_PER_STEP * c
                          + out * (TORCH_CP_OUT_FWD_FIXED + TORCH_CP_OUT_FWD_PER_STEP * steps))
    bwd_bytes = tokens * (kv * (TORCH_CP_KV_BWD_FIXED + TORCH_CP_KV_BWD_PER_STEP * steps)
                          + q * (TORCH_CP_Q_BWD_FIXED + TORCH_CP_Q_BWD_PER_STEP * steps))
    group = mesh_groups(plan, law=ctx.law).cp
    gather = ring_time(c * tokens * kv * BF16, group.size, group.stride, lk)
    hop = p2p_time(tokens * kv * FP32, group.crosses(lk.domain), lk)
    attention_bwd = attention_fwd_bwd - attention_fwd
    fwd = fwd_bytes / ctx.hbm + max(0.0, gather - attention_fwd / c)
    bwd = (bwd_bytes / ctx.hbm + max(0.0, gather - attention_bwd / c)
           + steps * max(0.0, hop - attention_bwd / c) + hop)
    return fwd, fwd + bwd


def cp_time(ctx: LayerContext, attention_fwd: float, attention_fwd_bwd: float) -> tuple[float, float]:
    """(forward, forward + backward) exposed CP traffic of one layer per micro-batch, by cp_comm_type as
    Transformer Engine runs it: p2p a K/V ring overlapped step by step; a2a (Ulysses) q, k, v and the output
    re-sharded sequence <-> heads by all-to-alls, forward and (dout; dq, dk, dv) backward, not overlapped;
    allgather the K/V gathered forward and dK/dV reduce-scattered backward, not overlapped; a2a+p2p the all-to-all
    over the CP ranks inside one node and a ring of the nodes (mesh.hierarchical_cp_sizes, what the adapters
    render as hierarchical_context_parallel_sizes), each ring step then carrying the same K/V bytes against
    a2a-size times the attention. Where the engine runs Ulysses (ctx.ulysses: runs_ulysses), its own all-to-alls
    (ulysses_time) whatever cp_comm_type says; where it runs torch's context_parallel (ctx.torch_cp), that ring
    (torch_ring_time)."""
    plan, arch, lk = ctx.plan, ctx.arch, ctx.lk
    c = plan.cp
    if c <= 1:
        return 0.0, 0.0
    if ctx.ulysses:
        one = ulysses_time(ctx)
        return one, FORWARD_AND_BACKWARD * one
    if ctx.torch_cp:
        return torch_ring_time(ctx, attention_fwd, attention_fwd_bwd)
    tokens = ctx.shard.tokens
    kv_bytes = tokens * kv_width(arch, plan.tp) * BF16
    attention_bwd = attention_fwd_bwd - attention_fwd
    group = mesh_groups(plan, law=ctx.law).cp
    if plan.cp_comm_type == "allgather":
        one = ring_time(c * kv_bytes, group.size, group.stride, lk)
        return one, FORWARD_AND_BACKWARD * one
    a2a, ring = (group, Group(1, plan.tp * c)) if plan.cp_comm_type == "a2a" else (Group(1, plan.tp), group)
    if plan.cp_comm_type == "a2a+p2p":
        a2a, ring = hierarchical_cp_groups(plan, lk.node)
    a2a_one = alltoall_time(tokens * (q_out_width(arch, plan.tp) + kv_width(arch, plan.tp)) * BF16,
                            a2a.size, a2a.stride, lk)
    fwd, total = ring_exposed(p2p_time(kv_bytes, ring.crosses(lk.domain), lk), ring.size, attention_fwd,
                              attention_bwd, ctx.cal.cp_overlap)
    passes_fwd, passes_bwd = te_ring_passes(ctx, ring.size)
    return fwd + passes_fwd + a2a_one, total + passes_fwd + passes_bwd + FORWARD_AND_BACKWARD * a2a_one
