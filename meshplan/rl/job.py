"""An RL post-training job (verl, SkyRL) as a request states it: the RL fields, the framework's defaults for those
left out (the `rl` section of its card, meshplan/knowledge/rl_card.py), every default noted, and the trainer's
request the rest of meshplan plans (its GPUs, prompt + response tokens, prompts x samples sequences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pydantic import BaseModel

from meshplan.arithmetic.mesh import rl_job_gpus
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import FrameworkCard, framework_card, rl_card, rl_frameworks
from meshplan.knowledge.rl_card import RLCard, RLDefaults
from meshplan.schema.choices import Placement, RLAlgorithm, RolloutEngine
from meshplan.schema.plan import Plan, RLJob
from meshplan.schema.request import Request

RL_FIELDS = ("algorithm", "prompts_per_step", "samples_per_prompt", "prompt_length", "response_length",
             "mean_response_length", "mean_prompt_length", "prompts_per_mini_batch", "update_epochs", "entropy_coeff",
             "rollout_engine", "rollout_tp", "rollout_dp",
             "rollout_ep", "rollout_memory_fraction", "placement", "rollout_gpus", "rollout_enforce_eager")


class ResolvedRL(BaseModel):
    """What `resolve_rl` decided: the job's workload and the rollout fields the plan carries."""

    job: RLJob
    engine: RolloutEngine
    tp: int
    dp: int
    ep: int
    memory_fraction: float
    placement: Placement
    rollout_gpus: int | None
    enforce_eager: bool = False
    critic_apart: bool = False  # PPO's critic on GPUs of its own, as many as the policy's (SkyRL, placement separate)

    def job_gpus(self, trainer_gpus: int) -> int:
        """The whole job's GPUs for this many trainer GPUs (rl_job_gpus)."""
        return rl_job_gpus(trainer_gpus, self.critic_apart, self.placement, self.rollout_gpus)

    def plan_fields(self, trainer_gpus: int) -> dict:
        """The plan's rollout_* fields; a colocated engine spans the trainer's GPUs unless the request said else."""
        return dict(rollout_engine=self.engine, rollout_tp=self.tp, rollout_dp=self.dp, rollout_ep=self.ep,
                    rollout_memory_fraction=self.memory_fraction, placement=self.placement,
                    rollout_gpus=self.rollout_gpus or trainer_gpus, rollout_enforce_eager=self.enforce_eager)


TRAINING_VALUES = {name: Plan.model_fields[name].default for name in RL_FIELDS if name in Plan.model_fields}
"""What a training job's Plan carries in the RL fields it has (rollout_enforce_eager=False, the others None): a
plan fed back as a request states them without asking for RL."""


def rl_fields_given(req: Request) -> list[str]:
    """The RL fields the request gives a value a training plan does not carry (TRAINING_VALUES): those that ask
    for an RL job, or that a training job refuses."""
    return [name for name in RL_FIELDS if getattr(req, name) is not None
            and getattr(req, name) != TRAINING_VALUES.get(name)]


def is_rl_request(req: Request) -> bool:
    """Whether the request is an RL job: job=rl, or an RL field given (rl_fields_given) with the job left out."""
    return req.job == "rl" or (req.job is None and bool(rl_fields_given(req)))


@dataclass(frozen=True)
class _Defaults:
    """Fills a field the request left out with the framework's own default, and notes it."""

    framework: str
    notes: list[str]

    def pick(self, value, default, field: str, why: str = ""):
        if value is not None:
            return value
        self.notes.append(f"{field} not given: {default}, the {self.framework} default{why}.")
        return default


class _Workload(NamedTuple):
    """The step's sequences as resolved: the algorithm, prompts x samples, prompt + response tokens (the longest
    response, and the mean where the request states one)."""

    algorithm: RLAlgorithm
    prompts: int
    samples: int
    prompt: int
    response: int
    mean_response: int | None = None
    mini_batch: int | None = None
    mean_prompt: int | None = None


class _Rollout(NamedTuple):
    """The rollout engine's fields as resolved (given or the framework's defaults)."""

    engine: RolloutEngine
    tp: int
    dp: int
    ep: int
    memory_fraction: float
    placement: Placement


def resolve_rl(req: Request, notes: list[str]) -> tuple[Request, ResolvedRL | None]:
    """An RL request as the trainer's request (its GPUs, prompt + response tokens, prompts x samples sequences) and
    the RL settings, every default noted; a training request unchanged with None. RL fields on a training job or on
    a framework without an `rl` card section are errors naming what is allowed."""
    given = rl_fields_given(req)
    if req.job in ("pretrain", "sft", "lora") or (req.job is None and not given):
        _refuse_rl_fields(req, given)
        return req, None
    card = rl_card(req.framework)
    if card is None:
        raise MeshplanError(f"{req.framework} runs no RL job (job=rl{', ' + ', '.join(given) if given else ''}).",
                            fix=f"Use framework {' or '.join(rl_frameworks())}, or leave the RL fields out.")
    if req.job is None:
        notes.append(f"job not given: rl, as {', '.join(given)} {'is' if len(given) == 1 else 'are'} given.")
    defaults = _Defaults(req.framework, notes)
    work = _workload(req, card.defaults, defaults)
    req = _critic_engine(req, card, work.algorithm, notes)
    rollout = _rollout_fields(req, card, defaults)
    critic_apart = card.critic_on_own_gpus(work.algorithm, rollout.placement)
    rollout_gpus, trainer_gpus = _pools(req, rollout, notes, critic_apart)
    job = RLJob(algorithm=work.algorithm, prompts_per_step=work.prompts, samples_per_prompt=work.samples,
                prompt_length=work.prompt, response_length=work.response, mean_response_length=work.mean_response,
                 mean_prompt_length=work.mean_prompt, prompts_per_mini_batch=work.mini_batch,
                 update_epochs=req.update_epochs,
                 entropy_coeff=card.defaults.entropy_coeff if req.entropy_coeff is None else req.entropy_coeff)
    rl = ResolvedRL(job=job, engine=rollout.engine, tp=rollout.tp, dp=rollout.dp, ep=rollout.ep,
                    memory_fraction=rollout.memory_fraction, placement=rollout.placement,
                    rollout_gpus=rollout_gpus, enforce_eager=bool(req.rollout_enforce_eager), critic_apart=critic_apart)
    trainer = req.model_copy(update={"num_gpus": trainer_gpus, "seq_length": work.prompt + work.response,
                                     "global_batch_size": work.prompts * work.samples})
    return trainer, rl


def trainer_request(trainer: Request, rl: RLJob | None = None) -> Request:
    """The trainer's own training request (resolve_rl's first answer with every RL field cleared): what the training
    search ranks actor layouts for, on the RL launcher's allocator where the request leaves it out (verl's workers
    turn expandable segments on, its SFT trainer, a training job's, does not: the card's allocator). With the
    resolved `rl` naming a mini-batch smaller than the step, its batch is one mini-batch's sequences: the update runs
    its pipeline schedule, and so holds its micro-batches in flight, once per mini-batch (rl/memory.
    update_micro_batches, rl/step_time.mini_batch_update), so the actor layouts are ranked and sized at that batch;
    at the whole step's, a deep pipeline's memory was counted at micro-batches it never holds at once."""
    card = framework_card(trainer.framework)
    cleared: dict = dict.fromkeys(("job", *RL_FIELDS, *rl_phase_only_offloads(trainer, card)))
    if rl is not None and rl.splits_step:
        cleared["global_batch_size"] = rl.mini_batch_sequences
    allocator = card.allocator_for(True)
    if trainer.expandable_segments is None and allocator is not None:
        cleared["expandable_segments"] = allocator.expandable_segments
    return trainer.model_copy(update=cleared)


def rl_phase_only_offloads(req: Request, card: FrameworkCard) -> list[str]:
    """The offload knobs set on `req` that act only between an RL step's phases on each engine its zero_stage may run
    (the card's offload: when phase, phase_offloads_when rl, as SkyRL's optimizer_offload): the training request
    ranks the update step, which has no phases, and rule OF001 refuses them on a training job; the RL plan keeps
    them (search/rl_actor.actor_layout takes the offload fields from the RL request's plan). `card`: the request's
    framework's, which trainer_request looked up."""
    engines = ([card.offload_at(req.zero_stage)] if req.zero_stage is not None else list(card.offload.values()))
    return [knob for knob in ("param_offload", "grad_offload", "optimizer_offload")
            if getattr(req, knob) and engines and all(
                sem is not None and sem.phase_offloads_when == "rl"
                and getattr(sem, knob.removesuffix("_offload")).when == "phase" for sem in engines)]


def _refuse_rl_fields(req: Request, given: list[str]) -> None:
    """A training job carries no RL field."""
    if given:
        what = "is an RL field" if len(given) == 1 else "are RL fields"
        raise MeshplanError(f"{', '.join(given)} {what}, not for job={req.job}.",
                            fix=f"Drop {'it' if len(given) == 1 else 'them'}, or pass job=rl (frameworks: "
                                + ", ".join(rl_frameworks()) + ").")


def _workload(req: Request, d: RLDefaults, defaults: _Defaults) -> _Workload:
    """The algorithm and the step's sequences: prompts x samples, prompt + response tokens; global_batch_size and
    seq_length, when given, must agree with them (or give the prompts and the prompt length)."""
    pick, notes = defaults.pick, defaults.notes
    algorithm = pick(req.algorithm, d.algorithm, "algorithm")
    n = pick(req.samples_per_prompt, d.samples_per_prompt, "samples_per_prompt")
    prompts = req.prompts_per_step
    if prompts is None and req.global_batch_size is not None:
        if req.global_batch_size % n:
            raise MeshplanError(f"global_batch_size {req.global_batch_size} is not a whole number of prompts of "
                                f"{n} samples.", fix=f"Pass prompts_per_step, or a multiple of {n}.")
        prompts = req.global_batch_size // n
        notes.append(f"prompts_per_step not given: {prompts} = global_batch_size / samples_per_prompt {n}.")
    prompts = pick(prompts, d.prompts_per_step, "prompts_per_step")
    if req.global_batch_size is not None and req.global_batch_size != prompts * n:
        raise MeshplanError(f"global_batch_size {req.global_batch_size} is not prompts_per_step x samples_per_prompt "
                            f"= {prompts} x {n} = {prompts * n}.", fix="Leave global_batch_size out for an RL job.")
    # seq_length counts as given when it is not the field's default: the MCP tools send every default explicitly
    seq_given = req.seq_length != Request.model_fields["seq_length"].default
    response = pick(req.response_length, d.response_length, "response_length")
    prompt = req.prompt_length
    if prompt is None and seq_given and req.seq_length > response:
        prompt = req.seq_length - response
        notes.append(f"prompt_length not given: {prompt} = seq_length - response_length.")
    prompt = pick(prompt, d.prompt_length, "prompt_length")
    if seq_given and req.seq_length != prompt + response:
        raise MeshplanError(f"seq_length {req.seq_length} is not prompt_length + response_length = {prompt} + "
                            f"{response} = {prompt + response}.", fix="Leave seq_length out for an RL job.")
    return _Workload(algorithm=algorithm, prompts=prompts, samples=n, prompt=prompt, response=response,
                     mean_response=_mean_length("mean_response_length", req.mean_response_length, "response_length",
                                                response),
                     mini_batch=_mini_batch(req.prompts_per_mini_batch, prompts, notes),
                     mean_prompt=_mean_length("mean_prompt_length", req.mean_prompt_length, "prompt_length", prompt))


def _mini_batch(mini: int | None, prompts: int, notes: list[str]) -> int | None:
    """The prompts of one optimizer step, at most the step's prompts (verl asserts train_batch_size >=
    ppo_mini_batch_size). None: the whole step in one optimizer step, as meshplan renders it."""
    if mini is None:
        notes.append(f"prompts_per_mini_batch not given: {prompts} (prompts_per_step), one optimizer step per RL "
                     "step.")
        return None
    if mini > prompts:
        raise MeshplanError(f"prompts_per_mini_batch {mini} is over prompts_per_step {prompts}: a mini-batch is a "
                            "share of the step's prompts.",
                            fix=f"Pass prompts_per_mini_batch from 1 to {prompts} (prompts_per_step), or raise "
                                "prompts_per_step.")
    return mini


def _mean_length(name: str, mean: int | None, longest_name: str, longest: int) -> int | None:
    """A mean length (of the responses or the prompts), at most the longest: the trainer's memory is planned for the
    longest, its passes cost the mean. None: every one at the longest."""
    if mean is not None and mean > longest:
        what = longest_name.split("_")[0]
        raise MeshplanError(f"{name} {mean} is over {longest_name} {longest}: the mean of the {what}s' lengths "
                            "cannot exceed the longest.",
                            fix=f"Pass {name} from 1 to {longest} ({longest_name}), or raise {longest_name} to the "
                                f"longest {what}.")
    return mean


def _critic_engine(req: Request, card: RLCard, algorithm: RLAlgorithm, notes: list[str]) -> Request:
    """An algorithm with a critic runs on an engine the framework trains a critic on (the card's rl.critic_engines:
    SkyRL's FSDP strategy only): a zero_stage of another engine is refused, one left out becomes the lowest stage of
    those engines where the framework's default is not one (so recommend searches only them)."""
    if not card.critic[algorithm]:
        return req
    fc = framework_card(req.framework)
    allowed = card.critic_engines
    stages = sorted(z for z, engine in fc.engine.by_zero_stage.items() if engine in allowed)
    if req.zero_stage is not None:
        if fc.engine_at(req.zero_stage) not in allowed:
            raise MeshplanError(
                f"{algorithm.upper()} trains a critic, which {req.framework} runs only on its "
                f"{' or '.join(allowed)} engine, not on zero_stage {req.zero_stage}'s "
                f"{fc.engine_at(req.zero_stage)}.",
                fix=f"Use zero_stage {' or '.join(map(str, stages))}, or algorithm grpo or dapo (no critic).")
        return req
    if fc.engine_at(fc.defaults.zero_stage) in allowed:
        return req
    notes.append(f"zero_stage not given: {stages[0]}, as {req.framework} trains {algorithm.upper()}'s critic only on "
                 f"its {' or '.join(allowed)} engine.")
    return req.model_copy(update={"zero_stage": stages[0]})


def _rollout_fields(req: Request, card: RLCard, defaults: _Defaults) -> _Rollout:
    """The engine (one the framework runs), its TP/DP/EP, memory fraction and placement."""
    d, pick = card.defaults, defaults.pick
    engine = pick(req.rollout_engine, d.engine, "rollout_engine")
    if engine not in card.engines:
        raise MeshplanError(f"{req.framework} runs no {engine} rollout engine.",
                            fix=f"Use rollout_engine {' or '.join(card.engines)}.")
    tp = pick(req.rollout_tp, d.rollout_tp, "rollout_tp")
    dp = pick(req.rollout_dp, d.rollout_dp, "rollout_dp")
    ep = pick(req.rollout_ep, d.rollout_ep, "rollout_ep")
    fraction = pick(req.rollout_memory_fraction, d.memory_fraction, "rollout_memory_fraction")
    placement = pick(req.placement, d.placement, "placement")
    return _Rollout(engine=engine, tp=tp, dp=dp, ep=ep, memory_fraction=fraction, placement=placement)


def _pools(req: Request, rollout: _Rollout, notes: list[str], critic_apart: bool) -> tuple[int | None, int | None]:
    """The rollout engine's GPUs and the trainer's: a separate pool takes its GPUs out of num_gpus (and must be
    given), and where the framework then runs PPO's critic on GPUs of its own (`critic_apart`: SkyRL), half of the
    rest are the critic's (meshplan renders it with the policy's count); a colocated engine spans the trainer's GPUs
    unless the request says else."""
    rollout_gpus = req.rollout_gpus
    trainer_gpus = req.num_gpus
    tp, dp = rollout.tp, rollout.dp
    if rollout.placement == "separate":
        if rollout_gpus is None:
            raise MeshplanError("placement separate needs rollout_gpus, the GPUs the rollout engine runs on.",
                                fix=f"Pass rollout_gpus, a multiple of rollout_tp x rollout_dp = {tp * dp}.")
        if trainer_gpus is not None:
            if rollout_gpus >= trainer_gpus:
                raise MeshplanError(f"rollout_gpus {rollout_gpus} leaves no GPU of num_gpus {trainer_gpus} to the "
                                    "trainer (placement separate takes them out of num_gpus).",
                                    fix=f"Pass rollout_gpus below {trainer_gpus}, or placement colocated.")
            trainer_gpus -= rollout_gpus
            if critic_apart:
                trainer_gpus = _critic_split(req, trainer_gpus, rollout_gpus)
                notes.append(f"placement separate with PPO on {req.framework}: the policy and reference run on "
                             f"{trainer_gpus} GPUs, the critic on {trainer_gpus} of its own (as many as the "
                             f"policy's), the rollout engine on {rollout_gpus}.")
            else:
                notes.append(f"placement separate: the trainer runs on {trainer_gpus} GPUs, the rollout engine on "
                             f"{rollout_gpus}.")
        elif critic_apart:
            notes.append(f"placement separate with PPO on {req.framework}: the critic runs on GPUs of its own, as many "
                         "as the policy's, beside the rollout engine's.")
    elif rollout_gpus is None:
        notes.append("rollout_gpus not given: the trainer's GPUs (colocated).")
    return rollout_gpus, trainer_gpus


def _critic_split(req: Request, rest: int, rollout_gpus: int) -> int:
    """The policy's GPUs where PPO's critic takes as many of its own: half of those the rollout leaves."""
    if rest % 2:
        raise MeshplanError(
            f"num_gpus {req.num_gpus} - rollout_gpus {rollout_gpus} = {rest} GPUs cannot be split evenly between the "
            f"policy and PPO's critic: {req.framework} with placement separate runs the critic on GPUs of its own, as "
            "many as the policy's.",
            fix=f"Pass num_gpus = rollout_gpus + twice the policy's GPUs (e.g. {rollout_gpus + rest + 1}), or a "
                "rollout_gpus that leaves an even number, or placement colocated.")
    return rest // 2


def is_rl(plan: Plan) -> bool:
    return plan.rollout_tp is not None
