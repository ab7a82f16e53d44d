"""What the RL recommend (search/rl.py) makes of one actor layout of the training search: its RL layout (the actor's
degrees with the RL job's rollout and offload fields), the phase offload variants it tries, and the host its RL step
takes; and the engine the training search ranks actor layouts with under a host limit, so that it ranks only those
whose RL step the node's host can hold (rule MEM003).

Why an engine: where the framework offloads every trainer model to the host around the rollout by itself (SkyRL's
colocate_all), the RL step's host is the trainer's states on the worst stage's GPU times the ranks per node, not what
the training step's own offload knobs put there. A training search that knows only the latter ranks first the layouts
that shard least (the fastest), whose RL steps all fail MEM003, and widening its top-k never reaches the sharded ones
that fit. With the RL step's host (rl_host_bytes, the figure rl_memory reports) as its memory estimates' host, the
search's own MEM003 machinery (SearchPlans.fits, host_counts.py) rejects them and ranks the next ones. The host is
read before the GPU where it is already known for the plan's host_key (ActorHost.known: worked out for another
micro-batch or recompute of the same layout, which the host does not read): a plan it refuses costs no GPU estimate,
and a search that counts (host_counts.host_only) still asks the GPU alone to tell MEM001 from MEM003, GPU first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from operator import itemgetter

from meshplan.estimate.memory import FitVerdict, estimate_memory
from meshplan.request.resolve import resolve
from meshplan.rl.job import resolve_rl
from meshplan.rl.memory import phase_setting, rl_host_bytes
from meshplan.rules.rollout import phase_knobs
from meshplan.schema.plan import PLAN_LIST_FIELDS, Job, Plan
from meshplan.schema.request import Request
from meshplan.search.estimators import Engine, default_engine

# The Plan fields an actor layout takes from the RL job's resolved plan: the rollout's, the offloads and the
# allocator (the RL launcher's, where a training job's differs: verl).
ACTOR_FIELDS = ("rollout_engine", "rollout_gpus", "placement", "rollout_enforce_eager", "param_offload",
                "grad_offload", "optimizer_offload", "optimizer_offload_fraction", "activation_offload",
                "expandable_segments")
OFFLOAD_KNOBS = ("param_offload", "grad_offload", "optimizer_offload")

HOST_FREE_FIELDS = frozenset({"micro_batch_size", "recompute", "recompute_layers", "recompute_method",
                              "recompute_modules", "selective_ac_option"})
"""Plan fields the RL step's host (rl_host_bytes) never reads unless activations are offloaded: the node's host holds
the model states the offloads move (arithmetic/offload.offload_stage: a class's share moved in the step, the CPU
optimizer's fp32 share, the states kept between phases), the reference model's weights and the states the framework
offloads by itself (rl/memory.stage_host_extra), none of which depends on the micro-batch or on what is recomputed;
only offloaded activations do. So ActorHost keeps one figure per the other fields for a layout that offloads no
activations; tests/test_rl_host.py holds the host to it field by field."""
_HOST_FIELDS = tuple(name for name in Plan.model_fields if name not in HOST_FREE_FIELDS)
_HOST_VALUES = itemgetter(*_HOST_FIELDS)  # read from the plan's own field dict
_HOST_LISTS = tuple(i for i, name in enumerate(_HOST_FIELDS) if name in PLAN_LIST_FIELDS)


def host_key(plan: Plan) -> tuple | None:
    """What the RL step's host reads of an RL layout (every field but HOST_FREE_FIELDS), hashable; None where it
    offloads activations (the host then reads the micro-batch and the recompute too)."""
    if plan.activation_offload:
        return None
    values = list(_HOST_VALUES(plan.__dict__))
    for i in _HOST_LISTS:
        values[i] = None if values[i] is None else tuple(values[i])
    return tuple(values)


def actor_layout(actor: Plan, base: Plan) -> Plan:
    """The actor's plan with the RL job's rollout and offload fields (`base`: resolve's plan of the RL request)."""
    return actor.model_copy(update={k: getattr(base, k) for k in ACTOR_FIELDS})


def off_gpu(setting) -> frozenset[str]:
    """The states off the GPU between phases: on the host or released."""
    return setting.phase_classes | setting.freed


def offload_options(job, plan: Plan, req: Request) -> list[dict]:
    """The phase offload variants of one actor layout, each a different RL step: the plan as resolved (the
    framework's default), and the framework's phase offload knobs all off and all on, unless the user set one
    (resolve put it on the plan). A variant that takes the same states off the GPU between phases as one kept before
    it is the same RL step and is left out: where the framework's own offload around the rollout already moves what
    the knob moves (SkyRL's colocate_all on its Megatron workers, which offload the optimizer whatever
    offload_after_step says), only the default is tried; on its FSDP workers colocate_all moves the optimizer only
    with offload_after_step (rl/memory.framework_offload), so both are."""
    if any(getattr(req, k) is not None for k in OFFLOAD_KNOBS):
        return [{}]
    knobs = phase_knobs(job.card, plan)
    out: list[dict] = [{}]
    moved = [off_gpu(phase_setting(job, plan))]
    for value in (False, True):
        option = dict.fromkeys(knobs, value)
        if all(getattr(plan, k) == value for k in knobs):
            continue  # the plan as resolved
        classes = off_gpu(phase_setting(job, plan.model_copy(update=option)))
        if classes not in moved:
            out.append(option)
            moved.append(classes)
    return out


@dataclass(frozen=True)
class ActorHost:
    """The host per node of the RL step on an actor plan of the training search: the least over its phase offload
    variants (the RL recommend tries each), each rl_host_bytes of the actor update's report as rl_memory reads it."""

    job: Job  # the RL job (resolve of the RL request)
    base: Plan
    req: Request
    kept: dict[tuple, int] = field(default_factory=dict, compare=False, repr=False)  # per host_key
    elsewhere: dict[int, tuple[Job, Plan, Request]] = field(default_factory=dict, compare=False, repr=False)

    def at(self, trainer_gpus: int) -> tuple[Job, Plan, Request]:
        """The RL job, its plan and request where the training search asks about another trainer GPU count (an empty
        answer's min-gpus scan, search/impossible.py): the RL request at the whole job's GPUs for that count."""
        if trainer_gpus == self.job.num_gpus:
            return self.job, self.base, self.req
        if trainer_gpus not in self.elsewhere:
            _, rl = resolve_rl(self.req, [])
            req = self.req.model_copy(update={"num_gpus": rl.job_gpus(trainer_gpus) if rl else trainer_gpus})
            self.elsewhere[trainer_gpus] = (*resolve(req), req)
        return self.elsewhere[trainer_gpus]

    def known(self, actor: Plan, trainer_gpus: int) -> int | None:
        """The host already worked out for the actor plan's host_key at the job's own trainer GPUs, else None (nothing
        is estimated)."""
        if trainer_gpus != self.job.num_gpus:
            return None
        key = host_key(actor_layout(actor, self.base))
        return None if key is None else self.kept.get(key)

    def __call__(self, actor: Plan, trainer_gpus: int | None = None) -> int:
        job, base, req = self.at(trainer_gpus or self.job.num_gpus)
        layout = actor_layout(actor, base)
        key = host_key(layout)
        kept = self.kept if job is self.job else None  # the scan's other counts: rare, not kept
        least = None if key is None or kept is None else kept.get(key)
        if least is not None:
            return least
        for option in offload_options(job, layout, req):
            plan = layout.model_copy(update=option)
            host = rl_host_bytes(job, plan, estimate_memory(job, plan))
            least = host if least is None else min(least, host)
        if key is not None and kept is not None:
            kept[key] = least  # type: ignore[assignment]
        return least  # type: ignore[return-value]


def actor_engine(job, base: Plan, req: Request, framework: str) -> Engine | None:
    """The training search's engine for the RL recommend's actor layouts: under a host limit, its memory estimates
    carry the RL step's host (ActorHost) instead of the training step's, so the search's MEM003 rejects the layouts
    whose RL step no offload variant fits on the node's host; their GPU figures are the training step's, unchanged.
    A verdict under the host limit reads the host first where it is known (not gpu_read when that refuses the plan).
    None (the default engine, the search exact as before) without a host limit."""
    if job.cpu_memory_per_node is None:
        return None
    inner = default_engine(framework)
    host_of = ActorHost(job, base, req)

    def memory(trainer: Job, plan: Plan):
        return inner.memory(trainer, plan).model_copy(update={"host_bytes_per_node": host_of(plan, trainer.num_gpus)})

    def memory_fit(trainer: Job, plan: Plan, budget: int, host: int | None = None, first: int = 0,
                   checked: bool = False) -> FitVerdict:
        if host is not None:
            known = host_of.known(plan, trainer.num_gpus)
            if known is not None and known > host:  # the host refuses it whatever the GPU: no GPU estimate
                return FitVerdict(0, known, False, None, 0, gpu_read=False)
        verdict = inner.memory_fit(trainer, plan, budget, None, first, checked)  # type: ignore[misc]
        if not verdict.complete or host is None:
            # over the GPU budget, or only the GPU's fit asked (host_counts.host_only completes a verdict the host
            # stopped, and reads nothing else of it): no host figure, 0 (a floor of any). The RL step's host costs
            # an estimate per offload variant (ActorHost), so it is worked out only where a host limit is asked.
            return FitVerdict(verdict.figure, 0, verdict.complete, verdict.over, verdict.peak)
        need = host_of(plan, trainer.num_gpus)
        return FitVerdict(verdict.figure, need, need <= host, None, verdict.peak)

    return replace(inner, memory=memory, memory_fit=memory_fit)
