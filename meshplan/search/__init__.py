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

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from meshplan import mesh
from meshplan.cancel import checkpoint
from meshplan.errors import MeshplanError
from meshplan.request import default_batch_note, default_global_batch, resolve
from meshplan.rulebook import lcm
from meshplan.schema import (
    Candidate,
    Job,
    MinimumGpus,
    NearMiss,
    Plan,
    Recommendation,
    Request,
)
from meshplan.search.engine import BestFirstSearch, Found, run_search
from meshplan.search.estimators import Engine, default_engine, ideal_time
from meshplan.search.policy import (
    GIB,
    HEADROOM_RULE,
    SAME,
    SEARCH_BUCKETS,
    SLOWER,
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
    Fixed,
    Layout,
    divisors,
    enumerate_layouts,
    micro_batches,
    params_split,
    states_lower_bound,
)

__all__ = ["FOLDED_KNOBS", "SEARCH_BUCKETS", "Engine", "default_engine", "headroom_for", "headroom_that_ranks",
           "memory_budget", "min_headroom_fraction", "minimum_gpus", "recommend", "slower_by"]


def _percent(share: float) -> str:
    """0.1 -> '10%', 0.032 -> '3.2%': a headroom as a percentage, without rounding it away."""
    return f"{share * 100:.3g}%"


def _headroom_text(headroom: float, default: bool) -> str:
    """Where the headroom came from, for the answer's text."""
    if default:
        return (f"headroom {headroom:g}: {HEADROOM_RULE}'s min_headroom_fraction in cards/rules.yaml; pass headroom "
                "to change it")
    return f"headroom {headroom:g}, from the request"


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
    search, considered = run_search(job, fixed, engine, top_k, deadline, warnings, budget)
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


def _fastest_below_headroom(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch,
                            deadline: float) -> Found | None:
    """The fastest layout that fits the GPU at all, when it does not keep the headroom: a top-1 search at full
    capacity reusing the ranked search's estimates. When layouts are ranked, only one at least `below_headroom_gain`
    faster than the best matters, so the probe stops at that step time. None when there is no such layout."""
    if search.budget >= job.gpu.memory_bytes or search.stopped_by_budget or time.perf_counter() > deadline:
        return None
    cutoff = math.inf
    if search.found:
        cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain)
    probe, _ = run_search(job, fixed, engine, 1, deadline, [], job.gpu.memory_bytes, share=search, cutoff=cutoff)
    if not probe.found or probe.stopped_by_budget:
        return None
    fastest = min(probe.found, key=lambda f: f.time)
    return fastest if fastest.memory.peak_bytes > search.budget else None


def _report_below_headroom(rec: Recommendation, job: Job, engine: Engine, thin: Found, headroom: float) -> None:
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


# --------------------------------------------------------------------------- the answer


_FASTEST = "Fastest predicted layout that passes every rule and fits. "


def _why(rank: int, found: Found, best: Found | None) -> str:
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


def _candidate(job: Job, engine: Engine, found: Found, rank: int, best: Found | None,
               same: list[Found] | None = None, note: str = "") -> Candidate:
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


def _rows(found: list[Found]) -> list[list[Found]]:
    """Plans grouped by their predicted numbers, fastest group first; in a group the simplest plan (least CP,
    then least interleaving, then the smallest micro-batch) stands for the others."""
    groups: dict[tuple[float, int], list[Found]] = {}
    for f in sorted(found, key=lambda f: f.time):
        groups.setdefault(same_numbers(f.time, f.memory.peak_bytes), []).append(f)
    return [sorted(g, key=lambda f: (f.plan.cp, f.plan.vpp, f.plan.micro_batch_size, f.plan.pp, f.plan.tp))
            for g in groups.values()]


def _decision_table(job: Job, fixed: Fixed, engine: Engine, best: Found | None, deadline: float,
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
    probe = BestFirstSearch.for_job(job, pinned, engine, 1, deadline, budget)
    layouts, _ = enumerate_layouts(job, pinned)
    probe.seed([lay for lay in layouts], ideal_time(job, engine))
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


def _answer(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch, considered: int, top_k: int,
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


def _explain_impossible(rec: Recommendation, job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch,
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
            example = search.caches.first_finding.get(top[0])
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


def _closest(search: BestFirstSearch, engine: Engine, count: int) -> list[NearMiss]:
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


def _probe_closest(job: Job, fixed: Fixed, search: BestFirstSearch, count: int) -> None:
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
    search = BestFirstSearch.for_job(job, fixed, engine, 1, deadline, budget)
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
    search = BestFirstSearch.for_job(job, fixed, engine, 1, math.inf)
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
            finding = search.caches.first_finding[error]
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
    zeros = BestFirstSearch.for_job(job, fixed, engine, 1, deadline, budget).zeros
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
