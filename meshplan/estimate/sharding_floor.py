"""A lower bound of a ZeRO-2/3 / FSDP plan's slowest stage per micro-batch from its sharding traffic alone, at any
recompute: what the search reads to carry such a plan at its own key before estimating its memory or step
(search/engine.py, Level.RULES)."""

from __future__ import annotations

import math

from meshplan.arithmetic import mesh
from meshplan.estimate.memory_terms import ParamTable, param_table_for, table_sums, time_rank_parts
from meshplan.estimate.perf import dp_traffic, kept_links
from meshplan.estimate.sharding_traffic import (
    DpTraffic,
    edge_units,
    grad_reduce_bytes,
    layer_weights,
    param_gather_bytes,
    sharding_schedule,
)
from meshplan.knowledge.calibration import calibration
from meshplan.schema.plan import Job, Plan


def sharding_floor(job: Job, plan: Plan) -> float:
    """Seconds per micro-batch the slowest pipeline stage (StageTime.total, so m x this is under step_terms' floor)
    takes at least, from the sharding traffic each micro-batch moves (sharding_traffic.exposed_by_schedule's `micro`).

    Why it holds at any recompute: exposed_sharding charges each unit's traffic less one window (a forward for the
    next all-gather, a backward for its neighbours' all-gather and reduce-scatter), each window used at most once, so
    exposed + those windows >= every all-gather and reduce-scatter of the pass; the windows sum to at most the stage's
    compute, recompute and TP / CP / EP seconds (stage_time.layer_sums: its layers' forward and backward with their
    recompute and side collectives, the head's forward and backward), all of which the stage's GPU seconds hold, and
    its total is at least its GPU seconds. So a stage's total is at least its units' traffic per micro-batch, which
    reads neither the layers' times nor the recompute. The slowest stage is at least the stages' mean: the model's
    decoder layers (each at the least traffic of a layer of its kind: shard_units times a run of layers by its first),
    the embedding and the output head, over pp. It reads of the plan its grid (tp, cp, dp, pp, ep, etp), ZeRO stage,
    sequence parallelism, dp_replicate, grad_reduce_in_fp32 and fp8_param_gather; 0 where no traffic is per
    micro-batch (the schedule's gather_each_microbatch and reduce_each_microbatch)."""
    cal = calibration(job.framework)
    sched = sharding_schedule(job, plan)
    gathered, reduced = sched.gather_each_microbatch, sched.reduce_each_microbatch
    if not gathered and not reduced:
        return 0.0
    arch, law = job.model, job.card.world_size_law
    groups = mesh.mesh_groups(plan, edp=int(mesh.expert_dp(job.num_gpus, plan, law)) if arch.moe else 1,
                             law=law)
    traffic = dp_traffic(job, plan, kept_links(job, cal), groups, cal)
    grad_bytes = grad_reduce_bytes(plan, cal)
    # every decoder layer gathered forward and, resharded after it (the schedule's regathered), backward
    total = _layers_traffic(job, plan, traffic, (gathered + sched.regathered, 1 if reduced else 0), grad_bytes)
    # the embedding (first stage) and the output head (head stage): shard_units' own units (their windows unread)
    embedding, output = edge_units(arch, plan, time_rank_parts(job, plan), 0.0, traffic, grad_bytes)
    total += (embedding.moved(gathered, reduced, sched.regathered)
              + output.moved(gathered, reduced, sched.regathered))
    return total / plan.pp


def kind_shapes(job: Job) -> tuple[tuple[bool, int, tuple[tuple[int, int, int], ...]], ...]:
    """Per kind of decoder layer (True: MoE) the model has: its count of layers and their distinct parameters as the
    framework's TP cuts them (RankParts.sums of one layer). Cached per parameter table."""
    table = param_table_for(job.model, job.card.moe_whole_over_tp)
    hit = _KINDS.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    arch = job.model
    moe_set = set(arch.moe.moe_layers) if arch.moe else set()
    kinds = []
    for moe in (False, True):
        layers = [i for i in range(arch.num_layers) if (i in moe_set) == moe]
        if layers:
            kinds.append((moe, len(layers), tuple(sorted({table_sums(table, (i,)) for i in layers}))))
    if len(_KINDS) > 256:
        _KINDS.clear()
    _KINDS[id(table)] = (table, tuple(kinds))
    return tuple(kinds)


_KINDS: dict[int, tuple[ParamTable, tuple]] = {}  # kind_shapes' per table (the table kept: ids are not recycled)


def _layers_traffic(job: Job, plan: Plan, traffic: DpTraffic, counts: tuple[int, int], grad_bytes: float) -> float:
    """The decoder layers' sharding traffic per micro-batch (`counts`: all-gathers and reduce-scatters of each
    layer), each layer at the least of its kind's (shard_units' gather and reduce of one layer)."""
    arch = job.model
    weight_bytes = param_gather_bytes(job, plan)
    prefetch = job.card.zero3_prefetch  # DeepSpeed: a dense layer's weights one by one
    gathers, reduces = counts
    total = 0.0
    for moe, count, shapes in kind_shapes(job):
        least = math.inf
        for sharded, replicated, routed in shapes:
            dense, expert = sharded / plan.tp + replicated, routed / (plan.ep * plan.etp)
            if prefetch is not None and not moe:
                gather = sum(traffic(w, 0.0, weight_bytes) for w in layer_weights(arch, plan, False))
            else:
                gather = traffic(dense, expert, weight_bytes)
            least = min(least, gathers * gather + reduces * traffic.reduce(dense, expert, grad_bytes))
        total += count * least
    return total
