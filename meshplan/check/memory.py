"""The rules that read the memory estimate (`memory: true` in cards/rules.yaml): the plan fits the GPU (MEM001, its
fix the nearby layouts that fit, meshplan/check/alternatives.py), keeps some headroom (MEM002), the node's host
memory holds what is offloaded (MEM003), each RL phase fits (RL005), the rollout engine holds a sequence (RL006), and a
rollout TP across nodes is told the sizes inside one whose engine holds its weights (RL004).

check_config estimates the plan once and runs these over the estimate (`Context.memory_report`); each returns None
when its rule passes, else the numbers for the card's message and fix templates.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from meshplan.arithmetic.mesh import ranks_per_node
from meshplan.arithmetic.offload import offload_card, offload_plan
from meshplan.check.alternatives import fitting_alternatives, judged
from meshplan.check.split import headroom_threshold
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, gib
from meshplan.estimate.memory import estimate_memory, memory_budget
from meshplan.rl.engine import engine_kv_bytes_per_sequence, engine_weight_bytes, engine_working_bytes
from meshplan.rl.memory import job_memory
from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import divisors, fmt_set
from meshplan.rules.rollout import phase_knobs
from meshplan.schema.reports import EngineMemory, MemoryReport


def _report(ctx: Context) -> MemoryReport:
    assert ctx.memory_report is not None, "memory rules run only after the estimate"
    return ctx.memory_report


def _capacity_words(ctx: Context, capacity: int) -> str:
    """The capacity a fit is judged against: the GPU's, or that less the headroom the request asked to keep."""
    if not ctx.job.headroom:
        return gib(capacity)
    return f"the {gib(memory_budget(ctx.job))} that headroom={ctx.job.headroom:g} leaves of {gib(capacity)}"


@rule("MEM001")
def does_not_fit(ctx: Context) -> Values:
    report = _report(ctx)
    if report.fits:
        return None
    over = report.fit_bytes - memory_budget(ctx.job)  # the figure that decided the fit (memory.fit_figure)
    fitting, tried = fitting_alternatives(ctx)
    if fitting and " + " in fitting[0]:
        fix = (f"no single change fits ({', '.join(tried) or 'no valid neighbour'}); together, "
               + " or ".join(fitting) + (" fits" if len(fitting) == 1 else " fit"))
    elif fitting:
        fix = " or ".join(fitting) + (" fits" if len(fitting) == 1 else " fit")
    else:
        fix = (f"none of the nearby layouts fits ({', '.join(tried) or 'no valid neighbour'}); "
               "more GPUs or `meshplan recommend` are needed")
    return {"peak": gib(report.fit_bytes), "stage": report.peak_stage,
            "capacity": _capacity_words(ctx, report.capacity_bytes), "over": gib(over), "gpu": ctx.job.gpu.name,
            "alternatives": fix}


@rule("MEM002")
def low_headroom(ctx: Context) -> Values:
    report = _report(ctx)
    minimum = headroom_threshold(ctx.job.headroom)
    if not report.fits or report.headroom_bytes >= minimum * report.capacity_bytes:
        return None
    # the figure the headroom is left from (memory.fit_figure): with expandable segments the allocated peak, whose
    # headroom beside the reserved peak read as "1.5 GiB free at a peak of 80.4 GiB" on a 79.6 GiB GPU
    peak = gib(report.fit_bytes) if report.fit_basis == "reserved" else (
        f"{gib(report.fit_bytes)} allocated (expandable segments; {gib(report.peak_bytes)} reserved)")
    return {"headroom": gib(report.headroom_bytes), "share": f"{report.headroom_bytes / report.capacity_bytes:.1%}",
            "stage": report.peak_stage, "minimum": f"{minimum:.0%}", "peak": peak,
            "changes": _rollout_changes(ctx, report, minimum) or _roomier_layouts(ctx, minimum)}


def _switched_on(knobs: list[str]) -> str:
    """Plan switches as a fix writes them, for fix_changes to read back as a request ("param_offload=true and
    optimizer_offload=true")."""
    return " and ".join(f"{k}=true" for k in knobs)


def _rollout_changes(ctx: Context, report: MemoryReport, minimum: float) -> str:
    """Where an RL job peaks in its rollout, what keeps `minimum` of the GPU free there: the phase offloads the plan
    has not made, estimated and named with their peak where they keep it (alternatives.judged: with the trainer's
    states on the host, an engine whose fraction is of the free memory grows into it, and 'param_offload=true and
    optimizer_offload=true' kept the warning), or a lower rollout_memory_fraction (_engine_changes, estimated the
    same way: a rollout_tp beside it kept the warning where the phase's other parts grew); a micro-batch,
    recompute or ZeRO stage changes only the update's peak. Empty for any other job or phase."""
    if not report.phases or report.peak_phase != "rollout":
        return ""
    top = next(p for p in report.phases if p.phase == "rollout")
    knobs = [k for k in phase_knobs(ctx.card, ctx.plan) if not getattr(ctx.plan, k)]
    switched = judged(ctx, _switched_on(knobs), dict.fromkeys(knobs, True), keep=minimum) \
        if knobs and top.pool == "trainer" else None
    short = minimum * report.capacity_bytes - report.headroom_bytes
    engine = [judged(ctx, label, change, keep=minimum) for label, change in _engine_changes(ctx, top.engine, short)]
    return " or ".join(j.fitting for j in (switched, *engine) if j is not None and j.fitting is not None)


def _roomier_layouts(ctx: Context, minimum: float) -> str:
    """The nearby layouts that keep `minimum` of the GPU free, each with its estimated peak and free share, found as
    MEM001's are (alternatives.fitting_alternatives, the one search of neighbours): 'a larger tp or pp' named a
    direction, and 'recompute=selective' one whose peak (an RL job's at its update) kept the warning."""
    fitting, tried = fitting_alternatives(ctx, keep=minimum)
    if fitting and " + " in fitting[0]:
        return "together, " + " or ".join(fitting)
    if fitting:
        return " or ".join(fitting)
    return (f"none of the nearby layouts keeps it ({', '.join(tried) or 'no valid neighbour'}); more GPUs or "
            "`meshplan recommend` (which ranks by this headroom)")


@rule("MEM003")
def host_memory_short(ctx: Context) -> Values:
    report = ctx.memory_report
    assert report is not None, "memory rules run only after the estimate"
    capacity = ctx.job.cpu_memory_per_node
    if capacity is None or report.host_bytes_per_node <= capacity:
        return None
    stage = max(report.stages, key=lambda s: s.host_bytes)
    gpus = ranks_per_node(ctx.job)
    kinds = {k.removeprefix("host_"): v for k, v in stage.detail.items() if k.startswith("host_")}
    what = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return {"host": gib(report.host_bytes_per_node), "per_gpu": gib(stage.host_bytes), "stage": stage.stage,
            "gpus": gpus, "what": what, "capacity": gib(capacity), "over": gib(report.host_bytes_per_node - capacity),
            "fix": _host_fix(ctx, stage.host_bytes, kinds, capacity / gpus)}


def _host_fix(ctx: Context, per_gpu: float, kinds: dict[str, int], budget: float) -> str:
    """The largest share of the CPU optimizer (two decimals, rounded down) whose whole offload fits the host, found
    by re-estimating (the share also changes what the phase offloads move); else which offload to drop."""
    plan = ctx.plan
    capacity = ctx.job.cpu_memory_per_node
    if kinds.get("cpu_optimizer") and capacity is not None:
        def fits(hundredths: int) -> bool:
            trial = plan.model_copy(update={"optimizer_offload_fraction": hundredths / 100})
            return estimate_memory(ctx.job, trial).host_bytes_per_node <= capacity

        low, high = 0, round(plan.optimizer_offload_fraction * 100)
        while low < high:  # the largest share in hundredths that fits (host bytes grow with the share)
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(mid) else (low, mid - 1)
        if low > 0:
            return (f"optimizer_offload_fraction={low / 100:g} fits the host (the CPU optimizer keeps "
                    f"{offload_card().cpu_optimizer_bytes_per_param:g} B per parameter of its share there; the GPU "
                    "then steps the rest), or more nodes (a smaller shard per GPU), or nodes with more host memory.")
    biggest = max(kinds, key=kinds.get) if kinds else "offload"
    knob = {"between_phases": "the phase offloads (param_offload/grad_offload/optimizer_offload)",
            "activations": "activation_offload", "cpu_optimizer": "optimizer_offload",
            "weights": "param_offload"}.get(biggest, f"the {biggest} offload")
    return f"Drop {knob}, use more nodes (a smaller shard per GPU), or nodes with more host memory."


@rule("RL004")
def rollout_tp_in_node(ctx: Context) -> Values:
    """A rollout TP over more GPUs than the NVLink domain: the fix names the sizes inside it whose engine holds its
    weights and one sequence in the budget this plan's engine has (RL006's arithmetic), and where none does says so
    ('none of': check --config writes no edit) instead of naming a size the engine cannot start at (DeepSeek-V3 at
    rollout_tp=32 was told rollout_tp=1, 1,250 GiB of weights per GPU)."""
    job, plan = ctx.job, ctx.plan
    domain = ctx.fast_domain
    if plan.rollout_tp is None or plan.rollout_tp <= domain:
        return None
    report = ctx.memory_report
    rollout = next((p for p in report.phases if p.phase == "rollout"), None) if report is not None else None
    budget = rollout.engine.budget_bytes if rollout is not None and rollout.engine is not None else None
    length = job.rl.prompt_length + job.rl.response_length
    inside = divisors(domain)
    holding = [tp for tp in inside if budget is None
               or _engine_needs(job, plan.model_copy(update={"rollout_tp": tp}), length)[0] <= budget]
    if holding:
        fix = (f"Keep rollout_tp within the node (rollout_tp in {fmt_set(holding)}) and add replicas or rollout EP "
               "(= TP x DP) instead")
    else:
        need = _engine_needs(job, plan.model_copy(update={"rollout_tp": domain}), length)[0]
        fix = (f"None of the rollout_tp inside the {domain}-GPU domain ({fmt_set(inside)}) holds the engine's weights "
               f"and one sequence (it needs {gib(need)} per GPU at rollout_tp={domain}; the engine has "
               f"{gib(budget)}): keep rollout_tp={plan.rollout_tp}")
    gpu = job.gpu
    return {"tp": plan.rollout_tp, "domain": domain, "net": f"{gpu.network_bandwidth / 1e9:.0f}",
            "intra": f"{gpu.intra_node_bandwidth / 1e9:.0f}", "fix": fix}


_PHASE_COUNTS = ("sequences_at_once", "micro_batch_tokens")
"""The entries of an RL phase's detail that count sequences or tokens, not bytes (rl/memory.py StagePeak.detail)."""


@rule("RL005")
def rl_phase_fits(ctx: Context) -> Values:
    report = ctx.memory_report
    if report is None or not report.phases or report.fits:
        return None
    top = next(p for p in report.phases if p.phase == report.peak_phase)
    d, plan, capacity = top.detail, ctx.plan, memory_budget(ctx.job)  # less the headroom the request asked to keep
    over = top.peak_bytes - capacity
    parts = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f} GiB" for k, v in d.items()
                      if k not in _PHASE_COUNTS and v)
    if d.get("micro_batch_tokens"):  # a count beside the bytes: it was said as 'micro batch tokens 0.0 GiB'
        parts += f", micro-batches of {int(d['micro_batch_tokens']):,} tokens"
    phase_off = offload_plan(ctx.card, plan).phase
    if top.phase == "rollout" and top.pool == "trainer":
        fixes = []
        knobs = phase_knobs(ctx.card, plan)
        if d.get("trainer_resident", 0) and not phase_off and knobs:
            fixes.append(f"{_switched_on(knobs)} (move the trainer's "
                         f"{d['trainer_resident'] / GIB:.1f} GiB to the host during the rollout)")
        if d.get("reference_resident", 0):
            fixes.append(f"param_offload=true (also moves the reference model's "
                         f"{d['reference_resident'] / GIB:.1f} GiB)")
        fixes.extend(_engine_fixes(ctx, top.engine, over))
        fix = "; or ".join(fixes) + "."
    elif top.phase == "rollout":
        fix = "; or ".join(_engine_fixes(ctx, top.engine, over)
                           or ["GPUs with more memory: no rollout_memory_fraction holds one sequence under it"]) + "."
    elif top.phase == "log_prob":
        fix = ("param_offload (the reference and the actor take turns on the GPU), or a smaller micro_batch_size for "
               "the forward passes.")
    else:
        fix = ("The update's peak is the training step's: phase offloads do not lower it; use "
               "optimizer_offload_fraction (the in-step CPU optimizer), recompute, a larger pp or ep, or more GPUs "
               "(`meshplan recommend`).")
    return {"phase": top.phase, "peak": f"{top.peak_bytes / GIB:.1f} GiB", "capacity": f"{capacity / GIB:.1f} GiB",
            "pool": top.pool, "parts": parts, "over": f"{over / GIB:.1f} GiB", "fix": fix}




def _engine_fixes(ctx: Context, engine: EngineMemory | None, over: float) -> list[str]:
    """The words of _engine_changes, each alternative a fix names."""
    return [label for label, _ in _engine_changes(ctx, engine, over)]


def _engine_changes(ctx: Context, engine: EngineMemory | None, over: float) -> list[tuple[str, dict]]:
    """The rollout engine's settings that take `over` bytes off the rollout phase and still hold one sequence (RL006):
    the largest rollout_memory_fraction, in hundredths, that does; where none does at this rollout_tp, the least
    doubling of rollout_tp (whole replicas in the NVLink domain, as RL006's fix) whose engine holds one at that
    fraction. The engine's budget is the fraction times its basis (the GPU's memory, or what the trainer leaves
    free: the engine card's memory_fraction_of), read from the estimate per unit of fraction; rollout_tp splits the
    weights and KV cache but not that budget, so a larger rollout_tp alone lowers no peak. Each with the plan
    change it names."""
    plan, job = ctx.plan, ctx.job
    if engine is None or engine.budget_bytes <= 0 or plan.rollout_memory_fraction <= 0:
        return []
    per_fraction = engine.budget_bytes / plan.rollout_memory_fraction
    fraction = math.floor(100 * (plan.rollout_memory_fraction - over / per_fraction)) / 100
    if fraction <= 0:
        return []
    length = job.rl.prompt_length + job.rl.response_length
    if fraction * per_fraction >= _engine_needs(job, plan, length)[0]:
        kv = engine.kv_bytes - (plan.rollout_memory_fraction - fraction) * per_fraction
        return [(f"rollout_memory_fraction={fraction:g} (the KV cache shrinks to {gib(kv)})",
                 {"rollout_memory_fraction": fraction})]
    for tp in _doubled_rollout_tps(ctx):
        if fraction * per_fraction >= _engine_needs(job, plan.model_copy(update={"rollout_tp": tp}), length)[0]:
            return [(f"rollout_tp={tp} with rollout_memory_fraction={fraction:g} (the engine's weights split over "
                     f"{tp // plan.rollout_tp} times the GPUs, so that fraction still holds a sequence)",
                     {"rollout_tp": tp, "rollout_memory_fraction": fraction})]
    return []


def _doubled_rollout_tps(ctx: Context) -> Iterator[int]:
    """The rollout_tp values a fix may name, least first: doublings of the plan's that keep whole replicas of the
    rollout GPUs (RL002) inside the NVLink domain (RL004); RL005's and RL006's fixes take the first that holds a
    sequence."""
    plan = ctx.plan
    gpus, tp = plan.rollout_gpus or ctx.world, 2 * plan.rollout_tp
    while gpus % (tp * plan.rollout_dp) == 0 and tp <= ctx.fast_domain:
        yield tp
        tp *= 2


@rule("RL006")
def rollout_holds_no_sequence(ctx: Context) -> Values:
    """The engine's fraction leaves no KV cache for one sequence (vLLM and SGLang refuse to start): what the RL search
    counts under this rule too, said by check instead of a step estimated at one sequence the engine cannot hold."""
    report = ctx.memory_report
    if report is None or not report.rollout_starved:
        return None
    rollout = next(p for p in report.phases if p.phase == "rollout")
    engine = rollout.engine
    job, plan = ctx.job, ctx.plan
    length = job.rl.prompt_length + job.rl.response_length
    need, weights, working, sequence = _engine_needs(job, plan, length)
    of_free = job.rl_card.engines[plan.rollout_engine].memory_fraction_of == "free"
    budget = engine.budget_bytes
    fixes: list[tuple[str, dict]] = []
    if budget > 0 and (fraction := math.ceil(100 * plan.rollout_memory_fraction * need / budget) / 100) <= 1:
        fixes.append((f"rollout_memory_fraction={fraction:g} or more", {"rollout_memory_fraction": fraction}))
    # the least doubling of rollout_tp whose engine holds a sequence, with the least fraction that then holds one
    # where the request's does not
    for tp in _doubled_rollout_tps(ctx) if budget > 0 else ():
        need_tp = _engine_needs(job, plan.model_copy(update={"rollout_tp": tp}), length)[0]
        at = math.ceil(100 * plan.rollout_memory_fraction * need_tp / budget) / 100
        if at <= 1:
            also = f" with rollout_memory_fraction={at:g} or more" if need_tp > budget else ""
            fixes.append((f"rollout_tp={tp}{also} (the engine's weights and KV cache split over "
                          f"{tp // plan.rollout_tp} times the GPUs)",
                          {"rollout_tp": tp} | ({"rollout_memory_fraction": at} if also else {})))
            break
    knobs = [k for k in phase_knobs(ctx.card, plan) if not getattr(plan, k)]
    if of_free and knobs and rollout.pool == "trainer":  # its fraction is of the memory the trainer leaves free
        fixes += _freed_for_the_engine(ctx, knobs, need)
    missed: list[str] = []
    if report.fits:  # a plan that fits: only a change that still fits, estimated (a larger fraction overflowed it)
        found = [(label, change, judged(ctx, label, change)) for label, change in fixes]
        fixes = [(j.fitting, change) for _, change, j in found if j is not None and j.fitting is not None]
        missed = [j.tried for _, _, j in found if j is not None and j.fitting is None]
    fixes_said = [label for label, _ in fixes]
    values = {"engine": plan.rollout_engine, "fraction": f"{plan.rollout_memory_fraction:g}", "need": gib(need),
              "weights": gib(weights), "working": gib(working), "kv": gib(engine.kv_bytes),
              "length": f"{length:,}", "sequence": gib(sequence)}
    if not fixes_said and missed:  # 'none of': check --config reads no edit from it (adapters/read/fixes.NO_FIX)
        return values | {"fix": f"None of the changes that hold a sequence fits ({'; '.join(missed)}): use GPUs "
                                "with more memory, more GPUs or `meshplan recommend`"}
    return values | {"fix": "Use " + (" or ".join(fixes_said) if fixes_said else
                                      "GPUs with more memory: no fraction holds one sequence here")}


def _freed_for_the_engine(ctx: Context, knobs: list[str], need: float) -> list[tuple[str, dict]]:
    """RL006's phase-offload fix where the engine's fraction is of what the trainer leaves free: the budget it then
    starts with, estimated with the knobs on, and the fraction that holds a sequence there where the request's does
    not (a Qwen3-30B-A3B verl job on 40 GB A100s was told optimizer_offload=true, and at its fraction 0.5 the engine
    still held none)."""
    plan = ctx.plan
    try:
        report = job_memory(ctx.job, plan.model_copy(update=dict.fromkeys(knobs, True)))
    except MeshplanError:  # the offloads refused for this plan (their own rules say why): no fix in them
        return []
    rollout = next((p for p in report.phases if p.phase == "rollout"), None)
    budget = rollout.engine.budget_bytes if rollout is not None and rollout.engine is not None else 0
    if budget <= 0:
        return []
    at = math.ceil(100 * plan.rollout_memory_fraction * need / budget) / 100
    why = "(the trainer's states leave the GPUs for the rollout, so more is free when the engine starts)"
    switched = dict.fromkeys(knobs, True)
    if at <= plan.rollout_memory_fraction:
        return [(f"{_switched_on(knobs)} {why}", switched)]
    return [(f"{_switched_on(knobs)} with rollout_memory_fraction={at:g} or more {why}",
             switched | {"rollout_memory_fraction": at})] if at <= 1 else []


def _engine_needs(job, plan, length: int) -> tuple[float, float, float, float]:
    """(the least budget the engine starts with, its weights, its activations, one sequence's KV cache), bytes."""
    weights = engine_weight_bytes(job.model, plan)
    working = engine_working_bytes(job.model, plan, job.rl_card.defaults)
    sequence = engine_kv_bytes_per_sequence(job, plan, length)
    return weights + working + sequence, weights, working, sequence
