"""The offload rules (OF001, OF002) and the host-memory rule (MEM003): what the framework's engine can offload,
what its activation offload needs, and whether the node's host memory holds what is offloaded."""

from __future__ import annotations

from typing import Any

from meshplan.arithmetic.offload import offload_card, unsupported_offloads
from meshplan.knowledge.cards import framework_card
from meshplan.rules.engine import Context, gib, rule


@rule("OF001")
def offload_the_engine_lacks(ctx: Context) -> dict[str, Any] | None:
    problems = unsupported_offloads(ctx.framework, ctx.plan)
    if not problems:
        return None
    knob, fix = problems[0]
    card = framework_card(ctx.framework)
    sem = card.offload_at(ctx.plan.zero_stage)
    has = sem is not None and any((sem.activation != "none", sem.param.when != "none", sem.grad.when != "none",
                                   sem.optimizer.when != "none"))
    why = ("it needs a higher zero_stage there" if has and fix.startswith("Use zero_stage")
           else f"the {card.engine_at(ctx.plan.zero_stage)} engine has no such offload")
    return {"knob": knob, "framework": card.display_name, "zero": ctx.plan.zero_stage, "why": why, "fix": fix}


@rule("OF002")
def activation_offload_needs_recompute(ctx: Context) -> dict[str, Any] | None:
    plan = ctx.plan
    if not plan.activation_offload:
        return None
    sem = framework_card(ctx.framework).offload_at(plan.zero_stage)
    if sem is None or not sem.activation_requires or plan.recompute in sem.activation_requires:
        return None
    return {"recompute": plan.recompute, "framework": framework_card(ctx.framework).display_name,
            "what": "the inputs its activation checkpointing keeps", "allowed": "|".join(sem.activation_requires)}


@rule("MEM003")
def host_memory_short(ctx: Context) -> dict[str, Any] | None:
    report = ctx.memory_report
    assert report is not None, "memory rules run only after the estimate"
    capacity = ctx.job.cpu_memory_per_node
    if capacity is None or report.host_bytes_per_node <= capacity:
        return None
    stage = max(report.stages, key=lambda s: s.host_bytes)
    gpus = ctx.job.gpus_per_node
    kinds = {k.removeprefix("host_"): v for k, v in stage.detail.items() if k.startswith("host_")}
    what = ", ".join(f"{k.replace('_', ' ')} {gib(v)}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return {"host": gib(report.host_bytes_per_node), "per_gpu": gib(stage.host_bytes), "stage": stage.stage,
            "gpus": gpus, "what": what, "capacity": gib(capacity), "over": gib(report.host_bytes_per_node - capacity),
            "fix": _host_fix(ctx, stage.host_bytes, kinds, capacity / gpus)}


def _host_fix(ctx: Context, per_gpu: float, kinds: dict[str, int], budget: float) -> str:
    """The largest share of the CPU optimizer (two decimals, rounded down) whose whole offload fits the host, found
    by re-estimating (the share also changes what the phase offloads move); else which offload to drop."""
    from meshplan.estimate.memory import estimate_memory

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
