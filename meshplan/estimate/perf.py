"""Step time, tokens/s per GPU and MFU of one training job under one parallel layout.

The model is first-order and explicit, so a reader can redo it by hand:
- every pipeline stage's time per micro-batch is the sum of its GEMMs (each at an achievable
  fraction of peak that depends on its shape), causal flash attention, memory-bound elementwise
  work, a per-layer launch overhead, and the exposed part of its TP / CP / EP / PP traffic;
- the pipeline runs m micro-batches: m x (slowest stage) plus the fill/drain of the others,
  divided by the virtual stages v, which is the (p-1)/(m*v) bubble for balanced stages;
- ZeRO-0/1: once per step the gradients are reduced over the data-parallel group (overlapped with the
  last backward) and ZeRO-1 gathers the parameters back; ZeRO-2/3 and FSDP move their traffic layer by
  layer (all-gathers forward and backward, reduce-scatters in the backward), per micro-batch or once per
  step as the framework schedules it, each hidden behind its neighbour layer's compute (exposed_sharding);
  the optimizer streams its state.
Constants come from cards/calibration.yaml (fitted on the Ultra-Scale Playbook sweep, see
bench/README.md); bandwidths and domain sizes from cards/hardware.yaml.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from meshplan.arithmetic import mesh
from meshplan.arithmetic.comm import (
    Links,
    allreduce_time,
    alltoall_time,
    dispatch_time,
    links,
    p2p_time,
    ring_time,
)
from meshplan.arithmetic.flops import (
    Gemm,
    Shard,
    attention_core_flops,
    attention_gemms,
    logits_gemm,
    mlp_gemms,
    model_flops_per_token,
    moe_gemms,
)
from meshplan.arithmetic.lora import (
    FROZEN_PASSES_PER_FORWARD,
    LoraEngine,
    adapter_params,
    layer_adapters,
    lora_engine,
    lora_flops_per_token,
)
from meshplan.arithmetic.memory_states import convention
from meshplan.arithmetic.mesh import crosses_domains, hierarchical_cp_sizes
from meshplan.arithmetic.muon import matrix_params, newton_schulz_seconds
from meshplan.arithmetic.offload import step_offload_time
from meshplan.arithmetic.schedule import Stages, plan_stages
from meshplan.estimate.memory import attention_switches, ep_rank_load, every_nth_blocks, routing_assumption
from meshplan.knowledge.calibration import Calibration, attention_fraction, calibration, calibration_summary
from meshplan.knowledge.cards import TpOverlapFacts, framework_card
from meshplan.knowledge.models import layer_params, per_architecture
from meshplan.request.resolve import uses_fsdp
from meshplan.rules.engine import require_estimable
from meshplan.schema.contract import Architecture, GpuSpec, Job, LoraSpec, Plan, ThroughputBreakdown, ThroughputReport

__all__ = ["estimate_throughput", "model_flops_per_token", "stage_layers"]

BF16 = 2  # bytes per activation element on the wire

# Counted constants of the step-time model, each with its derivation (what is judged or fitted lives in
# cards/calibration.yaml with its source).
# A GEMM's backward computes the input and the weight gradient, each as many FLOPs as its forward: forward +
# backward = 3x the forward, the forward a third (Narayanan et al. 2021). Memory-bound work splits the same way
# (one pass forward, two backward: elementwise_passes in the card), and so does the logits head.
TRAINING_PASSES_PER_FORWARD = 3.0
# Flash attention's backward recomputes the scores: five matmuls (S, dV, dP, dQ, dK) to the forward's two, 2.5x
# the forward FLOPs, so forward + backward = 3.5x (Dao-AILab/flash-attention benchmark_flash_attention.py flops()).
FLASH_ATTENTION_PASSES_PER_FORWARD = 3.5
# Communication that runs once in the forward runs mirrored once in the backward (activations forward, their
# gradients backward; FSDP gathers the weights for each): a forward is half of it.
FORWARD_AND_BACKWARD = 2.0
# Sequence-parallel TP: an all-gather before and a reduce-scatter after attention and after the MLP, 4 ring
# passes forward and 4 backward (Korthikanti et al. 2022, section 4.2.2; without SP, 2 all-reduces per pass
# move the same bytes).
TP_COLLECTIVES_PER_LAYER = 8.0
# A layer of routed experts only (no shared expert) keeps attention's pair, forward and backward: the experts
# take the sequence-sharded tokens straight into the all-to-all.
TP_COLLECTIVES_ATTENTION_ONLY = 4.0
# What each TP overlap mode hides (tp_hidden), for the breakdown's assumptions.
TP_OVERLAP_TEXT = {
    "fraction": "{share:.0%} hidden behind compute (cards/calibration.yaml tp_overlap).",
    "none": "none hidden (each collective waits for its GEMM).",
    "wgrad": "the backward reduce-scatter hidden behind the weight-gradient GEMM, up to its time.",
    "userbuffers": "userbuffers (tp_comm_overlap): each pipelined with its GEMM, up to (tp-1)/tp of its time, the "
                   "backward reduce-scatter in bulk behind the weight-gradient GEMM; the GEMMs beside the "
                   "reduce-scatter kernels run on the SMs those leave (the framework card's tp_overlap).",
    "async_tp": "async TP (tp_comm_overlap): each pipelined with its GEMM, up to (tp-1)/tp of its time; the "
                "local shard's copy, the reduce-scatter's sum of partials, the barriers and the chunked GEMMs' "
                "lower efficiency outside the pipeline (async_tp_cost).",
}
# torch's micro-pipelined TP (pytorch/pytorch torch/distributed/_symmetric_memory/__init__.py): symm_mem.barrier
# calls on the compute stream outside the pipeline, per fused op. All-gather + matmul
# (_pipelined_multi_all_gather_and_consume): barrier(channel=0) on entry, barrier(channel=1) after the local shard's
# copy, barrier(channel=0) on exit. Matmul + reduce-scatter (_pipelined_produce_and_all2all): barrier(channel=0) on
# entry and on exit (the two per step run in the pipeline, beside the other stream's chunk GEMM).
ASYNC_TP_AG_BARRIERS = 3.0
ASYNC_TP_RS_BARRIERS = 2.0
# Expert TP: an all-gather before and a reduce-scatter after the experts, forward and backward.
EXPERT_TP_COLLECTIVES_PER_LAYER = 4.0
# Token dispatch and combine, forward and backward.
EP_ALL_TO_ALLS_PER_LAYER = 4.0
# Ring attention (Transformer Engine AttnFuncWithCPAndKVP2P): each of the c-1 ring steps sends the K/V block on
# forward, K/V and dK/dV (one buffer of both) on backward, while the step's attention runs on the block at hand.
CP_RING_TRANSFERS_FORWARD = 1.0
CP_RING_TRANSFERS_BACKWARD = 2.0


# --------------------------------------------------------------------------- per-architecture caches

@per_architecture
def _layer_param_split(arch: Architecture) -> tuple[list[float], list[float]]:
    """Per layer: parameters sharded by TP or replicated, and routed-expert parameters (two columns, so a
    stage's total is one C-level sum). Cached per object."""
    dense, experts = [], []
    for i in range(arch.num_layers):
        p = layer_params(arch, i)
        dense.append(float(sum(p.values()) - p["routed_experts"]))
        experts.append(float(p["routed_experts"]))
    return dense, experts


def stage_layers(job: Job, plan: Plan) -> Stages:
    """The decoder layers each pipeline stage holds and the stage with the output layer, as estimate_throughput
    times them: the framework's convention from schedule.plan_stages, the same stages estimate_memory weighs."""
    return plan_stages(job, plan)


# --------------------------------------------------------------------------- validation


def _batch_warnings(job: Job, plan: Plan) -> list[str]:
    """What the estimate assumed about the batch (the framework's batch rule has already held or, for verl's
    FSDP engine and SkyRL, divides by another unit: `meshplan check` words it)."""
    unit = plan.micro_batch_size * plan.dp
    if job.global_batch_size % unit:
        return [f"global_batch_size {job.global_batch_size} is not a multiple of micro_batch_size x dp = {unit}; "
                f"timed as {job.global_batch_size // unit} micro-batches."]
    return []


# --------------------------------------------------------------------------- one layer on one rank


@dataclass
class LayerTime:
    """Seconds for one layer, one micro-batch, forward + backward, on one rank."""

    gemm: float = 0.0
    attention: float = 0.0
    elementwise: float = 0.0
    overhead: float = 0.0
    tp: float = 0.0
    cp: float = 0.0
    cp_fwd: float = 0.0  # forward share of cp (what full recompute repeats)
    ep: float = 0.0
    recompute: float = 0.0
    fwd_compute: float = 0.0  # forward share of gemm + attention + elementwise (recompute, overlap windows)
    attention_fwd: float = 0.0  # forward of the attention core alone (what selective recompute repeats)
    op_sac_fwd: float = 0.0  # forward of what torchtitan's op-level SAC does not keep (what its recompute repeats)
    module_fwd: dict[str, float] = field(default_factory=dict)  # forward of what each Megatron recompute module repeats

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.elementwise + self.overhead


def gemm_efficiency(g: Gemm, cal: Calibration, ridge_rows: float = 0.0) -> float:
    """Achievable fraction of peak: a saturation curve in each matrix dimension (small shards run slow); a routed
    expert's grouped GEMM saturates later in its rows (the tokens each local expert gets), since each expert reads its
    whole weight for few rows and its tile grid is small: the curve's half point is moe_gemm_half_ridges times the
    GPU's ridge rows (expert_ridge_rows), so a GPU with less compute per byte of memory needs fewer rows."""
    x0 = cal.gemm_half_dim
    eff = cal.gemm_peak_fraction * (g.m / (g.m + x0)) * (g.n / (g.n + x0)) * (g.k / (g.k + x0))
    if g.name.startswith("expert_"):
        eff *= g.m / (g.m + cal.moe_gemm_half_ridges * ridge_rows)
    return eff


def expert_ridge_rows(bf16_peak: float, hbm: float) -> float:
    """Rows per expert below which a GEMM that reads its whole weight once is memory-bound: 2*m*k*n FLOPs over
    2*k*n weight bytes (BF16; FP8 halves both the bytes and the time per FLOP) = m FLOPs per byte against the GPU's
    bf16_peak / hbm (H100 SXM 295, H20 37, B200 281)."""
    return bf16_peak / hbm


def gemm_seconds(gemms: list[Gemm], cal: Calibration, bf16_peak: float, fp8_peak: float | None,
                 ridge_rows: float = 0.0) -> float:
    """Forward + weight-gradient + data-gradient of each GEMM (3x the forward FLOPs). ridge_rows: the GPU's
    expert_ridge_rows, needed when the list holds routed experts' GEMMs."""
    total = 0.0
    for g in gemms:
        peak = fp8_peak if (fp8_peak and g.fp8) else bf16_peak
        total += TRAINING_PASSES_PER_FORWARD * g.flops / (peak * gemm_efficiency(g, cal, ridge_rows))
    return total


@dataclass(frozen=True)
class Ctx:
    """Everything the per-layer model needs, computed once per estimate."""

    arch: Architecture
    plan: Plan
    seq: int
    cal: Calibration
    lk: Links
    shard: Shard
    bf16_peak: float
    fp8_peak: float | None
    hbm: float
    flash: bool = True
    dropout: bool = False
    lora: LoraSpec | None = None  # a LoRA job's adapters (meshplan/arithmetic/lora.py); None: every weight trained
    lora_engine: LoraEngine | None = None
    a2a_steady_share: float = 0.0  # moe_a2a_overlap: the share of micro-batch chunks in the 1F1B steady state
    moe_host_syncs: float = 1.0  # device-to-host reads per MoE layer forward (moe_host_syncs: the dispatcher's)
    eager: bool = False  # blocks run as eager PyTorch ops (a compile switch left off): eager_elementwise_passes
    attention_fraction: float = 0.5  # of BF16 peak, the job's attention kernel on its GPU (attention_efficiency)
    attention_kernel: str | None = None  # that kernel's name (None: the shared fused-kernel fraction)
    routed_load: float = 1.0  # routed tokens on the most loaded EP rank over the mean (memory.ep_rank_load)
    tp_overlap_mode: str = "fraction"  # which TP collectives run beside a GEMM (tp_overlap_mode; tp_hidden)
    tp_rs_splits: int = 0  # chunks of a pipelined forward reduce-scatter (the card's tp_overlap.rs_splits; 0: tp)
    tp_sms: TpSms | None = None  # SMs the TP communication kernels hold beside their GEMMs (tp_sms; tp_hidden)

    @property
    def ridge_rows(self) -> float:
        return expert_ridge_rows(self.bf16_peak, self.hbm)


def attention_efficiency(job: Job, cal: Calibration, kernel: str | None = None,
                         backend: str = "auto", zero_stage: int | None = None) -> tuple[str | None, float]:
    """(kernel, fraction of BF16 peak) of the flash attention the job runs: with backend auto the kernel its framework
    release picks on the GPU's generation for the engine of `zero_stage` and for an MLA model (the framework card's
    attention section: AttentionSemantics.kernel_for), with flash or fused the kernel
    that backend is in the framework (the card's attention.backends), at that kernel's fraction for the generation
    (cards/calibration.yaml attention_kernels; else attention_peak_fraction). FlashAttention-2 reaches ~35% of an
    H100's peak where cuDNN / FA3-class kernels reach ~50% (FA3 paper), so the same trainer runs attention slower
    on an older release that still picked FA2. `kernel` names the one a run used instead (bench only: a published
    run of a trainer meshplan does not support, scored with another framework's card, e.g. LLM Foundry's Triton
    attention, which no framework meshplan renders can be told to run)."""
    fw = framework_card(job.framework)
    card = fw.attention
    if kernel is None and card is not None:
        engine = fw.engine_at(zero_stage) if zero_stage is not None else None
        kernel = card.kernel_for(job.framework_version, job.gpu.arch, engine=engine, mla=job.model.mla is not None) \
            if backend == "auto" else card.backends.get(backend)  # type: ignore[call-overload]
    return kernel, attention_fraction(cal, kernel, job.gpu.arch)


def _kv_width(arch: Architecture, tp: int) -> float:
    """K plus V elements per token held by one TP rank (what CP exchanges). MLA sends its up-projected per-head K
    (nope + rope) and V, not the compressed latent: Megatron-Core's MLASelfAttention hands the expanded key and value
    to TE's DotProductAttention, whose CP ring concatenates k and v into one send buffer."""
    if arch.mla is not None:
        m = arch.mla
        return arch.num_attention_heads / tp * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 2 * (-(-arch.num_kv_heads // tp)) * arch.head_dim


def _q_out_width(arch: Architecture, tp: int) -> float:
    """Query plus attention-output elements per token on one TP rank (what Ulysses re-shards besides K/V)."""
    heads = arch.num_attention_heads / tp
    if arch.mla is not None:
        m = arch.mla
        return heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 2 * heads * arch.head_dim


def ring_exposed(hop_s: float, steps: int, attention_fwd: float, attention_bwd: float,
                 overlap: float = 1.0) -> tuple[float, float]:
    """(forward, forward + backward) exposed seconds of a K/V ring of `steps` ranks: in each of the steps-1 ring steps
    the next block's transfer runs while the current block's attention computes, so each step exposes only what the
    transfer takes beyond `overlap` (cp_overlap) of that step's attention. Causal load balancing (TE's DualChunkSwap:
    each rank holds chunks i and 2c-1-i) gives every step the same attention work, 1/steps of the rank's."""
    if steps <= 1:
        return 0.0, 0.0
    fwd = (steps - 1) * max(0.0, CP_RING_TRANSFERS_FORWARD * hop_s - overlap * attention_fwd / steps)
    bwd = (steps - 1) * max(0.0, CP_RING_TRANSFERS_BACKWARD * hop_s - overlap * attention_bwd / steps)
    return fwd, fwd + bwd


def _cp_time(ctx: Ctx, attention_fwd: float, attention_fwd_bwd: float) -> tuple[float, float]:
    """(forward, forward + backward) exposed CP traffic of one layer per micro-batch, by cp_comm_type as
    Transformer Engine runs it: p2p a K/V ring overlapped step by step; a2a (Ulysses) q, k, v and the output
    re-sharded sequence <-> heads by all-to-alls, forward and (dout; dq, dk, dv) backward, not overlapped;
    allgather the K/V gathered forward and dK/dV reduce-scattered backward, not overlapped; a2a+p2p the all-to-all
    over the CP ranks inside one node and a ring of the nodes (mesh.hierarchical_cp_sizes, what the adapters
    render as hierarchical_context_parallel_sizes), each ring step then carrying the same K/V bytes against
    a2a-size times the attention."""
    plan, arch, lk = ctx.plan, ctx.arch, ctx.lk
    c = plan.cp
    if c <= 1:
        return 0.0, 0.0
    tokens = ctx.shard.tokens
    kv_bytes = tokens * _kv_width(arch, plan.tp) * BF16
    attention_bwd = attention_fwd_bwd - attention_fwd
    if plan.cp_comm_type == "allgather":
        one = ring_time(c * kv_bytes, c, plan.tp, lk)
        return one, FORWARD_AND_BACKWARD * one
    a2a_size = c if plan.cp_comm_type == "a2a" else 1
    if plan.cp_comm_type == "a2a+p2p":
        a2a_size = hierarchical_cp_sizes(c, plan.tp, lk.node)[0]
    a2a_one = alltoall_time(tokens * (_q_out_width(arch, plan.tp) + _kv_width(arch, plan.tp)) * BF16,
                            a2a_size, plan.tp, lk)
    steps = c // a2a_size
    cross = crosses_domains(steps, plan.tp * a2a_size, lk.domain)
    fwd, total = ring_exposed(p2p_time(kv_bytes, cross, lk), steps, attention_fwd, attention_bwd, ctx.cal.cp_overlap)
    return fwd + a2a_one, total + FORWARD_AND_BACKWARD * a2a_one


def unfused_attention_seconds(ctx: Ctx) -> tuple[float, float]:
    """(forward, forward + backward) of attention without flash attention, on one rank.

    Q.K^T and P.V run as batched GEMMs over the full s x s scores (the causal mask saves nothing), and
    the scores take memory-bound passes: scale-mask-softmax, and attention dropout when it is on
    (bytes per score from the card). This is Megatron-LM before FlashAttention (2021-22 papers) and
    `--attention-backend unfused`.
    """
    arch, sh, cal = ctx.arch, ctx.shard, ctx.cal
    heads = arch.num_attention_heads / sh.tp
    if arch.mla is not None:
        qk_width = arch.mla.qk_nope_head_dim + arch.mla.qk_rope_head_dim
        v_width = arch.mla.v_head_dim
    else:
        qk_width = v_width = arch.head_dim
    queries = ctx.seq / ctx.plan.cp  # per sequence on this rank; keys span the whole sequence
    batched = sh.tokens / queries * heads  # (micro-batch sequences) x (local heads) independent products
    scores = Gemm("attention_scores", queries, ctx.seq, qk_width, batched, fp8=False)
    context = Gemm("attention_context", queries, v_width, ctx.seq, batched, fp8=False)
    gemm = gemm_seconds([scores, context], cal, ctx.bf16_peak, None)
    elements = batched * queries * ctx.seq
    fwd_bytes = cal.softmax_bytes_per_score_fwd + (cal.dropout_bytes_per_score_fwd if ctx.dropout else 0.0)
    bwd_bytes = cal.softmax_bytes_per_score_bwd + (cal.dropout_bytes_per_score_bwd if ctx.dropout else 0.0)
    forward = gemm / TRAINING_PASSES_PER_FORWARD + elements * fwd_bytes / ctx.hbm
    return forward, gemm + elements * (fwd_bytes + bwd_bytes) / ctx.hbm


def layer_time(ctx: Ctx, moe: bool) -> LayerTime:
    arch, plan, cal, sh = ctx.arch, ctx.plan, ctx.cal, ctx.shard
    lt = LayerTime()
    gemms = attention_gemms(arch, sh)
    if moe:
        gemms += busiest_rank_experts(moe_gemms(arch, sh), ctx.routed_load)
    else:
        gemms += mlp_gemms(arch, sh, arch.ffn_hidden_size, "mlp")
    lt.gemm = gemm_seconds(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    gemm_fwd = lt.gemm / TRAINING_PASSES_PER_FORWARD
    if ctx.lora is not None:  # LoRA: the frozen linears skip their weight gradient, the adapters train
        lt.gemm, gemm_fwd = lora_gemm_seconds(ctx, gemms, moe)
    if ctx.flash:
        attn_fwd = attention_core_flops(arch, sh, ctx.seq) / (ctx.bf16_peak * ctx.attention_fraction)
        lt.attention = FLASH_ATTENTION_PASSES_PER_FORWARD * attn_fwd
    else:
        attn_fwd, lt.attention = unfused_attention_seconds(ctx)
    lt.attention_fwd = attn_fwd
    # Memory-bound work (norms, activation, rotary, residuals, dropout-free): passes over the layer's
    # hidden-sized tensors (sequence-sharded under SP) and its FFN activations (TP-sharded).
    t_sp = plan.tp if plan.sequence_parallel else 1
    routed_ffn = shared_ffn = dense_ffn = dispatch_bytes = router_bytes = 0.0
    if moe and arch.moe is not None:
        local = sh.tokens / t_sp
        routed_ffn = local * arch.moe.top_k * arch.moe.expert_ffn_hidden_size / plan.etp * ctx.routed_load
        shared_ffn = sh.tokens * arch.moe.shared_expert_ffn_hidden_size / plan.tp
    else:
        dense_ffn = sh.tokens * arch.ffn_hidden_size / plan.tp
    ffn_elems = routed_ffn + shared_ffn + dense_ffn
    hidden_elems = sh.tokens * arch.hidden_size / t_sp
    passes = cal.eager_elementwise_passes if ctx.eager else cal.elementwise_passes
    elem_bytes = passes * BF16 * (hidden_elems + ffn_elems)
    lt.overhead = cal.layer_overhead_s
    if moe and arch.moe is not None:
        # Token dispatch: the routed copies (tokens x top_k hidden vectors) are permuted, sorted by
        # expert, unsorted and unpermuted, forward and backward; the router's fp32 logits (scores, top-k, probs);
        # and the dispatcher's host syncs, each a stall while the host refills the GPU's queue.
        routed = sh.tokens / t_sp * arch.moe.top_k * arch.hidden_size / plan.etp * ctx.routed_load
        dispatch_bytes = cal.moe_dispatch_passes * BF16 * routed
        router_bytes = cal.moe_router_bytes_per_logit * sh.tokens / t_sp * arch.moe.num_experts
        elem_bytes += dispatch_bytes + router_bytes
        lt.overhead += ctx.moe_host_syncs * cal.moe_host_sync_s
    lt.elementwise = elem_bytes / ctx.hbm
    lt.fwd_compute = gemm_fwd + attn_fwd + lt.elementwise / TRAINING_PASSES_PER_FORWARD
    lt.module_fwd = _module_forwards(gemms, cal, ctx)
    for m, t in _module_memory_bound(ctx, hidden_elems, routed_ffn, shared_ffn, dense_ffn, dispatch_bytes,
                                     router_bytes).items():
        lt.module_fwd[m] = lt.module_fwd.get(m, 0.0) + t
    recomputed = _op_sac_recomputed(gemms, arch.gated_mlp, ctx.fp8_peak is not None)
    lt.op_sac_fwd = ((gemm_seconds(recomputed, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows) + lt.elementwise)
                     / TRAINING_PASSES_PER_FORWARD)

    # TP: per layer, forward two all-gather + reduce-scatter pairs (or two all-reduces), backward the same.
    act_bytes = sh.tokens * arch.hidden_size * BF16
    tp_ops = TP_COLLECTIVES_PER_LAYER
    if moe and arch.moe is not None and not arch.moe.shared_expert_ffn_hidden_size:
        tp_ops = TP_COLLECTIVES_ATTENTION_ONLY
    tp_comm = tp_ops * ring_time(act_bytes, plan.tp, 1, ctx.lk)
    if moe and plan.etp > 1:
        tp_comm += EXPERT_TP_COLLECTIVES_PER_LAYER * ring_time(act_bytes, plan.etp, 1, ctx.lk)
    if ctx.tp_overlap_mode == "fraction":
        lt.tp = (1.0 - cal.tp_overlap) * tp_comm
    else:  # the expert-TP gathers run in the token dispatcher, beside no GEMM
        pairs = tp_pairs(gemms, cal, ctx, moe)
        lt.tp = tp_comm - tp_hidden(ctx.tp_overlap_mode, ring_time(act_bytes, plan.tp, 1, ctx.lk), pairs, plan.tp,
                                    plan.sequence_parallel, ctx.tp_rs_splits, ctx.tp_sms)
        if ctx.tp_overlap_mode == "async_tp" and plan.tp > 1 and plan.sequence_parallel:
            lt.tp += async_tp_cost(act_bytes, plan.tp, len(pairs), ctx.hbm, ctx.lk.intra_lat,
                                   chunked_gemm_extra(gemms, cal, ctx, moe, plan.tp))
    lt.cp_fwd, lt.cp = _cp_time(ctx, attn_fwd, lt.attention)
    if moe and arch.moe is not None and plan.ep > 1:
        local = sh.tokens / t_sp
        # dispatch and combine, forward and backward; the most loaded rank receives (and sends back) routed_load
        # times the mean, and every rank waits for it
        sent = local * arch.hidden_size * BF16 * ctx.routed_load
        one = dispatch_time(sent, arch.moe.top_k, plan.ep, plan.etp, ctx.lk,
                            dedup=plan.moe_token_dispatcher == "flex", experts=arch.moe.num_experts,
                            num_groups=arch.moe.num_groups, group_topk=arch.moe.group_topk)
        lt.ep = EP_ALL_TO_ALLS_PER_LAYER * one
        if plan.moe_a2a_overlap:
            lt.ep = overlapped_a2a(one, lt.fwd_compute, lt.compute - lt.fwd_compute, ctx.a2a_steady_share)
    return lt


# The GEMMs that read a sequence-parallel all-gather's output (the input side of a TP pair) and the GEMM whose
# output is reduce-scattered (its output side): attention's, then the dense or shared-expert MLP's.
TP_PAIR_GEMMS = ((("qkv", "q_proj", "q_down", "kv_down"), ("attn_out",)),
                 (("mlp_fc1", "shared_expert_fc1"), ("mlp_fc2", "shared_expert_fc2")))


def tp_pairs(gemms: list[Gemm], cal: Calibration, ctx: Ctx, moe: bool) -> list[tuple[float, float]]:
    """(input side, output side) forward GEMM seconds of each TP pair of the layer: attention's, and the MLP's
    where it has one (a dense MLP, or an MoE layer's shared expert: routed experts only keep attention's pair,
    TP_COLLECTIVES_ATTENTION_ONLY)."""
    def fwd(names: tuple[str, ...]) -> float:
        picked = [g for g in gemms if g.name in names]
        return gemm_seconds(picked, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows) / TRAINING_PASSES_PER_FORWARD
    out = [(fwd(a), fwd(b)) for a, b in TP_PAIR_GEMMS]
    return out[:1] if moe and out[1] == (0.0, 0.0) else out


@dataclass(frozen=True)
class TpSms:
    """The GPU's SMs and those its framework's TP overlap kernels hold beside each TP pair's GEMMs (attention's,
    the MLP's): the forward reduce-scatter's and the bulk dgrad reduce-scatter's (the card's tp_overlap)."""

    sms: int
    fprop_rs: tuple[int, int] = (0, 0)
    wgrad_rs: tuple[int, int] = (0, 0)
    wgrad_margin: bool = False


def tp_sms(gpu: GpuSpec, facts: TpOverlapFacts, fp8: bool = False) -> TpSms | None:
    """The job's TpSms (`fp8`: its GEMMs run in FP8), or None where the GPU's SM count is unknown or no overlap kernel
    holds SMs."""
    fprop = facts.fp8_fprop_rs_sms if fp8 and facts.fp8_fprop_rs_sms is not None else facts.fprop_rs_sms
    if gpu.sm_count is None or not any(fprop + facts.wgrad_rs_sms):
        return None
    return TpSms(gpu.sm_count, fprop, facts.wgrad_rs_sms, facts.wgrad_rs_sm_margin)


def slowed_gemm(gemm: float, comm: float, held: int, sms: int, margin: bool) -> float:
    """Seconds a GEMM of `gemm` seconds on all `sms` SMs takes beside a communication kernel that holds `held` of them
    for `comm` seconds. With margin (Transformer Engine's set_sm_margin) it is launched on the other sms - held for its
    whole time: gemm * sms / (sms - held). Without, it shares them while the kernel runs: that overlapped portion runs
    at (sms - held) / sms of the rate, so gemm + min(comm, gemm * sms / (sms - held)) * held / sms."""
    if held <= 0:
        return gemm
    if held >= sms:
        raise ValueError(f"a communication kernel holds {held} of the GPU's {sms} SMs")
    full = gemm * sms / (sms - held)
    return full if margin else gemm + min(comm, full) * held / sms


def tp_hidden(mode: str, one: float, pairs: list[tuple[float, float]], tp: int, sp: bool = True,
              rs_splits: int = 0, sms: TpSms | None = None) -> float:
    """TP seconds hidden per layer behind the GEMMs each collective runs beside (`one`: one all-gather or
    reduce-scatter of the layer's activations). Per pair, forward: an all-gather before the input GEMM, a
    reduce-scatter after the output GEMM; backward: the output GEMM's grad all-gather before its dgrad, the input
    GEMM's dgrad reduce-scatter (cards/frameworks/*.yaml tp_overlap).
    - none: every collective waits for, or is waited on by, its GEMM.
    - wgrad (Transformer Engine without userbuffers): the dgrad reduce-scatter runs beside the input GEMM's wgrad
      GEMM, hidden up to that GEMM's time (the backward's input re-gather beside dgrad is not counted either way).
    - userbuffers (TE tp_comm_overlap): the all-gathers are ring-exchanged in tp chunks, each chunk's GEMM beside the
      next chunk's transfer, so at most (tp-1)/tp of the GEMM hides them; the forward reduce-scatter is pipelined
      over rs_splits chunks (the first chunk's GEMM and the last chunk's transfer run alone: (n-1)/n of the
      shorter); the dgrad reduce-scatter runs in bulk beside the whole wgrad GEMM.
    - async_tp (torch micro-pipelined TP): both all-gathers chunked by tp as above, both reduce-scatters pipelined
      over tp chunks, the dgrad one with the dgrad GEMM that produces it; what runs outside the pipelines is added
      by layer_time (async_tp_cost).
    Without sequence parallelism each pair is one all-reduce (two collectives' time) forward and one backward.
    With userbuffers the forward and the dgrad reduce-scatter are SM kernels (`sms`: the card's fprop_rs_sms and
    wgrad_rs_sms) and the GEMM beside each runs on the SMs left (slowed_gemm): the time hidden is counted against the
    slowed GEMM and the GEMM's lost time is taken off it, so an overlap can cost more than it hides. The all-gathers
    (ring exchange) and async TP's copies run on copy engines and hold no SMs; their share of HBM bandwidth is not
    modelled."""
    if mode == "none" or tp <= 1:
        return 0.0
    ag = (tp - 1) / tp
    hidden = 0.0
    for i, (into, out) in enumerate(pairs):
        bulk = min(one if sp else 2 * one, into)  # beside the input GEMM's wgrad GEMM (its forward's FLOPs)
        if mode == "wgrad":
            hidden += bulk
        elif mode == "userbuffers":
            n = rs_splits or tp
            rs_out, wgrad = out, into
            if sms is not None:
                rs_out = slowed_gemm(out, one, sms.fprop_rs[i], sms.sms, margin=True)
                wgrad = slowed_gemm(into, one, sms.wgrad_rs[i], sms.sms, sms.wgrad_margin)
            hidden += (min(one, ag * into) + min(one, ag * out) + (n - 1) / n * min(one, rs_out) - (rs_out - out)
                       + min(one if sp else 2 * one, wgrad) - (wgrad - into))
        elif mode == "async_tp":
            hidden += min(one, ag * into) + min(one, ag * out) + ag * min(one, out) + ag * min(one, into)
        else:
            raise ValueError(f"unknown TP overlap mode {mode!r}")
    return hidden


def chunked_gemm_extra(gemms: list[Gemm], cal: Calibration, ctx: Ctx, moe: bool, tp: int) -> float:
    """Seconds async TP's chunking adds to the TP pairs' GEMMs (tp_pairs): _fused_all_gather_matmul_impl runs the
    forward's and the gradient's matmul as tp GEMMs of m/tp rows, one per gathered shard, and
    _fused_matmul_reduce_scatter_impl (chunk_producer) one per scattered shard, each lower on the rows curve
    (gemm_efficiency); the weight-gradient GEMM is not chunked. So 2 of the 3 passes (gemm_seconds) run chunked."""
    names = {n for pair in (TP_PAIR_GEMMS[:1] if moe else TP_PAIR_GEMMS) for side in pair for n in side}
    picked = [g for g in gemms if g.name in names]
    whole = gemm_seconds(picked, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    chunked = tp * gemm_seconds([replace(g, m=g.m / tp) for g in picked], cal, ctx.bf16_peak, ctx.fp8_peak,
                                ctx.ridge_rows)
    return (chunked - whole) * 2.0 / TRAINING_PASSES_PER_FORWARD


def async_tp_cost(act_bytes: float, tp: int, pairs: int, hbm: float, barrier_s: float, chunk_extra: float) -> float:
    """Seconds per layer torch's async TP spends outside its pipelines (pytorch/pytorch
    torch/distributed/_symmetric_memory/__init__.py), forward and backward, per TP pair one all-gather + matmul
    and one matmul + reduce-scatter each way:
    - all-gather: the local shard (act_bytes / tp) is copied into its symmetric-memory buffer on the compute stream
      before the first chunk GEMM ('we are giving up the chance to overlap "mv" and "b" with the first
      shard_consumer'): read + write, 2 * act_bytes / tp over HBM;
    - reduce-scatter: the tp partial outputs pulled into stacked_partials are summed after the pipeline
      (reduce_partials / torch.sum over the rank dimension): read act_bytes, write act_bytes / tp;
    - the barriers on the compute stream (ASYNC_TP_AG_BARRIERS, ASYNC_TP_RS_BARRIERS), each one signal and wait
      among the NVLink peers: barrier_s (the links' intra-domain latency);
    - chunk_extra: the chunked GEMMs' lost efficiency (chunked_gemm_extra)."""
    if tp <= 1:
        return 0.0
    shard = act_bytes / tp
    gather = 2.0 * shard / hbm + ASYNC_TP_AG_BARRIERS * barrier_s
    scatter = (act_bytes + shard) / hbm + ASYNC_TP_RS_BARRIERS * barrier_s
    return FORWARD_AND_BACKWARD * pairs * (gather + scatter) + chunk_extra


def tp_overlap_mode(framework: str, plan: Plan) -> str:
    """Which TP collectives the plan runs beside a GEMM: its framework's switch mode when tp_comm_overlap is on,
    else the framework's base mode (the card's tp_overlap)."""
    facts = framework_card(framework).tp_overlap
    return facts.switch if plan.tp_comm_overlap and facts.switch else facts.base


def busiest_rank_experts(gemms: list[Gemm], load: float) -> list[Gemm]:
    """The routed experts' GEMMs on the most loaded EP rank: each local expert's rows times `load`
    (memory.ep_rank_load), so the grouped GEMM's FLOPs and its rows curve (gemm_efficiency) both follow the rank the
    step waits for. The model's FLOPs (MFU) keep the mean: imbalance is time lost, not work done."""
    if load == 1.0:
        return gemms
    return [replace(g, m=g.m * load) if g.name.startswith("expert_") else g for g in gemms]


def moe_host_syncs(job: Job, plan: Plan) -> float:
    """Device-to-host reads that stall the host once per MoE layer forward of dropless routing (a recompute repeats
    them), per Megatron-Core 0.19.2 megatron/core/transformer/moe/token_dispatcher.py: the alltoall dispatcher reads
    its input/output splits (EP > 1) or tokens per expert (EP = 1) at cuda_sync_point; flex on DeepEP reads
    tokens_per_expert.sum().item() to permute (_DeepepManager.get_permuted_hidden_states_by_experts); flex on
    HybridEP sizes the combine from tokens_per_expert.sum() ("CPU sync", _HybridEPManager.dispatch) unless a
    static capacity is set, which meshplan's dropless plans do not. One each, whatever the dispatcher."""
    return 1.0


def eager_blocks(job: Job, plan: Plan) -> bool:
    """Whether the blocks' memory-bound ops run as separate eager kernels: a framework whose card has a compile
    switch that compiles the blocks (torchtitan, KempnerForge) with torch_compile off. Frameworks without one run
    fused kernels either way (Megatron-Core / Transformer Engine), the count elementwise_passes is."""
    scope = framework_card(job.framework).compile
    return scope is not None and scope.blocks and not plan.torch_compile


def a2a_steady_share(m: int, pp: int, vpp: int) -> float:
    """Share of a stage's micro-batch chunks that run in the combined 1F1B steady state, where Megatron-Core's
    overlap_moe_expert_parallel_comm pairs one chunk's forward with another's backward. The warm-up forwards and the
    cool-down backwards run alone: one chunk without a pipeline (forward_backward_no_pipelining's combined 1F1B
    starts after the first forward), (pp - 1) x 2 + (vpp - 1) x pp on the first rank of the interleaved schedule
    (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, num_warmup_microbatches)."""
    chunks = m * vpp
    warmup = 1 if pp == 1 else (pp - 1) * 2 + (vpp - 1) * pp
    return max(0, chunks - warmup) / chunks


def overlapped_a2a(one: float, fwd_compute: float, bwd_compute: float, steady: float) -> float:
    """Exposed EP all-to-all of one MoE layer per micro-batch with moe_a2a_overlap: in the steady state, the
    forward's dispatch and combine run beside the other chunk's backward of the layer, and the backward's beside
    its forward (delay_wgrad_compute moves the weight gradients after the dispatch so the backward has them to
    offer), each hidden up to that compute; outside the steady state all four are exposed."""
    comm = FORWARD_AND_BACKWARD * one  # per direction: dispatch + combine
    exposed = max(0.0, comm - bwd_compute) + max(0.0, comm - fwd_compute)
    return steady * exposed + (1.0 - steady) * EP_ALL_TO_ALLS_PER_LAYER * one


def lora_gemm_seconds(ctx: Ctx, gemms: list[Gemm], moe: bool) -> tuple[float, float]:
    """(forward + backward, forward) GEMM seconds of one LoRA layer on one rank: the base linears (frozen) run their
    forward and data gradient, 2 of a trained linear's 3 passes; each adapter runs A (in -> r) and B (r -> out) in
    bf16 (Megatron-Bridge's ParallelLinearAdapter is a Megatron-Core linear, not a Transformer Engine FP8 one) with
    all 3 passes, sharded as meshplan/arithmetic/lora.py says: column-parallel bases (linear_qkv, linear_fc1) split A's
    r and B's
    out over TP, row-parallel ones (linear_proj, linear_fc2) split A's in and B's out; routed experts over etp,
    on the tokens the rank's experts see."""
    arch, sh, cal, spec = ctx.arch, ctx.shard, ctx.cal, ctx.lora
    assert spec is not None
    base = gemm_seconds(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    index = next((i for i in range(arch.num_layers) if arch.is_moe_layer(i) == moe), 0)  # a layer of this kind
    adapters = ctx.lora_engine.adapters if ctx.lora_engine else "fused"
    r, extra = spec.rank, []
    for a in layer_adapters(arch, index, spec, adapters):
        t, rows, count = sh.tp, sh.tokens, 1.0
        if a.expert:
            assert arch.moe is not None
            t, count = sh.etp, arch.moe.num_experts / sh.ep
            local = sh.tokens / sh.tp if sh.sp or sh.tp == 1 else sh.tokens
            rows = sh.ep * sh.etp * local * arch.moe.top_k / arch.moe.num_experts * ctx.routed_load
        column = a.target in ("linear_qkv", "linear_fc1")
        extra += [Gemm(f"lora_a_{a.target}", rows, r / t if column else r, a.inputs if column else a.inputs / t,
                       count * a.a_copies, fp8=False),
                  Gemm(f"lora_b_{a.target}", rows, a.outputs / t, r, count, fp8=False)]
    adapter = gemm_seconds(extra, cal, ctx.bf16_peak, None)
    frozen = base * FROZEN_PASSES_PER_FORWARD / TRAINING_PASSES_PER_FORWARD
    return frozen + adapter, (base + adapter) / TRAINING_PASSES_PER_FORWARD


# Megatron's recompute_modules -> the GEMMs (flops.py names) each one's recompute runs again; the memory-bound
# passes each repeats are counted in _module_memory_bound.
MODULE_GEMMS = {"mlp": ("mlp_",), "moe": ("router", "expert_", "shared_expert_"), "shared_experts": ("shared_expert_",),
                "mla_up_proj": ("q_up", "kv_up")}
# A norm's forward reads its input and writes its output: 2 bf16 passes over the hidden activations. Megatron's
# `layernorm` module recomputes two per layer, input_layernorm and pre_mlp_layernorm (knobs_peers_data.md 2.1).
NORM_PASSES = 2.0
NORMS_PER_LAYER = 2.0
# The FFN activation's forward: a gated one (SwiGLU) reads gate and up and writes one product, 3 passes over the
# FFN width; a plain one reads and writes it, 2.
GATED_ACT_PASSES = 3.0
PLAIN_ACT_PASSES = 2.0


def _module_forwards(gemms: list[Gemm], cal: Calibration, ctx: Ctx) -> dict[str, float]:
    """Forward seconds of the GEMMs each Megatron recompute module repeats."""
    return {m: gemm_seconds([g for g in gemms if g.name.startswith(prefixes)], cal, ctx.bf16_peak, ctx.fp8_peak,
                            ctx.ridge_rows)
            / TRAINING_PASSES_PER_FORWARD for m, prefixes in MODULE_GEMMS.items()}


def _module_memory_bound(ctx: Ctx, hidden_elems: float, routed_ffn: float, shared_ffn: float, dense_ffn: float,
                         dispatch_bytes: float, router_bytes: float) -> dict[str, float]:
    """Forward seconds of the memory-bound passes each Megatron recompute module repeats, at the HBM bandwidth
    elementwise work gets (hardware x calibration hbm_efficiency): `layernorm` its two norms, `moe_act` the routed
    experts' activation, `mlp` / `shared_experts` their activation, `moe` its activations plus the forward half of
    the dispatcher's permutes and the router's fp32 passes (`dispatch_bytes` / `router_bytes` are forward +
    backward; the card counts the backward as much again). mla_up_proj's RoPE and core_attn are not counted here."""
    act = GATED_ACT_PASSES if ctx.arch.gated_mlp else PLAIN_ACT_PASSES
    seconds = {"layernorm": NORMS_PER_LAYER * NORM_PASSES * BF16 * hidden_elems,
               "moe_act": act * BF16 * routed_ffn,
               "shared_experts": act * BF16 * shared_ffn,
               "mlp": act * BF16 * dense_ffn,
               "moe": act * BF16 * (routed_ffn + shared_ffn) + (dispatch_bytes + router_bytes) / FORWARD_AND_BACKWARD}
    return {m: b / ctx.hbm for m, b in seconds.items()}


def _op_sac_recomputed(gemms: list[Gemm], gated: bool, fp8: bool) -> list[Gemm]:
    """The GEMMs torchtitan's op-level SAC runs again (activations.py _op_sac keeps the others' outputs): the
    router gate and the routed experts (_grouped_mm, in no save list) always; of the other mm/linear calls,
    counted per block in call order with a gated fc1 as its w1 and w3, every second one; fp8 (_scaled_mm) none."""
    out: list[Gemm] = []
    count = 0
    for g in gemms:
        if g.name == "router" or g.name.startswith("expert_"):
            out.append(g)
            continue
        for part in ([replace(g, n=g.n / 2)] * 2 if gated and g.name.endswith("_fc1") else [g]):
            count += 1
            if count % 2 == 0 and not (fp8 and part.fp8):
                out.append(part)
    return out


def _recompute_time(lt: LayerTime, recompute: str, cal: Calibration, selective: str = "core_attention",
                    modules: tuple[str, ...] = ("core_attn",)) -> float:
    """Full recompute runs each layer's forward again: its forward compute, the forward share of its fixed
    overhead (card) and the forward part of its TP, CP and EP traffic (counted constants above)."""
    if recompute == "full":
        return (lt.fwd_compute + lt.overhead * cal.forward_share_of_layer_overhead + lt.tp / FORWARD_AND_BACKWARD
                + lt.cp_fwd + lt.ep / FORWARD_AND_BACKWARD)
    if recompute == "selective" and selective == "op_sac":
        # the unkept GEMMs, every pointwise and norm op and the TP all-gathers (reduce-scatters are kept)
        return lt.op_sac_fwd + lt.tp / FORWARD_AND_BACKWARD / 2
    if recompute == "selective":
        # each recompute module's forward again: core attention (Korthikanti et al. 2022), the GEMMs of the others,
        # and a recomputed MoE layer's dispatch and combine
        return sum(lt.attention_fwd if m == "core_attn" else lt.module_fwd.get(m, 0.0)
                   + (lt.ep / FORWARD_AND_BACKWARD if m == "moe" else 0.0) for m in modules)
    return 0.0


# --------------------------------------------------------------------------- data-parallel sharding

# What a stage's time per micro-batch is made of on the GPU (the host floor is compared with their sum).
STAGE_GPU_PARTS = ("compute", "tp", "cp", "ep", "recompute", "pp", "fsdp")


class ShardUnit(NamedTuple):
    """A run of `count` identical FSDP units in forward order (a decoder layer each, the embedding, the output
    head): FSDP2, Megatron-FSDP and ZeRO-3 gather and reduce one unit at a time, hidden behind its neighbours."""

    count: int
    gather: float  # all-gather of one unit's parameters
    reduce: float  # reduce-scatter of one unit's gradients
    fwd: float  # one unit's forward, the window that hides the next unit's all-gather
    bwd: float  # one unit's backward (with its recompute), the window that hides its neighbours' traffic
    resharded: bool = True  # freed after its forward, so gathered again for its backward


def exposed_sharding(units: Sequence[ShardUnit], gather_fwd: bool, gather_bwd: bool, reduce: bool) -> float:
    """Seconds of sharding traffic one pass over `units` (forward, then backward) leaves exposed.

    Forward: each unit's all-gather is prefetched behind the previous unit's forward, so it costs
    max(0, gather - that forward); the first unit's all-gather has nothing before it and waits whole.
    Backward (reverse order): a unit's backward hides the all-gather of the unit after it in backward order
    (`gather_bwd`, if that unit was resharded) and the reduce-scatter of the unit before it (`reduce`), both on
    the same links; the first backward unit's all-gather and the last one's reduce-scatter have nothing to hide
    behind. Exact for the stated model: runs of identical units are summed in closed form.
    """
    exposed = 0.0
    if gather_fwd and units:
        prev_fwd = None
        for u in units:
            exposed += u.gather if prev_fwd is None else max(0.0, u.gather - prev_fwd)
            exposed += (u.count - 1) * max(0.0, u.gather - u.fwd)
            prev_fwd = u.fwd
    if not (gather_bwd or reduce) or not units:
        return exposed
    back = units[::-1]

    def g(u: ShardUnit | None) -> float:
        return u.gather if (u is not None and gather_bwd and u.resharded) else 0.0

    def r(u: ShardUnit | None) -> float:
        return u.reduce if (u is not None and reduce) else 0.0

    exposed += g(back[0]) + r(back[-1])
    for i, u in enumerate(back):
        before = back[i - 1] if i else None  # the unit whose backward ran just before (its reduce-scatter)
        after = back[i + 1] if i + 1 < len(back) else None  # the unit whose backward comes next (its gather)
        if u.count == 1:
            exposed += max(0.0, g(after) + r(before) - u.bwd)
            continue
        exposed += max(0.0, g(u) + r(before) - u.bwd)  # first of the run
        exposed += (u.count - 2) * max(0.0, g(u) + r(u) - u.bwd)
        exposed += max(0.0, g(after) + r(u) - u.bwd)  # last of the run
    return exposed


def _shard_units(layers: list[int], kinds: list[bool], windows: dict[bool, tuple[float, float]],
                 params: tuple[list[float], list[float]], plan: Plan, arch: Architecture, first_stage: bool,
                 head_stage: bool, head: float, embed_params: float, traffic, grad_bytes: float) -> list[ShardUnit]:
    """A stage's FSDP units in forward order: the embedding on the first stage (no compute to hide the next
    gather behind), one unit per decoder layer (runs of one kind summed), the output head on the last stage
    (kept gathered into its backward: torchtitan does not reshard norm + output, Megatron-FSDP's root keeps
    the output layer). Tied embeddings without PP are one unit (torchtitan groups them, not resharded)."""
    units: list[ShardUnit] = []
    tied_one_unit = arch.tie_word_embeddings and plan.pp == 1
    if first_stage:
        units.append(ShardUnit(1, traffic(embed_params, 0.0, BF16), traffic(embed_params, 0.0, grad_bytes),
                               0.0, 0.0, resharded=not tied_one_unit))
    index = list(layers) + [arch.num_layers - 1] * (len(kinds) - len(layers))  # MTP blocks cost like the last layer
    start = 0
    while start < len(kinds):
        end = start
        while end < len(kinds) and kinds[end] == kinds[start]:
            end += 1
        i = index[start]
        dense, expert = params[0][i] / plan.tp, params[1][i] / (plan.ep * plan.etp)
        fwd, bwd = windows[kinds[start]]
        units.append(ShardUnit(end - start, traffic(dense, expert, BF16), traffic(dense, expert, grad_bytes),
                               fwd, bwd))
        start = end
    if head_stage:
        head_params = 0.0 if tied_one_unit else embed_params
        units.append(ShardUnit(1, traffic(head_params, 0.0, BF16), traffic(head_params, 0.0, grad_bytes),
                               head / TRAINING_PASSES_PER_FORWARD, head * (1 - 1 / TRAINING_PASSES_PER_FORWARD),
                               resharded=False))
    return units


@dataclass(frozen=True)
class ShardingSchedule:
    """When a plan's data-parallel sharding moves bytes: per micro-batch or once per step (framework facts in
    cards/calibration.yaml, fsdp_*)."""

    params_sharded: bool  # ZeRO-3 / FSDP: parameters gathered before use
    grads_sharded: bool  # ZeRO-2/3 / FSDP: gradients reduce-scattered into shards
    gather_each_microbatch: bool  # freed after forward, gathered forward and backward in every micro-batch
    reduce_each_microbatch: bool  # every backward reduce-scatters (else only the last micro-batch's)

    @property
    def per_step(self) -> bool:
        return self.params_sharded or self.grads_sharded


def sharding_schedule(job: Job, plan: Plan, cal: Calibration) -> ShardingSchedule:
    """FSDP2 (torchtitan, KempnerForge), Megatron-FSDP and DeepSpeed ZeRO-3 shard parameters; ZeRO-2 gradients
    too; ZeRO-1 only the optimizer (its traffic stays once per step, in the step's DP term)."""
    fsdp = uses_fsdp(job.framework, plan.zero_stage)
    params = fsdp and plan.zero_stage != 0  # FSDP2 at zero_stage 0 is dp_replicate
    grads = params or plan.zero_stage >= 2
    pp = plan.pp > 1
    keep = params and pp and cal.fsdp_keep_params_under_pp >= 0.5
    defer = (cal.fsdp_defer_grad_sync_under_pp if pp else cal.fsdp_defer_grad_sync) >= 0.5
    return ShardingSchedule(params, grads, params and not keep, grads and not defer)


# --------------------------------------------------------------------------- the step


def _peaks(job: Job, cal: Calibration) -> tuple[float, float | None, float]:
    gpu = job.gpu
    fp8 = gpu.fp8_flops * cal.fp8_gemm_relative_efficiency if job.precision == "fp8" and gpu.fp8_flops else None
    mfu_peak = gpu.fp8_flops if job.precision == "fp8" and gpu.fp8_flops else gpu.bf16_flops
    return gpu.bf16_flops, fp8, mfu_peak


def estimate_throughput(
    job: Job, plan: Plan, calibration_override: Calibration | None = None, *,
    attention_kernel: str | None = None,
) -> ThroughputReport:
    """Predicted step time, tokens/s per GPU and MFU of `plan` for `job`, with the time broken down.

    The plan's attention_backend and dropout as memory.attention_switches reads them (unfused: the scores'
    softmax and dropout passes, perf.unfused_attention_seconds). `attention_kernel` (bench only) overrides the flash
    kernel for a published run of a trainer meshplan does not support (attention_efficiency).
    Raises EstimateBlocked (a MeshplanError naming the rule) when the plan breaks a rule of the framework
    that no estimate can proceed past (`blocks_estimate` in cards/rules.yaml).
    """
    require_estimable(job, plan)
    warnings = _batch_warnings(job, plan)
    arch = job.model
    cal = calibration_override or calibration(job.framework)
    bf16_peak, fp8_peak, mfu_peak = _peaks(job, cal)
    lk = links(job.gpu, job.gpus_per_node, cal)
    tokens = plan.micro_batch_size * job.seq_length / plan.cp
    shard = Shard(tokens=tokens, tp=plan.tp, ep=plan.ep, etp=plan.etp, sp=plan.sequence_parallel)
    hbm = job.gpu.hbm_bandwidth * cal.hbm_efficiency
    _, conv, _ = convention(job.framework, plan.zero_stage)
    flash, dropout = attention_switches(conv, plan)
    m = max(1, job.global_batch_size // (plan.micro_batch_size * plan.dp))
    kernel, fraction = attention_efficiency(job, cal, attention_kernel, plan.attention_backend, plan.zero_stage)
    ctx = Ctx(arch, plan, job.seq_length, cal, lk, shard, bf16_peak, fp8_peak, hbm, flash, dropout, job.lora,
              lora_engine(job.framework, plan.zero_stage) if job.lora else None,
              a2a_steady_share(m, plan.pp, plan.vpp) if plan.moe_a2a_overlap else 0.0,
              moe_host_syncs(job, plan), eager_blocks(job, plan), attention_fraction=fraction,
              attention_kernel=kernel, routed_load=ep_rank_load(job, plan),
              tp_overlap_mode=tp_overlap_mode(job.framework, plan),
              tp_rs_splits=framework_card(job.framework).tp_overlap.rs_splits,
              tp_sms=tp_sms(job.gpu, framework_card(job.framework).tp_overlap, fp8_peak is not None))
    dense_lt = layer_time(ctx, moe=False) if arch.moe is None or len(arch.moe.moe_layers) < arch.num_layers else None
    moe_lt = layer_time(ctx, moe=True) if arch.moe is not None and arch.moe.moe_layers else None
    moe_set = set(arch.moe.moe_layers) if arch.moe else set()
    pipeline = stage_layers(job, plan)
    stages = [pipeline.layers(rank) for rank in range(plan.pp)]
    head_stage = pipeline.head_rank
    params = _layer_param_split(arch)
    selective = framework_card(job.framework).recompute.selective  # what this framework's "selective" repeats
    every_nth = every_nth_blocks(plan)
    modules = tuple(plan.recompute_modules or ("core_attn",))
    t_sp = plan.tp if plan.sequence_parallel else 1

    # Logits and cross-entropy on the last stage; MTP blocks (if the model has them) there too.
    head = gemm_seconds([logits_gemm(arch, shard)], cal, bf16_peak, None)
    if job.lora is not None:  # a frozen output layer: forward and data gradient only
        head *= FROZEN_PASSES_PER_FORWARD / TRAINING_PASSES_PER_FORWARD
    head += cal.cross_entropy_bytes_per_logit * tokens * arch.vocab_size / plan.tp / ctx.hbm
    mtp_layers = arch.num_mtp_layers
    pp_cross = crosses_domains(plan.pp, plan.tp * plan.cp * plan.dp, lk.domain)
    pp_bytes = tokens * arch.hidden_size * BF16 / t_sp
    pp_hop = p2p_time(pp_bytes, pp_cross, lk, cal.pp_latency_inter_s) if plan.pp > 1 else 0.0
    pp_comm = (1.0 - cal.pp_overlap) * FORWARD_AND_BACKWARD * plan.vpp * pp_hop
    pp_cross_layer = cal.pp_cross_sync_per_layer_s * plan.tp if plan.pp > 1 and pp_cross else 0.0
    # Blocking p2p (metadata received and read on the host before each activation/gradient) stops
    # the host running ahead of the GPU: per micro-batch, pp_host_sync of the shorter of host issue
    # time and GPU time is serialised behind the longer one instead of hidden under it.
    host_sync = cal.pp_host_sync if plan.pp > 1 else 0.0

    fsdp = uses_fsdp(job.framework, plan.zero_stage)
    sched = sharding_schedule(job, plan, cal)
    dense_group = plan.dp * plan.cp  # dense weights are replicated over DP x CP
    expert_group = int(mesh.expert_dp(job.num_gpus, plan)) if arch.moe else 1

    traffic_seen: dict[tuple[float, float, float], float] = {}  # stages repeat the same layers

    def dp_traffic(dense: float, expert: float, nbytes: float) -> float:
        """One ring collective (all-gather or reduce-scatter) over the dense and the expert DP groups."""
        key = (dense, expert, nbytes)
        if key not in traffic_seen:
            traffic_seen[key] = (ring_time(dense * nbytes, dense_group, plan.tp, lk)
                                 + ring_time(expert * nbytes, expert_group, plan.ep * plan.etp, lk))
        return traffic_seen[key]

    embed_p = arch.vocab_size * arch.hidden_size / plan.tp
    # Muon (Megatron-Core's emerging optimizer; the framework card's muon section says how it runs): None = Adam
    muon_facts = framework_card(job.framework).muon if plan.optimizer == "muon" and job.lora is None else None
    sharding_seen: dict[tuple[ShardUnit, ...], tuple[float, float, float]] = {}
    stage_rows = []
    for s, layers in enumerate(stages):
        parts = {"compute": 0.0, "tp": 0.0, "cp": 0.0, "ep": 0.0, "recompute": 0.0, "fwd": 0.0}
        n_recompute = len(layers) if plan.recompute_layers is None or plan.recompute_method == "uniform" \
            else min(len(layers), plan.recompute_layers)  # uniform recomputes every layer, in chunks
        kinds = [(i in moe_set) for i in layers] if moe_set else [False] * len(layers)
        if s == pipeline.mtp_at and mtp_layers and pipeline.mtp_trained:
            kinds += [arch.is_moe_layer(arch.num_layers - 1)] * mtp_layers
        # Every layer of a kind costs the same, so a stage is (count x layer) per kind; the first
        # n_recompute layers of the stage are the recomputed ones.
        n_moe = sum(kinds)
        n_moe_recompute = sum(kinds[:n_recompute])
        mode = plan.recompute
        if every_nth:  # torchtitan 0.2.x: every N-th block built on the rank is fully checkpointed, the rest not
            picked = [kind for k, kind in enumerate(kinds, 1) if k % every_nth == 0]
            mode, n_recompute, n_moe_recompute = "full", len(picked), sum(picked)
        windows: dict[bool, tuple[float, float]] = {}  # per kind (MoE?): one layer's forward and backward
        for is_moe, lt, count, recomputed in ((False, dense_lt, len(kinds) - n_moe, n_recompute - n_moe_recompute),
                                              (True, moe_lt, n_moe, n_moe_recompute)):
            if not count:
                continue
            assert lt is not None
            parts["compute"] += count * lt.compute
            parts["fwd"] += count * lt.fwd_compute
            parts["tp"] += count * lt.tp
            parts["cp"] += count * lt.cp
            parts["ep"] += count * lt.ep
            rec = recomputed * _recompute_time(lt, mode, cal, selective, modules) if recomputed else 0.0
            parts["recompute"] += rec
            windows[is_moe] = (lt.fwd_compute, lt.compute - lt.fwd_compute + rec / count)
        dense_p = sum(map(params[0].__getitem__, layers)) / plan.tp
        expert_p = sum(map(params[1].__getitem__, layers)) / (plan.ep * plan.etp)
        if s == 0:
            dense_p += arch.vocab_size * arch.hidden_size / plan.tp
        if s == head_stage:
            parts["compute"] += head
            parts["fwd"] += head / TRAINING_PASSES_PER_FORWARD
            if not arch.tie_word_embeddings or plan.pp > 1:
                dense_p += arch.vocab_size * arch.hidden_size / plan.tp
        if job.lora is not None:  # LoRA: only the adapters have gradients to reduce and states to step
            dense_p, expert_p = adapter_params(arch, layers, job.lora, ctx.lora_engine, tp=plan.tp, ep=plan.ep,
                                               etp=plan.etp)
        # Cross-node pipeline stages with host-synchronous p2p (nanotron) lose time on every layer
        # of every micro-batch, growing with the TP ranks that must meet in each collective.
        parts["pp"] = pp_comm + pp_cross_layer * len(kinds)
        # The host issues every kernel and collective of the micro-batch; when the GPU work is
        # shorter than that, the stage is launch-bound and waits for the CPU.
        parts["host"] = cal.host_time_per_layer_s * len(kinds)
        parts["dense_params"] = dense_p
        parts["expert_params"] = expert_p
        # Muon: the matrices this rank updates in place of Adam, and its share of their Newton-Schulz iterations
        parts["muon_s"] = parts["muon_dense"] = parts["muon_expert"] = 0.0
        if muon_facts is not None:
            parts["muon_dense"], parts["muon_expert"] = matrix_params(arch, shard, kinds, muon_facts)
            parts["muon_s"] = newton_schulz_seconds(arch, shard, kinds, muon_facts, cal, bf16_peak,
                                                    1 if plan.zero_stage == 0 else dense_group, expert_group)
        # ZeRO-2/3 / FSDP: unit-by-unit gathers and reduce-scatters, each hidden behind its neighbours' compute;
        # per micro-batch in "fsdp" (inside the pipeline), once per step in the step's DP term.
        parts["fsdp"] = parts["step_gather"] = parts["step_reduce"] = 0.0
        if sched.per_step:
            units = tuple(_shard_units(layers, kinds, windows, params, plan, arch, s == 0, s == head_stage, head,
                                       embed_p, dp_traffic, cal.grad_reduce_bytes))
            if units not in sharding_seen:  # pipeline stages often hold the same layers
                sharding_seen[units] = (
                    exposed_sharding(units, sched.gather_each_microbatch, sched.gather_each_microbatch,
                                     sched.reduce_each_microbatch),
                    exposed_sharding(units, sched.params_sharded and not sched.gather_each_microbatch, False, False),
                    exposed_sharding(units, False, False, sched.grads_sharded and not sched.reduce_each_microbatch))
            parts["fsdp"], parts["step_gather"], parts["step_reduce"] = sharding_seen[units]
        stage_rows.append(parts)

    for row in stage_rows:
        gpu = sum(row[k] for k in STAGE_GPU_PARTS)
        row["launch_bound"] = max(0.0, row["host"] - gpu) + host_sync * min(row["host"], gpu)
        row["total"] = gpu + row["launch_bound"]

    totals = [r["total"] for r in stage_rows]
    worst = max(range(len(totals)), key=totals.__getitem__)
    t_max = totals[worst]
    pipeline = m * t_max + (sum(totals) - t_max) / plan.vpp
    bubble = pipeline - m * t_max

    # Once per step: gradient reduction (overlapped with the last backward; later stages finish their
    # backward earlier, which gives them slack), the ZeRO parameter all-gather, the optimizer.
    dp_exposed = 0.0
    optimizer = 0.0
    for s, row in enumerate(stage_rows):
        grad_bytes = cal.grad_reduce_bytes
        # ZeRO-1/2 (not FSDP) may still all-reduce the whole gradient (nanotron without DDP) and may
        # run it after the backward instead of bucket by bucket inside it (zero_grad_* in the card).
        sharded_opt = plan.zero_stage > 0 and not fsdp
        bwd = row["compute"] - row["fwd"] + row["recompute"]
        # later stages finish their last backward (and start their first forward) earlier: slack
        slack = s * bwd / max(1, plan.vpp)
        if sched.per_step:  # ZeRO-2/3, FSDP: the once-per-step gathers / reduce-scatters, unit by unit
            exposed = max(0.0, row["step_gather"] - s * row["fwd"] / max(1, plan.vpp))
            exposed += max(0.0, row["step_reduce"] - slack)
        elif plan.zero_stage == 0 or cal.zero_grad_allreduce >= 0.5:
            sync = (allreduce_time(row["dense_params"] * grad_bytes, dense_group, plan.tp, lk)
                    + allreduce_time(row["expert_params"] * grad_bytes, expert_group, plan.ep * plan.etp, lk))
            exposed = max(0.0, sync - (cal.zero_grad_overlap if sharded_opt else cal.dp_overlap) * bwd - slack)
        else:
            sync = dp_traffic(row["dense_params"], row["expert_params"], grad_bytes)
            exposed = max(0.0, sync - cal.zero_grad_overlap * bwd - slack)
        if sharded_opt:  # ZeRO-1/2: the updated bf16 parameters are all-gathered once per step
            gather = dp_traffic(row["dense_params"], row["expert_params"], BF16)
            exposed += max(0.0, gather - cal.param_gather_overlap * row["fwd"])
        dp_exposed = max(dp_exposed, exposed)
        shard_group = 1 if plan.zero_stage == 0 else None
        dense_local = row["dense_params"] / (shard_group or dense_group)
        expert_local = row["expert_params"] / (shard_group or expert_group)
        muon_local = (row["muon_dense"] / (shard_group or dense_group)
                      + row["muon_expert"] / (shard_group or expert_group))
        opt = ((dense_local + expert_local - muon_local) * cal.optimizer_bytes_per_param
               + muon_local * cal.muon_bytes_per_param) / ctx.hbm + row["muon_s"]
        opt += m * (row["dense_params"] + row["expert_params"]) * cal.grad_accum_bytes_per_param / ctx.hbm
        optimizer = max(optimizer, opt)

    row = stage_rows[worst]
    # CPU offload: the CPU Adam step of the offloaded share and the host transfers the compute cannot cover
    offload_s, offload_how = step_offload_time(job, plan, compute_s=m * row["compute"])
    step = pipeline + dp_exposed + optimizer + offload_s
    per_token = (lora_flops_per_token(arch, job.seq_length, job.lora, ctx.lora_engine) if job.lora is not None
                 else model_flops_per_token(arch, job.seq_length))
    flops_step = per_token * job.seq_length * job.global_batch_size
    breakdown = ThroughputBreakdown(
        compute_s=m * row["compute"],
        tp_comm_s=m * row["tp"],
        cp_comm_s=m * row["cp"],
        ep_comm_s=m * row["ep"],
        dp_comm_s=m * row["fsdp"] + dp_exposed,
        pp_comm_s=m * row["pp"],
        bubble_s=bubble,
        recompute_s=m * row["recompute"],
        other_s=optimizer + m * row["launch_bound"],
        offload_s=offload_s,
    )
    tokens_step = job.seq_length * job.global_batch_size
    warnings += _warnings(job, plan, lk, m)
    return ThroughputReport(
        model=arch.name,
        framework=job.framework,
        plan=plan,
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_step / step / job.num_gpus,
        tokens_per_s=tokens_step / step,
        mfu=flops_step / (step * job.num_gpus * mfu_peak),
        model_flops_per_step=flops_step,
        breakdown=breakdown,
        assumptions=_assumptions(job, plan, m, worst, cal, ctx)
        + ([f"Offload: {offload_how} (meshplan/arithmetic/offload.py, cards/offload.yaml)."] if offload_how else []),
        warnings=warnings,
    )


def _warnings(job: Job, plan: Plan, lk: Links, m: int) -> list[str]:
    out = []
    if crosses_domains(plan.tp, 1, lk.domain):
        out.append(f"TP {plan.tp} spans more than one {lk.domain}-GPU NVLink domain: every layer's TP traffic "
                   "crosses the network.")
    if plan.cp > 1 and crosses_domains(plan.cp, plan.tp, lk.domain):
        out.append(f"CP {plan.cp} x TP {plan.tp} spans more than one NVLink domain: the K/V ring uses the network.")
    if plan.ep > 1 and crosses_domains(plan.ep, plan.etp, lk.domain):
        out.append(f"EP {plan.ep} spans more than one NVLink domain: token all-to-alls cross the network.")
    if plan.pp > 1 and m < plan.pp:
        out.append(f"Only {m} micro-batches for {plan.pp} pipeline stages: most of the step is pipeline bubble.")
    if job.model.sliding_window:
        out.append("Sliding-window layers are timed as full causal attention (upper bound; Megatron's MFU "
                   "formula counts them the same way).")
    return out


def _dp_assumption(job: Job, plan: Plan, cal: Calibration) -> str:
    """How the data-parallel traffic was timed, in the words of the schedule the plan runs."""
    sched = sharding_schedule(job, plan, cal)
    if not sched.per_step:
        return (f"DP: gradients reduced in {cal.grad_reduce_bytes:.0f}-byte elements over dp x cp once per step, "
                + (f"overlapped with {cal.dp_overlap:.0%} of the last backward." if plan.zero_stage == 0
                   else ("all-reduced" if cal.zero_grad_allreduce >= 0.5 else "reduce-scattered")
                   + f" with {cal.zero_grad_overlap:.0%} of the last backward hiding it; then the bf16 parameters "
                   "are all-gathered."))
    params = ("bf16 parameters all-gathered layer by layer, forward and again backward, every micro-batch"
              if sched.gather_each_microbatch else
              "bf16 parameters all-gathered layer by layer once per step (kept gathered across micro-batches)"
              if sched.params_sharded else "bf16 parameters all-gathered once per step after the optimizer")
    grads = "every micro-batch" if sched.reduce_each_microbatch else "in the last micro-batch only"
    return (f"DP (ZeRO-{plan.zero_stage} / FSDP schedule of {job.framework}): {params}; gradients reduce-scattered "
            f"layer by layer in {cal.grad_reduce_bytes:.0f}-byte elements over dp x cp {grads}. Each transfer hides "
            "behind the neighbouring layer's compute (exposed: what exceeds it, plus the first layer's all-gather "
            "and the last one's reduce-scatter).")


def _assumptions(job: Job, plan: Plan, m: int, worst: int, cal: Calibration, ctx: Ctx) -> list[str]:
    flash = ctx.flash
    peak = "FP8" if job.precision == "fp8" else "BF16"
    out = [
        "Model FLOPs: Megatron-LM num_floating_point_operations (causal attention halved, GQA, SwiGLU, top-k "
        "routed + shared experts, MLA, MTP, logits); MFU = model FLOPs / (step x GPUs x dense "
        f"{peak} peak), recompute not counted.",
        f"Pipeline: {m} micro-batches; step = m x slowest stage (stage {worst}) + fill/drain of the others / vpp "
        f"{plan.vpp}, i.e. the (p-1)/(m*v) bubble for balanced stages"
        + ("; layers split nanotron's way (cost-balanced, LM head counted as vocab x hidden)."
           if convention(job.framework, plan.zero_stage)[1].pipeline_partition == "compute_balanced"
           and plan.pp > 1 else "."),
        f"GEMM time = {TRAINING_PASSES_PER_FORWARD:g} x forward FLOPs / (peak x {cal.gemm_peak_fraction:.2f} x prod "
        f"d/(d+{cal.gemm_half_dim:.0f}) "
        "over its three dimensions); "
        + (f"flash attention ({ctx.attention_kernel or 'fused'}) at {ctx.attention_fraction:.2f} of "
           f"peak with a "
           f"{FLASH_ATTENTION_PASSES_PER_FORWARD - 1:g}x backward." if flash else
           "unfused attention: Q.K^T and P.V as batched GEMMs over the full s x s scores, plus "
           "memory-bound softmax" + (" and dropout" if ctx.dropout else "") + " passes over the scores."),
        f"TP: {TP_COLLECTIVES_PER_LAYER / FORWARD_AND_BACKWARD:g} all-gather/reduce-scatter (or 2 all-reduce) per "
        "layer forward and as many backward; "
        + TP_OVERLAP_TEXT[ctx.tp_overlap_mode].format(share=cal.tp_overlap),
        f"Host floor: a stage needs at least {cal.host_time_per_layer_s * 1e3:.2f} ms per layer per micro-batch "
        "to issue its kernels; GPU work shorter than that is launch-bound (counted in other_s with the optimizer).",
        _dp_assumption(job, plan, cal),
        "Links: NVLink inside the domain, the GPU's NIC across domains (rings use every NIC of the domain); "
        f"{cal.nvlink_efficiency:.0%} / {cal.network_efficiency:.0%} of datasheet bandwidth.",
        f"Constants: cards/calibration.yaml ({calibration_summary(job.framework)}; errors in bench/README.md).",
    ]
    if job.model.moe is not None:
        out.append(f"MoE layers: the token dispatcher moves the routed copies (tokens x top_k x hidden) in "
                   f"{cal.moe_dispatch_passes:.0f} bf16 passes forward + backward, the router "
                   f"{cal.moe_router_bytes_per_logit:.0f} bytes per fp32 logit, each expert GEMM slowed by its rows "
                   f"(tokens per local expert / (that + {cal.moe_gemm_half_ridges:g} x the GPU's ridge rows)), "
                   "and each MoE layer forward "
                   f"{moe_host_syncs(job, plan):.0f} host sync of {cal.moe_host_sync_s * 1e3:.2f} ms (the "
                   "last two fitted on published MoE runs, bench/moe_fit.py); "
                   + ("flex dispatcher: a token crosses the network once per destination NVLink domain holding "
                      "one of its experts (DeepEP/HybridEP), then fans out over NVLink"
                      + (f", its experts in at most topk_group = {job.model.moe.group_topk} of n_group = "
                         f"{job.model.moe.num_groups} expert groups (group-limited routing); "
                         if job.model.moe.num_groups > 1 else "; ")
                      if plan.moe_token_dispatcher == "flex" else
                      "all-to-all dispatcher: every routed copy travels to its expert's rank; ")
                   + ("expert all-to-all hidden behind the other micro-batch's compute of the layer in the 1F1B "
                      "steady state (moe_a2a_overlap), exposed in warm-up and cool-down."
                      if plan.moe_a2a_overlap else "expert all-to-all exposed (moe_a2a_overlap off)."))
        out.append(routing_assumption(job, plan))
    if job.precision == "fp8":
        out.append(f"FP8: transformer linears at FP8 peak x {cal.fp8_gemm_relative_efficiency:.2f}; attention, "
                   "router and logits stay BF16.")
    if plan.recompute != "none":
        out.append(f"Recompute {plan.recompute}: "
                   + ("one more forward of each recomputed layer (with its TP traffic)." if plan.recompute == "full"
                      else "the forward of the ops op-level SAC does not keep (every second linear, the router "
                      "and routed experts, pointwise and norms, TP all-gathers)."
                      if framework_card(job.framework).recompute.selective == "op_sac"
                      else "core attention forward again."))
    if plan.optimizer == "muon":
        muon = framework_card(job.framework).muon
        out.append(
            f"Muon: each weight matrix's momentum orthogonalized by {muon.ns_steps} Newton-Schulz iterations, three "
            "BF16 GEMMs each on the matrix's smaller side (4 m^2 n + 2 m^3 FLOPs), at the model GEMMs' efficiency; "
            f"tensor-parallel matrices {muon.tp_mode}"
            + (", QKV as Q, K and V blocks per query group" if muon.split_qkv else "")
            + "; whole matrices shared out over the data-parallel ranks (experts over expert-data-parallel), at "
            f"least the costliest one per rank; {cal.muon_bytes_per_param:g} B per matrix parameter of state "
            f"traffic, Adam's {cal.optimizer_bytes_per_param:g} on the rest (cards/frameworks/{job.framework}.yaml "
            "muon)." if muon is not None and job.lora is None else
            f"Muon: {job.framework} runs no Muon meshplan knows; its optimizer step is timed as Adam's.")
    if job.lora is not None:
        out.append(f"LoRA rank {job.lora.rank} on {', '.join(job.lora.targets)}: frozen linears (and the output "
                   "layer) run forward + data gradient, 2/3 of a trained GEMM's work; the adapters' GEMMs run in "
                   "bf16 with all three passes; data-parallel gradient traffic, the parameter all-gather and the "
                   "optimizer step cover the adapters only (FSDP/ZeRO-3 unit traffic is timed as for full "
                   "training). Model FLOPs (MFU) are the LoRA step's: Megatron's formula with the frozen linears' "
                   "weight gradients left out, plus 6 per adapter parameter per token (Megatron-Bridge "
                   "flop_utils.py counts frozen x 2/3 the same way, without the adapters).")
    return out + list(job.notes)
