"""The best-first search: the exact top K of the cost model without timing most layouts.

Each (layout, micro-batch) enters a priority queue with an optimistic step time and is refined one level at a
time (`Level`, in the order a node passes through them), each step pushing it back with a tighter key; a plan
reaching the top at the last level is ranked, since nothing left in the queue can be faster. Everything dropped is
counted under the rule id that dropped it (or a SEARCH-* bucket, meshplan/search/policy.py), so
considered = ranked + rejected.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TypeVar

from meshplan.arithmetic import mesh
from meshplan.arithmetic.mesh import crosses_domains
from meshplan.core.cancel import checkpoint
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import a2a_steady_share
from meshplan.rules.engine import Context, backend_of, load_rules
from meshplan.schema.contract import CheckReport, Finding, Job, MemoryReport, Plan, ThroughputReport
from meshplan.search.estimators import Engine, ideal_time
from meshplan.search.policy import (
    BUDGET,
    DOMINATED,
    HEADROOM_RULE,
    NVLINK,
    SLOWER,
    TIE,
    UNTIMED,
    same_numbers,
    search_limits,
)
from meshplan.search.space import (
    RECOMPUTE_ORDER,
    Fixed,
    Layout,
    Prefiltered,
    enumerate_layouts,
    first_stage_floor,
    knobs,
    micro_batches,
    params_split,
    state_preset,
    states_lower_bound,
    within_nvlink,
    zero_ladder,
)

PlanKey = tuple[Layout, int, str, int]  # (layout, ZeRO stage, recompute, micro-batch size)
Report = TypeVar("Report", MemoryReport, ThroughputReport, CheckReport)


class Level(IntEnum):
    """The queue's levels, in the order a node passes through them. At equal keys the lower level pops first."""

    FLOOR = 1
    """Seeded with the per-token bound: the least recompute the first stage's memory floor allows (none: dropped)."""
    SHARD = 2
    """The pipeline bound of this exact shard, with the send/receive traffic interleaving multiplies."""
    RULES = 3
    """The structural rules and the model-state lower bound, per ZeRO stage."""
    NEED = 4
    """The least recompute that really fits at the lightest ZeRO stage, estimated."""
    STAIRCASE = 5
    """Per ZeRO stage, the least recompute that fits (heavier recompute of that stage is dominated)."""
    TIME = 6
    """A plan known to fit gets its predicted step time."""
    RANK = 7
    """Nothing left in the queue can be faster: the plan's rules run, then it is ranked."""


@dataclass
class Found:
    """A ranked plan: it passes the rules, fits the budget, and has its predicted step time."""

    time: float
    plan: Plan
    memory: MemoryReport
    throughput: ThroughputReport


@dataclass
class Caches:
    """What a search has learnt about its job. The estimates, findings and bounds do not depend on the memory
    budget, so a search of the same job at another budget shares them (`shared`); what fits does."""

    memory: dict[PlanKey, MemoryReport] = field(default_factory=dict)
    throughput: dict[PlanKey, ThroughputReport] = field(default_factory=dict)
    checks: dict[PlanKey, CheckReport] = field(default_factory=dict)  # the structural rules' reports
    token_time: dict[tuple, float] = field(default_factory=dict)  # seconds per token of single-stage references
    first_finding: dict[str, Finding] = field(default_factory=dict)  # per rule id that rejected a plan: its first
    floors: dict[PlanKey, float] = field(default_factory=dict)  # first_stage_floor per non-interleaved plan
    states: dict[tuple[Layout, int], float] = field(default_factory=dict)  # states_lower_bound per (layout, ZeRO)
    # Per (layout, token_rate): the seed keys of its micro-batches, in order (a pure function of the two).
    seed_keys: dict[tuple[Layout, tuple[int, float]], list[float]] = field(default_factory=dict)
    space: tuple[list[Layout], list[Prefiltered]] | None = None  # enumerate_layouts of the job
    # Per (non-interleaved layout, ZeRO stage, recompute, micro-batch): the first stage's memory floor is in budget.
    floor_fits: dict[PlanKey, bool] = field(default_factory=dict)
    # Per layout and micro-batch: the least recompute (index) that fits at the lightest ZeRO stage; len(recomputes)
    # when nothing does. It only grows with the micro-batch, and interleaving only adds to its base's.
    least_recompute: dict[Layout, dict[int, int]] = field(default_factory=dict)

    def shared(self) -> Caches:
        """Caches for a search of the same job at another memory budget: the estimates shared, the fits afresh."""
        return Caches(memory=self.memory, throughput=self.throughput, checks=self.checks, token_time=self.token_time,
                      first_finding=self.first_finding, floors=self.floors, states=self.states,
                      seed_keys=self.seed_keys, space=self.space)


def estimable_zeros(job: Job, fixed: Fixed, zeros: tuple[int, ...]) -> tuple[int, ...]:
    """The ZeRO stages an estimate can take with the request's carried fields: a stage where a blocking rule refuses
    the plainest layout (no model parallelism) while another stage passes is left out of the ladder, e.g. FSDP with
    optimizer=muon (PR005). The search's memory bounds take the ladder's last stage as the lightest, so a stage no
    estimate can take cannot stay in it. When every stage is refused the ladder stays whole: the rules say why."""
    from meshplan.rules.engine import EstimateBlocked, require_estimable

    if not fixed.given:  # the frameworks' own defaults block no stage
        return zeros
    plain = Layout(tp=1, pp=1, cp=1, ep=1, etp=1, dp=job.num_gpus)
    ok = []
    for zero in zeros:
        try:
            require_estimable(job, plain.plan(zero_stage=zero, recompute="none", micro_batch_size=1,
                                              sequence_parallel=False, cp_comm_type="p2p", **fixed.carried))
        except EstimateBlocked:
            continue
        ok.append(zero)
    return tuple(ok) or zeros


def pow2_at_least(x: float) -> int:
    """The smallest power of two >= x (and >= 1): the reference micro-batch of the per-token bounds."""
    return 1 << max(0, (math.ceil(x) - 1).bit_length()) if x > 1 else 1


@dataclass
class BestFirstSearch:
    """One best-first search of a job's layouts under one memory budget (see the module docstring)."""

    job: Job
    fixed: Fixed
    engine: Engine
    top_k: int
    deadline: float
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
    rejected: Counter = field(default_factory=Counter)
    found: list[Found] = field(default_factory=list)
    rows: set[tuple[float, int]] = field(default_factory=set)  # distinct (step time, peak) among found: the top K
    cutoff: float = math.inf  # nothing slower than this step time is wanted (a probe for much faster layouts)
    near: list[tuple[int, Plan, MemoryReport]] = field(default_factory=list)  # plans over capacity, least first
    caches: Caches = field(default_factory=Caches)
    cp_mbs: dict[tuple[int, int], int] = field(default_factory=dict)  # largest micro-batch per (tp, cp)
    work_mbs: dict[tuple[int, int, int], float] = field(default_factory=dict)  # most sequences per rank per shard
    untimed_reasons: list[str] = field(default_factory=list)
    calls: Counter = field(default_factory=Counter)  # estimates computed by this search, per Engine estimator
    stopped_by_budget: bool = False
    max_evaluations: int = 1 << 62
    heap: list = field(default_factory=list)
    seq: int = 0
    overlaps: dict[tuple[Layout, int, str], bool] = field(default_factory=dict)  # a2a_overlap per layout/ZeRO/recompute
    tp_overlap: bool = False  # tp_comm_overlap on every plan with TP to overlap (a TP-1 layout has none)
    pipeline_overlap: dict[tuple[int, int], bool] = field(default_factory=dict)  # pipeline_overlaps per (pp, vpp)
    presets: dict[int, tuple] = field(default_factory=dict)  # space.state_preset per ZeRO stage: the memory floors'

    @classmethod
    def for_job(cls, job: Job, fixed: Fixed, engine: Engine, top_k: int, deadline: float,
                budget_bytes: int = 0) -> BestFirstSearch:
        """A search of `job` with the knobs its framework opens, less what the request fixes."""
        from meshplan.knowledge.cards import framework_card

        kn = knobs(job.framework)
        zeros = zero_ladder(job.framework)
        if "zero_stage" in fixed:
            zeros = tuple(z for z in (int(fixed.values["zero_stage"]),))  # type: ignore[call-overload]
        zeros = estimable_zeros(job, fixed, zeros)
        recomputes = tuple(r for r in RECOMPUTE_ORDER if r in kn.recompute)
        if "recompute" in fixed:
            recomputes = (str(fixed.values["recompute"]),)
        card = framework_card(job.framework)
        sp = card.defaults.sequence_parallel_when_tp
        if "sequence_parallel" in fixed:
            sp = bool(fixed.values["sequence_parallel"])
        cp_comm = str(fixed.values.get("cp_comm_type", "p2p"))
        # TP communication overlap: the request's switch (else the framework's default), not searched: the cost model
        # credits it beyond what the runs measured (perf.tp_hidden; bench/README.md, Throughput)
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
        domain = mesh.fast_domain(job.gpu, job.gpus_per_node)
        a2a_open = (job.model.moe is not None and "moe_a2a_overlap" not in fixed and card.adapter is not None
                    and card.adapter.renders("moe_a2a_overlap"))
        return cls(job=job, fixed=fixed, engine=engine, top_k=top_k, deadline=deadline, zeros=zeros,
                   recomputes=recomputes, sp=sp, cp_comm=cp_comm, split=params_split(job),
                   law=card.world_size_law, flex=card.flex_dispatcher and job.model.moe is not None,
                   a2a_open=a2a_open, domain=domain, max_evaluations=cap, budget_bytes=budget_bytes,
                   presets={z: state_preset(job, z, fixed.carried) for z in zeros}, tp_overlap=tp_overlap)

    # -- the estimators, cached per plan -----------------------------------------------------------

    def sequence_parallel(self, lay: Layout) -> bool:
        """The request's choice, else the framework default where there is TP to pair it with."""
        return self.sp if "sequence_parallel" in self.fixed else self.sp and lay.tp > 1

    def plan(self, lay: Layout, zero: int, recompute: str, mbs: int, overlap: bool | None = None) -> Plan:
        """The plan of a key, with the knobs chosen per plan (dispatcher, EP overlap; `overlap` forces the latter),
        the request's TP overlap wherever there is TP, and the request's carried fields."""
        if overlap is None:
            overlap = self.a2a_overlap(lay, zero, recompute)
        return lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs,  # type: ignore[arg-type]
                        sequence_parallel=self.sequence_parallel(lay), cp_comm_type=self.cp_comm,
                        moe_token_dispatcher=self.dispatcher(lay, zero), moe_a2a_overlap=overlap,
                        tp_comm_overlap=self.tp_overlap and lay.tp > 1, **self.fixed.carried)

    def a2a_overlap(self, lay: Layout, zero: int, recompute: str) -> bool:
        """moe_a2a_overlap: the user's, else on wherever rule EP009 (Megatron-Core's asserts) allows it. Overlap never
        adds time in the cost model (perf.overlapped_a2a exposes at most the plain all-to-all) and no memory
        (memory.py does not read it), so the plan with it dominates the plan without: one plan per key, as with
        the flex dispatcher, rather than twice the space."""
        if "moe_a2a_overlap" in self.fixed:
            return bool(self.fixed.values["moe_a2a_overlap"])
        if not self.a2a_open or lay.ep <= 1:
            return False
        key = (lay, zero, recompute)
        hit = self.overlaps.get(key)
        if hit is None:
            probe = self.plan(lay, zero, recompute, 1, overlap=True)
            hit = self.overlaps[key] = load_rules()["EP009"](Context(self.job, probe)) is None
        return hit

    def dispatcher(self, lay: Layout, zero: int) -> str:
        """The MoE token dispatcher: the user's, else flex (DeepEP/HybridEP) when the expert group leaves the
        NVLink domain and the framework (on its Megatron-Core engine) can render it - it never sends more
        than all-to-all - else alltoall."""
        fixed = self.fixed.values.get("moe_token_dispatcher")
        if fixed is not None:
            return str(fixed)
        if (self.flex and lay.ep > 1 and crosses_domains(lay.ep, lay.etp, self.domain)
                and backend_of(self.job.framework, zero) == "megatron"):
            return "flex"
        return "alltoall"

    @property
    def memory_calls(self) -> int:
        return self.calls["memory"]

    @property
    def perf_calls(self) -> int:
        return self.calls["throughput"]

    @property
    def evaluations(self) -> int:
        """Memory and throughput estimates this search computed (what the answer reports as `evaluated`)."""
        return self.memory_calls + self.perf_calls

    def _estimate(self, kind: str, cache: dict[PlanKey, Report], key: PlanKey) -> Report:
        """The Engine's `kind` estimate of the plan `key`, once per job: counted before the call, so one that raises
        (a plan the cost model cannot time) still counts."""
        hit = cache.get(key)
        if hit is None:
            self.calls[kind] += 1
            hit = cache[key] = getattr(self.engine, kind)(self.job, self.plan(*key))
        return hit

    def memory(self, lay: Layout, zero: int, recompute: str, mbs: int) -> MemoryReport:
        key = (lay, zero, recompute, mbs)
        new = key not in self.caches.memory
        report = self._estimate("memory", self.caches.memory, key)
        if new and not report.fits:
            self._remember_miss(report)
        return report

    def check_error(self, lay: Layout, zero: int, recompute: str, mbs: int) -> str | None:
        """First error id of the structural rules, or None."""
        report = self._estimate("check", self.caches.checks, (lay, zero, recompute, mbs))
        error = next((f for f in report.findings if f.severity == "error"), None)
        if error is None:
            return None
        self.caches.first_finding.setdefault(error.id, error)
        return error.id

    def throughput(self, lay: Layout, zero: int, recompute: str, mbs: int) -> ThroughputReport:
        return self._estimate("throughput", self.caches.throughput, (lay, zero, recompute, mbs))

    def _remember_miss(self, report: MemoryReport) -> None:
        over = report.fit_bytes - report.capacity_bytes
        self.near.append((over, report.plan, report))
        if len(self.near) > 64:
            self.near.sort(key=lambda t: t[0])
            del self.near[16:]

    def push(self, key: float, level: Level, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (key, level, self.seq, payload))

    def variants(self) -> int:
        return len(self.zeros) * len(self.recomputes)

    def plans_of(self, lay: Layout) -> int:
        """How many plans (ZeRO stage x recompute x micro-batch) a layout stands for; one micro-batch when none
        divides its share of the batch (the batch rule then says why)."""
        return self.variants() * max(1, len(micro_batches(self.job, lay, self.fixed)))

    def need_range(self, lay: Layout, mbs: int) -> tuple[int, int]:
        """What is already known of the least recompute that fits at the lightest ZeRO stage: (low, high).
        Memory grows with the micro-batch, so a smaller micro-batch's need is a floor and a larger one's a
        ceiling; a non-interleaved base's need is a floor for its interleaved layouts."""
        known = self.caches.least_recompute
        low, high = 0, len(self.recomputes)
        for key in (lay, lay.base()):
            for b, need in known.get(key, {}).items():
                if b <= mbs:
                    low = max(low, need)
                elif key is lay and b > mbs:
                    high = min(high, need)
        if mbs in known.get(lay, {}):
            low = high = known[lay][mbs]
        return low, max(low, high)

    @property
    def budget(self) -> int:
        return self.budget_bytes or self.job.gpu.memory_bytes

    def memory_rule_for(self, needed: int) -> str:
        """MEM001 when even the full capacity is exceeded; MEM002 when only the headroom budget is."""
        return self.engine.memory_rule if needed > self.job.gpu.memory_bytes else HEADROOM_RULE

    def floor_fits(self, lay: Layout, zero: int, recompute: str, mbs: int) -> bool:
        """False when the first stage's memory floor alone is over capacity (no estimate needed)."""
        key = (lay.base(), zero, recompute, mbs)
        hit = self.caches.floor_fits.get(key)
        if hit is None:
            floor = self.caches.floors.get(key)
            if floor is None:
                floor = self.caches.floors[key] = first_stage_floor(
                    self.job, lay.base(), zero, recompute, mbs, self.sequence_parallel(lay), self.presets[zero],
                    reserved=not self.fixed.carried.get("expandable_segments"),
                    activation_offload=bool(self.fixed.carried.get("activation_offload")))
            hit = self.caches.floor_fits[key] = floor <= self.budget
        return hit

    def states_bound(self, lay: Layout, zero: int) -> float:
        """states_lower_bound of the layout at that ZeRO stage, once per job."""
        key = (lay, zero)
        hit = self.caches.states.get(key)
        if hit is None:
            hit = self.caches.states[key] = states_lower_bound(self.job, lay, zero, self.split, self.presets[zero][1])
        return hit

    def fits(self, lay: Layout, zero: int, recompute: str, mbs: int) -> bool:
        return (self.floor_fits(lay, zero, recompute, mbs)
                and self.memory(lay, zero, recompute, mbs).fit_bytes <= self.budget)

    def unsharded(self, lay: Layout) -> bool:
        """ZeRO shards nothing here (dense dp*cp and expert-DP of 1): the stages then differ only by what each
        convention adds (ZeRO-3's gathered layers, FSDP2 ZeRO-2's kept bf16 copy), so none is the lightest."""
        return lay.dp * lay.cp == 1 and mesh.expert_dp(self.job.num_gpus, lay) == 1

    def lightest(self, lay: Layout) -> tuple[int, ...]:
        """The ZeRO stages whose least recompute bounds every stage's: the most sharded one, or each where
        nothing is sharded."""
        return self.zeros if self.unsharded(lay) else self.zeros[-1:]

    def need_floor(self, lay: Layout, mbs: int) -> int:
        """The least recompute whose first-stage floor fits at the lightest ZeRO stage (no estimate needed)."""
        return min(next((i for i, r in enumerate(self.recomputes) if self.floor_fits(lay, zero, r, mbs)),
                        len(self.recomputes)) for zero in self.lightest(lay))

    def need(self, lay: Layout, mbs: int) -> int:
        """The least recompute index that fits at the lightest ZeRO stage. The memory floor is usually right,
        so its answer is tried first and the walk goes up from there."""
        low, high = self.need_range(lay, mbs)
        n_r = len(self.recomputes)
        i = max(low, min(high, self.need_floor(lay, mbs)))
        lightest = self.lightest(lay)
        while i < min(high, n_r) and not any(self.fits(lay, zero, self.recomputes[i], mbs) for zero in lightest):
            i += 1
        self.caches.least_recompute.setdefault(lay, {})[mbs] = i
        return i

    # -- the bounds --------------------------------------------------------------------------------

    def microbatches(self, lay: Layout, mbs: int) -> int:
        return max(1, self.job.global_batch_size // (mbs * lay.dp))

    def ideal_time(self, lay: Layout, mbs: int, ideal: float) -> float:
        """Every GPU at the cost model's best fraction of peak, stretched by the bubble (p-1)/(m*v)."""
        return ideal * (1.0 + (lay.pp - 1) / (self.microbatches(lay, mbs) * lay.vpp))

    def pp_unit(self, lay: Layout, mbs: int) -> float:
        """Exposed pipeline send/receive per stage per micro-batch without interleaving, read from the
        non-interleaved base; interleaving multiplies it by vpp (Narayanan et al. 2021)."""
        try:
            report = self.throughput(lay.base(), self.zeros[0], self.recomputes[0], mbs)
        except MeshplanError:
            return 0.0
        return report.breakdown.pp_comm_s / self.microbatches(lay, mbs)

    def _per_token(self, key: tuple, tp: int, cp: int, ep: int, etp: int, b: int, recompute: str, part: str,
                   may_overlap: bool = False) -> float:
        """Seconds per token of a single-stage reference plan (one micro-batch of b sequences per rank); with
        `may_overlap`, its EP all-to-all overlapped wherever the reference can overlap it."""
        hit = self.caches.token_time.get(key)
        if hit is not None:
            return hit
        dp_ref = mesh.derived_dp(self.law, self.job.num_gpus, tp, 1, cp, ep)
        ref = Layout(tp=tp, pp=1, cp=cp, ep=ep, etp=etp, dp=dp_ref)
        overlap = may_overlap and any(self.a2a_overlap(ref, zero, recompute) for zero in self.zeros)
        tokens = b * self.job.seq_length / cp
        alone = 0.0
        if overlap:
            # One micro-batch alone is all warm-up (its all-to-all exposed: the plain reference, key without
            # overlap), so it would over-charge a layout whose micro-batches run in the steady state; the second
            # micro-batch's increment is one micro-batch fully overlapped (perf.overlapped_a2a at a steady share of
            # 1), the least any micro-batch pays.
            alone = self._per_token((*key[:-1], False), tp, cp, ep, etp, b, recompute, part) * tokens
        plan = self.plan(ref, self.zeros[0], recompute, b, overlap=overlap)
        job_ref = self.job.model_copy(update={"global_batch_size": (2 if overlap else 1) * b * dp_ref})
        try:
            self.calls["throughput"] += 1
            x = self.engine.throughput(job_ref, plan).breakdown
            total = (x.cp_comm_s if part == "cp" else
                     x.compute_s + x.recompute_s + x.tp_comm_s + x.ep_comm_s)
            value = (max(0.0, total - alone) if alone else 0.0) / tokens if overlap else total / tokens
        except MeshplanError:
            value = 0.0
        self.caches.token_time[key] = value
        return value

    def pipeline_overlaps(self, lay: Layout) -> bool:
        """Whether EP009 lets this layout's pipeline shape overlap the EP all-to-all (Megatron-Core wants virtual
        stages when pp > 1), asked once per (pp, vpp): a layout that cannot is bounded by a reference without it."""
        if not self.a2a_open or lay.ep <= 1:
            return False
        key = (lay.pp, lay.vpp)
        hit = self.pipeline_overlap.get(key)
        if hit is None:
            shape = Layout(tp=1, pp=lay.pp, cp=1, ep=lay.ep, etp=1, dp=1, vpp=lay.vpp)
            hit = self.pipeline_overlap[key] = any(self.a2a_overlap(shape, zero, self.recomputes[0])
                                                   for zero in self.zeros)
        return hit

    def token_bound(self, lay: Layout, mbs: int, recompute: str, exact: bool = False) -> float:
        """A cheaper bound shared by many shards. The time per token of a layer only falls as a rank sees more
        tokens (bigger GEMMs run closer to peak; launch overheads and message latencies are amortised), and
        its compute does not depend on how the tokens were split by context parallelism. So two single-stage
        references bound every layout: per (tp, ep, etp, recompute) with cp = 1, and per (tp, cp) for the
        context-parallel traffic, at a power-of-two micro-batch holding at least this layout's tokens per rank
        (`exact`: the smallest such; otherwise the most any layout of the shard uses, one reference for all):
        step >= tokens per rank x (their times per token) / pp x (m + (pp-1)/vpp)."""
        return self.stretch(lay, (mbs,), *self.token_rate(lay, mbs, recompute, exact))[0]

    def token_rate(self, lay: Layout, mbs: int, recompute: str, exact: bool = False) -> tuple[int, float, float]:
        """token_bound's references: (b_tok, seconds per token, and with EP overlap the seconds per token a
        micro-batch outside the steady state adds: its all-to-all exposed). Without `exact` it is the same for every
        micro-batch of a seeded layout (work_mbs and cp_mbs hold its shard's largest), so `seed` reads it once."""
        s = self.job.seq_length
        tokens = -(-s // lay.cp) * mbs
        most = tokens / s if exact else self.work_mbs.get((lay.tp, lay.ep, lay.etp), tokens / s)
        b_tok = pow2_at_least(most)
        overlap = self.pipeline_overlaps(lay)
        per_token = self._per_token(("work", lay.tp, lay.ep, lay.etp, recompute, b_tok, overlap), lay.tp, 1, lay.ep,
                                    lay.etp, b_tok, recompute, "work", overlap)
        exposed = 0.0
        if overlap:
            alone = self._per_token(("work", lay.tp, lay.ep, lay.etp, recompute, b_tok, False), lay.tp, 1, lay.ep,
                                    lay.etp, b_tok, recompute, "work")
            exposed = max(0.0, alone - per_token)
        if lay.cp > 1:
            # exact micro-batch when asked; otherwise the largest any layout of this (tp, cp) uses (a weaker
            # bound, since the time per token only falls with more tokens, but one reference for all of them)
            b_cp = pow2_at_least(mbs if exact else self.cp_mbs.get((lay.tp, lay.cp), mbs))
            per_token += self._per_token(("cp", lay.tp, lay.cp, b_cp), lay.tp, lay.cp, 1, 1, b_cp,
                                         self.recomputes[0], "cp")
        return b_tok, per_token, exposed

    def stretch(self, lay: Layout, sizes: tuple[int, ...], b_tok: int, per_token: float,
                exposed: float = 0.0) -> list[float]:
        """token_bound from its references, per micro-batch size: this layout's tokens per rank over its stages
        and micro-batches; with EP overlap, its micro-batches outside the steady state (perf.a2a_steady_share) pay
        `exposed` more per token, as the estimate charges them."""
        s = self.job.seq_length
        per_rank = -(-s // lay.cp)
        moe = self.job.model.moe
        sync = len(moe.moe_layers) * self.engine.moe_layer_fixed_s if moe is not None else 0.0
        bounds = []
        for mbs in sizes:
            tokens = per_rank * mbs
            rate = per_token
            if exposed:
                rate += (1.0 - a2a_steady_share(self.microbatches(lay, mbs), lay.pp, lay.vpp)) * exposed
            per_stage = tokens * rate / lay.pp
            if sync:
                # The reference spreads the per-micro-batch host sync of its MoE layers over b_tok sequences;
                # this layout pays it whole on each of its micro-batches (the average stage holds 1/pp of them).
                spread = tokens / (b_tok * s)
                per_stage += sync * max(0.0, 1.0 - spread) / lay.pp
            bounds.append(per_stage * (self.microbatches(lay, mbs) + (lay.pp - 1) / lay.vpp))
        return bounds

    def pipeline_bound(self, lay: Layout, mbs: int, recompute: str, interleave: bool = False) -> float:
        """The per-token bound plus the pipeline traffic interleaving multiplies: each stage sends and receives
        vpp times per micro-batch, so step >= (C/pp + vpp*pp_unit)(m + (pp-1)/vpp)."""
        bound = self.token_bound(lay, mbs, recompute, exact=True)
        if interleave and lay.vpp > 1:
            bound += lay.vpp * self.pp_unit(lay, mbs) * (self.microbatches(lay, mbs) + (lay.pp - 1) / lay.vpp)
        return bound

    # -- the levels: each pop refines one node a little and pushes it back with a tighter key ----------

    def refine_bound(self, key: float, lay: Layout, mbs: int) -> None:
        """Level.FLOOR (seeded with the per-token bound): the least recompute the memory floor allows (none fits:
        dropped) and the per-token bound with it."""
        floor = max(self.need_range(lay, mbs)[0], self.need_floor(lay, mbs))
        if floor >= len(self.recomputes):
            self.rejected[self.engine.memory_rule] += self.variants()
            return
        if floor > 0:
            key = max(key, self.token_bound(lay, mbs, self.recomputes[floor]))
        self.push(key, Level.SHARD, (lay, mbs, floor))

    def refine_shard(self, key: float, lay: Layout, mbs: int, floor: int) -> None:
        """Level.SHARD: the pipeline bound of this exact shard, with interleaving's traffic."""
        bound = self.pipeline_bound(lay, mbs, self.recomputes[floor], interleave=True)
        self.push(max(key, bound), Level.RULES, (lay, mbs, floor))

    def apply_rules(self, key: float, lay: Layout, mbs: int, low: int) -> None:
        """Level.RULES: structural rules and the model-state lower bound, per ZeRO stage."""
        n_r = len(self.recomputes)
        alive: list[int] = []
        for zero in self.zeros:
            error = self.check_error(lay, zero, self.recomputes[0], mbs)
            if error:
                self.rejected[error] += n_r
            elif (bound := self.states_bound(lay, zero)) > self.budget:
                self.rejected[self.memory_rule_for(bound)] += n_r
            else:
                alive.append(zero)
        if alive:
            self.push(key, Level.NEED, (lay, mbs, tuple(alive), low))

    def confirm_need(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], low: int) -> None:
        """Level.NEED: the least recompute that fits at the lightest ZeRO stage, estimated; every stage needs at
        least that much. If nothing fits, nothing does at any larger micro-batch either."""
        n_r = len(self.recomputes)
        need = self.need(lay, mbs)
        if need >= n_r:
            self.rejected[self.engine.memory_rule] += n_r * len(alive)
            return
        self.rejected[self.engine.memory_rule] += need * len(alive)
        if need > low:
            key = max(key, self.pipeline_bound(lay, mbs, self.recomputes[need], interleave=True))
        self.push(key, Level.STAIRCASE, (lay, mbs, alive, need))

    def staircase(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], need: int) -> None:
        """Level.STAIRCASE: for each ZeRO stage (lightest first) the least recompute that fits; heavier recompute
        of the same stage is dominated, lighter does not fit. Memory grows as the stage drops (where ZeRO shards
        something), so the walk only moves towards more recompute: at most len(alive) + len(recomputes) estimates."""
        n_r = len(self.recomputes)
        i = need
        unordered = self.unsharded(lay)  # no stage is lighter than another: each walks from `need`
        for pos, zero in enumerate(reversed(alive)):
            if unordered:
                i = need
            while i < n_r and not self.fits(lay, zero, self.recomputes[i], mbs):
                i += 1
            if i == n_r and unordered:
                self.rejected[self.engine.memory_rule] += n_r - need
                continue
            if i == n_r:
                self.rejected[self.engine.memory_rule] += (n_r - need) * (len(alive) - pos)
                return
            self.rejected[self.engine.memory_rule] += i - need
            self.rejected[DOMINATED] += n_r - i - 1
            bound = key if i == need else self.pipeline_bound(lay, mbs, self.recomputes[i], interleave=True)
            self.push(max(key, bound), Level.TIME, (lay, mbs, zero, self.recomputes[i]))

    def time_plan(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str) -> None:
        """Level.TIME: a plan known to fit gets its predicted step time."""
        try:
            report = self.throughput(lay, zero, recompute, mbs)
        except MeshplanError as exc:
            self.untimed(exc, 1)
            return
        self.push(report.step_time_s, Level.RANK, (lay, mbs, zero, recompute, report))

    def accept(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str, report: ThroughputReport) -> None:
        """Level.RANK: nothing left in the queue can be faster; the exact plan's rules run, then it is ranked."""
        error = self.check_error(lay, zero, recompute, mbs)
        if error:
            self.rejected[error] += 1
            return
        mem = self.memory(lay, zero, recompute, mbs)
        self.found.append(Found(report.step_time_s, report.plan, mem, report))
        self.rows.add(same_numbers(report.step_time_s, mem.peak_bytes))

    def untimed(self, exc: MeshplanError, count: int) -> None:
        self.rejected[UNTIMED] += count
        if exc.reason not in self.untimed_reasons:
            self.untimed_reasons.append(exc.reason)

    # -- the loop ----------------------------------------------------------------------------------

    def seed(self, layouts: list[Layout], ideal: float) -> None:
        sized = [(lay, micro_batches(self.job, lay, self.fixed)) for lay in layouts]
        for lay, sizes in sized:
            if sizes:
                key = (lay.tp, lay.cp)
                self.cp_mbs[key] = max(self.cp_mbs.get(key, 1), sizes[-1])
                work = (lay.tp, lay.ep, lay.etp)
                self.work_mbs[work] = max(self.work_mbs.get(work, 1.0), sizes[-1] / lay.cp)
        for lay, sizes in sized:
            checkpoint()
            if (bound := self.states_bound(lay, self.zeros[-1])) > self.budget:
                # even the most sharded model states do not fit: no variant of this layout can
                self.rejected[self.memory_rule_for(bound)] += self.variants() * max(1, len(sizes))
                continue
            if not sizes:
                # No micro-batch divides this layout's share of the batch: let the batch rule say so.
                mbs = int(self.fixed.values.get("micro_batch_size", 1))  # type: ignore[call-overload]
                self.push(0.0, Level.RULES, (lay, mbs, 0))
                continue
            for mbs, key in zip(sizes, self.seed_keys(lay, sizes, ideal), strict=True):
                self.push(key, Level.FLOOR, (lay, mbs))

    def seed_keys(self, lay: Layout, sizes: tuple[int, ...], ideal: float) -> list[float]:
        """The seed key of each micro-batch: the larger of the ideal time and the per-token bound, whose
        references are the same for all of them (token_rate); once per job (its micro-batches and ideal time are
        the job's) and references."""
        rate = self.token_rate(lay, sizes[0], self.recomputes[0])
        hit = self.caches.seed_keys.get((lay, rate))
        if hit is None:
            bounds = self.stretch(lay, sizes, *rate)
            hit = self.caches.seed_keys[(lay, rate)] = [
                max(self.ideal_time(lay, mbs, ideal), bound) for mbs, bound in zip(sizes, bounds, strict=True)]
        return hit

    def wanted(self) -> bool:
        """More to rank: fewer than top_k distinct rows, or the next node could still tie the last one ranked
        (a clone with the same numbers joins its row instead of being counted as slower)."""
        if self.heap[0][0] > self.cutoff:
            return False
        if len(self.rows) < self.top_k:
            return True
        return self.heap[0][0] <= self.found[-1].time * (1.0 + TIE)

    def run(self) -> None:
        steps = {Level.FLOOR: self.refine_bound, Level.SHARD: self.refine_shard, Level.RULES: self.apply_rules,
                 Level.NEED: self.confirm_need, Level.STAIRCASE: self.staircase, Level.TIME: self.time_plan,
                 Level.RANK: self.accept}
        while self.heap and self.wanted():
            checkpoint()
            if time.perf_counter() > self.deadline or self.evaluations >= self.max_evaluations:
                self.stopped_by_budget = True
                self.best_so_far()
                break
            key, level, _, payload = heapq.heappop(self.heap)
            steps[level](key, *payload)

    def best_so_far(self) -> None:
        """Out of budget: rank the plans already timed (they fit), fastest first, without proof that nothing
        unexplored is faster."""
        timed = sorted((entry for entry in self.heap if entry[1] == Level.RANK), key=lambda e: e[0])
        self.heap = [entry for entry in self.heap if entry[1] != Level.RANK]
        heapq.heapify(self.heap)
        for index, (key, _, _, payload) in enumerate(timed):
            if len(self.rows) >= self.top_k:
                self.rejected[BUDGET] += len(timed) - index
                break
            self.accept(key, *payload)

    def covered(self, level: Level, payload: tuple) -> int:
        """How many plans (ZeRO stage x recompute) a queued node stands for."""
        if level <= Level.RULES:
            return self.variants()
        if level == Level.NEED:
            return len(payload[2]) * len(self.recomputes)
        if level == Level.STAIRCASE:
            return len(payload[2]) * (len(self.recomputes) - payload[3])
        return 1

    def drain(self, bucket: str) -> None:
        """Count what is left in the queue under `bucket`."""
        if not self.heap:
            return
        variants = self.variants()  # what every node up to Level.RULES stands for
        self.rejected[bucket] += sum(variants if level <= Level.RULES else self.covered(level, payload)
                                     for _, level, _, payload in self.heap)
        self.heap.clear()


def run_search(job: Job, fixed: Fixed, engine: Engine, top_k: int, deadline: float, warnings: list[str],
               budget_bytes: int = 0, share: BestFirstSearch | None = None,
               cutoff: float = math.inf) -> tuple[BestFirstSearch, int]:
    """Search the whole space of `job` (TP inside the NVLink domain first, across it only when nothing inside
    fits) and count every plan considered. `share`: a search of the same job whose estimates this one reuses;
    `cutoff`: no slower step time is wanted. Appends to `warnings` what the answer must say about the run."""
    search = BestFirstSearch.for_job(job, fixed, engine, top_k, deadline, budget_bytes)
    search.cutoff = cutoff
    if share is not None:
        search.caches = share.caches.shared()
    if search.caches.space is None:
        search.caches.space = enumerate_layouts(job, fixed)
    layouts, dropped = search.caches.space
    considered = 0
    # Groups dropped by a cheap law: one check names the rule, every layout in the group counts under it.
    for group in dropped:
        error = search.check_error(group.example, search.zeros[0], search.recomputes[0], 1)
        count = group.layouts * search.plans_of(group.example)
        considered += count
        search.rejected[error or group.reason] += count
    tier1 = [lay for lay in layouts if within_nvlink(job, lay)]
    tier2 = [lay for lay in layouts if not within_nvlink(job, lay)]
    for lay in layouts:
        considered += search.plans_of(lay)
    ideal = ideal_time(job, engine)
    search.seed(tier1, ideal)
    search.run()
    if not search.found and not search.stopped_by_budget and tier2:
        search.drain(SLOWER)
        search.seed(tier2, ideal)
        search.run()
        if search.found:
            warnings.append("No layout with TP inside one NVLink domain fits; the ranked layouts use TP across "
                            "domains, so every layer's TP traffic crosses the network.")
    else:
        for lay in tier2:
            search.rejected[NVLINK] += search.plans_of(lay)
    search.drain(BUDGET if search.stopped_by_budget else SLOWER)
    for reason in search.untimed_reasons[:3]:
        warnings.append(f"The throughput model could not time some layouts that pass the rules: {reason}")
    if search.stopped_by_budget:
        warnings.append(
            f"The search stopped at its budget ({search_limits().time_budget_s:g} s or "
            f"{search.max_evaluations:,} estimates, cards/search.yaml) before the queue was exhausted: the ranked "
            "layouts are the fastest found so far, not proven optimal."
        )
    return search, considered
