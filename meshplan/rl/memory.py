"""Memory per phase of an RL step: the rollout, the log-prob passes, the actor's (and PPO's critic's) update, each on
the worst pipeline stage, and the host memory per node beside them.

The actor update is meshplan.estimate.memory.estimate_memory (with the in-step offloads); around it, the states a
phase offload moves to the host leave the GPU between phases, so they cut the rollout's and log-prob passes' memory,
not the update's peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from meshplan.arithmetic.memory_states import MemoryCard, memory_card
from meshplan.arithmetic.mesh import ranks_per_node
from meshplan.arithmetic.offload import offload_plan
from meshplan.core.units import GIB
from meshplan.estimate.memory import (
    estimate_memory,
    forward_gathered_bytes,
    memory_budget,
    peak_fit_bytes,
    stage_allocated,
)
from meshplan.rl.engine import ENGINE_BYTES, engine_memory, graph_bytes
from meshplan.rl.packing import largest_micro_batch_tokens, packed_micro_batch_count
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import EngineMemory, PhaseMemory


def job_memory(job, plan: Plan):
    """The memory report every caller takes: the training step's, or for an RL job the peak over its phases."""
    return rl_memory(job, plan) if job.rl is not None else estimate_memory(job, plan)


def _forward_only(plan: Plan) -> Plan:
    """The plan as a forward-only pass sees it: full recompute's report keeps one working layer and the logits."""
    return plan.model_copy(update={"recompute": "full", "recompute_layers": None, "recompute_method": None,
                                   "recompute_modules": None, "selective_ac_option": None})


def packing_args(job, plan: Plan) -> tuple | None:
    """packed_tokens', update_micro_batches' and the step time's slowest rank's arguments to rl/packing.py (budget,
    one rank's mini-batch sequences, lengths, dp, vpp divisor), or None where the framework does not pack to a token
    budget (the card's rl.packed_micro_batches) or every sequence is at its longest."""
    rl = job.rl
    if not job.rl_card.packed_micro_batches or rl.token_share >= 1:
        return None
    return (plan.micro_batch_size * job.seq_length, rank_mini_batch(job, plan), rl.prompt_length, rl.response_length,
            rl.mean_prompt, rl.mean_response, plan.dp, plan.pp if plan.vpp > 1 else 1)


def rank_mini_batch(job, plan: Plan) -> int:
    """One data-parallel rank's sequences of one mini-batch (prompts_per_mini_batch x samples / dp; the whole step's
    where the request names no mini-batch): what one optimizer step of the update runs on that rank."""
    rl = job.rl
    return max(1, rl.mini_batch_sequences // plan.dp)


def packed_tokens(job, plan: Plan) -> int:
    """The update's largest micro-batch, tokens: the planned micro_batch_size sequences of prompt + response, or where
    the framework packs to a token budget with no cap (the card's rl.packed_micro_batches: verl's use_dynamic_bsz,
    the budget read into micro_batch_size x seq_length) the largest its packing makes of one rank's mini-batch at the
    request's lengths (rl/packing.py), the count the MAX over the DP ranks and, where virtual stages interleave, rounded
    up to a multiple of microbatch_group_size_per_vp_stage (Megatron's default: the pipeline size)."""
    planned, packing = plan.micro_batch_size * job.seq_length, packing_args(job, plan)
    return planned if packing is None else max(planned, largest_micro_batch_tokens(*packing))


def update_micro_batches(job, plan: Plan) -> int:
    """Micro-batches one run of the update's pipeline schedule takes on a rank: one mini-batch's, since the trainer
    steps the optimizer after each (verl's megatron_actor.update_policy calls forward_backward_batch per mini-batch,
    which hands Megatron-Core's forward_backward_func num_microbatches = its micro-batches; SkyRL's training batch is
    its policy_mini_batch_size, the card's global_batch_size key; the step time's mini_batch_update likewise): the
    mini-batch's sequences over micro_batch_size, or where the framework packs to a token budget the count its packing
    makes (rl/packing.py packed_micro_batch_count). A stage holds min(this, pp - r) of them (1F1B), so a mini-batch of
    fewer micro-batches than stages fills no pipeline."""
    packing = packing_args(job, plan)
    if packing is None:
        return max(1, rank_mini_batch(job, plan) // plan.micro_batch_size)
    return packed_micro_batch_count(*packing)


def _packed_job(job, plan: Plan):
    """The job as the update's schedule sees it: one mini-batch of update_micro_batches micro-batches on each rank
    (global_batch_size, which the memory estimate reads its micro-batches per schedule run from), each at the largest
    micro-batch's tokens (seq_length its tokens over micro_batch_size)."""
    tokens = packed_tokens(job, plan)
    update = {"global_batch_size": update_micro_batches(job, plan) * plan.micro_batch_size * plan.dp}
    if tokens != plan.micro_batch_size * job.seq_length:
        update["seq_length"] = -(-tokens // plan.micro_batch_size)
    return job.model_copy(update=update)


def trainer_reports(job, plan: Plan) -> tuple:
    """The actor update's memory report and the forward-only one (the log-prob passes), both at the largest micro-
    batch (packed_tokens): what every rollout choice of one trainer layout shares (recommend computes them once per
    layout). The forward-only one is the no-grad pass's own loss (RLJob.log_prob_pass: memory_states.rl_loss_bytes)."""
    packed = _packed_job(job, plan)
    passes = packed.model_copy(update={"rl": packed.rl.model_copy(update={"log_prob_pass": True})})
    return estimate_memory(packed, plan), estimate_memory(passes, _forward_only(plan))


class StateLoads(NamedTuple):
    """How many times one RL step moves one model's phase-offloaded states to the GPU (and, each but a per-unit
    reference, back out): its weights, and the states only its update needs (gradients, optimizer)."""

    weights: int
    update: int


@dataclass(frozen=True)
class PhaseSetting:
    """What every pipeline stage's phases share: the states that leave the GPU between phases, the models the
    algorithm keeps, the fixed overheads and a colocated engine's CUDA graphs."""

    knob_classes: frozenset[str]  # what the offload knobs move to the host between phases (the estimate's host)
    phase_classes: frozenset[str]  # what is on the host between phases: the knobs' and the framework's own offload's
    freed: frozenset[str]  # what is released between phases, on neither GPU nor host (the gradients, by the engine)
    auto: bool  # the framework offloads every trainer model itself (SkyRL's colocate_all)
    has_ref: bool
    ref_on_host: bool  # the reference model's weights are on the host between its passes
    ref_per_unit: bool  # ...and come back one FSDP unit at a time in its pass (verl's FSDP CPU offload), not whole
    has_critic: bool
    critic_apart: bool  # PPO's critic runs on GPUs of its own (SkyRL with the rollout placed apart)
    mem: MemoryCard
    fixed: float
    colocated: bool
    capacity: float
    graphs: float
    loads: dict[str, StateLoads]  # state_loads: each trainer model's loads in one step, the step time's traffic too

    @property
    def critic_beside_actor(self) -> bool:
        """PPO's critic on the actor's GPUs (and host): its states resident beside the actor's and offloaded with
        them; on GPUs of its own (critic_apart) only its update counts, on its own pool."""
        return self.has_critic and not self.critic_apart


def freed_classes(job: Job, zero_stage: int) -> frozenset[str]:
    """The state classes the trainer engine at this ZeRO stage frees after the actor's update, so that between phases
    they are on neither the GPU nor the host: the FSDP engines' gradients (verl's and SkyRL's last
    optimizer.zero_grad() sets them to None; the card's rl.gradients_freed_after_update, with its sources)."""
    card = job.rl_card
    engine = job.card.engine_at(zero_stage)
    freed = card is not None and card.gradients_freed_after_update.get(engine, False)
    return frozenset({"gradients"}) if freed else frozenset()


def framework_offload(job: Job, zero_stage: int) -> tuple[frozenset[str], frozenset[str]]:
    """What the framework's own offload around a colocated rollout (SkyRL's colocate_all) does with the actor's
    states on the engine of this ZeRO stage, beyond the offload knobs: (copied to the host, released), the card's
    rl.colocated_offload_states with its sources, less what the engine already freed after the update. Empty where
    the framework offloads only by its knobs (verl)."""
    card = job.rl_card
    if card is None or not card.colocated_offload:
        return frozenset(), frozenset()
    own = card.colocated_offload_states[job.card.engine_at(zero_stage)]
    done = freed_classes(job, zero_stage)
    return frozenset(own.moves) - done, frozenset(own.frees) - done


def critic_apart(job, plan: Plan) -> bool:
    """Whether PPO's critic runs on GPUs of its own, as many as the policy's: where the framework puts it there with
    the rollout placed apart (the card's rl.critic_apart_when_separate, with its source: SkyRL), not beside the actor
    (verl's trainer pool)."""
    return job.rl_card.critic_on_own_gpus(job.rl.algorithm, plan.placement)


def state_loads(job, plan: Plan) -> dict[str, StateLoads]:
    """Per trainer model (actor, reference, critic), the loads of its phase-offloaded states in one RL step, from the
    card's rl.step_phases: the phases at the plan's placement of the models the algorithm has (PPO's critic only
    beside the actor: on GPUs of its own, `critic_apart`, it is not moved). rl.phase_offload around (verl): a load
    for each phase that runs the model, its update states for each update; swap (SkyRL): the states stay until
    another model of those phases runs, so a load for each run of the model's consecutive phases, taken round the
    step as the loop repeats it, its update states for each run holding an update, none where one model alone runs.
    A card with no phases: once each. A model the step does not run: (0, 0)."""
    card, algorithm = job.rl_card, job.rl.algorithm
    present = {"actor": True, "rollout": True, "reference": card.reference_model[algorithm],
               "critic": card.critic[algorithm] and not critic_apart(job, plan)}
    models = ("actor", "reference", "critic")
    if not card.step_phases:
        return {m: StateLoads(int(present[m]), int(present[m])) for m in models}
    phases = [p for p in card.step_phases
              if present[p.model] and p.placement in (None, plan.placement)]
    loads = {m: [0, 0] for m in models}
    if card.phase_offload == "around":
        for p in phases:
            if p.model in loads:
                loads[p.model][0] += 1
                loads[p.model][1] += p.runs == "update"
    elif len({p.model for p in phases}) > 1:
        runs: list[list] = []  # each run of one model's consecutive phases, the last joined to the first (the loop)
        for p in phases:
            if runs and runs[-1][0].model == p.model:
                runs[-1].append(p)
            else:
                runs.append([p])
        if len(runs) > 1 and runs[0][0].model == runs[-1][0].model:
            runs[0] += runs.pop()
        for run in runs:
            if run[0].model in loads:
                loads[run[0].model][0] += 1
                loads[run[0].model][1] += any(p.runs == "update" for p in run)
    return {m: StateLoads(*n) for m, n in loads.items()}


def phase_setting(job, plan: Plan) -> PhaseSetting:
    card = job.rl_card
    rl = job.rl
    off = offload_plan(job.card, plan)
    knob_classes = off.phase - off.phase_freed
    # SkyRL's colocate_all offloads every model around the rollout; placed apart, colocate_policy_ref still swaps the
    # policy and the reference through the host; the actor alone there (no reference) swaps with nothing, so no
    # state of it leaves the GPU, the knobs' neither (SkyRL's offload_after_step acts in offload_to_cpu alone)
    loads = state_loads(job, plan)
    swapped = loads["actor"].weights > 0
    auto = card.colocated_offload and (plan.placement == "colocated" or card.separate_offload) and swapped
    own_moves, own_frees = framework_offload(job, plan.zero_stage) if auto else (frozenset(), frozenset())
    freed = freed_classes(job, plan.zero_stage) | off.phase_freed | own_frees
    mem = memory_card()
    colocated = plan.placement == "colocated"
    engine = job.card.engine_at(plan.zero_stage)
    ref_host = card.reference_on_host.get(engine, "param_offload")
    ref_on_host = ref_host == "always" or plan.param_offload or auto
    has_critic = card.critic[rl.algorithm]
    return PhaseSetting(
        knob_classes=knob_classes, phase_classes=(knob_classes | own_moves) - freed if swapped else frozenset(),
        freed=freed, auto=auto,
        has_ref=card.reference_model[rl.algorithm],
        ref_on_host=ref_on_host, ref_per_unit=ref_on_host and card.reference_pass_weights.get(engine) == "per_unit",
        has_critic=has_critic, critic_apart=critic_apart(job, plan), mem=mem,
        fixed=mem.fixed_overhead_bytes + mem.cuda_context_bytes, colocated=colocated, capacity=job.gpu.memory_bytes,
        graphs=graph_bytes(plan) if colocated else 0.0, loads=loads,
    )


class StagePeak(NamedTuple):
    """One phase's peak on one pipeline stage: its bytes, their parts, and a note."""

    total: float
    detail: dict
    note: str
    engine: EngineMemory | None = None  # the rollout's engine


@dataclass(frozen=True)
class StagePhases:
    """One pipeline stage in every phase (the rollout only where the engine shares the GPUs), the allocator reserve
    inside its log-prob and update peaks."""

    rollout: StagePeak | None
    log_prob: StagePeak
    actor: StagePeak
    critic: StagePeak | None
    forward_reserve: float
    update_reserve: float  # what of the update's peak is not allocated at its allocated peak (memory.stage_allocated)
    engine_note: str


def state_bytes(s) -> dict[str, float]:
    """One stage report's model states per class (the classes the offload knobs and the framework's offload name)."""
    return {"weights": s.weights_bytes, "gradients": s.gradients_bytes, "optimizer": s.optimizer_bytes}


def reference_bytes(setting: PhaseSetting, s) -> float:
    """The reference model's (GRPO's and PPO's KL) bf16 weights on one GPU of stage report `s`: built as the actor is,
    in its layout and sharded as its weights are (the estimate's weight_params: over the FSDP group under ZeRO-3,
    verl's and SkyRL's FSDP reference workers; the actor's TP/PP/EP under Megatron), 0 without one."""
    return ENGINE_BYTES * s.detail.get("weight_params", 0) if setting.has_ref else 0.0


def stage_phases(job, plan: Plan, setting: PhaseSetting, s, f, gathered: float = 0.0) -> StagePhases:
    """One stage's phases from its update report `s` and forward-only report `f`. The reference model keeps its
    weights (reference_bytes) on the GPU between its passes unless on the host (setting.ref_on_host: verl's FSDP
    reference always, else with param_offload as verl's ref.megatron.param_offload follows the actor's); in its pass
    they are back whole, or one FSDP unit at a time (setting.ref_per_unit). Every forward pass of an FSDP model holds
    its gathered units (`gathered`: estimate.memory.forward_gathered_bytes). The states the engine frees after the
    update (setting.freed) are not resident. PPO's critic is counted as a second copy of the actor's states: on the
    actor's GPUs, or on its own (setting.critic_apart) where only its update is."""
    x, mem, fixed, graphs = setting, setting.mem, setting.fixed, setting.graphs
    states = state_bytes(s)
    between = sum(v for cls, v in states.items() if cls not in x.phase_classes | x.freed)
    ref = reference_bytes(x, s)
    ref_resident = 0.0 if x.ref_on_host else ref
    ref_pass = 0.0 if x.ref_per_unit else ref  # the reference's own weights on the GPU in its pass, beside `gathered`
    critic_resident = between if x.critic_beside_actor else 0.0
    acts = f.detail.get("recompute_working_layer", 0) + f.detail.get("logits_and_loss", 0)
    fwd = acts * (1 + mem.allocator_reserve_fraction)
    resident = between + ref_resident + critic_resident
    rollout, engine_note = None, ""
    if x.colocated:
        engine = engine_memory(job, plan, x.capacity - resident - fixed)
        engine_note = engine.note
        rollout = StagePeak(resident + fixed + engine.gpu_bytes,
                            {"trainer_resident": between, "reference_resident": ref_resident,
                             "critic_resident": critic_resident, "engine": engine.gpu_bytes,
                             "engine_weights": engine.weights_bytes, "kv_cache": engine.kv_bytes,
                             "sequences_at_once": engine.sequences_at_once, "fixed": fixed}, engine.note, engine)
    actor_fwd = states["weights"] + between - (states["weights"] if "weights" not in x.phase_classes else 0)
    log_prob = StagePeak(max(actor_fwd + ref_resident, between + ref_pass) + critic_resident + gathered + fwd + fixed
                         + graphs,
                         {"policy_or_reference_weights": max(states["weights"], ref_pass), "gathered_units": gathered,
                          "forward_activations": fwd, "resident": between + ref_resident + critic_resident,
                          "cuda_graphs": graphs, "fixed": fixed}, "old-policy and reference forward passes, one "
                         "micro-batch")
    actor = StagePeak(s.total_bytes + ref_resident + critic_resident + graphs,
                      {"update": s.total_bytes, "reference_resident": ref_resident,
                       "critic_resident": critic_resident, "cuda_graphs": graphs,
                       "micro_batch_tokens": packed_tokens(job, plan)},
                      "the training step's peak (the stage table), with the reference and critic held beside it")
    critic = None
    if x.critic_apart:
        critic = StagePeak(s.total_bytes, {"update": s.total_bytes},
                           "the critic's update on its own GPUs, counted as the actor's")
    elif x.has_critic:
        critic = StagePeak(s.total_bytes + between + ref_resident + graphs,
                           {"update": s.total_bytes, "actor_resident": between, "reference_resident": ref_resident,
                            "cuda_graphs": graphs}, "the critic's update, counted as the actor's")
    return StagePhases(rollout=rollout, log_prob=log_prob, actor=actor, critic=critic,
                       forward_reserve=acts * mem.allocator_reserve_fraction,
                       update_reserve=s.total_bytes - stage_allocated(s), engine_note=engine_note)


def stage_host_extra(setting: PhaseSetting, s) -> float:
    """What one stage's GPU puts on the host beyond what the offload knobs already put there (its update report
    `s`'s host_bytes): the reference model's bf16 weights where they are on the host (reference_bytes), PPO's
    critic where it shares the actor's GPUs (its host share as the actor's; on GPUs of its own it is never offloaded),
    the states the framework offloads by itself (SkyRL's colocate_all) less those the engine frees after the update
    (FSDP's gradients: setting.freed). Less what the knobs put there where no state leaves the GPU between phases
    (phase_setting: SkyRL's policy with no model to swap with, its offload_after_step never acting): negative."""
    x = setting
    states = state_bytes(s)
    auto_host = sum(v for cls, v in states.items() if cls in x.phase_classes - x.knob_classes)
    unmoved = s.detail.get("host_between_phases", 0) if x.knob_classes and not x.phase_classes else 0.0
    return ((reference_bytes(x, s) if x.ref_on_host else 0.0)
            + ((s.host_bytes + auto_host) if x.critic_beside_actor else 0.0) + auto_host - unmoved)


def rl_host_bytes(job, plan: Plan, update, setting: PhaseSetting | None = None) -> int:
    """Host bytes per node of the RL step (rule MEM003's figure): the actor update's report `update` (what its offload
    knobs put there) plus the most any stage's GPU adds beyond them (stage_host_extra), ranks_per_node of them. The
    one home of that rule: rl_memory's host, and the RL recommend's actor search (search/rl_actor.py) per layout."""
    setting = setting or phase_setting(job, plan)
    host_extra = max(stage_host_extra(setting, s) for s in update.stages)
    return max(0, update.host_bytes_per_node + int(host_extra * ranks_per_node(job)))


def least_framework_host(job, plan: Plan, state_bytes: float, params: float) -> float:
    """Host bytes per node a colocated RL step takes at least on any trainer layout where the framework itself offloads
    every trainer model around the rollout (SkyRL's colocate_all: stage_host_extra's host): the trainer's states it
    copies to the host, twice with a critic, and the reference model's bf16 weights. `state_bytes`: those states
    every layout holds across all GPUs at least (search/zero_stages.least_offloaded_state_bytes, with
    framework_offload's classes), `params`: the model's parameters, each on some
    GPU. The worst stage's GPU holds at least the average, 1/N; the node's host, ranks_per_node of them (the
    estimate's host_bytes_per_node). 0 where the framework does not offload by itself (verl: its knobs, which the
    search tries with and without)."""
    setting = phase_setting(job, plan)
    if not setting.auto:
        return 0.0
    copies = 2 if setting.critic_beside_actor else 1
    total = state_bytes * copies + (ENGINE_BYTES * params if setting.has_ref else 0.0)
    return total / job.num_gpus * ranks_per_node(job)


def worst_stage(name: str, values: list[StagePeak], *, plan: Plan, mem: MemoryCard, pool: str = "trainer",
                reserves: list[float] | None = None) -> PhaseMemory:
    """The phase's peak on its worst stage. With expandable segments the training phases' fit is their allocated
    peak (memory.peak_fit_bytes): the allocator reserve in them is given back before an OOM. The rollout engine's
    pool is taken up front either way."""
    stage = max(range(len(values)), key=lambda i: values[i][0])
    total, detail, note, engine = values[stage]
    fit_bytes = (max(peak_fit_bytes(v[0], r, plan, mem) for v, r in zip(values, reserves, strict=True))
                 if reserves else total)
    return PhaseMemory(phase=name, pool=pool, peak_bytes=int(total), fit_bytes=int(fit_bytes),
                       stage=stage, detail={k: int(v) for k, v in detail.items()}, note=note, engine=engine)


def rl_memory(job, plan: Plan, reports: tuple | None = None):
    """Per-GPU memory of each phase of an RL step, and host memory per node: the actor update's report with the
    phases added (`phases`, `peak_phase`) and its peak, fit and host figures those of the worst phase. A colocated
    engine holds its memory fraction during the rollout and its CUDA graphs in every phase."""
    update, forward = reports or trainer_reports(job, plan)
    setting = phase_setting(job, plan)
    gathered = (forward_gathered_bytes(job, plan) if job.card.engine_at(plan.zero_stage) == "fsdp"
                else [0.0] * len(update.stages))
    stages = [stage_phases(job, plan, setting, s, f, g)
              for s, f, g in zip(update.stages, forward.stages, gathered, strict=True)]
    engine_note = ""
    for stage in stages:
        engine_note = engine_note or stage.engine_note
    mem = setting.mem
    phases: list[PhaseMemory] = []
    if setting.colocated:
        phases.append(worst_stage("rollout", [stage.rollout for stage in stages], plan=plan, mem=mem))
    else:
        engine = engine_memory(job, plan, setting.capacity - setting.fixed)
        engine_note = engine.note
        detail = {"engine": engine.gpu_bytes, "engine_weights": engine.weights_bytes, "kv_cache": engine.kv_bytes,
                  "sequences_at_once": engine.sequences_at_once, "fixed": setting.fixed}
        phases.append(worst_stage("rollout", [StagePeak(setting.fixed + engine.gpu_bytes, detail, engine.note, engine)],
                                  plan=plan, mem=mem, pool="rollout"))
    forward_reserve = [stage.forward_reserve for stage in stages]
    update_reserve = [stage.update_reserve for stage in stages]
    phases.append(worst_stage("log_prob", [stage.log_prob for stage in stages], plan=plan, mem=mem,
                              reserves=forward_reserve))
    phases.append(worst_stage("actor_update", [stage.actor for stage in stages], plan=plan, mem=mem,
                              reserves=update_reserve))
    critic = [stage.critic for stage in stages if stage.critic is not None]
    if critic:
        phases.append(worst_stage("critic_update", critic, plan=plan, mem=mem, reserves=update_reserve,
                                  pool="critic" if setting.critic_apart else "trainer"))
    return _with_phases(job, plan, update, phases=phases, host=rl_host_bytes(job, plan, update, setting),
                        engine_note=engine_note, setting=setting)


def _model_assumptions(setting: PhaseSetting, job) -> list[str]:
    """Where the reference model's and PPO's critic's memory is, where it is not the actor's GPUs as a whole."""
    out = []
    if setting.has_ref and setting.ref_per_unit:
        out.append(f"The reference model's weights stay on the host ({job.framework}'s FSDP CPU offload): its log-prob "
                   "pass brings one FSDP unit at a time to the GPU (the gathered units), not its whole shard.")
    if setting.critic_apart:
        out.append(f"PPO's critic runs on GPUs of its own ({job.framework} with the rollout placed apart), as many as "
                   f"the policy's {job.num_gpus} at its layout: its update (critic_update) is on them, not on the "
                   "actor's GPUs, and the job takes the policy's GPUs twice plus the rollout's.")
    return out


def _with_phases(job, plan: Plan, update, *, phases: list[PhaseMemory], host: int, engine_note: str,
                 setting: PhaseSetting):
    """The update's report with the phases: the peak is the highest phase's, the fit the one that decides it."""
    capacity = job.gpu.memory_bytes
    rl = job.rl
    top = max(phases, key=lambda p: p.peak_bytes)
    deciding = max(phases, key=lambda p: p.fit_bytes)
    limited = ("gpu" if deciding.fit_bytes > memory_budget(job)
               else "host" if job.cpu_memory_per_node and host > job.cpu_memory_per_node else None)
    words = ", ".join(f"{p.phase} {p.peak_bytes / GIB:.1f} GiB" for p in phases)
    assumptions = [f"RL step ({rl.algorithm}, {plan.placement}): peak per phase {words}; {top.phase} peaks. "
                   f"Stages are the actor update's.", engine_note + "."]
    if setting.phase_classes:
        assumptions.append(f"Phase offloads ({', '.join(sorted(setting.phase_classes))}) are on the host during the "
                           "rollout and log-prob passes, and back on the GPU for the update (its peak is unchanged).")
    assumptions += _model_assumptions(setting, job)
    tokens = packed_tokens(job, plan)
    if tokens != plan.micro_batch_size * job.seq_length:
        assumptions.append(f"{job.framework} packs micro-batches to {plan.micro_batch_size * job.seq_length} tokens by "
                           f"a balanced partition with no cap: the largest holds {tokens} at the stated mean lengths "
                           "(expected over seeded draws, rl/packing.py), and the update and log-prob passes are "
                           "sized at it.")
    runs = update_micro_batches(job, plan)
    if plan.pp > 1 and runs != plan.num_microbatches(job.global_batch_size):
        assumptions.append(f"The update's pipeline runs one mini-batch at a time ({job.framework} steps the optimizer "
                           f"after each): {runs} micro-batches a rank, so a stage holds min({runs}, pp - r); the "
                           "micro-batches in flight below are counted per mini-batch.")
    if setting.freed:
        assumptions.append(f"Between phases the {', '.join(sorted(setting.freed))} are released (on neither the GPU "
                           "nor the host) and allocated again in the update.")
    return update.model_copy(update={
        "peak_bytes": top.peak_bytes, "peak_stage": top.stage, "fits": deciding.fit_bytes <= memory_budget(job),
        "headroom_bytes": capacity - deciding.fit_bytes, "fit_bytes": deciding.fit_bytes,
        "fit_basis": "allocated" if deciding.fit_bytes != deciding.peak_bytes else "reserved",
        "host_bytes_per_node": host, "phases": phases,
        "peak_phase": top.phase, "limited_by": limited, "assumptions": assumptions + update.assumptions,
    })
