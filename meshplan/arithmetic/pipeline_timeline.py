"""A pipeline step replayed op by op: each rank runs its forward and backward chunks in its schedule's order, each
op waits for the op of the same micro-batch on the neighbouring virtual stage (plus one p2p hop), and the step ends
when the last rank finishes. The step time and the idle share come from that timeline for any micro-batch count,
not the steady state's (p-1)/(v*m) bubble (what a rank holds at its peak, from the same order: pipeline_counts.py).

Orders, as the frameworks build them:
- GPipe: every forward, then every backward (torch.distributed.pipelining ScheduleGPipe).
- 1F1B: min(m, p - r - 1) warm-up forwards on rank r, then one forward and one backward in turn, then the remaining
  backwards (Megatron-Core schedules.py forward_backward_pipelining_without_interleaving; torch Schedule1F1B's
  warm-up of p - r forwards then 1B1F is the same order).
- interleaved 1F1B: the micro-batches in groups of G; forward k of a rank runs virtual chunk (k // G) % v on the
  k-th micro-batch of that chunk, backward k chunk v - 1 - (k // G) % v; rank r warms up 2*(p - r - 1) + (v - 1)*G
  forwards (capped at m*v), then one forward and one backward in turn. Megatron-Core (get_pp_rank_microbatches,
  get_schedule_table: G = microbatch_group_size_per_vp_stage, pp by default, the last group taking the remainder)
  and torch ScheduleInterleaved1F1B (_get_1f1b_rank_ops: G = microbatches_per_round = m // max(1, m // p)) build
  the same order for the same G.
- zero-bubble (torch ScheduleInterleavedZeroBubble, ZB1P; torchtitan InterleavedZeroBubble): the interleaved order
  of torch with the backward split into its input gradient I (what the previous stage waits for) and its weight
  gradient W; rank r warms up (v - 1)*G + (p - 1 - r) forwards, then F and I in turn, each I followed by the W of an
  earlier backward once r of them have run; the W left run at the end (_get_1f1b_rank_ops, enable_zero_bubble).
- ZBV zero-bubble (torch ScheduleZBVZeroBubble; torchtitan ZBVZeroBubble): two chunks per rank in a V (rank r runs
  stage r and stage 2p - 1 - r, so the last stage is on rank 0), its warm-up, steady and cool-down phases as
  torch's _calculate_single_rank_operations writes them.
- DualPipeV (torch ScheduleDualPipeV; torchtitan DualPipeV): the V placement, DeepSeek's eight steps; its
  overlapped forward+backward pairs run their two halves one after the other in torch's runtime (OVERLAP_F_B runs
  its sub-actions in turn unless a custom function is registered, which torchtitan's trainer does not), so the
  replay runs them in turn too; the backwards of its last steps split into I and W.
- combined 1F1B (Megatron-Core overlap_moe_expert_parallel_comm, combined_1f1b.py): the interleaved order with one
  extra warm-up forward (get_pp_rank_microbatches), each steady-state forward fused with the backward beside it into
  one step that starts when both inputs are in (combined_forward_backward_step); the EP all-to-all it hides is in
  the op times (estimate/moe_time.py).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

from meshplan.arithmetic.pipeline_numbering import (
    Runs,
    numbers,
    plain_numbered,
    plain_tail,
    rank_rows,
    shared_rows,
)
from meshplan.arithmetic.pipeline_split import Action, dualpipev_actions, zbv_actions, zero_bubble_actions
from meshplan.knowledge.pipeline_card import InterleaveGroup as Group
from meshplan.knowledge.pipeline_card import PipelineOrder

# The orders the replay knows: the frameworks' default ones (the cards' PipelineOrder) and the ones a plan's
# pipeline_schedule names.
Order = Literal["gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev",
                "combined_1f1b"]
# Orders whose backward is split into its input gradient (I) and weight gradient (W).
SPLIT_ORDERS = frozenset({"interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev"})
# Orders that place a rank's two chunks in a V: rank r runs stages r and 2p - 1 - r.
V_ORDERS = frozenset({"zbv_zero_bubble", "dualpipev"})

# A simulated op of the plain orders: (backward?, virtual chunk on the rank, micro-batch)
Op = tuple[bool, int, int]

# Micro-batches replayed op by op before the step is extended by its steady-state period (see `simulate`).
EXACT_MICROBATCHES = 128


@dataclass(frozen=True)
class Shape:
    """What fixes every rank's order: the schedule, pipeline ranks p, virtual chunks v per rank, micro-batches m and
    the interleaved group G (micro-batches per chunk round; ignored without interleaving)."""

    order: Order
    pp: int
    vpp: int
    microbatches: int
    group: int = 1

    @property
    def stages(self) -> int:
        return self.pp * self.vpp

    def stage(self, chunk: int, rank: int) -> int:
        """The virtual stage of a rank's chunk: chunk * p + rank (looped), or the V of two chunks."""
        if self.order in V_ORDERS:
            return rank if chunk == 0 else 2 * self.pp - 1 - rank
        return chunk * self.pp + rank

    def rank_of(self, stage: int) -> int:
        if self.order in V_ORDERS:
            return stage if stage < self.pp else 2 * self.pp - 1 - stage
        return stage % self.pp


def interleave_group(convention: Group, pp: int, microbatches: int) -> int:
    """Micro-batches a rank runs on one virtual chunk before moving to the next: Megatron-Core's
    microbatch_group_size_per_vp_stage (pp by default; with fewer micro-batches the groups cannot fill, rule PP005
    refuses it, and the order shrinks the group to m), or torch's microbatches_per_round m // max(1, m // p)."""
    m = max(1, microbatches)
    if convention == "rounds":
        return m // max(1, m // pp)
    return min(pp, m)


@lru_cache(maxsize=1024)  # small ints and names; asked for each plan's STEP floor and its replay
def shape_for(order: PipelineOrder | Order, convention: Group, pp: int, vpp: int, microbatches: int) -> Shape:
    """The shape of a plan's pipeline. The frameworks' default orders (gpipe, 1f1b): interleaved only with vpp > 1
    (one chunk per rank is plain 1F1B). A named order keeps its own name (zero-bubble with two chunks is the V of
    ZBV); every interleaved one takes the framework's group."""
    m = max(1, microbatches)
    if pp == 1:
        return Shape("gpipe" if order == "gpipe" else "1f1b", pp, 1, m)
    if order in ("interleaved_zero_bubble", "combined_1f1b"):
        return Shape(order, pp, vpp, m, interleave_group("rounds" if order != "combined_1f1b" else convention, pp, m))
    if order in V_ORDERS:
        return Shape(order, pp, vpp, m)
    if vpp > 1:
        return Shape("interleaved_1f1b", pp, vpp, m, interleave_group(convention, pp, m))
    return Shape("gpipe" if order == "gpipe" else "1f1b", pp, 1, m)


def schedule_order(schedule: str, vpp: int) -> Order:
    """The order a plan's pipeline_schedule runs: zero_bubble is torch's ZBV at two chunks per rank (the V it is built
    for) and its interleaved zero-bubble (ZB1P) at more; interleaved_1f1b is 1F1B at vpp = 1 (as the frameworks build
    it); the rest are their own order."""
    if schedule == "zero_bubble":
        return "zbv_zero_bubble" if vpp == 2 else "interleaved_zero_bubble"
    if schedule == "interleaved_1f1b" and vpp == 1:
        return "1f1b"
    return schedule  # type: ignore[return-value]


# The pipeline_schedule a user names for each order (schedule_order's inverse).
SCHEDULE_OF_ORDER: dict[str, str] = {
    "gpipe": "gpipe", "1f1b": "1f1b", "interleaved_1f1b": "interleaved_1f1b", "interleaved_zero_bubble": "zero_bubble",
    "zbv_zero_bubble": "zero_bubble", "dualpipev": "dualpipev", "combined_1f1b": "combined_1f1b"}


def _chunk_microbatches(shape: Shape) -> list[tuple[int, int]]:
    """(chunk, micro-batch) of a rank's forwards in order: Megatron's get_schedule_table (groups of G, the last
    group the rest), chunk by chunk within a group."""
    m, v, g = shape.microbatches, shape.vpp, shape.group
    table: list[tuple[int, int]] = []
    for start in range(0, m, g):
        stop = m if start + g >= m else start + g
        table.extend((c, mb) for c in range(v) for mb in range(start, stop))
    return table


@lru_cache(maxsize=4096)
def rank_order(shape: Shape, rank: int) -> tuple[Op, ...]:
    """The forwards and backwards rank `rank` runs, in its schedule's order (the plain orders; the others:
    rank_actions)."""
    if shape.order in SPLIT_ORDERS and shape.pp > 1:
        return tuple((a.kind != "F", a.chunk, a.mb) for a in rank_actions(shape, rank) if a.kind != "W")
    return _plain_order(shape, rank)


def _plain_order(shape: Shape, rank: int) -> tuple[Op, ...]:
    """rank_order of the orders that do not split the backward (GPipe, 1F1B, interleaved and combined 1F1B), uncached:
    a replay's program (_plain_program, cached per shape) reads it once, and a cached copy of its ~10^4 small tuples
    per shape would stay for the garbage collector to walk (Llama-3.1-70B on 64 H100: 0.34 M tuples, 20 ms of a first
    ask's collection)."""
    m, p, v = shape.microbatches, shape.pp, shape.vpp
    if shape.order == "gpipe" or p == 1:
        return tuple((False, 0, k) for k in range(m)) + tuple((True, 0, k) for k in range(m))
    if shape.order == "1f1b":
        table = [(0, k) for k in range(m)]
        warmup = min(p - rank - 1, m)
    else:
        table = _chunk_microbatches(shape)
        warmup = warmup_forwards(shape, rank)
    forwards = [(False, c, mb) for c, mb in table]
    backwards = [(True, v - 1 - c, mb) for c, mb in table]
    ops: list[Op] = forwards[:warmup]
    for k in range(len(table) - warmup):
        ops += [forwards[warmup + k], backwards[k]]
    return tuple(ops + backwards[len(table) - warmup:])


def warmup_forwards(shape: Shape, rank: int) -> int:
    """Forwards rank `rank` runs before its first backward in the interleaved orders: 2(p - r - 1) + (v - 1)G, one
    more for combined 1F1B (Megatron's get_pp_rank_microbatches: 'one extra micro-batch forward step before the 1f1b
    stages' so each combined step's forward and backward are independent), at most m*v."""
    p, v = shape.pp, shape.vpp
    extra = 1 if shape.order == "combined_1f1b" else 0
    return min(2 * (p - rank - 1) + (v - 1) * shape.group + extra, shape.microbatches * v)


@lru_cache(maxsize=4096)
def rank_actions(shape: Shape, rank: int) -> tuple[Action, ...]:
    """Every op rank `rank` runs, in its schedule's order, the backward split into I and W where the order splits it
    and the steady-state forward fused with its backward where the order fuses them."""
    if shape.order == "interleaved_zero_bubble" and shape.pp > 1:
        return zero_bubble_actions(shape.pp, shape.vpp, shape.microbatches, shape.group, rank)
    if shape.order == "zbv_zero_bubble" and shape.pp > 1:
        return zbv_actions(shape.pp, shape.microbatches, rank)
    if shape.order == "dualpipev" and shape.pp > 1:
        return dualpipev_actions(shape.pp, shape.microbatches, rank)
    order = rank_order(shape, rank)
    if shape.order != "combined_1f1b" or shape.pp == 1:
        return tuple(Action("B" if backward else "F", chunk, mb) for backward, chunk, mb in order)
    warmup = warmup_forwards(shape, rank)  # each steady-state forward and the backward after it: one combined step
    steady = range(warmup, warmup + 2 * (shape.microbatches * shape.vpp - warmup), 2)  # those forwards' positions
    return tuple(Action("B" if backward else "F", chunk, mb, k in steady)
                 for k, (backward, chunk, mb) in enumerate(order))


@dataclass(frozen=True)
class Timeline:
    """A replayed step: its seconds, and each rank's busy seconds in it."""

    seconds: float
    busy: tuple[float, ...]

    @property
    def idle_share(self) -> float:
        """The share of rank-seconds idle: 1 - busy / (ranks x step)."""
        if self.seconds <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * self.seconds)


def _rank_steps(shape: Shape, rank: int) -> list[tuple[bool, int, int, bool]]:
    """Each op of the rank's order as (backward?, its slot, the slot it waits for (-1: none), whether that input
    crosses a hop); a slot is stage * m + micro-batch, the input a forward's slot for the last stage's backward.
    Uncached, like _plain_order: only _plain_program reads it, once per shape."""
    p, s, m = shape.pp, shape.stages, shape.microbatches
    steps = []
    for backward, chunk, mb in _plain_order(shape, rank):
        stage = chunk * p + rank
        slot = stage * m + mb
        if backward:
            steps.append((True, slot, slot if stage == s - 1 else slot + m, stage < s - 1))
        else:
            steps.append((False, slot, slot - m if stage else -1, stage > 0))
    return steps


def _replay(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float,
            wgrad: Sequence[float] = ()) -> float:
    """The step's seconds: every rank runs its order; an op starts when its rank is free and its input has arrived
    (a forward from the previous virtual stage, a backward from the next, each one hop later; the last stage's
    backward follows its own forward), a fused pair when both inputs have. Each op ends at max(its rank's previous
    end, its input's end + hop) + its seconds whatever order the ops are visited in, so the replay runs the shape's
    ops in one precomputed order (_program) and keeps the step of each distinct input (a pure function of them)."""
    key = (shape, tuple(fwd), tuple(bwd), hop, tuple(wgrad))
    hit = _REPLAYS.get(key)
    if hit is None:
        if len(_REPLAYS) >= 4096:
            _REPLAYS.clear()
        hit = _REPLAYS[key] = _run_program(_program(shape, len(key[1]) > shape.pp), key[1], key[2], hop,
                                           key[4] or (0.0,) * len(key[1]))
    return hit


_REPLAYS: dict[tuple, float] = {}  # _replay's steps by their inputs


class _Program(NamedTuple):
    """A shape's ops in an order where each comes after its rank's previous op and its inputs: per op, the op
    before it on its rank, its input (ops are numbered from 1; 0: none), whether the input crosses a hop, a fused
    pair's second input and hop (0 where there is none; both empty where nothing is fused), and which of `seconds`
    it takes; and each rank's last op. No previous ops (plain_numbered's programs of p ranks): ops are numbered
    from p, each rank's previous op is the number p below, a row that waits for nothing and takes index
    len(seconds) (no seconds) carries its rank's end on, every input crosses a hop (or is none: _numbered_ends), and
    runs lays out takes by slices where the program has them (plain_numbered's), but for the rows in `apart`, whose
    takes the runs do not give (the last virtual stage's ops where its seconds are apart: _last_stage_rows)."""

    prev: Sequence[int]  # arrays where the program is kept, lists where it is built afresh (_plain_program)
    dep: Sequence[int]
    hopped: Sequence[int]
    dep2: Sequence[int]
    hopped2: Sequence[int]
    takes: Sequence[int]
    # (rank, kinds): an op's seconds, a fused pair's both (the rank per op where one of them is the last stage's)
    seconds: tuple[tuple[int | tuple[int, ...], tuple[str, ...]], ...]
    last: tuple[int, ...]
    runs: Runs = ()
    apart: Sequence[int] = ()


def _program(shape: Shape, last_apart: bool = False) -> _Program:
    """The ops of `shape` in the order the ranks can run them: a plain order's (_plain_program: numbered afresh, the
    rest kept), else the kept one (_action_program). `last_apart`: the last virtual stage's ops take their own
    seconds, those of a rank p past the ranks (simulate's `last`), so a plain order is stepped, not numbered."""
    if shape.order in ("gpipe", "1f1b", "interleaved_1f1b"):
        if last_apart:
            return _numbered_last_apart(shape) or _stepped_program(shape, _plain_seconds(shape.pp + 1), True)
        return _plain_program(shape)
    return _action_program(shape, last_apart)


def _numbered_last_apart(shape: Shape) -> _Program | None:
    """_numbered_program with the last virtual stage's ops taking rank p's seconds (index 2p and 2p + 1; the rows no
    op takes at 2p + 2, past them): the runs lay out every other row, those ops' rows (_last_stage_rows) are set
    after them. None where the shape is not numbered."""
    p = shape.pp
    numbered = _numbered(shape, 2 * p + 2)
    if numbered is None:
        return None
    dep, hopped, takes, last, runs = numbered
    apart = _take_last_apart(takes, _last_stage_rows(shape), p)
    return _Program([], dep, hopped, [], b"", takes, _plain_seconds(p + 1), last, runs, apart)


def _last_stage_rows(shape: Shape) -> tuple[list[int], list[int]]:
    """The rows of a numbered plain program (plain_numbered's) that run the last virtual stage: rank p - 1's
    forwards of its last chunk and its backwards of it (backward i runs chunk v - 1 - c of table entry i), each
    group's entries of chunk c sliced out of the table (_chunk_microbatches: group by group, chunk by chunk within)."""
    p, v, m, g = shape.pp, shape.vpp, shape.microbatches, shape.group
    forwards, backwards = rank_rows(p, m * v, p - 1, _warmups(shape)[p - 1])
    if v == 1:  # every op of the rank runs the one chunk
        return forwards, backwards
    last_forwards: list[int] = []
    first_backwards: list[int] = []
    for start in range(0, m, g):
        size = (m if start + g >= m else start + g) - start
        first = start * v  # the group's first entry (the groups before are whole)
        last_forwards += forwards[first + (v - 1) * size:first + v * size]
        first_backwards += backwards[first:first + size]
    return last_forwards, first_backwards


def _take_last_apart(takes: list[int], rows: tuple[list[int], list[int]], p: int, first: int = 0) -> list[int]:
    """Sets the last virtual stage's forward and backward rows (_last_stage_rows, those from row `first` on, each
    `first` rows back: a tail's) to rank p's seconds, 2p and 2p + 1, in place; returns the rows set."""
    apart = []
    for rows_of, index in zip(rows, (2 * p, 2 * p + 1), strict=True):
        for row in rows_of:
            if row >= first:
                takes[row - first] = index
                apart.append(row - first)
    return apart


# about 13 bytes an op: 0.3 MB for the largest shapes the search replays (23 k ops), a few kB for most. 256: the
# 124-129 distinct shapes one exhaustive request of 16 GPUs replays (64 rebuilt each about three times, ~25 ms each)
@lru_cache(maxsize=256)
def _action_program(shape: Shape, last_apart: bool = False) -> _Program:
    """_program of the orders that split or fuse ops: visiting the ranks in turn, each as far as its inputs allow
    (each op's position fixed by the order alone, not by its seconds). `last_apart`: the last virtual stage's ops take
    the seconds of rank p (one past the ranks), a fused pair's two ops each their own rank's."""
    p = shape.pp
    last_slots = (shape.stages - 1) * shape.microbatches if last_apart else None
    steps = [_action_steps(shape, r) for r in range(p)]
    size = shape.stages * shape.microbatches
    done = ([0] * size, [0] * size)  # the op that ends each slot's forward / backward (B or I); 0: not yet run
    pos, last = [0] * p, [0] * p
    columns: tuple[list[int], ...] = ([], [], [], [], [], [])  # _Program's first six, in order
    seconds: dict[tuple[int, tuple[str, ...]], int] = {}
    remaining = sum(map(len, steps))
    while remaining:
        moved = 0
        for r in range(p):
            order, k = steps[r], pos[r]
            while k < len(order):
                run = order[k:k + 2] if order[k][5] else order[k:k + 1]
                inputs = [0, 0, 0, 0]  # (input, hop) of each op of the run
                for i, (_, _, dep, source, hopped, _) in enumerate(run):
                    if dep >= 0:
                        inputs[2 * i], inputs[2 * i + 1] = done[source][dep], hopped
                        if not inputs[2 * i]:
                            break
                else:
                    owner: int | tuple[int, ...] = r
                    if last_slots is not None and any(step[1] >= last_slots for step in run):
                        owner = tuple(p if step[1] >= last_slots else r for step in run)
                    for column, value in zip(columns, (last[r], *inputs, seconds.setdefault(
                            (owner, tuple(step[0] for step in run)), len(seconds))), strict=True):
                        column.append(value)
                    last[r] = len(columns[0])
                    for kind, slot, *_ in run:
                        if kind != "W":
                            done[_FROM_F if kind == "F" else _FROM_B][slot] = last[r]
                    k += len(run)
                    continue
                break
            moved += k - pos[r]
            pos[r] = k
        if not moved:
            raise AssertionError(f"pipeline order deadlocks: {shape}")
        remaining -= moved
    if not any(columns[3]):  # nothing fused: no second inputs
        columns[3].clear()
        columns[4].clear()
    return _Program(*(array("b" if i in (2, 4) else "i", column) for i, column in enumerate(columns)),
                    seconds=tuple(seconds), last=tuple(last))


def _plain_program(shape: Shape) -> _Program:
    """_program of the plain orders (no split backward, nothing fused): numbered in closed form where it can be
    (pipeline_numbering.plain_numbered: lists built afresh for each replay, cheaper than arrays to build and to run,
    and kept by none), else from their steps (_rank_steps) replayed rank by rank (kept)."""
    numbered = _numbered_program(shape)
    if numbered is not None:
        return numbered
    return _stepped_program(shape, _plain_seconds(shape.pp))


def _plain_seconds(p: int) -> tuple[tuple[int, tuple[str, ...]], ...]:
    return tuple((r, (kind,)) for r in range(p) for kind in "FB")  # 2 r + backward


def _numbered_program(shape: Shape) -> _Program | None:
    numbered = _numbered(shape)
    if numbered is None:
        return None
    return _Program([], *numbered[:2], [], b"", numbered[2], _plain_seconds(shape.pp), *numbered[3:])


@lru_cache(maxsize=64)
def _stepped_program(shape: Shape, seconds: tuple[tuple[int, tuple[str, ...]], ...],
                     last_apart: bool = False) -> _Program:
    """_plain_program found by visiting the ranks in turn, each as far as its inputs allow, from their steps
    (_rank_steps): for the shapes plain_numbered does not number, and where the last virtual stage's ops take the
    seconds of rank p, one past the ranks (`last_apart`)."""
    p = shape.pp
    last_slots = (shape.stages - 1) * shape.microbatches if last_apart else shape.stages * shape.microbatches
    steps = [_rank_steps(shape, r) for r in range(p)]
    size = shape.stages * shape.microbatches
    done_f, done_b = [0] * size, [0] * size
    pos, last = [0] * p, [0] * p
    prev: list[int] = []
    dep_of: list[int] = []
    hops: list[bool] = []
    takes: list[int] = []
    remaining = sum(map(len, steps))
    while remaining:
        moved = 0
        for r in range(p):
            order, k, op = steps[r], pos[r], last[r]
            end = len(order)
            while k < end:
                backward, slot, dep, hopped = order[k]
                source = done_b if backward and hopped else done_f
                ran = source[dep] if dep >= 0 else 0
                if not ran and dep >= 0:
                    break
                prev.append(op)
                dep_of.append(ran)
                hops.append(hopped)
                takes.append(2 * (p if slot >= last_slots else r) + backward)
                op = len(prev)
                (done_b if backward else done_f)[slot] = op
                k += 1
            moved += k - pos[r]
            pos[r], last[r] = k, op
        if not moved:
            raise AssertionError(f"pipeline order deadlocks: {shape}")
        remaining -= moved
    return _Program(array("i", prev), array("i", dep_of), array("b", hops), array("i"), array("b"), array("i", takes),
                    seconds, tuple(last))


def _numbered(shape: Shape, padding: int | None = None) -> tuple[list[int], bytearray, list[int], tuple[int, ...],
                                                                 Runs] | None:
    """plain_numbered's program of a plain shape of p > 1 ranks, from each rank's warm-up forwards (_warmups), its
    rows that no op takes at index `padding` (plain_numbered's); None where it does not number the shape."""
    if shape.pp == 1 or (shape.vpp > 1 and shape.order != "interleaved_1f1b"):
        return None
    return plain_numbered(shape.pp, shape.vpp, shape.microbatches, shape.group, _warmups(shape), padding)


def _warmups(shape: Shape) -> list[int]:
    """Each rank's warm-up forwards in a plain order (_plain_order's: every forward for GPipe, min(p - r - 1, m) for
    1F1B)."""
    p, m = shape.pp, shape.microbatches
    if shape.order == "interleaved_1f1b":
        return [warmup_forwards(shape, r) for r in range(p)]
    return [m if shape.order == "gpipe" else min(p - r - 1, m) for r in range(p)]


def _run_program(prog: _Program, fwd: tuple[float, ...], bwd: tuple[float, ...], hop: float,
                 wgrad: tuple[float, ...]) -> float:
    """The program's step: the latest end of a rank's last op (_ends)."""
    ends = _ends(prog, fwd, bwd, hop, wgrad)
    return max(ends[op] for op in prog.last)


def _ends(prog: _Program, fwd: tuple[float, ...], bwd: tuple[float, ...], hop: float, wgrad: tuple[float, ...],
          known: list[float] | None = None) -> list[float]:
    """Each op's end (index: its number; 0: nothing, at 0.0): max(its rank's previous end, its inputs' ends + their
    hops) + its seconds (an input without a hop: + 0.0, the same number); a fused pair takes both ops' seconds.
    Without previous ops (plain_numbered's), the one p below, from p ends of 0.0; a padding row: that end + 0.0.
    `known`: the ends of the ops numbered before the program's first row (another program's, which numbers them
    alike: _replay_pair), extended in place."""
    per_kind = [{"F": fwd[r], "B": bwd[r], "I": bwd[r] - wgrad[r], "W": wgrad[r]} for r in range(len(fwd))]
    seconds = [sum(per_kind[r][kind] for kind in kinds) if isinstance(r, int) else
               sum(per_kind[o][kind] for o, kind in zip(r, kinds, strict=True)) for r, kinds in prog.seconds]
    hops = (0.0, hop)
    if not prog.prev:  # ops numbered from p (the ranks: len(prog.last), one fewer than fwd's where `last` is apart)
        seconds.append(0.0)
        if 0.0 <= hop < math.inf:
            return _numbered_ends(prog, seconds, hop, known or [0.0] * len(prog.last))
        ends = known or [0.0] * len(prog.last)
        below = -len(prog.last)
        for dep, hopped, takes in zip(prog.dep, prog.hopped, prog.takes, strict=True):
            free, ready = ends[below], ends[dep] + hops[hopped]
            ends.append((free if free > ready else ready) + seconds[takes])
        return ends
    ends = known or [0.0]
    append = ends.append
    if not prog.dep2:
        for prev, dep, hopped, takes in zip(prog.prev, prog.dep, prog.hopped, prog.takes, strict=True):
            free, ready = ends[prev], ends[dep] + hops[hopped]
            append((free if free > ready else ready) + seconds[takes])
    else:
        for prev, dep, hopped, dep2, hopped2, takes in zip(*prog[:6], strict=True):
            free, ready, other = ends[prev], ends[dep] + hops[hopped], ends[dep2] + hops[hopped2]
            if ready > free:
                free = ready
            append((free if free > other else other) + seconds[takes])
    return ends


def _numbered_ends(prog: _Program, seconds: list[float], hop: float, ends: list[float]) -> list[float]:
    """_ends of a numbered program (no previous ops: each op's previous one is p below; append: the list's own fast
    path) and a finite hop, in fewer instructions a row: its inputs are none (op 0) or cross a hop (plain_numbered),
    so the hop is added to every input with op 0's end held at -hop meanwhile (-hop + hop is 0.0 exactly, what an
    input of none gives: rank 0's first op, the only one that reads op 0 as its previous, starts at 0.0 either way);
    each row's seconds are laid out beforehand by the program's runs (its takes read one by one where it has none:
    plain_tail's rows) rather than looked up in the loop; the previous op is read at its index from the kept ints
    (pipeline_numbering.numbers: a list's fast index, where ends[-p] takes the generic one), two rows a turn (Llama-
    3.1-70B on 64 H100: about 800 instructions a row, from 1,150 in _ends' loop)."""
    if prog.runs:
        times = [0.0] * len(prog.takes)
        for rows, takes, count in prog.runs:
            times[rows] = [seconds[takes]] * count
        for row in prog.apart:
            times[row] = seconds[prog.takes[row]]
    else:
        times = [seconds[takes] for takes in prog.takes]
    ends[0] = -hop
    first = len(ends) - len(prog.last)  # the row's previous op: ends[row + first] (a kept int: a list's fast index)
    rows, deps, took = iter(numbers(first + len(times))[first:first + len(times)]), iter(prog.dep), iter(times)
    for row, dep, took1, row2, dep2, took2 in zip(rows, deps, took, rows, deps, took, strict=False):  # 2 rows a turn
        free, ready = ends[row], ends[dep] + hop
        ends.append((free if free > ready else ready) + took1)
        free, ready = ends[row2], ends[dep2] + hop
        ends.append((free if free > ready else ready) + took2)
    if len(times) % 2:
        row = len(ends) - len(prog.last)
        free, ready = ends[row], ends[prog.dep[-1]] + hop
        ends.append((free if free > ready else ready) + times[-1])
    ends[0] = 0.0
    return ends


# What a step's op waits for: a forward's output (F) or a backward's input gradient (B or I).
_FROM_F, _FROM_B = 0, 1


@lru_cache(maxsize=256)
def _action_steps(shape: Shape, rank: int) -> tuple[tuple[str, int, int, int, bool, bool], ...]:
    """Each action of the rank as (kind, its slot, the slot it waits for (-1: none), whether that slot is a forward's
    or a backward's, whether the input crosses a hop, fused with the next); a slot is stage * m + micro-batch. A W
    waits for its own I; with the V placement two neighbouring stages may share a rank (no hop)."""
    s, m = shape.stages, shape.microbatches
    steps = []
    for a in rank_actions(shape, rank):
        stage = shape.stage(a.chunk, rank)
        slot = stage * m + a.mb
        if a.kind == "F":
            dep = (slot - m, _FROM_F, shape.rank_of(stage - 1) != rank) if stage else (-1, _FROM_F, False)
        elif a.kind == "W":
            dep = (slot, _FROM_B, False)
        elif stage == s - 1:
            dep = (slot, _FROM_F, False)
        else:
            dep = (slot + m, _FROM_B, shape.rank_of(stage + 1) != rank)
        steps.append((a.kind, slot, *dep, a.fused))
    return tuple(steps)


def _replay_actions(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float,
                    wgrad: Sequence[float], record: list[list[tuple[float, float]]] | None = None) -> float:
    """_replay for every order: F, B, I (bwd - wgrad) and W (wgrad) ops; a fused pair starts when its rank is free
    and both inputs are in, and takes both ops' seconds. With `record`, each rank's ops' (start, end) are appended
    in its order (a fused pair's two ops back to back; the pair ends where the step's arithmetic says)."""
    p = shape.pp
    steps = [_action_steps(shape, r) for r in range(p)]
    size = shape.stages * shape.microbatches
    done = ([-1.0] * size, [-1.0] * size)  # forwards' and backwards' (B or I) ends per slot
    seconds = [{"F": fwd[r], "B": bwd[r], "I": bwd[r] - wgrad[r], "W": wgrad[r]} for r in range(p)]
    pos, free = [0] * p, [0.0] * p
    remaining = sum(map(len, steps))

    def ready(step: tuple[str, int, int, int, bool, bool]) -> float:
        _, _, dep, source, hopped, _ = step
        if dep < 0:
            return 0.0
        at = done[source][dep]
        return at if at < 0 or not hopped else at + hop

    while remaining:
        moved = 0
        for r in range(p):
            order, k, t = steps[r], pos[r], free[r]
            while k < len(order):
                run = order[k:k + 2] if order[k][5] else order[k:k + 1]
                starts = [ready(step) for step in run]
                if min(starts) < 0:
                    break
                begin = max(t, *starts)
                t = begin + sum(seconds[r][step[0]] for step in run)
                if record is not None and len(run) == 2:
                    middle = begin + seconds[r][run[0][0]]
                    record[r] += [(begin, middle), (middle, t)]
                elif record is not None:
                    record[r].append((begin, t))
                for kind, slot, *_ in run:
                    if kind != "W":
                        done[_FROM_F if kind == "F" else _FROM_B][slot] = t
                k += len(run)
            moved += k - pos[r]
            pos[r], free[r] = k, t
        if not moved:
            raise AssertionError(f"pipeline order deadlocks: {shape}")
        remaining -= moved
    return max(free)


def _periodic(shape: Shape) -> int:
    """Micro-batches one period of the order repeats (0: it has none to extend by): a whole group of the interleaved
    orders, one micro-batch otherwise."""
    unit = shape.group if shape.order in ("interleaved_1f1b", "interleaved_zero_bubble", "combined_1f1b") else 1
    if shape.microbatches % unit:
        return 0
    return unit * -(-2 * shape.pp // unit)


def replays_whole(shape: Shape) -> bool:
    """Whether `simulate` replays every micro-batch of `shape` rather than extending a shorter replay by its steady
    state (what pipeline_floor.chain_floor bounds)."""
    period = _periodic(shape)
    return not period or shape.microbatches <= EXACT_MICROBATCHES + 2 * period


def simulate(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float = 0.0,
             wgrad: Sequence[float] | None = None, last: tuple[float, float, float] | None = None) -> Timeline:
    """The step of `shape` whose rank r takes fwd[r] / bwd[r] seconds per forward / backward chunk of one
    micro-batch, with `hop` seconds per p2p transfer between ranks; `wgrad[r]`: the weight gradient's part of
    bwd[r], which the zero-bubble orders run apart from the input gradient (left out: none, I takes all of bwd).
    `last`: the (forward, backward, weight-gradient part) seconds of the last virtual stage's chunk where they are
    not its rank's (the output layer and loss run there alone: Megatron-Core builds post_process into the last
    virtual stage's model chunk only); its ops then take them, every other chunk of its rank fwd / bwd.

    Past EXACT_MICROBATCHES and one period, once the order has reached its steady state every further period adds
    the same seconds: the step is replayed at the smallest count past that bound with the same remainder and group,
    and at one period less, and extended by their difference (tests hold it within 1% of the full replay)."""
    m, p = shape.microbatches, shape.pp
    busy = tuple(shape.microbatches * shape.vpp * (fwd[r] + bwd[r]) for r in range(p))
    period = _periodic(shape)
    start = EXACT_MICROBATCHES + period
    w = tuple(wgrad) if wgrad is not None else (0.0,) * p
    if last is not None:  # the last stage's seconds as a rank p past the ranks (_program's last_apart)
        owner = shape.rank_of(shape.stages - 1)
        extra = m * (last[0] + last[1] - fwd[owner] - bwd[owner])
        busy = tuple(b + extra if r == owner else b for r, b in enumerate(busy))
        fwd, bwd, w = (*fwd, last[0]), (*bwd, last[1]), (*w, last[2])
    if not replays_whole(shape):
        base = start + (m - start) % period
        near, before = _replay_pair(_resized(shape, base), _resized(shape, base - period), fwd, bwd, hop, w)
        return Timeline(near + (m - base) // period * (near - before), busy)
    return Timeline(_replay(shape, fwd, bwd, hop, w), busy)


def _replay_pair(longer: Shape, shorter: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float,
                 wgrad: tuple[float, ...]) -> tuple[float, float]:
    """_replay of both shapes (one order at two micro-batch counts: simulate's extension), to the same bits. Where
    both are 1F1B or interleaved 1F1B numbered in closed form and the shorter's first rows are the longer's
    (pipeline_numbering.shared_rows), those rows' ops end where the longer's run ends them (each end reads the same
    ends in the same sums): they are taken from it, and only the shorter's last rows are numbered (plain_tail) and
    run (Llama-3.1-70B on 64 H100: about 4% of them). The same where the last virtual stage's seconds are apart
    (simulate's `last`): a row's seconds follow from its op, which is the same in both."""
    keys = [(shape, tuple(fwd), tuple(bwd), hop, wgrad) for shape in (longer, shorter)]
    hits = [_REPLAYS.get(key) for key in keys]
    shared, tail, warmups = 0, None, _warmups(shorter)
    apart = len(fwd) > longer.pp
    if hits[0] is None and hits[1] is None and longer.order in ("1f1b", "interleaved_1f1b"):
        shared = shared_rows(longer.pp, longer.vpp, longer.group, shorter.microbatches, longer.microbatches,
                             warmups, _warmups(longer))
    program = (_numbered_last_apart(longer) if apart else _numbered_program(longer)) if shared else None
    if program is not None:
        tail = plain_tail(shorter.pp, shorter.vpp, shorter.microbatches, shorter.group, warmups, shared // shorter.pp,
                          2 * shorter.pp + 2 if apart else None)
    if program is None or tail is None:
        return _replay(longer, fwd, bwd, hop, wgrad), _replay(shorter, fwd, bwd, hop, wgrad)
    if apart:  # the tail's rows start at the shared rows' end
        _take_last_apart(tail[2], _last_stage_rows(shorter), shorter.pp, shared)
    ends = _ends(program, keys[0][1], keys[0][2], hop, wgrad)
    step = max(ends[op] for op in program.last)
    del ends[shared + shorter.pp:]  # the shared rows' ends (numbered from p)
    ends = _ends(_Program([], *tail[:2], [], b"", tail[2], _plain_seconds(shorter.pp + apart), tail[3]), keys[0][1],
                 keys[0][2], hop, wgrad, ends)
    if len(_REPLAYS) >= 4095:
        _REPLAYS.clear()
    _REPLAYS[keys[0]], _REPLAYS[keys[1]] = step, max(ends[op] for op in tail[3])
    return _REPLAYS[keys[0]], _REPLAYS[keys[1]]


def _resized(shape: Shape, microbatches: int) -> Shape:
    return Shape(shape.order, shape.pp, shape.vpp, microbatches, shape.group)


class TimedAction(NamedTuple):
    """An action of a replayed step with the moments it started and ended (the report's schedule picture)."""

    action: Action
    start: float
    end: float


def timed_actions(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float = 0.0,
                  wgrad: Sequence[float] | None = None) -> tuple[tuple[TimedAction, ...], ...]:
    """Every rank's actions (rank_actions) in its order, each with its start and end, from the same replay as the
    step (_replay_actions). Nothing is extended past EXACT_MICROBATCHES, so at any micro-batch count the last end is
    the step `simulate` gives up to that bound (tests hold them equal)."""
    p = shape.pp
    w = tuple(wgrad) if wgrad is not None else (0.0,) * p
    moments: list[list[tuple[float, float]]] = [[] for _ in range(p)]
    _replay_actions(shape, fwd, bwd, hop, w, moments)
    return tuple(tuple(TimedAction(action, *moment) for action, moment in zip(rank_actions(shape, r), moments[r],
                                                                               strict=True))
                 for r in range(p))
