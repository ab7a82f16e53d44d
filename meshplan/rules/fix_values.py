"""Helpers the rules' computed fixes share: the values a fix lists and how it words them, a rule's threshold from
the card (moved out of rules/engine.py, which holds the registry and the kept verdicts)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from meshplan.arithmetic.mesh import default_global_batch
from meshplan.rules.engine import Context, rule_specs
from meshplan.schema.plan import Job

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
    if ctx.job.rl_step_stated == ("prompts_per_step",) or not ctx.job.rl_step_stated:
        return f"prompts_per_step = {' or '.join(map(str, prompts))} (x samples_per_prompt {n} = " \
               f"{' or '.join(f'{p * n:,}' for p in prompts)} sequences)"
    if ctx.job.rl_step_stated == ("global_batch_size",):
        return f"global_batch_size = {' or '.join(str(p * n) for p in prompts)} (prompts_per_step " \
               f"{' or '.join(map(str, prompts))} x samples_per_prompt {n})"
    return " or ".join(step_words(ctx, p) for p in prompts) + f" (x samples_per_prompt {n})"


def step_words(ctx: Context, prompts: int) -> str:
    """An RL step of `prompts` prompts in the fields the request stated its step in (Job.rl_step_stated; both must
    agree, rl/job.py): 'prompts_per_step = 48', 'global_batch_size = 96' or both joined by 'with'."""
    rl = ctx.job.rl
    assert rl is not None, "an RL job's step"
    said = {"prompts_per_step": f"prompts_per_step = {prompts}",
            "global_batch_size": f"global_batch_size = {prompts * rl.samples_per_prompt}"}
    return " with ".join(said[name] for name in ctx.job.rl_step_stated or ("prompts_per_step",))
