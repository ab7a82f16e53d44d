"""The words of a throughput report: the assumptions the estimate made (each term's model, its constants and
their source) and the warnings about the batch and the layout."""

from __future__ import annotations

from meshplan.arithmetic.comm import Links
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD
from meshplan.arithmetic.memory_states import convention, fp8_recipe, optimizer_sharded, state_replicas
from meshplan.arithmetic.mesh import job_domain, mesh_groups, own_ep_ranks_note
from meshplan.estimate.attention_time import INDEXER_PASSES_PER_FORWARD, op_sac_recomputes_attention
from meshplan.estimate.layer_records import LayerContext
from meshplan.estimate.memory import routing_assumption, selective_modules
from meshplan.estimate.moe_time import dispatcher_passes, moe_host_syncs
from meshplan.estimate.sharding_traffic import dp_hidden_share, grad_reduce_bytes, overlap_off, sharding_schedule
from meshplan.estimate.tp_overlap import tp_ring_passes
from meshplan.knowledge.adapter_knobs import shared_expert_overlap
from meshplan.knowledge.calibration import (
    FLASH_ATTENTION_PASSES_PER_FORWARD,
    Calibration,
    attention_fraction_assumed,
    attention_fraction_measured,
    calibration_card,
    calibration_summary,
    flex_dispatch_bandwidth,
)
from meshplan.schema.model import layer_kind_counts
from meshplan.schema.plan import Job, Plan

# What each TP overlap mode hides (tp_overlap.tp_hidden), for the breakdown's assumptions.
TP_OVERLAP_TEXT = {
    "fraction": "{share:.0%} hidden behind compute (cards/calibration.yaml tp_overlap).",
    "none": "none hidden (each collective waits for its GEMM).",
    "wgrad": "the backward reduce-scatter hidden behind the weight-gradient GEMM, up to its time.",
    "local_shard": "the forward all-gather beside the input GEMM's local shard (1/tp of it), the forward "
                   "reduce-scatter exposed, the backward gradient gather beside the output GEMM's local-shard data "
                   "gradient (1/tp), the input's re-gather beside the input GEMM's data gradient and its "
                   "reduce-scatter beside its weight gradient, each up to that GEMM's time (the framework card's "
                   "tp_overlap).",
    "userbuffers": "userbuffers (tp_comm_overlap): each pipelined with its GEMM, up to (tp-1)/tp of its time, the "
                   "backward reduce-scatter in bulk behind the weight-gradient GEMM; the GEMMs beside the "
                   "reduce-scatter kernels run on the SMs those leave (the framework card's tp_overlap).",
    "async_tp": "async TP (tp_comm_overlap): each pipelined with its GEMM, up to (tp-1)/tp of its time; the "
                "local shard's copy, the reduce-scatter's sum of partials, the barriers and the chunked GEMMs' "
                "lower efficiency outside the pipeline (async_tp_cost); a backward reduce-scatter of an input "
                "gradient that sums several linears' data gradients runs unfused (async_tp_unfused).",
}


def dsa_assumption(job: Job) -> str:
    """What a DeepSeek Sparse Attention model's attention time is made of; empty for every other model."""
    d = job.model.dsa
    if d is None:
        return ""
    return (f" DSA (Megatron-Core DSAttention): the sparse core on absorbed MLA over min(position, {d.index_topk}) "
            f"keys per query, the lightning indexer's {d.index_n_heads} heads of {d.index_head_dim} over every "
            f"preceding key in BF16 (forward and a {INDEXER_PASSES_PER_FORWARD - 1:g}-pass backward, its KL loss over "
            "the selected keys), its linears whole on every TP rank, at the same fraction of peak; MFU divides by "
            "Megatron-LM's model FLOPs, which count DSA as dense MLA.")


def batch_warnings(job: Job, plan: Plan) -> list[str]:
    """What the estimate assumed about the batch (the framework's batch rule has already held or, for verl's
    FSDP engine and SkyRL, divides by another unit: `meshplan check` words it)."""
    unit = plan.micro_batch_size * plan.dp
    if job.global_batch_size % unit:
        return [f"global_batch_size {job.global_batch_size} is not a multiple of micro_batch_size x dp = {unit}; "
                f"timed as {job.global_batch_size // unit} micro-batches."]
    return []


def layout_warnings(job: Job, plan: Plan, lk: Links, m: int) -> list[str]:
    """Where the layout's traffic leaves the NVLink domain, a pipeline mostly bubble, a term timed as an upper
    bound."""
    out = []
    groups = mesh_groups(plan, law=job.card.world_size_law)
    if groups.tp.crosses(lk.domain):
        out.append(f"TP {plan.tp} spans more than one {lk.domain}-GPU NVLink domain: every layer's TP traffic "
                   "crosses the network.")
    if plan.cp > 1 and groups.cp.crosses(lk.domain):
        out.append(f"CP {plan.cp} x TP {plan.tp} spans more than one NVLink domain: the K/V ring uses the network.")
    if plan.ep > 1 and groups.ep.crosses(lk.domain):
        out.append(f"EP {plan.ep} spans more than one NVLink domain: token all-to-alls cross the network.")
    own_ep = own_ep_ranks_note(job, plan)
    if own_ep:
        out.append(own_ep)
    if plan.pp > 1 and m < plan.pp:
        out.append(f"Only {m} micro-batches for {plan.pp} pipeline stages: most of the step is pipeline bubble.")
    m = job.model
    if m.sliding_window and job.card.attention is not None and not job.card.attention.builds_window(m.model_type):
        out.append(f"{job.card.display_name}'s model code has no sliding window for {m.model_type}: its "
                   f"{m.windowed_layers} windowed layers train, are timed and counted (MFU) as full causal "
                   "attention (the card's attention.windowed_source).")
    elif m.sliding_window:
        out.append(f"{m.windowed_layers} of {m.num_layers} layers attend over a {m.sliding_window:,}-token window: "
                   "their attention core is counted (MFU) and timed at the keys the window leaves, as Megatron-"
                   "Bridge's flop_utils counts them (Megatron-LM's MFU formula counts them full); flash kernels skip "
                   "the masked tiles (FlashAttention-2's time counts the whole tiles its query blocks overlap, "
                   "calibration.yaml attention_kernels local_tiles), unfused attention computes the whole score "
                   "matrix whatever the window.")
    if m.chunked_layers and (job.card.attention is None or not job.card.attention.builds_chunks(m.model_type)):
        out.append(f"{job.card.display_name}'s model code has no chunked attention for {m.model_type}: its "
                   f"{m.chunked_layers} chunked layers ({m.attention_chunk_size:,}-token chunks) train, are timed "
                   "and counted (MFU) as full causal attention (the card's attention.chunked_source).")
    elif m.chunked_layers:
        out.append(f"{m.chunked_layers} of {m.num_layers} layers attend within {m.attention_chunk_size:,}-token "
                   "chunks (iRoPE; the others full causal): their attention core is counted (MFU) and timed at the "
                   "keys a query's chunk holds up to it (flops.chunk_attended_keys).")
    return out


def dp_assumption(job: Job, plan: Plan, cal: Calibration) -> str:
    """How the data-parallel traffic was timed, in the words of the schedule the plan runs."""
    sched = sharding_schedule(job, plan)
    nbytes = grad_reduce_bytes(plan, cal)  # the plan's grad_reduce_in_fp32, else the framework's default
    if not sched.per_step:
        said = f"DP: gradients reduced in {nbytes:.0f}-byte elements over dp x cp once per step, "
        if plan.zero_stage == 0:
            hidden = dp_hidden_share(plan, cal.dp_overlap)  # 0: DeepSpeed's all-reduce after the backward
            said += (f"overlapped with {hidden:.0%} of the last backward." if hidden else
                     "all-reduced after the last backward, none of it hidden.")
            if optimizer_sharded(job.card, plan.zero_stage, job.framework_version):  # DeepSpeed's BF16_Optimizer
                said += (" The optimizer steps its dp shard of the fp32 master weights (its own ZeRO-1), then the bf16 "
                         f"parameters are all-gathered, {dp_hidden_share(plan, cal.param_gather_overlap):.0%} of the "
                         "next forward hiding it.")
            return said
        return (said + ("all-reduced" if cal.zero_grad_allreduce >= 0.5 else "reduce-scattered")
                + f" with {dp_hidden_share(plan, cal.zero_grad_overlap):.0%} of the last backward hiding it; then "
                f"the bf16 parameters are all-gathered, {dp_hidden_share(plan, cal.param_gather_overlap):.0%} of "
                "the next forward hiding it.")
    params = (("bf16 parameters all-gathered layer by layer, forward and again backward, every micro-batch"
               if sched.regathered else "bf16 parameters all-gathered layer by layer in the forward and kept into "
               "the backward (not resharded after forward), every micro-batch")
              if sched.gather_each_microbatch else
              "bf16 parameters all-gathered layer by layer once per step (kept gathered across micro-batches)"
              if sched.params_sharded else "bf16 parameters all-gathered once per step after the optimizer")
    grads = "every micro-batch" if sched.reduce_each_microbatch else "in the last micro-batch only"
    head = (f"DP (ZeRO-{plan.zero_stage} / FSDP schedule of {job.framework}): {params}; gradients reduce-scattered "
            f"layer by layer in {nbytes:.0f}-byte elements over dp x cp {grads}"
            + (" (routed experts over expert-DP)" if job.model.moe is not None and plan.ep > 1 else ""))
    off = overlap_off(job, plan)  # the card's sharding_overlap_off at this ZeRO stage, the switch off
    switch = " / ".join(job.card.keys_setting("grad_reduce_overlap"))  # the framework's own name for it
    if not sched.overlapped:  # its units on the compute stream
        return (head + f". grad_reduce_overlap=false ({switch} false): every "
                f"all-gather and reduce-scatter runs on the compute stream (cards/frameworks/{job.framework}.yaml "
                "sharding_overlap_off), so each waits whole and none hides behind a layer's compute.")
    said = (head + ". Each transfer runs on its own stream and hides behind the neighbouring layer's compute and its "
            "TP / CP / EP collectives over the other kind of link (NVLink against network; exposed: what exceeds "
            "them, plus the first layer's all-gather and the last one's reduce-scatter).")
    if plan.grad_reduce_overlap:
        return said
    if off is not None:  # units overlapped: the engine turns its overlap back on
        return (said + f" grad_reduce_overlap=false ({switch} false) changes none of that: at ZeRO-{plan.zero_stage} "
                f"{job.card.display_name}'s engine turns its overlap back on itself (cards/frameworks/"
                f"{job.framework}.yaml sharding_overlap_off), so these transfers, and any replicas' all-reduce, stay "
                "overlapped" + ("." if sched.params_sharded else
                                "; the updated parameters' all-gather after the optimizer follows the switch and "
                                "waits whole."))
    return (said + " grad_reduce_overlap=false is not modelled on this schedule: its layer-by-layer transfers are "
            "timed as overlapped as above (where this engine then runs them is not in its card's "
            "sharding_overlap_off).")


def hybrid_sharding_assumption(job: Job, plan: Plan) -> str:
    """With replicas (memory_states.state_replicas: dp_replicate, or dp where ZeRO-0 is fully_shard over a shard of
    one): which group the DP collectives above run over, and the step's extra all-reduce (estimate/perf.dp_traffic,
    sharding_traffic.DpTraffic.replica_allreduce); empty without replicas."""
    n = state_replicas(job, plan)
    if n == 1:
        return ""
    if n != plan.dp_replicate:  # ZeRO-0 as fully_shard over a shard of one (the card's engine.replica_shard)
        shard = plan.dp * plan.cp // n
        return (f" zero_stage 0 on {job.card.display_name} is fully_shard over a shard of {shard} with {n} "
                f"replicas (HSDP, not DDP: cards/frameworks/{job.framework}.yaml engine.replica_shard): 'dp x cp' "
                f"above is one replica's {shard} rank{'s' if shard > 1 else ''}"
                + (" (over one, fully_shard's copies in place of the gather and reduce-scatter)" if shard == 1 else "")
                + f"; each unit's fp32 gradient is all-reduced across the {n} replicas with its reduce, hidden as "
                "the gradient reduction is.")
    return (f" Hybrid sharding, {n} replicas: 'dp x cp' above is one replica's {plan.dp * plan.cp // n} ranks "
            f"(expert-DP / {n} likewise); then each rank's gradient shard is all-reduced across the {n} replicas once "
            "per step, hidden as the gradient reduction is.")


def throughput_assumptions(job: Job, plan: Plan, m: int, worst: int, cal: Calibration,
                           ctx: LayerContext) -> list[str]:
    """Every assumption of the estimate (`m` micro-batches, `worst` the slowest stage), then the job's notes."""
    out = _core_assumptions(job, plan, m, worst, cal, ctx)
    if job.model.layer_pattern is not None:
        out.append(_hybrid_assumption(job, cal))
    if job.model.moe is not None:
        out.append(_moe_assumption(job, plan, cal))
        out.append(routing_assumption(job, plan))
    if plan.cuda_graph_impl != "none":
        out.append(cuda_graph_assumption(job, plan))
    if job.precision == "fp8":
        casts = ctx.fp8_casts
        out.append(f"FP8: transformer linears at FP8 peak x {cal.fp8_gemm_relative_efficiency:.2f}; attention, "
                   "router and logits stay BF16"
                   + (f"; Transformer Engine's quantize passes timed as HBM traffic ({fp8_recipe(job, plan)}: each "
                      "linear's input and output gradient per micro-batch, its weight once per step; "
                      "arithmetic/fp8_casts.py)." if casts is not None else
                      "; the casts that feed the FP8 GEMMs are not timed apart (in the x "
                      f"{cal.fp8_gemm_relative_efficiency:.2f})."))
    out += fp8_setting_assumptions(job) + shared_overlap_assumptions(job, plan)
    if plan.recompute != "none":
        out.append(f"Recompute {plan.recompute}: "
                   + ("one more forward of each recomputed layer (with its TP traffic)." if plan.recompute == "full"
                      else "the forward of the ops op-level SAC does not keep (every second linear, the router "
                      "and routed experts, pointwise and norms, TP all-gathers"
                      + (f"; the attention too: {ctx.attention_kernel} is not in torchtitan {job.framework_version}'s "
                         "save list" if op_sac_recomputes_attention(job, plan.attention_backend, plan.zero_stage)
                         else "") + ")."
                      if job.card.recompute.selective == "op_sac"
                      else f"the forward of each recompute module again ({', '.join(selective_modules(plan))})."))
    if plan.optimizer == "muon":
        out.append(_muon_assumption(job, cal))
    if job.lora is not None:
        out.append(f"LoRA rank {job.lora.rank} on {', '.join(job.lora.targets)}: frozen linears (and the output "
                   "layer) run forward + data gradient, 2/3 of a trained GEMM's work; the adapters' GEMMs run in "
                   "bf16 with all three passes; data-parallel gradient traffic, the parameter all-gather and the "
                   "optimizer step cover the adapters only (FSDP/ZeRO-3 unit traffic is timed as for full "
                   "training). Model FLOPs (MFU) are the LoRA step's: Megatron's formula with the frozen linears' "
                   "weight gradients left out, plus 6 per adapter parameter per token (Megatron-Bridge "
                   "flop_utils.py counts frozen x 2/3 the same way, without the adapters).")
    return out + list(job.notes)


def fp8_setting_assumptions(job: Job) -> list[str]:
    """What the estimate makes of the two Megatron-Core fp8 settings' time: FP8 dot-product attention timed as the
    bf16 kernel (meshplan has no sourced training throughput of cuDNN's FP8 fused attention, forward and backward),
    and the SwiGLU input's fp8 store as its two casts' HBM traffic."""
    out = []
    if job.fp8_dot_product_attention:
        out.append("FP8 dot-product attention: its memory counted in fp8 (Q, K, V and the output kept in one byte); "
                   "its time counted as the bf16 attention kernel's (no sourced training throughput of cuDNN's FP8 "
                   "fused attention, forward and backward, in cards/calibration.yaml), so the step may be "
                   "over-estimated.")
    if job.fp8_activation_input_store:
        out.append("SwiGLU input stored in fp8 (activation_func_fp8_input_store): fc1's output kept in one byte; "
                   "its cast to fp8 in the forward and back to bf16 in the backward timed as HBM traffic (bf16 read "
                   "and fp8 write, fp8 read and bf16 write, over fc1's output).")
    return out


def shared_overlap_assumptions(job: Job, plan: Plan) -> list[str]:
    """What the estimate makes of Megatron-Core's moe_shared_expert_overlap where the plan runs it (adapter_knobs.
    shared_expert_overlap): its time, moe_time.shared_overlap_windows; its memory, the gathered layer input the shared
    experts keep, activations.shared_overlap_input_bytes."""
    if not shared_expert_overlap(job, plan):
        return []  # off, or no shared experts: the run ignores it (rule EP014)
    hidden = ("each EP all-to-all hidden up to the shared experts' GEMMs beside it (fc1 beside the dispatch, fc2 "
              "beside the combine, their backward beside the gradients' all-to-alls)" if plan.ep > 1 and
              not plan.moe_a2a_overlap else "no EP all-to-all to hide behind them")
    return [f"Shared experts overlapped with the token dispatch (moe_shared_expert_overlap): {hidden}; their "
            "sequence-parallel all-gather and reduce-scatter, on the same side stream, stay counted as TP traffic, "
            "and the two streams' GEMMs sharing SMs is not modelled; their memory counts the layer input they gather "
            "over sequence parallelism and keep."]


def _core_assumptions(job: Job, plan: Plan, m: int, worst: int, cal: Calibration, ctx: LayerContext) -> list[str]:
    """The assumptions every estimate makes: model FLOPs, the pipeline, GEMMs and attention, TP, the host floor,
    DP, links, constants."""
    flash = ctx.flash
    peak = "FP8" if job.precision == "fp8" else "BF16"
    return [
        "Model FLOPs: Megatron-LM num_floating_point_operations (causal attention halved, GQA, SwiGLU, top-k "
        "routed + shared experts, MLA, MTP, logits); MFU = model FLOPs / (step x GPUs x dense "
        f"{peak} peak), recompute not counted.",
        (f"Pipeline: {m} micro-batches; the step replayed op by op under the framework's schedule (each rank's "
         f"forward and backward chunks in order, each waiting for its neighbour stage and one p2p hop); slowest "
         f"stage {worst}"
         + ("; layers split nanotron's way (cost-balanced, LM head counted as vocab x hidden)."
            if convention(job.card, plan.zero_stage)[1].pipeline_partition == "compute_balanced" else ".")
         if plan.pp > 1 else
         f"No pipeline (pp 1): {m} micro-batch{'es' if m != 1 else ''} per step, each rank's forward and backward "
         "run one after another, the gradients accumulated over them."),
        f"GEMM time = {TRAINING_PASSES_PER_FORWARD:g} x forward FLOPs / (peak x {cal.gemm_peak_fraction:.2f} x prod "
        f"d/(d+{cal.gemm_half_dim:.0f}) "
        "over its three dimensions); "
        + (f"flash attention ({ctx.attention_kernel or 'fused'}) at {ctx.attention_fraction:.2f} of "
           f"peak with a "
           f"{FLASH_ATTENTION_PASSES_PER_FORWARD - 1:g}x backward" + _fraction_basis(job, ctx) + "." if flash else
           "unfused attention: Q.K^T and P.V as batched GEMMs over the full s x s scores, plus "
           "memory-bound softmax" + (" and dropout" if ctx.dropout else "") + " passes over the scores.")
        + dsa_assumption(job),
        tp_collectives_text(ctx, plan) + TP_OVERLAP_TEXT[ctx.tp_overlap_mode].format(share=cal.tp_overlap),
        f"Host floor: a stage needs at least {cal.host_time_per_layer_s * 1e3:.2f} ms per layer per micro-batch "
        "to issue its kernels; GPU work shorter than that is launch-bound (counted in other_s with the optimizer).",
        dp_assumption(job, plan, cal) + hybrid_sharding_assumption(job, plan),
        "Links: NVLink inside the domain, the GPU's NIC across domains (rings use every NIC of the domain); "
        f"{cal.nvlink_efficiency:.0%} / {cal.network_efficiency:.0%} of datasheet bandwidth.",
        f"Constants: cards/calibration.yaml ({calibration_summary(job.framework)}; errors in bench/README.md).",
    ]


def _fraction_basis(job: Job, ctx: LayerContext) -> str:
    """The words for where the attention fraction on the job's GPU comes from, where its kernel's entry says: the
    published rates it is derived from (attention_fraction_measured), or that no published figure backs it
    (attention_fraction_assumed) and what it takes instead."""
    kernel, arch = ctx.attention_kernel, job.gpu.arch
    measured = attention_fraction_measured(kernel, arch)
    if measured is not None:
        return (f" (measured: {measured.cited}, {len(measured.forward_tflops)} shapes' forward and backward rates; "
                "cards/calibration.yaml attention_kernels)")
    if not attention_fraction_assumed(kernel, arch):
        return ""
    instead = calibration_card().attention_kernels[kernel].assumed_from if kernel else None
    basis = f"{instead}'s fraction there, a bound the card cites" if instead else "the shared fused-kernel value"
    return (f" (assumed: no published measured fraction of peak for {kernel} on {arch}; {basis}, "
            "cards/calibration.yaml attention_kernels)")


def _hybrid_assumption(job: Job, cal: Calibration) -> str:
    """How a hybrid model's layers were timed (estimate/hybrid_time.py)."""
    pattern = job.model.layer_pattern or ""
    counts = layer_kind_counts(pattern)
    if job.model.gdn is not None:
        return (f"Hybrid layers ({counts}): each one norm and one mixer timed by its kind, so one TP pair per layer "
                f"and {cal.hybrid_layer_hidden_share:g} of a transformer layer's hidden-sized passes; a Gated "
                "DeltaNet layer's in_proj and out_proj as GEMMs, its conv1d, q and k, value width, chunk matrices and "
                f"chunk states as memory-bound passes ({cal.gdn_key_passes:g} over q and k at the value heads, "
                f"{cal.gdn_value_passes:g} over its value width, {cal.gdn_conv_passes:g} over its conv width, "
                f"{cal.gdn_chunk_passes:g} over A, {cal.gdn_state_passes:g} over the chunk states), FLA's chunked "
                f"gated delta rule's matmuls (forward x {TRAINING_PASSES_PER_FORWARD:g}, plus the w, u and h the "
                "backward recomputes) at the GEMMs' "
                f"{cal.gemm_peak_fraction:.2f} of peak, its all-to-alls under CP (uncalibrated: counted from FLA's "
                "and Megatron-Core's code, no measured Gated DeltaNet run). Model FLOPs: Megatron-LM's "
                "gdn_layer_flops and attention with its output gate.")
    return (f"Hybrid layers ({counts}): each one norm and one mixer timed by its kind, so one TP pair per layer (the "
            "TP line counts a transformer layer's two) and "
            f"{cal.hybrid_layer_hidden_share:g} of a transformer layer's hidden-sized passes; a Mamba-2 layer's "
            "in_proj and out_proj as GEMMs, its conv1d, SSD chunk states, scan inputs and outputs and gated norm as "
            f"memory-bound passes ({cal.mamba_inner_passes:g} over its inner width, {cal.mamba_conv_passes:g} over "
            f"its conv width, {cal.mamba_group_passes:g} over B or C, {cal.mamba_state_passes:g} fp32 over its "
            "chunk states), its SSD scan's matmuls x "
            f"{cal.mamba_scan_passes:g} at the GEMMs' {cal.gemm_peak_fraction:.2f} of peak, MambaContextParallel's "
            "all-to-alls under CP (cards/calibration.yaml; not validated against a measured hybrid run). Model FLOPs: "
            "Megatron-LM's hybrid_flops.")


def _flex_copies(job: Job, plan: Plan) -> str:
    """What the flex dispatcher's copies reach inside one NVLink domain on the job's GPU (comm.flex_dispatch_time), at
    the EP ranks the plan's group has in one domain (the card's figure by ranks, where it lists several)."""
    backend = job.moe_flex_backend
    ep = mesh_groups(plan, law=job.card.world_size_law).ep
    bw = flex_dispatch_bandwidth(backend, job.gpu.arch, ep.members_in(job_domain(job)))
    if bw is None:
        return (f"inside one NVLink domain {backend}'s copies at NVLink's bandwidth (no measured figure for "
                f"{job.gpu.arch or 'this GPU'} in cards/calibration.yaml flex_dispatch); ")
    return (f"inside one NVLink domain a rank receives every copy at {backend}'s {bw / 1e9:.0f} GB/s on "
            f"{job.gpu.arch} (the SMs Megatron runs it on: cards/calibration.yaml flex_dispatch), where that is "
            "slower than NVLink; ")


def _moe_assumption(job: Job, plan: Plan, cal: Calibration) -> str:
    """How an MoE layer's dispatcher, router, expert GEMMs, host syncs and all-to-alls were timed."""
    moe = job.model.moe
    assert moe is not None
    syncs = moe_host_syncs(job, plan)
    counted = dispatcher_passes(job, plan, cal)
    if counted is None or plan.moe_token_dispatcher != "flex":
        skipped = counted is not None and counted.received == 0
        passes = (f"{cal.moe_dispatch_passes / 2 if skipped else cal.moe_dispatch_passes:.0f} bf16 passes forward + "
                  "backward" + (" (one local expert: Megatron-Core's alltoall dispatcher skips its chunk sort and "
                                "unsort)" if skipped else ""))
    else:
        passes = (f"{counted.received:.0f} bf16 passes forward + backward beside "
                  f"{job.moe_flex_backend}'s dispatch and combine kernels (cards/calibration.yaml "
                  "flex_dispatch permute_passes)")
    return (f"MoE layers: the token dispatcher moves the routed copies (tokens x top_k x hidden) in "
            f"{passes}, the router "
            f"{cal.moe_router_bytes_per_logit:.0f} bytes per fp32 logit, each expert GEMM slowed by its rows "
            f"(tokens per local expert / (that + {cal.moe_gemm_half_ridges:g} x the GPU's ridge rows)), "
            "and each MoE layer forward "
            f"{syncs:.0f} host sync{'s' * (syncs != 1)} of {cal.moe_host_sync_s * 1e3:.2f} ms (the "
            "last two fitted on published MoE runs, bench/moe_fit.py); "
            + ("flex dispatcher under fake_balanced_gate (NeMo AutoModel's FakeBalancedGate): token t's experts are "
               "(t x top_k + j) mod num_experts, consecutive, and DeepEP sends it once to each EP rank (and over the "
               "network once to each NVLink domain) holding them; "
               if plan.moe_token_dispatcher == "flex" and job.moe_fake_balanced_gate else
               "flex dispatcher: a token goes once to each EP rank holding one of its experts and crosses the "
               "network once per such NVLink domain (DeepEP), however many of its experts sit there; how many "
               "ranks and domains is the expectation for routing uniform over the experts"
               + (f", its experts in at most topk_group = {moe.group_topk} of n_group = "
                  f"{moe.num_groups} expert groups (group-limited routing); "
                  if moe.num_groups > 1 else "; ")
               if plan.moe_token_dispatcher == "flex" else
               "all-to-all dispatcher: every routed copy travels to its expert's rank; ")
            + (_flex_copies(job, plan) if plan.moe_token_dispatcher == "flex" else "")
            + ("expert all-to-all hidden behind the other micro-batch's compute of the layer in the 1F1B "
               "steady state (moe_a2a_overlap), that compute slowed meanwhile by the SMs the all-to-all's kernels "
               "hold (NCCL's p2p channels, or the flex backend's SMs), exposed in warm-up and cool-down."
               if plan.moe_a2a_overlap else "expert all-to-all exposed (moe_a2a_overlap off)."))


def cuda_graph_assumption(job: Job, plan: Plan) -> str:
    """What the plan's CUDA graphs change in the estimate: nothing meshplan times. Rule CG002 refuses every capture of a
    dropless MoE layer's experts, so the dispatcher's host sync (moe_host_sync_s) and the per-expert grouped-GEMM
    launches (grouped_gemm_launch_s) stand; the captured modules' kernels are launched as one graph, and meshplan
    times no host launch for them eager either (the host runs ahead of the GPU there)."""
    what = ("the whole forward-backward iteration" if plan.cuda_graph_impl == "full_iteration" else
            f"each layer's {', '.join(plan.cuda_graph_modules)}" if plan.cuda_graph_modules else "each whole layer")
    experts = (" The routed experts stay eager (dropless routing: Megatron-Core cannot capture them, rule CG002): "
               "their host sync and per-expert launches are timed as without graphs."
               if job.model.moe is not None else "")
    return (f"CUDA graphs ({plan.cuda_graph_impl}) of {what}: timed as eager, since meshplan times no host launch for "
            "the captured kernels either way (the host runs ahead of the GPU outside an MoE layer's sync)." + experts
            + " Their memory pools are not counted.")


def _muon_assumption(job: Job, cal: Calibration) -> str:
    """How Muon's step was timed, as the framework card says the framework runs it (or that it runs none)."""
    muon = job.card.muon
    if muon is None or job.lora is not None:
        return f"Muon: {job.framework} runs no Muon meshplan knows; its optimizer step is timed as Adam's."
    dtype = "BF16" if muon.ns_dtype == "bf16" else "FP32 (the GPU's fp32_flops, no TF32)"
    side = "the matrix's smaller side" if muon.ns_side == "smaller" else "the matrix's rows as stored"
    which = ("each weight matrix" if muon.max_aspect_ratio is None else
             f"each 2-D weight at most {muon.max_aspect_ratio:g} times longer than wide (the embedding and output "
             "layer too where they are)")
    layout = ", QKV as Q, K and V blocks per query group" if muon.split_qkv and muon.matrices == "fused" else (
        ", one matrix per linear module" if muon.matrices == "per_module" else "")
    shared = ("whole matrices shared out over the data-parallel ranks (experts over expert-data-parallel), at least "
              "the costliest one per rank" if muon.assignment == "layer_wise" else
              "each rank iterating on its own FSDP2 shard of every matrix (its rows over the shard group)")
    return (f"Muon: {which}'s momentum orthogonalized by {muon.ns_steps} Newton-Schulz iterations, three {dtype} "
            f"GEMMs each on {side} (4 m^2 n + 2 m^3 FLOPs), at the model GEMMs' efficiency; tensor-parallel "
            f"matrices {muon.tp_mode}{layout}; {shared}; {cal.muon_bytes_per_param:g} B per matrix parameter of "
            f"state traffic, Adam's {cal.optimizer_bytes_per_param:g} on the rest (cards/frameworks/{job.framework}"
            ".yaml muon).")


def tp_collectives_text(ctx: LayerContext, plan: Plan) -> str:
    """A layer's TP collectives as its estimate counts them (tp_ring_passes over the framework's input-side
    collectives, cards' tp_input_linears): Korthikanti's 2 + 2 per pair unless the framework's TP plan says more."""
    fwd, bwd = tp_ring_passes(ctx.tp_input_ops, plan.sequence_parallel, 2, ctx.tp_input_regather)
    if plan.sequence_parallel:
        return f"TP: {fwd:g} all-gathers/reduce-scatters per layer forward and {bwd:g} backward; "
    return f"TP: {fwd / 2:g} all-reduces per layer forward and {bwd / 2:g} backward; "
