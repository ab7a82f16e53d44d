"""torch's context_parallel ring as torchtitan runs it (meshplan/estimate/context_parallel.py torch_ring_time, the
card's engine.torch_cp): the bytes its copies, fp32 merges and dK/dV accumulations move on the compute stream, K/V at
the query heads' width where the release repeats them, and the all-gather and last dK/dV hop it cannot hide."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.arithmetic.comm import p2p_time, ring_time
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.context_parallel import cp_time, torch_ring_time
from meshplan.estimate.perf import _step_context, estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

LONG = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, cp=4, seq_length=131072, global_batch_size=2,
            recompute="full")


def context(**fields):
    job, plan = resolve(Request(**{**LONG, **fields}))
    return job, plan, _step_context(job, plan, calibration(job.framework))[2]


def test_the_rings_elementwise_bytes_on_the_last_rank_at_hbm_bandwidth():
    """Llama 3.1 8B, cp 4, 32,768 tokens a rank, torchtitan 0.1.0 (K and V repeated to the 32 query heads): per token
    K + V 2 x 32 x 128 elements, output and query 32 x 128. Forward: K/V one copy and 3 cats at 4 B an element
    (16 in all), the output 12 B (two casts) + 3 merges x 38 B; backward: K/V 32 B + 3 steps x 25, the query
    20 B + 3 x 10. With attention long enough to hide every transfer, that is all the ring adds."""
    *_, ctx = context(framework="torchtitan", framework_version="0.1.0")
    tokens, kv, heads = 32768, 2 * 32 * 128, 32 * 128
    fwd_bytes = tokens * (kv * 16 + heads * (12 + 3 * 38))
    bwd_bytes = tokens * (kv * (32 + 3 * 25) + heads * (20 + 3 * 10))
    fwd, total = torch_ring_time(ctx, 1e3, 3.5e3)
    hop = p2p_time(tokens * kv * 4, False, ctx.lk)  # the last dK/dV permute, fp32, waited with nothing after it
    assert fwd == pytest.approx(fwd_bytes / ctx.hbm)
    assert total - fwd == pytest.approx(bwd_bytes / ctx.hbm + hop)
    assert 3e-3 < fwd < 2e-2  # ~21 GB at an H100 SXM's HBM3


def test_kv_moves_at_the_query_heads_width_only_where_the_release_repeats_it():
    """0.2.2's llama3 hands SDPA its 8 K/V heads with enable_gqa: every K/V term a quarter of 0.1.0's."""
    *_, old = context(framework="torchtitan", framework_version="0.1.0")
    *_, new = context(framework="torchtitan", framework_version="0.2.2")
    assert old.kv_repeated and not new.kv_repeated
    assert torch_ring_time(new, 1e3, 3.5e3)[1] < torch_ring_time(old, 1e3, 3.5e3)[1]
    tokens, c = 32768, 4
    kv_repeated, kv_gqa = 2 * 32 * 128, 2 * 8 * 128
    fwd_gap = torch_ring_time(old, 1e3, 3.5e3)[0] - torch_ring_time(new, 1e3, 3.5e3)[0]
    assert fwd_gap == pytest.approx(tokens * (kv_repeated - kv_gqa) * 4 * c / old.hbm)


def test_the_all_gather_shows_beyond_step_zeros_attention_and_each_hop_beyond_its_steps():
    """Attention too short to hide anything: forward adds the K/V all-gather less 1/4 of the attention; backward
    the all-gather again, 3 hops each less 1/4 of the backward, and the last hop whole."""
    _, plan, ctx = context(framework="torchtitan", framework_version="0.1.0")
    base_fwd, base_total = torch_ring_time(ctx, 1e3, 3.5e3)
    tokens, kv = 32768, 2 * 32 * 128
    group = mesh_groups(plan, law=ctx.law).cp
    gather = ring_time(4 * tokens * kv * 2, group.size, group.stride, ctx.lk)
    hop = p2p_time(tokens * kv * 4, False, ctx.lk)
    a_fwd, a_bwd = gather * 2, hop * 2  # 1/4 of each under the transfer it faces
    fwd, total = torch_ring_time(ctx, a_fwd, a_fwd + a_bwd)
    bytes_fwd, bytes_bwd = base_fwd, base_total - base_fwd - hop
    assert fwd == pytest.approx(bytes_fwd + gather - a_fwd / 4)
    assert total - fwd == pytest.approx(bytes_bwd + max(0.0, gather - a_bwd / 4) + 3 * (hop - a_bwd / 4) + hop)


def test_cp_time_takes_torchs_ring_on_torchtitan_whatever_cp_comm_type_says_and_te_elsewhere():
    _, _, titan = context(framework="torchtitan", framework_version="0.1.0")
    _, _, mcore = context(framework="megatron-core")
    assert titan.torch_cp and not mcore.torch_cp
    assert cp_time(titan, 0.5, 1.75) == torch_ring_time(titan, 0.5, 1.75)
    assert cp_time(replace(titan, plan=titan.plan.model_copy(update={"cp_comm_type": "allgather"})), 0.5, 1.75) \
        == torch_ring_time(titan, 0.5, 1.75)
    assert cp_time(mcore, 0.5, 1.75) != torch_ring_time(replace(mcore, torch_cp=True), 0.5, 1.75)


def test_torchtitans_cp_step_reports_the_ring():
    """A torchtitan CP step reports the ring in cp_comm_s; without CP there is none."""
    with_ring = estimate_throughput(*resolve(Request(framework="torchtitan", framework_version="0.1.0", **LONG)))
    assert with_ring.breakdown.cp_comm_s > 0.0
    no_cp = estimate_throughput(*resolve(Request(framework="torchtitan", framework_version="0.1.0",
                                                 **{**LONG, "cp": 1, "num_gpus": 2, "seq_length": 32768})))
    assert no_cp.breakdown.cp_comm_s == 0.0
