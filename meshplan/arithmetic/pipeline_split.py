"""The orders that split the backward into its input gradient (I) and weight gradient (W), one rank's ops as torch
writes them (pipeline_timeline's docstring says what each order is and how the replay runs it): the interleaved
zero-bubble order, ZBV's and DualPipeV's V. Apart from pipeline_timeline.py, which reads them per shape (rank_actions),
so that module keeps to the replay; they read only the pipeline's numbers (ranks p, chunks v, micro-batches m, the
group G), not its Shape."""

from __future__ import annotations

from typing import Literal, NamedTuple


class Action(NamedTuple):
    """One op of any order: F (forward), B (whole backward), I (input gradient), W (weight gradient) of a virtual
    chunk on one micro-batch; `fused`: it runs as one step with the next action (combined 1F1B)."""

    kind: Literal["F", "B", "I", "W"]
    chunk: int
    mb: int
    fused: bool = False


def zero_bubble_actions(p: int, v: int, m: int, g: int, rank: int) -> tuple[Action, ...]:
    """torch ScheduleInterleavedZeroBubble._calculate_single_rank_operations (_get_warmup_ops with multiply_factor
    1, _get_1f1b_rank_ops with enable_zero_bubble): G = microbatches_per_round."""
    warmup = min((v - 1) * g + (p - 1 - rank), m * v)
    steady_end, total = m * v, m * v + warmup  # warm-up + (m*v - warm-up) F/I pairs + warm-up cool-down I's
    count = {"F": [0] * v, "I": [0] * v, "W": [0] * v}
    ops: list[Action] = []
    backward_steps: list[int] = []
    weights = 0  # the W ops added so far (every chunk's): the oldest backward whose W has not run is this one

    def add(kind: Literal["F", "I", "W"], chunk: int) -> None:
        ops.append(Action(kind, chunk, count[kind][chunk]))
        count[kind][chunk] += 1

    def backward_chunk(step: int) -> int:
        return v - 1 - ((step - warmup) // g) % v

    for step in range(total):
        if step < steady_end:
            add("F", (step // g) % v)
        if step < warmup:
            continue
        add("I", backward_chunk(step))
        backward_steps.append(step)
        if step - warmup >= rank:  # the W of the oldest backward whose W has not run
            add("W", backward_chunk(backward_steps[weights]))
            weights += 1
    while weights < len(backward_steps):
        add("W", backward_chunk(backward_steps[weights]))
        weights += 1
    return tuple(ops)


def zbv_actions(p: int, m: int, rank: int) -> tuple[Action, ...]:
    """torch ScheduleZBVZeroBubble._calculate_single_rank_operations: chunk 0 is stage r, chunk 1 stage 2p - 1 - r;
    the order is written for max(2p - 1, m) micro-batches and the ones past m dropped."""
    n = max(2 * p - 1, m)
    ops: list[Action] = []
    f, b = [0, 0], [0, 0]

    def fwd(c: int) -> None:
        ops.append(Action("F", c, f[c]))
        f[c] += 1

    def backward(c: int, weight: bool = True) -> None:
        ops.append(Action("I", c, b[c]))
        if weight:
            ops.append(Action("W", c, b[c]))
        b[c] += 1

    for _ in range(2 * (p - rank) - 1):
        fwd(0)
    for _ in range(rank):
        fwd(1)
        fwd(0)
    for _ in range(p - rank):
        fwd(1)
        backward(1)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            fwd(0)
        backward(0)
        fwd(1)
        backward(1)
    w = list(b)
    for _ in range(rank):
        backward(0, weight=False)
        backward(1, weight=False)
    for _ in range(p - rank):
        ops.append(Action("I", 0, b[0]))
        b[0] += 1
        ops.append(Action("W", 0, w[0]))
        w[0] += 1
    ops += [Action("W", 1, k) for k in range(w[1], b[1])] + [Action("W", 0, k) for k in range(w[0], b[0])]
    return tuple(a for a in ops if a.mb < m)


def dualpipev_actions(p: int, m: int, rank: int) -> tuple[Action, ...]:
    """torch ScheduleDualPipeV._calculate_single_rank_operations (DeepSeek's DualPipeV in eight steps): chunk 0 is
    stage r, chunk 1 stage 2p - 1 - r; an overlapped forward+backward pair is a forward then a whole backward."""
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least {2 * p} micro-batches (its stages), got {m}")
    ops: list[Action] = []
    nxt = {"F": [0, 0], "I": [0, 0]}  # a whole backward B takes the I counter (and its W with it)
    weights: list[tuple[int, int]] = []  # the W of each lone I, oldest first

    def add(kind: Literal["F", "B", "I"], c: int) -> None:
        counter = nxt["F" if kind == "F" else "I"]
        ops.append(Action(kind, c, counter[c]))
        if kind == "I":
            weights.append((c, counter[c]))
        counter[c] += 1

    def weight() -> None:
        if weights:
            c, mb = weights.pop(0)
            ops.append(Action("W", c, mb))

    for _ in range((p - rank - 1) * 2):
        add("F", 0)
    for _ in range(rank + 1):
        add("F", 0)
        add("F", 1)
    for _ in range(p - rank - 1):
        add("I", 1)
        weight()
        add("F", 1)
    for _ in range(m - 2 * p + rank + 1):
        add("F", 0)  # with B1: one overlapped pair (its halves in turn), or two plain ops on the last rank's first
        add("B", 1)
        add("F", 1)
        add("B", 0)
    for _ in range(p - rank - 1):
        add("B", 1)
        add("F", 1)
        add("B", 0)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        add("I" if split else "B", 1)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        add("I" if split else "B", 0)
    for _ in range(p - rank - 1):
        weight()
        add("I" if split else "B", 0)
    for _ in range(rank + 1):
        weight()
    return tuple(ops)
