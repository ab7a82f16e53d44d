"""`minimum_gpus` (`meshplan min-gpus`): the smallest GPU count at which recommend ranks a layout that passes the rules
and keeps the headroom, found by the scan of meshplan/search/gpu_count.py, with recommend's best layout at that count.
Each count the scan settles is settled by recommend's own search there, so `min-gpus` and `recommend --num-gpus`
agree. An RL job scans the trainer's GPUs (plus a separate rollout pool, when it has one), each count settled by the RL
recommend (meshplan/search/rl.py). It sits above recommend (meshplan/search/ranking.py), whose nothing-fits answer runs
the same scan."""

from __future__ import annotations

from dataclasses import replace

from meshplan.core.errors import MeshplanError
from meshplan.core.units import plural
from meshplan.estimate.layer_records import shared_layers
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import DEFAULT_BATCH_TOKENS, cluster_gpu, resolve
from meshplan.rl.job import is_rl_request, resolve_rl, trainer_request
from meshplan.schema.plan import Job
from meshplan.schema.reports import MinimumGpus, Recommendation
from meshplan.schema.request import MAX_GPUS, Request
from meshplan.search.answer import FASTEST, fixed_assumption, headroom_assumption, job_warnings, keeps
from meshplan.search.estimators import Engine, default_engine
from meshplan.search.gpu_count import Scan, count_bound_text, scan_minimum
from meshplan.search.job import job_at, search_job
from meshplan.search.policy import headroom_for, search_limits
from meshplan.search.ranking import collector_paused, recommend
from meshplan.search.refusal import HostRefused
from meshplan.search.rl import recommend_rl, resolver_settled
from meshplan.search.space import Fixed


def minimum_gpus(req: Request, max_gpus: int | None = None, engine: Engine | None = None) -> MinimumGpus:
    """The smallest GPU count at which recommend ranks a layout that passes the rules and keeps the headroom, with
    that layout. Every field the request leaves open stays open; a default batch is re-derived at each count."""
    # every count's search shares each layer's time (layer_records); no cyclic garbage collection during the scan's
    # floors either (ranking.collector_paused: what recommend pauses it for holds for them too)
    with collector_paused(), shared_layers():
        return _minimum_gpus(req, max_gpus, engine)


def _minimum_gpus(req: Request, max_gpus: int | None, engine: Engine | None) -> MinimumGpus:
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
    node = req.gpus_per_node or get_gpu(req.gpu).gpus_per_node
    if is_rl_request(req):
        return _minimum_rl(req, limit, node)
    job, _ = search_job(req.model_copy(update={"num_gpus": node}))
    engine = engine or default_engine(job.framework)
    fixed = Fixed.from_request(req, job)
    user_gbs = req.global_batch_size is not None
    answers: dict[int, Recommendation] = {}

    def ranks(world: int, _: Job) -> bool:
        answers[world] = rec = recommend(req.model_copy(update={"num_gpus": world}), top_k=1, engine=engine,
                                         rows_only=True)  # the rows recommend ranks there; its other parts unread
        return bool(rec.candidates)

    scan = scan_minimum(job, fixed, engine, headroom_for(req), user_gbs, limit, ranks=ranks)
    batch = ("global_batch_size: the request's at every count." if user_gbs else
             f"global_batch_size not given: the default (~{DEFAULT_BATCH_TOKENS / 1e6:.1f}M tokens, rounded up to a "
             "multiple of the GPU count) is re-derived at each count.")
    rec = answers.get(scan.num_gpus or 0)  # no count settled: the job's own, which recommend says at any count
    return _answer(req, job, fixed, scan, rec, limit, batch, rec.warnings if rec is not None else job_warnings(job))


def _minimum_rl(req: Request, limit: int, node: int) -> MinimumGpus:
    """An RL job: the trainer's GPU counts scanned (its states floor, its layouts' fit: necessary for any RL step to
    fit), each count that passes settled by the RL recommend on the whole job; a separate rollout pool adds its
    rollout_gpus to every count, and where PPO's critic runs on GPUs of its own (rl/job.py critic_apart) each
    trainer count is taken twice."""
    # twice a node: a critic of its own halves what the rollout leaves (rl/job.py _critic_split)
    probe_gpus = node * (2 if req.placement == "separate" else 1) + (req.rollout_gpus or 0)
    resolver_notes: list[str] = []
    probe, rl = resolve_rl(req.model_copy(update={"num_gpus": probe_gpus}), resolver_notes)
    total = rl.job_gpus if rl is not None else (lambda trainer: trainer)  # the job's GPUs per trainer count
    # read off that one count (arithmetic/mesh.rl_job_gpus, linear in the trainer's): the rollout GPUs beside every
    # count, and the job's GPUs per trainer GPU (2 where PPO's critic runs on as many of its own): the scan's limit
    # and words
    pool = total(0)
    copies = total(1) - pool
    # the host is the RL step's, settled by the RL recommend at each count (refuse_host, the actor search's
    # ActorHost), not the training step's with the phase offloads as resolved: an RL step may turn them off
    # (SkyRL's FSDP optimizer left on the GPU takes less host), so the trainer's scan checks the GPU only
    training = trainer_request(probe, rl.job if rl is not None else None).model_copy(
        update={"cpu_memory_per_node": None})
    job, _ = search_job(training.model_copy(update={"num_gpus": node}))
    engine = default_engine(job.framework)
    fixed = Fixed.from_request(training, job)
    # a field the RL resolver set for the search (SkyRL's PPO critic's zero_stage 3) is said with its reason, not as
    # the request's
    settled = {name: note for name in resolver_settled(req, training) for note in resolver_notes
               if note.startswith(f"{name} not given:")}
    answers: dict[int, Recommendation] = {}

    def ranks(trainer_gpus: int, _: Job) -> bool:
        world = total(trainer_gpus)
        try:
            answers[world] = rec = recommend_rl(req.model_copy(update={"num_gpus": world}), top_k=1,
                                                rows_only=True)  # the rows it ranks there; its other parts unread
        except HostRefused:  # the host holds what the framework offloads only on more nodes: none at this count
            return False
        return bool(rec.candidates)

    scan = scan_minimum(job, fixed, engine, headroom_for(req), True, max(1, (limit - pool) // copies),
                        at=lambda t: job_at(job, t, user_gbs=True), ranks=ranks)
    if pool:
        shift = {k: total(getattr(scan, k)) for k in ("first", "last", "floor", "limit")}
        critic = " twice (the policy's and PPO's critic's)" if copies == 2 else ""
        scan = replace(scan, num_gpus=None if scan.num_gpus is None else total(scan.num_gpus),
                       stepping=f"the trainer's {scan.stepping}{critic}, plus the {pool:,} rollout GPUs", **shift)
    batch = (f"The RL step's batch at every count: {job.global_batch_size:,} sequences (prompts x samples) of "
             f"{job.seq_length:,} tokens (prompt + response); each count is settled by the RL recommend (actor "
             "layout, rollout engine, memory fraction and offloads).")
    rec = answers.get(scan.num_gpus or 0)
    if rec is not None:
        warnings = rec.warnings
    else:  # no count settled: the job's own, the RL recommend's at any count (the RL job at the probe's count)
        warnings = job_warnings(resolve(req.model_copy(update={"num_gpus": probe_gpus}))[0])
    return _answer(req, job, fixed, scan, rec, limit, batch, warnings, settled)


def _answer(req: Request, job: Job, fixed: Fixed, scan: Scan, rec: Recommendation | None, limit: int,
            batch: str, warnings: list[str], settled: dict[str, str] | None = None) -> MinimumGpus:
    """The MinimumGpus for a finished scan, with recommend's best layout at its count and `warnings`: recommend's
    answer's there, else the job's own (search/answer.job_warnings), what recommend says at any count."""
    headroom = headroom_for(req)
    candidate, gbs = None, None
    rationale = scan.sentence(headroom, fixed)
    if scan.num_gpus is not None and rec is not None and rec.candidates:
        gbs = rec.global_batch_size
        candidate = rec.candidates[0]
        rationale = (f"{scan.num_gpus:,} {job.gpu.name} is the smallest GPU count where recommend ranks a layout that "
                     f"passes the rules and {keeps(headroom)} (counts scanned in increasing order from "
                     f"{scan.first:,}: {scan.stepping}). The fastest layout there that passes every rule and fits: "
                     f"{candidate.rationale.removeprefix(FASTEST)}")
    scanned = {"rules": "A rule refuses every count, so the scan stopped at its first; it would step in increasing "
                        "order: ",
               "memory": "The count-free memory floor is over the budget, so no count was scanned; the scan would "
                         "step in increasing order: "}.get(scan.stopped_by, "Counts scanned in increasing order: ")
    assumptions = [
        headroom_assumption(job, headroom, req.headroom is None),
        scanned
        + f"{scan.stepping}, from {scan.floor:,} (no smaller count can hold "
        f"the model states, every parameter's, within the headroom) up to {plural(limit, 'GPU')}, within "
        f"{count_bound_text()}; no clock bounds the scan. Every count is checked, never bisected: fit is not "
        "monotone in the GPU count, since each layout's degrees must divide it.",
        "A count is skipped when no layout's lightest variant (most ZeRO sharding the rules allow, full recompute, "
        "the smallest micro-batch) keeps the headroom; the first count where one does is settled by recommend's own "
        "search there, so the count and `recommend --num-gpus` agree.",
        batch,
        *cluster_gpu(req)[1],  # the request's network, where it states one
        *fixed_assumption(fixed, settled or {}),
    ]
    if scan.proof is not None:
        assumptions.append(scan.proof.assumption())
    return MinimumGpus(
        model=job.model.name, framework=job.framework, gpu=job.gpu.name, num_gpus=scan.num_gpus, candidate=candidate,
        headroom=headroom, global_batch_size=gbs, searched_from=scan.first if scan.checked else scan.floor,
        searched_to=scan.last if scan.checked else limit,
        counts_checked=scan.checked, stepping=scan.scanned(), stopped_by=scan.stopped_by,  # type: ignore[arg-type]
        memory_floor=None if scan.proof is None else scan.proof.report(),
        rationale=rationale, warnings=warnings, assumptions=assumptions,
    )
