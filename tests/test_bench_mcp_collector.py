"""bench/mcp_collector.py's two ways of promoting a search's survivors inside a process that keeps objects frozen
(the MCP server), which search/ranking._promote_survivors does not take: what each does to a reference cycle that
dies after the freeze, the leak its docstring names. A test of the bench: it imports the bench's module."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import mcp_collector


class Node:
    pass


def _cycle() -> tuple[list, weakref.ref]:
    """Two nodes that hold each other, owned by a list (alive until the list is emptied)."""
    first, second = Node(), Node()
    first.other, second.other = second, first
    return [first, second], weakref.ref(first)


def test_a_refreeze_keeps_a_cycle_that_dies_later_and_the_reclaim_frees_it():
    """Frozen while alive, a cycle that dies afterwards survives every collection (the permanent generation is never
    walked); the reclaim's full unfreeze-collect-freeze, due once the frozen count grows by a quarter, frees it."""
    gc.unfreeze()  # a test before this one (an in-process MCP server's start-up) may have left objects frozen
    gc.freeze()  # as the server's start-up does
    try:
        owner, alive = _cycle()
        mcp_collector.refreeze()  # the in-flight request's objects are frozen with the survivors
        owner.clear()
        gc.collect()
        assert alive() is not None  # leaked: no collection frees it
        reclaim = mcp_collector.Reclaim()
        reclaim()  # takes the frozen count as its base; nothing grew
        assert reclaim.reclaims == 0 and alive() is not None
        grown = [[] for _ in range(reclaim.base // 4 + 1)]  # a quarter more alive: the next promotion reclaims
        reclaim()
        assert reclaim.reclaims == 1 and alive() is None and grown
    finally:
        gc.unfreeze()  # this test process is not a server: give its objects back to the collector


def test_outside_a_frozen_process_both_promote_without_freezing():
    """With nothing frozen both do what the package does: freeze and unfreeze, leaving nothing frozen."""
    gc.unfreeze()  # what an earlier test in this worker froze (an in-process server's start-up) goes back first
    assert gc.get_freeze_count() == 0
    mcp_collector.refreeze()
    assert gc.get_freeze_count() == 0
    reclaim = mcp_collector.Reclaim()
    reclaim()
    assert gc.get_freeze_count() == 0 and reclaim.reclaims == 0
