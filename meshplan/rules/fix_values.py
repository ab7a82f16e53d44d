"""Helpers the rules' computed fixes share: the values a fix lists and how it words them, a rule's threshold from
the card (moved out of rules/engine.py, which holds the registry and the kept verdicts)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from meshplan.arithmetic import mesh
from meshplan.arithmetic.mesh import default_global_batch
from meshplan.rules.engine import Context, load_rules, rule_specs
from meshplan.schema.plan import Job

# The rules that hold the global batch against dp (each framework's own law, rules/batch.py): a fix that moves dp (a
# degree, the GPU count) names only values they pass there, or the batch change beside it that they pass (batch_words).
BATCH_RULES = ("BS001", "VL001", "VL003", "VL004", "SK001")
# The world-size rules a degree's fix can bring in (the GPUs no longer tile the new replica, or torchtitan's EP no
# longer divides the ranks it borrows): a fix names values at which those passing now still pass, or the ep beside it.
WORLD_RULES = ("WS001", "WS002", "WS004", "WS005", "WS006")
# What a rule whose fix calls kept_degrees or layout_words reads beside its own fields: the degrees that derive dp,
# the ZeRO stage that picks the engine whose dp the batch rules count, the micro-batch and the batch, and what the
# world-size rules read (hybrid sharding's replicas, an RL job's placement, WS002's words the EP overlap).
BATCH_READS = ("tp", "pp", "cp", "ep", "etp", "dp", "zero_stage", "micro_batch_size", "global_batch_size",
               "dp_replicate", "placement", "rollout_gpus", "moe_a2a_overlap")
BATCH_TRIES = 8  # batches a fix tries each side of the stated one: the nearest multiples of the new micro-batch x dp

# How much a computed fix lists: presentation, not physics (a fix names a few values that work, not all).
LISTED = 6  # values a list in a fix shows at most: the ones nearest the request


def ctx_param(ctx: Context, rule_id: str, name: str) -> float:
    """A threshold from the rule's `params` in the card (its reason is in the rule's `why`)."""
    return rule_specs()[rule_id].params[name]


def divisors(n: int, upto: int | None = None) -> list[int]:
    """Divisors of n in increasing order, optionally only those <= upto."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    out = small + large[::-1]
    return [d for d in out if upto is None or d <= upto]


def fmt_set(values: Iterable[Any], limit: int = 8) -> str:
    """'{1, 2, 4, 8}', shortened to the first and last values when long."""
    items = list(values)
    if not items:
        return "{}"
    if len(items) > limit:
        head = ", ".join(str(v) for v in items[: limit - 2])
        return "{" + f"{head}, ..., {items[-1]}" + "}"
    return "{" + ", ".join(str(v) for v in items) + "}"


def neighbours(value: int, unit: int) -> str:
    """The multiples of `unit` just below and above `value` ('64 or 72')."""
    below = (value // unit) * unit
    above = below + unit
    return f"{below} or {above}" if below > 0 else str(above)


def lcm(*values: int) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


def batch_at(job: Job, mbs: int, dp: int) -> int:
    """The global batch a training job takes at another micro-batch and dp: the request's, else the default the
    resolver derives for them (Job.batch_follows_layout), which a fix that moves dp moves with it (PP003's pp at vpp=2
    on 24 GPUs at micro-batch 2: 1,056 sequences at dp=24 are 1,032 at dp=12, 43 micro-batches, which PP005 refuses,
    where the fix counted 44 of the 1,056)."""
    if not job.batch_follows_layout:
        return job.global_batch_size
    return default_global_batch(job.seq_length, job.num_gpus, mbs, dp)


def rl_batch_fix(ctx: Context, gbs: int, unit: int, mini_batch: bool = False) -> str:
    """The batch a fix names, a multiple of `unit`: an RL job's in its own fields (its batch is prompts_per_step x
    samples_per_prompt, so the prompts step by unit / gcd(unit, samples): 'global_batch_size = 8' at 3 samples a
    prompt named no whole prompts_per_step; `mini_batch`: the stated prompts_per_mini_batch is what was divided), a
    training job's as global_batch_size. The step's size is named in each field the request stated it in
    (step_words): 'prompts_per_step = 64' beside a stated global_batch_size=67 was refused as disagreeing with it, a
    second fix before check passed. No step under a stated mini-batch and no mini-batch over the step, which the
    request would refuse; a mini-batch that must grow past the step names the step with it."""
    if ctx.job.rl is None:
        return f"global_batch_size = {neighbours(gbs, unit)}"
    rl = ctx.job.rl
    n = rl.samples_per_prompt
    step = unit // math.gcd(unit, n)
    least = 1 if mini_batch or rl.prompts_per_mini_batch is None else rl.prompts_per_mini_batch
    below = (gbs // n) // step * step
    prompts = [p for p in (below, below + step) if p >= least] or [-(-least // step) * step]
    if mini_batch:
        within = [p for p in prompts if p <= rl.prompts_per_step]
        if not within:  # SkyRL's policy mini-batch past the step: both grow together
            return f"prompts_per_mini_batch = {prompts[0]} with {step_words(ctx, prompts[0])}"
        return f"prompts_per_mini_batch = {' or '.join(map(str, within))} (x samples_per_prompt {n} = " \
               f"{' or '.join(f'{p * n:,}' for p in within)} sequences)"
    prompts, beside = _steps_kept(ctx, prompts)
    if ctx.job.rl_step_stated == ("prompts_per_step",) or not ctx.job.rl_step_stated:
        return f"prompts_per_step = {' or '.join(map(str, prompts))}{beside} (x samples_per_prompt {n} = " \
               f"{' or '.join(f'{p * n:,}' for p in prompts)} sequences)"
    if ctx.job.rl_step_stated == ("global_batch_size",):
        return f"global_batch_size = {' or '.join(str(p * n) for p in prompts)}{beside} (prompts_per_step " \
               f"{' or '.join(map(str, prompts))} x samples_per_prompt {n})"
    return " or ".join(step_words(ctx, p) for p in prompts) + f"{beside} (x samples_per_prompt {n})"


def _steps_kept(ctx: Context, prompts: list[int]) -> tuple[list[int], str]:
    """Of the steps a batch fix names (`prompts` prompts each), those at which every batch rule passes beside a stated
    prompts_per_mini_batch, with '' beside them; where none does, the first with the mini-batch change the batch rules
    pass there (' with prompts_per_mini_batch = 64', batch_words). VL001's 'prompts_per_step = 64' under a stated
    mini-batch of 32 on verl's FSDP engine over 64 GPUs: 32 sequences over 64 ranks, an empty share (VL004). Without
    a stated mini-batch, all of them: the step rule that names them passes at each."""
    rl = ctx.job.rl
    if rl is None or rl.prompts_per_mini_batch is None:
        return prompts, ""
    at = {p: Context(ctx.job.model_copy(update={"rl": rl.model_copy(update={"prompts_per_step": p}),
                                                "global_batch_size": p * rl.samples_per_prompt}), ctx.plan)
          for p in prompts}
    kept = [p for p in prompts if not refusals_at(at[p], BATCH_RULES)]
    if kept:
        return kept, ""
    words = batch_words(at[prompts[0]])
    return prompts[:1], f" with {words}" if words else ""


def step_words(ctx: Context, prompts: int) -> str:
    """An RL step of `prompts` prompts in the fields the request stated its step in (Job.rl_step_stated; both must
    agree, rl/job.py): 'prompts_per_step = 48', 'global_batch_size = 96' or both joined by 'with'."""
    rl = ctx.job.rl
    assert rl is not None, "an RL job's step"
    said = {"prompts_per_step": f"prompts_per_step = {prompts}",
            "global_batch_size": f"global_batch_size = {prompts * rl.samples_per_prompt}"}
    return " with ".join(said[name] for name in ctx.job.rl_step_stated or ("prompts_per_step",))


def at_layout(ctx: Context, degrees: dict[str, int]) -> Context:
    """The check's context at the plan with `degrees` changed, as the request with that change resolves: the GPU count
    the degrees imply where the request left it out (Job.world_follows_layout), etp with tp where the request left etp
    to follow it (Job.etp_follows_tp), dp derived from it (a dp the request stated is named beside the change:
    layout_words), a default global batch moved with dp (batch_at)."""
    p, job = ctx.plan, ctx.job
    if job.etp_follows_tp and "tp" in degrees and "etp" not in degrees:  # an etp left out is tp's, as resolve sets it
        degrees = {**degrees, "etp": degrees["tp"]}
    d = {"tp": p.tp, "pp": p.pp, "cp": p.cp, "ep": p.ep, "etp": p.etp, **degrees}
    world = ctx.world
    if job.world_follows_layout:
        world = mesh.smallest_world(ctx.law, d["tp"], d["pp"], d["cp"], p.dp if job.dp_stated else 1, d["ep"],
                                    d["etp"])
    dp = mesh.derived_dp(ctx.law, world, d["tp"], d["pp"], d["cp"], d["ep"])
    update: dict[str, Any] = {"num_gpus": world} if world != job.num_gpus else {}
    if world != job.num_gpus:
        job = job.model_copy(update=update)
    gbs = batch_at(job, p.micro_batch_size, dp)
    if gbs != job.global_batch_size:
        job = job.model_copy(update={"global_batch_size": gbs})
    return Context(job, p.model_copy(update={**degrees, "dp": dp}))


def at_world(ctx: Context, world: int) -> Context:
    """The check's context at another trainer GPU count, as the request with num_gpus at it resolves: dp derived from
    it at the plan's degrees, a default global batch moved with dp (batch_at)."""
    p, job = ctx.plan, ctx.job
    dp = mesh.derived_dp(ctx.law, world, p.tp, p.pp, p.cp, p.ep)
    if world != job.num_gpus:
        job = job.model_copy(update={"num_gpus": world})
    gbs = batch_at(job, p.micro_batch_size, dp)
    if gbs != job.global_batch_size:
        job = job.model_copy(update={"global_batch_size": gbs})
    return Context(job, p.model_copy(update={"dp": dp}))


def kept_counts(ctx: Context, counts: list[int]) -> tuple[list[int], str]:
    """Of the GPU counts a world-size fix names, those at which the batch rules pass at the dp each derives, with ''
    beside them; where none does, the first with the batch change they pass there (' with global_batch_size = 8',
    batch_words): WS001's 'num_gpus = 24' at tp=3 and a 1-sequence global batch left dp 8, which BS001 refuses. Reads
    BATCH_READS."""
    kept = [c for c in counts if not refusals_at(at_world(ctx, c), BATCH_RULES)]
    if kept or not counts:
        return kept or counts, ""
    words = batch_words(at_world(ctx, counts[0]))
    return counts[:1], f" with {words}" if words else ""


def refusals_at(at: Context, rule_ids: Iterable[str]) -> list[str]:
    """Those of `rule_ids` the job's framework runs (on the engine at's ZeRO stage selects) that refuse at's plan:
    each rule's own condition, run on it."""
    specs, conditions = rule_specs(), load_rules()
    return [r for r in rule_ids if specs[r].applies_to(at.framework, at.backend) and conditions[r](at)]


def kept_degrees(ctx: Context, degree: str, values: Iterable[int]) -> str:
    """The values of one degree a fix lists ('{2, 4}'): those at which the batch rules pass, dp moved with the degree
    (TP004's 'tp in {1, 2, 4, 8}' applied as tp=1 at global_batch_size=100 on 8 GPUs: BS001 at dp=8), and the
    world-size rules that pass now still do (TP004's tp=2 beside ep=8 on 12 torchtitan GPUs: dp_shard 6, and ep 8
    does not divide dp_shard*tp = 12, WS005); where none does, all of them with the change beside the first
    (layout_words). Reads BATCH_READS."""
    pool = list(values)
    rules = BATCH_RULES + passing_world_rules(ctx)
    kept = [v for v in pool if not refusals_at(at_layout(ctx, {degree: v}), rules)]
    if kept or not pool:
        return fmt_set(kept or pool)
    beside = layout_words(ctx, {degree: pool[0]})
    if not beside:
        return fmt_set(pool)
    return fmt_set(pool) + (f" with {beside}" if len(pool) == 1 else f" ({degree}={pool[0]} with {beside})")


def layout_words(ctx: Context, degrees: dict[str, int]) -> str:
    """What a fix that changes `degrees` names with them so that the request with it passes: the ep at which the
    world-size rules passing now still pass, where they refuse the degrees at the plan's ep (ep_beside); the new dp
    where the request stated one (Job.dp_stated: KempnerForge's 'pp=1' left the file's dp_shard=1, which no longer
    tiled the GPUs, WS006), and the batch change the batch rules pass at the new dp (batch_words); empty where nothing
    must follow. Reads BATCH_READS."""
    ep = ep_beside(ctx, degrees)
    at = at_layout(ctx, degrees | ep)
    words = [f"ep={ep['ep']}"] if ep else []
    words += dp_follows(ctx, at.plan.dp)
    batch = batch_words(at)
    return ", ".join(words + ([batch] if batch else []))


def dp_follows(ctx: Context, dp: int) -> list[str]:
    """['dp=N'] where the request stated its dp (Job.dp_stated: a KempnerForge dp_shard, a ds_config's batch keys) and
    a fix's new degrees leave dp at N, not the plan's: the stated dp kept beside them no longer tiles the GPUs (WS003,
    WS006), so the fix names the one that follows (GPUs / the replica's size). Empty otherwise."""
    return [f"dp={dp}"] if ctx.job.dp_stated and dp != ctx.plan.dp else []


def passing_world_rules(ctx: Context) -> tuple[str, ...]:
    """The world-size rules (WORLD_RULES) the job's framework runs that pass at ctx's plan: those a fix must not
    bring in."""
    refused = set(refusals_at(ctx, WORLD_RULES))
    return tuple(r for r in WORLD_RULES if r not in refused)


def ep_beside(ctx: Context, degrees: dict[str, int]) -> dict[str, int]:
    """{'ep': e}: where the world-size rules passing now refuse the plan with `degrees` changed, the ep nearest the
    plan's at which they pass (a divisor of the expert count; 1 for a dense model, whose ep EP001 refuses anyway);
    empty where they pass, where the fix changes ep itself, or where no ep helps."""
    rules = passing_world_rules(ctx)
    if "ep" in degrees or not refusals_at(at_layout(ctx, degrees), rules):
        return {}
    eps = sorted(divisors(ctx.num_experts) if ctx.num_experts else [1], key=lambda e: (abs(e - ctx.plan.ep), e))
    return next(({"ep": e} for e in eps if e != ctx.plan.ep
                 and not refusals_at(at_layout(ctx, {**degrees, "ep": e}), rules)), {})


def batch_words(at: Context) -> str:
    """The one batch change at which every batch rule passes at at's plan, in the field the request states it in
    (nearest the request's first), or empty where they pass as it is, or where none of the changes tried does. A
    training job's global_batch_size, the nearest multiples of micro-batch x dp; an RL job's stated mini-batch
    (prompts_per_mini_batch, or left out), else its step (step_words)."""
    if not refusals_at(at, BATCH_RULES):
        return ""
    for words, job in _batch_changes(at):
        if not refusals_at(Context(job, at.plan), BATCH_RULES):
            return words
    return ""


def _batch_changes(at: Context):
    """(words, the job with them) of the batch changes batch_words tries, nearest first."""
    job, p = at.job, at.plan
    rl = job.rl
    if rl is None:
        if job.batch_follows_layout:
            return
        unit = p.micro_batch_size * p.dp
        below = job.global_batch_size // unit * unit
        for g in _nearest(below, unit, job.global_batch_size):
            yield f"global_batch_size = {g}", job.model_copy(update={"global_batch_size": g})
        return
    n = rl.samples_per_prompt
    if rl.prompts_per_mini_batch is not None:
        for m in sorted(range(1, rl.prompts_per_step + 1), key=lambda m: (abs(m - rl.prompts_per_mini_batch), m)):
            yield f"prompts_per_mini_batch = {m}", job.model_copy(
                update={"rl": rl.model_copy(update={"prompts_per_mini_batch": m})})
        yield "drop prompts_per_mini_batch", job.model_copy(
            update={"rl": rl.model_copy(update={"prompts_per_mini_batch": None}),
                    "global_batch_size": rl.step_sequences})
    span = at.world * p.micro_batch_size  # the largest unit a step rule divides by (verl's FSDP world, dp x micro)
    least = rl.prompts_per_mini_batch or 1
    steps = sorted(range(least, rl.prompts_per_step + span + 1), key=lambda q: (abs(q - rl.prompts_per_step), q))
    for prompts in steps:
        yield step_words(at, prompts), job.model_copy(
            update={"rl": rl.model_copy(update={"prompts_per_step": prompts}), "global_batch_size": prompts * n})
    if rl.prompts_per_mini_batch is not None:  # both refuse (VL001, VL004 at pp=1 on 64 GPUs): the step, one mini-batch
        for prompts in steps:
            yield f"{step_words(at, prompts)}, drop prompts_per_mini_batch", job.model_copy(update={
                "rl": rl.model_copy(update={"prompts_per_step": prompts, "prompts_per_mini_batch": None}),
                "global_batch_size": prompts * n})


def _nearest(below: int, unit: int, value: int) -> list[int]:
    """Multiples of `unit` nearest `value` (BATCH_TRIES each side, none under one unit), nearest first."""
    near = {below + k * unit for k in range(-BATCH_TRIES, BATCH_TRIES + 1)}
    return sorted((g for g in near if g >= unit), key=lambda g: (abs(g - value), g))
