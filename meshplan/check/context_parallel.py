"""CP002, the context-parallel rule that reads the step-time estimate: a cp split whose exchange the estimate does
not hide (the K/V ring's transfers beyond the attention they overlap, Ulysses' all-to-alls, which nothing overlaps).

It reads estimate/context_parallel.cp_time through the step estimate every face prices the plan with
(rl.step_time.job_throughput), so check never tells the user to drop a cp that recommend ranks first for speed (a
fixed tokens-per-rank threshold here said "cannot be hidden, use cp=1" of Llama-3.1-8B's TP1 CP2 DP4 at 4,096 tokens,
where the estimate hides the ring and recommend ranks it first). Its fix is the same estimates at each smaller cp (its
ranks folded into dp, down to cp=1): the fastest that fits where it is faster, else why the cp stays.
"""

from __future__ import annotations

from typing import NamedTuple

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
    fits = ctx.memory_report is None or ctx.memory_report.fits
    return {"cp": plan.cp, "seq": job.seq_length, "chunk": job.seq_length // plan.cp, "exchange": exchange,
            "exposed": f"{exposed:.3g} s", "step": f"{step.step_time_s:.3g} s",
            "share": f"{exposed / step.step_time_s:.1%}",
            "fix": _fewer_ranks(job, plan, step.step_time_s, ulysses, fits)}


class _Smaller(NamedTuple):
    """One smaller cp as the same estimates see it (its cp ranks folded into dp)."""

    plan: Plan
    seconds: float
    fit_bytes: int
    capacity_bytes: int
    fits: bool


def _smaller_cps(job: Job, plan: Plan) -> tuple[list[_Smaller], str]:
    """Each cp dividing the plan's below it, estimated (memory and step time) with the rest of the plan kept; and the
    first refusal met, in words, where one is not estimated (a blocking rule, or an estimate that cannot run)."""
    out, refused = [], ""
    for c in sorted((d for d in range(1, plan.cp) if plan.cp % d == 0), reverse=True):
        trial = plan.model_copy(update={"cp": c, "dp": plan.dp * plan.cp // c})
        try:
            memory = job_memory(job, trial)
            seconds = job_throughput(job, trial).step_time_s
        except EstimateBlocked as exc:
            refused = refused or f"cp {c} breaks {exc.rule_id} ({exc.finding.title})"
            continue
        except MeshplanError as exc:
            refused = refused or f"cp {c} is not estimated ({exc.reason})"
            continue
        keeps = memory.fits and memory.headroom_bytes >= headroom_threshold(job.headroom) * memory.capacity_bytes
        out.append(_Smaller(trial, seconds, memory.fit_bytes, memory.capacity_bytes, keeps))
    return out, refused


def _fewer_ranks(job: Job, plan: Plan, seconds: float, ulysses: bool, fits: bool) -> str:
    """The fix: the fastest smaller cp (down to 1) that fits, where the same estimate predicts it faster; else why the
    plan's cp stays (`fits`: whether the plan itself fits; where not, MEM001 names what does). Only a change it
    recommends is written name=value: check --config turns those into edits of the file (adapters/read/fixes.py)."""
    rank = "`meshplan recommend` ranks every layout on this same estimate"
    smaller, refused = _smaller_cps(job, plan)
    fitting = [s for s in smaller if s.fits]
    if fitting:
        best = min(fitting, key=lambda s: s.seconds)
        if best.seconds < seconds:
            return (f"Use cp={best.plan.cp} (dp={best.plan.dp}): predicted {1 - best.seconds / seconds:.1%} faster "
                    f"({best.seconds:.3g} s a step) and it fits ({gib(best.fit_bytes)}); {rank}.")
        return (f"Keep cp={plan.cp}: the fastest smaller cp that fits (cp {best.plan.cp}, dp {best.plan.dp}) is "
                f"predicted {best.seconds / seconds - 1:.1%} slower ({best.seconds:.3g} s); {rank}.")
    if not smaller:
        return f"Keep cp={plan.cp}: {refused or 'no smaller cp is estimated'}; {rank}."
    least = smaller[-1]  # cp 1: the most memory
    other_ways = "recompute" if ulysses else "TP/SP or recompute"  # the Ulysses engines have no TP
    need = (f"no smaller cp fits at these settings (cp {least.plan.cp}, dp {least.plan.dp} needs "
            f"{gib(least.fit_bytes)} of {gib(least.capacity_bytes)})")
    if not fits:  # MEM001 says what fits; no smaller cp is among it
        return f"Not a smaller cp: {need}; {rank}."
    return f"Keep cp={plan.cp} unless memory is sharded another way ({other_ways}): {need}; {rank}."
