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

from meshplan.cards import framework_card
from meshplan.errors import MeshplanError
from meshplan.schema import FRAMEWORKS, Placement, Plan, Request, RLAlgorithm, RLJob, RolloutEngine


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
             "rollout_gpus")


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

    def plan_fields(self, trainer_gpus: int) -> dict:
        """The plan's rollout_* fields; a colocated engine spans the trainer's GPUs unless the request said else."""
        return dict(rollout_engine=self.engine, rollout_tp=self.tp, rollout_dp=self.dp, rollout_ep=self.ep,
                    rollout_memory_fraction=self.memory_fraction, placement=self.placement,
                    rollout_gpus=self.rollout_gpus or trainer_gpus)


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
    seq_given = "seq_length" in req.model_fields_set
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
                    rollout_gpus=rollout_gpus)
    trainer = req.model_copy(update={"num_gpus": trainer_gpus, "seq_length": prompt + response,
                                     "global_batch_size": prompts * n})
    return trainer, rl


def is_rl(plan: Plan) -> bool:
    return plan.rollout_tp is not None


# --------------------------------------------------------------------------- the rollout engine's memory

GIB = 1 << 30
ENGINE_BYTES = 2  # the engine's weights and KV cache in bf16 (verl rollout.dtype, SkyRL model_dtype: bfloat16)
FP32 = 4  # the sampler's logits


def rl_constant(name: str) -> float:
    from meshplan.calibration import calibration_card

    return calibration_card().rl[name].value


def engine_weight_bytes(arch, plan: Plan) -> float:
    """One engine GPU's weights: attention, dense MLPs, shared experts, embedding and head sharded by the rollout TP;
    norms and routers whole; routed experts over the rollout EP (= TP x DP) when EP > 1, else over its TP."""
    from meshplan.models import layer_params

    tp = plan.rollout_tp
    expert_shards = plan.rollout_ep if plan.rollout_ep > 1 else tp
    sharded = whole = experts = 0
    for i in range(arch.num_layers):
        p = layer_params(arch, i)
        sharded += p["attention"] + p["dense_mlp"] + p["shared_experts"]
        whole += p["norms"] + p["router"]
        experts += p["routed_experts"]
    vocab_rows = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return ENGINE_BYTES * ((sharded + vocab_rows) / tp + whole + experts / expert_shards)


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
    graphs = rl_constant("cuda_graph_bytes")
    # vLLM allocates its whole budget (KV preallocated); SGLang's static pool is weights + KV, activations outside
    on_gpu = budget + graphs + (working if facts.memory_fraction_of == "free" else 0.0)
    note = (f"{plan.rollout_engine} budget {of} = {budget / GIB:.1f} GiB: weights {weights / GIB:.1f} GiB (rollout "
            f"TP{plan.rollout_tp}{f' EP{plan.rollout_ep}' if plan.rollout_ep > 1 else ''}), activations "
            f"{working / GIB:.1f} GiB, KV cache {kv / GIB:.1f} GiB = {int(kv // per_token):,} tokens = {per_rank:,} "
            f"sequences of {length:,} tokens per DP rank (max_num_seqs {card.defaults.max_num_seqs}); CUDA graphs "
            f"{graphs / GIB:.1f} GiB outside the fraction")
    if kv <= 0:
        note += ("; the weights and activations exceed the budget: the engine cannot start (raise "
                 "rollout_memory_fraction or rollout_tp)")
    return EngineMemory(budget_bytes=budget, weights_bytes=weights, working_bytes=working, kv_bytes=kv,
                        cuda_graph_bytes=graphs, kv_bytes_per_token=per_token, gpu_bytes=on_gpu,
                        sequences_at_once=seqs, note=note)

