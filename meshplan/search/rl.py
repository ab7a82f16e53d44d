"""recommend for an RL job: the trainer layouts the search ranks, each with the rollout engine and offloads that make
the whole RL step fastest while every phase fits.

The actor's layout is the training search's (meshplan.search.recommend on the trainer's step: prompts x samples
sequences of prompt + response tokens); for each of its best layouts, every rollout TP (a power of two the rollout
GPUs and the attention heads take), for an MoE model rollout DP with EP = TP x DP, with and without the
framework's phase offloads, at the largest memory fraction (in 0.05 steps up to MAX_FRACTION) whose phases keep
the headroom, is timed with meshplan.rl.step_time; the fastest RL steps are returned as a Recommendation whose plans
carry the rollout fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, plural
from meshplan.estimate.accuracy import with_band
from meshplan.estimate.layer_records import shared_layers
from meshplan.estimate.memory import memory_summary
from meshplan.request.resolve import resolve
from meshplan.rl.engine import ep_words
from meshplan.rl.job import resolve_rl, trainer_request
from meshplan.rl.memory import least_framework_host, phase_setting, rl_memory, trainer_reports
from meshplan.rl.step_time import rl_report, rl_step_time
from meshplan.schema.plan import Plan
from meshplan.schema.reports import Candidate, MemoryReport, Recommendation, peak_words
from meshplan.schema.request import Request
from meshplan.search.answer import how_sure, job_warnings, offload_words, plan_words
from meshplan.search.job import OPEN_FOR_SEARCH, search_job
from meshplan.search.policy import HEADROOM_RULE, HOST_RULE, headroom_for
from meshplan.search.ranking import recommend
from meshplan.search.refusal import HostRefused, nodes_to_hold
from meshplan.search.rl_actor import actor_engine, actor_layout, offload_options
from meshplan.search.space import Fixed, params_split, request_zeros
from meshplan.search.zero_stages import least_offloaded_state_bytes

# The largest memory fraction tried: verl's perf guide sets 0.8-0.9 with offload (docs/perf/best_practices.rst);
# above it the engine's own activations and NCCL buffers outside the estimate have no room.
MAX_FRACTION = 0.9
FRACTION_STEP = 0.05
ACTOR_LAYOUTS = 4  # trainer layouts of the training search whose rollout choices are tried (its best ones)
ACTOR_WIDENING = 4  # when no RL step fits on them: this many times as many actor layouts, again
MAX_ACTOR_LAYOUTS = 256  # the most actor layouts tried before answering that no RL step fits


SEARCHED = (*OPEN_FOR_SEARCH, "zero_stage", "micro_batch_size", "recompute", "rollout_tp", "rollout_dp", "rollout_ep",
            "rollout_memory_fraction")
"""The fields an RL recommend chooses where the request leaves them out: the actor's layout, ZeRO stage, micro-batch
and recompute (the training search), the rollout's shape and memory fraction (_rank_actor)."""


def held_notes(notes: list[str], settled: Iterable[str] = ()) -> list[str]:
    """The resolver's notes that hold for every candidate: the default it noted for a field the search chooses
    ('rollout_tp not given: 2, the verl default') names a value the candidates need not have; a field the resolver
    `settled` for the search (resolver_settled: SkyRL's PPO critic's zero_stage 3) holds for every one, and its note
    says why."""
    kept = set(settled)
    return [n for n in notes if (field := n.split(" not given:", 1)[0]) not in SEARCHED or field in kept]


def resolver_settled(req: Request, training: Request) -> list[str]:
    """The searched fields the request leaves out which the RL resolver sets in the trainer's request, so the search
    keeps them (rl/job._critic_engine: an algorithm's critic on the engines that train one)."""
    return [n for n in SEARCHED if getattr(req, n, None) is None and getattr(training, n, None) is not None]


def _fixed(req: Request) -> dict:
    """The rollout fields the user fixed: the search keeps them."""
    return {k: getattr(req, k) for k in ("rollout_tp", "rollout_dp", "rollout_ep", "rollout_memory_fraction")
            if getattr(req, k) is not None}


def _rollout_shapes(job, plan: Plan, fixed: dict) -> list[tuple[int, int, int]]:
    """(rollout TP, DP, EP) the engines can run: TP a power of two dividing the rollout GPUs and the attention heads
    (vLLM and SGLang shard heads over TP), up to four nodes; for an MoE model also DP > 1 with EP = TP x DP inside
    a node (rule RL001)."""
    gpus, heads, node = plan.rollout_gpus, job.model.num_attention_heads, job.gpus_per_node
    out = []
    tp = 1
    while tp <= min(gpus, 4 * node):
        if gpus % tp == 0 and heads % tp == 0:
            out.append((tp, 1, 1))
            if job.model.is_moe:
                if tp > 1:
                    out.append((tp, 1, tp))
                dp = 2
                while tp * dp <= node and gpus % (tp * dp) == 0:
                    out.append((tp, dp, tp * dp))
                    dp *= 2
        tp *= 2
    keep = [(t, d, e) for t, d, e in out if fixed.get("rollout_tp", t) == t and fixed.get("rollout_dp", d) == d
            and fixed.get("rollout_ep", e) == e]
    return keep or [(fixed.get("rollout_tp", 1), fixed.get("rollout_dp", 1), fixed.get("rollout_ep", 1))]


@dataclass(frozen=True)
class FractionFit:
    """What one rollout shape's memory fractions allow: the largest fraction whose phases keep the headroom (None:
    none does), and where none does, whether one fits the GPU's capacity (check warns MEM002 then, else refuses
    RL005)."""

    fraction: float | None
    within_capacity: bool
    memory: MemoryReport | None = None  # rl_memory at `fraction` where the line estimated it there, else None


def _fraction_fit(job, plan: Plan, reports: tuple, limit: float) -> FractionFit:
    """The largest memory fraction (a FRACTION_STEP multiple, at most MAX_FRACTION) whose phases' fit figures stay
    under `limit` (each phase's fit_bytes, as check's RL005 reads them: with expandable segments a training phase's
    allocated peak): only the rollout phase depends on it, linearly for both engines, so two estimates give the line;
    where none stays under `limit`, the same two estimates say whether one stays under the GPU's capacity."""
    estimated: dict[float, MemoryReport] = {}  # each fraction estimated once, for both caps

    def phases_at(fraction: float) -> tuple[float, float]:
        m = estimated.get(fraction)
        if m is None:
            m = estimated[fraction] = rl_memory(job, plan.model_copy(update={"rollout_memory_fraction": fraction}),
                                                reports)
        rollout = next(p.fit_bytes for p in m.phases if p.phase == "rollout")
        return rollout, max((p.fit_bytes for p in m.phases if p.phase != "rollout"), default=0)

    def largest(cap: float) -> float | None:
        high, others = phases_at(MAX_FRACTION)
        if others > cap:
            return None  # the update or the log-prob passes do not fit: no fraction helps
        if high <= cap:
            return MAX_FRACTION
        low, _ = phases_at(MAX_FRACTION / 2)
        slope = (high - low) / (MAX_FRACTION / 2)
        fraction = MAX_FRACTION - (high - cap) / slope if slope > 0 else 0.0
        steps = int(fraction / FRACTION_STEP + 1e-9)
        return round(steps * FRACTION_STEP, 2) if steps >= 1 else None

    fraction = largest(limit)
    return FractionFit(fraction, fraction is not None or largest(job.gpu.memory_bytes) is not None,
                       estimated.get(fraction))


def _training(req: Request) -> Request:
    """The trainer's step as a training request: the RL fields cleared."""
    trainer_req, rl = resolve_rl(req, [])
    if rl is None:
        raise MeshplanError("recommend_rl needs an RL job.", fix="Pass job=rl with framework verl or skyrl.")
    # every RL field cleared (rl/job.RL_FIELDS: a list kept here lacked enforce_eager), at one mini-batch
    return trainer_request(trainer_req, rl.job)


@dataclass
class RLRanking:
    """The RL steps timed so far over the actor layouts tried: (step seconds, candidate), shapes tried, rejections."""

    ranked: list[tuple[float, Candidate]] = field(default_factory=list)
    tried: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)  # every plan timed, as JSON: none is ranked twice

    def first_time(self, plan: Plan) -> bool:
        """Whether the plan is new to the ranking (two actor layouts, or two offload variants, that make the same RL
        plan give it once)."""
        key = plan.model_dump_json()
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def reject(self, rule: str) -> None:
        self.rejected[rule] = self.rejected.get(rule, 0) + 1


def _rank_actor(out: RLRanking, job, base: Plan, req: Request, actor: Candidate, limit: float) -> None:
    """Every rollout shape and phase offload of one actor layout, each at its largest memory fraction, into `out`."""
    fixed = _fixed(req)
    layout = actor_layout(actor.plan, base)
    for offload in offload_options(job, layout, req):
        plan0 = layout.model_copy(update=offload)
        reports = trainer_reports(job, plan0)
        update = None
        for tp, dp, ep in _rollout_shapes(job, plan0, fixed):
            out.tried += 1
            shape = plan0.model_copy(update={"rollout_tp": tp, "rollout_dp": dp, "rollout_ep": ep})
            fraction, estimated = fixed.get("rollout_memory_fraction"), None
            if fraction is None:
                fit = _fraction_fit(job, shape, reports, limit)
                fraction, estimated = fit.fraction, fit.memory
            if fraction is None:  # none under the headroom: within capacity check warns (MEM002), past it refuses
                out.reject(HEADROOM_RULE if fit.within_capacity else "RL005")
                continue
            plan = shape.model_copy(update={"rollout_memory_fraction": fraction})
            if not out.first_time(plan):
                continue
            memory = estimated or rl_memory(job, plan, reports)  # the fit's estimate where it made one at the fraction
            rollout = next(p for p in memory.phases if p.phase == "rollout")
            over = memory.fit_bytes > limit  # the figure check's RL005 reads (memory.fit_figure), not the reserved peak
            if over or rollout.engine is None or rollout.engine.sequences_at_once < 1:
                # as check names them: a phase past the capacity RL005, within it but over the headroom MEM002
                out.reject(("RL005" if memory.fit_bytes > job.gpu.memory_bytes else HEADROOM_RULE) if over
                           else "RL006")
                continue
            if job.cpu_memory_per_node is not None and memory.host_bytes_per_node > job.cpu_memory_per_node:
                out.reject(HOST_RULE)  # fits the GPUs, but the node's host cannot hold what it offloads, as check says
                continue
            timing, update, words, _ = rl_step_time(job, plan, reports, update)
            report = rl_report(job, plan, timing, update, words)
            # every part the step's table lists beside the largest (the log-prob passes were left out, though they
            # may take longer than the generation named: 7 s beside 4 s on Qwen2.5-7B's 8 H100s)
            why = (f"{rl_plan_words(plan, job.model.is_moe)}: RL step {timing.step_s:,.0f} s, its largest part the "
                   f"{timing.limited_by} (generation {timing.generation_s:,.0f} s, log-prob passes "
                   f"{timing.log_prob_s:,.0f} s, update {timing.update_s:,.0f} s); {memory.peak_phase} "
                   f"peaks at {peak_words(memory)}")
            out.ranked.append((timing.step_s, Candidate(rank=0, plan=plan, memory=memory_summary(memory),
                                                        throughput=report, rationale=why)))


def rl_plan_words(plan: Plan, moe: bool) -> str:
    """An RL plan in words, as every answer that names one row reads it (the RL recommend's rationale, min-gpus' best
    layout): the actor's degrees and knobs, the rollout engine's TP/DP/EP and memory fraction, the phase offloads."""
    return (f"{plan_words(plan)}; rollout {plan.rollout_engine} TP{plan.rollout_tp} DP{plan.rollout_dp}"
            f"{ep_words(moe, plan)} at memory fraction {plan.rollout_memory_fraction:g}; offload {offload_words(plan)}")


def recommend_rl(req: Request, top_k: int = 5, *, rows_only: bool = False) -> Recommendation:
    """The fastest RL steps that fit: actor layout, rollout TP/DP/EP, memory fraction and offloads. The actor
    layouts are the training search's best ACTOR_LAYOUTS; when no RL step fits on any of them, the next ones
    (ACTOR_WIDENING times as many, up to MAX_ACTOR_LAYOUTS), so an RL step that fits on a slower actor is found.
    `rows_only`: for a caller that reads only the ranked rows (minimum_gpus' RL scan): the same rows, and where no
    actor layout fits, not the training search's nothing-fits answer (recommend's explain_impossible), which ranks
    nothing."""
    with shared_layers():  # the actor searches and the RL steps share each layer's time (layer_records)
        return _recommend_rl(req, top_k, rows_only)


def _recommend_rl(req: Request, top_k: int, rows_only: bool = False) -> Recommendation:
    training = _training(req)
    job, base = resolve(req)
    job = job.model_copy(update={"notes": held_notes(job.notes, resolver_settled(req, training))})  # its assumptions
    quiet = job.model_copy(update={"notes": []})  # the candidates' reports, as the training search's: no resolver note
    refuse_host(job, base, training)
    headroom = headroom_for(req)
    limit = (1 - headroom) * job.gpu.memory_bytes
    out = RLRanking()
    engine = actor_engine(job, base, req, training.framework)  # under a host limit: the RL step's host per layout
    count, seen = ACTOR_LAYOUTS, 0
    while True:
        # the ranked rows are all the RL ranking reads of it: not the thinner-headroom probe (a training step's
        # headroom, not the RL phases') nor the decision table
        actors = recommend(training, top_k=count, engine=engine, rows_only=True)
        for actor in actors.candidates[seen:]:
            _rank_actor(out, quiet, base, req, actor, limit)
        seen = len(actors.candidates)
        if out.ranked or seen < count or count >= MAX_ACTOR_LAYOUTS:
            break
        count *= ACTOR_WIDENING
    if not actors.candidates and not rows_only:  # why no actor layout: the training search's whole answer
        actors = recommend(training, top_k=count, engine=engine)  # (its nothing-fits reasons)
    out.ranked.sort(key=lambda x: x[0])
    candidates = [_banded(quiet, c, i + 1) for i, (_, c) in enumerate(out.ranked[:top_k])]
    return _answer(job, base, req, actors, candidates, out, headroom)


def _banded(job, row: Candidate, rank: int) -> Candidate:
    """A ranked RL row with the error band estimate_throughput gives the same job and plan (the RL regime's,
    cards/accuracy.yaml, estimate/accuracy.with_band) and the rationale's 'How sure' sentence, as a training row's."""
    throughput = with_band(row.throughput, job, row.plan)
    sure = how_sure(job, row.plan, throughput.error_band)
    return row.model_copy(update={"rank": rank, "throughput": throughput,
                                  "rationale": f"{row.rationale}. {sure}".rstrip()})


def refuse_host(job, base: Plan, training: Request) -> None:
    """MEM003 before any search: where the framework offloads every trainer model around the rollout itself, the
    node's host must hold the trainer's states (and the reference model's weights) on any layout; a host smaller
    than that floor (least_framework_host) is refused with the numbers and the changes that open it, not searched
    until the estimate budget runs out."""
    capacity = job.cpu_memory_per_node
    if capacity is None:
        return
    trainer, _ = search_job(training)
    fixed = Fixed.from_request(training, trainer)
    params = sum(params_split(trainer))
    states = least_offloaded_state_bytes(trainer, request_zeros(trainer.card, fixed), fixed.carried)
    floor = least_framework_host(job, base, states, params)
    if floor <= capacity:
        return
    nodes = nodes_to_hold(job, floor, capacity)
    setting = phase_setting(job, base)
    ref = (" and the reference model's bf16 weights" if setting.has_ref else "") + (
        ", the critic's states too" if setting.critic_beside_actor else "")
    raise HostRefused(
        f"MEM003: {job.framework} offloads the trainer's models to the host around the rollout ({base.placement} "
        f"placement), which needs at least {floor / GIB:,.1f} GiB of host memory per node on any layout (the states "
        f"of {params / 1e9:,.2f}B parameters{ref} over {plural(job.num_gpus, 'GPU')}, "
        f"{job.gpus_per_node} per node), but "
        f"cpu_memory_per_node is {capacity / GIB:,.1f} GiB: no RL step passes rule MEM003.",
        f"Use nodes with at least {floor / GIB:,.1f} GiB of host memory; or use at least "
        f"{nodes * job.gpus_per_node:,} GPUs ({nodes:,} nodes, a smaller share per node); or placement=separate "
        "with rollout_gpus (the trainer then keeps its models on the GPU).")


def _answer(job, base: Plan, req: Request, actors: Recommendation, candidates: list[Candidate], out: RLRanking,
            headroom: float) -> Recommendation:
    """The RL Recommendation; with no actor layout for the trainer's step, the training search's own reasons."""
    best = candidates[0] if candidates else None
    if best is not None:
        rationale = f"#1: {best.rationale}"
    elif not actors.candidates:
        host = ("" if job.cpu_memory_per_node is None or not actors.rejected.get(HOST_RULE) else
                " (under cpu_memory_per_node the actor search counts a layout whose RL step's offloads the node's "
                "host cannot hold, on any phase offload, under MEM003)")
        rationale = f"No actor layout for the trainer's step{host}, so no RL step: {actors.rationale}"
    else:
        why = {"RL005": "a phase over the GPU's memory", HEADROOM_RULE: "a phase within memory but over the headroom",
               "RL006": "no room for one sequence's KV cache",
               HOST_RULE: "more offloaded state than the node's host holds (cpu_memory_per_node)"}
        counts = ", ".join(f"{why[rule]} ({rule}) x{n:,}" for rule, n in sorted(out.rejected.items(),
                                                                                key=lambda kv: -kv[1]))
        rationale = (f"No RL step fits on the training search's best {len(actors.candidates)} actor layouts (its "
                     f"fastest; a slower one is not proven not to fit): every rollout shape and phase offload of them "
                     f"leaves {counts}.")
    rejected = out.rejected if actors.candidates else dict(actors.rejected)
    host = ("" if job.cpu_memory_per_node is None else
            f" and whose offloads the node's {job.cpu_memory_per_node / GIB:,.1f} GiB host holds (MEM003)")
    total = req.num_gpus or job.num_gpus  # the request's, which resolve_rl split into the trainer's (job's) share
    return Recommendation(
        model=job.model.name, framework=job.framework, num_gpus=total, candidates=candidates,
        trainer_gpus=job.num_gpus if total != job.num_gpus else None,
        considered=out.tried if actors.candidates else actors.considered, rejected=rejected,
        global_batch_size=job.global_batch_size, gpus_per_node=job.gpus_per_node, headroom=headroom,
        rationale=rationale, closest=[] if actors.candidates else actors.closest, min_gpus=None,
        # the actor search ends its warnings with the trainer job's own (job_warnings), which the RL job's hold in the
        # same words (the same model and knobs; RL008 the RL job's alone): each said once
        warnings=list(dict.fromkeys([*actors.warnings, *job_warnings(job)])),
        assumptions=[f"Actor layouts: the training search's best {len(actors.candidates)} for the trainer's step; "
                     "for each, every rollout TP/DP/EP the engines can run, with and without phase offloads, at the "
                     f"largest memory fraction (<= {MAX_FRACTION}) whose phases keep the headroom{host}; ranked by "
                     "the RL step time.", *job.notes],
    )
