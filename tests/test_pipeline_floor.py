"""The replay's chain floor (meshplan/arithmetic/pipeline_floor.py), the search's STEP bound (estimate/perf.py
StepTerms.floor): never over the replayed step on random heterogeneous shapes of every order, exact for balanced
1F1B, and over m x the slowest stage (the floor it replaced) on real plans."""

from __future__ import annotations

import random

import pytest

from meshplan.arithmetic.flops import weight_gradient_share
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD
from meshplan.arithmetic.pipeline_floor import FLOOR_MARGIN, chain_floor
from meshplan.arithmetic.pipeline_timeline import Shape, replays_whole, shape_for, simulate
from meshplan.estimate import perf
from meshplan.estimate.perf import estimate_throughput, step_terms
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

ORDERS = ["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev",
          "combined_1f1b"]


def _random_shape(rnd: random.Random, order: str) -> Shape:
    pp = rnd.randint(2, 16)
    vpp = 2 if order in ("zbv_zero_bubble", "dualpipev") else rnd.randint(2, 8) if order != "gpipe" \
        and order != "1f1b" else 1
    convention = rnd.choice(["pp", "rounds"])
    m = rnd.choice([rnd.randint(1, 40), rnd.randint(41, 300)])
    if convention == "pp" and order in ("interleaved_1f1b", "combined_1f1b"):
        m = max(pp, m - m % pp)  # Megatron-Core's groups fill (rule PP005 refuses the rest)
    return shape_for(order, convention, pp, vpp, m)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ORDERS)
def test_the_chain_floor_is_never_over_the_replay(order):
    """Heterogeneous ranks (each forward 0.3-1.5 of a base, its backward 1.4-3 times that, any weight-gradient share),
    with and without a hop, pp 2-16, vpp 1-8, m 1-300 under both group conventions: the floor is at most the replayed
    step wherever simulate replays every micro-batch, and is not offered where it extends the steady state."""
    rnd = random.Random(f"floor-{order}")
    checked = extended = 0
    while checked < 40:
        shape = _random_shape(rnd, order)
        base = rnd.uniform(1e-3, 1e-1)
        fwd = [base * rnd.uniform(0.3, 1.5) for _ in range(shape.pp)]
        bwd = [f * rnd.uniform(1.4, 3.0) for f in fwd]
        wgrad = [b * rnd.uniform(0.0, 0.6) for b in bwd]
        hop = rnd.choice([0.0, base * rnd.uniform(0.0, 0.3)])
        if not replays_whole(shape):
            extended += 1
            continue
        try:
            step = simulate(shape, fwd, bwd, hop, wgrad).seconds
        except (AssertionError, ValueError):  # an order that cannot run this shape (the rules refuse it)
            continue
        assert chain_floor(shape, fwd, bwd, hop) <= step, (shape, fwd, bwd, hop)
        checked += 1
    assert order == "dualpipev" or extended  # the sampler reaches the extension, which the floor leaves alone


@pytest.mark.parametrize("order", ORDERS)
def test_the_chain_floor_holds_with_the_output_layers_chunk_apart(order):
    """As above, with the last virtual stage's chunk longer than its rank's others (simulate's `last`: the output
    layer and loss there alone, up to 4x a chunk more): the floor given that chunk is at most the replayed step, and at
    least the floor of the rank's other chunks alone (which stays one)."""
    rnd = random.Random(f"floor-last-{order}")
    checked = tighter = 0
    while checked < 40:
        shape = _random_shape(rnd, order)
        if not replays_whole(shape):
            continue
        base = rnd.uniform(1e-3, 1e-1)
        fwd = [base * rnd.uniform(0.3, 1.5) for _ in range(shape.pp)]
        bwd = [f * rnd.uniform(1.4, 3.0) for f in fwd]
        wgrad = [b * rnd.uniform(0.0, 0.6) for b in bwd]
        hop = rnd.choice([0.0, base * rnd.uniform(0.0, 0.3)])
        owner = shape.rank_of(shape.stages - 1)
        head = base * rnd.uniform(0.0, 4.0)
        last = (fwd[owner] + head / 3, bwd[owner] + 2 * head / 3, wgrad[owner] + rnd.uniform(0.0, 0.6) * head / 3)
        try:
            step = simulate(shape, fwd, bwd, hop, wgrad, last).seconds
        except (AssertionError, ValueError):  # an order that cannot run this shape (the rules refuse it)
            continue
        floor = chain_floor(shape, fwd, bwd, hop, last[:2])
        assert chain_floor(shape, fwd, bwd, hop) <= floor <= step, (shape, fwd, bwd, hop, last)
        tighter += floor > chain_floor(shape, fwd, bwd, hop)
        checked += 1
    assert tighter  # the chunk's excess reaches the floor


@pytest.mark.parametrize(("order", "p", "v", "m"), [("1f1b", 4, 1, 8), ("1f1b", 8, 1, 100), ("gpipe", 4, 1, 16),
                                                    ("interleaved_1f1b", 4, 2, 8)])
def test_balanced_stages_give_the_classic_bubble(order, p, v, m):
    """Equal ranks and no hop: the floor is m v (f + b) + (p - 1)(f + b), the (p - 1)/v bubble of the closed form, which
    the replay reaches exactly (m x the slowest stage has no bubble at all)."""
    shape = shape_for(order, "pp", p, v, m)  # type: ignore[arg-type]
    f, b = 0.01, 0.02
    floor = chain_floor(shape, [f] * p, [b] * p, 0.0)
    assert floor == pytest.approx((m * v + p - 1) * (f + b), rel=2 * FLOOR_MARGIN)
    assert floor <= simulate(shape, [f] * p, [b] * p).seconds == pytest.approx(floor, rel=2 * FLOOR_MARGIN)


@pytest.mark.parametrize(("order", "v", "step"), [("1f1b", 1, 31.6), ("interleaved_1f1b", 2, 29.4)])
def test_a_slowest_first_rank_still_waits_for_its_first_backward(order, v, step):
    """Two ranks, the first the slower (3.6 s a micro-batch against 3.0), hop 0.1 s, 8 micro-batches: its chain from
    the first op to the last is 8 x 3.6 = 28.8 s, nothing before or after it; cut at its first backward (which waits
    for micro-batch 0's forwards through every stage and the second rank's backwards) and its last forward (followed
    by the last micro-batch's round trip through the second rank) it is the replayed step itself."""
    shape = shape_for(order, "pp", 2, v, 8)  # type: ignore[arg-type]
    fwd, bwd = [1.2 / v, 1.0 / v], [2.4 / v, 2.0 / v]
    assert simulate(shape, fwd, bwd, 0.1).seconds == pytest.approx(step)
    assert chain_floor(shape, fwd, bwd, 0.1) == pytest.approx(step, rel=2 * FLOOR_MARGIN)


@pytest.mark.parametrize(("framework", "pp", "vpp", "schedule", "tighter"), [
    ("megatron-core", 8, 1, None, True), ("megatron-core", 4, 2, None, True), ("torchtitan", 8, 1, "gpipe", True),
    ("torchtitan", 4, 2, "zero_bubble", False), ("torchtitan", 4, 2, "dualpipev", False)])
def test_a_real_plans_floor_is_over_m_times_its_slowest_stage(framework, pp, vpp, schedule, tighter):
    """On real plans (Llama-3.1-70B on 64 H100, 64 micro-batches: every one replayed), the STEP floor is at most the
    estimated step, and over the one it replaced (m x the slowest stage plus the once-per-step terms) by most of the
    bubble where the order ends on the backward chain; the V orders' first rank holds the embedding and the loss, the
    slowest, whose chain has nothing before or after it: no tighter there."""
    knobs = {"pipeline_schedule": schedule} if schedule else {}
    job, plan = resolve(Request(model="llama-3.1-70b", num_gpus=64, gpu="h100", framework=framework, tp=8, pp=pp,
                                vpp=vpp, micro_batch_size=1, global_batch_size=64 * 64 // (8 * pp), **knobs))
    terms = step_terms(job, plan)
    old = terms.m * terms.rows[terms.worst].total + terms.dp_exposed + terms.optimizer + terms.offload_s
    step = estimate_throughput(job, plan).step_time_s
    assert old <= terms.floor <= step
    if tighter:
        assert terms.floor - old > 0.5 * (step - old) > 0  # most of the bubble


def test_the_output_layer_runs_on_the_last_chunk_of_its_rank():
    """Megatron-Core builds the output layer and loss into the last virtual stage's model chunk only: on an interleaved
    plan that chunk takes the head's seconds (a third forward), the rank's other chunks share the rest of its
    micro-batch equally, and the rank's total is the same; the replayed step is longer than with the head spread over
    the rank's chunks, and the floor still at most it."""
    job, plan = resolve(Request(model="llama-3.1-70b", num_gpus=64, gpu="h100", framework="megatron-core", tp=8, pp=4,
                                vpp=4, micro_batch_size=1, global_batch_size=128))
    terms = step_terms(job, plan)
    inp = terms.inputs
    shape, _ = perf._pipeline_shape(terms.m, inp)
    fwd, bwd, last, _ = perf._chunk_seconds(terms.rows, shape, inp)
    owner = inp.pipeline.head_rank
    assert owner == shape.rank_of(shape.stages - 1) == 3 and inp.head > 0 and last is not None
    assert last[0] - fwd[owner] == pytest.approx(inp.head / 3)
    assert last[1] - bwd[owner] == pytest.approx(2 * inp.head / 3)
    row = terms.rows[owner]
    assert (shape.vpp - 1) * (fwd[owner] + bwd[owner]) + last[0] + last[1] == pytest.approx(row.total)
    spread = [r.total * perf._forward_share(r) / shape.vpp for r in terms.rows]
    spread_b = [r.total / shape.vpp - f for r, f in zip(terms.rows, spread, strict=True)]
    assert simulate(shape, fwd, bwd, inp.pp_hop, None, last).seconds > simulate(shape, spread, spread_b,
                                                                                inp.pp_hop).seconds
    assert terms.floor <= estimate_throughput(job, plan).step_time_s


def test_a_split_that_counts_the_loss_leaves_the_heads_chunk_its_own_layers():
    """Where the split counts the loss as a layer (Megatron-Bridge's account_for_loss: Llama-3.1-405B's 126 layers and
    the embedding and loss over PP8 VPP8, two a chunk, one on the last), that chunk takes its one layer's share of the
    rank's time beside the head and the other seven two each: the same total."""
    job, plan = resolve(Request(model="llama-3.1-405b", num_gpus=512, gpu="h100", framework="megatron-bridge", tp=8,
                                pp=8, vpp=8, micro_batch_size=1, global_batch_size=512, account_for_embedding=True,
                                account_for_loss=True))
    terms = step_terms(job, plan)
    inp = terms.inputs
    owner = inp.pipeline.head_rank
    assert [len(c) for c in inp.pipeline.chunks[owner]] == [2] * 7 + [1]
    shape, _ = perf._pipeline_shape(terms.m, inp)
    fwd, bwd, last, _ = perf._chunk_seconds(terms.rows, shape, inp)
    assert last is not None
    rest = terms.rows[owner].total - inp.head
    assert fwd[owner] + bwd[owner] == pytest.approx(rest * 2 / 15)
    assert last[0] + last[1] == pytest.approx(rest / 15 + inp.head)
    assert terms.floor <= estimate_throughput(job, plan).step_time_s


def test_the_head_ranks_weight_gradients_split_over_its_chunks_and_the_head():
    """Where the order runs weight gradients apart (torchtitan's interleaved zero bubble), _chunk_seconds splits them
    with the chunks: each rank's part of a chunk's backward is the weight gradients' share of its backward compute over
    its chunks; on the head's rank its layers' part by its chunks' backward seconds, the head's own on the last chunk
    alone, summing to the rank's share; without the share nothing is split and the chunks' seconds are the same."""
    job, plan = resolve(Request(model="llama-3.1-70b", num_gpus=32, gpu="h100", framework="torchtitan", tp=8, pp=4,
                                vpp=4, pipeline_schedule="zero_bubble", micro_batch_size=1, global_batch_size=64))
    terms = step_terms(job, plan)
    inp, rows = terms.inputs, terms.rows
    shape, _ = perf._pipeline_shape(terms.m, inp)
    assert shape.order == "interleaved_zero_bubble"
    share = weight_gradient_share(inp.ctx.arch, job.seq_length)
    chunks = perf._chunk_seconds(rows, shape, inp, share)
    owner = inp.pipeline.head_rank
    assert chunks.last is not None and inp.head > 0
    for rank, row in enumerate(rows):
        if rank != owner:
            assert chunks.wgrad[rank] == pytest.approx(share * (row.compute - row.fwd) / shape.vpp)
    row = rows[owner]
    assert (shape.vpp - 1) * chunks.wgrad[owner] + chunks.last[2] == pytest.approx(share * (row.compute - row.fwd))
    head_bwd = inp.head - inp.head / TRAINING_PASSES_PER_FORWARD
    assert chunks.wgrad[owner] / chunks.bwd[owner] == pytest.approx(
        (chunks.last[2] - share * head_bwd) / (chunks.last[1] - head_bwd))  # layers' part per layers' backward second
    plain = perf._chunk_seconds(rows, shape, inp)
    assert plain.wgrad is None and plain.last == (*chunks.last[:2], 0.0)
    assert (plain.fwd, plain.bwd) == (chunks.fwd, chunks.bwd)
    assert terms.floor <= estimate_throughput(job, plan).step_time_s
