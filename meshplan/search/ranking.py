"""recommend: the search, the thinner-headroom probe, the answer, and the nothing-fits answer. The answer is a pure
function of the request: no clock decides it (the only bounds count work, cards/search.yaml)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from meshplan.core.errors import MeshplanError
from meshplan.estimate.layer_records import shared_layers
from meshplan.rl.job import is_rl_request
from meshplan.schema.reports import Recommendation
from meshplan.schema.request import Request
from meshplan.search.answer import headroom_assumption, job_warnings, ranked_answer
from meshplan.search.decision import decision_table
from meshplan.search.engine import run_search
from meshplan.search.estimators import Engine, default_engine
from meshplan.search.impossible import explain_impossible, fastest_below_headroom, report_below_headroom
from meshplan.search.job import search_job
from meshplan.search.policy import headroom_for, memory_budget, search_limits
from meshplan.search.refusal import refuse_impossible
from meshplan.search.space import Fixed


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one search, then restore it. A search allocates some 10^5
    queue entries and reports, none in a reference cycle (reference counting frees them all; a collection after a
    recommend finds 0 cyclic objects on the bench's jobs), yet the collector's passes over them took ~18% of
    DeepSeek-V3 on 2,048 H100 (bench/recommend_speed.py). Only the caller that found it enabled re-enables it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            _promote_survivors()
            gc.enable()


def _promote_survivors() -> None:
    """Move what the search left alive (its job memo, the answer) straight to the oldest generation, as a freeze
    followed at once by an unfreeze does: both splice lists, walking nothing. Left young, the first collection after
    the pause walks every survivor (some 3*10^4 objects on the bench's jobs, about 1% of a first ask) and the next
    middle one again, to promote objects that live until the memo drops them; in the oldest generation they are
    still collected by the next full collection. Skipped when the process keeps objects frozen itself (the MCP
    server's start-up), whose permanent generation an unfreeze would empty. Freezing again there instead (no unfreeze)
    removes the server's collections after a search but also freezes the in-flight request's own objects, some 16 a
    call (anyio Events, deques, sets) that then die in cycles no collection frees; a full unfreeze-collect-freeze each
    time the frozen count grows by a quarter (CPython's rule for a full collection) frees them but walks the start-up
    too, and costs more than the skip once requests differ (bench/mcp_collector.py: over 32 recommend calls the
    collector paused 1.2 s as it is, 0.7 s so on 4 repeated jobs; 3.6 s against 4.7 s on 16 jobs)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


def recommend(req: Request, top_k: int = 5, engine: Engine | None = None, *,
              rows_only: bool = False) -> Recommendation:
    """The fastest layouts that fit, ranked by predicted step time, with what was rejected and why. `rows_only`: for
    a caller that reads only the ranked rows (minimum_gpus, the RL recommend's actor search): the same rows, without
    the thinner-headroom probe, the decision table or the nothing-fits answer, which read the ranked search and change
    none of its rows, and with MEM003 not told apart from the GPU's memory rule in the counts (run_search's
    `counted`: a plan the host refuses is not estimated again to name the rule)."""
    if top_k < 1:
        raise MeshplanError(f"top_k must be at least 1, got {top_k}.", fix="Use top_k=5.")
    refuse_rl(req)
    with collector_paused(), shared_layers():  # one layer's time computed once per search (layer_records)
        return _recommend(req, top_k, engine, rows_only)


def refuse_rl(req: Request) -> None:
    """This search ranks a training job's layouts; an RL job (job=rl, or an RL field given) is planned by the RL
    recommend (meshplan/search/rl.py, which sits above this module and calls it for the trainer's actor layouts), which
    meshplan.api.recommend routes it to. Refused here rather than searched as if it were a training job."""
    if is_rl_request(req):
        raise MeshplanError(
            "meshplan.search.recommend ranks training layouts; this request is an RL job (job=rl or an RL field "
            "given), which the RL planner ranks (actor layout, rollout engine, memory fraction, offloads).",
            fix="Call meshplan.api.recommend (or meshplan.search.rl.recommend_rl) with it, or drop job=rl and the RL "
                "fields to rank the trainer's layouts alone.")


def _recommend(req: Request, top_k: int, engine: Engine | None, rows_only: bool = False) -> Recommendation:
    job, notes = search_job(req)
    engine = engine or default_engine(job.framework)
    fixed = Fixed.from_request(req, job)
    refuse_impossible(job, fixed)  # a rule no layout passes, a host no offload fits: refused with the rule's fix
    limits = search_limits()
    warnings: list[str] = []
    if job.num_gpus > limits.largest_cluster_gpus:
        warnings.append(
            f"{job.num_gpus:,} GPUs is beyond any cluster built (about {limits.largest_cluster_gpus:,} at most, "
            f"cards/search.yaml); the space is bounded by the model's shape (tp <= heads, pp <= layers, "
            f"cp <= seq_length/2, ep <= experts), and the search by {limits.absurd_max_evaluations:,} estimates, "
            "not by the GPU count."
        )
    headroom = headroom_for(req)
    default_headroom = req.headroom is None
    search, considered = run_search(job, fixed, engine, top_k, warnings, memory_budget(job, headroom),
                                    counted=not rows_only, recorded=not rows_only)
    thin = None if rows_only else fastest_below_headroom(job, fixed, engine, search)
    if not rows_only:
        search.keep_for_job()  # (the thinner-headroom probe's bounds too: it shares the search's)
    notes = [*notes, headroom_assumption(job, headroom, default_headroom)]
    rec = ranked_answer(job, fixed, engine, search, considered, top_k, notes, warnings, headroom, default_headroom)
    if not rows_only:
        best = rec.candidates[0] if rec.candidates else None
        rec.decision_table = decision_table(job, fixed, engine, best, search.budget)
        if thin is not None:
            report_below_headroom(rec, job, engine, thin, headroom)
        if not rec.candidates:
            explain_impossible(rec, job, fixed, engine, search, headroom, default_headroom,
                               req.global_batch_size is not None, req.gpus_per_node or job.gpu.gpus_per_node)
    # last, on every answer (rows_only too: min-gpus' scan copies its warnings): what holds whatever it ranks
    rec.warnings.extend(job_warnings(job))
    return rec
