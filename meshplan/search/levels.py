"""The best-first search's queue levels (meshplan/search/engine.py), in the order a node passes through them, apart
from the engine so the seeding's groups (seed_groups.py) and the engine name them alike."""

from __future__ import annotations

from enum import IntEnum


class Level(IntEnum):
    """The queue's levels, in the order a node passes through them. At equal keys the lower level pops first."""

    GROUP = 0
    """Seeded: the layouts of one degrees tuple (seed_groups.SeedGroup) keyed by a lower bound of all their seed
    keys; popped, its (layout, micro-batch) nodes enter FLOOR with their seed keys, in the order seeding gives them,
    each layout's once the queue reaches its least key (open_group: till then the group waits at that key)."""
    FLOOR = 1
    """Seeded with the per-token bound: the least recompute the first stage's memory floor allows (none: dropped)."""
    SHARD = 2
    """The pipeline bound of this exact shard, with the send/receive traffic interleaving multiplies, and per ZeRO stage
    the sharding traffic and once-per-step DP term after it: a RULES node per distinct key (refine_shard)."""
    RULES = 3
    """The structural rules and the model-state lower bound, per ZeRO stage of the node."""
    NEED = 4
    """The least recompute that really fits at any ZeRO stage the rules pass, estimated."""
    STAIRCASE = 5
    """Per ZeRO stage, the least recompute that fits (heavier recompute of that stage is dominated)."""
    STEP = 6
    """A plan known to fit gets its step's floor: its estimate's terms but the pipeline's replay (the costly part),
    m x the slowest stage or each rank's chain in its place (estimate/perf.py StepTerms.floor)."""
    TIME = 7
    """The plan's pipeline is replayed: its predicted step time."""
    RANK = 8
    """Nothing left in the queue can be faster: the plan's rules run, then it is ranked."""


# The levels as module names for the hot paths: Level.X goes through EnumType's __getattr__ hook (a call per read).
GROUP, FLOOR, SHARD, RULES, NEED, STAIRCASE, STEP, TIME, RANK = Level
