"""What a rank's pipeline order holds and shares, read from the order alone (no op times): the micro-batches whose
activations it holds per virtual chunk at its peak (the memory estimate's in-flight count), and the shares of its ops
that run in the steady state or fused with a backward (the step estimate's overlaps). Closed forms for the plain
orders, the split orders replayed op by op (pipeline_timeline.rank_order / rank_actions)."""

from __future__ import annotations

from functools import lru_cache

from meshplan.arithmetic.pipeline_timeline import SPLIT_ORDERS, Shape, rank_actions, rank_order, warmup_forwards


@lru_cache(maxsize=4096)
def in_flight(shape: Shape, rank: int) -> tuple[int, ...]:
    """Micro-batches whose activations rank `rank` holds per virtual chunk at the first moment it holds the most
    (forwards run, backwards not yet): the order alone decides it, not the op times; the split orders replayed."""
    return replayed_in_flight(shape, rank) if shape.order in SPLIT_ORDERS else plain_in_flight(shape, rank)


def plain_in_flight(shape: Shape, rank: int) -> tuple[int, ...]:
    """in_flight of rank_order's orders unreplayed: W warm-up forwards, a forward and a backward in turn, the other
    backwards (GPipe, one stage: forwards first), so the first min(W + 1, m v) forwards of the rank's table are held
    at the peak, never passed after (tests/test_pipeline_timeline.py holds it equal to the replay)."""
    m, p, v = shape.microbatches, shape.pp, shape.vpp
    if shape.order == "gpipe" or p == 1:
        return (m,) + (0,) * (v - 1)
    if shape.order == "1f1b":
        return (min(p - rank, m),) + (0,) * (v - 1)
    return _held_by_chunk(min(warmup_forwards(shape, rank) + 1, m * v), m, v, shape.group)


def _held_by_chunk(forwards: int, m: int, v: int, group: int) -> tuple[int, ...]:
    """Per chunk, how many of the rank's first `forwards` forwards it runs: its table (_chunk_microbatches) takes
    rows of `group` micro-batches on each chunk in turn (the last row the rest, m % group), so every chunk has
    `group` per whole row taken, and the row being taken fills its chunks in order (O(v), not one step per row)."""
    whole = m // group  # rows of a full group
    rows = min(forwards // (v * group), whole)  # rows taken whole
    held = [rows * group] * v
    left = forwards - rows * v * group
    row = group if rows < whole else m - whole * group  # the size of the next row (the rest: 0 when none)
    for chunk in range(v):
        take = min(row, left)
        held[chunk] += take
        left -= take
    return tuple(held)


def replayed_in_flight(shape: Shape, rank: int) -> tuple[int, ...]:
    """in_flight by replaying the rank's order op by op."""
    held, best, peak, total = [0] * shape.vpp, 0, (0,) * shape.vpp, 0  # total: sum(held), kept as the ops change it
    if shape.order in SPLIT_ORDERS:  # a split backward frees its activations only with its W (I keeps them)
        ops = [(-1 if a.kind in "BW" else 0 if a.kind == "I" else 1, a.chunk) for a in rank_actions(shape, rank)]
    else:
        ops = [(-1 if backward else 1, chunk) for backward, chunk, _ in rank_order(shape, rank)]
    for change, chunk in ops:
        held[chunk] += change
        total += change
        if total > best:
            best, peak = total, tuple(held)
    return peak


def steady_share(shape: Shape, rank: int) -> float:
    """The share of the rank's ops that run in the steady state of the interleaved orders (interleaved and combined
    1F1B: each forward after the warm-up with a backward in turn), (m*v - warm-up) / (m*v); the warm-up forwards and
    the cool-down backwards are the rest. 0 for the other orders."""
    if shape.order not in ("interleaved_1f1b", "combined_1f1b") or shape.pp == 1:
        return 0.0
    chunks = shape.microbatches * shape.vpp
    return (chunks - warmup_forwards(shape, rank)) / chunks


def fused_share(shape: Shape, rank: int) -> float:
    """The share of the rank's forwards that run fused with a backward (combined 1F1B's steps, where the expert
    all-to-all of one micro-batch hides behind the other's compute); 0 for orders that fuse none."""
    actions = rank_actions(shape, rank)
    forwards = sum(1 for a in actions if a.kind == "F")
    return sum(1 for a in actions if a.fused) / forwards if forwards else 0.0
