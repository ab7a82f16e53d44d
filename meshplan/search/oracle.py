"""The exhaustive oracle: every plan of the space estimated by brute force, no bounds, no pruning, none of the search's
caches (a plan's fit and peak are asked of memory.memory_fit, estimate_memory's own verdict and figures, stopping at the
first stage over, test_memory_fit). The estimates run inside one shared_layers scope, as recommend's do: the cost
model's own memos of its exact sub-results (a layer's time, a layout's memory terms, a stage's states and fit:
layer_records.scope_memo, each held bit for bit to the unscoped estimate by its own test, test_layer_memo,
test_memory_memo, test_stage_memo), so a plan's memory_fit and throughput (whose offload time estimates the memory
again) share them; and each blocking rule's verdict is kept per what the rule declares it reads (rules/engine.py
Verdicts.passes, in a Verdicts of the oracle's own, none of the search's). The best-first search must return the same
top K (tests/test_search.py); it is slow, so only small jobs call it."""

from __future__ import annotations

from typing import NamedTuple

from meshplan.estimate.layer_records import shared_layers
from meshplan.rules.engine import Verdicts
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search.engine import BestFirstSearch
from meshplan.search.estimators import default_engine
from meshplan.search.job import search_job
from meshplan.search.policy import headroom_for, heavier_twin, memory_budget, same_numbers
from meshplan.search.space import Fixed, Layout, enumerate_layouts, micro_batches, request_zeros, within_nvlink
from meshplan.search.zero_stages import offered_before


class OracleRow(NamedTuple):
    """One distinct row of the exhaustive answer: the fastest plan with these predicted numbers."""

    step_time_s: float
    peak_bytes: int
    plan: Plan


def exhaustive_top_k(req: Request, top_k: int) -> list[OracleRow]:
    """The top K distinct rows of every plan with TP inside the NVLink domain, or, where none of those fits, of every
    plan with TP across it (the search's two tiers, engine.run_search): each passes the structural rules, peaks within
    the request's headroom, leaves what it offloads within the host's cpu_memory_per_node (MEM003), and is timed. A
    plan is left out when the same layout fits with less recompute (the search calls it dominated: strictly slower,
    same choice); plans with the same predicted step time and peak memory are one row, as in the search's answer.
    Every ZeRO stage the request leaves open is tried, the stages the search leaves out of its ladder too
    (zero_stages.search_ladder), so a stage left out that some plan could take shows as a miss. A plan at a stage
    that is one plan with a stage offered before it at its layout (zero_stages.offered_before: Megatron's ZeRO 0 and
    1 at dp x cp 1) is left out where the rules pass that stage, as the search leaves it out; so is a plan whose twin
    at another ZeRO stage (the same layout, micro-batch and recompute) is timed the same or faster with a lower peak
    (policy.heavier_twin: Megatron-FSDP beside the distributed optimizer at dp x cp 1), as the search does."""
    with shared_layers():  # the cost model's memos (module docstring), dropped on return
        job, _ = search_job(req)
        fixed = Fixed.from_request(req, job)
        space = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), top_k)  # its knobs, plan building
        layouts, _ = enumerate_layouts(job, fixed)
        inside = [lay for lay in layouts if within_nvlink(job, lay)]
        rows = _rows(req, space, inside) or _rows(req, space, [lay for lay in layouts if not within_nvlink(job, lay)])
    return sorted(rows.values(), key=lambda r: (r.step_time_s, r.peak_bytes))[:top_k]  # as answer.rows orders


def _rows(req: Request, space: BestFirstSearch, layouts: list[Layout]) -> dict[tuple[float, int], OracleRow]:
    """exhaustive_top_k's distinct rows of these layouts, by brute force."""
    job, engine, fixed = space.job, space.engine, space.fixed
    budget = memory_budget(job, headroom_for(req))
    host = job.cpu_memory_per_node
    rows: dict[tuple[float, int], OracleRow] = {}
    verdicts = Verdicts(job)  # its own kept verdicts, not the search's (rules/engine.verdicts)
    fit = engine.memory_fit
    zeros = request_zeros(job.card, fixed)  # every stage the request leaves open, not the search's ladder
    for lay in layouts:
        first = space.plan(lay, zeros[0], space.recomputes[0], 1)
        before = {zero: offered_before(job, first.copied({"zero_stage": zero}), zeros) for zero in zeros}
        for mbs in micro_batches(job, lay, fixed):
            timed: list[tuple[str, OracleRow]] = []  # the layout's plans at this micro-batch, per ZeRO stage
            for zero in zeros:
                for recompute in space.recomputes:
                    plan = space.plan(lay, zero, recompute, mbs)
                    if not verdicts.passes(job, plan):
                        continue
                    # one plan with a stage offered before it that the rules pass here: that stage's row is its own
                    if any(verdicts.passes(job, space.plan(lay, other, recompute, mbs)) for other in before[zero]):
                        continue
                    # memory_fit: estimate_memory's verdict, stopping at the first stage over; `checked`: the check
                    # above found no structural error, so no blocking rule (require_estimable) is asked again. A
                    # complete verdict read every stage: the report's fit_bytes <= budget, host_bytes_per_node <= host
                    # and its peak_bytes, exactly (test_memory_fit), so the report itself is not built
                    if fit is not None:
                        verdict = fit(job, plan, budget, host, checked=True)
                        if not verdict.complete:
                            continue
                        peak = verdict.peak
                    else:
                        memory = engine.memory(job, plan)
                        if memory.fit_bytes > budget:  # what decides the fit (memory.fit_figure), as the search
                            continue
                        if host is not None and memory.host_bytes_per_node > host:  # rule MEM003, as `check` does
                            continue
                        peak = memory.peak_bytes
                    row = OracleRow(engine.throughput(job, plan).step_time_s, peak, plan)
                    twin = space.plain_twin(lay, zero, recompute, mbs)  # the EP overlap's schedule may be slower
                    if twin is not None and (plain := engine.throughput(job, twin).step_time_s) < row.step_time_s:
                        row = OracleRow(plain, peak, twin)
                    timed.append((recompute, row))
                    break  # heavier recompute of the same plan is dominated
            for recompute, row in timed:
                # its twin at another ZeRO stage timed the same or faster with a lower peak: left out as the search does
                if any(r == recompute and heavier_twin(row.step_time_s, row.peak_bytes, o.step_time_s, o.peak_bytes)
                       for r, o in timed):
                    continue
                key = same_numbers(row.step_time_s, row.peak_bytes)
                if key not in rows or row.step_time_s < rows[key].step_time_s:
                    rows[key] = row
    return rows
