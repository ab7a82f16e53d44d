"""check_config: runs every rule of cards/rules.yaml that applies to the job's framework over one plan.

Structural rules are pure arithmetic (meshplan/rules/conditions.py) and run first; with
`include_memory=False` they are all that runs, which is what the search calls thousands of times. The
memory rules estimate the plan once; when it does not fit, the fix is computed by re-estimating a
short list of nearby layouts and naming the ones that fit, so the advice is a number, not a slogan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meshplan.arithmetic import mesh
from meshplan.arithmetic.schedule import pipeline_split
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import framework_card
from meshplan.rules.conditions import ctx_param
from meshplan.rules.engine import Context, EstimateBlocked, finding, gib, rule, rules_for
from meshplan.schema.contract import CheckReport, Finding, Job, MemoryReport, MemorySummary, Plan


def check_config(job: Job, plan: Plan, *, include_memory: bool = True) -> CheckReport:
    """Every applicable rule over the plan; `ok` is False when any finding is an error."""
    ctx = Context(job, plan)
    findings: list[Finding] = []
    next_steps: list[str] = []
    structural_error = False
    for spec, condition in rules_for(job.framework, ctx.backend, False):
        values = condition(ctx)
        if values is not None:
            findings.append(finding(spec, values))
            structural_error = structural_error or spec.severity == "error"
    memory: MemorySummary | None = None
    if include_memory:
        memory, note = _memory_findings(ctx, findings)
        if note:
            next_steps.append(note)
    ok = not any(f.severity == "error" for f in findings)
    next_steps.extend(_next_steps(ok, structural_error, findings))
    return CheckReport(ok=ok, framework=job.framework, model=job.model.name, plan=plan, findings=findings,
                       memory=memory, next_steps=next_steps)


def check_structure(job: Job, plan: Plan) -> list[Finding]:
    """Only the structural findings (no memory estimate): the cheap form the search prunes with."""
    return check_config(job, plan, include_memory=False).findings


def _next_steps(ok: bool, structural_error: bool, findings: list[Finding]) -> list[str]:
    if structural_error:
        ids = ", ".join(sorted({f.id for f in findings if f.severity == "error"}))
        return [f"Fix the errors ({ids}) with the values their fix names, then run `meshplan check` again; "
                "`meshplan recommend` lists layouts that pass every rule."]
    if not ok:
        return ["Apply one of the layouts the MEM001 fix names, or run `meshplan recommend` for the fastest one "
                "that fits."]
    return ["The layout passes every rule of its framework: `meshplan throughput` predicts its speed, "
            "`meshplan render` writes it in the framework's own keys."]


# --------------------------------------------------------------------------- memory rules


def _memory_findings(ctx: Context, findings: list[Finding]) -> tuple[MemorySummary | None, str]:
    """Estimate once, then run the memory rules over the estimate; nonsense layouts get a note instead."""
    from meshplan.estimate.memory import memory_summary
    from meshplan.rl.rollout import job_memory as estimate_memory  # an RL job: the peak over its phases

    try:
        report = estimate_memory(ctx.job, ctx.plan)
    except EstimateBlocked as exc:  # already a finding above: name it, do not repeat it
        return None, f"Memory not estimated until {exc.rule_id} ({exc.finding.title}) is fixed."
    except MeshplanError as exc:
        return None, f"Memory not estimated: {exc.reason}"
    with_memory = replace(ctx, memory_report=report)
    for spec, condition in rules_for(ctx.framework, ctx.backend, True):
        if spec.memory:
            values = condition(with_memory)
            if values is not None:
                findings.append(finding(spec, values))
    return memory_summary(report), ""


def _report(ctx: Context) -> MemoryReport:
    assert ctx.memory_report is not None, "memory rules run only after the estimate"
    return ctx.memory_report


@rule("MEM001")
def does_not_fit(ctx: Context) -> dict[str, Any] | None:
    report = _report(ctx)
    if report.fits:
        return None
    over = report.fit_bytes - report.capacity_bytes  # the figure that decided the fit (memory.fit_figure)
    fitting, tried = fitting_alternatives(ctx)
    if fitting and " + " in fitting[0]:
        fix = (f"no single change fits ({', '.join(tried) or 'no valid neighbour'}); together, "
               + " or ".join(fitting) + (" fits" if len(fitting) == 1 else " fit"))
    elif fitting:
        fix = " or ".join(fitting) + (" fits" if len(fitting) == 1 else " fit")
    else:
        fix = (f"none of the nearby layouts fits ({', '.join(tried) or 'no valid neighbour'}); "
               "more GPUs or `meshplan recommend` are needed")
    return {"peak": gib(report.fit_bytes), "stage": report.peak_stage, "capacity": gib(report.capacity_bytes),
            "over": gib(over), "gpu": ctx.job.gpu.name, "alternatives": fix}


@rule("MEM002")
def low_headroom(ctx: Context) -> dict[str, Any] | None:
    report = _report(ctx)
    minimum = ctx_param(ctx, "MEM002", "min_headroom_fraction")
    if not report.fits or report.headroom_bytes >= minimum * report.capacity_bytes:
        return None
    return {"headroom": gib(report.headroom_bytes), "share": f"{report.headroom_bytes / report.capacity_bytes:.1%}",
            "stage": report.peak_stage, "minimum": f"{minimum:.0%}", "peak": gib(report.peak_bytes)}


# --------------------------------------------------------------------------- computed fixes for MEM001
# Which neighbours the fix tries and how many it names are MEM001's params in cards/rules.yaml (the why says
# why); the cp threshold is CP002's, so the fix never offers a cp that CP002 would then flag.


def _dp_for(ctx: Context, tp: int, pp: int, cp: int, ep: int) -> int | None:
    """The data-parallel size the framework's world-size law gives these degrees, or None if it does not divide."""
    unit = mesh.replica_size(ctx.law, tp, pp, cp, ep)
    return ctx.world // unit if ctx.world % unit == 0 else None


def _candidates(ctx: Context) -> list[tuple[str, Plan]]:
    """Nearby layouts, cheapest first: fewer activations, more sharding, then more model parallelism."""
    p, arch = ctx.plan, ctx.job.model
    step = int(ctx_param(ctx, "MEM001", "degree_factor"))
    max_pp_factor = ctx_param(ctx, "MEM001", "max_pp_factor")
    out: list[tuple[str, dict[str, Any]]] = []
    if p.micro_batch_size > 1:
        out.append(("micro_batch_size=1", {"micro_batch_size": 1}))
    if p.recompute == "none":
        out.append(("recompute=selective", {"recompute": "selective", "recompute_layers": None,
                                            "recompute_method": None}))
    raise_to = framework_card(ctx.framework).memory_fix  # how far this framework's ZeRO may go, and why
    max_zero = p.zero_stage if raise_to.highest_zero_stage is None else raise_to.highest_zero_stage
    if p.pp > 1 and raise_to.highest_zero_stage_with_pp is not None:
        max_zero = min(max_zero, raise_to.highest_zero_stage_with_pp)
    for zero in range(p.zero_stage + 1, max_zero + 1):
        out.append((f"zero_stage={zero}", {"zero_stage": zero}))
    if p.optimizer == "adam" and p.optimizer_state_dtype in (None, "fp32"):  # PR001 drops it where Adam cannot
        out.append(("optimizer_state_dtype=bf16", {"optimizer_state_dtype": "bf16"}))
    pp_factors = [step]  # step, step^2, ... up to max_pp_factor (2 and 4)
    while pp_factors[-1] * step <= max_pp_factor:
        pp_factors.append(pp_factors[-1] * step)
    for factor in pp_factors:
        pp = p.pp * factor
        change: dict[str, Any] = {"pp": pp, "first_stage_layers": None, "last_stage_layers": None, "vpp": 1}
        label = f"pp={pp}"
        # the split the search enumerates for this pp (schedule.pipeline_split): uneven only when pp does not
        # divide the layers
        split = pipeline_split(arch.num_layers, pp) if ctx.backend == "megatron" else None
        if split and split[0] is not None:
            change |= {"first_stage_layers": split[0], "last_stage_layers": split[1]}
            label += f" (first/last stage {split[0]}/{split[1]} layers)"
        out.append((label, change))
    if mesh.tp_fits_domain(p.tp * step, ctx.fast_domain):
        out.append((f"tp={p.tp * step}", {"tp": p.tp * step, "sequence_parallel": True}))
    if arch.moe is not None:
        out.append((f"ep={p.ep * step}", {"ep": p.ep * step}))
    if ctx.job.seq_length >= step * ctx_param(ctx, "CP002", "min_tokens_per_rank"):
        out.append((f"cp={p.cp * step}", {"cp": p.cp * step}))
    if p.recompute != "full":
        out.append(("recompute=full", {"recompute": "full", "recompute_layers": None, "recompute_method": None}))
    # Host offload last, as the slowest steps: the CPU optimizer, then parameters streamed from the host (the
    # framework card's offload section says what each moves and when; the offload rules drop the one it lacks)
    if p.optimizer_offload_fraction < 1.0:
        out.append(("optimizer_offload=true", {"optimizer_offload": True, "optimizer_offload_fraction": 1.0}))
    if not p.param_offload:
        out.append(("param_offload=true", {"param_offload": True}))
    return out


def _neighbour(ctx: Context, change: dict[str, Any]) -> Plan | None:
    """The plan with the change applied and dp re-derived, or None when the degrees do not divide the world."""
    merged = ctx.plan.model_dump() | change
    dp = _dp_for(ctx, merged["tp"], merged["pp"], merged["cp"], merged["ep"])
    if dp is None:
        return None
    return Plan.model_validate(merged | {"dp": dp})


def _combinations(changes: list[tuple[str, dict[str, Any]]], size: int) -> list[tuple[str, dict[str, Any]]]:
    """Every set of `size` neighbours that set different knobs, cheapest first (by its costliest member, then the
    rest): two knobs each too little alone may fit together (tp=2 and full recompute, say)."""
    from itertools import combinations

    ranked = sorted(combinations(range(len(changes)), size), key=lambda idx: sorted(idx, reverse=True))
    out = []
    for idx in ranked:
        parts = [changes[i] for i in idx]
        keys = [set(change) for _, change in parts]
        if any(a & b for n, a in enumerate(keys) for b in keys[n + 1:]):
            continue  # two settings of one knob (pp=2 and pp=4, selective and full recompute)
        merged: dict[str, Any] = {}
        for _, change in parts:
            merged |= change
        out.append((" + ".join(label for label, _ in parts), merged))
    return out


def fitting_alternatives(ctx: Context) -> tuple[list[str], list[str]]:
    """Labels of nearby layouts that pass every structural rule and fit in memory (MEM001's max_alternatives).

    One change at a time first; when none fits, up to MEM001's max_changes changes together, so the fix names a
    layout that works rather than a list of near misses. `tried` keeps the single changes' figures."""
    from meshplan.rl.rollout import job_memory as estimate_memory  # an RL job: the peak over its phases

    known = {f.id for f in check_structure(ctx.job, ctx.plan) if f.severity == "error"}
    limit = ctx_param(ctx, "MEM001", "max_alternatives")
    singles = _candidates(ctx)
    fitting: list[str] = []
    tried: list[str] = []
    for size in range(1, int(ctx_param(ctx, "MEM001", "max_changes")) + 1):
        for label, change in singles if size == 1 else _combinations(singles, size):
            plan = _neighbour(ctx, change)
            # A neighbour may keep the plan's own structural errors (they have their own fixes), not add new ones.
            if plan is None or any(f.severity == "error" and f.id not in known for f in check_structure(ctx.job, plan)):
                continue
            try:
                report = estimate_memory(ctx.job, plan)
            except MeshplanError:
                continue
            host, host_capacity = report.host_bytes_per_node, ctx.job.cpu_memory_per_node
            host_short = host_capacity is not None and host > host_capacity  # MEM003 would refuse it
            if size == 1:  # the figure that decides (memory.fit_figure)
                tried.append(f"{label}: {gib(report.fit_bytes)}"
                             + (f" but {gib(host)} host per node of {gib(host_capacity)}" if host_short else ""))
            if report.fits and not host_short:
                host_note = f", {gib(host)} host per node" if host else ""
                fitting.append(f"{label} ({gib(report.fit_bytes)} peak{host_note})")
                if len(fitting) == limit:
                    return fitting, tried
        if fitting:
            break
    return fitting, tried
