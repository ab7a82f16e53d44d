"""The search against the decision tables (meshplan/search/strategies.py): what a table suggests for the job, and
whether the search's pick agrees, in numbers (the table's layout is searched with the same estimators and compared)."""

from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.schema.plan import Job
from meshplan.schema.reports import Candidate
from meshplan.search.answer import knob_words
from meshplan.search.engine import BestFirstSearch
from meshplan.search.estimators import Engine, ideal_time
from meshplan.search.policy import search_comparison, slower_by
from meshplan.search.refusal import Space
from meshplan.search.space import Fixed
from meshplan.search.strategies import suggest

DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp")
"""The degrees a table's suggestion pins (dp follows from them and the GPU count)."""


def decision_table(job: Job, fixed: Fixed, engine: Engine, best: Candidate | None, budget: int) -> str:
    """What the decision tables suggest, and why the recommendation agrees or differs, in numbers: the table's
    layout is searched with the same estimators (its knobs left open) and compared with the pick, `best`. The
    suggestion keeps the degrees the request fixed (strategies.suggest) and its search every other fixed field."""
    try:
        table = suggest(job, fixed.values)
    except MeshplanError as exc:
        return f"The decision tables give no suggestion for this job ({exc.reason})."
    sp = table.plan
    text = f"Decision table {table.table} row {table.row_id!r} ({table.row}) suggests {sp.short()}"
    text += (" after fitting it to this job (" + " ".join(table.adjustments) + ")." if table.adjustments else ".")
    if best is not None and all(getattr(best.plan, d) == getattr(sp, d) for d in DEGREES):
        return text + " The search agrees: its best layout has the same degrees."
    pinned = Fixed({**{k: v for k, v in fixed.values.items() if k not in DEGREES},
                    **{d: getattr(sp, d) for d in DEGREES}}, fixed.carried, fixed.given)
    probe = BestFirstSearch.for_job(job, pinned, engine, 1, budget_bytes=budget)
    space = Space.of(job, pinned)
    probe.seed(list(space.layouts), ideal_time(job, engine))
    probe.run()
    picks = "The search found no layout either" if best is None else f"The search picks {best.plan.short()}"
    if not probe.found and probe.stopped_by_budget:
        return text + (f" {picks}; the table's layout was not compared: its search stopped at "
                       f"the budget of {probe.max_evaluations:,} estimates (cards/search.yaml max_evaluations) "
                       "before one of its variants was timed.")
    if not probe.found:  # a suggestion the rules refuse is never left standing unsaid (e.g. EP5 of 128 experts)
        rejected = probe.rejected + space.dropped_by()  # the rules' counts and the cheap laws' (no layout built)
        reasons = ", ".join(f"{k} x{v}" for k, v in rejected.most_common(3)) or "no layout of that shape"
        return text + (f" {picks}{'' if best is None else ' instead'}: the table's layout has no variant that "
                       f"passes the rules and fits this job ({reasons}).")
    if best is None:  # cannot happen while the probe's space lies inside the search's: say so rather than hide it
        return text + " The table's layout fits, yet the search found none: please report this request."
    bp = best.plan
    theirs = min(probe.found, key=lambda f: f.time)
    mine, its = best.throughput.tokens_per_s_per_gpu, theirs.throughput.tokens_per_s_per_gpu
    gap = slower_by(its, mine)
    tolerance = search_comparison().agreement_tolerance
    verdict = (f"within {tolerance:.0%} of the pick: the table and the search agree in practice" if gap <= tolerance
               else "the search's pick is clearly faster under the cost model")
    return text + (f" The search picks {bp.short()}; the table's layout at its best ({theirs.plan.short()}, "
                   f"{knob_words(theirs.plan)}) fits and is predicted at {its:,.0f} tokens/s/GPU against the pick's "
                   f"{mine:,.0f}, {gap:.1%} slower: {verdict}.")
