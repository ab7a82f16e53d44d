"""The answer's wording: each ranked row's rationale, the folding of plans with the same predicted numbers into one
row, the headroom sentences and the assumptions of a Recommendation. Numbers come from the search; this only says
them."""

from __future__ import annotations

from meshplan.arithmetic.memory_states import convention, convention_name
from meshplan.check.split import split_words
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, gib, percent
from meshplan.estimate.accuracy import accuracy_card, terms, with_band
from meshplan.estimate.memory import state_shards
from meshplan.rules.engine import job_no_effect_findings
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import Candidate, ErrorBand, Recommendation, finding_line, peak_words
from meshplan.search.engine import BestFirstSearch, Found
from meshplan.search.estimators import Engine
from meshplan.search.policy import (
    ADAPTER_RULE,
    HEADROOM_RULE,
    SAME,
    SEARCH_BUCKETS,
    SLOWER,
    budget_cut,
    memory_budget,
    memory_rule_id,
    same_numbers,
    slower_by,
)
from meshplan.search.space import SEARCHED_FIELDS, Fixed
from meshplan.search.zero_stages import LeftOut, one_plan_stages

FASTEST = "Fastest predicted layout that passes every rule and fits. "

FOLDED_KNOBS = ("zero_stage", "recompute", "sequence_parallel", "moe_token_dispatcher", "moe_a2a_overlap")
"""Knobs beyond the degrees and the micro-batch that a folded equivalent may differ in; named when they do."""


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


def fixed_assumption(fixed: Fixed, settled: dict[str, str] | None = None) -> list[str]:
    """The assumption naming what the request fixed, when it fixed anything; a field the resolver set for the search
    (`settled`: the field and the resolver's note, 'zero_stage not given: 3, as skyrl trains PPO's critic only on its
    fsdp engine.') is said in that note, not as the request's."""
    settled = settled or {}
    given = {k: v for k, v in fixed.values.items() if k not in settled}
    words = [f"Fixed by the request: {', '.join(f'{k}={v}' for k, v in given.items())}."] if given else []
    return words + [note for k, note in settled.items() if k in fixed.values]


def carried_assumption(fixed: Fixed, left_out: tuple[LeftOut, ...]) -> list[str]:
    """What every ranked plan keeps as the request resolves it (space.CARRIED_FIELDS), the optimizer first, and the
    ZeRO stages the search leaves out (zero_stages.search_ladder), each with the rules that refuse it."""
    words = [f"{k}={'true' if v is True else 'false' if v is False else v}"
             f" ({'given' if k in fixed.given else 'default'})" for k, v in fixed.carried.items() if v is not None]
    out = [
        "Not searched, kept as the request resolves them in every ranked plan: " + ", ".join(words) + ". The "
        "optimizer is the request's (left out: Adam): which optimizer trains the model is a training decision, not a "
        "layout; pass optimizer=muon to rank layouts for Muon (its memory, one fp32 momentum on the matrices in place "
        "of Adam's two moments, and its Newton-Schulz time, meshplan/arithmetic/muon.py, are estimated)."
    ]
    if "zero_stage" in fixed:
        return out
    by_rules: dict[tuple[str, ...], list[int]] = {}  # stages refused by the same rules: one sentence
    for stage in left_out:
        by_rules.setdefault(tuple(dict.fromkeys(stage.rules)), []).append(stage.zero)
    for rules, zeros in by_rules.items():
        many, stages = len(rules) > 1, len(zeros) > 1
        given = (f" with the request's {', '.join(sorted(fixed.given))}"
                 if fixed.given and ADAPTER_RULE not in rules else "")
        out.append(f"ZeRO stage{'s' if stages else ''} {', '.join(map(str, zeros))} not searched: "
                   f"rule{'s' if many else ''} {', '.join(rules)} refuse{'' if many else 's'} "
                   f"{'them' if stages else 'it'} on every layout{given} ({'their' if stages else 'its'} plans "
                   f"are counted under {'them' if many else 'it'}; `meshplan check` says why).")
    return out


def knob_words(plan: Plan) -> str:
    """'micro-batch 2, ZeRO 1, recompute selective': the knobs of a plan beyond its degrees, and its pipeline split
    where it is not the even one (first/last stage sizes, the embedding/loss counted, a layout string)."""
    split = split_words(plan)
    return (f"micro-batch {plan.micro_batch_size}, ZeRO {plan.zero_stage}, recompute {plan.recompute}"
            + ("" if split == "the even split" else f", {split}"))


def offload_words(plan: Plan) -> str:
    """The offload knobs a plan turns on (the phase offloads of an RL step among them), or 'none'."""
    on = [name for name, flag in (("param", plan.param_offload), ("grad", plan.grad_offload),
                                  ("opt", plan.optimizer_offload), ("act", plan.activation_offload)) if flag]
    if plan.optimizer_offload_fraction > 0:
        on.append(f"opt {plan.optimizer_offload_fraction:g}")
    return "+".join(on) or "none"


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
    if p.moe_a2a_overlap:
        dispatcher += ", EP all-to-all overlapped with the other micro-batch's compute (moe_a2a_overlap)"
    head = (f"{plan_words(p)}{dispatcher}: "
            f"{t.step_time_s:.3f} s per step, {t.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {t.mfu:.1%}; "
            f"compute {b.compute_s / t.step_time_s:.0%} of the step, then {cost_text}; "
            f"peak memory {peak_words(found.memory)} of {gib(found.memory.capacity_bytes)}.")
    if best is None:
        return FASTEST + head
    slower = slower_by(t.tokens_per_s_per_gpu, best.throughput.tokens_per_s_per_gpu)
    return f"{slower:.1%} slower than #1 (fewer tokens/s/GPU). " + head


def ranked_words(n: int) -> str:
    """The rows a search ranked, as a person counts them, with their verb: 'the fastest layout that passes', 'the
    fastest 5 distinct layouts that pass'."""
    return "the fastest layout that passes" if n == 1 else f"the fastest {n:,} distinct layouts that pass"


def candidate(job: Job, engine: Engine, found: Found, rank: int, best: Found | None,
              same: list[Found] | None = None, note: str = "", zeros: tuple[int, ...] = ()) -> Candidate:
    """One row of the answer: the plan, its reports, why it ranks there (or `note`: why it is not ranked), the
    clones folded into it and the ZeRO stages of the search's ladder (`zeros`) that are the same plan at its layout."""
    text = why(found, best)
    if note:
        text = text.removeprefix(FASTEST) + " " + note
    if same:
        text += (" Same predicted step time and peak memory, folded into this row: "
                 + "; ".join(differs(found.plan, other.plan) for other in same) + ".")
    text += same_stage_text(job, engine, found.plan, zeros) + heavier_text(job, found)
    # the plan's own warnings: those of every plan of the job are the answer's, said once there (job_warnings)
    job_wide = {f.id for f in job_no_effect_findings(job, found.plan)}
    notes_here = [f.message for f in engine.full_check(job, found.plan).findings
                  if f.severity == "warning" and f.id not in job_wide]
    if notes_here:
        text += " Warnings: " + " ".join(notes_here)
    throughput = with_band(found.throughput, job, found.plan)  # the error measured in its regime
    text += " " + how_sure(job, found.plan, throughput.error_band) + overlap_share(job, engine, found)
    return Candidate(rank=rank, plan=found.plan, memory=engine.summary(found.memory), throughput=throughput,
                     rationale=text, equivalents=[other.plan for other in same or ()])


def same_stage_text(job: Job, engine: Engine, plan: Plan, zeros: tuple[int, ...]) -> str:
    """The ZeRO stages of `zeros` that are one plan with the row's at its layout and that the rules pass there
    (zero_stages.one_plan_stages: the search leaves them out, SEARCH-SAME-STAGE), in words: what the higher stage
    shards, over how many ranks, and which stage the row offers; '' where there are none."""
    others = [zero for zero in one_plan_stages(job, plan, zeros)
              if not any(f.severity == "error" for f in engine.check(job, plan.copied({"zero_stage": zero})).findings)]
    if not others:
        return ""
    highest = max(plan.zero_stage, *others)
    sharded = [t.name for t in convention(job.card, highest, job.framework_version)[2] if t.shard == "dp"]
    dense, expert = state_shards(job, plan)
    over = f"dp x cp = {dense} rank"
    if job.model.moe is not None:
        over += f" (routed experts: expert-dp = {expert:g})"
    stages = " and ".join(f"ZeRO {zero}" for zero in sorted(others))
    what = " and ".join([", ".join(sharded[:-1]), sharded[-1]] if len(sharded) > 1 else sharded)
    why_this = (f"{job.framework}'s default" if plan.zero_stage == job.card.defaults.zero_stage
                else "the lowest stage the rules pass")
    return (f" {stages} {'is' if len(others) == 1 else 'are'} the same plan at this layout: ZeRO {highest} shards "
            f"its {what} over {over}, which holds them whole, so the stages hold the same bytes and run the same "
            f"step; listed once, as ZeRO {plan.zero_stage} ({why_this}).")


def heavier_text(job: Job, found: Found) -> str:
    """The row's twins the search left out as SEARCH-HEAVIER-STAGE (Found.heavier: the same layout, micro-batch and
    recompute at another ZeRO stage, timed the same or slower with a higher peak), in words: each stage with its byte
    preset where it differs from the row's (memory_states.convention_name: Megatron-FSDP at Megatron-Core's ZeRO 3),
    its step where slower, its peak, and that it shards nothing where dp x cp is 1; "" where there are none."""
    if not found.heavier:
        return ""
    card, version, plan = job.card, job.framework_version, found.plan
    mine = convention_name(card, plan.zero_stage, version)
    dense, expert = state_shards(job, plan)
    nothing = ""
    if dense == 1 and (job.model.moe is None or expert == 1):
        nothing = f": at dp x cp = 1{', expert-dp = 1' if job.model.moe is not None else ''} it shards nothing"
    parts = []
    for other in sorted(found.heavier, key=lambda f: f.plan.zero_stage):
        theirs = convention_name(card, other.plan.zero_stage, version)
        preset = f" (byte preset {theirs}, the row's {mine})" if theirs != mine else ""
        step = ("the same predicted step" if same_numbers(other.time, 0) == same_numbers(found.time, 0) else
                f"a slower predicted step, {other.time:.3f} s against {found.time:.3f} s,")
        parts.append(f" ZeRO {other.plan.zero_stage}{preset} runs this layout at {step} with a "
                     f"higher peak, {peak_words(other.memory)}{nothing}, so it is not listed (SEARCH-HEAVIER-STAGE).")
    return "".join(parts)


def how_sure(job: Job, plan: Plan, band: ErrorBand | None) -> str:
    """What the row's prediction rests on: the error measured in its regime with the terms no measured run exercised
    (the row relies on them unchecked), and how many measured runs exercise each of its other mechanisms
    (cards/accuracy.yaml, counted by bench/accuracy_card.py with meshplan.estimate.accuracy.terms)."""
    if band is None:
        return ""
    runs = accuracy_card().throughput.terms
    checked = [f"{t} {runs[t]}" for t in terms(job, plan, "throughput")
               if runs.get(t) and not t.startswith(("framework ", "GPU "))]
    text = f"How sure: {band.text}"
    if band.unvalidated:
        text += " (this row relies on them unchecked)"
    if checked:
        text += f"; measured runs behind its other terms: {', '.join(checked)}"
    return text + "."


def overlap_share(job: Job, engine: Engine, found: Found) -> str:
    """What the search's EP overlap buys this row: its step time with the all-to-all exposed (one estimate)."""
    if not found.plan.moe_a2a_overlap:
        return ""
    try:
        plain = engine.throughput(job, found.plan.model_copy(update={"moe_a2a_overlap": False}))
    except MeshplanError:
        return ""
    return (f" Without the EP overlap (moe_a2a_overlap=false) it takes {plain.step_time_s:.3f} s per step "
            f"({slower_by(plain.tokens_per_s_per_gpu, found.throughput.tokens_per_s_per_gpu):.1%} slower).")


def differs(plan: Plan, other: Plan) -> str:
    """`other` in words, with the knobs that differ from `plan` beyond its degrees."""
    text = f"also {other.short()}, micro-batch {other.micro_batch_size}"
    for name in FOLDED_KNOBS:
        if getattr(other, name) != getattr(plan, name):
            text += f", {name} {getattr(other, name)}"
    return text


def rows(found: list[Found]) -> list[list[Found]]:
    """Plans grouped by their predicted numbers, fastest group first and, at the same step time, the lower peak
    first (ZeRO-3 at dp 1 shards nothing and holds more: the stage that holds less leads); in a group the simplest
    plan (least CP, then least interleaving, then the smallest micro-batch) stands for the others."""
    groups: dict[tuple[float, int], list[Found]] = {}
    for f in sorted(found, key=lambda f: (f.time, f.memory.peak_bytes)):
        groups.setdefault(same_numbers(f.time, f.memory.peak_bytes), []).append(f)
    return [sorted(g, key=lambda f: (f.plan.cp, f.plan.vpp, f.plan.micro_batch_size, f.plan.pp, f.plan.tp))
            for g in groups.values()]


SPACE_ASSUMPTIONS = [
    "Space: every tp, pp, cp (and ep, etp for MoE) over divisors of the GPU count under the framework's "
    "world-size law; for each pp, every vpp dividing the layers with the split schedule.uneven_split chooses "
    "(uneven with vpp > 1 only where the framework splits the Megatron-Core way), and where it splits that way the "
    "splits whose end stages (embedding; output layer and loss) are lighter and whose middle stages hold the fewest "
    "layers the heaviest can (schedule.end_light_splits: the last filled with the rest, as Megatron-Bridge's layout "
    "helpers do, or an end one layer lighter, Megatron-Core's account_for_embedding/loss_in_pipeline_split): as "
    "first/last stage sizes, and where the framework writes pipeline_model_parallel_layout also per virtual stage at "
    "any vpp (check/split.py pipeline_options; `meshplan check` names the fastest of them for a fixed layout); ZeRO "
    "stages that have a distinct byte preset in cards/memory.yaml, less those the framework's adapter has no key "
    "for (rule AD001, counted under it); recompute modes "
    "of the framework card's search section; micro-batch sizes dividing each data-parallel rank's share of the "
    "batch.",
    "Sequence parallelism follows the framework default (on with tp > 1) and CP uses the p2p ring unless "
    "given; TP (and ETP) stay inside one NVLink domain unless nothing else fits.",
    "MoE, unless given: the flex dispatcher where the expert group leaves the NVLink domain and the framework renders "
    "it; the EP all-to-all overlapped with the other micro-batch's compute (moe_a2a_overlap) wherever the framework "
    "renders it and rule EP009 allows it (ep > 1, vpp with pp > 1, no full recompute, at most one MTP layer). In the "
    "cost model the overlap only hides time and adds no memory, so the overlapped plan stands for both; a row that "
    "uses it says its step time without it.",
    "Exact best-first search over the same estimators: a plan is ranked only when no unexplored one can be "
    "faster. Bounds: time per token from single-stage reference plans (it only falls with more tokens per "
    "rank) x tokens / pp x (m + (pp-1)/vpp); memory floors from the first stage's states and activations. "
    "Assumes more recompute never makes a plan faster or bigger, that a higher ZeRO stage never holds more model "
    "states (each stage's peak is still estimated: its gathered or kept copies can outweigh what it shards), and "
    "that memory grows with the micro-batch and with interleaving.",
    "Ranked layouts are distinct choices: the same layout with more recompute than it needs is not listed, "
    "and layouts with the same predicted step time and peak memory (e.g. a factor moved between CP and the "
    "micro-batch) share one row (its equivalents). ZeRO stages that are the same plan at a layout (what one shards "
    "is split over one rank, e.g. Megatron's distributed optimizer at dp x cp 1) are one plan, listed once at the "
    "framework's default stage (else the lowest) the rules pass, its row naming the others; a stage of a layout "
    "timed the same as another stage there with a higher peak (another engine or byte preset, e.g. Megatron-FSDP "
    "beside the distributed optimizer at dp x cp 1) is not listed, the row it loses to naming it.",
    "\"X% slower\" is 1 - (its tokens/s/GPU) / (the other's): the share of throughput lost, at the same batch.",
    "Rejected counts: rule ids of cards/rules.yaml (the memory error for plans that do not fit, including "
    "those dropped by a memory floor) and search buckets: "
    + "; ".join(f"{k}: {v}" for k, v in SEARCH_BUCKETS.items()) + ".",
]
"""What every recommendation assumes about the space and the search, in the order the answer lists it."""


def job_warnings(job: Job) -> list[str]:
    """What every search's answer warns of whatever it ranks: the findings of the `no_effect` rules that read no plan
    field (rules/engine.job_no_effect_findings: EP014,
    moe_shared_expert_overlap for a model without shared experts; RL008, GRPO over one sample per prompt), in the
    words check gives them. They read the job alone (never its GPU count) and apply on every engine
    (tests/test_job_warnings.py), so any plan of the job answers the same: asked on the default Plan, so the answer
    with no candidate, the one refused a count and min-gpus' scan say them as the one with candidates does. The
    training recommend, the RL recommend and min-gpus all say them through this one function."""
    return [finding_line(f) for f in job_no_effect_findings(job, Plan())]


def ranked_answer(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch, considered: int, top_k: int,
                  notes: list[str], warnings: list[str], headroom: float, default_headroom: bool) -> Recommendation:
    """The Recommendation for a finished search: its top K rows (clones folded, the rest counted as slower), the
    rationale and the assumptions (the decision tables' view is meshplan/search/decision.py's)."""
    grouped = rows(search.found)
    ranked = grouped[:top_k]
    search.rejected[SLOWER] += sum(len(row) for row in grouped[top_k:])
    search.rejected[SAME] += sum(len(row) - 1 for row in ranked)
    best = ranked[0][0] if ranked else None
    candidates = [candidate(job, engine, row[0], i + 1, best if i else None, row[1:], zeros=search.zeros)
                  for i, row in enumerate(ranked)]
    open_fields = [f for f in SEARCHED_FIELDS if f not in fixed] + (["moe_a2a_overlap"] if search.a2a_open else [])
    rationale = ""
    if best is not None:
        rationale = (
            f"Searched {considered:,} layouts ({', '.join(open_fields) or 'nothing'} open; "
            f"{fixed_text(fixed) or 'nothing fixed'}), "
            f"evaluated {search.memory_calls} memory and {search.perf_calls} throughput estimates, "
            f"and ranked {ranked_words(len(ranked))} every rule and "
            f"{'keeps' if len(ranked) == 1 else 'keep'} "
            f"{percent(headroom)} of GPU memory free ({headroom_text(headroom, default_headroom)}). "
            + "#1: " + candidates[0].rationale.removeprefix(FASTEST)  # the sentence before says what #1 is
        )
    return Recommendation(
        model=job.model.name, framework=job.framework, num_gpus=job.num_gpus, candidates=candidates,
        considered=considered, rejected={k: v for k, v in sorted(search.rejected.items()) if v},
        rationale=rationale, warnings=warnings,
        assumptions=[*notes, *SPACE_ASSUMPTIONS, *carried_assumption(fixed, search.refused),
                     *fixed_assumption(fixed),
                     *([budget_cut(search.max_evaluations)] if search.stopped_by_budget else [])],
        evaluated=search.evaluations, global_batch_size=job.global_batch_size, gpus_per_node=job.gpus_per_node,
        headroom=headroom,
    )
