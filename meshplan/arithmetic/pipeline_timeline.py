"""A pipeline step replayed op by op: each rank runs its forward and backward chunks in its schedule's order, each
op waits for the op of the same micro-batch on the neighbouring virtual stage (plus one p2p hop), and the step ends
when the last rank finishes. The step time and the idle share come from that timeline for any micro-batch count,
instead of the (p-1)/(v*m) bubble that holds only in steady state; the activations a rank holds at its peak come
from the same order.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from meshplan.knowledge.cards import InterleaveGroup as Group
from meshplan.knowledge.cards import PipelineOrder as Order

# A simulated op: (backward?, virtual chunk on the rank, micro-batch)
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


def interleave_group(convention: Group, pp: int, microbatches: int) -> int:
    """Micro-batches a rank runs on one virtual chunk before moving to the next: Megatron-Core's
    microbatch_group_size_per_vp_stage (pp by default; with fewer micro-batches the groups cannot fill, rule PP005
    refuses it, and the order shrinks the group to m), or torch's microbatches_per_round m // max(1, m // p)."""
    m = max(1, microbatches)
    if convention == "rounds":
        return m // max(1, m // pp)
    return min(pp, m)


def shape_for(order: Order, convention: Group, pp: int, vpp: int, microbatches: int) -> Shape:
    """The shape of a plan's pipeline: interleaved only with vpp > 1 (one chunk per rank is plain 1F1B)."""
    m = max(1, microbatches)
    if vpp > 1 and pp > 1:
        return Shape("interleaved_1f1b", pp, vpp, m, interleave_group(convention, pp, m))
    return Shape("gpipe" if order == "gpipe" else "1f1b", pp, 1, m)


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
    """The forwards and backwards rank `rank` runs, in its schedule's order."""
    m, p, v = shape.microbatches, shape.pp, shape.vpp
    if shape.order == "gpipe" or p == 1:
        return tuple((False, 0, k) for k in range(m)) + tuple((True, 0, k) for k in range(m))
    if shape.order == "1f1b":
        table = [(0, k) for k in range(m)]
        warmup = min(p - rank - 1, m)
    else:
        table = _chunk_microbatches(shape)
        warmup = min(2 * (p - rank - 1) + (v - 1) * shape.group, m * v)
    forwards = [(False, c, mb) for c, mb in table]
    backwards = [(True, v - 1 - c, mb) for c, mb in table]
    ops: list[Op] = forwards[:warmup]
    for k in range(len(table) - warmup):
        ops += [forwards[warmup + k], backwards[k]]
    return tuple(ops + backwards[len(table) - warmup:])


@lru_cache(maxsize=4096)
def in_flight(shape: Shape, rank: int) -> tuple[int, ...]:
    """Micro-batches whose activations rank `rank` holds per virtual chunk at the first moment it holds the most
    (forwards run, backwards not yet): the order alone decides it, not the op times."""
    held = [0] * shape.vpp
    best, peak = 0, tuple(held)
    for backward, chunk, _ in rank_order(shape, rank):
        held[chunk] += -1 if backward else 1
        if sum(held) > best:
            best, peak = sum(held), tuple(held)
    return peak


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


@lru_cache(maxsize=256)
def _rank_steps(shape: Shape, rank: int) -> tuple[tuple[bool, int, int, bool], ...]:
    """Each op of the rank's order as (backward?, its slot, the slot it waits for (-1: none), whether that input
    crosses a hop); a slot is stage * m + micro-batch, the input a forward's slot for the last stage's backward."""
    p, s, m = shape.pp, shape.stages, shape.microbatches
    steps = []
    for backward, chunk, mb in rank_order(shape, rank):
        stage = chunk * p + rank
        slot = stage * m + mb
        if backward:
            steps.append((True, slot, slot if stage == s - 1 else slot + m, stage < s - 1))
        else:
            steps.append((False, slot, slot - m if stage else -1, stage > 0))
    return tuple(steps)


def _replay(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float) -> float:
    """The step's seconds: every rank runs its order; an op starts when its rank is free and its input has arrived
    (a forward from the previous virtual stage, a backward from the next, each one hop later; the last stage's
    backward follows its own forward)."""
    p = shape.pp
    steps = [_rank_steps(shape, r) for r in range(p)]
    size = shape.stages * shape.microbatches
    done_f, done_b = [-1.0] * size, [-1.0] * size
    pos, free = [0] * p, [0.0] * p
    remaining = sum(map(len, steps))
    while remaining:
        moved = 0
        for r in range(p):
            order, k, t, f, b = steps[r], pos[r], free[r], fwd[r], bwd[r]
            end = len(order)
            while k < end:
                backward, slot, dep, hopped = order[k]
                if backward:
                    ready = done_f[dep] if not hopped else done_b[dep]
                else:
                    ready = done_f[dep] if dep >= 0 else 0.0
                if ready < 0:
                    break
                if hopped:
                    ready += hop
                if backward:
                    t = (t if t > ready else ready) + b
                    done_b[slot] = t
                else:
                    t = (t if t > ready else ready) + f
                    done_f[slot] = t
                k += 1
            moved += k - pos[r]
            pos[r], free[r] = k, t
        if not moved:
            raise AssertionError(f"pipeline order deadlocks: {shape}")
        remaining -= moved
    return max(free)


def _periodic(shape: Shape) -> int:
    """Micro-batches one period of the order repeats (0: it has none to extend by): a whole group of the interleaved
    order, one micro-batch otherwise."""
    unit = shape.group if shape.order == "interleaved_1f1b" else 1
    if shape.microbatches % unit:
        return 0
    return unit * -(-2 * shape.pp // unit)


def simulate(shape: Shape, fwd: Sequence[float], bwd: Sequence[float], hop: float = 0.0) -> Timeline:
    """The step of `shape` whose rank r takes fwd[r] / bwd[r] seconds per forward / backward chunk of one
    micro-batch, with `hop` seconds per p2p transfer between ranks.

    Past EXACT_MICROBATCHES and one period, once the order has reached its steady state every further period adds
    the same seconds: the step is replayed at the smallest count past that bound with the same remainder and group,
    and at one period less, and extended by their difference (tests hold it within 1% of the full replay)."""
    m, p = shape.microbatches, shape.pp
    busy = tuple(shape.microbatches * shape.vpp * (fwd[r] + bwd[r]) for r in range(p))
    period = _periodic(shape)
    start = EXACT_MICROBATCHES + period
    if period and m > start + period:
        base = start + (m - start) % period
        near = _replay(_resized(shape, base), fwd, bwd, hop)
        before = _replay(_resized(shape, base - period), fwd, bwd, hop)
        return Timeline(near + (m - base) // period * (near - before), busy)
    return Timeline(_replay(shape, fwd, bwd, hop), busy)


def _resized(shape: Shape, microbatches: int) -> Shape:
    return Shape(shape.order, shape.pp, shape.vpp, microbatches, shape.group)
