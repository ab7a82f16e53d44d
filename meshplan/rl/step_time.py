"""Time per RL step: the rollout engine's decode steps and waves, the prefill, the log-prob passes, the update,
resharding the weights to the engine and the phase offloads' transfers, and the ThroughputReport built from them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from meshplan.arithmetic.comm import job_links, small_allreduce_time
from meshplan.arithmetic.flops import model_flops_per_token, verl_flops
from meshplan.arithmetic.mesh import rl_job_gpus
from meshplan.core.units import GIB, plural
from meshplan.estimate.perf import HeadLoss, estimate_throughput, head_loss, log_prob_loss_bytes
from meshplan.knowledge.calibration import calibration, calibration_card
from meshplan.knowledge.model_counts import expert_params, total_params
from meshplan.knowledge.releases import predates
from meshplan.rl.engine import (
    ENGINE_BYTES,
    engine_kv_bytes_per_sequence,
    engine_weight_bytes,
    ep_words,
    kv_bytes_per_sequence,
)
from meshplan.rl.launches import eager_launches
from meshplan.rl.lengths import age_in_flight, drain_need, length_variance, quantile, rate, survival_mean
from meshplan.rl.memory import (
    critic_apart,
    packing_args,
    phase_setting,
    rank_mini_batch,
    reference_bytes,
    rl_memory,
)
from meshplan.rl.stragglers import packed_slowest_share, slowest_rank_share
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


def decode_collectives(job, plan: Plan, batch: float, cal) -> float:
    """Seconds of one decode step's collectives on one engine GPU, each on a batch x hidden bf16 tensor at the
    ring's bandwidth plus one small-message latency (arithmetic/comm.small_allreduce_time): per layer attention's
    output all-reduce over the rollout TP (vLLM RowParallelLinear o_proj), and the MLP's over the TP too (down_proj,
    or the MoE layer's one all-reduce after the routed and shared experts), or with EP the MoE layer's dispatch
    and combine over TP x DP: vLLM's default EP path all-gathers every DP rank's tokens and reduce-scatters them
    back (all2all.py AgRsAll2AllManager), an all-reduce's bytes of the DP ranks' batches. At a decode batch these
    are latency-bound inside a node; across nodes (a TP group of 32 over 4 nodes) the bytes count too."""
    arch = job.model
    lk = job_links(job, cal)
    activations = batch * arch.hidden_size * ENGINE_BYTES
    tp = small_allreduce_time(activations, plan.rollout_tp, 1, lk)
    moe = len(arch.moe.moe_layers) if arch.moe is not None else 0
    if plan.rollout_ep > 1:
        group = plan.rollout_tp * plan.rollout_dp
        routed = small_allreduce_time(activations * plan.rollout_dp, group, 1, lk)
    else:
        routed = tp
    return (2 * arch.num_layers - moe) * tp + moe * routed


def decode_step_seconds(job, plan: Plan, batch: int, context: float) -> tuple[float, str]:
    """One decode step of `batch` sequences at `context` tokens on one engine GPU: the larger of reading its weights
    (every dense weight, and the routed experts the batch's tokens reach) plus the batch's KV cache from HBM, and
    the step's FLOPs; plus the layers' collectives on the batch's activations (`decode_collectives`) and, run eager,
    the host's kernel launches (rl/launches.eager_launches)."""
    cal = calibration(job.framework)
    arch, gpu = job.model, job.gpu
    fixed, per_expert, experts_here = _engine_param_split(arch, plan)
    touched = 0.0
    if arch.moe is not None:
        # tokens routed to this GPU's experts in one step: every DP rank's batch when EP spans them
        routed = batch * arch.moe.top_k * (plan.rollout_dp if plan.rollout_ep > 1 else 1)
        reach = 1.0 - (1.0 - 1.0 / arch.moe.num_experts) ** routed  # chance an expert gets at least one token
        touched = per_expert * experts_here * reach * len(arch.moe.moe_layers)
    kv = batch * kv_bytes_per_sequence(arch, plan.rollout_tp, context, window_only=True)  # a window reads its own
    memory_s = (fixed + touched + kv) / (gpu.hbm_bandwidth * cal.hbm_efficiency)
    flops = model_flops_per_token(arch, int(context), mtp_layers=0) / 3 * batch / plan.rollout_tp
    compute_s = flops / (gpu.bf16_flops * cal.gemm_peak_fraction)
    comm_s = decode_collectives(job, plan, batch, cal)
    eager = eager_launches(arch, plan)  # without CUDA graphs the host launches every layer's kernels each step
    bound = "HBM" if memory_s >= compute_s else "compute"
    words = (f"{bound}-bound: {(fixed + touched) / GIB:.1f} GiB of weights and {kv / GIB:.1f} GiB of KV read "
             f"({memory_s * 1e3:.1f} ms), {compute_s * 1e3:.1f} ms of FLOPs, {comm_s * 1e3:.2f} ms of all-reduces"
             + (f", {eager.words}" if eager.kernels else ""))
    return max(memory_s, compute_s) + comm_s + eager.seconds, words


class Decode(NamedTuple):
    """One engine DP rank's decode of its share of the responses (`decode_seconds`)."""

    seconds: float
    sequences: int  # decoded at once (the full batch)
    rounds: int  # of the full batch to finish the share
    step: float  # seconds of one step at the full batch
    words: str


def decode_seconds(job, plan: Plan, share_of_rank: int, planned: int, held: int) -> Decode:
    """Seconds one engine DP rank decodes its `share_of_rank` responses, `planned` (the KV cache at the longest) or
    `held` (at the tokens in flight, `sequences_per_rank`) at once.

    Every response at response_length M (no mean stated): rounds of the planned batch B, M steps each at the mean
    context prompt + M / 2 (the prompts at their mean, mean_prompt_length where stated, else prompt_length). With a
    mean m < M, continuous batching (vLLM's scheduler admits a waiting sequence as soon as one finishes, up to
    max_num_seqs and its KV blocks): while sequences wait, the `held` slots B all decode, at
    the mean context in flight (rl/lengths.age_in_flight), for k whole rounds of m steps each (k = (N - B) // B),
    then until the share r = (N - B) / B - k of the slots that take one more response have freed, the r-quantile of
    the lengths (the rounds of equal lengths, the continuous queue of spread ones); then each slot's last response
    drains, the batch shrinking as they finish (B x P(L > t), at least the longest one),
    until the longest ends at M, in calibration.yaml's rl.response_drain_segments segments, each at its mean live
    batch and context. Never more than every response at M (the step is convex in the context: near m = M the
    segments could add a hair over it)."""
    rl = job.rl
    prompt, longest, mean = rl.mean_prompt, rl.response_length, rl.mean_response
    batch = min(planned, share_of_rank)
    rounds = -(-share_of_rank // batch)
    step, words = decode_step_seconds(job, plan, batch, prompt + longest / 2)
    at_max = rounds * longest * step
    if mean >= longest:
        return Decode(at_max, batch, rounds, step, words)
    share = mean / longest
    u = rate(share)
    batch = min(max(planned, held), share_of_rank)
    step, words = decode_step_seconds(job, plan, batch, prompt + longest * age_in_flight(u, share))
    whole, part = divmod(share_of_rank - batch, batch)
    waiting = whole * mean + longest * quantile(u, part / batch)
    seconds = waiting * step
    segments = int(calibration_card().rl.response_drain_segments.value)
    for k in range(segments):
        x0, x1 = k / segments, (k + 1) / segments
        live = max(1.0, batch * survival_mean(u, x0, x1))
        seconds += longest / segments * decode_step_seconds(job, plan, live, prompt + longest * (x0 + x1) / 2)[0]
    words += (f"; responses of mean {mean:,} and at most {longest:,} tokens, continuous batching: "
              f"{waiting:,.0f} steps at the full batch while sequences wait, then the "
              f"last ones drain over {longest:,} steps")
    return Decode(min(seconds, at_max), batch, -(-share_of_rank // batch), step, words)


def sequences_per_rank(job, plan: Plan, rollout: dict) -> tuple[int, int]:
    """Sequences one engine DP rank holds at once: as many as its KV cache holds at the prompt + the longest response
    (the engine's own figure at prompt_length, more where the prompts' stated mean is shorter; at most max_num_seqs),
    and with a mean response below the longest, as many as it holds at the most tokens a sequence needs in
    `decode_seconds`' schedule (vLLM allocates KV blocks as the tokens come and admits waiting sequences while blocks
    and max_num_seqs allow: calibration.yaml rl.response_drain_segments' source): the mean prompt + the mean tokens
    in flight while the queue keeps the batch full, or in the drain the survivors' prompt + t times P(L > t) at its
    largest (the longest at the maximum); at most max_num_seqs. Preemptions when the tokens in flight swing over
    their mean are not counted. `rollout` is the rollout phase's detail (rl_memory)."""
    planned = max(1, int(rollout.get("sequences_at_once", 0) // plan.rollout_dp))
    rl = job.rl
    prompt, longest = rl.mean_prompt, rl.response_length
    cap = job.rl_card.defaults.max_num_seqs
    def sequence(tokens: float) -> float:
        return engine_kv_bytes_per_sequence(job, plan, tokens)

    if prompt < rl.prompt_length:  # every response at the longest, the prompts at their mean
        planned = max(planned, min(int(rollout.get("kv_cache", 0) // sequence(prompt + longest)), cap))
    if rl.mean_response >= longest:
        return planned, planned
    share = rl.mean_response / longest
    u = rate(share)
    need = longest * max(prompt / longest + age_in_flight(u, share), drain_need(u, prompt / longest))
    held = int(rollout.get("kv_cache", 0) // sequence(need))
    return planned, max(planned, min(held, cap))


def at_tokens(update, tokens: float, flops: float | None = None, batches: float = 1.0) -> float:
    """The update's seconds at `tokens` of the tokens it was estimated at and `flops` of its model FLOPs (flops_share:
    attention's reach shrinks with the sequence too; `tokens` where not given), over `batches` of the batch it was
    estimated for (an RL step's prompts over one mini-batch's; a last, smaller mini-batch counts its share): the
    micro-batches' compute scales with the FLOPs, their TP/CP/EP/PP traffic with the tokens, both with the batches;
    once per optimizer step (ceil(batches)) come the step's gradient sync, optimizer and other terms, its offload,
    and the pipeline's fill and drain, whose micro-batches dynamic batching packs to the same token budget whatever
    the mean (verl rearrange_micro_batches; megatron_actor.update_policy runs forward_backward_batch and
    optimizer.step once per mini-batch)."""
    flops = tokens if flops is None else flops
    if tokens >= 1 and flops >= 1 and batches == 1:
        return update.step_time_s
    b = update.breakdown
    fixed = min(update.step_time_s, b.dp_comm_s + b.other_s + b.offload_s)
    flush = min(update.step_time_s - fixed, b.bubble_s)
    scaled = update.step_time_s - fixed - flush
    compute = min(scaled, b.compute_s)
    return math.ceil(batches) * (fixed + flush) + batches * (compute * flops + (scaled - compute) * tokens)


def log_prob_seconds(update, tokens: float, flops: float) -> float:
    """One log-prob pass over the step's batch: a forward of the update's micro-batches, a third of their compute
    (no recompute) and TP/CP/EP/PP traffic, the compute at `flops` and the traffic at `tokens` of what the update was
    estimated at (`at_tokens`), and one pipeline fill and drain (verl's compute_log_prob runs the whole batch in one
    forward-only schedule); no gradient sync or optimizer."""
    b = update.breakdown
    traffic = b.tp_comm_s + b.cp_comm_s + b.ep_comm_s + b.pp_comm_s
    return ((b.compute_s - b.recompute_s) * flops + traffic * tokens + b.bubble_s) / 3


def log_prob_loss_seconds(job, plan: Plan, head: HeadLoss, share: float) -> tuple[float, float, float]:
    """What each log-prob pass's loss path takes beyond the third of the update's that `log_prob_seconds` counts,
    seconds over the step's batch on a rank of the output layer's stage (at `share` of its tokens): the old policy's
    pass, the reference's and the critic's, each its own forward bytes per logit (perf.log_prob_loss_bytes: the old
    policy's adds the entropy where the engine computes it there; the critic's value head reads no vocabulary, 0)
    less a third of the update's, over that rank's logits (`head`, perf.head_loss). Zeros where the engine's card
    counts no RL loss path."""
    old, ref = log_prob_loss_bytes(job, plan, True), log_prob_loss_bytes(job, plan, False)
    if old is None or ref is None:
        return 0.0, 0.0, 0.0
    hbm = job.gpu.hbm_bandwidth * calibration(job.framework).hbm_efficiency
    per_byte = head.logits * share / hbm
    third = head.update_bytes / 3
    return (old - third) * per_byte, (ref - third) * per_byte, -third * per_byte


def mini_batch_update(job, plan: Plan, update):
    """The update estimate of one optimizer step and how many of its batch the RL step's update runs: `update` (the
    whole step's sequences) and 1 where the job names no mini-batch, else the estimate at one mini-batch's sequences
    (prompts_per_mini_batch x samples: its micro-batches, pipeline flush, gradient sync and optimizer step) and
    prompts_per_step / prompts_per_mini_batch of them."""
    rl = job.rl
    if not rl.splits_step:
        return update, 1.0
    mini = job.model_copy(update={"global_batch_size": rl.mini_batch_sequences})
    return estimate_throughput(mini, plan), rl.prompts_per_step / rl.prompts_per_mini_batch


def micro_batch_sync(job, plan: Plan) -> tuple[int, int]:
    """(sequences a micro-batch, data-parallel ranks meeting at each) where the trainer's engine joins ranks at every
    micro-batch (the card's rl.micro_batch_sync: FSDP every data-parallel rank, Megatron-Core an MoE layer's expert-
    parallel group, ep x etp ranks over the tp x cp ranks that share a sequence); (0, 1) where only the mini-batch's
    end joins them. Where the micro-batches are packed to a token budget (rl.packed_micro_batches, at lengths under
    the longest: memory.packing_args) the sequences a micro-batch are the packing's, 0 (`slowest_rank` times them)."""
    card = job.rl_card
    sync = card.micro_batch_sync.get(job.card.engine_at(plan.zero_stage))
    if sync is None:
        return 0, 1
    if sync == "data_parallel":
        ranks = plan.dp
    elif job.model.moe is not None and plan.ep > 1:
        ranks = min(plan.dp, max(1, plan.ep * plan.etp // (plan.tp * plan.cp)))
    else:
        ranks = 1
    if ranks <= 1:
        return 0, 1
    return (0 if packing_args(job, plan) else plan.micro_batch_size), ranks


def slowest_rank(job, plan: Plan, whole_step: bool = False) -> float:
    """The slowest data-parallel rank's tokens of a mini-batch over the mean rank's (rl/stragglers.py), where the
    framework's trainer balances the step over the ranks and splits each share into mini-batches in rollout order
    (its card's rl.balanced_step_batch) on a release before it sorted the shares by workload (release_changes
    rank_share_sorted: verl 62221fa13, v0.6.1), or cuts each mini-batch into chunks of consecutive sequences with no
    balancing (rl.in_order_rank_chunks: SkyRL); with `whole_step`, of the whole step's chunk (a pass the trainer runs
    over the step at once: balanced shares have no straggler there). Where the engine joins ranks at every
    micro-batch (`micro_batch_sync`), each micro-batch at its slowest rank of those: micro-batches packed to a token
    budget (rl.packed_micro_batches) are Karmarkar-Karp's bins of the rank's mini-batch (stragglers.packed_slowest_
    share). 1.0 otherwise, with one rank, no length spread (no mean stated: every sequence at its longest), or on the
    sorted release, whose ranks' mini-batches are one quantile band of like shares, their micro-batches sorted by
    workload alike (bench/rl_stragglers.py simulates 0-1.2% at every micro-batch there)."""
    card, rl = job.rl_card, job.rl
    micro, ranks = micro_batch_sync(job, plan)
    if card.in_order_rank_chunks:
        sequences = rl.step_sequences // plan.dp if whole_step else rank_mini_batch(job, plan)
        return slowest_rank_share(plan.dp, max(1, sequences), 1, rl.prompt_length, rl.response_length,
                                  rl.mean_prompt, rl.mean_response, in_order=True,
                                  samples_per_prompt=rl.samples_per_prompt, micro_batch=micro, sync_ranks=ranks)
    if not card.balanced_step_batch or whole_step:
        return 1.0
    change = job.card.release_change("rank_share_sorted")
    if change is not None and not predates(job.framework_version, change):
        return 1.0
    mini_batches = -(-rl.prompts_per_step // rl.mini_batch_prompts)
    packing = packing_args(job, plan)
    if packing is not None and ranks > 1:
        budget, sequences, prompt, response, mean_prompt, mean_response, dp, divisor = packing
        return packed_slowest_share(dp, ranks, sequences, mini_batches, budget, prompt, response, mean_prompt,
                                    mean_response, divisor)
    return slowest_rank_share(plan.dp, rank_mini_batch(job, plan), mini_batches, rl.prompt_length, rl.response_length,
                              rl.mean_prompt, rl.mean_response, micro_batch=micro, sync_ranks=ranks)


def log_prob_slowest(job, plan: Plan, mini_batch: float) -> float:
    """The log-prob passes' tokens at their slowest rank over the mean rank's, averaged over the passes: the old
    policy's and the critic's run a mini-batch's chunks at a time (`mini_batch`, slowest_rank as the update timed it)
    and the reference's the whole step's where the trainer chunks in order (rl.in_order_rank_chunks: SkyRL's
    recompute_old_logprobs_per_minibatch, on by default); 1.0 where it balances the step (each rank's balanced share
    runs whole)."""
    card, algorithm = job.rl_card, job.rl.algorithm
    if not card.in_order_rank_chunks:
        return 1.0
    mini, ref = 1 + card.critic[algorithm], card.reference_model[algorithm]
    return (mini * mini_batch + ref * slowest_rank(job, plan, whole_step=True)) / (mini + ref)


def straggler_words(job, plan: Plan, slowest: float) -> str:
    """What the update's note says of its `slowest` rank (`slowest_rank`, as rl_step_time timed it): nothing where it
    times none."""
    if slowest <= 1.0:
        return ""
    how, key = (("cuts each mini-batch into data-parallel chunks of consecutive sequences in rollout order, "
                 "balancing none (its log-prob passes too)", "in_order_rank_chunks") if job.rl_card.in_order_rank_chunks
                else ("splits each rank's balanced share into mini-batches in rollout order", "balanced_step_batch"))
    micro, ranks = micro_batch_sync(job, plan)
    engine, packing = job.card.engine_at(plan.zero_stage), packing_args(job, plan)
    if packing is not None and ranks > 1:
        met = (f", and its {engine} engine joins {ranks} of them at every micro-batch, which it packs to "
               f"{packing[0]:,} tokens by Karmarkar-Karp, each at its slowest (rl.micro_batch_sync, "
               "rl.packed_micro_batches)")
    else:
        met = (f", and its {engine} engine joins {ranks} of them at every micro-batch of "
               f"{plural(micro, 'sequence')}, each at its slowest (rl.micro_batch_sync)" if micro else "")
    return (f" (each mini-batch at its slowest of {plan.dp} data-parallel ranks' tokens, {slowest:.3f}x the mean "
            f"rank's: {job.card.display_name} {job.framework_version or job.card.version} {how}{met}; "
            f"cards/frameworks/{job.framework}.yaml rl.{key})")


class StepWords(NamedTuple):
    """What an RL step's note says beside its figures (rl_report), worded where rl_step_time times them: the decode's
    (decode_seconds) and the update's slowest rank's (straggler_words)."""

    decode: str
    straggler: str


def flops_share(job) -> float:
    """The model FLOPs of the sequences at their mean prompt and response over those at the longest (tokens and
    attention's reach): what the update's MFU counts, as verl counts the real sequences' FLOPs."""
    rl = job.rl
    mean, longest = rl.mean_prompt + rl.mean_response, rl.prompt_length + rl.response_length
    return mean * model_flops_per_token(job.model, mean) / (longest * model_flops_per_token(job.model, longest))


def step_token_moments(job) -> tuple[float, float]:
    """The RL step's tokens and the sum of its sequences' squared lengths: its prompts x samples sequences at the
    request's mean prompt and response, their squares' mean the mean squared plus the lengths' variance (rl/lengths.py,
    the prompt and the response drawn apart). What verl's flops_counter reads of the step (ray_trainer.py's
    global_token_num: each sequence's attention-mask sum; arithmetic/flops.verl_flops)."""
    rl = job.rl
    mean = rl.mean_prompt + rl.mean_response
    spread = length_variance(rl.mean_prompt, rl.prompt_length) + length_variance(rl.mean_response, rl.response_length)
    return rl.step_sequences * mean, rl.step_sequences * (mean * mean + spread)


def actor_update_seconds(job, timing: RLStepTime) -> float:
    """One actor update of the RL step, seconds: its update_s less the critic's (RLCard.trained_models), what
    update_mfu is the MFU over."""
    return timing.update_s / job.rl_card.trained_models(job.rl.algorithm)


def logged_update_mfu(job, timing: RLStepTime) -> float:
    """The actor update's MFU as the framework logs it (its card's rl.logged_mfu_flops): meshplan's own
    (timing.update_mfu), or verl's flops_counter's count of the step's sequences (arithmetic/flops.verl_flops,
    `step_token_moments`) x update epochs over one actor update's seconds, the actor's GPUs and the GPU's peak (verl's
    device table's within 0.1% for H20 and H100); meshplan's own where verl counts the model_type 0."""
    if job.rl_card.logged_mfu_flops == "flops_counter":
        counted = verl_flops(job.model, *step_token_moments(job))
        if counted is not None:
            return counted * job.rl.epochs / (actor_update_seconds(job, timing) * job.num_gpus * job.gpu.bf16_flops)
    return timing.update_mfu


def phase_offload_bytes(setting, stage) -> tuple[float, float]:
    """One GPU's phase-offload traffic of an RL step on stage report `stage`: (bytes copied out and back, bytes
    copied in alone). Each load of a model's states (rl/memory.state_loads, which the setting holds) moves the
    classes on the host between phases (setting.phase_classes), the weights at every load, the gradients and
    optimizer at an update's; PPO's critic beside the actor as a copy of the actor's states; the reference's weights
    where they are on the host, out and back each load, or where its pass brings them one FSDP unit at a time
    (setting.ref_per_unit: verl's FSDP CPU offload) copied in alone, the host copy never written back."""

    def model_bytes(model: str) -> float:
        n = setting.loads[model]
        return sum(getattr(stage, f"{cls}_bytes") * (n.weights if cls == "weights" else n.update)
                   for cls in setting.phase_classes)

    both = model_bytes("actor") + (model_bytes("critic") if setting.critic_beside_actor else 0.0)
    ref = reference_bytes(setting, stage) * setting.loads["reference"].weights if setting.ref_on_host else 0.0
    return (both, ref) if setting.ref_per_unit else (both + ref, 0.0)


def overlaps(job, plan: Plan) -> bool:
    """Whether generation runs beside the training side: a separate rollout pool whose framework trains one step
    off (card rl.separate_overlaps); SkyRL's trainer waits for the generation at either placement."""
    return plan.placement == "separate" and job.rl_card.separate_overlaps


def rl_step_time(job, plan: Plan, reports: tuple | None = None, update=None):
    """Seconds of one RL step and its parts (schema.RLStepTime), the actor update's ThroughputReport, the note's
    StepWords and the memory estimate (rl_memory).

    Generation: each replica's share of prompts x samples sequences decodes as many at once as its KV cache holds
    (`sequences_per_rank`), each step read-bound or compute-bound (decode_step_seconds), timed by `decode_seconds`;
    prefill is the prompts' forward FLOPs. Log-prob passes are forwards of the update's batch
    (`log_prob_seconds`). They and the update are estimated at prompt + response_length tokens (what memory plans
    for) and cost prompt + the mean response, their compute at its FLOPs (dynamic batches pack the real tokens), the
    update once per mini-batch of prompts_per_mini_batch and update epoch (`mini_batch_update`, `at_tokens`), each
    mini-batch's micro-batches at its slowest data-parallel rank's tokens where the trainer splits the ranks' shares
    in rollout order (`slowest_rank`; the log-prob passes run each rank's balanced share whole), or cuts every pass
    into unbalanced chunks (`log_prob_slowest` too).
    Resharding moves the bf16 weights once over the slowest link the trainer's model-parallel group or the rollout
    pool spans. Phase offloads move their states over the host link at each load the trainer's loop makes of them
    (`phase_offload_bytes`: the actor's, PPO's critic's beside it, the reference's). Colocated parts add; a separate
    rollout pool generates the next batch while the trainer trains where the framework's trainer runs one step off
    (its card's rl.separate_overlaps: verl's one-step-off recipe), else its parts add too (SkyRL's
    RayPPOTrainer generates, then trains, then syncs the weights)."""
    card, rl, arch, gpu = job.rl_card, job.rl, job.model, job.gpu
    cal = calibration(job.framework)
    update = update or estimate_throughput(job, plan)
    passes = 1 + card.reference_model[rl.algorithm] + card.critic[rl.algorithm]
    share = rl.token_share
    flops = flops_share(job) if share < 1 else 1.0
    old_loss, ref_loss, critic_loss = log_prob_loss_seconds(job, plan, head_loss(job, plan), share)
    slowest = slowest_rank(job, plan)  # each mini-batch's micro-batches run at its slowest DP rank's tokens
    straggle = log_prob_slowest(job, plan, slowest)  # SkyRL's passes run unbalanced chunks too
    log_prob = (passes * log_prob_seconds(update, share * straggle, flops * straggle) + old_loss
                + card.reference_model[rl.algorithm] * ref_loss + card.critic[rl.algorithm] * critic_loss)
    mini, batches = mini_batch_update(job, plan, update)
    one_update = at_tokens(mini, share * slowest, flops * slowest, batches) * rl.epochs  # each epoch: every one again
    update_s = one_update * card.trained_models(rl.algorithm)

    memory = rl_memory(job, plan, reports)
    rollout_phase = next(p for p in memory.phases if p.phase == "rollout")
    planned, held = sequences_per_rank(job, plan, rollout_phase.detail)
    group_size = plan.rollout_tp * plan.rollout_dp
    replicas = max(1, plan.rollout_gpus // group_size)
    sequences = rl.prompts_per_step * rl.samples_per_prompt
    per_dp_rank = -(-sequences // (replicas * plan.rollout_dp))
    decode = decode_seconds(job, plan, per_dp_rank, planned, held)
    prefill_flops = model_flops_per_token(arch, rl.mean_prompt, mtp_layers=0) / 3 * rl.mean_prompt * per_dp_rank
    prefill = prefill_flops / plan.rollout_tp / (gpu.bf16_flops * cal.gemm_peak_fraction)
    generation = prefill + decode.seconds

    weights = ENGINE_BYTES * total_params(arch)
    trainer_group = plan.tp * plan.pp * plan.ep * plan.cp
    cross = plan.placement == "separate" or trainer_group > job.gpus_per_node or group_size > job.gpus_per_node
    link = gpu.network_bandwidth * cal.network_efficiency if cross else gpu.intra_node_bandwidth * cal.nvlink_efficiency
    reshard = weights / link
    setting = phase_setting(job, plan)  # what rl_memory moves between phases: the same states, the same reference
    update_stage = max(memory.stages, key=lambda s: s.total_bytes)
    round_trip, one_way = phase_offload_bytes(setting, update_stage)
    offload = (2 * round_trip + one_way) / gpu.host_bandwidth
    train_side = log_prob + update_s + offload
    if overlaps(job, plan):
        total = max(generation, train_side) + reshard
    else:
        total = generation + train_side + reshard
    parts = {"generation": generation, "log-prob passes": log_prob, "update": update_s, "resharding": reshard,
             "offload": offload}
    limited = max(parts, key=parts.get)
    return RLStepTime(
        step_s=total, generation_s=generation, prefill_s=prefill, decode_s=decode.seconds, log_prob_s=log_prob,
        update_s=update_s, reshard_s=reshard, offload_s=offload, replicas=replicas,
        sequences_at_once=decode.sequences * plan.rollout_dp, decode_waves=decode.rounds, decode_step_s=decode.step,
        update_mfu=(update.mfu * flops * rl.epochs * update.step_time_s / one_update
                    if share < 1 or batches > 1 or rl.epochs > 1 else update.mfu),
        limited_by=limited,
    ), update, StepWords(decode.words, straggler_words(job, plan, slowest)), memory


def rl_throughput(job, plan: Plan):
    """The ThroughputReport of an RL job: step_time_s is the whole RL step (its parts in `rl`), tokens/s count the
    trained tokens over it, and mfu is the actor update's (what verl reports)."""
    timing, update, words, _ = rl_step_time(job, plan)
    return rl_report(job, plan, timing, update, words)


def rl_report(job, plan: Plan, timing, update, words: StepWords):
    """The update's ThroughputReport turned into the RL step's (recommend builds its candidates with it too), its note
    with rl_step_time's `words`."""
    rl = job.rl
    share = rl.token_share
    tokens = update.tokens_per_s * update.step_time_s * share  # estimated at response_length, trained at the mean
    prompts = (f" of prompts of mean {rl.mean_prompt:,} of at most {rl.prompt_length:,} tokens"
               if rl.mean_prompt < rl.prompt_length else "")
    note = (f"RL step ({rl.algorithm}, {plan.placement}): generation {timing.generation_s:,.0f} s (prefill "
            f"{timing.prefill_s:,.0f} s{prompts}, decode {timing.decode_s:,.0f} s: "
            f"{plural(timing.replicas, 'replica')} of rollout "
            f"TP{plan.rollout_tp}{f' DP{plan.rollout_dp}' if plan.rollout_dp > 1 else ''}"
            f"{ep_words(job.model.moe is not None, plan)}, {plural(timing.sequences_at_once, 'sequence')} at once, "
            + (f"{plural(timing.decode_waves, 'wave')} of {rl.response_length:,} steps of "
               if rl.mean_response >= rl.response_length
               else "steps at the full batch of ")
            + f"{timing.decode_step_s * 1e3:.1f} ms, "
            f"{words.decode}), log-prob passes {timing.log_prob_s:,.0f} s, update {timing.update_s:,.0f} s"
            f"{words.straggler}, resharding "
            f"{timing.reshard_s:,.1f} s, phase offloads {timing.offload_s:,.1f} s; "
            + ("separate pools: generation overlaps the training side (one step off)." if overlaps(job, plan) else
               f"{plan.placement}{' pools' if plan.placement == 'separate' else ''}: the parts add."))
    return update.model_copy(update={
        "plan": plan,  # the update may be one estimated for another rollout shape of the same actor (rl_step_time)
        "step_time_s": timing.step_s, "tokens_per_s": tokens / timing.step_s,
        "tokens_per_s_per_gpu": tokens / timing.step_s / rl_job_gpus(job.num_gpus, critic_apart(job, plan),
                                                                     plan.placement, plan.rollout_gpus),
        "mfu": timing.update_mfu,
        "model_flops_per_step": update.model_flops_per_step * (flops_share(job) if share < 1 else 1.0) * rl.epochs,
        "rl": timing, "assumptions": [
            note, "mfu is the actor update's: its model FLOPs over the update's seconds and the actor's GPUs (verl's "
                  "own log counts the FLOPs with its flops_counter, which `meshplan compare` reads as verl counts "
                  "them).",
            *update.assumptions],
    })


def job_throughput(job, plan: Plan):
    """The throughput report every caller takes: the training step's, or for an RL job the whole RL step."""
    return rl_throughput(job, plan) if job.rl is not None else estimate_throughput(job, plan)
