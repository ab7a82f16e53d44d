"""The RL rollout rules of cards/rules.yaml (RL*): the rollout engine's layout against the framework's own checks.

Each condition returns None when its rule passes (or the job is not an RL job), else the numbers for the card's
message and fix templates; the facts they test are in the framework cards' `rl` sections (meshplan/rl/rollout.py).
"""

from __future__ import annotations

from typing import Any

from meshplan.arithmetic import mesh
from meshplan.rl.rollout import rl_card
from meshplan.rules.engine import Context, divisors, fmt_set, neighbours, rule

Values = dict[str, Any] | None


@rule("RL001")
def rollout_ep_is_tp_dp(ctx: Context) -> Values:
    p, card = ctx.plan, rl_card(ctx.framework)
    if p.rollout_ep is None or card is None or not card.ep_equals_tp_dp or p.rollout_ep == 1:
        return None
    tp, dp = p.rollout_tp, p.rollout_dp
    if p.rollout_ep == tp * dp:
        return None
    dp_fix = p.rollout_ep // tp if p.rollout_ep % tp == 0 else dp
    return {"ep": p.rollout_ep, "tp": tp, "dp": dp, "product": tp * dp, "framework": ctx.framework,
            "dp_fix": dp_fix, "ep_one": ", or rollout_ep=1 (experts sharded by the rollout TP)"}


@rule("RL002")
def rollout_replicas_whole(ctx: Context) -> Values:
    p = ctx.plan
    if p.rollout_gpus is None:
        return None
    size = p.rollout_tp * p.rollout_dp
    if p.rollout_gpus % size == 0:
        return None
    return {"gpus": p.rollout_gpus, "tp": p.rollout_tp, "dp": p.rollout_dp, "size": size,
            "working": fmt_set(divisors(p.rollout_gpus, upto=max(size * 4, 8))[-6:]),
            "near": neighbours(p.rollout_gpus, size)}


@rule("RL003")
def colocated_spans_trainer(ctx: Context) -> Values:
    p, card = ctx.plan, rl_card(ctx.framework)
    if p.placement != "colocated" or card is None or not card.colocated_gpus_equal_training:
        return None
    if p.rollout_gpus == ctx.world:
        return None
    return {"gpus": p.rollout_gpus, "trainer": ctx.world, "framework": ctx.framework}


@rule("RL004")
def rollout_tp_in_node(ctx: Context) -> Values:
    p = ctx.plan
    if p.rollout_tp is None:
        return None
    domain = mesh.fast_domain(ctx.job.gpu, ctx.job.gpus_per_node)
    if p.rollout_tp <= domain:
        return None
    gpu = ctx.job.gpu
    return {"tp": p.rollout_tp, "domain": domain, "net": f"{gpu.network_bandwidth / 1e9:.0f}",
            "intra": f"{gpu.intra_node_bandwidth / 1e9:.0f}", "working": fmt_set(divisors(domain))}


def phase_knobs(framework: str, plan) -> list[str]:
    """The offload knobs that move state to the host between RL phases on this framework's engine (its card)."""
    from meshplan.knowledge.cards import framework_card

    sem = framework_card(framework).offload_at(plan.zero_stage)
    if sem is None:
        return []
    return [f"{name}_offload" for name, knob in (("param", sem.param), ("grad", sem.grad), ("optimizer", sem.optimizer))
            if knob.when == "phase"]


@rule("RL005")
def rl_phase_fits(ctx: Context) -> Values:
    report = ctx.memory_report
    if report is None or not report.phases or report.fits:
        return None
    from meshplan.arithmetic.offload import offload_plan

    gib = 1 << 30
    top = next(p for p in report.phases if p.phase == report.peak_phase)
    d, plan, capacity = top.detail, ctx.plan, report.capacity_bytes
    over = top.peak_bytes - capacity
    parts = ", ".join(f"{k.replace('_', ' ')} {v / gib:.1f} GiB" for k, v in d.items()
                      if k != "sequences_at_once" and v)
    phase_off = offload_plan(ctx.framework, plan).phase
    if top.phase == "rollout" and top.pool == "trainer":
        fixes = []
        knobs = phase_knobs(ctx.framework, plan)
        if d.get("trainer_resident", 0) and not phase_off and knobs:
            fixes.append(f"{' and '.join(knobs)} move the trainer's {d['trainer_resident'] / gib:.1f} GiB to the "
                         "host during the rollout")
        if d.get("reference_resident", 0):
            fixes.append(f"param_offload also moves the reference model's {d['reference_resident'] / gib:.1f} GiB")
        fraction = plan.rollout_memory_fraction - over / capacity
        if fraction * capacity > d.get("engine_weights", 0):
            fixes.append(f"rollout_memory_fraction {fraction:.2f} (the KV cache shrinks to "
                         f"{max(0, d.get('kv_cache', 0) - over) / gib:.1f} GiB)")
        fixes.append(f"rollout_tp {plan.rollout_tp * 2} halves the engine's weights")
        fix = "; or ".join(fixes) + "."
    elif top.phase == "rollout":
        fix = (f"rollout_tp {plan.rollout_tp * 2} (the engine's weights {d.get('engine_weights', 0) / gib:.1f} GiB "
               "halve), or a lower rollout_memory_fraction.")
    elif top.phase == "log_prob":
        fix = ("param_offload (the reference and the actor take turns on the GPU), or a smaller micro_batch_size for "
               "the forward passes.")
    else:
        fix = ("The update's peak is the training step's: phase offloads do not lower it; use "
               "optimizer_offload_fraction (the in-step CPU optimizer), recompute, a larger pp or ep, or more GPUs "
               "(`meshplan recommend`).")
    return {"phase": top.phase, "peak": f"{top.peak_bytes / gib:.1f} GiB", "capacity": f"{capacity / gib:.1f} GiB",
            "pool": top.pool, "parts": parts, "over": f"{over / gib:.1f} GiB", "fix": fix}
