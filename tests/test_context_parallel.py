"""Context parallelism's step-time terms (meshplan/estimate/context_parallel.py cp_time, ring_exposed): exact
cases of the ring's per-step overlap, the K/V bytes each attention kind sends, and how each cp_comm_type places
its traffic."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.activations import ulysses_heads
from meshplan.arithmetic.comm import alltoall_time, job_links, ring_time
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.context_parallel import (
    cp_passes,
    cp_time,
    gathered_keys_attended,
    kv_width,
    q_k_v_out_widths,
    ring_exposed,
    te_a2a_copies,
    te_a2a_time,
    te_gather_passes,
    te_gather_time,
    te_ring_pass_bytes,
    te_ring_passes,
    ulysses_widths,
)
from meshplan.estimate.perf import _step_context, estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def estimate(**fields):
    job, plan = resolve(Request(**fields))
    return estimate_throughput(job, plan)


def test_ring_exposes_per_step_what_the_transfer_takes_beyond_that_steps_attention():
    """4 ranks, a 1 s hop: forward each of the 3 steps sends K/V (1 s) against 2/4 s of attention, backward K/V +
    dK/dV (2 s) against 6/4 s: 3 x 0.5 each way."""
    assert ring_exposed(1.0, 4, 2.0, 6.0) == (1.5, 3.0)
    # forward hidden (1 s of transfer behind 8/4 s of attention), backward not (2 s against 6/4 s)
    assert ring_exposed(1.0, 4, 8.0, 6.0) == (0.0, 1.5)
    # the whole exchange against the whole attention would hide everything here (9 s of transfer, 14 s of attention)
    assert ring_exposed(1.0, 4, 8.0, 6.0)[1] > 0.0
    assert ring_exposed(1.0, 4, 100.0, 100.0) == (0.0, 0.0)
    assert ring_exposed(5.0, 1, 0.0, 0.0) == (0.0, 0.0)
    # cp_overlap 0: every transfer exposed, 3 steps x (1 + 2) s
    assert ring_exposed(1.0, 4, 8.0, 6.0, overlap=0.0) == (3.0, 9.0)


def test_kv_bytes_gqa_shares_heads_mla_sends_expanded_heads():
    """GQA sends its K/V heads (8 x 128, twice), a TP rank at least one of each; MLA sends per-head K (nope 128 +
    rope 64) and V (128) for its 128 heads, not the 512 + 64 latent."""
    llama, dsv3 = resolve_model("llama-3.1-8b"), resolve_model("deepseek-v3")
    assert kv_width(llama, 1) == 2 * 8 * 128
    assert kv_width(llama, 16) == 2 * 1 * 128
    assert kv_width(dsv3, 1) == 128 * (128 + 64 + 128)
    assert kv_width(dsv3, 8) == 16 * (128 + 64 + 128)
    assert q_k_v_out_widths(llama, 1) == (32 * 128, 8 * 128, 8 * 128, 32 * 128)
    assert q_k_v_out_widths(llama, 16) == (2 * 128, 128, 128, 2 * 128)
    assert q_k_v_out_widths(dsv3, 1) == (128 * 192, 128 * 192, 128 * 128, 128 * 128)


LONG = dict(model="llama-3.1-8b", num_gpus=32, gpus_per_node=8, tp=1, cp=32, seq_length=131072, global_batch_size=4)


def test_a2a_plus_p2p_rings_the_domains_and_exposes_less_than_the_flat_ring():
    """CP 32 over 4 nodes: the flat ring waits on a cross-node hop at every one of its 31 steps with 1/32 of the
    attention behind each; a2a+p2p all-to-alls inside the node and rings the 4 nodes, the same K/V bytes per hop
    behind 1/4 of the attention each."""
    p2p = estimate(**LONG, cp_comm_type="p2p").breakdown.cp_comm_s
    hier = estimate(**LONG, cp_comm_type="a2a+p2p").breakdown.cp_comm_s
    assert 0.0 < hier < p2p


def test_a2a_plus_p2p_inside_one_domain_is_ulysses():
    """With every CP rank in one NVLink domain there is no ring level: a2a+p2p times as a2a."""
    inside = dict(LONG, num_gpus=8, cp=8, seq_length=32768)
    a2a = estimate(**inside, cp_comm_type="a2a").breakdown.cp_comm_s
    assert a2a > 0.0
    assert estimate(**inside, cp_comm_type="a2a+p2p").breakdown.cp_comm_s == pytest.approx(a2a)


def test_ring_inside_a_node_hides_behind_long_attention():
    """8 ranks on NVLink at 32K tokens each: every hop (~134 MB at NVLink speed) is shorter than a step's attention,
    so the ring exposes nothing, while the same job's all-gather (not overlapped) does. Its merges and accumulations
    are the layer's memory-bound work (cp_passes: 32 layers, 1 micro-batch per rank), in compute."""
    inside = dict(LONG, num_gpus=8, cp=8, seq_length=262144)
    ring = estimate(**inside, cp_comm_type="p2p")
    assert ring.breakdown.cp_comm_s == 0.0
    assert estimate(**inside, cp_comm_type="allgather").breakdown.cp_comm_s > 0.0
    job, plan = resolve(Request(**inside, cp_comm_type="p2p"))
    *_, ctx = _step_context(job, plan, calibration(job.framework))
    fwd, total = cp_passes(ctx)
    assert (fwd, total - fwd) == te_ring_passes(ctx, 8)
    without = estimate_throughput(job, plan.model_copy(update={"cp_comm_type": "a2a"}))  # same tokens, no ring
    assert ring.breakdown.compute_s > without.breakdown.compute_s


def test_te_ring_bytes_per_element_follow_its_branches():
    """TransformerEngine v2.3 AttnFuncWithCPAndKVP2P, bf16, causal, sbhd: a copy moves 4 B an element, a merge
    (x.add_(y)) 6. Two ranks: rank 0 merges its second output half only (4 + 3), rank 1 the whole (4 + 6); dQ the
    same (rank 0: half copy 2, then half copy + half add 5; rank 1: copy 4, add 6); dK/dV after the send buffer's
    copy (4): rank 0 copies it whole (4), then half adds, half copies (5); rank 1 copies the first half (2), then
    adds the whole (6). K/V's cat into the first send buffer, 4, forward. The last rank's output and dQ grow by a
    whole merge a step: 4 + 6 (c - 1)."""
    assert te_ring_pass_bytes(2, 0) == (7.0, 4.0, 7.0, 13.0)
    assert te_ring_pass_bytes(2, 1) == (10.0, 4.0, 10.0, 12.0)
    for c in (4, 8, 32):
        out, kv, dq, _ = te_ring_pass_bytes(c, c - 1)
        assert out == dq == 4 + 6 * (c - 1)
        assert kv == 4
        assert te_ring_pass_bytes(c, 0)[0] == 4 + 3 * (c - 1)  # rank 0 merges second halves only
        assert te_ring_pass_bytes(c, 0)[3] == 4 + 4 + 6 * (c - 2) + 5  # whole adds but the last's half copy


def test_te_ring_passes_take_each_pass_on_its_busiest_rank_at_hbm_bandwidth():
    """Llama 3.1 8B, cp 4, tp 1, 32,768 tokens a rank: output and dQ 32 x 128 elements a token, K/V 2 x 8 x 128.
    Forward on the last rank: output 4 + 18, K/V 4. Backward the most over the ranks of dQ and dK/dV together."""
    job, plan = resolve(Request(**dict(LONG, num_gpus=4, cp=4, seq_length=131072, global_batch_size=1)))
    *_, ctx = _step_context(job, plan, calibration(job.framework))
    tokens, heads, kv = 32768, 32 * 128, 2 * 8 * 128
    fwd, bwd = te_ring_passes(ctx, 4)
    assert fwd == pytest.approx(tokens * (heads * 22 + kv * 4) / ctx.hbm)
    most = max(heads * te_ring_pass_bytes(4, r)[2] + kv * te_ring_pass_bytes(4, r)[3] for r in range(4))
    assert bwd == pytest.approx(tokens * most / ctx.hbm)
    assert te_ring_passes(ctx, 1) == (0.0, 0.0)


def test_hierarchical_sizes_are_what_the_adapters_render_and_what_is_timed():
    """The a2a level is the largest divisor of cp beside tp in one node (12 ranks on 8-GPU nodes: 6 x 2, not 4 x 3);
    the Megatron adapter renders those sizes and the step time rings over the second."""
    from meshplan.adapters.common import hierarchical_cp
    from meshplan.arithmetic.mesh import hierarchical_cp_sizes

    assert hierarchical_cp_sizes(32, 1, 8) == (8, 4)
    assert hierarchical_cp_sizes(12, 1, 8) == (6, 2)
    assert hierarchical_cp_sizes(8, 2, 8) == (4, 2)
    assert hierarchical_cp_sizes(4, 16, 8) == (1, 4)  # TP fills more than a node: no a2a level
    job, plan = resolve(Request(**LONG, cp_comm_type="a2a+p2p"))
    assert hierarchical_cp(job, plan) == [8, 4]


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_ulysses_engines_time_cp_as_all_to_alls(framework):
    """verl's and SkyRL's FSDP engines run cp as Ulysses sequence parallelism (all-to-alls, not overlapped), but the
    step time timed it as the default p2p K/V ring, hidden behind the attention at 32K: cp comm 0 s. Their Megatron
    engine keeps Transformer Engine's ring."""
    common = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, cp=2, seq_length=32768, global_batch_size=64,
                  framework=framework, job="sft")
    ulysses = estimate(**common, zero_stage=3).breakdown.cp_comm_s
    assert ulysses > 0.0
    _, plan = resolve(Request(**common, zero_stage=3))
    assert plan.cp_comm_type == "p2p"  # the plan keeps the default: the engine has no comm type
    ring = estimate(**common, zero_stage=1, micro_batch_size=1).breakdown.cp_comm_s
    assert ring == 0.0


def test_ulysses_sends_q_k_v_and_the_output_one_all_to_all_each_with_k_v_repeated_to_the_degree():
    """verl's and SkyRL's _ulysses_flash_attention_forward repeat K and V to max(degree // kv_heads, 1) times their
    heads (repeat_kv), then send q, k, v and later the output through one all-to-all each, the backward the same
    four on the gradients. Llama-3.1-8B (32 heads, 8 KV heads, head 128) at Ulysses 16: K and V go out at 16 heads
    each, not 8; the step's cp comm is 32 layers x 2 directions x those four all-to-alls x its micro-batches."""
    assert [ulysses_heads(8, u) for u in (2, 8, 16)] == [8, 8, 16]
    assert ulysses_widths(resolve_model("llama-3.1-8b"), 16, False) == (32 * 128, 16 * 128, 16 * 128, 32 * 128)
    mla = resolve_model("deepseek-v2-lite")  # 16 heads, nope 128 + rope 64, v 128: V and the output padded to 192
    assert ulysses_widths(mla, 2, True) == (16 * 192,) * 4
    assert ulysses_widths(mla, 2, False) == (16 * 192, 16 * 192, 16 * 128, 16 * 128)
    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, cp=16, seq_length=32768,
                                global_batch_size=16, micro_batch_size=1, framework="verl", job="sft", zero_stage=3))
    lk = job_links(job, calibration(job.framework))
    group = mesh_groups(plan, law=job.card.world_size_law).cp
    tokens = 32768 / 16
    one = sum(alltoall_time(tokens * w * 2, group.size, group.stride, lk) for w in (4096, 2048, 2048, 4096))
    m = plan.num_microbatches(job.global_batch_size)
    assert estimate_throughput(job, plan).breakdown.cp_comm_s == pytest.approx(m * 32 * 2 * one, rel=1e-12)


def test_te_a2a_sends_each_tensor_alone_and_the_output_twice_backward():
    """Transformer Engine's flash_attn_a2a_communicate: one all_to_all_single per tensor, forward q, k, v and the
    output, backward the output, its gradient, dq, dk and dv; each tensor copied twice (4 B an element each), memory-
    bound work (cp_passes). Llama 3.1 8B, a2a over 8 ranks of one node, 16,384 tokens a rank."""
    job, plan = resolve(Request(**dict(LONG, num_gpus=8, cp=8, seq_length=131072, global_batch_size=1,
                                       cp_comm_type="a2a")))
    *_, ctx = _step_context(job, plan, calibration(job.framework))
    group = mesh_groups(plan, law=ctx.law).cp
    tokens, q, kv = 16384, 32 * 128, 8 * 128

    def moved(widths):
        return sum(alltoall_time(tokens * w * 2, 8, group.stride, ctx.lk) for w in widths)

    def copied(widths):
        return tokens * sum(widths) * 8 / ctx.hbm

    assert te_a2a_time(ctx, group) == pytest.approx((moved((q, kv, kv, q)), moved((q, q, q, kv, kv))))
    assert te_a2a_copies(ctx, group) == pytest.approx((copied((q, kv, kv, q)), copied((q, q, q, kv, kv))))
    fwd, total = cp_passes(ctx)
    assert (fwd, total - fwd) == pytest.approx(te_a2a_copies(ctx, group))  # no ring level
    assert te_a2a_time(ctx, group._replace(size=1)) == te_a2a_copies(ctx, group._replace(size=1)) == (0.0, 0.0)


def test_gathered_keys_attended_counts_the_last_ranks_chunks_and_the_window():
    """The last rank of c holds chunks c-1 and c of 2c: a full causal layer attends c + (c + 1) chunks, 4.5 local
    K/Vs at c 4. gpt-oss-20b (window 128 on half its layers) at 131,072 tokens, c 4 (chunks of 16,384): a windowed
    layer attends its chunk and 127 keys before it, twice; averaged with the full layers."""
    llama, oss = resolve_model("llama-3.1-8b"), resolve_model("gpt-oss-20b")
    assert gathered_keys_attended(llama, 131072, 4) == 4.5
    assert oss.windowed_layers * 2 == oss.num_layers and oss.sliding_window == 128
    chunk = 16384
    assert gathered_keys_attended(oss, 131072, 4) == pytest.approx((9 * chunk + 2 * (chunk + 127)) / 2 / (2 * chunk))


def test_te_all_gather_gathers_twice_backward_and_moves_its_copies_and_adds():
    """AttnFuncWithCPAndKVAllGather, Llama 3.1 8B, 8 ranks of one node, 16,384 tokens a rank: K and V gathered one
    call each forward, again backward with dK and dV reduce-scattered; forward the gathered K/V reordered (a copy of
    8 local K/Vs, 4 B an element) and the output's halves copied; backward dK/dV zeroed (8 x 2 B), K/V and dK/dV
    reordered (2 x 8 x 4 B), 4.5 local K/Vs of adds (6 B), dq copied."""
    job, plan = resolve(Request(**dict(LONG, num_gpus=8, cp=8, seq_length=131072, global_batch_size=1,
                                       cp_comm_type="allgather")))
    *_, ctx = _step_context(job, plan, calibration(job.framework))
    group = mesh_groups(plan, law=ctx.law).cp
    tokens, q, kv = 16384, 32 * 128, 2 * 8 * 128
    gather = 2 * ring_time(8 * tokens * kv / 2 * 2, 8, group.stride, ctx.lk)
    assert te_gather_time(ctx, group) == pytest.approx((gather, 2 * gather))
    assert cp_time(ctx, 1.0, 3.5) == pytest.approx((gather, 3 * gather))
    fwd = tokens * (kv * 4 * 8 + q * 4) / ctx.hbm
    bwd = tokens * (kv * (2 * 8 + 2 * 4 * 8 + 6 * 8.5) + q * 4) / ctx.hbm
    assert te_gather_passes(ctx) == pytest.approx((fwd, bwd))
    assert cp_passes(ctx) == pytest.approx((fwd, fwd + bwd))
