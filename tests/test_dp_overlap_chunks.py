"""The data-parallel sync Megatron-Core's interleaved schedule launches chunk by chunk (the card's
pipeline.chunk_dp_sync; perf.sync_chunks, chunked_reduce_exposed, chunked_gather_exposed): each chunk's gradient
reduction once its last micro-batch's backward is done, each chunk's parameter all-gather a chunk ahead, so the other
chunks' backward and forward hide them; the search's floor (chunked_share) stays under it."""

from __future__ import annotations

import itertools

import pytest

from meshplan.estimate.perf import (
    SyncChunks,
    chunked_gather_exposed,
    chunked_reduce_exposed,
    chunked_share,
    step_sync,
    step_terms,
    sync_chunks,
)
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def test_one_chunk_is_the_stages_whole_sync():
    """Without virtual chunks the reduction hides behind share x the last backward and the gather behind share x the
    first forward, as before the chunks; not overlapped (share 0), all of it is exposed."""
    one = SyncChunks()
    assert chunked_reduce_exposed(0.3, 0.8, 0.1, one) == pytest.approx(0.3 - 0.08)
    assert chunked_reduce_exposed(0.3, 0.8, 0.1, one, slack=0.05) == pytest.approx(0.3 - 0.08 - 0.05)
    assert chunked_gather_exposed(0.2, 0.8, 0.05, one) == pytest.approx(0.2 - 0.04)
    assert chunked_reduce_exposed(0.3, 0.0, 0.1, SyncChunks(8, 6)) == 0.3
    assert chunked_reduce_exposed(0.3, 0.0, 0.1, SyncChunks(8, 6), slack=0.1) == pytest.approx(0.2)
    assert chunked_gather_exposed(0.2, 0.0, 0.05, SyncChunks(8, 6)) == 0.2


def test_chunked_reduction_by_hand():
    """8 chunks, 6 micro-batches a group, 0.0671 s of backward per micro-batch (one chunk's: 0.0671 / 8), 0.315 s of
    reduction: after chunk c's last backward c x 6 chunk-backwards are left, which hide all but the last chunk's part
    (0.315 / 8) less share of its own backward; at 1.2 s of reduction the queue outlasts the window:
    1.2 - 7 x 6 x op."""
    chunks, bwd = SyncChunks(8, 6), 0.0671
    op = bwd / 8
    assert chunked_reduce_exposed(0.315, 0.8, bwd, chunks) == pytest.approx(0.315 / 8 - 0.8 * op)
    assert chunked_reduce_exposed(1.2, 0.8, bwd, chunks) == pytest.approx(1.2 - 7 * 6 * op - 0.8 * op)
    # a later pipeline rank's backward ends `slack` earlier, which the last chunk's part gains, but it launches each
    # chunk's sync as much later (microbatch_id - pipeline_parallel_rank), so the queue's tail does not
    assert chunked_reduce_exposed(0.315, 0.8, bwd, chunks, slack=0.01) == pytest.approx(0.315 / 8 - 0.01 - 0.8 * op)
    assert chunked_reduce_exposed(1.2, 0.8, bwd, chunks, slack=0.01) == pytest.approx(1.2 - 7 * 6 * op - 0.8 * op)


def test_chunked_gather_by_hand():
    """The first chunk's gather before its first forward (less share of that chunk's forward), each later one beside
    the group of forwards of the chunk before it: exposed only where a chunk's part outlasts them."""
    chunks, fwd = SyncChunks(4, 8), 0.0494
    op = fwd / 4
    assert chunked_gather_exposed(0.113, 0.8, fwd, chunks) == pytest.approx(0.113 / 4 - 0.8 * op)
    assert chunked_gather_exposed(2.0, 0.8, fwd, chunks) == pytest.approx(0.5 - 0.8 * op + 3 * (0.5 - 8 * op))


def test_the_floor_share_bounds_every_chunked_sync():
    """seconds - chunked_share x work never exceeds the exposed part, at fewer micro-batches a group (m < pp) too:
    what the search's sync floor relies on (estimate/sync_floor.py)."""
    for seconds, share, work, vpp, pp, m in itertools.product((0.01, 0.3, 2.0), (0.0, 0.5, 0.8), (0.02, 0.1, 1.0),
                                                             (1, 2, 8), (2, 6), (1, 3, 72)):
        floor = SyncChunks(vpp, pp) if vpp > 1 else SyncChunks()
        run = SyncChunks(vpp, min(m, pp)) if vpp > 1 else SyncChunks()
        least = seconds - chunked_share(share, floor) * work
        assert least <= chunked_reduce_exposed(seconds, share, work, run) + 1e-12
        assert least <= chunked_gather_exposed(seconds, share, work, run) + 1e-12


def test_which_plans_sync_per_chunk():
    """Megatron-Core's and Megatron-Bridge's interleaved schedule (the card's pipeline.chunk_dp_sync), in groups of
    min(m, pp); not without virtual stages, nor on a framework whose card does not say so (torchtitan)."""
    job, _ = resolve(Request(model="gpt3-175b", gpu="h100", num_gpus=64, framework="megatron-core"))
    assert framework_card("megatron-core").pipeline.chunk_dp_sync
    assert framework_card("megatron-bridge").pipeline.chunk_dp_sync
    assert sync_chunks(job, 6, 8, 6) == SyncChunks(8, 6)
    assert sync_chunks(job, 8, 4, 3) == SyncChunks(4, 3)
    assert sync_chunks(job, 8, 4) == SyncChunks(4, 8)
    assert sync_chunks(job, 8, 1, 72) == SyncChunks()
    titan, _ = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="torchtitan"))
    assert not framework_card("torchtitan").pipeline.chunk_dp_sync
    assert sync_chunks(titan, 2, 2, 8) == SyncChunks()


def test_mlperf_gpt3_layout_hides_all_but_the_last_chunks_sync():
    """GPT-3 175B as NVIDIA's MLPerf v4.0 run on 10,752 H100 laid it out (TP4 PP6 VP8, 6 micro-batches, distributed
    optimizer, bf16 gradient reduction, fp8 parameter gather, overlapped): the exposed DP term is at most one chunk's
    reduction and gather, and under half what the first stage's whole sync hidden by one micro-batch would leave."""
    req = Request(model="gpt3-175b", gpu="h100", num_gpus=10752, framework="megatron-core", tp=4, pp=6, vpp=8,
                  dp=448, micro_batch_size=1, global_batch_size=2688, seq_length=2048, precision="fp8",
                  sequence_parallel=True, zero_stage=1, recompute="none", tp_comm_overlap=True,
                  grad_reduce_in_fp32=False, fp8_param_gather=True)
    job, plan = resolve(req)
    terms = step_terms(job, plan)
    first = terms.rows[0]
    sync = step_sync(job, plan, terms.ctx.cal, terms.ctx.lk, terms.inputs.traffic, first.dense_params,
                     first.expert_params, terms.inputs.sharding.per_step,
                     edge=terms.inputs.parts.embedding)
    bwd = first.compute - first.fwd + first.recompute
    assert 0.0 < terms.dp_exposed <= (sync.reduce + sync.gather) / plan.vpp
    whole = max(0.0, sync.reduce - sync.reduce_hidden * bwd) + max(0.0, sync.gather - sync.gather_hidden * first.fwd)
    assert terms.dp_exposed < whole / 2
