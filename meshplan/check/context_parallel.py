"""CP002, the context-parallel rule that reads the step-time estimate: a cp split whose exchange the estimate does
not hide (the K/V ring's transfers beyond the attention they overlap, Ulysses' all-to-alls, which nothing overlaps).

It reads estimate/context_parallel.cp_time through the step estimate every face prices the plan with
(rl.step_time.job_throughput), so check never tells the user to drop a cp that recommend ranks first for speed (a
fixed tokens-per-rank threshold here said "cannot be hidden, use cp=1" of Llama-3.1-8B's TP1 CP2 DP4 at 4,096 tokens,
where the estimate hides the ring and recommend ranks it first). Its fix is the same estimate at cp=1 (cp folded into
dp): faster and fitting, slower, or not fitting.
"""

from __future__ import annotations

from meshplan.check.split import headroom_threshold
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib
from meshplan.rl.memory import job_memory
from meshplan.rl.step_time import job_throughput
from meshplan.rules.context import runs_ulysses
from meshplan.rules.engine import Context, EstimateBlocked, Values, rule
from meshplan.schema.plan import Job, Plan


@rule("CP002")
def cp_exchange_exposed(ctx: Context) -> Values:
    """Where the engine's cp is Ulysses (verl's and SkyRL's FSDP engines, the card's engine.ulysses) the traffic is
    its all-to-alls, which nothing hides."""
    job, plan = ctx.job, ctx.plan
    if plan.cp == 1:
        return None
    try:
        step = job_throughput(job, plan)
    except (EstimateBlocked, MeshplanError):  # already a finding, or said by the memory note
        return None
    exposed = step.breakdown.cp_comm_s
    if exposed <= 0:
        return None
    ulysses = runs_ulysses(job.card, plan.zero_stage)
    exchange = ("Ulysses' all-to-alls of q, k, v and the output (nothing overlaps them)" if ulysses else
                "the exchange of K/V chunks behind the attention")
    return {"cp": plan.cp, "seq": job.seq_length, "chunk": job.seq_length // plan.cp, "exchange": exchange,
            "exposed": f"{exposed:.3g} s", "step": f"{step.step_time_s:.3g} s",
            "share": f"{exposed / step.step_time_s:.1%}", "fix": _without_cp(job, plan, step.step_time_s, ulysses)}


def _without_cp(job: Job, plan: Plan, seconds: float, ulysses: bool) -> str:
    """What the same estimate says of the plan at cp=1 (its cp ranks become data-parallel ones)."""
    single = plan.model_copy(update={"cp": 1, "dp": plan.dp * plan.cp})
    label = f"cp=1 (dp={single.dp})"
    rank = "`meshplan recommend` ranks every layout on this same estimate"
    try:
        memory = job_memory(job, single)
        other = job_throughput(job, single).step_time_s
    except EstimateBlocked as exc:
        return f"Keep cp={plan.cp}: {label} breaks {exc.rule_id} ({exc.finding.title}); {rank}."
    except MeshplanError as exc:
        return f"Keep cp={plan.cp}: {label} is not estimated ({exc.reason}); {rank}."
    if not memory.fits or memory.headroom_bytes < headroom_threshold(job.headroom) * memory.capacity_bytes:
        other_ways = "a smaller cp or recompute" if ulysses else "a smaller cp, TP/SP or recompute"  # no TP there
        return (f"{label} does not fit at these settings ({gib(memory.fit_bytes)} of {gib(memory.capacity_bytes)}): "
                f"shard memory another way ({other_ways}) or keep cp={plan.cp}; {rank}.")
    if other < seconds:
        return (f"Use {label}: predicted {1 - other / seconds:.1%} faster ({other:.3g} s a step) and it fits "
                f"({gib(memory.fit_bytes)}); {rank}.")
    return f"Keep cp={plan.cp}: {label} is predicted {other / seconds - 1:.1%} slower ({other:.3g} s a step); {rank}."
