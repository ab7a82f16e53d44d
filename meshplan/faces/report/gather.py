"""The numbers a report draws, all from `meshplan.api` (the calls behind the CLI's --json), plus the resolved job
for the mesh (GPUs per node, the fast domain) and the headroom line (the search's policy).

With `recommend`, the search runs first and the plan drawn is its first candidate; when nothing keeps the
headroom, the fastest layout with less headroom, else the closest miss (a nothing-fits answer draws what it is
closest to). The drawn plan is estimated again through the api from a request holding its fields, so every
picture of it matches `meshplan memory/throughput --json` for those fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan import api
from meshplan.arithmetic.mesh import MeshAxis, job_domain, mesh_axes, segment_words, world_size
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.rl.job import RL_FIELDS
from meshplan.schema.plan import Plan
from meshplan.schema.reports import MemoryReport, Recommendation, ThroughputReport
from meshplan.schema.request import Request
from meshplan.search.policy import headroom_for, memory_budget


@dataclass(frozen=True)
class PlanReport:
    """Everything one report draws; every number is a field of an api result or of the resolved job."""

    request: Request = field(repr=False)
    drawn: Request | None = field(repr=False)  # the request whose plan is drawn (None: nothing to draw)
    memory: MemoryReport | None
    throughput: ThroughputReport | None
    recommendation: Recommendation | None
    plan: Plan | None
    axes: list[MeshAxis]
    world: int
    gpus_per_node: int
    domain: int
    gpu_name: str
    framework: str  # the resolved job's framework: which schedule its pipeline runs
    microbatches: int
    headroom: float
    budget_bytes: int
    drawn_as: str  # which plan is drawn, in words
    notes: list[str]


def plan_request(req: Request, plan: Plan, global_batch_size: int | None) -> Request:
    """`req` with every layout field set to `plan`'s: the request `meshplan memory --json` takes for that plan. A
    training plan's RL switches (rollout_enforce_eager=False) stay out: given, they would make it an RL request."""
    skip = set(RL_FIELDS) if plan.rollout_engine is None else set()
    update = {name: value for name in Plan.model_fields
              if name not in skip and (value := getattr(plan, name)) is not None}
    if global_batch_size is not None:
        update["global_batch_size"] = global_batch_size
    return req.model_copy(update=update)


def _pick(rec: Recommendation) -> tuple[Plan | None, str]:
    if rec.candidates:
        return rec.candidates[0].plan, "recommend's first candidate"
    if rec.best_below_headroom is not None:
        return rec.best_below_headroom.plan, "the fastest layout that fits only with less than the headroom"
    if rec.closest:
        return rec.closest[0].plan, "the closest miss: it does not fit"
    return None, "nothing: no layout passed the rules"


def gather(req: Request, *, recommend: bool = False, top_k: int = 5) -> PlanReport:
    """The api's answers for `req` (searched first with `recommend`), ready to draw."""
    req = api.script_request(req)  # a launch script's path as model: the model its flags state, once for all
    rec = api.recommend(req, top_k=top_k) if recommend else None
    drawn, drawn_as, notes = req, "the plan as requested (defaults filled as `meshplan memory` fills them)", []
    if rec is not None:
        plan, drawn_as = _pick(rec)
        drawn = plan_request(req, plan, rec.global_batch_size) if plan is not None else None
    memory = throughput = None
    if drawn is not None:
        memory, throughput, untimed = api.memory_and_throughput(drawn)  # its memory estimated once for both
        if untimed is not None:  # a plan that cannot be timed is still drawn; the reason is printed
            notes.append(f"step time not estimated: {untimed}")
    job, plan = resolve(drawn if drawn is not None else req)
    if drawn is None:
        plan = None
    world = world_size(framework_card(job.framework).world_size_law, memory.plan) if memory is not None else 0
    domain = job_domain(job)
    if (segments := segment_words(job)) is not None:
        notes.append(segments)
    headroom = headroom_for(req)
    return PlanReport(
        request=req, drawn=drawn, memory=memory, throughput=throughput, recommendation=rec,
        plan=memory.plan if memory is not None else None,
        axes=mesh_axes(memory.plan, world, domain, job.model.moe is not None,
                                                     job.card.world_size_law) if memory is not None else [],
        world=world, gpus_per_node=job.gpus_per_node, domain=domain, gpu_name=job.gpu.name, framework=job.framework,
        microbatches=memory.plan.num_microbatches(job.global_batch_size) if memory is not None else 0,
        headroom=headroom, budget_bytes=memory_budget(job, headroom), drawn_as=drawn_as, notes=notes,
    )
