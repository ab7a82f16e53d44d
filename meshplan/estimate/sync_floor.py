"""A lower bound of a plan's once-per-step data-parallel term (perf._dp_exposed: the gradients' reduction and ZeRO-1/2's
parameter all-gather after the pipeline) from the first pipeline rank's traffic alone, at any micro-batch and
recompute: what the search adds to its pipeline bounds (search/bounds.py sync_bound) before estimating a plan."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from meshplan.arithmetic import mesh
from meshplan.arithmetic.comm import Links
from meshplan.arithmetic.memory_states import state_replicas
from meshplan.estimate.memory_terms import RankParts, time_rank_parts
from meshplan.estimate.perf import StepSync, chunked_share, dp_traffic, kept_links, step_sync, sync_chunks
from meshplan.estimate.sharding_traffic import DpTraffic, sharding_schedule
from meshplan.knowledge.calibration import Calibration, calibration
from meshplan.schema.plan import Job, Plan


class SyncFloor(NamedTuple):
    """The first rank's once-per-step DP traffic before any of it is hidden (`seconds`), and how much of it one second
    of that rank's compute and recompute per micro-batch can hide at most (`hidden`): its exposed DP term is at least
    seconds - hidden x (compute + recompute of one micro-batch)."""

    seconds: float = 0.0
    hidden: float = 0.0


class StageSync(NamedTuple):
    """What the search's synced reads of one ZeRO stage of a grid (search/bounds.py group_syncs): its sharding
    traffic per micro-batch and its first ranks' SyncFloor (seconds, hidden)."""

    per_micro: float
    seconds: float
    hidden: float


@dataclass(frozen=True)
class SyncRates:
    """What sync_floor reads of a plan besides its first rank's decoder layers: its DP groups and links, its ZeRO
    stage's sharding schedule (the same for every layout of a grid and ZeRO stage)."""

    job: Job
    plan: Plan
    cal: Calibration
    lk: Links
    traffic: DpTraffic
    per_step: bool  # the sharding schedule's units move the gradients (ZeRO-2/3, FSDP)
    parts: RankParts  # which parameters a rank holds

    def floor(self, sums: tuple[float, float, float], vpp: int = 1) -> SyncFloor:
        """The SyncFloor of a first rank whose decoder layers' unsharded parameters are `sums` (RankParts.sums), with
        the embedding (and, with one stage, the output layer): what stage_params gives that rank (RankParts.held but
        the MTP blocks), in plans of at most `vpp` virtual chunks (the hidden share only grows with them:
        perf.chunked_share). More of any parameters never lowers it (each collective's time grows with its bytes), so
        it also bounds a rank holding more."""
        return self.chunked(self.step(sums), vpp)

    def step(self, sums: tuple[float, float, float]) -> StepSync:
        """The first rank's step_sync of floor (what does not depend on the virtual chunks: a caller keeping floors
        at several chunk counts works it out once)."""
        plan = self.plan
        # (with more than one stage the output layer is on another rank but a V order's: left out, a lower bound)
        held = self.parts.held_sums(sums, first=True, last=plan.pp == 1, mtp=False)
        return step_sync(self.job, plan, self.cal, self.lk, self.traffic, *held, self.per_step)

    def chunked(self, sync: StepSync, vpp: int = 1) -> SyncFloor:
        """floor of a first rank whose step_sync is `sync` (step) in plans of at most `vpp` virtual chunks."""
        chunks = sync_chunks(self.job, self.plan.pp, vpp)
        return SyncFloor(sync.reduce + sync.gather,
                         max(chunked_share(sync.reduce_hidden, chunks), chunked_share(sync.gather_hidden, chunks)))

    def at(self, plan: Plan) -> SyncRates:
        """The SyncRates of a plan of the same grid (degrees and the request's fields) at another ZeRO stage: the same
        groups and links, its own sharding schedule; its own groups where the stage splits them into other replicas
        (memory_states.state_replicas: torchtitan 0.3's ZeRO-0 is fully_shard with dp replicas, its ZeRO-3 one
        shard)."""
        if state_replicas(self.job, plan) != state_replicas(self.job, self.plan):
            return sync_rates(self.job, plan)  # type: ignore[return-value]  # (not a LoRA job: self exists)
        return SyncRates(self.job, plan, self.cal, self.lk, self.traffic,
                         sharding_schedule(self.job, plan).per_step, time_rank_parts(self.job, plan))


def sync_rates(job: Job, plan: Plan) -> SyncRates | None:
    """The SyncRates of the plan's grid and ZeRO stage; None for a LoRA job (its adapters are what it reduces: no
    floor here)."""
    if job.lora is not None:
        return None
    cal = calibration(job.framework)
    lk, law = kept_links(job, cal), job.card.world_size_law
    groups = mesh.mesh_groups(plan, edp=int(mesh.expert_dp(job.num_gpus, plan, law)) if job.model.moe else 1,
                             law=law)
    return SyncRates(job, plan, cal, lk, dp_traffic(job, plan, lk, groups, cal), sharding_schedule(job, plan).per_step,
                     time_rank_parts(job, plan))


def sync_floor(job: Job, plan: Plan, layers: Sequence[int]) -> SyncFloor:
    """A lower bound of the plan's exposed once-per-step DP term (perf._dp_exposed), as a SyncFloor: the first pipeline
    rank holds decoder `layers` (schedule.Stages.layers(0)) and the embedding.

    Why it holds: the step's DP term is the largest over ranks of _dp_exposed, and the first rank's has no slack (it
    finishes the last backward). Its terms, perf.chunked_reduce_exposed and chunked_gather_exposed of step_sync's
    reduce and gather, are each at least its traffic less its chunked_share of one micro-batch's backward or forward
    (the plan's virtual chunks at the most micro-batches per group, pp), and bwd + fwd is that micro-batch's compute
    and recompute, so the term is at least reduce + gather - the larger share x (compute + recompute). FSDP's
    per-unit gathers and reduce-scatters (the sharding schedule's per-step units) are not counted (0 is their floor),
    nor a LoRA job's adapters (no floor: SyncFloor())."""
    rates = sync_rates(job, plan)
    return SyncFloor() if rates is None else rates.floor(rates.parts.sums(layers), plan.vpp)


def unraised_from(ms: list[int], syncs: tuple[StageSync, ...]) -> list[float]:
    """Per micro-batch count of `ms`, the least pipeline bound synced_keys keeps as it is (it raises nothing from
    there up; inf where every ZeRO stage of `syncs` raises any bound): a stage whose sharding traffic m x per_micro is
    at most the bound B leaves B as the pipeline's, and, with DP traffic (seconds > 0) and a share of it hidden
    (hidden > 0), caps B + the exposed term at max(m x seconds / hidden, B), which is B where B is at least that ratio;
    so from the least over the stages of max(m x per_micro, m x seconds / hidden) one stage gives B and the least over
    them is B, to the last bit (the same products as synced_keys'). What a caller raising many keys of the same counts
    and stages works out once (search/bounds.py raise_to_sync: about half of a seed group's keys stay as they are)."""
    floors = []
    for m in ms:
        least = math.inf
        for per_micro, seconds, hidden in syncs:
            floor = m * per_micro
            if seconds > 0.0:
                if hidden <= 0.0:
                    continue  # its whole traffic exposed: it raises any bound
                at_sync = m * seconds / hidden
                if at_sync > floor:
                    floor = at_sync
            if floor < least:
                least = floor
        floors.append(least)
    return floors


def synced_keys(pipes: list[float], ms: list[int], syncs: tuple[StageSync, ...], each: bool = False,
                unraised: list[float] | None = None) -> list[float]:
    """search/bounds.py's synced: per (pipeline bound, micro-batches) of `pipes` and `ms`, a bound of every plan of a
    group_syncs' layouts with that many micro-batches, where the pipeline bound holds: the least over the ZeRO stages
    of the pipeline (at least the bound B and m x the sharding traffic per micro-batch) plus the once-per-step DP term
    after it. With u the first rank's compute and recompute per micro-batch, which m micro-batches leave under the
    pipeline, that sum is at least max(B, m u) + max(0, seconds - hidden u) (SyncFloor): convex and piecewise linear
    in u, least at a break, u = B / m or seconds / hidden. It only grows with B and with m. (The seeds' hot loop:
    written out, no calls.) `each`: per ZeRO stage of `syncs` in turn, its own (what this gives of that stage alone;
    search/bounds.py grid_stage_keys, a node's key at each stage, in one call). `unraised`: unraised_from(ms, syncs),
    where the caller has it (not with `each`): a bound at or over its count's is kept without the stages' terms."""
    if not syncs:
        return pipes
    raised, inf = [], math.inf
    # (without `unraised`, a NaN floor for each: no bound, not even an infinite one, is at or over it)
    for pipe, m, floor in zip(pipes, ms, unraised or [math.nan] * len(ms), strict=True):
        if pipe >= floor:  # (unraised_from: some stage raises it nothing)
            raised.append(pipe)
            continue
        least = inf
        for per_micro, seconds, hidden in syncs:
            bound = m * per_micro
            if bound < pipe:
                bound = pipe
            if seconds > 0.0:
                exposed = seconds - hidden * bound / m
                at_pipe = bound + (exposed if exposed > 0.0 else 0.0)  # max(0.0, exposed)
                if hidden > 0.0:
                    at_sync = m * seconds / hidden
                    at_sync = at_sync if at_sync > bound else bound
                    if at_sync < at_pipe:  # min(at_pipe, at_sync)
                        at_pipe = at_sync
                bound = at_pipe
            if bound < least:
                least = bound
            if each:  # (this stage's alone: as the least of it alone)
                raised.append(least if least > pipe else pipe)
                least = inf
        if not each:
            raised.append(least if least > pipe else pipe)
    return raised
