"""MEM001's and MEM002's fix: the nearby layouts (a smaller micro-batch, recompute, more ZeRO, more pp/tp/ep/cp,
host offload) re-estimated, and those that pass every structural rule and fit (MEM002: leaving its share free) named,
one change at a time, else a few together.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, NamedTuple

from meshplan.arithmetic import mesh
from meshplan.arithmetic.schedule import model_pipeline_split
from meshplan.check.config import check_structure
from meshplan.check.split import fastest_split, split_words
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib
from meshplan.rl.memory import job_memory
from meshplan.rules.engine import Context
from meshplan.rules.fix_values import ctx_param, dp_follows
from meshplan.schema.plan import Plan

# Which neighbours the fix tries and how many it names are MEM001's params in cards/rules.yaml (the why says
# why), the cp threshold among them (the decision tables' CP-from-8K row: a cp neighbour only where each rank keeps
# cp_min_tokens_per_rank).


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
    for zero in range(p.zero_stage + 1, highest_zero_stage(ctx) + 1):
        out.append((f"zero_stage={zero}", {"zero_stage": zero}))
    if p.optimizer == "adam" and p.optimizer_state_dtype in (None, "fp32"):  # PR001 drops it where Adam cannot
        out.append(("optimizer_state_dtype=bf16", {"optimizer_state_dtype": "bf16"}))
    pp_factors = [step]  # step, step^2, ... up to max_pp_factor (2 and 4)
    while pp_factors[-1] * step <= max_pp_factor:
        pp_factors.append(pp_factors[-1] * step)
    for factor in pp_factors:
        pp = p.pp * factor
        out.append(_deeper_pipeline(ctx, pp))
    if mesh.tp_fits_domain(p.tp * step, ctx.fast_domain):
        out.append(_wider_tp(ctx, p.tp * step))
    if arch.moe is not None:
        out.append((f"ep={p.ep * step}", {"ep": p.ep * step}))
    if ctx.job.seq_length >= step * ctx_param(ctx, "MEM001", "cp_min_tokens_per_rank"):
        out.append((f"cp={p.cp * step}", {"cp": p.cp * step}))
    if p.recompute != "full":
        out.append(("recompute=full", {"recompute": "full", "recompute_layers": None, "recompute_method": None}))
    # Host offload last, as the slowest steps: the CPU optimizer, then parameters streamed from the host (the
    # framework card's offload section says what each moves and when; the offload rules drop the one it lacks)
    out.extend(_cpu_optimizer(ctx))
    if not p.param_offload:
        out.append(("param_offload=true", {"param_offload": True}))
    return out


def _wider_tp(ctx: Context, tp: int) -> tuple[str, dict[str, Any]]:
    """The tp neighbour, named so that the request with it resolves to it (request/resolve.py): an MoE model's expert
    TP kept, and named beside tp where the framework would otherwise split the experts over the new tp (Megatron-Core's
    etp = tp default: SkyRL, Megatron-Bridge); sequence parallelism as the plan has it, or from tp=1 as the card's
    defaults turn it on with tp (DeepSpeed runs none), named where it turns on (a file at tp=1 often states it off)."""
    p, defaults = ctx.plan, ctx.card.defaults
    sp = p.sequence_parallel or (p.tp == 1 and defaults.sequence_parallel_with_tp(ctx.job.model, p.pp))
    label = f"tp={tp}"
    if ctx.job.model.is_moe and defaults.etp == "tp" and p.etp != tp:
        label += f", etp={p.etp}"
    if sp and not p.sequence_parallel:
        label += ", sequence_parallel=true"
    return label, {"tp": tp, "sequence_parallel": sp}


def _cpu_optimizer(ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """The optimizer stepped on the CPU, in the knob the framework steps it with (its card's offload section): the
    optimizer offload where it acts inside the step (Megatron-Core's CPU optimizer, DeepSpeed's offload_optimizer);
    where that knob moves the optimizer between an RL step's phases (verl, SkyRL), the in-step share,
    optimizer_offload_fraction, and in an RL job the phase offload beside it as its own neighbour."""
    p = ctx.plan
    semantics = ctx.card.offload_at(p.zero_stage)
    if semantics is None or semantics.optimizer.when != "phase":
        return [("optimizer_offload=true", {"optimizer_offload": True, "optimizer_offload_fraction": 1.0})] \
            if p.optimizer_offload_fraction < 1.0 else []
    out: list[tuple[str, dict[str, Any]]] = []
    if semantics.optimizer_fraction == "in_step" and p.optimizer_offload_fraction < 1.0:
        out.append(("optimizer_offload_fraction=1.0", {"optimizer_offload_fraction": 1.0}))
    if ctx.job.rl is not None and not p.optimizer_offload:
        out.append(("optimizer_offload=true", {"optimizer_offload": True}))
    return out


def highest_zero_stage(ctx: Context) -> int:
    """How far a fix may raise the plan's ZeRO stage on its framework (the card's memory_fix, which says why)."""
    p, raise_to = ctx.plan, ctx.card.memory_fix
    highest = p.zero_stage if raise_to.highest_zero_stage is None else raise_to.highest_zero_stage
    if p.pp > 1 and raise_to.highest_zero_stage_with_pp is not None:
        highest = min(highest, raise_to.highest_zero_stage_with_pp)
    return max(highest, p.zero_stage)


def _deeper_pipeline(ctx: Context, pp: int) -> tuple[str, dict[str, Any]]:
    """The pp neighbour without interleaving, with the split recommend ranks first for it (split.fastest_split, the
    function PP001's fix names its split with), else the split the search enumerates first for that pp
    (schedule.pipeline_split: uneven only when pp does not divide the layers); sequence parallelism off where the
    framework runs its pipeline stages without it (KempnerForge), as the request with that pp resolves."""
    change: dict[str, Any] = {"pp": pp, "first_stage_layers": None, "last_stage_layers": None, "vpp": 1,
                              "pipeline_layout": None, "account_for_embedding": False, "account_for_loss": False,
                              "sequence_parallel": ctx.plan.sequence_parallel
                              and ctx.card.defaults.sequence_parallel_in_pipeline(pp)}
    plan = _neighbour(ctx, change)
    fastest = fastest_split(ctx.job, plan) if plan is not None and pp <= ctx.job.model.num_layers else None
    words = None
    if fastest is not None:
        change |= {k: getattr(fastest, k) for k in SPLIT_FIELDS}
        words = None if split_words(fastest) == "the even split" else split_words(fastest)
    elif (split := model_pipeline_split(ctx.job.model, pp) if ctx.backend == "megatron" else None) and \
            split[0] is not None:
        change |= {"first_stage_layers": split[0], "last_stage_layers": split[1]}
        words = f"first_stage_layers={split[0]}, last_stage_layers={split[1]}"
    return _pipeline_label(ctx.plan, pp, change, words), change


SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers", "pipeline_layout", "account_for_embedding",
                "account_for_loss")


def _pipeline_label(plan: Plan, pp: int, change: dict[str, Any], words: str | None) -> str:
    """The deeper pipeline in the fields it changes: the plan's own split or vpp kept beside pp=4 could break the
    rules (first_stage_layers=31 leaves 1 layer for 3 stages), so the ones it clears are named (`drop x`, vpp=1)."""
    label = f"pp={pp}" + (", vpp=1" if plan.vpp > 1 else "")
    dropped = [f"drop {name}" for name in SPLIT_FIELDS
               if getattr(plan, name) not in (None, False) and change[name] in (None, False)]
    said = ([words] if words else []) + dropped
    return f"{label} ({', '.join(said)})" if said else label


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


def fitting_alternatives(ctx: Context, keep: float = 0.0) -> tuple[list[str], list[str]]:
    """Labels of nearby layouts that pass every structural rule and fit in memory (MEM001's max_alternatives), each
    with its estimated peak; with `keep`, a share of the GPU's memory, only those that also leave it free, named
    with the share they leave (MEM002's fix: a layout, not a direction such as 'a larger tp').

    One change at a time first; when none fits, up to MEM001's max_changes changes together, so the fix names a
    layout that works rather than a list of near misses. `tried` keeps the single changes' figures."""
    known = plan_errors(ctx)
    limit = ctx_param(ctx, "MEM001", "max_alternatives")
    singles = _candidates(ctx)
    fitting: list[str] = []
    tried: list[str] = []
    for size in range(1, int(ctx_param(ctx, "MEM001", "max_changes")) + 1):
        for label, change in singles if size == 1 else _combinations(singles, size):
            found = judged(ctx, label, change, keep, known)
            if found is None:
                continue
            if size == 1:
                tried.append(found.tried)
            if found.fitting is not None:
                fitting.append(found.fitting)
                if len(fitting) == limit:
                    return fitting, tried
        if fitting:
            break
    return fitting, tried


class Judged(NamedTuple):
    """A neighbour's estimate as a fix words it: its figure ('pp=2: 81.3 GiB'), and where it fits (and keeps the
    share asked) its label with its peak ('pp=2 (75.0 GiB peak)'), else None."""

    tried: str
    fitting: str | None


def plan_errors(ctx: Context) -> set[str]:
    """The structural errors the plan has already: a neighbour may keep them (they have their own fixes)."""
    return {f.id for f in check_structure(ctx.job, ctx.plan) if f.severity == "error"}


def judged(ctx: Context, label: str, change: dict[str, Any], keep: float = 0.0,
           known: set[str] | None = None) -> Judged | None:
    """The plan with `change` (_neighbour) estimated as MEM001's and MEM002's fixes name it: None where the degrees do
    not tile the GPUs, it adds a structural error the plan has not (`known`, plan_errors) or it cannot be estimated;
    it fits where its figure (memory.fit_figure) is within the budget, the host holds its offload (MEM003), an RL
    job's rollout engine holds a sequence (RL006) and it leaves `keep` of the GPU free (named with the share it
    leaves)."""
    plan = _neighbour(ctx, change)
    known = plan_errors(ctx) if known is None else known
    if plan is None or any(f.severity == "error" and f.id not in known for f in check_structure(ctx.job, plan)):
        return None
    try:
        report = job_memory(ctx.job, plan)  # an RL job: the peak over its phases
    except MeshplanError:
        return None
    host, host_capacity = report.host_bytes_per_node, ctx.job.cpu_memory_per_node
    host_short = host_capacity is not None and host > host_capacity  # MEM003 would refuse it
    # an RL job's rollout engine left no KV cache for one sequence: vLLM and SGLang refuse to start (RL006)
    starved = report.rollout_starved
    tried = f"{label}: {gib(report.fit_bytes)}" + (
        f" but {gib(host)} host per node of {gib(host_capacity)}" if host_short else "") + (
        " but the rollout engine holds no sequence" if starved else "")
    if not report.fits or host_short or starved or report.headroom_bytes < keep * report.capacity_bytes:
        return Judged(tried, None)
    host_note = f", {gib(host)} host per node" if host else ""
    free = f", {report.headroom_bytes / report.capacity_bytes:.0%} free" if keep else ""
    return Judged(tried, f"{_with_dp(ctx, label, plan)} ({gib(report.fit_bytes)} peak{free}{host_note})")


def _with_dp(ctx: Context, label: str, plan: Plan) -> str:
    """The label with the dp the neighbour's degrees leave (fix_values.dp_follows, what KF001's pp=1 names) where the
    request stated its dp: MEM001's 'tp=2' on a ds_config stating dp 8 through its batch keys named no dp, the file's
    kept beside tp 2 on 8 GPUs. Written after the last change's values, before its parenthetical (`pp=2, dp=4 (drop
    vpp)`), so the combined changes' dp follows them all."""
    words = dp_follows(ctx, plan.dp)
    if not words:
        return label
    head, sep, said = label.rpartition(" + ")
    values, paren, rest = said.partition(" (")
    return f"{head}{sep}{values}, {words[0]}{paren}{rest}"
