"""`minimum_gpus` (`meshplan min-gpus`): the smallest GPU count at which some layout passes the rules and keeps the
headroom, found by the scan of meshplan/search/gpu_count.py, with recommend's best layout at that count. It sits
above recommend (meshplan/search/ranking.py), whose nothing-fits answer runs the same scan."""

from __future__ import annotations

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import DEFAULT_BATCH_TOKENS
from meshplan.schema.reports import MinimumGpus
from meshplan.schema.request import MAX_GPUS, Request
from meshplan.search.answer import fixed_assumption, headroom_assumption, keeps
from meshplan.search.estimators import Engine, default_engine
from meshplan.search.gpu_count import scan_minimum
from meshplan.search.job import search_job
from meshplan.search.policy import headroom_for, search_limits
from meshplan.search.ranking import recommend
from meshplan.search.space import Fixed


def minimum_gpus(req: Request, max_gpus: int | None = None, engine: Engine | None = None) -> MinimumGpus:
    """The smallest GPU count at which some layout passes the rules and keeps the headroom, with recommend's best
    layout there. Every field the request leaves open stays open; a default batch is re-derived at each count."""
    if req.num_gpus is not None:
        raise MeshplanError(
            f"minimum_gpus finds the GPU count, so num_gpus cannot be given (got {req.num_gpus}).",
            fix="Leave num_gpus out; bound the scan with max_gpus.",
        )
    limits = search_limits()
    limit = limits.min_gpus_search_limit if max_gpus is None else max_gpus
    if not 1 <= limit <= MAX_GPUS:
        raise MeshplanError(f"max_gpus must be between 1 and {MAX_GPUS:,}, got {limit}.",
                            fix=f"Use max_gpus={limits.min_gpus_search_limit} (the default).")
    headroom = headroom_for(req)
    node = req.gpus_per_node or get_gpu(req.gpu).gpus_per_node
    job, _ = search_job(req.model_copy(update={"num_gpus": node}))
    engine = engine or default_engine(job.framework)
    fixed = Fixed.from_request(req)
    user_gbs = req.global_batch_size is not None
    scan = scan_minimum(job, fixed, engine, headroom, user_gbs, limit)
    candidate, gbs = None, None
    rationale = scan.sentence(headroom, fixed)
    if scan.num_gpus is not None:
        rec = recommend(req.model_copy(update={"num_gpus": scan.num_gpus}), top_k=1, engine=engine)
        gbs = rec.global_batch_size
        if rec.candidates:
            candidate = rec.candidates[0]
            rationale = (f"{scan.num_gpus:,} {job.gpu.name} is the smallest GPU count where a layout passes the rules "
                         f"and {keeps(headroom)} (counts scanned in increasing order from {scan.first:,}: "
                         f"{scan.stepping}). Best layout there: {candidate.rationale}")
        else:
            rationale += f" (recommend at {scan.num_gpus:,} GPUs ranked nothing: {rec.rationale})"
    assumptions = [
        headroom_assumption(job, headroom, req.headroom is None),
        f"Counts scanned in increasing order: {scan.stepping}, from {scan.floor:,} (no smaller count can hold "
        f"the model states within the headroom) up to {limit:,} GPUs or {limits.min_gpus_time_budget_s:g} s "
        "(cards/search.yaml). Every count is checked, never bisected: fit is not monotone in the GPU count, since "
        "each layout's degrees must divide it.",
        "A count fits when the lightest variant (most ZeRO sharding the rules allow, full recompute, the smallest "
        "micro-batch) of some layout passes the structural rules and its estimated peak is within the headroom.",
        ("global_batch_size: the request's at every count." if user_gbs else
         f"global_batch_size not given: the default (~{DEFAULT_BATCH_TOKENS / 1e6:.1f}M tokens, rounded up to a "
         "multiple of the GPU count) is re-derived at each count."),
        *fixed_assumption(fixed),
    ]
    return MinimumGpus(
        model=job.model.name, framework=job.framework, gpu=job.gpu.name, num_gpus=scan.num_gpus, candidate=candidate,
        headroom=headroom, global_batch_size=gbs, searched_from=scan.first if scan.checked else scan.floor,
        searched_to=scan.last if scan.checked else limit,
        counts_checked=scan.checked, stepping=scan.stepping, stopped_by=scan.stopped_by,  # type: ignore[arg-type]
        rationale=rationale, assumptions=assumptions,
    )
