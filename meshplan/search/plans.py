"""The plans a search compares and what it knows of them: each key's plan with the knobs chosen per plan (sequence
parallelism, the MoE dispatcher, EP overlap, the request's carried fields), its estimates cached once per job
(`Caches`, shared by a search of the same job at another memory budget), and whether it fits that budget: the least
recompute each layout needs, from the first stage's memory floor before any estimate.

The queue that orders these plans is meshplan/search/engine.py; the step-time bounds it orders them by,
meshplan/search/bounds.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from meshplan.arithmetic.memory_states import accumulated_grad_bytes, bytes_per_param
from meshplan.arithmetic.mesh import crosses_domains
from meshplan.core.once import once
from meshplan.estimate.memory import FitVerdict, memory_budget
from meshplan.estimate.perf import StepTerms
from meshplan.rules.engine import backend_of, verdicts
from meshplan.schema.plan import Job, Plan, step_microbatches
from meshplan.schema.reports import CheckReport, Finding, MemoryReport, ThroughputReport
from meshplan.search.estimators import Engine
from meshplan.search.floors import (
    first_stage_floor_rows,
    first_stage_floors,
    first_stage_needs,
    layout_floor,
    layout_floors,
    own_memory,
    ranks_floor,
)
from meshplan.search.host_counts import HostCounts
from meshplan.search.job_memo import kept_or_refused, memo_part
from meshplan.search.overlap_choice import OverlapChoice
from meshplan.search.policy import HEADROOM_RULE
from meshplan.search.seed_groups import Seeds
from meshplan.search.space import (
    Fixed,
    Layout,
    LayoutRun,
    Prefiltered,
    Tiers,
    layout_sequence_parallel,
    micro_batches,
    states_lower_bound,
)
from meshplan.search.zero_stages import offered_before

# The rules that refuse moe_a2a_overlap on a plan (Megatron-Core's asserts: EP009 its preconditions, PP015 a named
# schedule other than combined 1F1B, or Megatron-FSDP over virtual stages, CG003 Transformer Engine graphs of the moe
# or mlp module, EP012 beside moe_shared_expert_overlap), and the Plan fields they read (their `reads`): of a search's
# plan (`SearchPlans.plan`) these vary with pp, vpp, ep, etp, the ZeRO stage, the recompute and the layout's named
# schedule only (recompute_modules is never set, the CUDA-graph fields are the request's in every plan, the dispatcher
# is SearchPlans.dispatcher's of (ep, etp, ZeRO stage), the overlap is on in a2a_overlap's probe).
OVERLAP_RULES = ("EP009", "PP015", "CG003", "EP012")
OVERLAP_READS = ("pp", "vpp", "ep", "zero_stage", "recompute", "recompute_modules", "pipeline_schedule",
                 "moe_a2a_overlap", "cuda_graph_impl", "cuda_graph_modules", "moe_token_dispatcher")

PlanKey = tuple[Layout, int, str, int]  # (layout, ZeRO stage, recompute, micro-batch size)
Report = TypeVar("Report", MemoryReport, ThroughputReport, CheckReport)


@dataclass
class Caches:
    """What a search has learnt about its job. The estimates, findings and bounds do not depend on the memory
    budget, so a search of the same job at another budget shares them (`shared`); what fits does."""

    memory: dict[PlanKey, MemoryReport] = field(default_factory=dict)
    # What Engine.memory_fit found of a plan whose report the search did not need (SearchPlans.fits): exact where
    # complete, else a floor of the report's figures (settles another budget only where that floor is over it).
    verdicts: dict[PlanKey, FitVerdict] = field(default_factory=dict)
    throughput: dict[PlanKey, ThroughputReport] = field(default_factory=dict)
    terms: dict[PlanKey, StepTerms] = field(default_factory=dict)  # a step's terms before its pipeline's replay
    plain_terms: dict[PlanKey, StepTerms] = field(default_factory=dict)  # its plain twin's (overlap_choice.py)
    checks: dict[PlanKey, Finding | None] = field(default_factory=dict)  # the structural rules' first error, or None
    token_time: dict[tuple, float] = field(default_factory=dict)  # seconds per token of single-stage references
    # per work reference of token_time: its layers' and head's parts per token (bounds.token_parts)
    token_parts: dict[tuple, tuple[float, ...]] = field(default_factory=dict)
    pp_units: dict[PlanKey, float] = field(default_factory=dict)  # bounds.pp_unit per non-interleaved base
    first_finding: dict[str, Finding] = field(default_factory=dict)  # per rule id that rejected a plan: its first
    # first_stage_floors per own_memory layout and ZeRO stage, per micro-batch: one figure per recompute of the search
    floors: dict[tuple[Layout, int], dict[int, tuple[float, ...]]] = field(default_factory=dict)
    states: dict[tuple[int, ...], float] = field(default_factory=dict)  # states_lower_bound per (degrees, ZeRO)
    per_param: dict[tuple[int, int], float] = field(default_factory=dict)  # its bytes per parameter per (ZeRO, shard)
    # per layout: its model states' bound per ZeRO stage and its layout floors as asked (SearchPlans.stage_over)
    stage_floors: dict[Layout, tuple[list[float], list[float | None]]] = field(default_factory=dict)
    space: tuple[list[Layout], list[Prefiltered], tuple[LayoutRun, ...]] | None = None  # enumerate_space of the job
    tiers: Tiers | None = None  # run_search's split of the space
    seeds: dict[int, Seeds] = field(default_factory=dict)  # per tier (0 inside the NVLink domain, 1 across)
    # Per layout and micro-batch: the least recompute (index) that fits at the lightest ZeRO stage; len(recomputes)
    # when nothing does. It only grows with the micro-batch, and interleaving only adds to its base's.
    least_recompute: dict[Layout, dict[int, int]] = field(default_factory=dict)
    plans: dict[Layout, Plan] = field(default_factory=dict)  # each layout's first plan, validated (SearchPlans.plan)
    # per grid (tp, pp, cp, ep, etp, dp), per ZeRO stage of the ladder: the stages offered before it there, one plan
    # with it (zero_stages.offered_before; SearchPlans.offered_first)
    offered: dict[tuple[int, ...], dict[int, tuple[int, ...]]] = field(default_factory=dict)

    @classmethod
    def kept(cls, memo: dict) -> Caches:
        """Caches for a search whose job memo is `memo` (job_memo.py): what no count and no budget decides (the floors,
        the model-state bounds, the layouts' plans, the stages offered first, the space) read from it, the estimates
        a search counts afresh."""
        return cls(floors=memo_part(memo, "floors"), states=memo_part(memo, "states"),
                   per_param=memo_part(memo, "per param"), stage_floors=memo_part(memo, "stage floors"),
                   plans=memo_part(memo, "plans"), offered=memo_part(memo, "offered"), space=memo.get("space"))

    def shared(self) -> Caches:
        """Caches for a search of the same job at another memory budget: the estimates shared, the fits afresh."""
        return Caches(memory=self.memory, verdicts=self.verdicts, throughput=self.throughput, terms=self.terms,
                      plain_terms=self.plain_terms,
                      checks=self.checks, token_time=self.token_time, token_parts=self.token_parts,
                      pp_units=self.pp_units, first_finding=self.first_finding, floors=self.floors, states=self.states,
                      per_param=self.per_param, stage_floors=self.stage_floors, offered=self.offered,
                      space=self.space, tiers=self.tiers, seeds=self.seeds, plans=self.plans)


@dataclass(kw_only=True)
class SearchPlans(HostCounts, OverlapChoice):
    """A job's plans under one memory budget: the plan of each key, its estimates (cached), whether it fits."""

    job: Job
    fixed: Fixed
    engine: Engine
    zeros: tuple[int, ...]
    recomputes: tuple[str, ...]
    sp: bool
    cp_comm: str
    split: tuple[int, int]
    law: str = "megatron"
    flex: bool = False  # the framework can render Megatron-Core's flex MoE dispatcher
    a2a_open: bool = False  # the search chooses moe_a2a_overlap (an MoE model, a framework that renders it, not fixed)
    domain: int = 8  # GPUs per NVLink domain (a node, or a rack for GB200 NVL72)
    budget_bytes: int = 0  # memory a ranked plan may use: capacity less the MEM002 headroom (0 = capacity)
    # The keys this search estimated first (by report or verdict) that may be over capacity, in order; `near` builds
    # from them the list of those that are (near_list; near_done: how many of the keys it has read).
    missed: list[PlanKey] = field(default_factory=list)
    near_list: list[tuple[int, Plan, MemoryReport]] = field(default_factory=list)
    near_done: int = 0
    over_stage: dict[int, int] = field(default_factory=dict)  # per pp: the stage memory_fit last found over
    caches: Caches = field(default_factory=Caches)
    calls: Counter = field(default_factory=Counter)  # estimates computed by this search, per Engine estimator
    overlaps: dict[tuple[int, int, int, int, str, str], bool] = field(default_factory=dict)  # a2a_overlap's memo
    plain_twins: dict[PlanKey, Plan | None] = field(default_factory=dict)  # overlap_choice.plain_twin's memo
    dispatchers: dict[tuple[int, int, int], str] = field(default_factory=dict)  # dispatcher's per (ep, etp, ZeRO)
    knob_rows: dict[tuple, list[dict]] = field(default_factory=dict)  # check_errors' knobs per what knobs reads
    tp_overlap: bool = False  # tp_comm_overlap on every plan with TP to overlap (a TP-1 layout has none)
    presets: dict[int, tuple] = field(default_factory=dict)  # space.state_preset per ZeRO stage: the memory floors'
    refused: tuple = ()  # zero_stages.LeftOut: ZeRO stages left out, refused on every layout (search_ladder)
    floor_parts: dict = field(default_factory=dict)  # first_stage_floor's memo for this job and these presets
    sizes_by_dp: dict[int, tuple[int, ...]] = field(default_factory=dict)  # micro_batches per dp (all it reads)
    floor_needs: dict[Layout, dict[int, tuple[int, ...]]] = field(default_factory=dict)  # zero_needs' memo, per mbs
    floor_least: dict[Layout, dict[int, int]] = field(default_factory=dict)  # need_floor's memo, per micro-batch
    # The plans fits() rejected under cpu_memory_per_node that may be within the GPU budget: True where they are
    # (only the host rejected them: rule MEM003, as `check` names it), None until settled (host_counts.py); host_seen
    # counts the rejections noted; gpu_over, per pp, the stage a verdict settled without the host last found over.
    host_short: dict[PlanKey, bool | None] = field(default_factory=dict)
    host_seen: int = 0
    gpu_over: dict[int, int] = field(default_factory=dict)
    count_host: bool = True  # False where nothing reads the counts (the GPU-count scan): no plan is noted
    plain: Plan | None = None  # the first layout's plan without a split, validated: first_plan copies the others
    sp_by_pp: dict[tuple[bool, int], bool] = field(default_factory=dict)  # sequence_parallel's memo
    state_rows: dict[tuple[int, ...], tuple[float, ...]] = field(default_factory=dict)  # states_row's, per degrees
    job_memo: dict = field(default_factory=dict)  # what its job's searches keep across requests (job_memo.py)

    def sequence_parallel(self, lay: Layout) -> bool:
        """The request's choice, else the framework default where there is TP to pair it with
        (space.layout_sequence_parallel, once per whether the layout has TP and its pp: all it reads of a layout)."""
        key = (lay.tp > 1, lay.pp)
        hit = self.sp_by_pp.get(key)
        if hit is None:
            hit = self.sp_by_pp[key] = layout_sequence_parallel(self.job, self.fixed, self.sp, lay)
        return hit

    def plan(self, lay: Layout, zero: int, recompute: str, mbs: int, overlap: bool | None = None) -> Plan:
        """The plan of a key, with the knobs chosen per plan (dispatcher, EP overlap; `overlap` forces the latter),
        the request's TP overlap wherever there is TP, and the request's carried fields. The layout's first plan is
        first_plan's (Caches.plans); the others are copies of it with the knobs that change between a layout's plans
        (Plan.copied: not validated again), each a value validation returns unchanged (ZeRO stage, recompute,
        positive micro-batch, dispatcher, bool): the same plan (tests/test_search_plans_built.py builds both)."""
        knobs = self.knobs(lay, zero, recompute, mbs, overlap)
        template = self.caches.plans.get(lay)
        if template is None:
            return self.caches.plans.setdefault(lay, self.first_plan(lay, knobs))
        return template.copied(knobs)

    def first_plan(self, lay: Layout, knobs: dict) -> Plan:
        """A layout's first plan: copied from `plain` where Layout.copied_plan can (the same plan), else validated."""
        sp, overlap = self.sequence_parallel(lay), self.tp_overlap and lay.tp > 1
        plan = lay.copied_plan(self.plain, knobs, sp, overlap) or lay.plan(  # type: ignore[arg-type]
            **knobs, sequence_parallel=sp, cp_comm_type=self.cp_comm, tp_comm_overlap=overlap, **self.fixed.carried)
        self.plain = self.plain or (plan if lay.split is None else None)
        return plan

    def knobs(self, lay: Layout, zero: int, recompute: str, mbs: int, overlap: bool | None = None) -> dict:
        """The fields in which a layout's plans differ (plan: the layout's first plan with these), by field name."""
        if overlap is None:
            overlap = self.a2a_overlap(lay, zero, recompute)
        return {"zero_stage": zero, "recompute": recompute, "micro_batch_size": mbs,
                "moe_token_dispatcher": self.dispatcher(lay, zero), "moe_a2a_overlap": overlap}

    def a2a_overlap(self, lay: Layout, zero: int, recompute: str) -> bool:
        """moe_a2a_overlap: the user's, else on wherever the rules that refuse it (OVERLAP_RULES: Megatron-Core's
        asserts, e.g. PP015) allow it. It adds no memory, and without a pipeline only hides time: one plan per key, as
        with the flex dispatcher; at pp > 1 it runs the combined 1F1B schedule, which may be slower, and the key's
        plan is the faster of the two (overlap_choice.py). Asked once per what the rules read (OVERLAP_READS), each
        rule's verdict from the job's kept verdicts (rules/engine.Verdicts.fires: per its screen or reads; the rules
        are blocking rules of every framework that renders the overlap, tests/test_search_plans_built.py)."""
        if "moe_a2a_overlap" in self.fixed:
            return bool(self.fixed.values["moe_a2a_overlap"])
        if lay.schedule == "combined_1f1b":  # the overlap's own schedule (a request that names it)
            return True
        if not self.a2a_open or lay.ep <= 1:
            return False
        # what the rules read of it (OVERLAP_READS; etp for the dispatcher EP012 reads)
        key = (lay.pp, lay.vpp, lay.ep, lay.etp, zero, recompute, lay.schedule)
        hit = self.overlaps.get(key)
        if hit is None:
            probe, kept = self.plan(lay, zero, recompute, 1, overlap=True), verdicts(self.job)
            hit = self.overlaps[key] = not any(kept.fires(self.job, probe, rule) for rule in OVERLAP_RULES)
        return hit

    def dispatcher(self, lay: Layout, zero: int) -> str:
        """The MoE token dispatcher: the user's, else flex (DeepEP/HybridEP) when the expert group leaves the
        NVLink domain and the framework (on its Megatron-Core engine) can render it - it never sends more
        than all-to-all - else alltoall."""
        key = (lay.ep, lay.etp, zero)  # all it reads of the plan
        hit = self.dispatchers.get(key)
        if hit is None:
            fixed = self.fixed.values.get("moe_token_dispatcher")
            if fixed is not None:
                hit = str(fixed)
            elif (self.flex and lay.ep > 1 and crosses_domains(lay.ep, lay.etp, self.domain)
                  and backend_of(self.job.card, zero) == "megatron"):
                hit = "flex"
            else:
                hit = "alltoall"
            self.dispatchers[key] = hit
        return hit

    @property
    def memory_calls(self) -> int:
        return self.calls["memory"]

    @property
    def perf_calls(self) -> int:
        return self.calls["throughput"]

    @property
    def evaluations(self) -> int:
        """Memory and throughput estimates this search computed (what the answer reports as `evaluated`; the queue
        asks it before each pop, so the counts are read here directly)."""
        calls = self.calls
        return calls["memory"] + calls["throughput"]

    def _estimate(self, kind: str, cache: dict[PlanKey, Report], key: PlanKey) -> Report:
        """The Engine's `kind` estimate of the plan `key`, once per job: counted before the call, so one that raises
        (a plan the cost model cannot time) still counts."""
        hit = cache.get(key)
        if hit is None:
            self.calls[kind] += 1
            hit = cache[key] = getattr(self.engine, kind)(self.job, self.plan(*key))
        return hit

    def memory(self, lay: Layout, zero: int, recompute: str, mbs: int) -> MemoryReport:
        """The plan's memory report, counted once per job with its verdict (fit_verdict) where that came first."""
        key = (lay, zero, recompute, mbs)
        report = self.caches.memory.get(key)
        if report is None:
            if key in self.caches.verdicts:
                report = self.caches.memory[key] = self.engine.memory(self.job, self.plan(*key))
            else:
                report = self._estimate("memory", self.caches.memory, key)
                if not report.fits:
                    self.missed.append(key)
        return report

    def check_error(self, lay: Layout, zero: int, recompute: str, mbs: int) -> str | None:
        """First error id of the structural rules, or None: their first error's finding once per job (Caches.checks),
        from the check's first_error_of where it has one (config.StructuralCheck: the same finding from the kept
        verdicts, read from the layout's first plan's values with this key's knobs: the plan is built only where a
        verdict is not kept), else its report."""
        key = (lay, zero, recompute, mbs)
        error = self.caches.checks.get(key, False)
        if error is False:
            self.calls["check"] += 1
            first_of = getattr(self.engine.check, "first_error_of", None)
            if first_of is not None:  # a layout's plans differ from its first in their knobs only (plan)
                error = first_of(self.job, self.knobs(lay, zero, recompute, mbs), self.caches.plans.get(lay),
                                 lambda: self.plan(*key))
            else:
                report = self.engine.check(self.job, self.plan(*key))
                error = next((f for f in report.findings if f.severity == "error"), None)
            self.caches.checks[key] = error
        return self.rule_id(error)

    def kept_check(self, key: PlanKey, error: Finding | None) -> str | None:
        """check_error of a key whose first error a search of the same job memo found (`error`): counted and kept as
        check_error keeps it (tiers.split_space's replay)."""
        if key not in self.caches.checks:
            self.calls["check"] += 1
            self.caches.checks[key] = error
        return self.rule_id(self.caches.checks[key])

    def rule_id(self, error: Finding | None) -> str | None:
        """A first error's rule id, its finding kept as the first of that rule (Caches.first_finding); None: none."""
        if error is None:
            return None
        self.caches.first_finding.setdefault(error.id, error)
        return error.id

    def check_errors(self, lay: Layout, zero: int, mbs: int) -> tuple[str | None, ...]:
        """check_error at each recompute of the search: a layout's plans at one ZeRO stage and micro-batch differ in
        the recompute and the EP overlap it allows, and rules read both (OF002: DeepSpeed's activation offload needs
        full recompute; EP009 refuses the overlap with full recompute; PP015 reads the overlap). Asked together
        (the check's first_errors_over, where it has one): the rules that read neither are asked once."""
        keys = [(lay, zero, recompute, mbs) for recompute in self.recomputes]
        over = getattr(self.engine.check, "first_errors_over", None)
        if over is None:
            return tuple(self.check_error(*key) for key in keys)
        checks = self.caches.checks
        found = [checks.get(key, False) for key in keys]
        if any(error is False for error in found):
            self.calls["check"] += len(keys)
            base = self.caches.plans.get(lay)
            if base is None:  # the layout's first plan (plan keeps it): the others are read from its values
                base = self.plan(*keys[0])
            found = over(self.job, self.knob_row(lay, zero, mbs), base, [partial(self.plan, *key) for key in keys])
            for key, error in zip(keys, found, strict=True):
                checks[key] = error
        return tuple(self.rule_id(error) for error in found)

    def offered_first(self, lay: Layout, zero: int, mbs: int) -> int:
        """The recomputes (a mask, bit i: recomputes[i]) at which a ZeRO stage offered before `zero` at this layout
        (zero_stages.offered_before: one plan with it, the default stage first) passes the rules: there the plan at
        `zero` is that plan, which the search ranks at the other stage (engine.apply_rules, SEARCH-SAME-STAGE). What
        decides it reads the layout's degrees only, so it is kept per grid."""
        grid = (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)
        before = self.caches.offered.get(grid)
        if before is None:
            plan = self.plan(lay, self.zeros[0], self.recomputes[0], mbs)
            before = self.caches.offered[grid] = {
                other: offered_before(self.job, plan.copied({"zero_stage": other}), self.zeros) for other in self.zeros}
        mask = 0
        for other in before[zero]:
            for i, error in enumerate(self.check_errors(lay, other, mbs)):
                if error is None:
                    mask |= 1 << i
        return mask

    def knob_row(self, lay: Layout, zero: int, mbs: int) -> list[dict]:
        """knobs of the layout's plans at this ZeRO stage and micro-batch, one per recompute of the search, kept per
        all they read of a layout (a2a_overlap: pp, vpp, ep and the named schedule; dispatcher: ep, etp): the same
        dicts for every layout alike in those (read, never changed: first_errors_over copies what it updates)."""
        key = (lay.pp, lay.vpp, lay.ep, lay.etp, lay.schedule, zero, mbs)
        row = self.knob_rows.get(key)
        if row is None:
            row = self.knob_rows[key] = [self.knobs(lay, zero, recompute, mbs) for recompute in self.recomputes]
        return row

    def throughput(self, lay: Layout, zero: int, recompute: str, mbs: int) -> ThroughputReport:
        """The plan's estimate, finished from its step's terms when the search already computed them (the same
        numbers: estimate_throughput is step_terms then throughput_of)."""
        key = (lay, zero, recompute, mbs)
        hit = self.caches.throughput.get(key)
        if hit is not None:
            return hit
        terms = self.caches.terms.pop(key, None)
        hit = (self._estimate("throughput", self.caches.throughput, key) if terms is None or self.engine.finish is None
               else self.engine.finish(terms))
        hit = self.caches.throughput[key] = self.faster(key, hit)  # where the EP overlap may be slower (its twin's)
        return hit

    def step_floor(self, lay: Layout, zero: int, recompute: str, mbs: int) -> float:
        """A lower bound of the plan's step time without replaying its pipeline (StepTerms.floor), or its step time
        when it is already estimated. Counted as a throughput estimate (the finish that may follow is not)."""
        key = (lay, zero, recompute, mbs)
        done = self.caches.throughput.get(key)
        if done is not None:
            return done.step_time_s
        terms = self.caches.terms.get(key)
        if terms is None:
            if self.engine.terms is None:
                return self.throughput(lay, zero, recompute, mbs).step_time_s
            self.calls["throughput"] += 1
            terms = self.caches.terms[key] = self.kept_terms("terms", key, lambda: self.plan(*key))
        return self.least_floor(key, terms.floor)

    def kept_terms(self, kind: str, key: PlanKey, plan: Callable[[], Plan]) -> StepTerms:
        """Engine.terms of the key's plan (`plan` builds it; `kind`: the key's own plan, "terms", or its plain twin,
        "plain terms", overlap_choice.py), or the refusal it raises, once per job memo (job_memo.py: a pure function of
        the key at the memo's job, fixed fields and estimators); the search counts it as before, per search."""
        return kept_or_refused(self.job_memo, kind, key, lambda: self.engine.terms(self.job, plan()))  # type: ignore[misc]

    @property
    def near(self) -> list[tuple[int, Plan, MemoryReport]]:
        """The plans over capacity this search estimated first, as (bytes over, plan, report), in the order estimated
        and trimmed to the 16 least over whenever more than 64 gather; the reports of the plans only a verdict
        settled are built here (not counted again), for the answer that names the closest."""
        for key in self.missed[self.near_done:]:
            report = self.caches.memory.get(key)
            if report is None:
                report = self.caches.memory[key] = self.engine.memory(self.job, self.plan(*key))
            self.near_done += 1
            if not report.fits:
                self.near_list.append((report.fit_bytes - report.capacity_bytes, report.plan, report))
                if len(self.near_list) > 64:
                    self.near_list.sort(key=lambda t: t[0])
                    del self.near_list[16:]
        return self.near_list

    def variants(self) -> int:
        return len(self.zeros) * len(self.recomputes)

    def sizes(self, lay: Layout) -> tuple[int, ...]:
        """space.micro_batches of the layout, once per dp (all it reads of a layout)."""
        hit = self.sizes_by_dp.get(lay.dp)
        if hit is None:
            hit = self.sizes_by_dp[lay.dp] = micro_batches(self.job, lay, self.fixed)
        return hit

    def plans_of(self, lay: Layout) -> int:
        """How many plans (ZeRO stage x recompute x micro-batch) a layout stands for in the search (the refused
        stages' are refused_plans); one micro-batch when none divides its share of the batch (the batch rule then
        says why)."""
        return self.variants() * max(1, len(self.sizes(lay)))

    def refused_plans(self, lay: Layout) -> int:
        """The plans of the ZeRO stages the search leaves out (zero_stages.search_ladder: counted as refused)."""
        return len(self.refused) * len(self.recomputes) * max(1, len(self.sizes(lay)))

    def need_range(self, lay: Layout, mbs: int) -> tuple[int, int]:
        """What is already known of the least recompute that fits at the lightest ZeRO stage: (low, high).
        Memory grows with the micro-batch, so a smaller micro-batch's need is a floor and a larger one's a
        ceiling; a non-interleaved base's need is a floor for its interleaved layouts where it is their own (own).
        Where FSDP units hold gradients between micro-batches (grad_accumulation), a step of one micro-batch holds
        none: only needs on the same side of that step are compared."""
        known = self.caches.least_recompute
        low, high = 0, len(self.recomputes)
        if lay not in known and self.own(lay) not in known:  # nothing known yet (most layouts when first asked)
            return low, high
        card, gbs, lora = self.job.card, self.job.global_batch_size, self.job.lora is not None
        defer = self.fixed.carried.get("defer_fsdp_grad_sync")
        holds = lambda b: accumulated_grad_bytes(card, step_microbatches(gbs, b, lay.dp), True, lay.pp, defer, lora)  # noqa: E731
        held = holds(mbs) if card.grad_accumulation else None
        for key in (lay, self.own(lay)):
            for b, need in known.get(key, {}).items():
                if held is not None and holds(b) != held:
                    continue  # one side holds the accumulated gradients, the other not: no order between them
                if b <= mbs:
                    low = max(low, need)
                elif key is lay and b > mbs:
                    high = min(high, need)
        if mbs in known.get(lay, {}):
            low = high = known[lay][mbs]
        return low, max(low, high)

    def own(self, lay: Layout) -> Layout:
        """The layout whose floors and least recompute stand for `lay`'s (floors.own_memory: its non-interleaved base
        where the ranks hold layers of the same kinds in the same order, else itself)."""
        if lay.vpp == 1 or lay.split is not None:
            return lay
        return own_memory(self.job, lay, self.zeros, self.floor_parts)

    @property
    def budget(self) -> int:
        return self.budget_bytes or self.job.gpu.memory_bytes

    def memory_rule_for(self, needed: int) -> str:
        """MEM001 when even the full capacity is exceeded; MEM002 when only the headroom budget is."""
        return self.engine.memory_rule if needed > self.job.gpu.memory_bytes else HEADROOM_RULE

    def floor_fits(self, lay: Layout, zero: int, recompute: str, mbs: int) -> bool:
        """False when the first stage's memory floor alone is over capacity (no estimate needed)."""
        return self.floor_bytes(self.own(lay), zero, recompute, mbs) <= self.budget

    @once
    def reserved_floors(self) -> bool:
        """Whether the floors count the allocator reserve: the fit's figure has none with expandable segments."""
        return not self.fixed.carried.get("expandable_segments")

    @once
    def offloaded_activations(self) -> bool:
        """Whether the request offloads the saved activations, fine-grained or layer-wise (the floors then count
        none: a lower bound wherever some go to the host)."""
        return bool(self.fixed.carried.get("activation_offload")) or bool(self.job.activation_offload_layers)

    def floor_bytes(self, own: Layout, zero: int, recompute: str, mbs: int) -> float:
        """first_stage_floor of an own_memory layout, once per job: read from its row (floor_row, every recompute of
        the search at once) where the recompute is one of them, else computed alone (the same figure)."""
        if recompute not in self.recomputes:
            return first_stage_floors(
                self.job, own, zero, (recompute,), mbs, self.sequence_parallel(own), self.presets[zero],
                reserved=self.reserved_floors, activation_offload=self.offloaded_activations, memo=self.floor_parts)[0]
        row = self.caches.floors.get((own, zero))
        floors = None if row is None else row.get(mbs)
        if floors is None:
            floors = self.floor_row(own, zero, (mbs,))[mbs]
        return floors[self.recomputes.index(recompute)]

    def floor_row(self, own: Layout, zero: int, sizes: tuple[int, ...]) -> dict[int, tuple[float, ...]]:
        """The first-stage floors of an own_memory layout at this ZeRO stage per micro-batch, each a figure per
        recompute of the search (floors.first_stage_floor_rows: the same floats as first_stage_floor's), with those
        of `sizes` among them; once per job (Caches.floors), the missing ones in one call."""
        row = self.caches.floors.get((own, zero))
        if row is None:  # (most rows: asked once, all their micro-batches)
            row = self.caches.floors[(own, zero)] = {}
            missing = sizes
        else:
            missing = tuple([b for b in sizes if b not in row])
        if missing:
            rows = first_stage_floor_rows(
                self.job, own, zero, self.recomputes, missing, self.sequence_parallel(own), self.presets[zero],
                reserved=self.reserved_floors,
                activation_offload=self.offloaded_activations, memo=self.floor_parts)
            row.update(zip(missing, rows, strict=True))
        return row

    def states_bound(self, lay: Layout, zero: int) -> float:
        """states_lower_bound of the layout at that ZeRO stage, once per job and degrees (all it reads)."""
        key = (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp, zero)
        hit = self.caches.states.get(key)
        if hit is None:
            hit = self.caches.states[key] = states_lower_bound(self.job, lay, zero, self.split, self.presets[zero][1],
                                                               partial(self.bytes_per_param, zero))
        return hit

    def bytes_per_param(self, zero: int, shard: int) -> float:
        """memory_states.bytes_per_param of the ZeRO stage's preset at this shard size, once per job (all it reads:
        states_bound asks a few shard sizes of every degrees tuple)."""
        hit = self.caches.per_param.get((zero, shard))
        if hit is None:
            hit = self.caches.per_param[zero, shard] = bytes_per_param(self.presets[zero][1], shard)
        return hit

    def fits(self, lay: Layout, zero: int, recompute: str, mbs: int) -> bool:
        """Within the memory budget, and the node's host holds what the plan offloads (rule MEM003, as `check`
        applies it when cpu_memory_per_node is given: host bytes, like GPU bytes, only fall with more recompute or
        a higher ZeRO stage, so the staircase's order holds)."""
        if not self.floor_fits(lay, zero, recompute, mbs):
            return False
        key = (lay, zero, recompute, mbs)
        host = self.job.cpu_memory_per_node
        report = self.caches.memory.get(key)
        if report is None and self.engine.memory_fit is not None:
            fits = self.fit_verdict(key, host)
        else:
            report = self.memory(lay, zero, recompute, mbs)
            fits = report.fit_bytes <= self.budget and (host is None or report.host_bytes_per_node <= host)
        if not fits and host is not None and self.count_host:
            self.host_rejected(key, report)
        return fits

    def fit_verdict(self, key: PlanKey, host: int | None) -> bool:
        """fits from Engine.memory_fit, without the report: counted as the memory estimate once per job; a verdict
        of another budget is reused where it settles this one. The stage found over last (per pp) is asked first.
        A plan that may be over capacity is remembered for `near` as memory() remembers its report."""
        known = self.caches.verdicts.get(key)
        if known is not None:
            if known.figure > self.budget or (host is not None and known.host_per_node > host):
                return False
            if known.complete:
                return True
        else:
            self.calls["memory"] += 1
        pp = key[0].pp
        checked = self.caches.checks.get(key, False) is None  # the search ran the structural rules: no error
        verdict = self.caches.verdicts[key] = self.engine.memory_fit(  # type: ignore[misc]
            self.job, self.plan(*key), self.budget, host, self.over_stage.get(pp, 0), checked)
        if verdict.over is not None:
            self.over_stage[pp] = verdict.over
        if known is None and not (verdict.complete and verdict.figure <= memory_budget(self.job)):
            self.missed.append(key)
        return verdict.complete

    def lightest(self, lay: Layout) -> tuple[int, ...]:
        """The ZeRO stages whose least recompute bounds every stage's: all of them. A higher stage shards more, but
        each convention adds its own (ZeRO-3 / FSDP's gathered units, FSDP2 ZeRO-2's kept bf16 copy), and where the
        sharding groups are small that can outweigh what it saves: Moonlight-16B-A3B on 16 A100 with SkyRL, EP8 DP16
        (expert DP 2), peaks at 74 GB under ZeRO-1 and 81 GB under ZeRO-3 without recompute (tests/
        test_search_oracle.py found it). So no stage stands for the others."""
        return self.zeros

    def need_floor(self, lay: Layout, mbs: int) -> int:
        """The least recompute whose first-stage floor fits at some ZeRO stage (no estimate needed). The
        heaviest recompute is asked first: where even it is over (most layouts of a large job), the search's
        assumption that more recompute never adds memory says no lighter one fits, in one floor instead of one per
        recompute. Kept per layout, for all its micro-batches at once (floor_least: zero_needs works out the row
        at once, and release asks it of each of a layout's seeds, refine_bound of each as it pops)."""
        row = self.floor_least.get(lay)
        if row is None:
            row = self.floor_least[lay] = {}
            own = self.own(lay)
            sizes = self.sizes(own)
            if mbs in sizes:
                self.zero_needs(lay, mbs)  # the row of every micro-batch of the layout
                needs, least = self.floor_needs[own], self.least(lay)
                for b in sizes:
                    row[b] = least(needs[b])
        hit = row.get(mbs)
        if hit is None:  # a micro-batch outside the layout's (a node the batch rule settles)
            hit = row[mbs] = self.least(lay)(self.zero_needs(lay, mbs))
        return hit

    def least(self, lay: Layout) -> Callable[[tuple[int, ...]], int]:
        """need_floor from a zero_needs row of the layout: the least of its lightest ZeRO stages' (min itself where
        every stage is, decided once per layout, not per micro-batch)."""
        lightest = self.lightest(lay)
        if lightest is self.zeros:
            return min
        at = [self.zeros.index(zero) for zero in lightest]
        return lambda needs: min(needs[i] for i in at)

    def may_fit(self, lay: Layout, zero: int, mbs: int) -> bool:
        """Whether any recompute of this stage can fit, from the cheapest bounds: the model states' (cached per
        layout), then the first stage's floor under the heaviest recompute (more recompute never adds memory)."""
        return self.zero_needs(lay, mbs)[self.zeros.index(zero)] < len(self.recomputes)

    def zero_needs(self, lay: Layout, mbs: int) -> tuple[int, ...]:
        """Per ZeRO stage of `zeros`, the least recompute whose first-stage floor fits, len(recomputes) where none
        can (the model states' bound or the layout floor over: stages_over; or the heaviest recompute's floor over);
        all that need_floor and may_fit read of a layout (its degrees, its TP's sequence parallelism and the floors
        of own_memory). Worked out for every micro-batch of the layout at once (needs_row), under this budget."""
        own = self.own(lay)
        needs = self.floor_needs.get(own)
        hit = None if needs is None else needs.get(mbs)
        if hit is None:
            sizes = self.sizes(own)
            if mbs not in sizes:  # a micro-batch outside the layout's (a node the batch rule settles)
                sizes = (mbs,)
            if needs is None:
                needs = self.floor_needs[own] = {}
            needs.update(zip(sizes, self.needs_row(own, sizes), strict=True))
            hit = needs[mbs]
        return hit

    def needs_row(self, own: Layout, sizes: tuple[int, ...]) -> list[tuple[int, ...]]:
        """zero_needs of an own_memory layout at each of `sizes`: per ZeRO stage, none where its model states' bound
        or its layout floor as far as known (stage_floors) is over the budget, else from the stage's floors
        (floors.first_stage_needs, one call for the micro-batches): none where the heaviest recompute's is over
        the budget, else the least recompute whose floor fits (the heaviest one at most). A layout floor not yet
        worked out is not asked: it is under every floor of the row to the last bit (floors.layout_floor), so where
        it is over the budget, so is each heaviest recompute's floor, and the row says none as stage_over would
        have."""
        n_r, budget = len(self.recomputes), self.budget
        sp, reserved, offload = self.sequence_parallel(own), self.reserved_floors, self.offloaded_activations
        none = (n_r,) * len(sizes)
        states, lows = self.stage_floors(own)
        columns = []
        for index, zero in enumerate(self.zeros):
            low = lows[index]
            if states[index] > budget or (low is not None and low > budget):
                columns.append(none)
                continue
            columns.append(first_stage_needs(
                self.job, own, zero, self.recomputes, sizes, sp, self.presets[zero], budget, reserved=reserved,
                activation_offload=offload, memo=self.floor_parts))
        return list(zip(*columns, strict=True))

    def stages_over(self, own: Layout) -> tuple[bool, ...]:
        """Per ZeRO stage of `zeros`: whether the own_memory layout's model states' bound (states_bound) or its layout
        floor (floors.layout_floor: under every micro-batch's and recompute's first-stage floor to the last bit) is
        over the budget, so that no micro-batch or recompute of the stage fits (stage_over)."""
        over = self.stage_over
        return tuple([over(own, index) for index in range(len(self.zeros))])

    def group_over(self, owns: list[Layout]) -> list[bool]:
        """Whether every ZeRO stage of each of `owns` is over (stage_over, asked from the most sharded stage down,
        stopping at one that may fit), for own_memory layouts of one degrees tuple (a seed group's): the same
        verdicts with the same floors worked out and kept (Caches.stage_floors); the model states' bounds are read
        once (states_bound reads only the degrees), and at each ZeRO stage, from the most sharded down, the layout
        floors of the layouts not yet found to fit whose bound is within the budget are worked out together
        (floors.layout_floors: layout_floor's floats)."""
        budget, kept, zeros = self.budget, self.caches.stage_floors, self.zeros
        entries, bounds = [], None
        for own in owns:
            entry = kept.get(own)
            if entry is None:
                if bounds is None:
                    bounds = self.states_row(own)
                entry = kept[own] = (list(bounds), [None] * len(zeros))
            entries.append(entry)
        over = [True] * len(owns)
        pending = list(range(len(owns)))
        for index in reversed(range(len(zeros))):
            asked = [i for i in pending if entries[i][0][index] <= budget and entries[i][1][index] is None]
            if asked:
                zero = zeros[index]
                lows = layout_floors(self.job, [owns[i] for i in asked], zero, self.presets[zero],
                                     memo=self.floor_parts,
                                     reserved=self.reserved_floors)
                for i, low in zip(asked, lows, strict=True):
                    entries[i][1][index] = low
            still = []
            for i in pending:
                states, lows = entries[i]
                if states[index] > budget or lows[index] > budget:  # type: ignore[operator]
                    still.append(i)
                else:
                    over[i] = False
            pending = still
        return over

    def ranks_bytes(self, lay: Layout, zero: int) -> float:
        """floors.ranks_floor of the layout at this ZeRO stage: the heaviest pipeline rank after the first, its
        layers' model states alone (kept per layout and stage in the job's floor memo, so a search at another budget
        only compares)."""
        return ranks_floor(self.job, lay, zero, self.presets[zero], memo=self.floor_parts)

    def layout_over(self, lay: Layout, own: Layout | None = None) -> bool:
        """Whether every ZeRO stage of the layout is over the budget at every micro-batch and recompute: its first
        rank's floors (stage_over of its own_memory, `own` where the caller has it) or a later rank's states
        (ranks_bytes), from the most sharded stage down, stopping at one that may fit."""
        own, budget, zeros = self.own(lay) if own is None else own, self.budget, self.zeros
        states, lows = self.stage_floors(own)  # stage_over's steps
        for index in reversed(range(len(zeros))):
            if states[index] > budget:
                continue
            low = lows[index]
            if low is None:
                low = self.stage_low(own, index, lows)
            if low <= budget and self.ranks_bytes(lay, zeros[index]) <= budget:
                return False
        return True

    def stage_over(self, own: Layout, index: int) -> bool:
        """stages_over at the ZeRO stage zeros[index]: the model states' bound first, the layout floor only where
        that is within the budget. Both are the same at any budget, so they are kept once per job (Caches.
        stage_floors, per layout: the bounds per stage, the layout floors as asked) and a search at another budget
        (the thinner-headroom probe) only compares."""
        states, lows = self.stage_floors(own)
        if states[index] > self.budget:
            return True
        low = lows[index]
        if low is None:
            low = self.stage_low(own, index, lows)
        return low > self.budget

    def stage_low(self, own: Layout, index: int, lows: list[float | None]) -> float:
        """The layout floor of `own` at the ZeRO stage zeros[index], worked out and kept in its stage_floors entry's
        `lows` (where stage_over and layout_over find it not yet asked)."""
        zero = self.zeros[index]
        low = lows[index] = layout_floor(self.job, own, zero, self.presets[zero], memo=self.floor_parts,
                                         reserved=self.reserved_floors)
        return low

    def stage_floors(self, own: Layout) -> tuple[list[float], list[float | None]]:
        """The own_memory layout's entry of Caches.stage_floors: its model states' bound per ZeRO stage and its layout
        floors as asked (None until then)."""
        entry = self.caches.stage_floors.get(own)
        if entry is None:
            entry = self.caches.stage_floors[own] = (list(self.states_row(own)), [None] * len(self.zeros))
        return entry

    def states_row(self, lay: Layout) -> tuple[float, ...]:
        """states_bound of the layout at each ZeRO stage of `zeros`, once per degrees tuple (all it reads)."""
        key = (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)
        hit = self.state_rows.get(key)
        if hit is None:
            hit = self.state_rows[key] = tuple([self.states_bound(lay, zero) for zero in self.zeros])
        return hit

    def need(self, lay: Layout, mbs: int, alive: tuple[int, ...], masks: tuple[int, ...]) -> int:
        """The least recompute index that fits at any of the `alive` ZeRO stages where the structural rules pass it
        (`masks`: per stage, bit i set where they pass recomputes[i]; plans.lightest). The memory floor is usually
        right, so its answer is tried first and the walk goes up from there. Remembered for the other micro-batches
        (need_range) only when every stage is alive at every recompute: fewer stages or recomputes need no less, so a
        need of all of them stays a floor for any."""
        low, high = self.need_range(lay, mbs)
        n_r = len(self.recomputes)
        i = max(low, min(high, self.need_floor(lay, mbs)))
        lightest = tuple((zero, mask) for zero, mask in zip(alive, masks, strict=True) if self.may_fit(lay, zero, mbs))
        start, seen = i, self.host_seen
        while i < min(high, n_r) and not any(mask >> i & 1 and self.fits(lay, zero, self.recomputes[i], mbs)
                                             for zero, mask in lightest):
            i += 1
        # not where only the host rejected some (MEM003): the need a larger micro-batch reads stays one of GPU memory
        host = seen != self.host_seen and any(mask >> j & 1 and self.host_only((lay, zero, self.recomputes[j], mbs))
                                              for j in range(start, min(i + 1, n_r)) for zero, mask in lightest)
        if not host and set(alive) == set(self.zeros) and all(mask == (1 << n_r) - 1 for mask in masks):
            self.caches.least_recompute.setdefault(lay, {})[mbs] = i
        return i
