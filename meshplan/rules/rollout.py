"""The structural RL rollout rules of cards/rules.yaml (RL001-RL003, RL007): the rollout engine's layout against the
framework's own checks; RL008, a group-relative algorithm over one response per prompt. RL004 (rollout TP across
nodes, whose fix names only the sizes whose engine holds the weights) and RL005, whether each RL phase fits, read the
memory estimate (meshplan/check/memory.py).

Each condition returns None when its rule passes (or the job is not an RL job), else the numbers for the card's
message and fix templates; the facts they test are in the framework cards' `rl` sections
(meshplan/knowledge/rl_card.py).
"""

from __future__ import annotations

from meshplan.knowledge.cards import FrameworkCard
from meshplan.rules.engine import Context, Values, rule
from meshplan.rules.fix_values import divisors, fmt_set, neighbours
from meshplan.schema.plan import Plan


@rule("RL001", reads=("rollout_tp", "rollout_dp", "rollout_ep"))
def rollout_ep_is_tp_dp(ctx: Context) -> Values:
    p, card = ctx.plan, ctx.rl_card
    if p.rollout_ep is None or card is None or not card.ep_equals_tp_dp or p.rollout_ep == 1:
        return None
    tp, dp = p.rollout_tp, p.rollout_dp
    if tp is None or dp is None or p.rollout_ep == tp * dp:  # None: the rollout layout is not chosen yet
        return None
    # the largest TP up to the engine's that divides the EP, and the DP that makes their product it (with the engine's
    # own TP where it divides; else keeping TP named the layout refused: 'rollout_dp=2 with rollout_tp=3' for EP 4)
    tp_fix = max(t for t in range(1, tp + 1) if p.rollout_ep % t == 0)
    return {"ep": p.rollout_ep, "tp": tp, "dp": dp, "product": tp * dp, "framework": ctx.framework,
            "dp_fix": p.rollout_ep // tp_fix, "tp_fix": tp_fix,
            "ep_one": ", or rollout_ep=1 (experts sharded by the rollout TP)"}


@rule("RL007", reads=("rollout_engine", "rollout_tp", "rollout_dp", "rollout_ep"))
def rollout_ep_needs_experts(ctx: Context) -> Values:
    """An engine that checks the model when its expert parallelism is on (the card's ep_needs_experts: vLLM) refuses
    rollout EP > 1 on a dense model."""
    p, card = ctx.plan, ctx.rl_card
    if p.rollout_ep is None or p.rollout_ep == 1 or card is None or ctx.job.model.is_moe:
        return None
    facts = card.engines.get(p.rollout_engine) if p.rollout_engine is not None else None
    if facts is None or not facts.ep_needs_experts:
        return None
    return {"ep": p.rollout_ep, "model": ctx.job.model.name, "framework": ctx.framework, "engine": p.rollout_engine,
            "tp": p.rollout_tp, "dp": p.rollout_dp}


@rule("RL008", reads=())
def one_response_group(ctx: Context) -> Values:
    """GRPO and DAPO over samples_per_prompt 1: the job's workload alone decides it, never the layout."""
    rl = ctx.job.rl
    if rl is None or rl.samples_per_prompt != 1 or rl.algorithm not in ("grpo", "dapo"):
        return None
    return {"algorithm": rl.algorithm.upper(), "framework": ctx.framework}


@rule("RL002", reads=("rollout_tp", "rollout_dp", "rollout_gpus", "placement"))
def rollout_replicas_whole(ctx: Context) -> Values:
    """The fix names other rollout_gpus only for an engine on GPUs of its own: a colocated one spans exactly the
    trainer's (RL003), so '6 or 9' of 8 GPUs was a fix that rule refuses."""
    p, card = ctx.plan, ctx.rl_card
    if p.rollout_gpus is None or p.rollout_tp is None or p.rollout_dp is None:  # not chosen yet
        return None
    size = p.rollout_tp * p.rollout_dp
    if p.rollout_gpus % size == 0:
        return None
    fixed = p.placement == "colocated" and card is not None and card.colocated_gpus_equal_training
    return {"gpus": p.rollout_gpus, "tp": p.rollout_tp, "dp": p.rollout_dp, "size": size,
            "working": fmt_set(divisors(p.rollout_gpus, upto=max(size * 4, 8))[-6:]),
            "or_gpus": "" if fixed else f", or rollout_gpus {neighbours(p.rollout_gpus, size)}"}


@rule("RL003", reads=("placement", "rollout_gpus"))
def colocated_spans_trainer(ctx: Context) -> Values:
    p, card = ctx.plan, ctx.rl_card
    if p.placement != "colocated" or card is None or not card.colocated_gpus_equal_training:
        return None
    if p.rollout_gpus is None or p.rollout_gpus == ctx.world:
        return None
    return {"gpus": p.rollout_gpus, "trainer": ctx.world, "framework": ctx.framework}


def phase_knobs(card: FrameworkCard, plan: Plan) -> list[str]:
    """The offload knobs that move state to the host between RL phases on this framework's engine (its card)."""
    sem = card.offload_at(plan.zero_stage)
    if sem is None:
        return []
    return [f"{name}_offload" for name, knob in (("param", sem.param), ("grad", sem.grad), ("optimizer", sem.optimizer))
            if knob.when == "phase"]
