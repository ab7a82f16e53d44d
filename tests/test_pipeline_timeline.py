"""The pipeline step replayed from each schedule's order (meshplan/arithmetic/pipeline_timeline.py): the orders as
Megatron-Core and torch build them, the step and idle share against hand-worked timelines and an independent
slot-by-slot reference, the activations held at the peak, and what the throughput estimate and recommend make of a
pipeline with one micro-batch."""

from __future__ import annotations

import random
import re

import pytest

from meshplan import api
from meshplan.arithmetic import pipeline_counts as counts
from meshplan.arithmetic import pipeline_timeline as tl
from meshplan.arithmetic.pipeline_counts import in_flight
from meshplan.arithmetic.pipeline_timeline import Shape, rank_order, shape_for, simulate
from meshplan.estimate.perf import estimate_throughput
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def reference_step(shape: Shape, fwd: list[int], bwd: list[int], last: tuple[int, int] | None = None) -> int:
    """An independent reference: whole time slots, no hop; each slot every idle rank starts its next op if the op's
    input finished at or before the slot (forward: the previous virtual stage's forward; backward: the next one's
    backward, or its own forward on the last stage); `last`: the last stage's own forward and backward slots."""
    p, s = shape.pp, shape.stages
    orders = [list(rank_order(shape, r)) for r in range(p)]
    done: dict[tuple[str, int, int], int] = {}
    busy_until, pos, now = [0] * p, [0] * p, 0
    while any(pos[r] < len(orders[r]) for r in range(p)):
        for r in range(p):
            if busy_until[r] > now or pos[r] == len(orders[r]):
                continue
            backward, chunk, mb = orders[r][pos[r]]
            stage = chunk * p + r
            need = (("F", stage, mb) if stage == s - 1 else ("B", stage + 1, mb)) if backward \
                else (("F", stage - 1, mb) if stage else None)
            if need is None or done.get(need, now + 1) <= now:
                seconds = (bwd[r], fwd[r]) if last is None or stage != s - 1 else (last[1], last[0])
                busy_until[r] = now + seconds[0 if backward else 1]
                done[("B" if backward else "F", stage, mb)] = busy_until[r]
                pos[r] += 1
        now += 1
    return max(busy_until)


def test_megatron_schedule_table_and_warmup():
    # Megatron-Core's own example (schedules.py, get_schedule_table): PP2, N3 (group), M5, VP2
    shape = Shape("interleaved_1f1b", 2, 2, 5, 3)
    assert tl._chunk_microbatches(shape) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2),
                                             (0, 3), (0, 4), (1, 3), (1, 4)]
    # rank 0 of PP4 VPP2 M8, group 4: 2*(4-0-1) + (2-1)*4 = 10 warm-up forwards, then F and B in turn
    order = rank_order(shape_for("1f1b", "pp", 4, 2, 8), 0)
    assert [op[0] for op in order[:12]] == [False] * 10 + [False, True]
    assert order[:10] == tuple((False, c, mb) for c, mb in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2),
                                                            (1, 3), (0, 4), (0, 5)])
    assert order[11] == (True, 1, 0)  # the first backward runs the last chunk


def test_groups_follow_each_framework():
    assert tl.interleave_group("pp", 4, 16) == 4  # Megatron-Core: microbatch_group_size_per_vp_stage = pp
    assert tl.interleave_group("rounds", 4, 10) == 5  # torch: 10 // max(1, 10 // 4) = 5 per round
    assert tl.interleave_group("rounds", 4, 3) == 3  # one round of 3
    assert shape_for("1f1b", "pp", 4, 1, 8) == Shape("1f1b", 4, 1, 8)
    assert shape_for("gpipe", "pp", 4, 1, 8).order == "gpipe"


@pytest.mark.parametrize(("order", "p", "m", "expected"), [
    ("1f1b", 2, 1, 6),   # F r0, F r1, B r1, B r0: half of every rank's time idle
    ("1f1b", 4, 2, 15),  # m < p: (m + p - 1)(f + b)
    ("1f1b", 3, 4, 18),  # m not a multiple of p
    ("1f1b", 4, 8, 33),
    ("gpipe", 2, 2, 9),
    ("gpipe", 4, 3, 18),
])
def test_plain_schedules_match_hand_worked_steps(order, p, m, expected):
    shape = shape_for(order, "pp", p, 1, m)
    timeline = simulate(shape, [1.0] * p, [2.0] * p)
    assert timeline.seconds == pytest.approx(expected)
    assert timeline.seconds == reference_step(shape, [1] * p, [2] * p)
    assert timeline.idle_share == pytest.approx(1 - m * 3 / expected)


def test_interleaved_two_ranks_two_chunks_by_hand():
    # chunks of f = 0.5, b = 1 (a rank's micro-batch: 3): r0 F00 F01 F10 F11 B10 B11 B00 B01, r1 F00 F01 F10 B10 F11
    # B11 B00 B01 -> the last backward of rank 0 ends at 7.5 = (m + (p-1)/v) x 3 with m = p (steady-state formula)
    shape = shape_for("1f1b", "pp", 2, 2, 2)
    assert simulate(shape, [0.5, 0.5], [1.0, 1.0]).seconds == pytest.approx(7.5)


def test_one_microbatch_idles_half_of_two_stages_whatever_v():
    for v in (1, 2, 21):
        timeline = simulate(shape_for("1f1b", "rounds", 2, v, 1), [1 / v] * 2, [2 / v] * 2)
        assert timeline.seconds == pytest.approx(6.0)
        assert timeline.idle_share == pytest.approx(0.5)


@pytest.mark.parametrize("convention", ["pp", "rounds"])
@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 1), (4, 2, 2), (4, 2, 3), (4, 2, 6), (4, 2, 8), (4, 3, 12),
                                           (3, 2, 5), (2, 4, 4), (8, 2, 16), (4, 4, 10)])
def test_interleaved_matches_the_slot_reference(convention, p, v, m):
    rng = random.Random(p * 100 + v * 10 + m)
    fwd = [rng.randint(1, 3) for _ in range(p)]
    bwd = [2 * f + rng.randint(0, 1) for f in fwd]
    shape = shape_for("1f1b", convention, p, v, m)
    assert simulate(shape, fwd, bwd).seconds == reference_step(shape, fwd, bwd)


@pytest.mark.parametrize("convention", ["pp", "rounds"])
@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (3, 2, 5), (2, 4, 4), (2, 24, 8), (4, 4, 10)])
def test_the_output_layers_chunk_runs_apart(convention, p, v, m):
    """simulate's `last` (the output layer and loss in the last virtual stage's chunk alone): the slot reference
    with that stage's own slots, and the plain replay where they are its rank's."""
    rng = random.Random(p * 1000 + v * 10 + m)
    fwd = [rng.randint(1, 3) for _ in range(p)]
    bwd = [2 * f + rng.randint(0, 1) for f in fwd]
    shape = shape_for("1f1b", convention, p, v, m)
    last = (fwd[-1] + rng.randint(1, 4), bwd[-1] + rng.randint(2, 8))
    assert simulate(shape, fwd, bwd, last=(*last, 0)).seconds == reference_step(shape, fwd, bwd, last)
    assert simulate(shape, fwd, bwd, last=(fwd[-1], bwd[-1], 0)).seconds == simulate(shape, fwd, bwd).seconds


@pytest.mark.parametrize("order", ["combined_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev"])
def test_the_output_layers_chunk_in_the_fused_split_and_v_orders(order):
    """The same in the orders that fuse, split or fold their ops: its rank's own seconds replay the plain step, and
    a longer chunk there (on rank 0 in the V orders, which hold the last stage) lengthens the step, by no more than
    its excess on every micro-batch."""
    p, v, m = 4, 2 if order in tl.V_ORDERS else 3, 16
    shape = shape_for(order, "pp", p, v, m)
    fwd, bwd, wgrad = [1.0, 1.1, 0.9, 1.2], [2.0, 2.2, 1.8, 2.4], [0.8, 0.9, 0.7, 1.0]
    owner = shape.rank_of(shape.stages - 1)
    assert owner == (0 if order in tl.V_ORDERS else p - 1)
    plain = simulate(shape, fwd, bwd, 0.01, wgrad).seconds
    same = (fwd[owner], bwd[owner], wgrad[owner])
    assert simulate(shape, fwd, bwd, 0.01, wgrad, same).seconds == plain
    longer = simulate(shape, fwd, bwd, 0.01, wgrad, (fwd[owner] + 1.0, bwd[owner] + 2.0, wgrad[owner] + 0.5))
    assert plain < longer.seconds <= plain + m * 3.0 + 1e-9
    assert longer.busy[owner] == pytest.approx(simulate(shape, fwd, bwd, 0.01, wgrad).busy[owner] + m * 3.0)


def test_steady_state_limit_is_the_closed_form():
    # balanced stages, m a multiple of p: (m + (p-1)/v) x t, the bubble (p-1)/(m*v) of the classic formula
    for p, v, m in [(4, 1, 8), (4, 2, 8), (8, 4, 32), (4, 4, 16)]:
        shape = shape_for("1f1b", "pp", p, v, m)
        assert simulate(shape, [1 / v] * p, [2 / v] * p).seconds == pytest.approx((m + (p - 1) / v) * 3)


def test_hops_delay_the_fill_and_drain():
    # 1F1B, 2 ranks, one micro-batch: F, hop, F, B, hop, B
    assert simulate(shape_for("1f1b", "pp", 2, 1, 1), [1.0, 1.0], [2.0, 2.0], 0.25).seconds == pytest.approx(6.5)


def test_long_steps_extend_the_steady_state():
    rng = random.Random(7)
    worst = 0.0
    for _ in range(40):
        p, v = rng.choice([2, 4, 8]), rng.choice([1, 2, 4])
        m = rng.choice([160, 200, 256]) // p * p
        fwd = [rng.uniform(0.9, 1.1) / v for _ in range(p)]
        bwd = [2 * f for f in fwd]
        shape = shape_for("1f1b", rng.choice(["pp", "rounds"]), p, v, m)
        full = tl._replay(shape, fwd, bwd, 0.01 / v)
        worst = max(worst, abs(simulate(shape, fwd, bwd, 0.01 / v).seconds - full) / full)
    assert worst < 0.01


def closed_form_in_flight(rank: int, p: int, v: int, m: int) -> tuple[int, ...]:
    """What schedule.in_flight computed before the timeline (exact for m a multiple of p, m >= p)."""
    if v == 1:
        return (min(m, p - rank),)
    held = min((p - rank - 1) * 2 + (v - 1) * p + 1, m * v)
    counts = [0] * v
    for k in range(held):
        counts[(k % (p * v)) // p] += 1
    return tuple(counts)


def test_in_flight_keeps_the_closed_form_where_it_was_exact():
    for p, v, k in [(2, 1, 1), (4, 1, 2), (8, 1, 4), (2, 2, 1), (4, 2, 1), (4, 2, 3), (8, 3, 2), (4, 4, 4)]:
        m = k * p
        for convention in ("pp", "rounds"):
            shape = shape_for("1f1b", convention, p, v, m)
            assert [in_flight(shape, r) for r in range(p)] == [closed_form_in_flight(r, p, v, m) for r in range(p)]


def test_in_flight_with_few_microbatches():
    # 1F1B, m < p: every forward before the first backward on the early ranks
    assert [in_flight(shape_for("1f1b", "pp", 4, 1, 2), r) for r in range(4)] == [(2,), (2,), (2,), (1,)]
    # torch's one round of 3 over PP4 VPP2: rank 0 warms up 3 + 6 -> capped at all 6 forwards
    assert in_flight(shape_for("1f1b", "rounds", 4, 2, 3), 0) == (3, 3)


def llama405_torchtitan(**layout):
    return Request(model="llama-3.1-405b", gpu="h100", num_gpus=128, framework="torchtitan", global_batch_size=32,
                   **layout)


def test_one_microbatch_per_pipeline_is_priced_mostly_idle():
    # TP4 PP2 VPP21 DP16 at micro-batch 2: one micro-batch per pipeline, two stages taking turns
    job, plan = resolve(llama405_torchtitan(tp=4, pp=2, vpp=21, micro_batch_size=2))
    report = estimate_throughput(job, plan)
    b = report.breakdown
    pipeline = b.compute_s + b.tp_comm_s + b.pp_comm_s + b.bubble_s + b.recompute_s
    assert b.bubble_s > 0.9 * (pipeline - b.bubble_s)  # about as long as the busy stage itself
    words = next(a for a in report.assumptions if a.startswith("Pipeline schedule Interleaved1F1B (v=21"))
    assert int(re.search(r"leaves (\d+)% of the pipeline's GPU-seconds idle", words).group(1)) >= 45


def test_the_idle_share_says_it_counts_the_stages_unequal_work():
    """Llama-3.1-70B TP4 PP4 VPP7 CP2 DP2 (recommend's pick on 64 H100): 256 micro-batches leave 0.08 s of bubble,
    0.1% of the step, yet 4% of the GPU-seconds idle, since the layout's first and last stages hold the embedding and
    the loss beside fewer layers; the words said '4% ... idle (0.0784 s of bubble)', which read as a contradiction."""
    job, plan = resolve(Request(model="llama-3.1-70b", gpu="h100", num_gpus=64, seq_length=8192,
                                global_batch_size=512, tp=4, pp=4, vpp=7, cp=2, zero_stage=1, micro_batch_size=1,
                                recompute="none", pipeline_layout="Ett|(t*3|)*26L"))
    report = estimate_throughput(job, plan)
    words = next(a for a in report.assumptions if a.startswith("Pipeline schedule "))
    idle = int(re.search(r"leaves (\d+)% of the pipeline's GPU-seconds idle", words).group(1))
    assert report.breakdown.bubble_s < 0.01 * report.step_time_s and idle >= 2
    assert "the stages' unequal work included" in words and "beyond the micro-batches x the slowest stage" in words


def test_recommend_never_ranks_an_idle_pipeline_first():
    rec = api.recommend(llama405_torchtitan(), top_k=5)
    for cand in rec.candidates:
        plan = cand.plan
        if plan.pp > 1:
            assert 32 // (plan.micro_batch_size * plan.dp) >= plan.pp


@pytest.mark.parametrize("order", ["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble",
                                   "dualpipev", "combined_1f1b"])
def test_precomputed_replay_is_the_op_by_op_replay_to_the_bit(order):
    """_replay runs each shape's ops in one precomputed order (_program) and keeps each input's step: the same
    floats, to the last bit, as the op-by-op replay that visits the ranks in turn (_replay_actions, timed_actions'),
    on sampled shapes, seconds, hops and weight-gradient shares; asked twice or afresh, the same number."""
    rnd = random.Random(order)
    checked = 0
    while checked < 25:
        pp, m = rnd.choice([1, 2, 3, 4, 8]), rnd.randint(1, 48)
        vpp = 2 if order in ("zbv_zero_bubble", "dualpipev") else rnd.choice([2, 3, 5]) if "interleaved" in order \
            or order == "combined_1f1b" else 1
        shape = shape_for(order, rnd.choice(["pp", "rounds"]), pp, vpp, m)  # type: ignore[arg-type]
        fwd = [rnd.uniform(1e-3, 1e-2) for _ in range(shape.pp)]
        bwd = [f * rnd.uniform(1.0, 3.0) for f in fwd]
        wgrad = [b * rnd.uniform(0.0, 0.6) for b in bwd]
        hop = rnd.choice([0.0, 3e-4, 2e-3])
        try:
            expected = tl._replay_actions(shape, fwd, bwd, hop, wgrad)
        except (AssertionError, ValueError):  # an order that cannot run this shape (the rules refuse it)
            continue
        assert tl._replay(shape, fwd, bwd, hop, wgrad) == expected, shape
        assert tl._replay(shape, tuple(fwd), tuple(bwd), hop, tuple(wgrad)) == expected
        tl._REPLAYS.clear()
        assert tl._replay(shape, fwd, bwd, hop, wgrad) == expected
        checked += 1


def test_the_closed_form_in_flight_is_the_replayed_one():
    # plain_in_flight (GPipe, 1F1B, interleaved and combined 1F1B, both group conventions) gives what replaying each
    # rank's order op by op gives, on every rank of every shape up to pp 8, vpp 5, 40 micro-batches
    checked = 0
    for order in ("gpipe", "1f1b", "interleaved_1f1b", "combined_1f1b"):
        for convention in ("pp", "rounds"):
            for pp in range(1, 9):
                for vpp in range(1, 6):
                    for m in range(1, 41):
                        shape = shape_for(order, convention, pp, vpp, m)
                        for rank in range(pp):
                            plain = counts.plain_in_flight(shape, rank)
                            assert plain == counts.replayed_in_flight(shape, rank), (shape, rank)
                            checked += 1
    assert checked == 57600


def test_held_by_chunk_is_the_table_taken_row_by_row():
    # _held_by_chunk (plain_in_flight's interleaved count, O(v)) gives what taking the rank's table row by row gives,
    # at micro-batch counts past the replay test's (up to 300), groups that do and do not divide them
    def by_rows(forwards, m, v, group):
        held, left = [0] * v, forwards
        for start in range(0, m, group):
            for chunk in range(v):
                take = min(group, m - start, left)
                held[chunk] += take
                left -= take
        return tuple(held)

    for m in (1, 7, 40, 128, 129, 300):
        for v in (1, 2, 5):
            for group in {g for g in (1, 3, 4, 8, 16, m) if g <= m}:
                for forwards in range(0, m * v + 1, max(1, m * v // 97)):
                    assert counts._held_by_chunk(forwards, m, v, group) == by_rows(forwards, m, v, group)


def test_a_plain_replay_caches_its_program_not_its_ops():
    # the plain orders' program reads each rank's order once (_plain_order, _rank_steps: uncached, the same order as
    # rank_order): no per-op tuples stay behind in a cache for the garbage collector to walk
    shape = tl.Shape("interleaved_1f1b", 4, 3, 131, 4)
    assert tl._plain_order(shape, 1) == tl.rank_order(shape, 1)
    tl.rank_order.cache_clear()
    tl.simulate(shape, (1.0,) * 4, (2.0,) * 4, 0.1)
    assert tl.rank_order.cache_info().currsize == 0 and not hasattr(tl._rank_steps, "cache_info")
    assert tl._stepped_program.cache_info().currsize >= 1  # 131 micro-batches in groups of 4: not numbered, kept


def test_a_numbered_program_is_built_as_lists_and_kept_by_none():
    # a numbered plain program (plain_numbered) is built afresh for each replay, as lists (cheaper to build and to run
    # than arrays filled from Python ints): a first ask builds each of its shapes once; nothing keeps it
    shape = tl.Shape("interleaved_1f1b", 8, 10, 144, 8)
    tl._stepped_program.cache_clear()
    tl._REPLAYS.clear()
    prog = tl._program(shape)
    assert all(type(column) is list for column in (prog.prev, prog.dep, prog.takes)) and not prog.prev
    assert not hasattr(tl._program, "cache_info")
    tl.simulate(shape, (1.0,) * 8, (2.0,) * 8, 0.1)
    assert tl._stepped_program.cache_info().currsize == 0
