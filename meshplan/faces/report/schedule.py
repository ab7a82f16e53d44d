"""The order a pipeline runs its micro-batches, for the schedule picture: Megatron-Core's 1F1B, interleaved when
vpp > 1 (megatron/core/pipeline_parallel/schedules.py).

Each rank runs its warm-up forwards, then one forward and one backward in turn, then the remaining backwards;
an operation starts when its rank is free and the stage before it (forward) or after it (backward) is done.
Times are in units of one chunk's forward (a backward takes two): the picture shows the shape of the schedule
and where the bubble sits; the seconds printed beside it are the throughput estimate's.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_DRAWN_MICROBATCHES_PER_RANK = 2  # micro-batches drawn: 2 x pp (all of them when fewer), enough for the shape
FORWARD, BACKWARD = 1, 2  # a chunk's forward and backward, in units of one forward


@dataclass(frozen=True)
class Slot:
    rank: int
    microbatch: int
    chunk: int
    backward: bool
    start: int
    end: int


def drawn_microbatches(pp: int, vpp: int, microbatches: int) -> int:
    """Micro-batches the picture draws: all of them, or 2 x pp when there are more (the steady state repeats);
    interleaved, a multiple of pp once there are pp or more (Megatron runs them in groups of pp)."""
    drawn = max(1, min(microbatches, MAX_DRAWN_MICROBATCHES_PER_RANK * pp))
    return drawn - drawn % pp if vpp > 1 and drawn >= pp else drawn


def rank_order(rank: int, pp: int, vpp: int, microbatches: int) -> list[tuple[bool, int, int]]:
    """(backward, micro-batch, chunk) in the order `rank` runs them (Megatron's warm-up, steady 1F1B, cool-down)."""
    m = microbatches
    group = min(pp, m)
    total = m * vpp

    def op(k: int, backward: bool) -> tuple[bool, int, int]:
        chunk = (k % (group * vpp)) // group
        micro = (k // (group * vpp)) * group + k % group
        return backward, micro, (vpp - 1 - chunk) if backward else chunk

    warmup = min(pp - rank - 1 if vpp == 1 else (pp - rank - 1) * 2 + (vpp - 1) * group, total)
    order = [op(k, False) for k in range(warmup)]
    forwards, backwards = warmup, 0
    while backwards < total:
        if forwards < total:
            order.append(op(forwards, False))
            forwards += 1
        order.append(op(backwards, True))
        backwards += 1
    return order


def simulate(pp: int, vpp: int, microbatches: int) -> list[Slot]:
    """Every operation of every rank with its start and end, in unit times (see the module docstring)."""
    orders = [rank_order(r, pp, vpp, microbatches) for r in range(pp)]
    done: dict[tuple[bool, int, int], int] = {}  # (backward, micro-batch, model stage) -> end
    free, nxt, slots = [0] * pp, [0] * pp, []
    last = pp * vpp - 1
    progress = True
    while progress:
        progress = False
        for rank in range(pp):
            while nxt[rank] < len(orders[rank]):
                backward, micro, chunk = orders[rank][nxt[rank]]
                stage = chunk * pp + rank
                if backward:
                    dep = (True, micro, stage + 1) if stage < last else (False, micro, stage)
                else:
                    dep = (False, micro, stage - 1) if stage > 0 else None
                if dep is not None and dep not in done:
                    break
                start = max(free[rank], done.get(dep, 0) if dep else 0)
                end = start + (BACKWARD if backward else FORWARD)
                done[(backward, micro, stage)] = free[rank] = end
                slots.append(Slot(rank, micro, chunk, backward, start, end))
                nxt[rank] += 1
                progress = True
    return slots
