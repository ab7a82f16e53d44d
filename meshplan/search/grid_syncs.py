"""One ZeRO stage's DP bound of a seed group (search/bounds.py group_syncs: its sharding traffic per micro-batch and its
first ranks' SyncFloor), kept per what the cost model's two estimators read of a grid, not per grid: grids that differ
only in how their data ranks split between DP and CP share it. On DeepSeek-V3 on 2,048 H100 the 754 grids the queue
raises ask 2,210 (grid, ZeRO stage) bounds of 1,095 distinct keys.

What they read (estimate/sync_floor.py sync_rates and SyncRates.floor, estimate/sharding_floor.py sharding_floor): of
the grid plan (bounds.grid_plan) its tp, pp, ep and etp (the rank's parameters, RankParts, and the layers' gathered
weights), its sequence parallelism and TP overlap (the search sets both from tp), the ZeRO stage, the request's fields
(the same for every grid), the dense and expert data-parallel groups (DpTraffic's two groups: mesh_groups' dp_cp and
edp, whose sizes and strides are all the collectives read of them, and the replicas they split into where ZeRO-0 is
fully_shard over a shard of one: memory_states.replicas_at) and the sharding schedule
(sharding_traffic.sharding_schedule, which reads the step's micro-batches through the grid's dp); and the first
rank's parameters. Those are the key; another Engine's estimators are asked per grid (bounds.first_rank_step and
sharding_per_micro)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from meshplan.arithmetic import mesh
from meshplan.arithmetic.memory_states import replicates_by_sharding
from meshplan.estimate.perf import StepSync
from meshplan.estimate.sharding_floor import sharding_floor
from meshplan.estimate.sharding_traffic import sharding_schedule
from meshplan.estimate.sync_floor import StageSync, SyncRates, sync_rates
from meshplan.schema.plan import Job, Plan
from meshplan.search.estimators import Engine
from meshplan.search.space import Layout


class GridBounds(Protocol):
    """What this module reads of the search's bounds (search/bounds.py StepTimeBounds, which imports this module)."""

    job: Job
    engine: Engine
    bounds_memo: dict

    def grid_plan(self, lay: Layout, zero: int) -> Plan: ...

    def first_rank_step(self, lay: Layout, zero: int, params: tuple[float, float, float]
                        ) -> tuple[SyncRates, StepSync] | None: ...

    def sharding_per_micro(self, lay: Layout, zero: int) -> float: ...


class StageParts(NamedTuple):
    """What a grid's StageSync at a ZeRO stage reads that does not depend on the virtual chunks: the sharding traffic
    per micro-batch (sharding_per_micro) and the first rank's SyncRates and step_sync (bounds.first_rank_step; None
    where there is no floor). Plans of another chunk count read the same, less only the chunked share of what the
    compute hides (SyncRates.chunked): the layouts of a seed group with fewer virtual chunks than its most."""

    per_micro: float
    step: tuple[SyncRates, StepSync] | None

    def at(self, chunks: int) -> StageSync:
        """The StageSync in plans of at most `chunks` virtual chunks (bounds.sync_vpp): the sharding traffic and the
        first rank's SyncFloor there (first_rank_sync's, term for term), no floor where its seconds are not
        positive."""
        if self.step is not None:
            rates, sync = self.step
            floor = rates.chunked(sync, chunks)
            if floor.seconds > 0.0:
                return StageSync(self.per_micro, floor.seconds, floor.hidden)
        return StageSync(self.per_micro, 0.0, 0.0)


def grid_stage_sync(bounds: GridBounds, lay: Layout, zero: int,
                    least: tuple[float, float, float] | None, vpp: int = 1) -> StageSync:
    """The StageSync of the layout's grid at this ZeRO stage for a first rank holding `least` (RankParts.sums; None:
    no floor, the sharding traffic alone) in plans of at most `vpp` virtual chunks (bounds.sync_vpp): the sharding
    traffic per micro-batch (sharding_per_micro) and the first rank's SyncFloor (StageParts.at), none where its
    seconds are not positive. Kept in the search's bounds memo per what the estimators read (the module docstring)
    where they are the cost model's own, with its chunk-free StageParts kept without the chunks (a group's layouts of
    fewer virtual chunks ask it again at theirs); else per grid, as asked."""
    engine = bounds.engine
    if engine.sync_rates is not sync_rates or engine.sharding_floor is not sharding_floor:
        return stage_parts(bounds, lay, zero, least).at(vpp)
    memo = bounds.bounds_memo
    # what the grid's StageSync reads, kept per grid, ZeRO stage and first rank (its layouts of fewer virtual chunks
    # ask it again at theirs: grid_stage_keys, some 4,000 of DeepSeek-V3/2,048's 6,400 asks)
    grid = ("alike", lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero, least)
    alike = memo.get(grid)
    if alike is None:
        dp_cp, edp = _dp_groups(bounds, lay)
        # the replicas the groups split into (perf.dp_traffic's state_replicas: dp where ZeRO-0 is fully_shard over a
        # shard of one, so grids of one dp x cp group but another dp shard and all-reduce over other groups)
        replicas = _replicas(bounds, zero, lay.dp)
        alike = memo[grid] = (zero, least, lay.tp, lay.pp, lay.ep, lay.etp, dp_cp, edp, replicas,
                              _schedule(bounds, lay, zero))
    key = ("stage sync", vpp, alike)
    hit = memo.get(key)
    if hit is None:
        chunk_free = ("stage parts", alike)
        parts = memo.get(chunk_free)
        if parts is None:
            parts = memo[chunk_free] = stage_parts(bounds, lay, zero, least)
        hit = memo[key] = parts.at(vpp)  # type: ignore[union-attr]
    return hit  # type: ignore[return-value]


def _replicas(bounds: GridBounds, zero: int, dp: int) -> int:
    """memory_states.replicas_at of the search's job (no hybrid sharding: a grid's dp_replicate is 1), its card read
    once a job: whether its ZeRO-0 is fully_shard over a shard of one (replicates_by_sharding) is a pure function of
    the job, kept in the bounds memo, where replicas_at read the card at every ZeRO-0 grid (846 asks on
    Llama-3.1-70B on 64 H100)."""
    if zero:
        return 1
    memo = bounds.bounds_memo
    key = ("zero-0 replicas",)
    every = memo.get(key)
    if every is None:
        every = memo[key] = replicates_by_sharding(bounds.job.card, 0, bounds.job.framework_version)  # type: ignore[assignment]
    return dp if every else 1


def stage_parts(bounds: GridBounds, lay: Layout, zero: int, least: tuple[float, float, float] | None) -> StageParts:
    """The StageParts of this very grid at this ZeRO stage for a first rank holding `least`."""
    return StageParts(bounds.sharding_per_micro(lay, zero),
                      None if least is None else bounds.first_rank_step(lay, zero, least))


def _dp_groups(bounds: GridBounds, lay: Layout) -> tuple:
    """The grid's dense and expert data-parallel groups (mesh_groups' dp_cp and edp), kept per grid (its degrees: all
    they read besides the job): group_syncs asks grid_stage_sync once per ZeRO stage of a grid."""
    grid = ("dp groups", lay.tp, lay.pp, lay.cp, lay.dp, lay.ep, lay.etp)
    hit = bounds.bounds_memo.get(grid)
    if hit is None:
        job = bounds.job
        law = job.card.world_size_law
        edp = int(mesh.expert_dp(job.num_gpus, lay, law)) if job.model.moe else 1
        groups = mesh.mesh_groups(lay, edp=edp, law=law)  # type: ignore[arg-type]  # (the grid plan's degrees)
        hit = bounds.bounds_memo[grid] = (groups.dp_cp, groups.edp)
    return hit  # type: ignore[return-value]


def _schedule(bounds: GridBounds, lay: Layout, zero: int) -> tuple[bool, ...]:
    """sharding_schedule of the layout's grid plan at this ZeRO stage, as a tuple, kept per what it reads of that plan
    besides the card and the request's fields: the ZeRO stage, pp and the step's micro-batches (its dp: the grid plan's
    micro-batch is 1)."""
    key = ("grid schedule", zero, lay.pp, lay.dp)
    hit = bounds.bounds_memo.get(key)
    if hit is None:
        sched = sharding_schedule(bounds.job, bounds.grid_plan(lay, zero))
        hit = bounds.bounds_memo[key] = (sched.params_sharded, sched.grads_sharded, sched.gather_each_microbatch,
                                         sched.reduce_each_microbatch)
    return hit  # type: ignore[return-value]

