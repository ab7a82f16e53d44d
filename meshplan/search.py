"""recommend: search every layout the framework can express, drop what breaks a rule or does not fit, rank by time.

The space (meshplan/space.py) is every (tp, pp, vpp, cp, ep, etp, dp) over divisors of the GPU count,
times the ZeRO/FSDP stage, the recompute mode and the micro-batch size. It is searched best-first
(A*) with the real estimators, so the answer is the exact top K of the cost model without timing most
layouts. Each (layout, micro-batch) enters the queue with an optimistic step time and is refined a step
at a time, each step pushing it back with a tighter key:

1. time per token from single-stage reference plans (it only falls as a rank sees more tokens), times
   the tokens each stage handles, stretched by the pipeline bubble (p-1)/(m*v);
2. the memory floor of the first stage (model states plus in-flight activations) says which recompute
   is needed at least: if even full recompute is over capacity the node is dropped unestimated;
3. the structural rules (check_config without memory) and the model-state bound per ZeRO stage;
4. estimated memory: the least recompute that fits at the lightest ZeRO stage (if nothing fits, nothing
   fits at any larger micro-batch either), then the staircase of (stage, recompute) pairs that fit -
   heavier recompute of a fitting pair is dominated, since it only adds time;
5. the predicted step time; a plan reaching the top of the queue is ranked: nothing left can be faster.

Everything dropped is counted under the rule id that dropped it (or a SEARCH-* bucket), so
considered = ranked + rejected.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from meshplan.cancel import checkpoint
from meshplan.comm import crosses_domains
from meshplan.errors import MeshplanError
from meshplan.request import resolve
from meshplan.rulebook import backend_of
from meshplan.schema import (
    MAX_TOKENS,
    Candidate,
    CheckReport,
    Finding,
    Job,
    MemoryReport,
    MemorySummary,
    NearMiss,
    Plan,
    Recommendation,
    Request,
    ThroughputReport,
)
from meshplan.space import (
    RECOMPUTE_ORDER,
    Fixed,
    Layout,
    enumerate_layouts,
    first_stage_floor,
    knobs,
    micro_batches,
    params_split,
    search_card,
    states_lower_bound,
    within_nvlink,
    zero_ladder,
)

GIB = 1 << 30
TOKENS_PER_STEP = 1 << 22  # the default batch: ~4M tokens (request.DEFAULT_BATCH_TOKENS)

# Buckets for variants that no rule rejected but the search did not rank (ids never change meaning).
SLOWER = "SEARCH-SLOWER"  # valid or not yet checked, but its optimistic time is behind the top K
HEADROOM_RULE = "MEM002"  # cards/rules.yaml: fits, but with less than the minimum headroom
DOMINATED = "SEARCH-DOMINATED"  # the same layout fits with less recompute, which is faster
NVLINK = "SEARCH-NVLINK"  # TP beyond the NVLink domain, not searched because layouts inside it fit
BUDGET = "SEARCH-BUDGET"  # not reached before the time budget ran out
UNTIMED = "SEARCH-UNTIMED"  # passes the rules but the cost model cannot time it (its reason is a warning)
SEARCH_BUCKETS = {
    SLOWER: "not ranked: its optimistic step time (or its predicted one) is slower than the top K",
    DOMINATED: "not ranked: the same layout fits with less recompute, which is faster",
    NVLINK: "not searched: TP beyond the NVLink domain, and layouts inside the domain fit",
    BUDGET: "not reached before the search's time budget ran out",
    UNTIMED: "passes the rules, but the throughput model cannot time it (reason in the warnings)",
}


# --------------------------------------------------------------------------- the estimators it calls


@dataclass
class Engine:
    """The estimators the search calls; injected so tests can count or fake them."""

    memory: Callable[[Job, Plan], MemoryReport]
    throughput: Callable[[Job, Plan], ThroughputReport]
    check: Callable[[Job, Plan], CheckReport]  # structural rules only (no memory estimate)
    full_check: Callable[[Job, Plan], CheckReport]  # every rule, memory included
    summary: Callable[[MemoryReport], MemorySummary]
    memory_rule: str = "MEM001"
    efficiency_cap: float = 1.0  # best fraction of peak the cost model ever achieves (for the lower bound)
    peak_flops: Callable[[Job], float] | None = None
    moe_layer_fixed_s: float = 0.0  # fixed cost per MoE layer per micro-batch (kept whole in the bound)


def _pow2_at_least(x: float) -> int:
    """The smallest power of two >= x (and >= 1): the reference micro-batch of the per-token bounds."""
    return 1 << max(0, (math.ceil(x) - 1).bit_length()) if x > 1 else 1


def default_engine(framework: str) -> Engine:
    from meshplan.calibration import calibration
    from meshplan.memory import estimate_memory, memory_summary
    from meshplan.perf import estimate_throughput
    from meshplan.rules import check_config

    cal = calibration(framework)
    return Engine(
        memory=estimate_memory,
        throughput=estimate_throughput,
        check=lambda job, plan: check_config(job, plan, include_memory=False),
        full_check=check_config,
        summary=memory_summary,
        memory_rule=_memory_rule_id(),
        efficiency_cap=max(cal.gemm_peak_fraction, cal.attention_peak_fraction),
        peak_flops=lambda job: max(job.gpu.bf16_flops, (job.gpu.fp8_flops or 0.0) * cal.fp8_gemm_relative_efficiency
                                   if job.precision == "fp8" else 0.0),
        moe_layer_fixed_s=cal.moe_layer_overhead_s,
    )


def min_headroom_fraction() -> float:
    """The free share of memory a recommended layout keeps: MEM002's threshold, so rules and search agree."""
    from meshplan.rulebook import rule_specs

    return float(rule_specs()[HEADROOM_RULE].params["min_headroom_fraction"])


def _memory_rule_id() -> str:
    """The rules card's 'does not fit' error id (the memory rule with severity error)."""
    from meshplan.rulebook import memory_rules, rule_specs

    errors = sorted(r for r in memory_rules() if rule_specs()[r].severity == "error")
    return errors[0] if errors else "MEM001"


# --------------------------------------------------------------------------- search state


@dataclass
class _Found:
    time: float
    plan: Plan
    memory: MemoryReport
    throughput: ThroughputReport


@dataclass
class _Search:
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
    domain: int = 8  # GPUs per NVLink domain (a node, or a rack for GB200 NVL72)
    budget_bytes: int = 0  # memory a ranked plan may use: capacity less the MEM002 headroom (0 = capacity)
    rejected: Counter = field(default_factory=Counter)
    found: list[_Found] = field(default_factory=list)
    near: list[tuple[int, Plan, MemoryReport]] = field(default_factory=list)
    # Per layout and micro-batch: the least recompute (index) that fits at the lightest ZeRO stage; len(recomputes)
    # when nothing does. It only grows with the micro-batch, and interleaving only adds to its base's.
    needs: dict[Layout, dict[int, int]] = field(default_factory=dict)
    mem_cache: dict[tuple, MemoryReport] = field(default_factory=dict)
    perf_cache: dict[tuple, ThroughputReport] = field(default_factory=dict)
    check_cache: dict[tuple, CheckReport] = field(default_factory=dict)
    floor_cache: dict[tuple, bool] = field(default_factory=dict)
    examples: dict[str, Finding] = field(default_factory=dict)  # first finding of each rule that rejected a plan
    token_time: dict[tuple, float] = field(default_factory=dict)
    cp_mbs: dict[tuple[int, int], int] = field(default_factory=dict)  # largest micro-batch per (tp, cp)
    work_mbs: dict[tuple[int, int, int], float] = field(default_factory=dict)  # most sequences per rank per shard
    untimed_reasons: list[str] = field(default_factory=list)
    memory_calls: int = 0
    perf_calls: int = 0
    check_calls: int = 0
    stopped_by_budget: bool = False
    max_evaluations: int = 1 << 62
    heap: list = field(default_factory=list)
    seq: int = 0

    # -- the estimators, cached per plan -----------------------------------------------------------

    def plan(self, lay: Layout, zero: int, recompute: str, mbs: int) -> Plan:
        sp = self.sp if "sequence_parallel" in self.fixed else self.sp and lay.tp > 1
        return lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs,  # type: ignore[arg-type]
                        sequence_parallel=sp, cp_comm_type=self.cp_comm,
                        moe_token_dispatcher=self.dispatcher(lay, zero))

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

    def memory(self, lay: Layout, zero: int, recompute: str, mbs: int) -> MemoryReport:
        key = (lay, zero, recompute, mbs)
        hit = self.mem_cache.get(key)
        if hit is None:
            self.memory_calls += 1
            hit = self.mem_cache[key] = self.engine.memory(self.job, self.plan(lay, zero, recompute, mbs))
            if not hit.fits:
                self._remember_miss(hit)
        return hit

    def check_error(self, lay: Layout, zero: int, recompute: str, mbs: int) -> str | None:
        """First error id of the structural rules, or None."""
        key = (lay, zero, recompute, mbs)
        report = self.check_cache.get(key)
        if report is None:
            self.check_calls += 1
            report = self.check_cache[key] = self.engine.check(self.job, self.plan(lay, zero, recompute, mbs))
        error = next((f for f in report.findings if f.severity == "error"), None)
        if error is None:
            return None
        self.examples.setdefault(error.id, error)
        return error.id

    def throughput(self, lay: Layout, zero: int, recompute: str, mbs: int) -> ThroughputReport:
        key = (lay, zero, recompute, mbs)
        hit = self.perf_cache.get(key)
        if hit is None:
            self.perf_calls += 1
            hit = self.perf_cache[key] = self.engine.throughput(self.job, self.plan(lay, zero, recompute, mbs))
        return hit

    def _remember_miss(self, report: MemoryReport) -> None:
        over = report.peak_bytes - report.capacity_bytes
        self.near.append((over, report.plan, report))
        if len(self.near) > 64:
            self.near.sort(key=lambda t: t[0])
            del self.near[16:]

    def push(self, key: float, level: int, payload: tuple) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (key, level, self.seq, payload))

    def variants(self) -> int:
        return len(self.zeros) * len(self.recomputes)

    def need_range(self, lay: Layout, mbs: int) -> tuple[int, int]:
        """What is already known of the least recompute that fits at the lightest ZeRO stage: (low, high).
        Memory grows with the micro-batch, so a smaller micro-batch's need is a floor and a larger one's a
        ceiling; a non-interleaved base's need is a floor for its interleaved layouts."""
        low, high = 0, len(self.recomputes)
        for key in (lay, lay.base()):
            for b, need in self.needs.get(key, {}).items():
                if b <= mbs:
                    low = max(low, need)
                elif key is lay and b > mbs:
                    high = min(high, need)
        if mbs in self.needs.get(lay, {}):
            low = high = self.needs[lay][mbs]
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
        hit = self.floor_cache.get(key)
        if hit is None:
            sp = self.sp if "sequence_parallel" in self.fixed else self.sp and lay.tp > 1
            floor = first_stage_floor(self.job, lay.base(), zero, recompute, mbs, sp)
            hit = self.floor_cache[key] = floor <= self.budget
        return hit

    def fits(self, lay: Layout, zero: int, recompute: str, mbs: int) -> bool:
        return (self.floor_fits(lay, zero, recompute, mbs)
                and self.memory(lay, zero, recompute, mbs).peak_bytes <= self.budget)

    def need_floor(self, lay: Layout, mbs: int) -> int:
        """The least recompute whose first-stage floor fits at the lightest ZeRO stage (no estimate needed)."""
        lightest = self.zeros[-1]
        return next((i for i, r in enumerate(self.recomputes) if self.floor_fits(lay, lightest, r, mbs)),
                    len(self.recomputes))

    def need(self, lay: Layout, mbs: int) -> int:
        """The least recompute index that fits at the lightest ZeRO stage. The memory floor is usually right,
        so its answer is tried first and the walk goes up from there."""
        low, high = self.need_range(lay, mbs)
        n_r = len(self.recomputes)
        i = max(low, min(high, self.need_floor(lay, mbs)))
        lightest = self.zeros[-1]
        while i < min(high, n_r) and not self.fits(lay, lightest, self.recomputes[i], mbs):
            i += 1
        self.needs.setdefault(lay, {})[mbs] = i
        return i

    def hopeless(self, lay: Layout, mbs: int) -> bool:
        return self.need_range(lay, mbs)[0] >= len(self.recomputes)

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

    def _per_token(self, key: tuple, tp: int, cp: int, ep: int, etp: int, b: int, recompute: str, part: str) -> float:
        """Seconds per token of a single-stage reference plan (one micro-batch of b sequences per rank)."""
        hit = self.token_time.get(key)
        if hit is not None:
            return hit
        own_ep = ep if self.law == "kempnerforge" else 1
        dp_ref = self.job.num_gpus // (tp * cp * own_ep)
        ref = Layout(tp=tp, pp=1, cp=cp, ep=ep, etp=etp, dp=dp_ref)
        job_ref = self.job.model_copy(update={"global_batch_size": b * dp_ref})
        try:
            self.perf_calls += 1
            x = self.engine.throughput(job_ref, self.plan(ref, self.zeros[0], recompute, b)).breakdown
            total = (x.cp_comm_s if part == "cp" else
                     x.compute_s + x.recompute_s + x.tp_comm_s + x.ep_comm_s)
            value = total / (b * self.job.seq_length / cp)
        except MeshplanError:
            value = 0.0
        self.token_time[key] = value
        return value

    def token_bound(self, lay: Layout, mbs: int, recompute: str, exact: bool = False) -> float:
        """A cheaper bound shared by many shards. The time per token of a layer only falls as a rank sees more
        tokens (bigger GEMMs run closer to peak; launch overheads and message latencies are amortised), and
        its compute does not depend on how the tokens were split by context parallelism. So two single-stage
        references bound every layout: per (tp, ep, etp, recompute) with cp = 1, and per (tp, cp) for the
        context-parallel traffic, at a power-of-two micro-batch holding at least this layout's tokens per rank
        (`exact`: the smallest such; otherwise the most any layout of the shard uses, one reference for all):
        step >= tokens per rank x (their times per token) / pp x (m + (pp-1)/vpp)."""
        s = self.job.seq_length
        tokens = -(-s // lay.cp) * mbs
        most = tokens / s if exact else self.work_mbs.get((lay.tp, lay.ep, lay.etp), tokens / s)
        b_tok = _pow2_at_least(most)
        per_token = self._per_token(("work", lay.tp, lay.ep, lay.etp, recompute, b_tok), lay.tp, 1, lay.ep, lay.etp,
                                    b_tok, recompute, "work")
        if lay.cp > 1:
            # exact micro-batch when asked; otherwise the largest any layout of this (tp, cp) uses (a weaker
            # bound, since the time per token only falls with more tokens, but one reference for all of them)
            b_cp = _pow2_at_least(mbs if exact else self.cp_mbs.get((lay.tp, lay.cp), mbs))
            per_token += self._per_token(("cp", lay.tp, lay.cp, b_cp), lay.tp, lay.cp, 1, 1, b_cp,
                                         self.recomputes[0], "cp")
        per_stage = tokens * per_token / lay.pp
        moe = self.job.model.moe
        if moe is not None and self.engine.moe_layer_fixed_s:
            # The reference spreads the fixed per-micro-batch cost of its MoE layers over b_tok sequences;
            # this layout pays it whole on each of its micro-batches (the average stage holds 1/pp of them).
            spread = tokens / (b_tok * s)
            per_stage += len(moe.moe_layers) * self.engine.moe_layer_fixed_s * max(0.0, 1.0 - spread) / lay.pp
        return per_stage * (self.microbatches(lay, mbs) + (lay.pp - 1) / lay.vpp)

    def pipeline_bound(self, lay: Layout, mbs: int, recompute: str, interleave: bool = False) -> float:
        """The per-token bound plus the pipeline traffic interleaving multiplies: each stage sends and receives
        vpp times per micro-batch, so step >= (C/pp + vpp*pp_unit)(m + (pp-1)/vpp)."""
        bound = self.token_bound(lay, mbs, recompute, exact=True)
        if interleave and lay.vpp > 1:
            bound += lay.vpp * self.pp_unit(lay, mbs) * (self.microbatches(lay, mbs) + (lay.pp - 1) / lay.vpp)
        return bound

    # -- the levels: each pop refines one node a little and pushes it back with a tighter key ----------
    #
    # seeded with the per-token bound -> 1 the recompute the memory floor needs -> 7 this shard's exact bound with
    # interleaving -> 2 rules and the model-state bound per ZeRO stage -> 3 the least recompute that really
    # fits -> 4 the staircase of (ZeRO stage, recompute) pairs that fit -> 5 predicted step time -> 6 ranked.

    def refine_bound(self, key: float, lay: Layout, mbs: int) -> None:
        """Level 1 (seeded with the per-token bound): the least recompute the memory floor allows (none fits:
        dropped) and the per-token bound with it."""
        floor = max(self.need_range(lay, mbs)[0], self.need_floor(lay, mbs))
        if floor >= len(self.recomputes):
            self.rejected[self.engine.memory_rule] += self.variants()
            return
        if floor > 0:
            key = max(key, self.token_bound(lay, mbs, self.recomputes[floor]))
        self.push(key, 7, (lay, mbs, floor))

    def refine_shard(self, key: float, lay: Layout, mbs: int, floor: int) -> None:
        """Level 7 (between 1 and 2): the pipeline bound of this exact shard, with interleaving's traffic."""
        bound = self.pipeline_bound(lay, mbs, self.recomputes[floor], interleave=True)
        self.push(max(key, bound), 2, (lay, mbs, floor))

    def apply_rules(self, key: float, lay: Layout, mbs: int, low: int) -> None:
        """Level 2: structural rules and the model-state lower bound, per ZeRO stage."""
        n_r = len(self.recomputes)
        alive: list[int] = []
        for zero in self.zeros:
            error = self.check_error(lay, zero, self.recomputes[0], mbs)
            if error:
                self.rejected[error] += n_r
            elif (bound := states_lower_bound(self.job, lay, zero, self.split)) > self.budget:
                self.rejected[self.memory_rule_for(bound)] += n_r
            else:
                alive.append(zero)
        if alive:
            self.push(key, 3, (lay, mbs, tuple(alive), low))

    def confirm_need(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], low: int) -> None:
        """Level 3: the least recompute that fits at the lightest ZeRO stage, estimated; every stage needs at
        least that much. If nothing fits, nothing does at any larger micro-batch either."""
        n_r = len(self.recomputes)
        need = self.need(lay, mbs)
        if need >= n_r:
            self.rejected[self.engine.memory_rule] += n_r * len(alive)
            return
        self.rejected[self.engine.memory_rule] += need * len(alive)
        if need > low:
            key = max(key, self.pipeline_bound(lay, mbs, self.recomputes[need], interleave=True))
        self.push(key, 4, (lay, mbs, alive, need))

    def staircase(self, key: float, lay: Layout, mbs: int, alive: tuple[int, ...], need: int) -> None:
        """Level 4: for each ZeRO stage (lightest first) the least recompute that fits; heavier recompute of the
        same stage is dominated, lighter does not fit. Memory grows as the stage drops, so the walk only moves
        towards more recompute: at most len(alive) + len(recomputes) estimates."""
        n_r = len(self.recomputes)
        i = need
        for pos, zero in enumerate(reversed(alive)):
            while i < n_r and not self.fits(lay, zero, self.recomputes[i], mbs):
                i += 1
            if i == n_r:
                self.rejected[self.engine.memory_rule] += (n_r - need) * (len(alive) - pos)
                return
            self.rejected[self.engine.memory_rule] += i - need
            self.rejected[DOMINATED] += n_r - i - 1
            bound = key if i == need else self.pipeline_bound(lay, mbs, self.recomputes[i], interleave=True)
            self.push(max(key, bound), 5, (lay, mbs, zero, self.recomputes[i]))

    def time_plan(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str) -> None:
        """Level 5: a plan known to fit gets its predicted step time."""
        try:
            report = self.throughput(lay, zero, recompute, mbs)
        except MeshplanError as exc:
            self.untimed(exc, 1)
            return
        self.push(report.step_time_s, 6, (lay, mbs, zero, recompute, report))

    def accept(self, key: float, lay: Layout, mbs: int, zero: int, recompute: str, report: ThroughputReport) -> None:
        """Level 6: nothing left in the queue can be faster; the exact plan's rules run, then it is ranked."""
        error = self.check_error(lay, zero, recompute, mbs)
        if error:
            self.rejected[error] += 1
            return
        mem = self.memory(lay, zero, recompute, mbs)
        self.found.append(_Found(report.step_time_s, report.plan, mem, report))

    def untimed(self, exc: MeshplanError, count: int) -> None:
        self.rejected[UNTIMED] += count
        if exc.reason not in self.untimed_reasons:
            self.untimed_reasons.append(exc.reason)

    # -- the loop ----------------------------------------------------------------------------------

    def seed(self, layouts: list[Layout], ideal: float) -> None:
        for lay in layouts:
            sizes = micro_batches(self.job, lay, self.fixed)
            if sizes:
                key = (lay.tp, lay.cp)
                self.cp_mbs[key] = max(self.cp_mbs.get(key, 1), sizes[-1])
                work = (lay.tp, lay.ep, lay.etp)
                self.work_mbs[work] = max(self.work_mbs.get(work, 1.0), sizes[-1] / lay.cp)
        for lay in layouts:
            checkpoint()
            sizes = micro_batches(self.job, lay, self.fixed)
            if (bound := states_lower_bound(self.job, lay, self.zeros[-1], self.split)) > self.budget:
                # even the most sharded model states do not fit: no variant of this layout can
                self.rejected[self.memory_rule_for(bound)] += self.variants() * max(1, len(sizes))
                continue
            if not sizes:
                # No micro-batch divides this layout's share of the batch: let the batch rule say so.
                mbs = int(self.fixed.values.get("micro_batch_size", 1))  # type: ignore[call-overload]
                self.push(0.0, 2, (lay, mbs, 0))
                continue
            for mbs in sizes:
                key = max(self.ideal_time(lay, mbs, ideal), self.token_bound(lay, mbs, self.recomputes[0]))
                self.push(key, 1, (lay, mbs))

    def run(self) -> None:
        steps = {1: self.refine_bound, 7: self.refine_shard, 2: self.apply_rules, 3: self.confirm_need,
                 4: self.staircase, 5: self.time_plan, 6: self.accept}
        while self.heap and len(self.found) < self.top_k:
            checkpoint()
            if time.perf_counter() > self.deadline or self.memory_calls + self.perf_calls >= self.max_evaluations:
                self.stopped_by_budget = True
                self.best_so_far()
                break
            key, level, _, payload = heapq.heappop(self.heap)
            steps[level](key, *payload)

    def best_so_far(self) -> None:
        """Out of budget: rank the plans already timed (they fit), fastest first, without proof that nothing
        unexplored is faster."""
        timed = sorted((entry for entry in self.heap if entry[1] == 6), key=lambda e: e[0])
        self.heap = [entry for entry in self.heap if entry[1] != 6]
        heapq.heapify(self.heap)
        for index, (key, _, _, payload) in enumerate(timed):
            if len(self.found) >= self.top_k:
                self.rejected[BUDGET] += len(timed) - index
                break
            self.accept(key, *payload)

    def covered(self, level: int, payload: tuple) -> int:
        """How many plans (ZeRO stage x recompute) a queued node stands for."""
        if level <= 2 or level == 7:
            return self.variants()
        if level == 3:
            return len(payload[2]) * len(self.recomputes)
        if level == 4:
            return len(payload[2]) * (len(self.recomputes) - payload[3])
        return 1

    def drain(self, bucket: str) -> None:
        """Count what is left in the queue under `bucket`."""
        for _, level, _, payload in self.heap:
            self.rejected[bucket] += self.covered(level, payload)
        self.heap.clear()


# --------------------------------------------------------------------------- the job


def _search_job(req: Request) -> tuple[Job, list[str]]:
    """The job the search compares layouts on: one global batch for every layout."""
    if req.num_gpus is None:
        fixed = [req.tp, req.pp, req.cp, req.dp]
        if all(v is not None for v in fixed):
            req = req.model_copy(update={"num_gpus": req.tp * req.pp * req.cp * req.dp})  # type: ignore[operator]
        else:
            raise MeshplanError(
                "recommend needs the GPU count to search over.",
                fix="Pass num_gpus (e.g. --num-gpus 64), or fix every degree (tp, pp, cp, dp).",
            )
    notes: list[str] = []
    job, _ = resolve(req.model_copy(update={"tp": None, "pp": None, "cp": None, "ep": None, "etp": None,
                                            "dp": None, "vpp": None, "first_stage_layers": None,
                                            "last_stage_layers": None}))
    if req.global_batch_size is None:
        world = job.num_gpus
        sequences = max(1, TOKENS_PER_STEP // req.seq_length)
        gbs = min(-(-sequences // world) * world, max(world, MAX_TOKENS))
        job = job.model_copy(update={"global_batch_size": gbs, "notes": []})
        notes.append(
            f"global_batch_size not given: {gbs} sequences ({gbs * req.seq_length / 1e6:.1f}M tokens), about 4M "
            f"tokens rounded up to a multiple of the {world} GPUs so that every data-parallel size divides it."
        )
    else:
        job = job.model_copy(update={"notes": []})
    return job, notes


def _ideal_time(job: Job, engine: Engine) -> float:
    """Step time at the cost model's best achievable fraction of peak on every GPU, with no communication."""
    from meshplan.flops import model_flops_per_step

    peak = engine.peak_flops(job) if engine.peak_flops else job.gpu.bf16_flops
    flops = model_flops_per_step(job.model, job.seq_length, job.global_batch_size)
    return flops / (job.num_gpus * peak * engine.efficiency_cap)


# --------------------------------------------------------------------------- entry point


def recommend(req: Request, top_k: int = 5, engine: Engine | None = None) -> Recommendation:
    """The fastest layouts that fit, ranked by predicted step time, with what was rejected and why."""
    if top_k < 1:
        raise MeshplanError(f"top_k must be at least 1, got {top_k}.", fix="Use top_k=5.")
    started = time.perf_counter()
    job, notes = _search_job(req)
    engine = engine or default_engine(job.framework)
    fixed = Fixed.from_request(req)
    limits = search_card().limits
    warnings: list[str] = []
    if job.num_gpus > limits.largest_cluster_gpus:
        warnings.append(
            f"{job.num_gpus:,} GPUs is beyond any cluster built (about {limits.largest_cluster_gpus:,} at most, "
            f"cards/search.yaml); the space is bounded by the model's shape (tp <= heads, pp <= layers, "
            f"cp <= seq_length/2, ep <= experts), and the search by {limits.absurd_max_evaluations:,} estimates or "
            f"{limits.time_budget_s:g} s, not by the GPU count."
        )
    headroom = min_headroom_fraction()
    budget = int(job.gpu.memory_bytes * (1.0 - headroom))
    search, considered = _run(job, fixed, engine, top_k, started + limits.time_budget_s, warnings, budget)
    if not search.found and time.perf_counter() < started + limits.time_budget_s:
        # Nothing keeps the headroom: rank what fits at all, and say how thin it is.
        search, considered = _run(job, fixed, engine, top_k, started + limits.time_budget_s, warnings)
        if search.found:
            warnings.append(
                f"No layout keeps {headroom:.0%} of the {job.gpu.memory_bytes / GIB:.1f} GiB free ({HEADROOM_RULE}); "
                "the ranked layouts fit with less, so fragmentation or longer samples may push them over. "
                "More GPUs, or a GPU with more memory, gives room."
            )
    else:
        notes = [*notes, f"Ranked layouts keep at least {headroom:.0%} of GPU memory free (the {HEADROOM_RULE} "
                 f"threshold of cards/rules.yaml); layouts that fit with less are counted under {HEADROOM_RULE} "
                 "when their memory floor or estimate is within capacity, and used only when nothing else fits."]
    rec = _answer(job, req, fixed, engine, search, considered, top_k, notes, warnings)
    if not rec.candidates:
        _explain_impossible(rec, job, fixed, engine, search, started + limits.time_budget_s,
                            req.global_batch_size is not None)
    return rec


def _new_search(job: Job, fixed: Fixed, engine: Engine, top_k: int, deadline: float,
                budget_bytes: int = 0) -> _Search:
    from meshplan.cards import framework_card

    kn = knobs(job.framework)
    zeros = zero_ladder(job.framework)
    if "zero_stage" in fixed:
        zeros = tuple(z for z in (int(fixed.values["zero_stage"]),))  # type: ignore[call-overload]
    recomputes = tuple(r for r in RECOMPUTE_ORDER if r in kn.recompute)
    if "recompute" in fixed:
        recomputes = (str(fixed.values["recompute"]),)
    card = framework_card(job.framework)
    sp = card.defaults.sequence_parallel_when_tp
    if "sequence_parallel" in fixed:
        sp = bool(fixed.values["sequence_parallel"])
    cp_comm = str(fixed.values.get("cp_comm_type", "p2p"))
    limits = search_card().limits
    cap = limits.max_evaluations if job.num_gpus <= limits.largest_cluster_gpus else limits.absurd_max_evaluations
    gpu = job.gpu
    domain = gpu.nvlink_domain if gpu.nvlink_domain > gpu.gpus_per_node else job.gpus_per_node
    return _Search(job=job, fixed=fixed, engine=engine, top_k=top_k, deadline=deadline, zeros=zeros,
                   recomputes=recomputes, sp=sp, cp_comm=cp_comm, split=params_split(job),
                   law=card.world_size_law, flex=kn.flex_dispatcher and job.model.moe is not None,
                   domain=max(1, domain), max_evaluations=cap, budget_bytes=budget_bytes)


def _run(job: Job, fixed: Fixed, engine: Engine, top_k: int, deadline: float,
         warnings: list[str], budget_bytes: int = 0) -> tuple[_Search, int]:
    search = _new_search(job, fixed, engine, top_k, deadline, budget_bytes)
    layouts, dropped = enumerate_layouts(job, fixed)
    considered = 0
    variants = search.variants()
    # Groups dropped by a cheap law: one check names the rule, every layout in the group counts under it.
    for group in dropped:
        sizes = max(1, len(micro_batches(job, group.example, fixed)))
        error = search.check_error(group.example, search.zeros[0], search.recomputes[0], 1)
        count = group.layouts * variants * sizes
        considered += count
        search.rejected[error or group.reason] += count
    tier1 = [lay for lay in layouts if within_nvlink(job, lay)]
    tier2 = [lay for lay in layouts if not within_nvlink(job, lay)]
    for lay in layouts:
        considered += variants * max(1, len(micro_batches(job, lay, fixed)))
    ideal = _ideal_time(job, engine)
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
            search.rejected[NVLINK] += variants * max(1, len(micro_batches(job, lay, fixed)))
    search.drain(BUDGET if search.stopped_by_budget else SLOWER)
    for reason in search.untimed_reasons[:3]:
        warnings.append(f"The throughput model could not time some layouts that pass the rules: {reason}")
    if search.stopped_by_budget:
        limits = search_card().limits
        warnings.append(
            f"The search stopped at its budget ({limits.time_budget_s:g} s or {search.max_evaluations:,} estimates, "
            "cards/search.yaml) before the queue was exhausted: the ranked layouts are the fastest found so far, "
            "not proven optimal."
        )
    return search, considered


# --------------------------------------------------------------------------- the answer


def _why(rank: int, found: _Found, best: _Found | None) -> str:
    t = found.throughput
    b = t.breakdown
    parts = {"compute": b.compute_s, "TP communication": b.tp_comm_s, "CP communication": b.cp_comm_s,
             "EP all-to-all": b.ep_comm_s, "DP/FSDP communication": b.dp_comm_s, "PP transfers": b.pp_comm_s,
             "pipeline bubble": b.bubble_s, "recompute": b.recompute_s, "optimizer and other": b.other_s}
    costs = sorted(((v, k) for k, v in parts.items() if k != "compute" and v > 0), reverse=True)[:2]
    cost_text = ", ".join(f"{k} {v / t.step_time_s:.0%}" for v, k in costs) or "no exposed overhead"
    p = found.plan
    dispatcher = ", flex MoE dispatcher (DeepEP/HybridEP)" if p.moe_token_dispatcher == "flex" else ""
    head = (f"{p.short()}, micro-batch {p.micro_batch_size}, ZeRO {p.zero_stage}, recompute {p.recompute}"
            f"{dispatcher}: "
            f"{t.step_time_s:.3f} s per step, {t.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {t.mfu:.1%}; "
            f"compute {b.compute_s / t.step_time_s:.0%} of the step, then {cost_text}; "
            f"peak memory {found.memory.peak_bytes / GIB:.1f} of {found.memory.capacity_bytes / GIB:.1f} GiB.")
    if best is None:
        return "Fastest predicted layout that passes every rule and fits. " + head
    slower = found.time / best.time - 1
    return f"{slower:.1%} slower than #1. " + head


def _decision_table(job: Job, fixed: Fixed, engine: Engine, best: _Found | None, deadline: float) -> str:
    """What the decision tables suggest, and why the recommendation agrees or differs, in numbers: the table's
    layout is searched with the same estimators (its knobs left open) and compared with the pick."""
    from meshplan.strategies import suggest

    try:
        table = suggest(job)
    except MeshplanError as exc:
        return f"The decision tables give no suggestion for this job ({exc.reason})."
    sp = table.plan
    text = f"Decision table {table.table} row {table.row_id!r} ({table.row}) suggests {sp.short()}"
    text += (" after fitting it to this job (" + " ".join(table.adjustments) + ")." if table.adjustments else ".")
    if best is None:
        return text
    bp = best.plan
    degrees = ("tp", "pp", "vpp", "cp", "ep", "etp")
    if all(getattr(bp, d) == getattr(sp, d) for d in degrees):
        return text + " The search agrees: its best layout has the same degrees."
    pinned = Fixed({**{k: v for k, v in fixed.values.items() if k not in (*degrees, "dp")},
                    **{d: getattr(sp, d) for d in degrees}})
    probe = _new_search(job, pinned, engine, 1, deadline)
    layouts, _ = enumerate_layouts(job, pinned)
    probe.seed([lay for lay in layouts], _ideal_time(job, engine))
    probe.run()
    if not probe.found:
        reasons = ", ".join(f"{k} x{v}" for k, v in probe.rejected.most_common(3)) or "no layout of that shape"
        return text + (f" The search picks {bp.short()} instead: the table's layout has no variant that passes "
                       f"the rules and fits this job ({reasons}).")
    theirs = min(probe.found, key=lambda f: f.time)
    gap = theirs.time / best.time - 1
    verdict = ("within 15% of the pick: the table and the search agree in practice" if gap <= 0.15
               else "the search's pick is clearly faster under the cost model")
    return text + (f" The search picks {bp.short()}; the table's layout at its best ({theirs.plan.short()}, "
                   f"micro-batch {theirs.plan.micro_batch_size}, ZeRO {theirs.plan.zero_stage}, recompute "
                   f"{theirs.plan.recompute}) fits and is predicted at {theirs.throughput.tokens_per_s_per_gpu:,.0f} "
                   f"tokens/s/GPU, {gap:.1%} slower: {verdict}.")


def _answer(job: Job, req: Request, fixed: Fixed, engine: Engine, search: _Search, considered: int, top_k: int,
            notes: list[str], warnings: list[str]) -> Recommendation:
    search.found.sort(key=lambda f: f.time)
    ranked = search.found[:top_k]
    search.rejected[SLOWER] += len(search.found[top_k:])
    candidates = []
    for i, found in enumerate(ranked):
        full = engine.full_check(job, found.plan)
        why = _why(i + 1, found, ranked[0] if i else None)
        notes_here = [f.message for f in full.findings if f.severity == "warning"]
        if notes_here:
            why += " Warnings: " + " ".join(notes_here)
        candidates.append(Candidate(rank=i + 1, plan=found.plan, memory=engine.summary(found.memory),
                                    throughput=found.throughput, rationale=why))
    best = ranked[0] if ranked else None
    table_text = _decision_table(job, fixed, engine, best, search.deadline)
    open_fields = [f for f in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "zero_stage", "micro_batch_size",
                               "recompute") if f not in fixed]
    rationale = ""
    if best is not None:
        rationale = (
            f"Searched {considered:,} layouts ({', '.join(open_fields) or 'nothing'} open; "
            f"{', '.join(f'{k}={v}' for k, v in fixed.values.items()) or 'nothing fixed'}), "
            f"evaluated {search.memory_calls} memory and {search.perf_calls} throughput estimates, "
            f"and ranked the fastest {len(ranked)} that pass every rule and fit. " + candidates[0].rationale
        )
    assumptions = [
        *notes,
        "Space: every tp, pp, cp (and ep, etp for MoE) over divisors of the GPU count under the framework's "
        "world-size law; vpp over divisors of the layers per stage; an uneven first/last stage when pp does not "
        "divide the layers; ZeRO stages that have a distinct byte preset in cards/memory.yaml; recompute modes "
        "of cards/search.yaml; micro-batch sizes dividing each data-parallel rank's share of the batch.",
        "Sequence parallelism follows the framework default (on with tp > 1) and CP uses the p2p ring unless "
        "given; TP (and ETP) stay inside one NVLink domain unless nothing else fits.",
        "Exact best-first search over the same estimators: a plan is ranked only when no unexplored one can be "
        "faster. Bounds: time per token from single-stage reference plans (it only falls with more tokens per "
        "rank) x tokens / pp x (m + (pp-1)/vpp); memory floors from the first stage's states and activations. "
        "Assumes more recompute or a higher ZeRO stage never makes a plan faster or bigger, and that memory grows "
        "with the micro-batch and with interleaving.",
        "Ranked layouts are distinct choices: the same layout with more recompute than it needs is not listed.",
        "Rejected counts: rule ids of cards/rules.yaml (the memory error for plans that do not fit, including "
        "those dropped by a memory floor) and search buckets: "
        + "; ".join(f"{k}: {v}" for k, v in SEARCH_BUCKETS.items()) + ".",
    ]
    if fixed.values:
        assumptions.append("Fixed by the request: " + ", ".join(f"{k}={v}" for k, v in fixed.values.items()) + ".")
    return Recommendation(
        model=job.model.name, framework=job.framework, num_gpus=job.num_gpus, candidates=candidates,
        considered=considered, rejected={k: v for k, v in sorted(search.rejected.items()) if v},
        decision_table=table_text,
        rationale=rationale, warnings=warnings, assumptions=assumptions,
        evaluated=search.memory_calls + search.perf_calls, global_batch_size=job.global_batch_size,
    )


# --------------------------------------------------------------------------- impossible jobs


def _explain_impossible(rec: Recommendation, job: Job, fixed: Fixed, engine: Engine, search: _Search,
                        deadline: float, user_gbs: bool) -> None:
    """No layout fits: the closest misses and the smallest GPU count where one fits."""
    limits = search_card().limits
    if search.stopped_by_budget:
        rec.rationale = (
            "The search ran out of its budget before any layout was proven to fit and timed; this is not proof that "
            "none fits. Fix more fields (tp, pp, micro_batch_size, ...) to shrink the space and ask again."
        )
        return
    if not search.near:
        _probe_closest(job, fixed, search, limits.closest_layouts)
    misses = sorted(search.near, key=lambda t: t[0])
    seen: set[str] = set()
    closest: list[NearMiss] = []
    for over, plan, mem in misses:
        key = plan.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        closest.append(NearMiss(
            plan=plan, memory=engine.summary(mem), over_bytes=over,
            rationale=f"{plan.short()}, micro-batch {plan.micro_batch_size}, ZeRO {plan.zero_stage}, recompute "
                      f"{plan.recompute}: stage {mem.peak_stage} needs {mem.peak_bytes / GIB:.1f} GiB of "
                      f"{mem.capacity_bytes / GIB:.1f} GiB ({over / GIB:.1f} GiB, "
                      f"{over / mem.capacity_bytes:.0%} over).",
        ))
        if len(closest) >= limits.closest_layouts:
            break
    rec.closest = closest
    rec.evaluated = search.memory_calls + search.perf_calls
    memory_rejects = rec.rejected.get(engine.memory_rule, 0)
    rule_rejects = {k: v for k, v in rec.rejected.items() if k != engine.memory_rule and k not in SEARCH_BUCKETS}
    if not memory_rejects and rule_rejects:
        top = max(rule_rejects.items(), key=lambda kv: kv[1])
        example = search.examples.get(top[0])
        said = f" For example: {example.message} Fix: {example.fix}" if example else ""
        rec.rationale = (f"No layout passes the framework's rules for this request: most were rejected by {top[0]} "
                         f"({top[1]:,} of {rec.considered:,}).{said} Leave more fields open, or run `meshplan "
                         "check` on a layout for every finding.")
        return
    smallest = _smallest_gpu_count(job, fixed, engine, limits.min_gpus_search_limit, deadline, user_gbs)
    rec.min_gpus = smallest
    head = (f"Impossible on {job.num_gpus:,} {job.gpu.name}: no layout fits even with every memory-saving knob "
            f"{'left open' if not fixed.values else 'not fixed by the request'} (highest ZeRO/FSDP stage, full "
            "recompute, micro-batch 1, every TP/PP/CP/EP split).")
    if closest:
        head += " Closest: " + " ".join(c.rationale for c in closest)
    if smallest is not None:
        head += (f" The smallest GPU count where a layout fits is {smallest:,} (searched over multiples of the "
                 f"{job.gpus_per_node}-GPU node); run `meshplan recommend` with --num-gpus {smallest}.")
    else:
        head += (f" No GPU count up to {limits.min_gpus_search_limit:,} fits with these fixed fields"
                 + (f" ({', '.join(f'{k}={v}' for k, v in fixed.values.items())}); leave them open." if fixed.values
                    else "."))
    rec.rationale = head


def _probe_closest(job: Job, fixed: Fixed, search: _Search, count: int) -> None:
    """Nothing was estimated (every layout failed a cheap bound): estimate the lightest variant of the layouts
    with the smallest model-state bound, so the answer can say how far over they are."""
    layouts, _ = enumerate_layouts(job, fixed)
    zero, recompute = search.zeros[-1], search.recomputes[-1]
    ranked = sorted(layouts, key=lambda lay: states_lower_bound(job, lay, zero, search.split))
    for lay in ranked[: 4 * count]:
        sizes = micro_batches(job, lay, fixed)
        if sizes and not search.check_error(lay, zero, recompute, sizes[0]):
            search.memory(lay, zero, recompute, sizes[0])
        if len(search.near) >= count:
            break


def _fits_somewhere(job: Job, fixed: Fixed, engine: Engine, deadline: float) -> bool:
    """Does any layout of this job fit? Lightest variants only, most promising (smallest lower bound) first."""
    search = _new_search(job, fixed, engine, 1, deadline)
    layouts, _ = enumerate_layouts(job, fixed)
    zero, recompute = search.zeros[-1], search.recomputes[-1]
    capacity = job.gpu.memory_bytes
    scored = sorted((states_lower_bound(job, lay, zero, search.split), lay) for lay in layouts)
    for bound, lay in scored:
        checkpoint()
        if bound > capacity or time.perf_counter() > deadline:
            return False
        sizes = micro_batches(job, lay, fixed)
        if not sizes:
            continue
        if search.check_error(lay, zero, recompute, sizes[0]):
            continue
        if search.memory(lay, zero, recompute, sizes[0]).fits:
            return True
    return False


def _smallest_gpu_count(job: Job, fixed: Fixed, engine: Engine, limit: int, deadline: float,
                        user_gbs: bool) -> int | None:
    """Doubling, then bisection over multiples of the node size: the smallest count at which a layout fits."""
    node = job.gpus_per_node
    def job_at(world: int) -> Job:
        gbs = job.global_batch_size
        if not user_gbs:
            sequences = max(1, TOKENS_PER_STEP // job.seq_length)
            gbs = -(-sequences // world) * world
        return job.model_copy(update={"num_gpus": world, "global_batch_size": gbs})

    low = job.num_gpus
    high = max(node, -(-low // node) * node)
    if high == low:
        high *= 2
    while high <= limit:
        if time.perf_counter() > deadline:
            return None
        if _fits_somewhere(job_at(high), fixed, engine, deadline):
            break
        low, high = high, high * 2
    else:
        return None
    # smallest multiple of the node size in (low, high] that fits
    lo_n, hi_n = low // node, high // node
    while hi_n - lo_n > 1 and time.perf_counter() <= deadline:
        mid = (lo_n + hi_n) // 2
        if _fits_somewhere(job_at(mid * node), fixed, engine, deadline):
            hi_n = mid
        else:
            lo_n = mid
    return hi_n * node
