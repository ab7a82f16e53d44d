"""Data-parallel sharding's traffic: when ZeRO-2/3 and FSDP move their bytes (ShardingSchedule), the units they
gather and reduce one at a time (ShardUnit), and what of that traffic the neighbouring units' compute leaves
exposed (exposed_sharding); the ring collectives over the dense and expert data-parallel groups (DpTraffic)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from meshplan.arithmetic.comm import Links, ring_time
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD
from meshplan.arithmetic.memory_states import uses_fsdp
from meshplan.estimate.layer_records import BF16
from meshplan.knowledge.calibration import Calibration
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan


class ShardUnit(NamedTuple):
    """A run of `count` identical FSDP units in forward order (a decoder layer each, the embedding, the output
    head): FSDP2, Megatron-FSDP and ZeRO-3 gather and reduce one unit at a time, hidden behind its neighbours."""

    count: int
    gather: float  # all-gather of one unit's parameters
    reduce: float  # reduce-scatter of one unit's gradients
    fwd: float  # one unit's forward, the window that hides the next unit's all-gather
    bwd: float  # one unit's backward (with its recompute), the window that hides its neighbours' traffic
    resharded: bool = True  # freed after its forward, so gathered again for its backward


def exposed_sharding(units: Sequence[ShardUnit], gather_fwd: bool, gather_bwd: bool, reduce: bool) -> float:
    """Seconds of sharding traffic one pass over `units` (forward, then backward) leaves exposed.

    Forward: each unit's all-gather is prefetched behind the previous unit's forward, so it costs
    max(0, gather - that forward); the first unit's all-gather has nothing before it and waits whole.
    Backward (reverse order): a unit's backward hides the all-gather of the unit after it in backward order
    (`gather_bwd`, if that unit was resharded) and the reduce-scatter of the unit before it (`reduce`), both on
    the same links; the first backward unit's all-gather and the last one's reduce-scatter have nothing to hide
    behind. Exact for the stated model: runs of identical units are summed in closed form.
    """
    exposed = 0.0
    if gather_fwd and units:
        prev_fwd = None
        for u in units:
            exposed += u.gather if prev_fwd is None else max(0.0, u.gather - prev_fwd)
            exposed += (u.count - 1) * max(0.0, u.gather - u.fwd)
            prev_fwd = u.fwd
    if not (gather_bwd or reduce) or not units:
        return exposed
    back = units[::-1]

    def g(u: ShardUnit | None) -> float:
        return u.gather if (u is not None and gather_bwd and u.resharded) else 0.0

    def r(u: ShardUnit | None) -> float:
        return u.reduce if (u is not None and reduce) else 0.0

    exposed += g(back[0]) + r(back[-1])
    for i, u in enumerate(back):
        before = back[i - 1] if i else None  # the unit whose backward ran just before (its reduce-scatter)
        after = back[i + 1] if i + 1 < len(back) else None  # the unit whose backward comes next (its gather)
        if u.count == 1:
            exposed += max(0.0, g(after) + r(before) - u.bwd)
            continue
        exposed += max(0.0, g(u) + r(before) - u.bwd)  # first of the run
        exposed += (u.count - 2) * max(0.0, g(u) + r(u) - u.bwd)
        exposed += max(0.0, g(after) + r(u) - u.bwd)  # last of the run
    return exposed


@dataclass
class DpTraffic:
    """One ring collective (all-gather or reduce-scatter) over the dense and the expert DP groups, remembered per
    estimate (pipeline stages repeat the same layers)."""

    plan: Plan
    lk: Links
    dense_group: int  # dense weights are replicated over DP x CP
    expert_group: int
    seen: dict[tuple[float, float, float], float] = field(default_factory=dict)

    def __call__(self, dense: float, expert: float, nbytes: float) -> float:
        key = (dense, expert, nbytes)
        if key not in self.seen:
            plan = self.plan
            self.seen[key] = (ring_time(dense * nbytes, self.dense_group, plan.tp, self.lk)
                              + ring_time(expert * nbytes, self.expert_group, plan.ep * plan.etp, self.lk))
        return self.seen[key]


class StageShards(NamedTuple):
    """One pipeline stage as its FSDP units see it: its decoder layers and their kinds (True: MoE; MTP blocks
    appended), each kind's (forward, backward) window, whether it holds the embedding and the output head."""

    layers: Sequence[int]
    kinds: list[bool]
    windows: dict[bool, tuple[float, float]]
    first: bool
    head_stage: bool


def shard_units(stage: StageShards, *, params: tuple[list[float], list[float]], plan: Plan, arch: Architecture,
                head: float, embed_params: float, traffic: DpTraffic, grad_bytes: float) -> list[ShardUnit]:
    """A stage's FSDP units in forward order: the embedding on the first stage (no compute to hide the next
    gather behind), one unit per decoder layer (runs of one kind summed), the output head on the last stage
    (kept gathered into its backward: torchtitan does not reshard norm + output, Megatron-FSDP's root keeps
    the output layer). Tied embeddings without PP are one unit (torchtitan groups them, not resharded)."""
    units: list[ShardUnit] = []
    kinds = stage.kinds
    tied_one_unit = arch.tie_word_embeddings and plan.pp == 1
    if stage.first:
        units.append(ShardUnit(1, traffic(embed_params, 0.0, BF16), traffic(embed_params, 0.0, grad_bytes),
                               0.0, 0.0, resharded=not tied_one_unit))
    # MTP blocks cost like the last layer
    index = list(stage.layers) + [arch.num_layers - 1] * (len(kinds) - len(stage.layers))
    start = 0
    while start < len(kinds):
        end = start
        while end < len(kinds) and kinds[end] == kinds[start]:
            end += 1
        i = index[start]
        dense, expert = params[0][i] / plan.tp, params[1][i] / (plan.ep * plan.etp)
        fwd, bwd = stage.windows[kinds[start]]
        units.append(ShardUnit(end - start, traffic(dense, expert, BF16), traffic(dense, expert, grad_bytes),
                               fwd, bwd))
        start = end
    if stage.head_stage:
        head_params = 0.0 if tied_one_unit else embed_params
        units.append(ShardUnit(1, traffic(head_params, 0.0, BF16), traffic(head_params, 0.0, grad_bytes),
                               head / TRAINING_PASSES_PER_FORWARD, head * (1 - 1 / TRAINING_PASSES_PER_FORWARD),
                               resharded=False))
    return units


@dataclass(frozen=True)
class ShardingSchedule:
    """When a plan's data-parallel sharding moves bytes: per micro-batch or once per step (framework facts in
    cards/calibration.yaml, fsdp_*)."""

    params_sharded: bool  # ZeRO-3 / FSDP: parameters gathered before use
    grads_sharded: bool  # ZeRO-2/3 / FSDP: gradients reduce-scattered into shards
    gather_each_microbatch: bool  # freed after forward, gathered forward and backward in every micro-batch
    reduce_each_microbatch: bool  # every backward reduce-scatters (else only the last micro-batch's)

    @property
    def per_step(self) -> bool:
        return self.params_sharded or self.grads_sharded


def sharding_schedule(job: Job, plan: Plan, cal: Calibration) -> ShardingSchedule:
    """FSDP2 (torchtitan, KempnerForge), Megatron-FSDP and DeepSpeed ZeRO-3 shard parameters; ZeRO-2 gradients
    too; ZeRO-1 only the optimizer (its traffic stays once per step, in the step's DP term)."""
    fsdp = uses_fsdp(job.framework, plan.zero_stage)
    params = fsdp and plan.zero_stage != 0  # FSDP2 at zero_stage 0 is dp_replicate
    grads = params or plan.zero_stage >= 2
    pp = plan.pp > 1
    keep = params and pp and cal.fsdp_keep_params_under_pp >= 0.5
    defer = (cal.fsdp_defer_grad_sync_under_pp if pp else cal.fsdp_defer_grad_sync) >= 0.5
    return ShardingSchedule(params, grads, params and not keep, grads and not defer)


class ShardingExposed(NamedTuple):
    """A stage's exposed sharding traffic: per micro-batch (inside the pipeline), and once per step (the
    parameters' all-gather, the gradients' reduce-scatter: the step's DP term)."""

    micro: float = 0.0
    step_gather: float = 0.0
    step_reduce: float = 0.0


def exposed_by_schedule(units: Sequence[ShardUnit], sched: ShardingSchedule) -> ShardingExposed:
    """The units' exposed traffic split as the schedule runs it: per micro-batch or once per step."""
    return ShardingExposed(
        exposed_sharding(units, sched.gather_each_microbatch, sched.gather_each_microbatch,
                         sched.reduce_each_microbatch),
        exposed_sharding(units, sched.params_sharded and not sched.gather_each_microbatch, False, False),
        exposed_sharding(units, False, False, sched.grads_sharded and not sched.reduce_each_microbatch))
