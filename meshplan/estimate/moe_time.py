"""An MoE layer's own time on one rank: the most loaded EP rank's experts, the token dispatcher's permutes, router
passes and host syncs, and the EP all-to-alls with what moe_a2a_overlap hides of them."""

from __future__ import annotations

from dataclasses import replace

from meshplan.arithmetic.comm import (
    Links,
    allreduce_time,
    alltoall_sm_share,
    beside_compute,
    dispatch_time,
    ring_time,
)
from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, summed
from meshplan.arithmetic.memory_states import fp8_recipe
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_records import BF16, FORWARD_AND_BACKWARD, DispatchPasses, LayerContext
from meshplan.knowledge.calibration import Calibration, flex_permute_passes
from meshplan.schema.plan import Job, Plan

# Token dispatch and combine, forward and backward.
EP_ALL_TO_ALLS_PER_LAYER = 4.0


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
    static capacity is set, which meshplan's dropless plans do not. One each, whatever the dispatcher. A framework
    with a dispatcher of its own says its count in its card (moe_host_syncs: KempnerForge's three with EP)."""
    facts = job.card.moe_host_syncs
    if facts is None:
        return 1.0
    return float(facts.with_ep if plan.ep > 1 else facts.without_ep)


def dispatcher_passes(job: Job, plan: Plan, cal: Calibration) -> DispatchPasses | None:
    """bf16 passes over the routed copies, forward + backward, that the plan's token dispatcher runs beside its
    all-to-alls (LayerContext.dispatch_passes), from Megatron-Core's token_dispatcher.py (core_v0.19.0):
    - the flex dispatcher on the job's backend (Job.moe_flex_backend, the request's or the machine's) runs its
      over what the rank receives (cards/calibration.yaml flex_dispatch permute_passes: DeepEP's permute after the
      dispatch and unpermute before the combine, none on HybridEP, whose dispatch and combine kernels permute as
      they copy);
    - the alltoall dispatcher on Megatron-Core's engine runs moe_dispatch_passes, its permute and unpermute over the
      rank's own copies and its chunk sort and unsort over what it receives, the latter only with more than one
      local expert (MoEAlltoAllTokenDispatcher.dispatch_postprocess / combine_preprocess: `if
      self.num_local_experts > 1` around sort_chunks_by_idxs; with one expert a rank's received chunks are already
      in its order);
    None for any other framework's dispatcher: the card's count, half over each."""
    moe = job.model.moe
    if moe is None:
        return None
    if plan.moe_token_dispatcher == "flex" and job.card.flex_dispatcher:
        return DispatchPasses(0.0, flex_permute_passes(job.moe_flex_backend))
    if plan.moe_token_dispatcher != "alltoall" or job.card.engine_at(plan.zero_stage) != "megatron":
        return None
    half = cal.moe_dispatch_passes / 2
    return DispatchPasses(half, half if moe.num_experts // plan.ep > 1 else 0.0)


def expert_launches(job: Job, plan: Plan) -> tuple[float, float]:
    """(forward, backward) kernels one MoE layer's grouped GEMMs launch on a rank per micro-batch, where the framework's
    grouped GEMM launches per local expert (its card's grouped_gemm_launches; (0, 0) where it is one kernel): each of
    the num_experts / ep local experts' GEMMs, and under FP8 its quantized tensors times the recipe's kernels each.
    (0, 0) where the plan's stage does not launch per expert (launches_per_expert)."""
    if not launches_per_expert(job, plan.zero_stage):
        return 0.0, 0.0
    facts, moe = job.card.grouped_gemm_launches, job.model.moe
    assert facts is not None and moe is not None
    recipe = fp8_recipe(job, plan)
    per_tensor = facts.quantize_kernels.get(recipe, 0) if recipe is not None else 0
    local = moe.num_experts / plan.ep
    return (local * (facts.forward_gemms + facts.forward_quantized * per_tensor),
            local * (facts.backward_gemms + facts.backward_quantized * per_tensor))


def launches_per_expert(job: Job, zero_stage: int) -> bool:
    """Whether the job's plans at this ZeRO stage launch their routed experts' grouped GEMMs one local expert at a
    time (expert_launches counts them, expert_launch_floor and backward_launch_wait time them): an MoE model trained
    whole (a LoRA job's frozen experts, without weight gradients, are not counted) on a framework whose card has
    grouped_gemm_launches, by an engine among its `engines` (verl's and SkyRL's Megatron engine, not their FSDP one,
    which trains transformers' MoE block). The estimate and the search's single-stage references
    (search/zero_stages.reference_zeros: one per answer of this, the least kept) read this one function."""
    facts = job.card.grouped_gemm_launches
    if facts is None or job.model.moe is None or job.lora is not None:
        return False
    return facts.engines is None or job.card.engine_at(zero_stage) in facts.engines


def expert_launch_floor(ctx: LayerContext, expert_gemms: float) -> tuple[float, float]:
    """(forward + backward, forward) seconds of one MoE layer's routed experts' GEMMs per micro-batch (`expert_gemms`
    their three passes on the GPU, a third of it in the forward as TRAINING_PASSES_PER_FORWARD counts), with the
    forward no shorter than its launches' host time (ctx.expert_launches, grouped_gemm_launch_s each): they are
    issued right after the dispatcher's host sync, so the host has no lead over the GPU to hide them behind (the
    backward's: backward_launch_wait). The backward's passes are kept as they are. The floored forward is the total
    less those passes, (passes - 1) / passes of `expert_gemms`, rather than the floor itself: the same real number,
    whose float differs from it in the last bit now and then, and that bit moves recommend's answers."""
    fwd = expert_gemms / TRAINING_PASSES_PER_FORWARD
    floor = ctx.expert_launches[0] * ctx.cal.grouped_gemm_launch_s
    if floor <= fwd:
        return expert_gemms, fwd
    total = floor + (expert_gemms - fwd)
    return total, total - (TRAINING_PASSES_PER_FORWARD - 1.0) * expert_gemms / TRAINING_PASSES_PER_FORWARD


def backward_launch_wait(ctx: LayerContext, backward: float) -> float:
    """Seconds one MoE layer's backward waits for the host to launch its experts' kernels one expert at a time
    (ctx.expert_launches' backward, grouped_gemm_launch_s each), beyond its GPU seconds `backward`: no host sync stops
    the autograd thread there, so the lead it gains while the GPU runs the layer's other backward work hides them, up
    to that work."""
    return max(0.0, ctx.expert_launches[1] * ctx.cal.grouped_gemm_launch_s - backward)


def dispatch_and_router_bytes(ctx: LayerContext) -> tuple[float, float]:
    """(dispatcher, router) memory-bound bytes of one MoE layer, forward + backward: the routed copies (tokens x top_k
    hidden vectors on the busiest rank, latent-wide in a latent MoE) permuted, sorted by expert, unsorted and
    unpermuted (transformers' eager MoE block, ctx.hf_eager: its index, scatter and routing-weight passes over them,
    hf_eager_dispatch_passes); the router's fp32 logits (scores, top-k, probs), over the tokens the rank routes
    (Shard.moe_tokens of the block's shard). The copies are whole hidden vectors whatever the ETP: under ETP > 1
    Megatron-Core's alltoall dispatcher gathers the received copies over the expert-TP group before it sorts them by
    expert (token_dispatcher.py MoEAlltoAllTokenDispatcher: gather_from_sequence_parallel_region on the tp group, then
    sort_chunks_by_idxs; the unsort before its reduce-scatter), so the sort and unsort half of the passes runs over
    etp x the copies and the permute and unpermute half over the rank's own; with one local expert the sort half is
    not run (ctx.dispatch_passes, dispatcher_passes). The flex dispatcher runs its backend's passes over what the
    rank receives, every copy sent to each rank of the expert-TP group (MoEFlexTokenDispatcher: top_k and the experts
    times the tp size, the routing map expanded over it): etp x the copies."""
    arch, cal = ctx.arch, ctx.cal
    assert arch.moe is not None
    local = ctx.shard.moe_view().moe_tokens
    routed = local * arch.moe.top_k * arch.moe.expert_width(arch.hidden_size) * ctx.routed_load
    if ctx.hf_eager:  # transformers' MoE block: no expert TP
        dispatch_bytes = cal.hf_eager_dispatch_passes * BF16 * routed
    elif ctx.dispatch_passes is not None:  # the dispatcher's own count (dispatcher_passes)
        own, received = ctx.dispatch_passes
        dispatch_bytes = (own + received * ctx.plan.etp) * BF16 * routed
    else:
        dispatch_bytes = cal.moe_dispatch_passes * BF16 * routed * (1 + ctx.plan.etp) / 2
    router_bytes = cal.moe_router_bytes_per_logit * local * arch.moe.num_experts
    return dispatch_bytes, router_bytes


def shared_overlap_windows(ctx: LayerContext, gemms: list[Gemm], terms: list[float]) -> tuple[float, ...]:
    """Seconds of the shared experts' GEMMs in each of an MoE layer's four EP all-to-alls' windows where the plan runs
    Megatron-Core's moe_shared_expert_overlap (ctx.shared_expert_overlap), in exposed_ep's order: (dispatch forward,
    combine forward, combine backward, dispatch backward); () without it, or for a LoRA job (its frozen linears' passes
    are not the three gemm_terms count). From NVIDIA/Megatron-LM 24bad8e677 transformer/moe/token_dispatcher.py and
    shared_experts.py: MoEAlltoAllTokenDispatcher.token_dispatch launches the shared experts' linear_fc1 and activation
    on their own stream right after the tokens' all-to-all, and token_combine their linear_fc2 right after the combine's
    (wait_current_stream first, so neither runs beside the routed experts); the forward's get_output joins the
    streams after the combine. In the backward the all-to-alls' gradients are launched first (the sequence numbers
    set_tensor_grad_fn_sequence_sr gives them) and each linear's backward runs on the stream of its forward: fc2's data
    and weight gradients beside the combine's all-to-all, fc1's beside the dispatch's (_BackwardStreamWait holds it
    until the routed fc1's backward is issued). Each GEMM's forward is a third of its gemm_terms seconds
    (TRAINING_PASSES_PER_FORWARD), its backward the rest. The shared experts' own sequence-parallel all-gather and
    reduce-scatter (pre_forward_comm, post_forward_comm) move to that stream too, but stay counted as the layer's TP
    traffic (tp_overlap.exposed_tp)."""
    if not ctx.shared_expert_overlap or ctx.lora is not None:
        return ()
    fc1 = summed([t for g, t in zip(gemms, terms, strict=True) if g.name == "shared_expert_fc1"])
    fc2 = summed([t for g, t in zip(gemms, terms, strict=True) if g.name == "shared_expert_fc2"])
    backward = (TRAINING_PASSES_PER_FORWARD - 1.0) / TRAINING_PASSES_PER_FORWARD
    return (fc1 / TRAINING_PASSES_PER_FORWARD, fc2 / TRAINING_PASSES_PER_FORWARD, fc2 * backward, fc1 * backward)


def exposed_ep(ctx: LayerContext, fwd_compute: float, bwd_compute: float, shared: tuple[float, ...] = ()) -> float:
    """Exposed EP all-to-all seconds of one MoE layer per micro-batch: dispatch and combine, forward and backward,
    the most loaded rank receiving (and sending back) routed_load times the mean while every rank waits for it;
    with moe_a2a_overlap, what the other chunk's compute hides (overlapped_a2a); with the shared experts beside them
    (`shared`: shared_overlap_windows' seconds per all-to-all), each all-to-all and the shared experts' GEMMs in its
    window take the GEMMs' seconds and what the all-to-all adds to them (comm.beside_compute): the all-to-all hidden
    up to those GEMMs' length, which run meanwhile on the SMs its kernels leave (comm.alltoall_sm_share)."""
    arch, plan = ctx.arch, ctx.plan
    if arch.moe is None or plan.ep <= 1:
        return 0.0
    local = ctx.shard.moe_view().moe_tokens  # what the rank routes: its SP shard, or (the block whole) every token
    ep = mesh_groups(plan, law=ctx.law).ep
    width = arch.moe.expert_width(arch.hidden_size)  # a latent MoE dispatches latent-wide tokens
    if ctx.gather_dispatch and plan.moe_token_dispatcher != "flex":
        return gather_ep(local * width * BF16, ep.size, ep.stride, ctx.lk)
    sent = local * width * BF16 * ctx.routed_load
    one = dispatch_time(sent, arch.moe.top_k, ep.size, ep.stride, ctx.lk, dedup=plan.moe_token_dispatcher == "flex",
                        experts=arch.moe.num_experts, num_groups=arch.moe.num_groups, group_topk=arch.moe.group_topk,
                        consecutive=ctx.consecutive_routing)
    share = alltoall_sm_share(ep.size, ep.stride, ctx.lk, flex=plan.moe_token_dispatcher == "flex")
    if plan.moe_a2a_overlap:
        return overlapped_a2a(one, fwd_compute, bwd_compute, ctx.a2a_steady_share, share)
    return (EP_ALL_TO_ALLS_PER_LAYER - len(shared)) * one + sum(beside_compute(one, s, share) for s in shared)


def gather_ep(local_bytes: float, ep: int, stride: int, lk: Links) -> float:
    """One MoE layer's EP communication per micro-batch where the dispatcher gathers instead of routing (NeMo
    AutoModel's torch dispatcher, components/moe/experts.py GroupedExperts.forward): the forward all-gathers every
    rank's tokens over the EP group and all-reduces the gathered expert output ([ep x tokens, hidden]) before each
    rank keeps its own rows; the backward reduce-scatters the gathered input's gradient and all-reduces the output's.
    Each collective moves the EP group's tokens (ep x `local_bytes`), whatever the top-k: two ring passes and two
    all-reduces (the routing weights and indices gathered beside them are top_k values per token, left out)."""
    gathered = local_bytes * ep
    return 2.0 * ring_time(gathered, ep, stride, lk) + 2.0 * allreduce_time(gathered, ep, stride, lk)


def a2a_steady_share(m: int, pp: int, vpp: int) -> float:
    """Share of a stage's micro-batch chunks that run in the combined 1F1B steady state, where Megatron-Core's
    overlap_moe_expert_parallel_comm pairs one chunk's forward with another's backward. The warm-up forwards and the
    cool-down backwards run alone: one chunk without a pipeline (forward_backward_no_pipelining's combined 1F1B
    starts after the first forward), (pp - 1) x 2 + (vpp - 1) x pp on the first rank of the interleaved schedule
    (megatron/core/pipeline_parallel/schedules.py get_pp_rank_microbatches, num_warmup_microbatches)."""
    chunks = m * vpp
    warmup = 1 if pp == 1 else (pp - 1) * 2 + (vpp - 1) * pp
    return max(0, chunks - warmup) / chunks


def overlapped_a2a(one: float, fwd_compute: float, bwd_compute: float, steady: float, share: float = 0.0) -> float:
    """Exposed EP all-to-all of one MoE layer per micro-batch with moe_a2a_overlap: in the steady state, the
    forward's dispatch and combine run beside the other chunk's backward of the layer, and the backward's beside
    its forward (delay_wgrad_compute moves the weight gradients after the dispatch so the backward has them to
    offer), each hidden up to that compute, which runs meanwhile on the SMs the all-to-all's kernels leave (`share`
    of them held: comm.alltoall_sm_share), so each direction costs comm.beside_compute: its part beyond the window,
    or the compute it slowed, whichever is longer. Megatron-Core core_v0.16.0 (3bec9aa9)
    models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run launches the dispatch and combine
    on a communication stream beside the compute stream's attention and expert nodes, and
    models/gpt/fine_grained_callables.py submodule_combine_forward starts the combine before the residual add so that
    add does not 'compete for SM resources with another microbatch's computation': the kernels share the GPU's SMs
    for as long as the all-to-all runs. Outside the steady state all four are exposed."""
    comm = FORWARD_AND_BACKWARD * one  # per direction: dispatch + combine
    exposed = beside_compute(comm, bwd_compute, share) + beside_compute(comm, fwd_compute, share)
    return steady * exposed + (1.0 - steady) * EP_ALL_TO_ALLS_PER_LAYER * one
