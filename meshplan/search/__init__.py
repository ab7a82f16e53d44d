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

One headroom policy: a layout fits when its peak is at most capacity x (1 - headroom), headroom being the request's
or MEM002's min_headroom_fraction (cards/rules.yaml). The ranking, the answer when nothing keeps it, the warning about
a much faster layout it excludes, and the smallest-GPU-count scan (`minimum_gpus`) all use that one threshold.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from meshplan import mesh
from meshplan.cancel import checkpoint
from meshplan.errors import MeshplanError
from meshplan.mesh import crosses_domains
from meshplan.request import default_batch_note, default_global_batch, resolve
from meshplan.rulebook import backend_of, lcm
from meshplan.schema import (
    Candidate,
    CheckReport,
    Finding,
    Job,
    MemoryReport,
    MemorySummary,
    MinimumGpus,
    NearMiss,
    Plan,
    Recommendation,
    Request,
    ThroughputReport,
)
from meshplan.search.policy import (
    BUDGET,
    DOMINATED,
    GIB,
    HEADROOM_RULE,
    NVLINK,
    SAME,
    SEARCH_BUCKETS,
    SLOWER,
    TIE,
    UNTIMED,
    headroom_for,
    headroom_that_ranks,
    memory_budget,
    memory_rule_id,
    min_headroom_fraction,
    same_numbers,
    search_comparison,
    search_limits,
    slower_by,
)
from meshplan.space import (
    RECOMPUTE_ORDER,
    Fixed,
    Layout,
    divisors,
    enumerate_layouts,
    first_stage_floor,
    knobs,
    micro_batches,
    params_split,
    states_lower_bound,
    within_nvlink,
    zero_ladder,
)

__all__ = ["FOLDED_KNOBS", "SEARCH_BUCKETS", "Engine", "default_engine", "headroom_for", "headroom_that_ranks",
           "memory_budget", "min_headroom_fraction", "minimum_gpus", "recommend", "slower_by"]


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
        memory_rule=memory_rule_id(),
        efficiency_cap=max(cal.gemm_peak_fraction, cal.attention_peak_fraction),
        peak_flops=lambda job: max(job.gpu.bf16_flops, (job.gpu.fp8_flops or 0.0) * cal.fp8_gemm_relative_efficiency
                                   if job.precision == "fp8" else 0.0),
        moe_layer_fixed_s=cal.moe_layer_overhead_s,
    )


def _percent(share: float) -> str:
    """0.1 -> '10%', 0.032 -> '3.2%': a headroom as a percentage, without rounding it away."""
    return f"{share * 100:.3g}%"


def _headroom_text(headroom: float, default: bool) -> str:
    """Where the headroom came from, for the answer's text."""
    if default:
        return (f"headroom {headroom:g}: {HEADROOM_RULE}'s min_headroom_fraction in cards/rules.yaml; pass headroom "
                "to change it")
    return f"headroom {headroom:g}, from the request"


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
    rows: set[tuple[float, int]] = field(default_factory=set)  # distinct (step time, peak) among found: the top K
    cutoff: float = math.inf  # nothing slower than this step time is wanted (a probe for much faster layouts)
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
        dp_ref = mesh.derived_dp(self.law, self.job.num_gpus, tp, 1, cp, ep)
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
        self.rows.add(same_numbers(report.step_time_s, mem.peak_bytes))

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

    def wanted(self) -> bool:
        """More to rank: fewer than top_k distinct rows, or the next node could still tie the last one ranked
        (a clone with the same numbers joins its row instead of being counted as slower)."""
        if self.heap[0][0] > self.cutoff:
            return False
        if len(self.rows) < self.top_k:
            return True
        return self.heap[0][0] <= self.found[-1].time * (1.0 + TIE)

    def share_caches(self, other: _Search) -> None:
        """Reuse another search's estimates of the same job (they do not depend on the memory budget)."""
        self.mem_cache, self.perf_cache, self.check_cache = other.mem_cache, other.perf_cache, other.check_cache
        self.token_time, self.examples = other.token_time, other.examples

    def run(self) -> None:
        steps = {1: self.refine_bound, 7: self.refine_shard, 2: self.apply_rules, 3: self.confirm_need,
                 4: self.staircase, 5: self.time_plan, 6: self.accept}
        while self.heap and self.wanted():
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
            if len(self.rows) >= self.top_k:
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
        job = _job_at(job, job.num_gpus, user_gbs=False)
        notes.append(default_batch_note(job.global_batch_size, job.seq_length,
                                        f"the {job.num_gpus:,} GPUs, so that every data-parallel size divides it"))
    else:
        job = job.model_copy(update={"notes": []})
    return job, notes


def _job_at(job: Job, world: int, user_gbs: bool) -> Job:
    """The job on `world` GPUs; a default batch is re-derived for that count (micro-batch 1 x world ranks)."""
    gbs = job.global_batch_size if user_gbs else default_global_batch(job.seq_length, 1, world)
    return job.model_copy(update={"num_gpus": world, "global_batch_size": gbs, "notes": []})


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
    limits = search_limits()
    warnings: list[str] = []
    if job.num_gpus > limits.largest_cluster_gpus:
        warnings.append(
            f"{job.num_gpus:,} GPUs is beyond any cluster built (about {limits.largest_cluster_gpus:,} at most, "
            f"cards/search.yaml); the space is bounded by the model's shape (tp <= heads, pp <= layers, "
            f"cp <= seq_length/2, ep <= experts), and the search by {limits.absurd_max_evaluations:,} estimates or "
            f"{limits.time_budget_s:g} s, not by the GPU count."
        )
    headroom = headroom_for(req)
    budget = memory_budget(job, headroom)
    deadline = started + limits.time_budget_s
    search, considered = _run(job, fixed, engine, top_k, deadline, warnings, budget)
    thin = _fastest_below_headroom(job, fixed, engine, search, deadline)
    notes = [*notes, _headroom_assumption(job, headroom, req.headroom is None)]
    rec = _answer(job, fixed, engine, search, considered, top_k, notes, warnings, headroom, req.headroom is None)
    if thin is not None:
        _report_below_headroom(rec, job, engine, thin, headroom)
    if not rec.candidates:
        _explain_impossible(rec, job, fixed, engine, search, headroom, req.headroom is None,
                            req.global_batch_size is not None)
    return rec


def _headroom_assumption(job: Job, headroom: float, default: bool) -> str:
    cap = job.gpu.memory_bytes
    return (f"Headroom: a layout counts as fitting when its peak memory is at most capacity x (1 - {headroom:g}) = "
            f"{memory_budget(job, headroom) / GIB:.1f} of {cap / GIB:.1f} GiB ({_headroom_text(headroom, default)}). "
            "The ranking, the answer when nothing keeps it and the smallest-GPU-count scan use this one threshold; "
            f"layouts that fit only with less are counted under {HEADROOM_RULE} (or {memory_rule_id()} when over "
            "capacity) and never ranked silently: the answer names the fastest of them when it matters.")


def _fastest_below_headroom(job: Job, fixed: Fixed, engine: Engine, search: _Search, deadline: float) -> _Found | None:
    """The fastest layout that fits the GPU at all, when it does not keep the headroom: a top-1 search at full
    capacity reusing the ranked search's estimates. When layouts are ranked, only one at least `below_headroom_gain`
    faster than the best matters, so the probe stops at that step time. None when there is no such layout."""
    if search.budget >= job.gpu.memory_bytes or search.stopped_by_budget or time.perf_counter() > deadline:
        return None
    cutoff = math.inf
    if search.found:
        cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain)
    probe, _ = _run(job, fixed, engine, 1, deadline, [], job.gpu.memory_bytes, share=search, cutoff=cutoff)
    if not probe.found or probe.stopped_by_budget:
        return None
    fastest = min(probe.found, key=lambda f: f.time)
    return fastest if fastest.memory.peak_bytes > search.budget else None


def _report_below_headroom(rec: Recommendation, job: Job, engine: Engine, thin: _Found, headroom: float) -> None:
    """Name a layout the headroom excludes when nothing is ranked, or when it is much faster than the best ranked
    one: its free memory, its speed, and the headroom value that would rank it."""
    cap = job.gpu.memory_bytes
    free = cap - thin.memory.peak_bytes
    share = free / cap
    would_rank = headroom_that_ranks(thin.memory)
    tput = thin.throughput.tokens_per_s_per_gpu
    note = (f"Not ranked: it leaves {free / GIB:.1f} GiB ({share:.1%}) free, under the {headroom:g} headroom; "
            f"headroom={would_rank:g} (--headroom {would_rank:g}) would rank it.")
    candidate = _candidate(job, engine, thin, 1, None, note=note)
    if not rec.candidates:
        rec.best_below_headroom = candidate
        return
    best = rec.candidates[0].throughput.tokens_per_s_per_gpu
    gap = slower_by(best, tput)
    if gap < search_comparison().below_headroom_gain:
        return
    rec.best_below_headroom = candidate
    rec.warnings.append(
        f"{thin.plan.short()} (micro-batch {thin.plan.micro_batch_size}, ZeRO {thin.plan.zero_stage}, recompute "
        f"{thin.plan.recompute}) is predicted at {tput:,.0f} tokens/s/GPU but leaves only {free / GIB:.1f} GiB "
        f"({share:.1%}) free, under the {headroom:g} headroom, so it is not ranked: the best ranked layout, "
        f"{rec.candidates[0].plan.short()} at {best:,.0f} tokens/s/GPU, is {gap:.1%} slower. Pass "
        f"headroom={would_rank:g} (--headroom {would_rank:g}) to rank it if the job can run that close to capacity."
    )


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
    limits = search_limits()
    cap = limits.max_evaluations if job.num_gpus <= limits.largest_cluster_gpus else limits.absurd_max_evaluations
    domain = mesh.fast_domain(job.gpu, job.gpus_per_node)
    return _Search(job=job, fixed=fixed, engine=engine, top_k=top_k, deadline=deadline, zeros=zeros,
                   recomputes=recomputes, sp=sp, cp_comm=cp_comm, split=params_split(job),
                   law=card.world_size_law, flex=card.flex_dispatcher and job.model.moe is not None,
                   domain=domain, max_evaluations=cap, budget_bytes=budget_bytes)


def _run(job: Job, fixed: Fixed, engine: Engine, top_k: int, deadline: float, warnings: list[str],
         budget_bytes: int = 0, share: _Search | None = None, cutoff: float = math.inf) -> tuple[_Search, int]:
    search = _new_search(job, fixed, engine, top_k, deadline, budget_bytes)
    search.cutoff = cutoff
    if share is not None:
        search.share_caches(share)
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
        limits = search_limits()
        warnings.append(
            f"The search stopped at its budget ({limits.time_budget_s:g} s or {search.max_evaluations:,} estimates, "
            "cards/search.yaml) before the queue was exhausted: the ranked layouts are the fastest found so far, "
            "not proven optimal."
        )
    return search, considered


# --------------------------------------------------------------------------- the answer


_FASTEST = "Fastest predicted layout that passes every rule and fits. "


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
        return _FASTEST + head
    slower = slower_by(t.tokens_per_s_per_gpu, best.throughput.tokens_per_s_per_gpu)
    return f"{slower:.1%} slower than #1 (fewer tokens/s/GPU). " + head


def _candidate(job: Job, engine: Engine, found: _Found, rank: int, best: _Found | None,
               same: list[_Found] | None = None, note: str = "") -> Candidate:
    """One row of the answer: the plan, its reports, why it ranks there (or `note`: why it is not ranked), and the
    clones folded into it."""
    why = _why(rank, found, best)
    if note:
        why = why.removeprefix(_FASTEST) + " " + note
    if same:
        why += (" Same predicted step time and peak memory, folded into this row: "
                + "; ".join(_differs(found.plan, other.plan) for other in same) + ".")
    notes_here = [f.message for f in engine.full_check(job, found.plan).findings if f.severity == "warning"]
    if notes_here:
        why += " Warnings: " + " ".join(notes_here)
    return Candidate(rank=rank, plan=found.plan, memory=engine.summary(found.memory), throughput=found.throughput,
                     rationale=why, equivalents=[other.plan for other in same or ()])


FOLDED_KNOBS = ("zero_stage", "recompute", "sequence_parallel", "moe_token_dispatcher")
"""Knobs beyond the degrees and the micro-batch that a folded equivalent may differ in; named when they do."""


def _differs(plan: Plan, other: Plan) -> str:
    """`other` in words, with the knobs that differ from `plan` beyond its degrees."""
    text = f"also {other.short()}, micro-batch {other.micro_batch_size}"
    for name in FOLDED_KNOBS:
        if getattr(other, name) != getattr(plan, name):
            text += f", {name} {getattr(other, name)}"
    return text


def _rows(found: list[_Found]) -> list[list[_Found]]:
    """Plans grouped by their predicted numbers, fastest group first; in a group the simplest plan (least CP,
    then least interleaving, then the smallest micro-batch) stands for the others."""
    groups: dict[tuple[float, int], list[_Found]] = {}
    for f in sorted(found, key=lambda f: f.time):
        groups.setdefault(same_numbers(f.time, f.memory.peak_bytes), []).append(f)
    return [sorted(g, key=lambda f: (f.plan.cp, f.plan.vpp, f.plan.micro_batch_size, f.plan.pp, f.plan.tp))
            for g in groups.values()]


def _decision_table(job: Job, fixed: Fixed, engine: Engine, best: _Found | None, deadline: float,
                    budget: int) -> str:
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
    probe = _new_search(job, pinned, engine, 1, deadline, budget)
    layouts, _ = enumerate_layouts(job, pinned)
    probe.seed([lay for lay in layouts], _ideal_time(job, engine))
    probe.run()
    if not probe.found:
        reasons = ", ".join(f"{k} x{v}" for k, v in probe.rejected.most_common(3)) or "no layout of that shape"
        return text + (f" The search picks {bp.short()} instead: the table's layout has no variant that passes "
                       f"the rules and fits this job ({reasons}).")
    theirs = min(probe.found, key=lambda f: f.time)
    mine, its = best.throughput.tokens_per_s_per_gpu, theirs.throughput.tokens_per_s_per_gpu
    gap = slower_by(its, mine)
    tolerance = search_comparison().agreement_tolerance
    verdict = (f"within {tolerance:.0%} of the pick: the table and the search agree in practice" if gap <= tolerance
               else "the search's pick is clearly faster under the cost model")
    return text + (f" The search picks {bp.short()}; the table's layout at its best ({theirs.plan.short()}, "
                   f"micro-batch {theirs.plan.micro_batch_size}, ZeRO {theirs.plan.zero_stage}, recompute "
                   f"{theirs.plan.recompute}) fits and is predicted at {its:,.0f} tokens/s/GPU against the pick's "
                   f"{mine:,.0f}, {gap:.1%} slower: {verdict}.")


def _answer(job: Job, fixed: Fixed, engine: Engine, search: _Search, considered: int, top_k: int,
            notes: list[str], warnings: list[str], headroom: float, default_headroom: bool) -> Recommendation:
    rows = _rows(search.found)
    ranked = rows[:top_k]
    search.rejected[SLOWER] += sum(len(row) for row in rows[top_k:])
    search.rejected[SAME] += sum(len(row) - 1 for row in ranked)
    best = ranked[0][0] if ranked else None
    candidates = [_candidate(job, engine, row[0], i + 1, best if i else None, row[1:]) for i, row in enumerate(ranked)]
    table_text = _decision_table(job, fixed, engine, best, search.deadline, search.budget)
    open_fields = [f for f in ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "zero_stage", "micro_batch_size",
                               "recompute") if f not in fixed]
    rationale = ""
    if best is not None:
        rationale = (
            f"Searched {considered:,} layouts ({', '.join(open_fields) or 'nothing'} open; "
            f"{', '.join(f'{k}={v}' for k, v in fixed.values.items()) or 'nothing fixed'}), "
            f"evaluated {search.memory_calls} memory and {search.perf_calls} throughput estimates, "
            f"and ranked the fastest {len(ranked)} distinct layouts that pass every rule and keep "
            f"{_percent(headroom)} of GPU memory free ({_headroom_text(headroom, default_headroom)}). "
            + candidates[0].rationale
        )
    assumptions = [
        *notes,
        "Space: every tp, pp, cp (and ep, etp for MoE) over divisors of the GPU count under the framework's "
        "world-size law; vpp over divisors of the layers per stage; an uneven first/last stage when pp does not "
        "divide the layers; ZeRO stages that have a distinct byte preset in cards/memory.yaml; recompute modes "
        "of the framework card's search section; micro-batch sizes dividing each data-parallel rank's share of the "
        "batch.",
        "Sequence parallelism follows the framework default (on with tp > 1) and CP uses the p2p ring unless "
        "given; TP (and ETP) stay inside one NVLink domain unless nothing else fits.",
        "Exact best-first search over the same estimators: a plan is ranked only when no unexplored one can be "
        "faster. Bounds: time per token from single-stage reference plans (it only falls with more tokens per "
        "rank) x tokens / pp x (m + (pp-1)/vpp); memory floors from the first stage's states and activations. "
        "Assumes more recompute or a higher ZeRO stage never makes a plan faster or bigger, and that memory grows "
        "with the micro-batch and with interleaving.",
        "Ranked layouts are distinct choices: the same layout with more recompute than it needs is not listed, "
        "and layouts with the same predicted step time and peak memory (e.g. a factor moved between CP and the "
        "micro-batch) share one row (its equivalents).",
        "\"X% slower\" is 1 - (its tokens/s/GPU) / (the other's): the share of throughput lost, at the same batch.",
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
        headroom=headroom,
    )


# --------------------------------------------------------------------------- impossible jobs


def _explain_impossible(rec: Recommendation, job: Job, fixed: Fixed, engine: Engine, search: _Search,
                        headroom: float, default_headroom: bool, user_gbs: bool) -> None:
    """Nothing is ranked. Either a layout fits with less than the headroom (`rec.best_below_headroom`, named with the
    headroom that would rank it) or none fits at all (the closest misses); then the smallest GPU count where a layout
    keeps the headroom, from the same scan `minimum_gpus` runs."""
    limits = search_limits()
    thin = rec.best_below_headroom
    if search.stopped_by_budget and thin is None:
        rec.rationale = (
            "The search ran out of its budget before any layout was proven to fit and timed; this is not proof that "
            "none fits. Fix more fields (tp, pp, micro_batch_size, ...) to shrink the space and ask again."
        )
        return
    cap = job.gpu.memory_bytes
    if thin is not None:
        head = (f"No layout keeps {_percent(headroom)} of the {cap / GIB:.1f} GiB free on {job.num_gpus:,} "
                f"{job.gpu.name} ({_headroom_text(headroom, default_headroom)}), so none is ranked. The fastest that "
                f"fits with less: {thin.rationale}")
    else:
        if not search.near:
            _probe_closest(job, fixed, search, limits.closest_layouts)
        rec.closest = _closest(search, engine, limits.closest_layouts)
        rec.evaluated = search.memory_calls + search.perf_calls
        memory_rules = (engine.memory_rule, HEADROOM_RULE)
        memory_rejects = sum(rec.rejected.get(rule, 0) for rule in memory_rules)
        rule_rejects = {k: v for k, v in rec.rejected.items() if k not in memory_rules and k not in SEARCH_BUCKETS}
        if not memory_rejects and rule_rejects:
            top = max(rule_rejects.items(), key=lambda kv: kv[1])
            example = search.examples.get(top[0])
            said = f" For example: {example.message} Fix: {example.fix}" if example else ""
            rec.rationale = (f"No layout passes the framework's rules for this request: most were rejected by "
                             f"{top[0]} ({top[1]:,} of {rec.considered:,}).{said} Leave more fields open, or run "
                             "`meshplan check` on a layout for every finding.")
            return
        head = (f"Impossible on {job.num_gpus:,} {job.gpu.name}: no layout fits even with every memory-saving knob "
                f"{'left open' if not fixed.values else 'not fixed by the request'} (highest ZeRO/FSDP stage, full "
                "recompute, micro-batch 1, every TP/PP/CP/EP split).")
        if rec.closest:
            head += " Closest: " + " ".join(c.rationale for c in rec.closest)
    # One call, one time bound: the scan gets what is left of the search's (cards/search.yaml time_budget_s).
    scan = _scan_minimum(job, fixed, engine, headroom, user_gbs, limits.min_gpus_search_limit, search.deadline)
    rec.min_gpus = scan.num_gpus
    rec.rationale = head + " " + scan.sentence(headroom, fixed)


def _closest(search: _Search, engine: Engine, count: int) -> list[NearMiss]:
    """The distinct plans that missed by the least, with how far over capacity they are."""
    seen: set[str] = set()
    closest: list[NearMiss] = []
    for over, plan, mem in sorted(search.near, key=lambda t: t[0]):
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
        if len(closest) >= count:
            break
    return closest


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


# --------------------------------------------------------------------------- the smallest GPU count


def _fits_somewhere(job: Job, fixed: Fixed, engine: Engine, deadline: float, budget: int) -> bool | None:
    """Does any layout of this job pass the rules and peak within `budget`? Only the lightest variant of each layout
    is estimated (more ZeRO sharding and recompute and a smaller micro-batch never add memory), most promising
    layouts (smallest model-state bound) first. None: the deadline passed before an answer."""
    search = _new_search(job, fixed, engine, 1, deadline, budget)
    layouts, _ = enumerate_layouts(job, fixed)
    recompute = search.recomputes[-1]
    lightest = search.zeros[-1]
    scored = sorted((states_lower_bound(job, lay, lightest, search.split), lay) for lay in layouts)
    for bound, lay in scored:
        checkpoint()
        if bound > budget:
            return False
        if time.perf_counter() > deadline:
            return None
        sizes = micro_batches(job, lay, fixed)
        if not sizes or not search.floor_fits(lay, lightest, recompute, sizes[0]):
            continue
        # A rule may forbid the most sharded stage (e.g. FSDP with pipelines) but allow a lighter one.
        for zero in reversed(search.zeros):
            if search.check_error(lay, zero, recompute, sizes[0]):
                continue
            if search.fits(lay, zero, recompute, sizes[0]):  # the memory floor first, then the estimate
                return True
            break
    return False


def _count_unit(job: Job, fixed: Fixed) -> int:
    """The smallest world size the fixed degrees allow: pp*lcm(tp*cp*dp, ep*etp) (cards/rules.yaml WS002; the open
    degrees at 1), or the plain product where expert parallelism takes ranks of its own (KempnerForge)."""
    from meshplan.cards import framework_card

    def v(name: str) -> int:
        return int(fixed.values.get(name, 1))  # type: ignore[call-overload]

    return mesh.smallest_world(framework_card(job.framework).world_size_law,
                               v("tp"), v("pp"), v("cp"), v("dp"), v("ep"), v("etp"))


def _gpu_counts(job: Job, fixed: Fixed, start: int, limit: int) -> tuple[Iterator[int], str]:
    """GPU counts from `start` to `limit` in increasing order: the divisors of one node below it, then the multiples
    of the node (of lcm(node, the fixed degrees' minimum world size) when some are fixed). Every count is checked:
    fit is not monotone in the count, since a layout's degrees must divide it."""
    node = job.gpus_per_node
    unit = _count_unit(job, fixed)
    if all(name in fixed for name in ("tp", "pp", "cp", "dp")):  # the degrees fix the world size itself
        only = [unit] if start <= unit <= limit else []
        return iter(only), f"only {unit:,} (tp, pp, cp and dp are all fixed)"
    step = lcm(node, unit)
    small = [d for d in divisors(node) if start <= d < node and d % unit == 0]
    text = ", ".join(f"{c:,}" for c in small) + (", then " if small else "")
    text += f"every multiple of {step:,}"
    text += (f" (lcm of the {node}-GPU node and the fixed degrees' smallest world size {unit:,})" if step != node
             else f" (the {node}-GPU node)")

    def counts() -> Iterator[int]:
        yield from (c for c in small if c <= limit)
        c = max(step, -(-start // step) * step)
        while c <= limit:
            yield c
            c += step

    return counts(), text


def _states_floor(job: Job, zeros: tuple[int, ...], budget: int) -> int:
    """No count below this can hold the model states within `budget`: every layout puts at least (its bytes per
    parameter x the dense parameters + its unsharded bytes x the expert parameters) / GPUs on some GPU (a floor of
    space.states_lower_bound), at the lightest ZeRO stage allowed."""
    from meshplan.memory_states import bytes_per_param, convention

    dense, routed = params_split(job)
    need = min(bytes_per_param(convention(job.framework, z)[2], 1.0) * dense
               + bytes_per_param(convention(job.framework, z)[2], math.inf) * routed for z in zeros)
    return max(1, math.ceil(need / max(1, budget)))


@dataclass
class _Scan:
    """What the smallest-GPU-count scan found, and where and why it stopped."""

    num_gpus: int | None
    first: int
    last: int
    checked: int
    stepping: str
    stopped_by: str  # found | max_gpus | time | rules
    time_bound_s: float
    floor: int = 1  # no smaller count can hold the model states
    limit: int = 0
    rule: str = ""  # stopped_by == rules: the rule that rejects the fixed fields at every count, in words

    def sentence(self, headroom: float, fixed: Fixed) -> str:
        keep = _keeps(headroom)
        if self.num_gpus is not None:
            return (f"The smallest GPU count where a layout {keep} is {self.num_gpus:,} (counts scanned in increasing "
                    f"order from {self.first:,}: {self.stepping}); run `meshplan recommend` with "
                    f"--num-gpus {self.num_gpus}.")
        fixed_text = ", ".join(f"{k}={v}" for k, v in fixed.values.items())
        if self.stopped_by == "rules":
            return f"No GPU count can help: {self.rule}"
        if self.stopped_by == "time":
            return (f"The scan for the smallest GPU count where a layout {keep} stopped at its {self.time_bound_s:g} s "
                    f"bound after {self.checked:,} counts from {self.first:,} to {self.last:,} ({self.stepping}) "
                    f"without finding one; this is not proof that none fits above {self.last:,}.")
        if self.checked:
            text = (f"No GPU count from {self.first:,} to {self.last:,} ({self.stepping}) has a layout that {keep}")
        else:
            text = (f"No GPU count up to {self.limit:,} can hold the model: its states alone need at least "
                    f"{self.floor:,} GPUs for a layout that {keep}, and the counts allowed are {self.stepping}")
        return text + (f" with these fixed fields ({fixed_text}); leave them open." if fixed_text else ".")


def _keeps(headroom: float) -> str:
    return f"keeps {_percent(headroom)} of GPU memory free" if headroom else "fits"


_PREFILTERED_BY = {"tp-heads": ("tp",), "cp-seq": ("cp",),
                   "pp-layers": ("pp", "vpp", "first_stage_layers", "last_stage_layers")}


def _rules_forbid(job: Job, fixed: Fixed, engine: Engine) -> str:
    """Why the fixed fields have no layout at any GPU count, in words ("" when some count could have one): a fixed
    degree that breaks a shape law (heads, layers, sequence length; enumerate_layouts prefilters these whatever the
    count) or a fixed ep that does not divide the experts."""
    search = _new_search(job, fixed, engine, 1, math.inf)
    examples = []
    moe = job.model.moe
    ep = int(fixed.values.get("ep", 1))  # type: ignore[call-overload]
    if ep > 1 and (moe is None or moe.num_experts % ep):
        degrees = {d: int(fixed.values.get(d, 1)) for d in ("tp", "pp", "cp")}  # type: ignore[call-overload]
        examples.append(Layout(**degrees, ep=ep, etp=1, dp=max(1, job.num_gpus // math.prod(degrees.values()))))
    layouts, dropped = enumerate_layouts(job, fixed)
    if not layouts:
        examples += [g.example for g in dropped if any(n in fixed for n in _PREFILTERED_BY.get(g.reason, ()))]
    for example in examples:
        error = search.check_error(example, search.zeros[0], search.recomputes[0], 1)
        if error:
            finding = search.examples[error]
            return f"every layout with the fixed fields breaks {error}: {finding.message} Fix: {finding.fix}"
    return ""


def _scan_minimum(job: Job, fixed: Fixed, engine: Engine, headroom: float, user_gbs: bool, limit: int,
                  deadline: float | None = None) -> _Scan:
    """The smallest GPU count at which a layout of `job` keeps `headroom`, scanning counts in increasing order from
    the first that could hold the model states, within the card's time bound (or the caller's, if sooner)."""
    limits = search_limits()
    bound = limits.min_gpus_time_budget_s
    started = time.perf_counter()
    deadline = min(started + bound, deadline) if deadline is not None else started + bound
    budget = memory_budget(job, headroom)
    zeros = _new_search(job, fixed, engine, 1, deadline, budget).zeros
    floor = _states_floor(job, zeros, budget)
    counts, stepping = _gpu_counts(job, fixed, floor, limit)
    first = last = 0
    checked = 0
    for world in counts:
        if time.perf_counter() > deadline:
            return _Scan(None, first, last, checked, stepping, "time", bound, floor, limit)
        at = _job_at(job, world, user_gbs)
        if not checked and (reason := _rules_forbid(at, fixed, engine)):
            return _Scan(None, world, world, 1, stepping, "rules", bound, floor, limit, reason)
        fits = _fits_somewhere(at, fixed, engine, deadline, budget)
        if fits is None:
            return _Scan(None, first, last, checked, stepping, "time", bound, floor, limit)
        first = first or world
        last = world
        checked += 1
        if fits:
            return _Scan(world, first, last, checked, stepping, "found", bound, floor, limit)
    return _Scan(None, first, last, checked, stepping, "max_gpus", bound, floor, limit)


def minimum_gpus(req: Request, max_gpus: int | None = None, engine: Engine | None = None) -> MinimumGpus:
    """The smallest GPU count at which some layout passes the rules and keeps the headroom, with recommend's best
    layout there. Every field the request leaves open stays open; a default batch is re-derived at each count."""
    from meshplan.hardware import get_gpu
    from meshplan.schema import MAX_GPUS

    if req.num_gpus is not None:
        raise MeshplanError(
            f"minimum_gpus finds the GPU count, so num_gpus cannot be given (got {req.num_gpus}).",
            fix="Leave num_gpus out; bound the scan with max_gpus.",
        )
    limits = search_limits()
    limit = limits.min_gpus_search_limit if max_gpus is None else max_gpus
    if not 1 <= limit <= MAX_GPUS:
        raise MeshplanError(f"max_gpus must be between 1 and {MAX_GPUS:,}, got {limit}.",
                            fix=f"Use max_gpus={limits.min_gpus_search_limit} (the default).")
    headroom = headroom_for(req)
    node = req.gpus_per_node or get_gpu(req.gpu).gpus_per_node
    job, _ = _search_job(req.model_copy(update={"num_gpus": node}))
    engine = engine or default_engine(job.framework)
    fixed = Fixed.from_request(req)
    user_gbs = req.global_batch_size is not None
    scan = _scan_minimum(job, fixed, engine, headroom, user_gbs, limit)
    candidate, gbs = None, None
    rationale = scan.sentence(headroom, fixed)
    if scan.num_gpus is not None:
        rec = recommend(req.model_copy(update={"num_gpus": scan.num_gpus}), top_k=1, engine=engine)
        gbs = rec.global_batch_size
        if rec.candidates:
            candidate = rec.candidates[0]
            rationale = (f"{scan.num_gpus:,} {job.gpu.name} is the smallest GPU count where a layout passes the rules "
                         f"and {_keeps(headroom)} (counts scanned in increasing order from {scan.first:,}: "
                         f"{scan.stepping}). Best layout there: {candidate.rationale}")
        else:
            rationale += f" (recommend at {scan.num_gpus:,} GPUs ranked nothing: {rec.rationale})"
    assumptions = [
        _headroom_assumption(job, headroom, req.headroom is None),
        f"Counts scanned in increasing order: {scan.stepping}, from {scan.floor:,} (no smaller count can hold "
        f"the model states within the headroom) up to {limit:,} GPUs or {limits.min_gpus_time_budget_s:g} s "
        "(cards/search.yaml). Every count is checked, never bisected: fit is not monotone in the GPU count, since "
        "each layout's degrees must divide it.",
        "A count fits when the lightest variant (most ZeRO sharding the rules allow, full recompute, the smallest "
        "micro-batch) of some layout passes the structural rules and its estimated peak is within the headroom.",
        ("global_batch_size: the request's at every count." if user_gbs else
         "global_batch_size not given: the default (~4.2M tokens, rounded up to a multiple of the GPU count) is "
         "re-derived at each count."),
    ]
    if fixed.values:
        assumptions.append("Fixed by the request: " + ", ".join(f"{k}={v}" for k, v in fixed.values.items()) + ".")
    return MinimumGpus(
        model=job.model.name, framework=job.framework, gpu=job.gpu.name, num_gpus=scan.num_gpus, candidate=candidate,
        headroom=headroom, global_batch_size=gbs, searched_from=scan.first if scan.checked else scan.floor,
        searched_to=scan.last if scan.checked else limit,
        counts_checked=scan.checked, stepping=scan.stepping, stopped_by=scan.stopped_by,  # type: ignore[arg-type]
        rationale=rationale, assumptions=assumptions,
    )
