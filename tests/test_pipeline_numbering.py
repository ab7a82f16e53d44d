"""pipeline_numbering.plain_numbered: the plain orders' replay program numbered in closed form ends every op where the
op-by-op replay does (to the bit), on every shape it numbers; where it declines, the program found by visiting the
ranks in turn runs."""

from __future__ import annotations

import random
from operator import lt

import pytest

from meshplan.arithmetic import pipeline_numbering
from meshplan.arithmetic import pipeline_timeline as tl
from meshplan.arithmetic.pipeline_numbering import numbers, plain_numbered, plain_tail, shared_rows
from meshplan.arithmetic.pipeline_timeline import shape_for


def _chains(prog: tl._Program, fwd: list[float], bwd: list[float], hop: float) -> list[list[float]]:
    """Each rank's op ends in its order, read from the program's run (_run_program's arithmetic): from the rank's
    last op back along prev, or without prev (plain_numbered's) p numbers back, the padding rows (index
    len(seconds): no seconds) skipped."""
    seconds = [(fwd[r], bwd[r])[kinds[0] == "B"] for r, kinds in prog.seconds]
    if not prog.prev:
        p = len(fwd)
        ends, padded = [0.0] * p, [*seconds, 0.0]
        for number, (dep, hopped, takes) in enumerate(zip(prog.dep, prog.hopped, prog.takes, strict=True), start=p):
            ends.append(max(ends[number - p], ends[dep] + (0.0, hop)[hopped]) + padded[takes])
        return [[ends[op] for op in range(last % p, last + 1, p) if op >= p and prog.takes[op - p] < len(seconds)]
                for last in prog.last]
    ends = [0.0]
    for prev, dep, hopped, takes in zip(prog.prev, prog.dep, prog.hopped, prog.takes, strict=True):
        ends.append(max(ends[prev], ends[dep] + (0.0, hop)[hopped]) + seconds[takes])
    chains = []
    for op in prog.last:
        chain = []
        while op:
            chain.append(ends[op])
            op = prog.prev[op - 1]
        chains.append(chain[::-1])
    return chains


def _shapes(order: str) -> list[tl.Shape]:
    shapes = []
    for pp in (2, 3, 4, 8):
        for vpp in (1,) if order != "interleaved_1f1b" else (2, 3, 5):
            for m in sorted({1, 2, pp - 1, pp, pp + 1, 2 * pp, 3 * pp + 1, 17, 24, 40}):
                shapes += [shape_for(order, convention, pp, vpp, max(1, m)) for convention in ("pp", "rounds")]  # type: ignore[arg-type]
    return [*dict.fromkeys(shapes), tl.Shape(order, 8, 10 if order == "interleaved_1f1b" else 1, 136, 8)]  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_the_numbered_program_ends_every_op_where_the_replay_does(order):
    rnd = random.Random(order)
    numbered = 0
    for shape in _shapes(order):
        try:
            prog = tl._plain_program(shape)
        except AssertionError:  # an order that deadlocks on this shape (the rules refuse it): never numbered
            assert tl._numbered(shape) is None
            continue
        fwd = [rnd.uniform(1e-3, 1e-2) for _ in range(shape.pp)]
        bwd = [f * rnd.uniform(1.0, 3.0) for f in fwd]
        hop = rnd.choice([0.0, 3e-4, 2e-3])
        timed = tl.timed_actions(shape, fwd, bwd, hop)
        assert _chains(prog, fwd, bwd, hop) == [[a.end for a in rank] for rank in timed], shape
        assert tl._run_program(prog, tuple(fwd), tuple(bwd), hop, (0.0,) * shape.pp) == \
            tl._replay_actions(shape, fwd, bwd, hop, [0.0] * shape.pp)
        if tl._numbered(shape) is not None:
            numbered += 1
            p = shape.pp
            assert not prog.prev  # each op's previous one: the number p below (numbered from p)
            assert all(map(lt, prog.dep, range(p, len(prog.dep) + p)))  # every input first
            assert len(prog.dep) == (2 * shape.microbatches * shape.vpp + p) * p  # p rows of padding per rank
            padding = [row for row, takes in enumerate(prog.takes) if takes == 2 * p]
            assert len(padding) == p * p and not any(prog.dep[row] or prog.hopped[row] for row in padding)
            # every input is none or crosses a hop (the last stage's backward's own forward: none), and the runs lay
            # out takes (_numbered_ends adds the hop to every input and reads each row's seconds from the runs)
            assert all(prog.hopped[row] for row, dep in enumerate(prog.dep) if dep)
            laid = [2 * p] * len(prog.takes)
            for rows, takes, count in prog.runs:
                laid[rows] = [takes] * count
            assert laid == list(prog.takes)
    assert numbered >= 20


def test_the_searchs_long_shapes_are_numbered_and_the_rest_stepped():
    # Llama-3.1-70B on 64 H100 replays pp 8 and 4, vpp up to 20, 128-144 micro-batches in groups of pp: numbered in
    # closed form; a group that leaves a remainder puts a first-rank forward after the last rank's later position
    # (no column order runs it), so it is found by visiting the ranks in turn, to the same ends
    for shape in (tl.Shape("interleaved_1f1b", 8, 10, 144, 8), tl.Shape("interleaved_1f1b", 4, 20, 136, 4),
                  tl.Shape("1f1b", 8, 1, 144), tl.Shape("gpipe", 4, 1, 128)):
        assert tl._numbered(shape) is not None, shape
    shape = shape_for("interleaved_1f1b", "pp", 4, 3, 10)
    assert shape.microbatches % shape.group and tl._numbered(shape) is None
    seconds = tuple((r, (kind,)) for r in range(4) for kind in "FB")
    assert tl._plain_program(shape) == tl._stepped_program(shape, seconds)


def test_a_warm_up_that_rises_with_the_rank_is_not_numbered():
    # the proof for the inputs between neighbouring ranks needs warm-ups that fall with the rank (strictly below N)
    assert plain_numbered(2, 1, 4, 1, [1, 0]) is not None
    assert plain_numbered(2, 1, 4, 1, [0, 1]) is None
    assert plain_numbered(2, 1, 4, 1, [1, 1]) is None
    assert plain_numbered(2, 1, 4, 1, [4, 4]) is not None  # GPipe: both ranks warm up with every forward


def test_a_shorter_step_shares_the_longer_steps_first_rows():
    # simulate's extension replays one order at two micro-batch counts a period apart: the shorter's first
    # shared_rows rows are the longer's, row for row, so _replay_pair takes their ends from the longer's run and runs
    # the rest, to the same bits as two whole replays (uneven ranks, hops, the last virtual stage's seconds apart or
    # not: simulate's `last`, a rank p past the ranks); 0 where it is not proven (GPipe's warm-ups grow with m, a count
    # that leaves its last group short)
    rnd = random.Random(23)
    shared = apart = 0
    for order in ("1f1b", "interleaved_1f1b", "gpipe"):
        for convention in ("pp", "rounds"):
            for pp in (2, 3, 4, 5, 8):
                for vpp in (1,) if order != "interleaved_1f1b" else (2, 3, 5):
                    for m in sorted({pp, 2 * pp, 3 * pp + 1, 4 * pp, 40, 48, 60}):
                        shorter = shape_for(order, convention, pp, vpp, m)  # type: ignore[arg-type]
                        period = tl._periodic(shorter)
                        if not period:
                            continue
                        longer = tl._resized(shorter, m + period)
                        ranks = pp + rnd.randint(0, 1)  # one more: the last stage's own seconds
                        fwd = [rnd.uniform(1e-3, 1e-2) for _ in range(ranks)]
                        bwd = [f * rnd.uniform(1.0, 3.0) for f in fwd]
                        hop, w = rnd.choice([0.0, 3e-4, 2e-3]), (0.0,) * ranks
                        tl._REPLAYS.clear()
                        try:
                            whole = tl._replay(longer, fwd, bwd, hop, w), tl._replay(shorter, fwd, bwd, hop, w)
                        except AssertionError:  # an order that deadlocks on this shape (the rules refuse it)
                            continue
                        tl._REPLAYS.clear()
                        assert tl._replay_pair(longer, shorter, fwd, bwd, hop, w) == whole, (shorter, ranks)
                        apart += ranks > pp
                        rows = shared_rows(pp, vpp, shorter.group, m, m + period, tl._warmups(shorter),
                                           tl._warmups(longer))
                        if order == "gpipe" or m % shorter.group:
                            assert rows == 0
                        programs = tl._numbered_program(longer), tl._numbered_program(shorter)
                        if rows and None not in programs:
                            shared += 1
                            for column in range(1, 4):  # dep, hopped, takes (prev: the number p below)
                                assert list(programs[0][column][:rows]) == list(programs[1][column][:rows])
    assert shared >= 150 and apart >= 100


def test_the_searchs_extension_runs_the_shorter_steps_last_rows():
    # Llama-3.1-70B on 64 H100: pp 8, vpp 5, 144 and 128 micro-batches in groups of 8: of the shorter program's
    # (2N + p) p rows, those from column 2N - w0 on run (w0 = 2 (p - 1) + (v - 1) G = 46 warm-up forwards on rank 0)
    longer, shorter = tl.Shape("interleaved_1f1b", 8, 5, 144, 8), tl.Shape("interleaved_1f1b", 8, 5, 128, 8)
    rows = shared_rows(8, 5, 8, 128, 144, tl._warmups(shorter), tl._warmups(longer))
    assert tl._warmups(shorter)[0] == 46 and rows == (2 * 640 - 46) * 8
    assert len(tl._numbered_program(shorter).dep) - rows == (46 + 8) * 8  # 432 of 10,304


def test_the_tail_numbered_alone_is_the_whole_programs_tail():
    # plain_tail writes the rows from a column on by plain_numbered's own slices: the rows plain_numbered gives there,
    # padding included, and each rank's last op, on every shape plain_numbered numbers with a count that fills its
    # last group (column 0: the whole program); a short last group: None
    checked = 0
    for order in ("1f1b", "interleaved_1f1b"):
        for convention in ("pp", "rounds"):
            for pp in (2, 3, 4, 5, 8):
                for vpp in (1,) if order == "1f1b" else (2, 3, 5):
                    for m in sorted({pp, 2 * pp, 3 * pp + 1, 4 * pp, 40, 48, 60, 128}):
                        shape = shape_for(order, convention, pp, vpp, m)  # type: ignore[arg-type]
                        warmups = tl._warmups(shape)
                        whole = plain_numbered(pp, vpp, m, shape.group, warmups)
                        if whole is None:
                            continue
                        for column in (0, m, 2 * m * vpp - max(warmups)):
                            tail = plain_tail(pp, vpp, m, shape.group, warmups, column)
                            if m % shape.group:
                                assert tail is None
                                continue
                            assert tail is not None and tail[3] == whole[3], (shape, column)
                            for part in range(3):
                                assert list(tail[part]) == list(whole[part][column * pp:]), (shape, column, part)
                            checked += 1
    assert checked >= 300


def test_the_numbers_are_one_kept_list_up_to_a_bound():
    # a numbered program's op numbers and a replay's row numbers are copied from one kept list of ints (made once,
    # extended when too short), not made afresh per program; past NUMBERS_KEPT a list is made for the one call
    kept = numbers(10)
    assert kept[:10] == list(range(10)) and numbers(5) is kept
    grown = numbers(len(kept) + 7)
    assert grown is kept and grown == list(range(len(grown)))
    whole = tl._numbered(tl.Shape("interleaved_1f1b", 4, 2, 8, 4))
    assert whole is not None and all(number is kept[number] for number in whole[0] if number)
    beyond = numbers(pipeline_numbering.NUMBERS_KEPT + 1)
    assert beyond is not kept and len(beyond) == pipeline_numbering.NUMBERS_KEPT + 1


@pytest.mark.parametrize(("order", "p", "v", "m"), [("1f1b", 4, 1, 16), ("1f1b", 4, 2, 8), ("1f1b", 8, 5, 40),
                                                    ("gpipe", 3, 1, 6), ("1f1b", 2, 24, 32)])
def test_the_last_stage_apart_numbers_like_the_stepped_program(order, p, v, m):
    """The numbered program with the last virtual stage's ops at their own seconds (simulate's `last`) replays every
    op where the stepped one does, to the bit."""
    shape = tl.shape_for(order, "pp", p, v, m)
    rng = random.Random(p * 100 + v * 10 + m)
    fwd = tuple(rng.uniform(0.5, 1.5) for _ in range(p + 1))
    bwd = tuple(2 * f for f in fwd)
    numbered = tl._numbered_last_apart(shape)
    assert numbered is not None
    stepped = tl._stepped_program(shape, tl._plain_seconds(p + 1), True)
    assert tl._run_program(numbered, fwd, bwd, 0.01, (0.0,) * (p + 1)) == \
        tl._run_program(stepped, fwd, bwd, 0.01, (0.0,) * (p + 1))
