"""The answer's wording: each ranked row's rationale, the folding of plans with the same predicted numbers into one
row, the headroom sentences and the assumptions of a Recommendation. Numbers come from the search; this only says
them."""

from __future__ import annotations

from meshplan.accuracy import with_band
from meshplan.schema import Candidate, Job, Plan, Recommendation
from meshplan.search.engine import BestFirstSearch, Found
from meshplan.search.estimators import Engine
from meshplan.search.policy import (
    GIB,
    HEADROOM_RULE,
    SAME,
    SEARCH_BUCKETS,
    SLOWER,
    memory_budget,
    memory_rule_id,
    same_numbers,
    slower_by,
)
from meshplan.space import SEARCHED_FIELDS, Fixed

FASTEST = "Fastest predicted layout that passes every rule and fits. "

FOLDED_KNOBS = ("zero_stage", "recompute", "sequence_parallel", "moe_token_dispatcher")
"""Knobs beyond the degrees and the micro-batch that a folded equivalent may differ in; named when they do."""


def percent(share: float) -> str:
    """0.1 -> '10%', 0.032 -> '3.2%': a headroom as a percentage, without rounding it away."""
    return f"{share * 100:.3g}%"


def keeps(headroom: float) -> str:
    """What a layout must do to count, in words: keep the headroom free, or just fit when it is 0."""
    return f"keeps {percent(headroom)} of GPU memory free" if headroom else "fits"


def headroom_text(headroom: float, default: bool) -> str:
    """Where the headroom came from, for the answer's text."""
    if default:
        return (f"headroom {headroom:g}: {HEADROOM_RULE}'s min_headroom_fraction in cards/rules.yaml; pass headroom "
                "to change it")
    return f"headroom {headroom:g}, from the request"


def headroom_assumption(job: Job, headroom: float, default: bool) -> str:
    """The assumption every answer states: which budget counts as fitting, and what happens to what misses it."""
    cap = job.gpu.memory_bytes
    return (f"Headroom: a layout counts as fitting when its peak memory is at most capacity x (1 - {headroom:g}) = "
            f"{memory_budget(job, headroom) / GIB:.1f} of {cap / GIB:.1f} GiB ({headroom_text(headroom, default)}). "
            "The ranking, the answer when nothing keeps it and the smallest-GPU-count scan use this one threshold; "
            f"layouts that fit only with less are counted under {HEADROOM_RULE} (or {memory_rule_id()} when over "
            "capacity) and never ranked silently: the answer names the fastest of them when it matters.")


def fixed_text(fixed: Fixed) -> str:
    """The request's fixed fields as 'tp=8, pp=3' ('' when none)."""
    return ", ".join(f"{k}={v}" for k, v in fixed.values.items())


def fixed_assumption(fixed: Fixed) -> list[str]:
    """The assumption naming what the request fixed, when it fixed anything."""
    return [f"Fixed by the request: {fixed_text(fixed)}."] if fixed.values else []


def knob_words(plan: Plan) -> str:
    """'micro-batch 2, ZeRO 1, recompute selective': the knobs of a plan beyond its degrees."""
    return f"micro-batch {plan.micro_batch_size}, ZeRO {plan.zero_stage}, recompute {plan.recompute}"


def plan_words(plan: Plan) -> str:
    """A plan in words: its degrees, then its other knobs."""
    return f"{plan.short()}, {knob_words(plan)}"


def why(found: Found, best: Found | None) -> str:
    """A ranked row's rationale: its numbers, where its step goes, and how much slower than #1 it is."""
    t = found.throughput
    b = t.breakdown
    parts = {"compute": b.compute_s, "TP communication": b.tp_comm_s, "CP communication": b.cp_comm_s,
             "EP all-to-all": b.ep_comm_s, "DP/FSDP communication": b.dp_comm_s, "PP transfers": b.pp_comm_s,
             "pipeline bubble": b.bubble_s, "recompute": b.recompute_s, "optimizer and other": b.other_s}
    costs = sorted(((v, k) for k, v in parts.items() if k != "compute" and v > 0), reverse=True)[:2]
    cost_text = ", ".join(f"{k} {v / t.step_time_s:.0%}" for v, k in costs) or "no exposed overhead"
    p = found.plan
    dispatcher = ", flex MoE dispatcher (DeepEP/HybridEP)" if p.moe_token_dispatcher == "flex" else ""
    head = (f"{plan_words(p)}{dispatcher}: "
            f"{t.step_time_s:.3f} s per step, {t.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {t.mfu:.1%}; "
            f"compute {b.compute_s / t.step_time_s:.0%} of the step, then {cost_text}; "
            f"peak memory {found.memory.peak_bytes / GIB:.1f} of {found.memory.capacity_bytes / GIB:.1f} GiB.")
    if best is None:
        return FASTEST + head
    slower = slower_by(t.tokens_per_s_per_gpu, best.throughput.tokens_per_s_per_gpu)
    return f"{slower:.1%} slower than #1 (fewer tokens/s/GPU). " + head


def candidate(job: Job, engine: Engine, found: Found, rank: int, best: Found | None,
              same: list[Found] | None = None, note: str = "") -> Candidate:
    """One row of the answer: the plan, its reports, why it ranks there (or `note`: why it is not ranked), and the
    clones folded into it."""
    text = why(found, best)
    if note:
        text = text.removeprefix(FASTEST) + " " + note
    if same:
        text += (" Same predicted step time and peak memory, folded into this row: "
                 + "; ".join(differs(found.plan, other.plan) for other in same) + ".")
    notes_here = [f.message for f in engine.full_check(job, found.plan).findings if f.severity == "warning"]
    if notes_here:
        text += " Warnings: " + " ".join(notes_here)
    throughput = with_band(found.throughput, job, found.plan)  # the error measured in its regime
    return Candidate(rank=rank, plan=found.plan, memory=engine.summary(found.memory), throughput=throughput,
                     rationale=text, equivalents=[other.plan for other in same or ()])


def differs(plan: Plan, other: Plan) -> str:
    """`other` in words, with the knobs that differ from `plan` beyond its degrees."""
    text = f"also {other.short()}, micro-batch {other.micro_batch_size}"
    for name in FOLDED_KNOBS:
        if getattr(other, name) != getattr(plan, name):
            text += f", {name} {getattr(other, name)}"
    return text


def rows(found: list[Found]) -> list[list[Found]]:
    """Plans grouped by their predicted numbers, fastest group first; in a group the simplest plan (least CP,
    then least interleaving, then the smallest micro-batch) stands for the others."""
    groups: dict[tuple[float, int], list[Found]] = {}
    for f in sorted(found, key=lambda f: f.time):
        groups.setdefault(same_numbers(f.time, f.memory.peak_bytes), []).append(f)
    return [sorted(g, key=lambda f: (f.plan.cp, f.plan.vpp, f.plan.micro_batch_size, f.plan.pp, f.plan.tp))
            for g in groups.values()]


SPACE_ASSUMPTIONS = [
    "Space: every tp, pp, cp (and ep, etp for MoE) over divisors of the GPU count under the framework's "
    "world-size law; for each pp, every vpp dividing the layers with the split schedule.uneven_split chooses "
    "(the one `meshplan check` suggests; uneven with vpp > 1 only where the framework splits the Megatron-Core "
    "way); ZeRO stages that have a distinct byte preset in cards/memory.yaml; recompute modes "
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
"""What every recommendation assumes about the space and the search, in the order the answer lists it."""


def ranked_answer(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch, considered: int, top_k: int,
                  notes: list[str], warnings: list[str], headroom: float, default_headroom: bool) -> Recommendation:
    """The Recommendation for a finished search: its top K rows (clones folded, the rest counted as slower), the
    rationale and the assumptions (the decision tables' view is meshplan/search/decision.py's)."""
    grouped = rows(search.found)
    ranked = grouped[:top_k]
    search.rejected[SLOWER] += sum(len(row) for row in grouped[top_k:])
    search.rejected[SAME] += sum(len(row) - 1 for row in ranked)
    best = ranked[0][0] if ranked else None
    candidates = [candidate(job, engine, row[0], i + 1, best if i else None, row[1:]) for i, row in enumerate(ranked)]
    open_fields = [f for f in SEARCHED_FIELDS if f not in fixed]
    rationale = ""
    if best is not None:
        rationale = (
            f"Searched {considered:,} layouts ({', '.join(open_fields) or 'nothing'} open; "
            f"{fixed_text(fixed) or 'nothing fixed'}), "
            f"evaluated {search.memory_calls} memory and {search.perf_calls} throughput estimates, "
            f"and ranked the fastest {len(ranked)} distinct layouts that pass every rule and keep "
            f"{percent(headroom)} of GPU memory free ({headroom_text(headroom, default_headroom)}). "
            + candidates[0].rationale
            + f" Throughput error measured in its regime: {candidates[0].throughput.error_band.text}."
        )
    return Recommendation(
        model=job.model.name, framework=job.framework, num_gpus=job.num_gpus, candidates=candidates,
        considered=considered, rejected={k: v for k, v in sorted(search.rejected.items()) if v},
        rationale=rationale, warnings=warnings, assumptions=[*notes, *SPACE_ASSUMPTIONS, *fixed_assumption(fixed)],
        evaluated=search.evaluations, global_batch_size=job.global_batch_size,
        headroom=headroom,
    )
