"""The offload rules (OF001, OF002): what the framework's engine can offload and what its activation offload needs.
Whether the node's host memory holds what is offloaded (MEM003) reads the memory estimate (meshplan/check/memory.py)."""

from __future__ import annotations

from meshplan.arithmetic.offload import unsupported_offloads
from meshplan.rules.engine import Context, Values, rule


@rule("OF001", reads=("zero_stage", "activation_offload", "param_offload", "grad_offload", "optimizer_offload",
      "optimizer_offload_fraction"))
def offload_the_engine_lacks(ctx: Context) -> Values:
    problems = unsupported_offloads(ctx.card, ctx.job, ctx.plan)
    if not problems:
        return None
    knob, why, fix = problems[0]
    if not fix.startswith("Use zero_stage"):  # the card's nearest knob works only with this one off: said first
        fix = f"Set {knob}={'0' if knob == 'optimizer_offload_fraction' else 'false'}; {fix}"
    return {"knob": knob, "framework": ctx.card.display_name, "zero": ctx.plan.zero_stage, "why": why, "fix": fix}


@rule("OF002", reads=("zero_stage", "recompute", "activation_offload"))
def activation_offload_needs_recompute(ctx: Context) -> Values:
    plan = ctx.plan
    if not plan.activation_offload:
        return None
    sem = ctx.card.offload_at(plan.zero_stage)
    if sem is None or not sem.activation_requires or plan.recompute in sem.activation_requires:
        return None
    return {"recompute": plan.recompute, "framework": ctx.card.display_name,
            "what": "the inputs its activation checkpointing keeps", "allowed": "|".join(sem.activation_requires)}
