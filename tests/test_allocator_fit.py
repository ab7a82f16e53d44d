"""The caching-allocator model's out-of-memory path (bench/allocator_replay.py): what a GPU of a given size runs.

PyTorch's default allocator (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc), when no cached block
fits and cudaMalloc fails, frees every cached block that is a whole segment (release_cached_blocks) and tries again;
the free part of a segment that still holds a live block is not handed back. So a whole free segment in the reserve
does not decide the fit and a split one does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from allocator_replay import MIB, STEPS, OutOfMemory, least_capacity, replay


def _steps(*step: tuple) -> list:
    """The same events in every step the replay counts (handles renumbered per step)."""
    events: list = []
    for n in range(STEPS):
        events.append(("m", f"step {n}"))
        events.extend((e[0], 1000 * n + e[1], *e[2:]) for e in step)
    return events


# A 100 MiB tensor freed, then a 200 MiB one: the first segment stays cached, reserved 300 MiB with memory to spare
WHOLE = _steps(("a", 1, 100 * MIB, "default"), ("f", 1), ("a", 2, 200 * MIB, "default"), ("f", 2))
# ...but a 40 MiB tensor reuses the first segment before the 200 MiB one: its other 60 MiB cannot be handed back
SPLIT = _steps(("a", 1, 100 * MIB, "default"), ("f", 1), ("a", 3, 40 * MIB, "default"),
               ("a", 2, 200 * MIB, "default"), ("f", 2), ("f", 3))


def test_a_whole_free_segment_is_handed_back_before_out_of_memory():
    assert replay(WHOLE, per_stream=True)["reserved"] * 1024 == pytest.approx(300)  # with memory to spare
    replay(WHOLE, per_stream=True, capacity=200 * MIB)  # runs: the cached 100 MiB segment is freed for the 200
    assert least_capacity(WHOLE, per_stream=True) * 1024 == pytest.approx(200)


def test_the_free_part_of_a_split_segment_decides_the_fit():
    assert replay(SPLIT, per_stream=True)["reserved"] * 1024 == pytest.approx(300)
    with pytest.raises(OutOfMemory):
        replay(SPLIT, per_stream=True, capacity=250 * MIB)
    assert least_capacity(SPLIT, per_stream=True) * 1024 == pytest.approx(300)
