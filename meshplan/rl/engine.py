"""The rollout engine on one GPU (vLLM, SGLang as verl and SkyRL run them): its bf16 weights sharded by the rollout
TP/EP, its profiled activation peak, the KV cache its memory fraction leaves, and how many sequences that holds.
"""

from __future__ import annotations

from meshplan.core.units import GIB
from meshplan.knowledge.calibration import calibration_card
from meshplan.knowledge.model_counts import layer_params, per_architecture
from meshplan.knowledge.rl_card import RLDefaults, SWAPool
from meshplan.schema.plan import Plan
from meshplan.schema.reports import EngineMemory

ENGINE_BYTES = 2  # the engine's weights and KV cache in bf16 (verl rollout.dtype, SkyRL model_dtype: bfloat16)
FP32 = 4  # the sampler's logits


def _param_split(arch) -> tuple[int, int, int]:
    """The model's parameters by how an engine shards them: over its TP (attention, dense MLPs, shared experts,
    embedding and head), whole (norms, routers, a latent MoE's projections), routed experts."""
    sharded = whole = experts = 0
    for i in range(arch.num_layers):
        p = layer_params(arch, i)
        sharded += p["attention"] + p["dense_mlp"] + p["shared_experts"]
        whole += p["norms"] + p["router"] + p["latent_proj"]
        experts += p["routed_experts"]
    vocab_rows = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return sharded + vocab_rows, whole, experts


def ep_words(moe: bool, plan: Plan) -> str:
    """" EP<n>" where the rollout engine shards experts over EP ranks, else "": a dense model (`moe` False) has no
    experts, so a rollout_ep there shards nothing (vLLM refuses it: rule RL007) and is never named; at EP1 a MoE
    engine's experts are split over its TP (engine_weight_bytes). Every face's words for it (the notes, the RL
    table's rollout cell)."""
    return f" EP{plan.rollout_ep}" if moe and (plan.rollout_ep or 1) > 1 else ""


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


def kv_bytes_per_sequence(arch, tp: int, tokens: float, window_only: bool) -> float:
    """KV cache one sequence of `tokens` tokens takes (or one decode step reads) on one engine GPU: kv_bytes_per_token's
    bytes per layer for every token in a full layer, and in each local layer (Architecture.local_attention: a
    sliding-window layer, or a chunked one whose query sees its own chunk) min(tokens, span) where `window_only` (an
    engine that frees what the window or chunk has passed, the card's windowed_kv: vLLM's SlidingWindowSpec and
    ChunkedLocalAttentionSpec; a decode step's attention reads the span alone on every engine), else every token.
    vLLM's block rounding (at most two blocks per local layer) is not counted."""
    per_layer = kv_bytes_per_token(arch, tp) / arch.num_layers
    local, span = arch.local_attention
    local = local if window_only else 0
    kept = min(tokens, span) if local else tokens
    return per_layer * ((arch.num_layers - local) * tokens + local * kept)


def swa_pool_bytes_per_sequence(arch, tp: int, tokens: float, pool: SWAPool) -> float:
    """KV budget one sequence of `tokens` tokens takes in a split pool (SGLang's HybridSWAPoolConfigurator, the card's
    swa_pool): each full slot costs cell = per-layer bytes x (full layers + ratio x windowed layers), since the pool
    keeps ratio windowed slots per full slot; a sequence takes `tokens` full slots and, in the windowed pool, at most
    window x (1 + eviction interval) (what a decoding sequence holds before its next eviction), which binds where
    that over the ratio exceeds `tokens`. With no full layer the pool is the windowed one alone (no ratio)."""
    per_layer = kv_bytes_per_token(arch, tp) / arch.num_layers
    windowed, span = arch.local_attention  # SGLang pools a chunked layer as a window of the chunk (model_runner.py)
    full = arch.num_layers - windowed
    held = min(tokens, span * (1 + pool.eviction_interval_windows)) if windowed else tokens
    if full == 0:
        return per_layer * windowed * held
    cell = per_layer * (full + pool.full_tokens_ratio * windowed)
    return cell * max(tokens, held / pool.full_tokens_ratio if windowed else 0.0)


def engine_kv_bytes_per_sequence(job, plan: Plan, tokens: float) -> float:
    """KV budget one sequence of `tokens` tokens takes in the job's rollout engine (the framework card's
    rl.engines.<engine>): the split pool (swa_pool_bytes_per_sequence) for a windowed model type the engine pools
    apart, else kv_bytes_per_sequence with the window freed (windowed_kv: window) or every token kept."""
    facts, arch = job.rl_card.engines[plan.rollout_engine], job.model
    if facts.swa_pool is not None and arch.local_attention[0] and arch.model_type in facts.swa_pool.model_types:
        return swa_pool_bytes_per_sequence(arch, plan.rollout_tp, tokens, facts.swa_pool)
    return kv_bytes_per_sequence(arch, plan.rollout_tp, tokens, facts.windowed_kv == "window")


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


def outside_budget(job, plan: Plan, working: float) -> float:
    """What the engine holds on the GPU beside its fraction's budget: its CUDA graphs (none under enforce_eager), and,
    where the fraction is of the free memory, its activations (vLLM allocates its whole budget, KV preallocated;
    SGLang's static pool is weights + KV, activations outside). `working`: engine_working_bytes."""
    of_free = job.rl_card.engines[plan.rollout_engine].memory_fraction_of == "free"
    return graph_bytes(plan) + (working if of_free else 0.0)


def graph_bytes(plan: Plan) -> float:
    """The engine's CUDA graphs, outside its fraction (calibration.yaml rl); none under enforce_eager."""
    return 0.0 if plan.rollout_enforce_eager else calibration_card().rl.cuda_graph_bytes.value


def engine_memory(job, plan: Plan, free_bytes: float) -> EngineMemory:
    """The engine on one GPU where `free_bytes` are free when it starts (the trainer's resident state taken): vLLM's
    fraction is a share of total memory, SGLang's of the free memory (the framework card's `memory_fraction_of`)."""
    card = job.rl_card
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
    per_rank = int(kv // engine_kv_bytes_per_sequence(job, plan, length))
    seqs = min(per_rank, card.defaults.max_num_seqs) * plan.rollout_dp
    graphs = graph_bytes(plan)
    on_gpu = budget + outside_budget(job, plan, working)
    note = (f"{plan.rollout_engine} budget {of} = {budget / GIB:.1f} GiB: weights {weights / GIB:.1f} GiB (rollout "
            f"TP{plan.rollout_tp}{ep_words(arch.moe is not None, plan)}), activations "
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

