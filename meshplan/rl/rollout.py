"""An RL post-training job (verl, SkyRL): what the request fields mean, and the rollout engine's arithmetic.

An RL step runs phases on the same GPUs (colocated) or on two pools (separate): the rollout engine generates
prompts x samples responses, the old policy and the reference model score them (forward passes only), the actor
(and for PPO the critic) is updated, and the new weights are resharded from the trainer's layout to the engine's.
The framework's facts (defaults, the engines it runs, what each engine's memory fraction means, its rollout rules)
are the `rl` section of its card (cards/frameworks/<name>.yaml); this module reads them and does the arithmetic.
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.models import per_architecture
from meshplan.schema.contract import FRAMEWORKS, Placement, Plan, Request, RLAlgorithm, RLJob, RolloutEngine


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RLDefaults(_Card):
    """What the framework does when the request leaves an RL field out (its own config defaults)."""

    algorithm: RLAlgorithm
    samples_per_prompt: int = Field(ge=1)
    prompts_per_step: int = Field(ge=1)
    prompt_length: int = Field(ge=1)
    response_length: int = Field(ge=1)
    engine: RolloutEngine
    rollout_tp: int = Field(ge=1)
    rollout_dp: int = Field(ge=1)
    rollout_ep: int = Field(ge=1)
    memory_fraction: float = Field(gt=0, le=1)
    placement: Placement
    max_num_seqs: int = Field(ge=1, description="The engine's cap on sequences decoded at once")
    max_num_batched_tokens: int = Field(ge=1, description="The engine's cap on tokens per forward (its profile run)")
    source: str


class EngineFacts(_Card):
    """One rollout engine as the framework runs it."""

    memory_fraction_of: Literal["total", "free"] = Field(
        description="total: the fraction is a share of the GPU's total memory (vLLM gpu_memory_utilization); free: a "
                    "share of the memory free when the engine starts (SGLang mem_fraction_static)"
    )
    multi_node_tp: bool = Field(description="Whether the engine runs a tensor-parallel group across nodes")
    why: str


class RLCard(_Card):
    """The `rl` section of a framework card."""

    defaults: RLDefaults
    engines: dict[RolloutEngine, EngineFacts]
    ep_equals_tp_dp: bool = Field(description="Rollout EP > 1 must equal rollout TP x DP")
    rollout_pp: bool = Field(description="Whether the engine may be pipeline-parallel (meshplan plans PP 1)")
    colocated_gpus_equal_training: bool = Field(description="Colocated engines must span exactly the trainer's GPUs")
    colocated_offload: bool = Field(
        description="With colocated engines the framework itself moves every trainer model (policy, reference, critic:"
                    " weights, gradients, optimizer) to the host between phases, whatever the offload knobs say"
    )
    colocated_offload_source: str
    reference_model: dict[RLAlgorithm, bool] = Field(description="Whether the algorithm keeps a reference model")
    critic: dict[RLAlgorithm, bool] = Field(description="Whether the algorithm trains a critic")
    rules_source: str


@cache
def rl_card(framework: str) -> RLCard | None:
    """The framework's `rl` card section, validated; None when it runs no RL job."""
    raw = (framework_card(framework).model_extra or {}).get("rl")
    return RLCard.model_validate(raw) if raw is not None else None


def rl_frameworks() -> list[str]:
    return [f for f in FRAMEWORKS if rl_card(f) is not None]


# --------------------------------------------------------------------------- the request


RL_FIELDS = ("algorithm", "prompts_per_step", "samples_per_prompt", "prompt_length", "response_length",
             "rollout_engine", "rollout_tp", "rollout_dp", "rollout_ep", "rollout_memory_fraction", "placement",
             "rollout_gpus", "rollout_enforce_eager")


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

    def plan_fields(self, trainer_gpus: int) -> dict:
        """The plan's rollout_* fields; a colocated engine spans the trainer's GPUs unless the request said else."""
        return dict(rollout_engine=self.engine, rollout_tp=self.tp, rollout_dp=self.dp, rollout_ep=self.ep,
                    rollout_memory_fraction=self.memory_fraction, placement=self.placement,
                    rollout_gpus=self.rollout_gpus or trainer_gpus, rollout_enforce_eager=self.enforce_eager)


def is_rl_request(req: Request) -> bool:
    """Whether the request is an RL job: job=rl, or an RL field given with the job left out."""
    return req.job == "rl" or (req.job is None and any(getattr(req, name) is not None for name in RL_FIELDS))


def resolve_rl(req: Request, notes: list[str]) -> tuple[Request, ResolvedRL | None]:
    """An RL request as the trainer's request (its GPUs, prompt + response tokens, prompts x samples sequences) and
    the RL settings, every default noted; a training request unchanged with None. RL fields on a training job or on
    a framework without an `rl` card section are errors naming what is allowed."""
    given = [name for name in RL_FIELDS if getattr(req, name) is not None]
    if req.job in ("pretrain", "sft", "lora") or (req.job is None and not given):
        if given:
            what = "is an RL field" if len(given) == 1 else "are RL fields"
            raise MeshplanError(f"{', '.join(given)} {what}, not for job={req.job}.",
                                fix="Drop them, or pass job=rl (frameworks: " + ", ".join(rl_frameworks()) + ").")
        return req, None
    card = rl_card(req.framework)
    if card is None:
        raise MeshplanError(f"{req.framework} runs no RL job (job=rl{', ' + ', '.join(given) if given else ''}).",
                            fix=f"Use framework {' or '.join(rl_frameworks())}, or leave the RL fields out.")
    d = card.defaults
    if req.job is None:
        notes.append(f"job not given: rl, as {', '.join(given)} {'is' if len(given) == 1 else 'are'} given.")

    def pick(value, default, field: str, why: str = ""):
        if value is not None:
            return value
        notes.append(f"{field} not given: {default}, the {req.framework} default{why}.")
        return default

    algorithm = pick(req.algorithm, d.algorithm, "algorithm")
    n = pick(req.samples_per_prompt, d.samples_per_prompt, "samples_per_prompt")
    if n == 1 and algorithm in ("grpo", "dapo"):
        notes.append(f"samples_per_prompt is 1: {algorithm.upper()}'s group advantage of a single response is zero; "
                     "its recipes sample 5-16 per prompt.")
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
    engine = pick(req.rollout_engine, d.engine, "rollout_engine")
    if engine not in card.engines:
        raise MeshplanError(f"{req.framework} runs no {engine} rollout engine.",
                            fix=f"Use rollout_engine {' or '.join(card.engines)}.")
    tp = pick(req.rollout_tp, d.rollout_tp, "rollout_tp")
    dp = pick(req.rollout_dp, d.rollout_dp, "rollout_dp")
    ep = pick(req.rollout_ep, d.rollout_ep, "rollout_ep")
    fraction = pick(req.rollout_memory_fraction, d.memory_fraction, "rollout_memory_fraction")
    placement = pick(req.placement, d.placement, "placement")
    rollout_gpus = req.rollout_gpus
    trainer_gpus = req.num_gpus
    if placement == "separate":
        if rollout_gpus is None:
            raise MeshplanError("placement separate needs rollout_gpus, the GPUs the rollout engine runs on.",
                                fix=f"Pass rollout_gpus, a multiple of rollout_tp x rollout_dp = {tp * dp}.")
        if trainer_gpus is not None:
            if rollout_gpus >= trainer_gpus:
                raise MeshplanError(f"rollout_gpus {rollout_gpus} leaves no GPU of num_gpus {trainer_gpus} to the "
                                    "trainer (placement separate takes them out of num_gpus).",
                                    fix=f"Pass rollout_gpus below {trainer_gpus}, or placement colocated.")
            trainer_gpus -= rollout_gpus
            notes.append(f"placement separate: the trainer runs on {trainer_gpus} GPUs, the rollout engine on "
                         f"{rollout_gpus}.")
    elif rollout_gpus is None:
        notes.append("rollout_gpus not given: the trainer's GPUs (colocated).")
    rl = ResolvedRL(job=RLJob(algorithm=algorithm, prompts_per_step=prompts, samples_per_prompt=n,
                              prompt_length=prompt, response_length=response),
                    engine=engine, tp=tp, dp=dp, ep=ep, memory_fraction=fraction, placement=placement,
                    rollout_gpus=rollout_gpus, enforce_eager=bool(req.rollout_enforce_eager))
    trainer = req.model_copy(update={"num_gpus": trainer_gpus, "seq_length": prompt + response,
                                     "global_batch_size": prompts * n})
    return trainer, rl


def is_rl(plan: Plan) -> bool:
    return plan.rollout_tp is not None


# --------------------------------------------------------------------------- the rollout engine's memory

ENGINE_BYTES = 2  # the engine's weights and KV cache in bf16 (verl rollout.dtype, SkyRL model_dtype: bfloat16)
FP32 = 4  # the sampler's logits


def rl_constant(name: str) -> float:
    from meshplan.knowledge.calibration import calibration_card

    return calibration_card().rl[name].value


def _param_split(arch) -> tuple[int, int, int]:
    """The model's parameters by how an engine shards them: over its TP (attention, dense MLPs, shared experts,
    embedding and head), whole (norms, routers), routed experts."""
    from meshplan.knowledge.models import layer_params

    sharded = whole = experts = 0
    for i in range(arch.num_layers):
        p = layer_params(arch, i)
        sharded += p["attention"] + p["dense_mlp"] + p["shared_experts"]
        whole += p["norms"] + p["router"]
        experts += p["routed_experts"]
    vocab_rows = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return sharded + vocab_rows, whole, experts


def engine_weight_bytes(arch, plan: Plan) -> float:
    """One engine GPU's weights: attention, dense MLPs, shared experts, embedding and head sharded by the rollout TP;
    norms and routers whole; routed experts over the rollout EP (= TP x DP) when EP > 1, else over its TP."""
    sharded, whole, experts = _split(arch)
    expert_shards = plan.rollout_ep if plan.rollout_ep > 1 else plan.rollout_tp
    return ENGINE_BYTES * (sharded / plan.rollout_tp + whole + experts / expert_shards)


_split = per_architecture(_param_split)  # built once per model


def kv_bytes_per_token(arch, tp: int) -> float:
    """KV cache one token takes on one engine GPU: MLA caches its compressed latent and rope key whole on every TP
    rank (vLLM's MLA backends); GQA/MHA caches K and V of its KV heads over TP, one head per rank at least (vLLM
    replicates KV heads when TP exceeds them)."""
    if arch.mla is not None:
        per_layer = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    else:
        per_layer = 2 * max(1.0, arch.num_kv_heads / tp) * arch.head_dim
    return ENGINE_BYTES * per_layer * arch.num_layers


def engine_working_bytes(arch, plan: Plan, defaults: RLDefaults) -> float:
    """The engine's profiled activation peak: one forward of max_num_batched_tokens tokens holds the residual stream
    and attention in/out (4 x hidden) and the widest MLP's gate/up output and activation (3 x width over the TP, the
    routed experts' top_k copies of each token where that is wider), plus the sampler's fp32 logits of max_num_seqs
    sequences over the whole vocabulary."""
    tokens = defaults.max_num_batched_tokens
    moe_layers = len(arch.moe.moe_layers) if arch.moe is not None else 0
    width = arch.ffn_hidden_size / plan.rollout_tp if moe_layers < arch.num_layers else 0.0
    if arch.moe is not None:
        shards = plan.rollout_ep if plan.rollout_ep > 1 else plan.rollout_tp
        width = max(width, arch.moe.top_k * arch.moe.expert_ffn_hidden_size / shards)
    return ENGINE_BYTES * tokens * (4 * arch.hidden_size + 3 * width) + FP32 * defaults.max_num_seqs * arch.vocab_size


class EngineMemory(BaseModel):
    """One rollout engine GPU: what the engine takes and how many sequences its KV cache holds at once."""

    budget_bytes: float = Field(description="What the memory fraction gives the engine (weights + activations + KV)")
    weights_bytes: float
    working_bytes: float
    kv_bytes: float = Field(description="KV cache the fraction leaves after weights and activations (0: none)")
    cuda_graph_bytes: float
    kv_bytes_per_token: float
    gpu_bytes: float = Field(description="What the engine holds on the GPU while it runs")
    sequences_at_once: int = Field(description="Sequences of prompt + response tokens one engine holds at once")
    note: str


def engine_memory(job, plan: Plan, free_bytes: float) -> EngineMemory:
    """The engine on one GPU where `free_bytes` are free when it starts (the trainer's resident state taken): vLLM's
    fraction is a share of total memory, SGLang's of the free memory (the framework card's `memory_fraction_of`)."""
    card = rl_card(job.framework)
    facts = card.engines[plan.rollout_engine]
    arch, rl = job.model, job.rl
    fraction = plan.rollout_memory_fraction
    if facts.memory_fraction_of == "total":
        budget = fraction * job.gpu.memory_bytes
        of = f"{fraction:g} x {job.gpu.memory_bytes / GIB:.1f} GiB total"
    else:
        budget = fraction * max(0.0, free_bytes)
        of = f"{fraction:g} x {max(0.0, free_bytes) / GIB:.1f} GiB free at start"
    weights = engine_weight_bytes(arch, plan)
    working = engine_working_bytes(arch, plan, card.defaults)
    kv = max(0.0, budget - weights - working)
    per_token = kv_bytes_per_token(arch, plan.rollout_tp)
    length = rl.prompt_length + rl.response_length
    # an engine of TP x DP GPUs: each DP rank caches its own sequences over its TP ranks
    per_rank = int(kv // (per_token * length))
    seqs = min(per_rank, card.defaults.max_num_seqs) * plan.rollout_dp
    graphs = 0.0 if plan.rollout_enforce_eager else rl_constant("cuda_graph_bytes")
    # vLLM allocates its whole budget (KV preallocated); SGLang's static pool is weights + KV, activations outside
    on_gpu = budget + graphs + (working if facts.memory_fraction_of == "free" else 0.0)
    note = (f"{plan.rollout_engine} budget {of} = {budget / GIB:.1f} GiB: weights {weights / GIB:.1f} GiB (rollout "
            f"TP{plan.rollout_tp}{f' EP{plan.rollout_ep}' if plan.rollout_ep > 1 else ''}), activations "
            f"{working / GIB:.1f} GiB, KV cache {kv / GIB:.1f} GiB = {int(kv // per_token):,} tokens = {per_rank:,} "
            f"sequences of {length:,} tokens per DP rank (max_num_seqs {card.defaults.max_num_seqs}); "
            + ("no CUDA graphs (enforce_eager)" if plan.rollout_enforce_eager else
               f"CUDA graphs {graphs / GIB:.1f} GiB outside the fraction"))
    if kv <= 0:
        note += ("; the weights and activations exceed the budget: the engine cannot start (raise "
                 "rollout_memory_fraction or rollout_tp)")
    return EngineMemory(budget_bytes=budget, weights_bytes=weights, working_bytes=working, kv_bytes=kv,
                        cuda_graph_bytes=graphs, kv_bytes_per_token=per_token, gpu_bytes=on_gpu,
                        sequences_at_once=seqs, note=note)


# --------------------------------------------------------------------------- memory per phase


STATE_CLASSES = ("weights", "gradients", "optimizer")


def job_memory(job, plan: Plan):
    """The memory report every caller takes: the training step's, or for an RL job the peak over its phases."""
    from meshplan.estimate.memory import estimate_memory

    return rl_memory(job, plan) if job.rl is not None else estimate_memory(job, plan)


def _forward_only(plan: Plan) -> Plan:
    """The plan as a forward-only pass sees it: full recompute's report keeps one working layer and the logits."""
    return plan.model_copy(update={"recompute": "full", "recompute_layers": None, "recompute_method": None,
                                   "recompute_modules": None, "selective_ac_option": None})


def trainer_reports(job, plan: Plan) -> tuple:
    """The actor update's memory report and the forward-only one (the log-prob passes): what every rollout choice
    of one trainer layout shares (recommend computes them once per layout)."""
    from meshplan.estimate.memory import estimate_memory

    return estimate_memory(job, plan), estimate_memory(job, _forward_only(plan))


def rl_memory(job, plan: Plan, reports: tuple | None = None):
    """Per-GPU memory of each phase of an RL step, and host memory per node.

    The actor update is meshplan.estimate.memory.estimate_memory (with the in-step offloads); around it, the states a
    phase
    offload (verl param/grad/optimizer_offload) moves to the host leave the GPU between phases but are all back
    for the update, so they cut the rollout's and log-prob passes' memory, not the update's peak. The reference
    model (GRPO's and PPO's KL) keeps bf16 weights in the trainer's layout, offloaded with param_offload as verl's
    ref.megatron.param_offload follows the actor's; PPO's critic is counted as a second copy of the actor's states.
    A colocated engine holds its memory fraction during the rollout and its CUDA graphs in every phase."""
    from meshplan.arithmetic.memory_states import memory_card
    from meshplan.arithmetic.offload import offload_plan
    from meshplan.estimate.memory import peak_fit_bytes
    from meshplan.schema.contract import PhaseMemory

    card = rl_card(job.framework)
    rl = job.rl
    update, forward = reports or trainer_reports(job, plan)
    knob_classes = offload_plan(job.framework, plan).phase
    auto = card.colocated_offload and plan.placement == "colocated"  # SkyRL's colocate_all offloads every model
    phase_classes = frozenset(STATE_CLASSES) if auto else knob_classes
    has_ref, has_critic = card.reference_model[rl.algorithm], card.critic[rl.algorithm]
    mem = memory_card()
    fixed = mem.fixed_overhead_bytes + mem.cuda_context_bytes
    colocated = plan.placement == "colocated"
    capacity = job.gpu.memory_bytes
    graphs = rl_constant("cuda_graph_bytes") if colocated and not plan.rollout_enforce_eager else 0.0
    phases: list[PhaseMemory] = []

    # With expandable segments the training phases' fit is their allocated peak (memory.peak_fit_bytes): the
    # allocator reserve in them is given back before an OOM. The rollout engine's pool is taken up front either way.
    def worst(name: str, values: list[tuple[float, dict, str]], pool: str = "trainer",
              reserves: list[float] | None = None) -> None:
        stage = max(range(len(values)), key=lambda i: values[i][0])
        total, detail, note = values[stage]
        fit_bytes = (max(peak_fit_bytes(v[0], r, plan, mem) for v, r in zip(values, reserves, strict=True))
                     if reserves else total)
        phases.append(PhaseMemory(phase=name, pool=pool, peak_bytes=int(total), fit_bytes=int(fit_bytes),
                                  stage=stage, detail={k: int(v) for k, v in detail.items()}, note=note))

    rollout, log_prob, actor, critic = [], [], [], []
    forward_reserve, update_reserve = [], []  # the allocator reserve inside each stage's log-prob and update peaks
    host_extra = 0.0
    engine_note = ""
    for s, f in zip(update.stages, forward.stages, strict=True):
        states = {"weights": s.weights_bytes, "gradients": s.gradients_bytes, "optimizer": s.optimizer_bytes}
        between = sum(v for cls, v in states.items() if cls not in phase_classes)
        ref = ENGINE_BYTES * s.detail.get("params_on_gpu", 0) if has_ref else 0.0
        ref_resident = 0.0 if plan.param_offload or auto else ref
        critic_resident = between if has_critic else 0.0
        acts = f.detail.get("recompute_working_layer", 0) + f.detail.get("logits_and_loss", 0)
        fwd = acts * (1 + mem.allocator_reserve_fraction)
        forward_reserve.append(acts * mem.allocator_reserve_fraction)
        update_reserve.append(s.detail.get("allocator_reserve", 0))
        resident = between + ref_resident + critic_resident
        if colocated:
            engine = engine_memory(job, plan, capacity - resident - fixed)
            engine_note = engine_note or engine.note
            rollout.append((resident + fixed + engine.gpu_bytes,
                            {"trainer_resident": between, "reference_resident": ref_resident,
                             "critic_resident": critic_resident, "engine": engine.gpu_bytes,
                             "engine_weights": engine.weights_bytes, "kv_cache": engine.kv_bytes,
                             "sequences_at_once": engine.sequences_at_once, "fixed": fixed}, engine.note))
        actor_fwd = states["weights"] + between - (states["weights"] if "weights" not in phase_classes else 0)
        log_prob.append((max(actor_fwd + ref_resident, between + ref) + critic_resident + fwd + fixed + graphs,
                         {"policy_or_reference_weights": max(states["weights"], ref), "forward_activations": fwd,
                          "resident": between + ref_resident + critic_resident, "cuda_graphs": graphs,
                          "fixed": fixed}, "old-policy and reference forward passes, one micro-batch"))
        actor.append((s.total_bytes + ref_resident + critic_resident + graphs,
                      {"update": s.total_bytes, "reference_resident": ref_resident,
                       "critic_resident": critic_resident, "cuda_graphs": graphs},
                      "meshplan.estimate.memory.estimate_memory"))
        if has_critic:
            critic.append((s.total_bytes + between + ref_resident + graphs,
                           {"update": s.total_bytes, "actor_resident": between, "reference_resident": ref_resident,
                            "cuda_graphs": graphs}, "the critic's update, counted as the actor's"))
        # beyond what the offload knobs already put on the host (update.host_bytes_per_node): the reference model,
        # PPO's critic (its host share as the actor's), the states the framework offloads by itself
        auto_host = sum(v for cls, v in states.items() if cls not in knob_classes) if auto else 0.0
        host_extra = max(host_extra, (ref if plan.param_offload or auto else 0.0)
                         + ((s.host_bytes + auto_host) if has_critic else 0.0) + auto_host)
    if colocated:
        worst("rollout", rollout)
    else:
        engine = engine_memory(job, plan, capacity - fixed)
        engine_note = engine.note
        detail = {"engine": engine.gpu_bytes, "engine_weights": engine.weights_bytes, "kv_cache": engine.kv_bytes,
                  "sequences_at_once": engine.sequences_at_once, "fixed": fixed}
        worst("rollout", [(fixed + engine.gpu_bytes, detail, engine.note)], pool="rollout")
    worst("log_prob", log_prob, reserves=forward_reserve)
    worst("actor_update", actor, reserves=update_reserve)
    if critic:
        worst("critic_update", critic, reserves=update_reserve)
    top = max(phases, key=lambda p: p.peak_bytes)
    deciding = max(phases, key=lambda p: p.fit_bytes)
    host = update.host_bytes_per_node + int(host_extra * job.gpus_per_node)
    limited = ("gpu" if deciding.fit_bytes > capacity
               else "host" if job.cpu_memory_per_node and host > job.cpu_memory_per_node else None)
    words = ", ".join(f"{p.phase} {p.peak_bytes / GIB:.1f} GiB" for p in phases)
    assumptions = [f"RL step ({rl.algorithm}, {plan.placement}): peak per phase {words}; {top.phase} peaks. "
                   f"Stages are the actor update's.", engine_note + "."]
    if phase_classes:
        assumptions.append(f"Phase offloads ({', '.join(sorted(phase_classes))}) are on the host during the rollout "
                           "and log-prob passes, and back on the GPU for the update (its peak is unchanged).")
    return update.model_copy(update={
        "peak_bytes": top.peak_bytes, "peak_stage": top.stage, "fits": deciding.fit_bytes <= capacity,
        "headroom_bytes": capacity - deciding.fit_bytes, "fit_bytes": deciding.fit_bytes,
        "fit_basis": "allocated" if deciding.fit_bytes != deciding.peak_bytes else "reserved",
        "host_bytes_per_node": host, "phases": phases,
        "peak_phase": top.phase, "limited_by": limited, "assumptions": assumptions + update.assumptions,
    })


# --------------------------------------------------------------------------- time per RL step


def _engine_param_split(arch, plan: Plan) -> tuple[float, float, float]:
    """One engine GPU's bytes read every decode step whatever the batch (attention, dense and shared MLPs, norms,
    routers, the head), one routed expert's bytes on that GPU, and the routed experts each MoE layer holds there."""
    from meshplan.knowledge.models import expert_params

    if arch.moe is None:
        return engine_weight_bytes(arch, plan), 0.0, 0.0
    shards = plan.rollout_ep if plan.rollout_ep > 1 else plan.rollout_tp
    per_expert = ENGINE_BYTES * expert_params(arch) / (1 if plan.rollout_ep > 1 else plan.rollout_tp)
    experts_here = arch.moe.num_experts / (shards if plan.rollout_ep > 1 else 1)
    expert_total = per_expert * experts_here * len(arch.moe.moe_layers)
    # the embedding table is not read per step (a lookup), but the head is: close enough to count both
    return engine_weight_bytes(arch, plan) - expert_total, per_expert, experts_here


def decode_step_seconds(job, plan: Plan, batch: int, context: float) -> tuple[float, str]:
    """One decode step of `batch` sequences at `context` tokens on one engine GPU: the larger of reading its weights
    (every dense weight, and the routed experts the batch's tokens reach) plus the batch's KV cache from HBM, and
    the step's FLOPs; plus two TP all-reduces (or EP all-to-alls) per layer at the link's small-message latency."""
    from meshplan.arithmetic.flops import model_flops_per_token
    from meshplan.knowledge.calibration import calibration

    cal = calibration(job.framework)
    arch, gpu = job.model, job.gpu
    fixed, per_expert, experts_here = _engine_param_split(arch, plan)
    touched = 0.0
    if arch.moe is not None:
        # tokens routed to this GPU's experts in one step: every DP rank's batch when EP spans them
        routed = batch * arch.moe.top_k * (plan.rollout_dp if plan.rollout_ep > 1 else 1)
        reach = 1.0 - (1.0 - 1.0 / arch.moe.num_experts) ** routed  # chance an expert gets at least one token
        touched = per_expert * experts_here * reach * len(arch.moe.moe_layers)
    kv = batch * context * kv_bytes_per_token(arch, plan.rollout_tp)
    memory_s = (fixed + touched + kv) / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    flops = model_flops_per_token(arch, int(context), mtp_layers=0) / 3 * batch / plan.rollout_tp
    compute_s = flops / (gpu.bf16_flops * cal.gemm_peak_fraction)
    domain = job.gpus_per_node
    group = plan.rollout_tp * (plan.rollout_dp if plan.rollout_ep > 1 else 1)
    latency = cal.latency_intra_s if group <= domain else cal.latency_inter_s
    comm_s = 2 * arch.num_layers * latency if group > 1 else 0.0
    # without CUDA graphs the host launches every layer's kernels each step (calibration.yaml rl)
    eager_s = arch.num_layers * rl_constant("eager_launch_s_per_layer") if plan.rollout_enforce_eager else 0.0
    bound = "HBM" if memory_s >= compute_s else "compute"
    words = (f"{bound}-bound: {(fixed + touched) / GIB:.1f} GiB of weights and {kv / GIB:.1f} GiB of KV read "
             f"({memory_s * 1e3:.1f} ms), {compute_s * 1e3:.1f} ms of FLOPs, {comm_s * 1e3:.2f} ms of all-reduces"
             + (f", {eager_s * 1e3:.1f} ms of eager kernel launches" if eager_s else ""))
    return max(memory_s, compute_s) + comm_s + eager_s, words


def rl_step_time(job, plan: Plan, reports: tuple | None = None, update=None):
    """Seconds of one RL step and its parts (schema.RLStepTime), and the actor update's ThroughputReport.

    Generation: each replica's share of prompts x samples sequences decodes in waves of as many sequences as its
    KV cache holds (at most max_num_seqs per DP rank), response_length steps per wave, each step read-bound or
    compute-bound (decode_step_seconds, at the mean context prompt + response / 2); prefill is the prompts' forward
    FLOPs. Log-prob passes are forwards of the update's batch (a third of its compute and communication, no
    recompute or gradient sync). Resharding moves the bf16 weights once over the slowest link the trainer's
    model-parallel group or the rollout pool spans. Phase offloads move their states out and back over the host
    link. Colocated parts add; a separate rollout pool generates the next batch while the trainer trains."""
    from meshplan.arithmetic.flops import model_flops_per_token
    from meshplan.arithmetic.offload import offload_plan
    from meshplan.estimate.perf import estimate_throughput
    from meshplan.knowledge.calibration import calibration
    from meshplan.knowledge.models import total_params
    from meshplan.schema.contract import RLStepTime

    card, rl, arch, gpu = rl_card(job.framework), job.rl, job.model, job.gpu
    cal = calibration(job.framework)
    update = update or estimate_throughput(job, plan)
    b = update.breakdown
    forward = (b.compute_s - b.recompute_s + b.tp_comm_s + b.cp_comm_s + b.ep_comm_s + b.pp_comm_s + b.bubble_s) / 3
    passes = 1 + card.reference_model[rl.algorithm] + card.critic[rl.algorithm]
    log_prob = passes * forward
    update_s = update.step_time_s * (2 if card.critic[rl.algorithm] else 1)

    memory = rl_memory(job, plan, reports)
    rollout_phase = next(p for p in memory.phases if p.phase == "rollout")
    per_rank = max(1, int(rollout_phase.detail.get("sequences_at_once", 0) // plan.rollout_dp))
    group_size = plan.rollout_tp * plan.rollout_dp
    replicas = max(1, plan.rollout_gpus // group_size)
    sequences = rl.prompts_per_step * rl.samples_per_prompt
    per_dp_rank = -(-sequences // (replicas * plan.rollout_dp))
    batch = min(per_rank, per_dp_rank)
    waves = -(-per_dp_rank // batch)
    context = rl.prompt_length + rl.response_length / 2
    step, words = decode_step_seconds(job, plan, batch, context)
    decode = waves * rl.response_length * step
    prefill_flops = model_flops_per_token(arch, rl.prompt_length, mtp_layers=0) / 3 * rl.prompt_length * per_dp_rank
    prefill = prefill_flops / plan.rollout_tp / (gpu.bf16_flops * cal.gemm_peak_fraction)
    generation = prefill + decode

    weights = ENGINE_BYTES * total_params(arch)
    trainer_group = plan.tp * plan.pp * plan.ep * plan.cp
    cross = plan.placement == "separate" or trainer_group > job.gpus_per_node or group_size > job.gpus_per_node
    link = gpu.network_bandwidth * cal.network_efficiency if cross else gpu.intra_node_bandwidth * cal.nvlink_efficiency
    reshard = weights / link
    phase_classes = offload_plan(job.framework, plan).phase
    if card.colocated_offload and plan.placement == "colocated":
        phase_classes = frozenset(STATE_CLASSES)
    update_stage = max(memory.stages, key=lambda s: s.total_bytes)
    moved = sum(getattr(update_stage, f"{cls}_bytes") for cls in phase_classes)
    if (plan.param_offload or card.colocated_offload) and card.reference_model[rl.algorithm]:
        moved += ENGINE_BYTES * update_stage.detail.get("params_on_gpu", 0)
    offload = 2 * moved / gpu.host_bandwidth
    train_side = log_prob + update_s + offload
    if plan.placement == "colocated":
        total = generation + train_side + reshard
    else:
        total = max(generation, train_side) + reshard
    parts = {"generation": generation, "log-prob passes": log_prob, "update": update_s, "resharding": reshard,
             "offload": offload}
    limited = max(parts, key=parts.get)
    return RLStepTime(
        step_s=total, generation_s=generation, prefill_s=prefill, decode_s=decode, log_prob_s=log_prob,
        update_s=update_s, reshard_s=reshard, offload_s=offload, replicas=replicas,
        sequences_at_once=per_rank * plan.rollout_dp, decode_waves=waves, decode_step_s=step, update_mfu=update.mfu,
        limited_by=limited,
    ), update, words, memory


def rl_throughput(job, plan: Plan):
    """The ThroughputReport of an RL job: step_time_s is the whole RL step (its parts in `rl`), tokens/s count the
    trained tokens over it, and mfu is the actor update's (what verl reports)."""
    timing, update, words, _ = rl_step_time(job, plan)
    return rl_report(job, plan, timing, update, words)


def rl_report(job, plan: Plan, timing, update, words: str):
    """The update's ThroughputReport turned into the RL step's (recommend builds its candidates with it too)."""
    tokens = update.tokens_per_s * update.step_time_s
    rl = job.rl
    note = (f"RL step ({rl.algorithm}, {plan.placement}): generation {timing.generation_s:,.0f} s (prefill "
            f"{timing.prefill_s:,.0f} s, decode {timing.decode_s:,.0f} s: {timing.replicas} replicas of rollout "
            f"TP{plan.rollout_tp}{f' DP{plan.rollout_dp}' if plan.rollout_dp > 1 else ''}"
            f"{f' EP{plan.rollout_ep}' if plan.rollout_ep > 1 else ''}, {timing.sequences_at_once} sequences at once, "
            f"{timing.decode_waves} waves of {rl.response_length:,} steps of {timing.decode_step_s * 1e3:.1f} ms, "
            f"{words}), log-prob passes {timing.log_prob_s:,.0f} s, update {timing.update_s:,.0f} s, resharding "
            f"{timing.reshard_s:,.1f} s, phase offloads {timing.offload_s:,.1f} s; "
            + ("colocated: the parts add." if plan.placement == "colocated" else
               "separate pools: generation overlaps the training side (one step off)."))
    return update.model_copy(update={
        "step_time_s": timing.step_s, "tokens_per_s": tokens / timing.step_s,
        "tokens_per_s_per_gpu": tokens / timing.step_s / (job.num_gpus + (plan.rollout_gpus if plan.placement ==
                                                                           "separate" else 0)),
        "rl": timing, "assumptions": [note, "mfu is the actor update's, as verl reports it.", *update.assumptions],
    })


def job_throughput(job, plan: Plan):
    """The throughput report every caller takes: the training step's, or for an RL job the whole RL step."""
    from meshplan.estimate.perf import estimate_throughput

    return rl_throughput(job, plan) if job.rl is not None else estimate_throughput(job, plan)
