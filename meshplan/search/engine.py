"""The best-first search: the exact top K of the cost model without timing most layouts.

The layouts enter a priority queue a group per degrees tuple (Level.GROUP, meshplan/search/seed_groups.py); an
opened group's (layout, micro-batch) nodes carry an optimistic step time and are refined one level at a time
(`Level`, in the order a node passes through them), each step pushing it back with a tighter key; a plan reaching
the top at the last level is ranked, since nothing left in the queue can be faster. Everything dropped is counted
under the rule id that dropped it (or a SEARCH-* bucket, meshplan/search/policy.py), so considered = ranked +
rejected; the nodes of a layout over the budget at every ZeRO stage never enter the queue, nor those its memory
floor leaves no recompute once its first node pops (release), and are counted as it would have counted them
(settle_dead); in an opened group whose least-bubble layout cannot fit, under the memory rule (group_under). The
plans and their cached estimates are meshplan/search/plans.py; the bounds that order the queue, bounds.py.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter

from meshplan.arithmetic import mesh
from meshplan.core.cancel import checkpoint
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.compute_card import cp_comm_type_default
from meshplan.rules.engine import Context, load_rules
from meshplan.rules.experts import flex_backend_refusal
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import MemoryReport, ThroughputReport
from meshplan.search.bounds import StepTimeBounds, by_key
from meshplan.search.estimators import Engine, ideal_time
from meshplan.search.job_memo import job_memo, memo_part
from meshplan.search.levels import FLOOR, GROUP, NEED, RANK, RULES, SHARD, STAIRCASE, STEP, TIME, Level
from meshplan.search.plans import Caches
from meshplan.search.policy import (
    BUDGET,
    DOMINATED,
    HEAVIER_STAGE,
    NVLINK,
    SAME_STAGE,
    SLOWER,
    TIE,
    UNTIMED,
    budget_cut,
    heavier_twin,
    same_numbers,
    search_limits,
)
from meshplan.search.seed_groups import SeedGroup, SuperGroup
from meshplan.search.seeding import Seeding
from meshplan.search.space import (
    RECOMPUTE_ORDER,
    Fixed,
    Layout,
    params_split,
)
from meshplan.search.tiers import across_floor, split_space
from meshplan.search.zero_stages import bound_preset, first_valid, search_ladder

_LEVEL = itemgetter(1)  # a queue entry's level
_COVERED = frozenset(level for level in Level if level not in (FLOOR, SHARD))  # drain: counted node by node (covered)


@dataclass
class Found:
    """A ranked plan: it passes the rules, fits the budget, and has its predicted step time."""

    time: float
    plan: Plan
    memory: MemoryReport
    throughput: ThroughputReport
    # the same layout, micro-batch and recompute at other ZeRO stages, timed no faster with a higher peak
    # (policy.heavier_twin): left out as SEARCH-HEAVIER-STAGE, named in this row's words
    heavier: list[Found] = field(default_factory=list)


@dataclass
class Below:
    """What a ranked search settled of its seeds, kept for the thinner-headroom probe (impossible.below_settled), which
    asks the same seeds again at the GPU's full capacity: the (key, layout, micro-batch) of every seed node it popped at
    Level.FLOOR or found dead when its layout's first node released it (`nodes`); the layouts it found dead before
    queueing them, with their shape's entry (its seed keys, None where never worked out) and group (`members`);
    the seed groups whose model-state bound is over its budget (`groups`); and whether a group had no micro-batch
    (`unsized`: its nodes go to the batch rule at key 0, which the probe's proof does not replay)."""

    nodes: list[tuple[float, Layout, int]] = field(default_factory=list)
    members: list[tuple[Layout, list, SeedGroup]] = field(default_factory=list)
    groups: list[SeedGroup] = field(default_factory=list)
    unsized: bool = False


@dataclass(kw_only=True)
class BestFirstSearch(StepTimeBounds, Seeding):
    """One best-first search of a job's layouts under one memory budget (see the module docstring)."""

    top_k: int
    rejected: Counter = field(default_factory=Counter)
    found: list[Found] = field(default_factory=list)
    rows: set[tuple[float, int]] = field(default_factory=set)  # distinct (step time, peak) among found: the top K
    twins: dict[tuple, list[Found]] = field(default_factory=dict)  # found per (layout, micro-batch, recompute): rank
    cutoff: float = math.inf  # nothing slower than this step time is wanted (a probe for much faster layouts)
    # plans drain counts though not queued: seeds over the cutoff (never popped: keys only grow), and the seeds a
    # layout's first node holds until it pops (open_group, release)
    beyond_cutoff: int = 0
    untimed_reasons: list[str] = field(default_factory=list)
    stopped_by_budget: bool = False  # the estimate budget (cards/search.yaml max_evaluations) ran out: not exact
    max_evaluations: int = 1 << 62
    heap: list = field(default_factory=list)
    seq: int = 0
    seed_rates: dict[tuple, tuple[int, float, float, tuple]] = field(default_factory=dict)  # seed_rate's, per seeding
    # Seeds never queued because no plan of their layout can fit (open_group, is_dead), as (key, seq): run() counts
    # them as their FLOOR pop would have (settle_dead), so the counts are those of a queue that held them.
    dead: list[tuple[float, int]] = field(default_factory=list)
    dead_layouts: dict[Layout, bool] = field(default_factory=dict)  # is_dead per layout asked, under this budget
    # False where no count is read (the thinner-headroom probe, the GPU-count scan: only what it ranks): the dead
    # seeds and what is left in the queue are then not counted (settle_dead, drain), which decides nothing
    tallied: bool = True
    below: Below | None = None  # what it settled of its seeds, where a thinner-headroom probe will read it (Below)

    @classmethod
    def for_job(cls, job: Job, fixed: Fixed, engine: Engine, top_k: int, *,
                budget_bytes: int = 0) -> BestFirstSearch:
        """A search of `job` with the knobs its framework opens, less what the request fixes."""
        kn = job.card.search
        recomputes = tuple(r for r in RECOMPUTE_ORDER if r in kn.recompute)
        if "recompute" in fixed:
            recomputes = (str(fixed.values["recompute"]),)
        zeros, left_out = search_ladder(job, fixed, recomputes)
        card = job.card
        sp = card.defaults.sequence_parallel_with_tp(job.model)
        if "sequence_parallel" in fixed:
            sp = bool(fixed.values["sequence_parallel"])
        cp_comm = str(fixed.values.get("cp_comm_type", cp_comm_type_default(job.model, card.attention)))
        # TP communication overlap: the request's switch (else the framework's default), not searched: the cost model
        # credits it beyond what the runs measured (tp_overlap.tp_hidden; bench/README.md, Throughput)
        tp_overlap = bool(fixed.values.get("tp_comm_overlap", card.tp_overlap.default))
        if tp_overlap and "tp_comm_overlap" in fixed:  # asked for: refuse what TP005 refuses every TP plan
            probe = Plan(tp=2, sequence_parallel=sp, tp_comm_overlap=True,
                         torch_compile=bool(fixed.carried.get("torch_compile")))
            blocked = load_rules()["TP005"](Context(job, probe))
            if blocked is not None:
                raise MeshplanError(f"tp_comm_overlap=true cannot run in any layout with TP: {blocked['reason']} "
                                    "(rule TP005).", blocked["fix"])
        limits = search_limits()
        cap = limits.max_evaluations if job.num_gpus <= limits.largest_cluster_gpus else limits.absurd_max_evaluations
        domain = mesh.job_domain(job)
        a2a_open = (job.model.moe is not None and "moe_a2a_overlap" not in fixed and card.adapter is not None
                    and card.adapter.renders("moe_a2a_overlap"))
        # what no count decides, kept across requests (job_memo.py); what a budget decides, per budget
        memo = job_memo(job, fixed, engine)
        budget = budget_bytes or job.gpu.memory_bytes
        return cls(job=job, fixed=fixed, engine=engine, top_k=top_k, zeros=zeros,
                   job_memo=memo, caches=Caches.kept(memo), bounds_memo=memo_part(memo, "bounds"),
                   overlaps=memo_part(memo, "overlaps"), dispatchers=memo_part(memo, "dispatchers"),
                   knob_rows=memo_part(memo, "knob rows"), floor_parts=memo_part(memo, "floor parts"),
                   sizes_by_dp=memo_part(memo, "sizes"), sp_by_pp=memo_part(memo, "sequence parallel"),
                   pipeline_overlap=memo_part(memo, "pipeline overlap"), factors=memo_part(memo, "factors"),
                   p2p_shares=memo_part(memo, "p2p shares"), chunks_by_vpp=memo_part(memo, "sync chunks"),
                   kept_token_bounds=memo_part(memo, "token bounds"),
                   kept_pipe_bounds=memo_part(memo, "pipeline bounds"), kept_seed_keys=memo_part(memo, "seed keys"),
                   floor_needs=memo_part(memo, ("floor needs", budget)),
                   floor_least=memo_part(memo, ("floor least", budget)),
                   dead_layouts=memo_part(memo, ("dead", budget)),
                   recomputes=recomputes, sp=sp, cp_comm=cp_comm, split=params_split(job),
                   law=card.world_size_law,
                   # the flex dispatcher where the framework renders it and the job's backend runs (rule EP013): the
                   # search weighs the job's one backend, never another, so a refused one leaves alltoall
                   flex=card.flex_dispatcher and job.model.moe is not None and flex_backend_refusal(job) is None,
                   a2a_open=a2a_open, domain=domain, max_evaluations=cap, budget_bytes=budget_bytes,
                   presets={z: bound_preset(job, z, fixed.carried) for z in zeros}, tp_overlap=tp_overlap,
                   refused=left_out)

    # -- the queue --------------------------------------------------------------------------------------

    def push(self, key: float, level: Level, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (key, level, self.seq, payload))

    # -- the levels: each pop refines one node a little and pushes it back with a tighter key ----------

    def refine_bound(self, key: float, lay: Layout, mbs: int, held: tuple = (), floor: int = -1) -> None:
        """Level.FLOOR (seeded with the per-token bound): the least recompute the memory floor allows (none fits, or
        no plan of the layout can: dropped) and the per-token bound with it, the DP term after it added as to the
        seeds (grid_stage_keys: its seed group's). `held`: the layout's other seeds, which its first node holds until
        it pops (open_group), released first; `floor`: need_floor where release already read it."""
        if self.below is not None:
            self.below.nodes.append((key, lay, mbs))
        if held:
            self.release(lay, held)
        n_r = len(self.recomputes)
        if floor < 0:  # need_floor's row, where release read it
            row = self.floor_least.get(lay)
            floor = row.get(mbs, -1) if row is not None else -1
            if floor < 0:
                floor = self.need_floor(lay, mbs)  # where it is len(recomputes), no known need can raise it further
        if floor < n_r:
            floor = max(self.need_range(lay, mbs)[0], floor)
        # dead: open_group never queues it (is_dead's entry first)
        if floor >= n_r or (self.dead_layouts.get(lay) is not False and self.is_dead(lay)):
            self.rejected[self.engine.memory_rule] += self.variants()
            return
        if floor > 0:  # the per-token bound at that recompute, with the DP term after it at the least ZeRO stage's
            key = max(key, min(self.grid_stage_keys(lay, mbs, self.token_bound(lay, mbs, self.recomputes[floor]))))
        self.push(key, SHARD, (lay, mbs, floor))

    def release(self, lay: Layout, held: tuple) -> None:
        """The seeds a layout's first node held (open_group), as (seed key, seq, micro-batch), when it pops: each
        enters the queue as seeded, or, where the memory floor leaves no recompute at any ZeRO stage (need_floor: its
        FLOOR pop could only reject it), joins the dead seeds settle_dead counts. Each comes after the node popping
        now in the queue's order, so the queue pops the same nodes in the same order as if each were pushed at
        opening; until now drain counted them (beyond_cutoff), as queued."""
        n_r, heap, dead, need_floor = len(self.recomputes), self.heap, self.dead, self.need_floor
        self.beyond_cutoff -= self.variants() * len(held)
        need_floor(lay, held[0][2])  # the layout's row (every micro-batch of it at once), read below as need_floor
        row = self.floor_least[lay]
        for seed_key, seq, mbs in held:
            floor = row[mbs] if mbs in row else need_floor(lay, mbs)
            if floor >= n_r:
                dead.append((seed_key, seq))
                if self.below is not None:
                    self.below.nodes.append((seed_key, lay, mbs))
            else:
                heapq.heappush(heap, (seed_key, FLOOR, seq, (lay, mbs, (), floor)))

    def refine_shard(self, key: float, lay: Layout, mbs: int, floor: int) -> None:
        """Level.SHARD: the pipeline bound of this exact shard, with interleaving's traffic, and per ZeRO stage its
        grid's sharding traffic and DP term after it (grid_stage_keys): a RULES node per distinct key with its stages,
        so the rules run only on stages the queue reaches (a node never popped: SEARCH-SLOWER, drain)."""
        pipe = self.pipeline_bound(lay, mbs, self.recomputes[floor], interleave=True)
        for k, zeros in by_key([max(key, k) for k in self.grid_stage_keys(lay, mbs, pipe)], self.zeros):
            self.push(k, RULES, (lay, mbs, floor, zeros))

    def apply_rules(self, key: float, lay: Layout, mbs: int, low: int, zeros: tuple[int, ...] | None = None) -> None:
        """Level.RULES: structural rules and the model-state lower bound (rules_pass) per ZeRO stage of the node
        (`zeros`; all where the batch rule's node was seeded); the stages they pass go on (carry)."""
        alive, masks = self.rules_pass(lay, mbs, zeros or self.zeros, self.rejected)
        if alive:
            self.carry(key, lay, mbs, alive, masks, low)

    def rules_pass(self, lay: Layout, mbs: int, zeros: tuple[int, ...], rejected: Counter
                   ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ZeRO stages of `zeros` whose plans pass the structural rules and the model-state lower bound at some
        recompute, each with the mask of the recomputes they pass (bit i: recomputes[i]); asked at every recompute
        (check_errors: some read it, or the EP overlap it allows), each plan refused counted in `rejected` under its
        first error (the search's; a proof's own, impossible.reaches_need)."""
        alive: list[int] = []
        masks: list[int] = []
        for zero in zeros:
            mask = 0
            for i, error in enumerate(self.check_errors(lay, zero, mbs)):
                if error:
                    rejected[error] += 1
                else:
                    mask |= 1 << i
            if mask and (same := mask & self.offered_first(lay, zero, mbs)):  # one plan, offered at another stage
                rejected[SAME_STAGE] += same.bit_count()
                mask &= ~same
            if not mask:
                continue
            if (bound := self.states_bound(lay, zero)) > self.budget:
                rejected[self.memory_rule_for(bound)] += mask.bit_count()
            elif (later := self.ranks_bytes(lay, zero)) > self.budget:  # a later pipeline rank's states alone
                rejected[self.memory_rule_for(later)] += mask.bit_count()
            else:
                alive.append(zero)
                masks.append(mask)
        return tuple(alive), tuple(masks)

    def carry(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], masks: tuple[int, ...],
              low: int) -> None:
        """Push the NEED nodes of the stages the rules pass (need_nodes)."""
        for k, stages, stage_masks, floor in self.need_nodes(key, lay, mbs, alive, masks, low, self.rejected):
            self.push(k, NEED, (lay, mbs, stages, stage_masks, floor))

    def need_nodes(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], masks: tuple[int, ...],
                   low: int, rejected: Counter) -> list[tuple[float, tuple[int, ...], tuple[int, ...], int]]:
        """The NEED nodes (key, stages, masks, low) of the stages the rules pass, split by each one's own DP bound
        (sync_bound: its layout's), each as need_alive leaves it, in the order the search pushes them; the plans
        they drop counted in `rejected` (the search's; a proof's own, impossible.reaches_need)."""
        pipe = self.pipeline_bound(lay, mbs, self.recomputes[low], interleave=True)  # (refine_shard's, kept)
        keys = [max(key, self.sync_bound(lay, zero, mbs, pipe)) for zero in alive]
        nodes = []
        for k, picked in by_key(keys, range(len(alive))):
            node = self.need_alive(k, lay, mbs, tuple(alive[i] for i in picked), tuple(masks[i] for i in picked), low,
                                   rejected)
            if node is not None:
                nodes.append(node)
        return nodes

    def need_alive(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], masks: tuple[int, ...],
                   low: int, rejected: Counter) -> tuple[float, tuple[int, ...], tuple[int, ...], int] | None:
        """The NEED node (key, alive, masks, low) of the ZeRO stages the rules pass, `alive`, at the recomputes they
        pass (`masks`), or None: the floor
        level's `low` read the first rank's floors at every ZeRO stage (need_floor), but where the rules reject the
        stages or recomputes whose floors fit with less recompute, the least recompute whose floor fits at an alive
        stage and that the rules pass there (zero_needs, kept per layout and micro-batch) is higher: none (every
        plan over the memory rule, as confirm_need would find after its estimates), or a heavier one whose pipeline
        bound raises the key (the bound confirm_need would raise it to, so a node over the cutoff is never
        estimated). The plans under `low` are counted over the memory rule here (in `rejected`), the rest by
        confirm_need or, never popped, by drain (covered)."""
        n_r = len(self.recomputes)
        needs = self.zero_needs(lay, mbs)
        floor = min(first_valid(mask, needs[self.zeros.index(zero)], n_r)
                    for zero, mask in zip(alive, masks, strict=True))
        if floor >= n_r:
            rejected[self.engine.memory_rule] += sum(mask.bit_count() for mask in masks)
            return None
        if floor > low:
            key = max(key, self.pipeline_bound(lay, mbs, self.recomputes[floor], interleave=True))
            low = floor
        rejected[self.engine.memory_rule] += sum(mask.bit_count() - (mask >> low).bit_count() for mask in masks)
        return key, alive, masks, low

    def confirm_need(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], masks: tuple[int, ...],
                     low: int) -> None:
        """Level.NEED: the least recompute that fits at any ZeRO stage the rules pass (those of this node: carry) and
        that they pass there, estimated; every stage needs at least that much. If nothing fits, nothing does at any
        larger micro-batch either. `low`: what need_alive found at the alive stages' floors (need's ceiling from a
        larger micro-batch reads every stage's need)."""
        n_r = len(self.recomputes)
        need = max(low, self.need(lay, mbs, alive, masks))
        above = [(mask >> low).bit_count() for mask in masks]
        if self.host_short:  # those of them only the host rejects: MEM003
            self.host_recount(self.rejected, lay, mbs, zip(alive, masks, strict=True), low, min(need, n_r))
        if need >= n_r:
            self.rejected[self.engine.memory_rule] += sum(above)
            return
        # the plans from `low` up to the need (those under `low`: need_alive)
        self.rejected[self.engine.memory_rule] += sum(above) - sum((mask >> need).bit_count() for mask in masks)
        if need > low:
            key = max(key, self.pipeline_bound(lay, mbs, self.recomputes[need], interleave=True))
        self.push(key, STAIRCASE, (lay, mbs, alive, masks, need))

    def staircase(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], masks: tuple[int, ...],
                  need: int) -> None:
        """Level.STAIRCASE: for each ZeRO stage the least recompute that fits among those the rules pass there;
        heavier recompute of the same stage is dominated, lighter does not fit. No stage is lighter than every other
        (plans.lightest), so each walks up from `need`, the least that fits at any of them."""
        n_r = len(self.recomputes)
        for zero, mask in reversed(tuple(zip(alive, masks, strict=True))):
            i = first_valid(mask, need, n_r)
            while i < n_r and not self.fits(lay, zero, self.recomputes[i], mbs):
                i = first_valid(mask, i + 1, n_r)
            above = (mask >> need).bit_count()
            if self.host_short:
                self.host_recount(self.rejected, lay, mbs, ((zero, mask),), need, i)
            if i == n_r:
                self.rejected[self.engine.memory_rule] += above
                continue
            rest = (mask >> i).bit_count()  # this plan and the heavier ones the rules pass
            self.rejected[self.engine.memory_rule] += above - rest
            self.rejected[DOMINATED] += rest - 1
            bound = key if i == need else self.pipeline_bound(lay, mbs, self.recomputes[i], interleave=True)
            self.push(max(key, bound), STEP, (lay, mbs, zero, self.recomputes[i]))

    def step_bound(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str) -> None:
        """Level.STEP: the plan's step without its pipeline's replay, a bound only the replay can raise."""
        try:
            floor = self.step_floor(lay, zero, recompute, mbs)
        except MeshplanError as exc:
            self.untimed(exc, 1)
            return
        self.push(max(key, floor), TIME, (lay, mbs, zero, recompute))

    def time_plan(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str) -> None:
        """Level.TIME: a plan known to fit gets its predicted step time."""
        try:
            report = self.throughput(lay, zero, recompute, mbs)
        except MeshplanError as exc:
            self.untimed(exc, 1)
            return
        self.push(report.step_time_s, RANK, (lay, mbs, zero, recompute, report))

    def accept(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str, report: ThroughputReport) -> None:
        """Level.RANK: nothing left in the queue can be faster; the exact plan's rules run, then it is ranked."""
        error = self.check_error(lay, zero, recompute, mbs)
        if error:
            self.rejected[error] += 1
            return
        mem = self.memory(lay, zero, recompute, mbs)
        if mem.plan.moe_a2a_overlap != report.plan.moe_a2a_overlap:  # the plain twin's (overlap_choice): same memory
            mem = mem.model_copy(update={"plan": report.plan})
        self.rank(Found(report.step_time_s, report.plan, mem, report), (lay, mbs, recompute))

    def rank(self, new: Found, twin_key: tuple) -> None:
        """Rank a plan, or leave it out where its twin at another ZeRO stage (the same layout, micro-batch and
        recompute: `twin_key`) is timed the same or faster with a lower peak (policy.heavier_twin), counted
        SEARCH-HEAVIER-STAGE and named by the twin's row; a twin ranked before it that it dominates leaves the ranking
        the same way (the two pop in either order at the same key), and the rows wanted are counted again without
        it."""
        twins = self.twins.setdefault(twin_key, [])
        for twin in twins:
            if heavier_twin(new.time, new.memory.peak_bytes, twin.time, twin.memory.peak_bytes):
                twin.heavier.append(new)
                self.rejected[HEAVIER_STAGE] += 1
                return
        beaten = [twin for twin in twins
                  if heavier_twin(twin.time, twin.memory.peak_bytes, new.time, new.memory.peak_bytes)]
        for twin in beaten:
            new.heavier += [twin, *twin.heavier]
            twin.heavier = []
            twins[:] = [t for t in twins if t is not twin]
            self.found = [f for f in self.found if f is not twin]
            self.rejected[HEAVIER_STAGE] += 1
        twins.append(new)
        self.found.append(new)
        if beaten:
            self.rows = {same_numbers(f.time, f.memory.peak_bytes) for f in self.found}
        else:
            self.rows.add(same_numbers(new.time, new.memory.peak_bytes))

    def untimed(self, exc: MeshplanError, count: int) -> None:
        self.rejected[UNTIMED] += count
        if exc.reason not in self.untimed_reasons:
            self.untimed_reasons.append(exc.reason)

    # -- the loop ----------------------------------------------------------------------------------

    def open_group(self, key: float, group: SeedGroup | SuperGroup, base: int, ideal: float,
                   pending: list | None = None, live: bool = False) -> None:
        """Level.GROUP: push the group's (layout, micro-batch) nodes with their seed keys (worked out once per shape,
        Seeds) and their seeding's seq; those over the cutoff are counted as never queued (drain). A layout's nodes
        enter as one, its first in the queue's order, holding the others until it pops (refine_bound, release): a
        layout never popped costs one push, and one popped has its memory floors worked out for every micro-batch
        at once (plans.needs_row) before its other nodes are queued. The layouts left out as dead (is_dead) are found
        together where the group may not fit (group_dead; raise_live).

        A group opens over several pops, as the queue reaches its layouts: the first works out the keys and keeps the
        members under the cutoff (`pending`, by least key; group_under); once its least key is due, raise_live finds
        whether one may fit and raises their keys to the DP bound (`live`) if so; each later pop pushes the members
        whose least key is due (none could pop before the queue's next key: `horizon`), each checked for death then.
        The rest waits at its least key (level GROUP, the group's seq): every node it stands for comes after it in
        the queue's order, so the queue pops the same nodes in the same order and stops at the same one (wants()
        grows no easier with the key); drain counts it as those nodes (covered), settle_dead its dead seeds, as a
        queue that held every node would. The DP raise reads the first pop's members, as an opening at once."""
        if type(group) is SuperGroup:  # its groups enter at their own keys (push_supers)
            for one in group.groups:
                self.push_group(one, self.keyed(one, ideal), base, ideal)
            return
        if pending is None:
            pending = self.group_under(group, ideal)
        heap = self.heap
        horizon = max(key, heap[0][0]) if heap else math.inf
        if not live and pending:
            if pending[0][1][2] > horizon:
                heapq.heappush(heap, (pending[0][1][2], GROUP, base + group.first + 1,
                                      (group, base, ideal, pending, False)))
                return
            pending = self.raise_live(group, base, pending)
        due = 0
        while due < len(pending) and pending[due][1][2] <= horizon:
            due += 1
        if due:
            ready, pending = pending[:due], pending[due:]
            deads = [self.is_dead(ready[0][0])] if due == 1 else self.group_dead([lay for lay, _, _ in ready])
            self.push_members(group, base, ready, deads)
        if pending:
            heapq.heappush(heap, (pending[0][1][2], GROUP, base + group.first + 1,
                                  (group, base, ideal, pending, True)))

    def group_under(self, group: SeedGroup, ideal: float) -> list:
        """The members of a group under the cutoff, by least seed key (its keys worked out where its shape's are not
        yet), those over it counted as never queued. Where the layout of its least bubble (SeedGroup.pick: the least
        key's, most often) cannot fit, every layout of the group is asked (group_dead) before any key: those that
        cannot fit are counted under the memory rule here, whatever their keys, and only the others' keys are worked
        out (most groups of a job that barely fits: Kimi-K2 on 256 H100 opens 1,044 of 1,192 with none that fits)."""
        members, sizes, variants = group.members, group.sizes, self.variants()
        if self.is_dead(members[group.pick][0]):
            deads = self.group_dead([lay for lay, _, _ in members])
            if self.below is not None:
                self.below.members += [(lay, entry, group) for (lay, entry, _), dead in zip(members, deads, strict=True)
                                       if dead]
            members = [member for member, dead in zip(members, deads, strict=True) if not dead]
            self.rejected[self.engine.memory_rule] += variants * len(sizes) * (len(group.members) - len(members))
        for lay, entry, _ in members:
            if entry[1] is None:
                keys = entry[1] = self.seed_keys(lay, sizes, ideal, self.seed_rate(lay, sizes[0], self.seed_rates),
                                                 entry[4])
                entry[2] = min(keys)
        group.note_keys()
        under = sorted((member for member in members if member[1][2] <= self.cutoff), key=lambda member: member[1][2])
        self.beyond_cutoff += variants * len(sizes) * (len(members) - len(under))
        return under

    def raise_live(self, group: SeedGroup, base: int, under: list) -> list:
        """Whether a group's members under the cutoff may fit (is_dead, the least key's first: where it may, the rest
        wait): if so, their seed keys raised to the DP bound (raise_to_sync; a group none of whose layouts can fit is
        only counted, its seeds' own keys placing them); the members checked pushed, the rest returned by raised
        least key."""
        if not self.is_dead(under[0][0]):
            self.raise_to_sync(group, under)
            self.push_members(group, base, under[:1], [False])
            return sorted(under[1:], key=lambda member: member[1][2])
        deads = [True, *self.group_dead([lay for lay, _, _ in under[1:]])]
        if not all(deads):
            self.raise_to_sync(group, under)
        self.push_members(group, base, under, deads)
        return []

    def push_members(self, group: SeedGroup, base: int, members: list, deads: list[bool]) -> None:
        """Push each of a group's `members` (its nodes: the first, holding the others), or leave its seeds out where
        it is dead (`deads`); those over the cutoff (never queued) and held (till the first pops) counted once for
        drain (`left_out`). The first node is the one min() would pick: the least key at the least seq."""
        cutoff, sizes, heap, dead_seeds, left_out = self.cutoff, group.sizes, self.heap, self.dead, 0
        for (lay, entry, index), dead in zip(members, deads, strict=True):
            if dead:  # (most members of the groups opened dead: no zip, whose strict= builds a dict per call)
                if self.below is not None:
                    self.below.members.append((lay, entry, group))
                for seq, seed_key in enumerate(entry[1], base + index + 1):
                    if seed_key > cutoff:
                        left_out += 1
                    else:
                        dead_seeds.append((seed_key, seq))
                continue
            seq, nodes, least, at = base + index, [], math.inf, -1
            for mbs, seed_key in zip(sizes, entry[1], strict=True):
                seq += 1
                if seed_key > cutoff:
                    left_out += 1
                    continue
                if at < 0 or seed_key < least:
                    least, at = seed_key, len(nodes)
                nodes.append((seed_key, seq, mbs))
            if nodes:
                _, first, mbs = nodes.pop(at)
                left_out += len(nodes)
                heapq.heappush(heap, (least, FLOOR, first, (lay, mbs, tuple(nodes))))
        if left_out:
            self.beyond_cutoff += self.variants() * left_out

    def wants(self, key: float) -> bool:
        """A node of this key is still wanted: fewer than top_k distinct rows, or it could still tie the last one
        ranked (a clone with the same numbers joins its row instead of being counted as slower)."""
        if key > self.cutoff:
            return False
        if len(self.rows) < self.top_k:
            return True
        return key <= self.found[-1].time * (1.0 + TIE)

    def run(self) -> None:
        steps = {FLOOR: self.refine_bound, SHARD: self.refine_shard, RULES: self.apply_rules,
                 NEED: self.confirm_need, STAIRCASE: self.staircase, STEP: self.step_bound,
                 TIME: self.time_plan, RANK: self.accept}
        last: tuple = (-math.inf,)  # the last node popped (key, level, seq)
        stop: tuple | None = None  # the node the loop stopped at, None where the queue ran out
        heap, wants, pop, group = self.heap, self.wants, heapq.heappop, GROUP  # (best_so_far's new heap: left)
        while heap:
            top = heap[0]
            if not wants(top[0]):  # more to rank: the next node is wanted
                stop = top[:3]
                break
            checkpoint()  # a cancelled MCP call stops here; no clock decides what is returned
            if top[1] == group:  # estimates nothing: the budget is asked before a node's pop only
                key, _, _, payload = pop(heap)
                self.open_group(key, *payload)
                continue
            if self.evaluations >= self.max_evaluations:
                self.stopped_by_budget = True
                stop = top[:3]
                self.best_so_far()
                break
            key, level, seq, payload = pop(heap)
            last = (key, level, seq)
            steps[level](key, *payload)
        self.settle_dead(last, stop)

    def is_dead(self, lay: Layout) -> bool:
        """Whether no plan of the layout can fit, whatever the queue holds: every ZeRO stage is over the budget at any
        micro-batch and recompute (plans.layout_over: its model states' bound, its first rank's layout floor or a
        later rank's states are over it). Its nodes are rejected under the memory rule where a queue holding them
        would have popped them (settle_dead), as refine_bound rejects a node its floors leave no recompute."""
        hit = self.dead_layouts.get(lay)
        if hit is None:
            hit = self.dead_layouts[lay] = self.layout_over(lay)
        return hit

    def group_dead(self, lays: list[Layout]) -> list[bool]:
        """is_dead of each of a seed group's layouts, together: their first ranks' floors at once (plans.group_over:
        the same verdicts), then a later rank's states (layout_over) for those these leave alive."""
        owns, over_of = [self.own(lay) for lay in lays], self.layout_over
        dead = [over or over_of(lay, own) for lay, own, over in zip(lays, owns, self.group_over(owns), strict=True)]
        self.dead_layouts.update(zip(lays, dead, strict=True))
        return dead

    def settle_dead(self, last: tuple, stop: tuple | None) -> None:
        """Count the seeds open_group left out because no plan of their layout can fit (every ZeRO stage over the
        budget: is_dead), as a queue holding them would have: a pop rejects such a
        node under the memory rule, and pops change nothing else (no estimate, no ranked row), so the other nodes
        pop in the same order and the loop stops at the same one. Popped, in that queue: each before the last node
        popped (the loop went on past it, and wants() holds for a smaller key whenever it holds for a larger one at
        the same ranked rows), and, after it, each the loop's stopping test would have let through with the final
        rows, up to the node it stopped at (none after a budget stop: the budget is asked before every pop). The rest
        were never popped: left for drain, like a seed over the cutoff."""
        if not self.tallied:
            self.dead.clear()
            return
        if not self.dead:
            return
        popped, floor, go_on, wants = 0, FLOOR, not self.stopped_by_budget, self.wants  # (read once)
        for key, seq in self.dead:
            node = (key, floor, seq)
            if node < last or (go_on and (stop is None or node < stop) and wants(key)):
                popped += 1
        variants = self.variants()
        self.rejected[self.engine.memory_rule] += popped * variants
        self.beyond_cutoff += (len(self.dead) - popped) * variants
        self.dead.clear()

    def best_so_far(self) -> None:
        """Out of its estimate budget: rank the plans already timed (they fit), fastest first, then, while fewer than
        top_k rows are ranked, the plans whose step's floor is known, in the order of their floors (their pipelines
        replayed now); without proof that nothing unexplored is faster."""
        timed = sorted((entry for entry in self.heap if entry[1] == RANK), key=lambda e: (e[0], e[2]))
        floored = sorted((entry for entry in self.heap if entry[1] == TIME), key=lambda e: (e[0], e[2]))
        self.heap = [entry for entry in self.heap if entry[1] not in (RANK, TIME)]
        heapq.heapify(self.heap)
        for index, (key, _, _, payload) in enumerate(timed):
            if len(self.rows) >= self.top_k:
                self.rejected[BUDGET] += len(timed) - index
                break
            self.accept(key, *payload)
        for index, (_, _, _, (lay, mbs, zero, recompute)) in enumerate(floored):
            if len(self.rows) >= self.top_k:
                self.rejected[BUDGET] += len(floored) - index
                break
            try:
                report = self.throughput(lay, zero, recompute, mbs)
            except MeshplanError as exc:
                self.untimed(exc, 1)
                continue
            self.accept(report.step_time_s, lay, mbs, zero, recompute, report)

    def covered(self, level: Level, payload: tuple) -> int:
        """How many plans (ZeRO stage x recompute) a queued node stands for."""
        if level == GROUP:  # a group, or what is left of one part-way open (open_group's `pending`)
            group = payload[0]
            return self.variants() * (group.nodes if len(payload) == 3 else len(group.sizes) * len(payload[3]))
        if level == RULES and len(payload) == 4:  # a node of some ZeRO stages (refine_shard)
            return len(payload[3]) * len(self.recomputes)
        if level <= RULES:
            return self.variants()
        if level in (NEED, STAIRCASE):  # the plans the rules pass from its low (or need) up
            return sum((mask >> payload[4]).bit_count() for mask in payload[3])
        return 1

    def drain(self, bucket: str) -> None:
        """Count what is left in the queue under `bucket`, with the seeds left out over the cutoff."""
        if not self.tallied:
            self.beyond_cutoff = 0
            self.heap.clear()
            return
        if self.beyond_cutoff:
            self.rejected[bucket] += self.beyond_cutoff
            self.beyond_cutoff = 0
        if not self.heap:
            return
        # what every FLOOR and SHARD node stands for (the variants), counted by level at C speed: most of what is left
        # (DeepSeek-V3/2,048: 9,166 of 15,834 nodes); the others each by what it covers (a RULES node: its stages)
        levels = list(map(_LEVEL, self.heap))
        plain = levels.count(FLOOR) + levels.count(SHARD)
        self.rejected[bucket] += self.variants() * plain + sum(
            self.covered(level, payload) for _, level, _, payload in compress(self.heap, map(_COVERED.__contains__,
                                                                                               levels)))
        self.heap.clear()


def shared_search(job: Job, fixed: Fixed, engine: Engine, top_k: int, budget_bytes: int,
                  share: BestFirstSearch | None) -> BestFirstSearch:
    """A search of `job` under this budget; `share`: a search of the same job whose estimates and budget-free memos
    it reuses (run_search's)."""
    search = BestFirstSearch.for_job(job, fixed, engine, top_k, budget_bytes=budget_bytes)
    if share is not None:  # what does not depend on the budget: the estimates, and the per-search memos below
        search.caches = share.caches.shared()
        search.overlaps, search.pipeline_overlap = share.overlaps, share.pipeline_overlap
        search.sizes_by_dp, search.floor_parts = share.sizes_by_dp, share.floor_parts
        search.bounds_memo, search.search_memo = share.bounds_memo, share.search_memo
        search.token_bounds, search.pipe_bounds = share.token_bounds, share.pipe_bounds
        search.seed_key_rows = share.seed_key_rows
    return search


def run_search(job: Job, fixed: Fixed, engine: Engine, top_k: int, warnings: list[str],
               budget_bytes: int = 0, share: BestFirstSearch | None = None,
               cutoff: float = math.inf, counted: bool = True, tallied: bool = True,
               recorded: bool = False) -> tuple[BestFirstSearch, int]:
    """Search the whole space of `job` (TP inside the NVLink domain first, across it only when nothing inside
    fits) and count every plan considered. `share`: a search of the same job whose estimates this one reuses;
    `cutoff`: no slower step time is wanted (the TP-across tier is then left out whole where its floor, across_floor,
    is over it); `counted`: False where only what it ranks is read (the MEM003 count is then not told apart);
    `tallied`: False where no count is read at all (the dead seeds and what the queue holds at the end are not
    counted: the time a search spends on counts alone, BestFirstSearch.tallied); `recorded`: it keeps what it settled
    of its seeds for a thinner-headroom probe (Below).
    Appends to `warnings` what the answer must say about the run."""
    search = shared_search(job, fixed, engine, top_k, budget_bytes, share)
    search.cutoff, search.count_host, search.tallied = cutoff, counted, tallied
    if recorded:
        search.below = Below()
    tiers = search.caches.tiers
    if tiers is None:
        tiers = search.caches.tiers = split_space(search)
    search.rejected.update(tiers.rejected)
    ideal = ideal_time(job, engine)
    search.seed(tiers.inside, ideal, tier=0, runs=tiers.inside_runs)
    search.run()
    if not search.found and not search.stopped_by_budget and tiers.across:
        search.drain(SLOWER)
        if cutoff < math.inf and across_floor(search, tiers) > cutoff:
            # Every plan across the domain is slower than the cutoff (tier_floor): the tier is drained SLOWER unseeded
            # (dead seeds too); only the thinner-headroom probe's cutoff is finite, and its counts are not read.
            search.beyond_cutoff += tiers.across_plans
        else:
            search.seed(tiers.across, ideal, tier=1, runs=tiers.across_runs)
            search.run()
        if search.found:
            warnings.append("No layout with TP inside one NVLink domain fits; the ranked layouts use TP across "
                            "domains, so every layer's TP traffic crosses the network.")
    elif tiers.across:
        search.rejected[NVLINK] += tiers.across_plans
    search.drain(BUDGET if search.stopped_by_budget else SLOWER)
    for reason in search.untimed_reasons[:3]:
        warnings.append(f"The throughput model could not time some layouts that pass the rules: {reason}")
    if search.stopped_by_budget:
        warnings.append(budget_cut(search.max_evaluations))
    search.keep_for_job()
    return search, tiers.considered

