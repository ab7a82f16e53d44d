"""Context parallelism's exposed traffic per layer: the K/V ring, Ulysses' all-to-alls, the all-gather, and the
hierarchical a2a+p2p, as Transformer Engine runs each beside the attention it feeds; torch's context_parallel ring as
torchtitan runs it (torch_ring_time: its copies and merges on the compute stream too); and DeepSpeed-Ulysses as
verl's and SkyRL's FSDP engines run it (rules/context.runs_ulysses), which the search's CP references read through
the same function."""

from __future__ import annotations

from functools import cache

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


def q_k_v_out_widths(arch: Architecture, tp: int) -> tuple[float, float, float, float]:
    """Elements per token of the query, key, value and attention output on one TP rank as Transformer Engine's
    attention takes them (K and V at kv_width's heads, MLA's per-head K nope + rope and V)."""
    heads = arch.num_attention_heads / tp
    if arch.mla is not None:
        m = arch.mla
        return heads * m.qk_head_dim, heads * m.qk_head_dim, heads * m.v_head_dim, heads * m.v_head_dim
    kv_heads = -(-arch.num_kv_heads // tp)
    return heads * arch.head_dim, kv_heads * arch.head_dim, kv_heads * arch.head_dim, heads * arch.head_dim


def te_a2a_time(ctx: LayerContext, group: Group) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's Transformer Engine all-to-alls per micro-batch over `group`
    (cp_comm_type a2a, and a2a+p2p's level inside the node), as flash_attn_a2a_communicate runs them (TE v2.3 5de3e148
    context_parallel.py; AttnFuncWithCPAndQKVOA2A and AttnFuncWithCPAndKVP2P alike): forward q, k and v before the
    attention and its output after, backward the output and its gradient before (the saved output goes back to the
    heads' layout) and dq, dk, dv after, one all_to_all_single each, not overlapped with the attention
    (te_a2a_widths). (0, 0) for a group of one."""
    if group.size <= 1:
        return 0.0, 0.0
    tokens, lk = ctx.shard.tokens, ctx.lk
    return tuple(sum(alltoall_time(tokens * w * BF16, group.size, group.stride, lk) for w in widths)
                 for widths in te_a2a_widths(ctx))  # type: ignore[return-value]


def te_a2a_widths(ctx: LayerContext) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Elements per token of the tensors Transformer Engine's CP all-to-alls move, (forward, backward): q, k, v and
    the output; the output, its gradient, dq, dk and dv."""
    q, k, v, out = q_k_v_out_widths(ctx.arch, ctx.plan.tp)
    return (q, k, v, out), (out, out, q, k, v)


def te_a2a_copies(ctx: LayerContext, group: Group) -> tuple[float, float]:
    """(forward, backward) seconds of the copies around Transformer Engine's CP all-to-alls
    (flash_attn_a2a_communicate): each tensor it moves (te_a2a_widths) copied twice on the compute and CP streams,
    its movedim(...).contiguous() and its sequence chunks' reorder (index_select), a copy's bf16 read and write each
    (TE_RING_COPY), at HBM bandwidth. (0, 0) for a group of one."""
    if group.size <= 1:
        return 0.0, 0.0
    fwd, bwd = te_a2a_widths(ctx)
    per_element = ctx.shard.tokens * 2 * TE_RING_COPY / ctx.hbm
    return sum(fwd) * per_element, sum(bwd) * per_element


def gathered_keys_attended(arch: Architecture, seq: int, c: int) -> float:
    """Keys the last CP rank's two chunks (c-1 and c, of 2c) attend in Transformer Engine's all-gathered K/V, in
    local K/Vs (2 chunks of seq / 2c), averaged over the layers (AttnFuncWithCPAndKVAllGather's
    kv_seq_range_per_step, get_kv_seq_info_after_all_gather): a full causal layer every key up to its chunk's end,
    c + c + 1 chunks; a windowed layer its chunk and the window before it, at most that (TE's window_size
    sliding_window - 1 to the left). The last rank's chunks end latest, so no rank attends more; a chunked layer is
    counted full."""
    chunk = seq / (2 * c)
    full = (2 * c + 1) * chunk
    windowed = arch.windowed_layers
    if not windowed:
        return full / (2 * chunk)
    span = chunk + (arch.sliding_window or 1) - 1
    local = min(c * chunk, span) + min((c + 1) * chunk, span)
    return (full * (arch.num_layers - windowed) + local * windowed) / arch.num_layers / (2 * chunk)


def te_gather_time(ctx: LayerContext, group: Group) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's Transformer Engine all-gather CP collectives per micro-batch
    (cp_comm_type allgather: AttnFuncWithCPAndKVAllGather, TE v2.3 5de3e148 context_parallel.py), none of them behind
    the attention: forward K and V all-gathered, one call each; backward K and V all-gathered again and dK and dV
    reduce-scattered, one call each."""
    _, k, v, _ = q_k_v_out_widths(ctx.arch, ctx.plan.tp)
    c, tokens, lk = ctx.plan.cp, ctx.shard.tokens, ctx.lk
    gather = sum(ring_time(c * tokens * w * BF16, group.size, group.stride, lk) for w in (k, v))
    return gather, 2 * gather


def te_gather_passes(ctx: LayerContext) -> tuple[float, float]:
    """(forward, backward) seconds of the copies and adds of Transformer Engine's all-gather CP at HBM bandwidth
    (TE_RING_*, a zero fill one bf16 write): forward the gathered K/V reordered into chunk order (index_select, a
    copy of c local K/Vs) and the output's halves copied into place; backward K/V reordered again, dK/dV zeroed at the
    gathered size, each local chunk's dK/dV added into the keys it attended (gathered_keys_attended), reordered back
    before the reduce-scatter, dq's halves copied into place."""
    c = ctx.plan.cp
    q, k, v, out = q_k_v_out_widths(ctx.arch, ctx.plan.tp)
    kv, tokens = k + v, ctx.shard.tokens
    attended = gathered_keys_attended(ctx.arch, ctx.seq, c)
    fwd_bytes = tokens * (kv * TE_RING_COPY * c + out * TE_RING_COPY)
    bwd_bytes = tokens * (kv * (BF16 * c + 2 * TE_RING_COPY * c + TE_RING_MERGE * attended) + q * TE_RING_COPY)
    return fwd_bytes / ctx.hbm, bwd_bytes / ctx.hbm


@cache  # a pure function of two small integers: each layer of each plan with a p2p ring asks every rank's
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
    q, k, v, out = q_k_v_out_widths(ctx.arch, ctx.plan.tp)
    kv = k + v
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
    Transformer Engine runs it (its memory-bound merges and copies apart: cp_passes): p2p a K/V ring overlapped
    step by step; a2a (Ulysses) q, k, v and the output re-sharded sequence <-> heads by
    all-to-alls, forward, and the output, its gradient, dq, dk, dv backward, not overlapped (te_a2a_time);
    allgather the K/V gathered forward, gathered again and dK/dV reduce-scattered backward, not overlapped
    (te_gather_time; DSA's own gather of its latent key, Megatron-Core's DSAttention, once each way); a2a+p2p the
    all-to-all over the CP ranks inside one node and a ring of the nodes (mesh.hierarchical_cp_sizes, what the
    adapters render as hierarchical_context_parallel_sizes), each ring step then carrying the same K/V bytes against
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
    if plan.cp_comm_type == "allgather":
        group = mesh_groups(plan, law=ctx.law).cp
        if arch.dsa is not None:  # DSA's own gather of its latent key, once each way
            one = ring_time(c * kv_bytes, group.size, group.stride, lk)
            return one, FORWARD_AND_BACKWARD * one
        gather_fwd, gather_bwd = te_gather_time(ctx, group)
        return gather_fwd, gather_fwd + gather_bwd
    a2a, ring = te_cp_groups(ctx)
    a2a_fwd, a2a_bwd = te_a2a_time(ctx, a2a)
    fwd, total = ring_exposed(p2p_time(kv_bytes, ring.crosses(lk.domain), lk), ring.size, attention_fwd,
                              attention_bwd, ctx.cal.cp_overlap)
    return fwd + a2a_fwd, total + a2a_fwd + a2a_bwd


def te_cp_groups(ctx: LayerContext) -> tuple[Group, Group]:
    """(all-to-all group, ring group) of Transformer Engine's cp_comm_type a2a, p2p and a2a+p2p (a level of one
    where the type has none): a2a the whole CP group, p2p the ring over it, a2a+p2p the node's all-to-all and the
    ring of the nodes (hierarchical_cp_groups)."""
    plan = ctx.plan
    group = mesh_groups(plan, law=ctx.law).cp
    if plan.cp_comm_type == "a2a+p2p":
        return hierarchical_cp_groups(plan, ctx.lk.node)
    if plan.cp_comm_type == "a2a":
        return group, Group(1, plan.tp * plan.cp)
    return Group(1, plan.tp), group


def cp_passes(ctx: LayerContext) -> tuple[float, float]:
    """(forward, forward + backward) seconds of one layer's memory-bound CP work per micro-batch on the compute and
    CP streams, by cp_comm_type as Transformer Engine runs it, apart from its traffic (cp_time): its p2p ring's merges
    and accumulations (te_ring_passes, over the ring level of a2a+p2p too), the copies around its all-to-alls
    (te_a2a_copies) and its all-gather's reorders and adds (te_gather_passes). Memory-bound work like a layer's
    other passes (layer_time adds them to its elementwise seconds, their forward to its forward compute), not
    exchange: none of them waits on a transfer the attention could hide. (0, 0) for one CP rank, for the engines
    that run Ulysses or torch's ring (their own terms are in cp_time) and for DSA's own gather."""
    plan = ctx.plan
    if plan.cp <= 1 or ctx.ulysses or ctx.torch_cp:
        return 0.0, 0.0
    if plan.cp_comm_type == "allgather":
        if ctx.arch.dsa is not None:
            return 0.0, 0.0
        fwd, bwd = te_gather_passes(ctx)
        return fwd, fwd + bwd
    a2a, ring = te_cp_groups(ctx)
    ring_fwd, ring_bwd = te_ring_passes(ctx, ring.size)
    copies_fwd, copies_bwd = te_a2a_copies(ctx, a2a)
    return ring_fwd + copies_fwd, ring_fwd + copies_fwd + ring_bwd + copies_bwd
