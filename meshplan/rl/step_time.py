"""Time per RL step: the rollout engine's decode steps and waves, the prefill, the log-prob passes, the update,
resharding the weights to the engine and the phase offloads' transfers, and the ThroughputReport built from them.
"""

from __future__ import annotations

from meshplan.arithmetic.flops import model_flops_per_token
from meshplan.core.units import GIB
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.model_counts import expert_params, total_params
from meshplan.rl.engine import ENGINE_BYTES, engine_weight_bytes, kv_bytes_per_token, rl_constant
from meshplan.rl.job import rl_job_gpus
from meshplan.rl.memory import critic_apart, phase_setting, reference_bytes, rl_memory
from meshplan.schema.plan import Plan
from meshplan.schema.reports import RLStepTime


def _engine_param_split(arch, plan: Plan) -> tuple[float, float, float]:
    """One engine GPU's bytes read every decode step whatever the batch (attention, dense and shared MLPs, norms,
    routers, the head), one routed expert's bytes on that GPU, and the routed experts each MoE layer holds there."""
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
    card, rl, arch, gpu = job.rl_card, job.rl, job.model, job.gpu
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
    setting = phase_setting(job, plan)  # what rl_memory moves between phases: the same states, the same reference
    update_stage = max(memory.stages, key=lambda s: s.total_bytes)
    moved = sum(getattr(update_stage, f"{cls}_bytes") for cls in setting.phase_classes)
    if setting.ref_on_host:
        moved += reference_bytes(setting, update_stage)
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
        "tokens_per_s_per_gpu": tokens / timing.step_s / rl_job_gpus(job.num_gpus, critic_apart(job, plan),
                                                                     plan.placement, plan.rollout_gpus),
        "rl": timing, "assumptions": [note, "mfu is the actor update's, as verl reports it.", *update.assumptions],
    })


def job_throughput(job, plan: Plan):
    """The throughput report every caller takes: the training step's, or for an RL job the whole RL step."""
    return rl_throughput(job, plan) if job.rl is not None else estimate_throughput(job, plan)
