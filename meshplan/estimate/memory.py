"""Per-GPU, per-pipeline-stage memory of a training job: will it fit, and where does the memory go?

For each pipeline stage: the parameters that stage's GPU holds (its layers sharded by TP, its routed
experts by EP*ETP, embedding on the first stage, output layer, final norm and MTP on the last), times
the framework's byte table (cards/memory.yaml, via memory_states); plus the activations of the
micro-batches the real schedule keeps in flight on that stage (schedule.py), per layer from
activations.py; plus logits and the fp32 loss on the last stage; plus one calibrated fixed overhead,
the CUDA context and the caching allocator's reserve over the memory that churns every step (peak
reserved, which is what runs out). The worst stage decides whether the job fits.
"""

from __future__ import annotations

from typing import NamedTuple

from meshplan.arithmetic import mesh
from meshplan.arithmetic.activations import (
    Layout,
    activation_mode,
    attention_saves,
    layer_activations,
    moe_bytes,
    shape_of,
)
from meshplan.arithmetic.memory_states import (
    describe_tensors,
    fp8_inputs,
    fp8_param_gather,
    gathered_transient,
    memory_card,
    muon_saved_bytes,
    output_activations,
    state_bytes,
    with_precision,
)
from meshplan.arithmetic.offload import offload_plan, offload_stage
from meshplan.arithmetic.schedule import in_flight, padded_vocab, plan_stages
from meshplan.core.units import GIB
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.models import layer_params, mtp_params, per_architecture
from meshplan.rules.engine import require_estimable
from meshplan.schema.contract import Architecture, Job, MemoryReport, MemorySummary, Plan, StageMemory

# --------------------------------------------------------------------------- parameters per layer (cached)


class _ParamTable:
    """Per-layer parameters split by how they shard: over TP, not at all, over EP*ETP; linear-layer share."""

    __slots__ = ("arch", "experts", "linear_dense", "moe", "mtp", "replicated", "tp_sharded")

    def __init__(self, arch: Architecture):
        self.arch = arch
        self.tp_sharded: list[int] = []
        self.replicated: list[int] = []
        self.experts: list[int] = []
        self.linear_dense: list[int] = []
        self.moe: list[bool] = []
        for i in range(arch.num_layers):
            p = layer_params(arch, i)
            sharded = p["attention"] + p["dense_mlp"] + p["shared_experts"]
            self.tp_sharded.append(sharded)
            self.replicated.append(p["norms"] + p["router"])
            self.experts.append(p["routed_experts"])
            self.linear_dense.append(sharded)
            self.moe.append(arch.is_moe_layer(i))
        self.mtp = (0, 0, 0)
        if arch.num_mtp_layers:
            last = layer_params(arch, arch.num_layers - 1)
            total = mtp_params(arch)
            per_block_experts = last["routed_experts"]
            experts = arch.num_mtp_layers * per_block_experts
            h = arch.hidden_size
            sharded = arch.num_mtp_layers * (2 * h * h + last["attention"] + last["dense_mlp"] + last["shared_experts"])
            self.mtp = (sharded, total - experts - sharded, experts)


_param_table = per_architecture(_ParamTable)


# --------------------------------------------------------------------------- validation


def _assumed(job: Job, plan: Plan) -> list[str]:
    """What the estimate assumed where the layout breaks a rule that does not block it (`meshplan check`
    words those rules; the blocking ones stopped the estimate before this runs)."""
    arch, warnings = job.model, []
    kv = arch.num_kv_heads
    if kv % plan.tp and plan.tp % kv:
        warnings.append(
            f"tp={plan.tp} does not divide the {kv} KV heads evenly; estimated as if it did (run `meshplan check`)."
        )
    if arch.moe is None and plan.etp > 1:
        warnings.append(f"etp={plan.etp} ignored: {arch.name} is a dense model.")
    return warnings


def _world(job: Job, plan: Plan) -> tuple[int, float, list[str]]:
    """World size of the layout and the expert-data-parallel size world/(pp*ep*etp) (the world-size and
    expert-grid rules of the framework already hold: they block the estimate)."""
    world = mesh.world_size(framework_card(job.framework).world_size_law, plan)
    warnings = []
    group = mesh.expert_group(plan)
    if job.model.moe is not None and world % group:
        warnings.append(
            f"world {world} is not divisible by pp*ep*etp = {group}; expert-data-parallel size taken as "
            f"{world / group:.2f} (run `meshplan check`)."
        )
    return world, mesh.expert_dp(world, plan), warnings


# --------------------------------------------------------------------------- the estimate


def attention_switches(conv, plan: Plan) -> tuple[bool, bool]:
    """(flash, dropout) of the plan's attention: unfused attention materialises the scores, flash and fused keep only
    q, k, v, the output and the log-sum-exp; auto and a dropout left out are the framework's memory convention's
    (cards/memory.yaml). Every estimator reads them here (Plan.attention_backend, Plan.dropout)."""
    flash = conv.flash_attention if plan.attention_backend == "auto" else plan.attention_backend != "unfused"
    return flash, conv.dropout if plan.dropout is None else plan.dropout


def estimate_memory(job: Job, plan: Plan) -> MemoryReport:
    """Per-GPU memory of every pipeline stage (the attention backend and dropout: attention_switches).

    Raises EstimateBlocked (a MeshplanError naming the rule) when the plan breaks a rule of the framework
    that no estimate can proceed past (`blocks_estimate` in cards/rules.yaml)."""
    require_estimable(job, plan)
    warnings = _assumed(job, plan)
    arch = job.model
    conv_name, conv, tensors = with_precision(job, plan)  # the convention with the plan's precision knobs
    card = memory_card()
    _, expert_dp, world_warnings = _world(job, plan)
    warnings += world_warnings
    vocab = padded_vocab(arch.vocab_size, conv.vocab_pad_multiple, plan.tp)
    pipeline = plan_stages(job, plan)
    layout = pipeline.chunks
    warnings += list(pipeline.warnings)
    vpp = len(layout[0])
    table = _param_table(arch)
    shape = shape_of(arch)
    tp, pp = plan.tp, plan.pp
    ts = tp if plan.sequence_parallel else 1
    h = arch.hidden_size
    norm_width = h * (2 if arch.norm_type == "layernorm" else 1)
    fp8 = job.precision == "fp8"
    dense_dp = plan.dp * plan.cp
    if job.global_batch_size % (plan.micro_batch_size * plan.dp):
        warnings.append(
            f"global_batch_size {job.global_batch_size} is not a multiple of micro_batch_size*dp = "
            f"{plan.micro_batch_size * plan.dp}; micro-batches rounded down (run `meshplan check`)."
        )
    m = plan.num_microbatches(job.global_batch_size)
    tokens = -(-job.seq_length // plan.cp) * plan.micro_batch_size
    flash, dropout = attention_switches(conv, plan)
    lay = Layout(
        tokens=tokens, seq_kv=job.seq_length, tp=tp, sp=plan.sequence_parallel, etp=plan.etp,
        flash=flash, dropout=dropout,
        swiglu_unfused=conv.swiglu_unfused, fp8=fp8_inputs(job, conv), ep=plan.ep,
        moe=moe_bytes(conv, arch), qkv_fused=conv.qkv_projections == "fused",
        attn=attention_saves(conv), routed_load=ep_rank_load(job, plan),
    )
    recompute = plan.recompute
    selective = framework_card(job.framework).recompute.selective  # what this framework's "selective" saves
    modules = tuple(plan.recompute_modules or ("core_attn",))  # Megatron's recompute_modules (its default)
    per_kind = {
        (moe, mode): sum(layer_activations(shape, lay, moe, activation_mode(mode, selective), modules).values())
        for moe in (False, True) for mode in ("none", "selective", "full")
    }
    stored_mode = "selective" if recompute == "selective" else "none"
    # torchtitan 0.2.x selective_ac_option N: the k-th block built on a rank (k from 1, over its chunks) is fully
    # checkpointed when k % N == 0, the others not (activation_checkpoint.py _apply_layer_sac's global counter)
    every_nth = every_nth_blocks(plan)
    # Megatron's uniform method checkpoints chunks of `group` layers together: each chunk keeps only its input and
    # its backward rebuilds all of its layers at once (transformer_block.py _checkpointed_forward)
    group = uniform_group(plan)
    sharded_weights = any(t.shard == "dp" and t.tensor_class == "weights" for t in tensors)
    gathered = conv.gathered_layers if sharded_weights else 0
    other_fixed = card.fixed_overhead_bytes + card.cuda_context_bytes
    # final-norm and output-layer inputs plus the logits and loss of one micro-batch (chunked where the loss is)
    logits_bytes = output_activations(conv, tokens, vocab, tp, h, ts)
    # what the offload knobs move to host memory on this framework's engine (cards/frameworks/*.yaml offload)
    offload = offload_plan(job.framework, plan)
    optimizer_sharded = any(t.shard == "dp" for t in tensors if t.tensor_class == "optimizer")

    stages: list[StageMemory] = []
    walk_moments: dict[int, str] = {}  # the moment each stage peaks at, where the convention walks the backward
    for rank, chunks in enumerate(layout):
        layers = [i for chunk in chunks for i in chunk]
        first, last = rank == 0, rank == pipeline.head_rank
        dense = sum(map(table.tp_sharded.__getitem__, layers)) / tp + sum(map(table.replicated.__getitem__, layers))
        experts = sum(map(table.experts.__getitem__, layers)) / (plan.ep * plan.etp)
        linear = sum(map(table.linear_dense.__getitem__, layers)) / tp + experts
        detail: dict[str, int] = {}
        if first:
            emb = vocab * h / tp + arch.learned_position_embeddings * h
            dense += emb
            detail["embedding_params"] = int(emb)
        head = 0.0
        if last:
            head = vocab * h / tp if (not arch.tie_word_embeddings or pp > 1) else 0
            dense += head + norm_width
            linear += head
            detail["output_layer_params"] = int(head)
        if arch.num_mtp_layers and pipeline.mtp_trained and rank == pipeline.mtp_at:
            mtp_sharded, mtp_repl, mtp_experts = table.mtp
            dense += mtp_sharded / tp + mtp_repl
            experts += mtp_experts / (plan.ep * plan.etp)
            linear += mtp_sharded / tp + mtp_experts / (plan.ep * plan.etp)
            detail["mtp_params"] = int(mtp_sharded / tp + mtp_repl + mtp_experts / (plan.ep * plan.etp))
        states = state_bytes(tensors, dense, dense_dp)
        for cls, value in state_bytes(tensors, experts, expert_dp).items():
            states[cls] += value
        # Muon: one momentum instead of Adam's two on the decoder's (and MTP's) matrices; the output layer stays on Adam
        states["optimizer"] -= (muon_saved_bytes(plan, tensors, linear - head - experts, dense_dp)
                                + muon_saved_bytes(plan, tensors, experts, expert_dp))
        if job.lora is not None:  # LoRA: the frozen base keeps its weights only, the adapters carry every state
            states = lora_states(job, plan, tensors, layers, states, dense_dp, expert_dp, detail)
        if fp8 and conv.fp8_weight_bytes:
            states["weights"] += conv.fp8_weight_bytes * linear
            detail["fp8_weight_copies"] = int(conv.fp8_weight_bytes * linear)
        detail["params_on_gpu"] = int(dense + experts)

        # activations of the micro-batches this stage holds at its peak
        held = in_flight(rank, pp, vpp, m)
        acts = 0.0
        built = 0
        layer_modes: dict[int, str] = {}  # the mode each layer ran in (one micro-batch), for the backward walk
        for chunk, count in zip(chunks, held, strict=True):
            chunk_bytes = 0.0
            for pos, i in enumerate(chunk):
                built += 1
                mode = stored_mode
                if group and pos % group:
                    continue  # inside a uniform chunk: only the chunk's first input is kept
                if group:
                    mode = "full"
                elif recompute == "full" and (plan.recompute_layers is None or plan.recompute_method == "uniform"
                                              or pos < plan.recompute_layers):
                    mode = "full"
                elif every_nth:
                    mode = "full" if built % every_nth == 0 else "none"
                layer_modes[i] = mode
                chunk_bytes += per_kind[(table.moe[i], mode)]
            acts += count * chunk_bytes
        detail["microbatches_in_flight"] = sum(held)
        detail["layer_activations"] = int(acts)
        host = 0.0
        if offload.any:
            optimizer_params = dense / dense_dp + experts / expert_dp if optimizer_sharded else dense + experts
            largest = max((per_kind[(table.moe[i], stored_mode)] for i in layers), default=0.0)
            moved = offload_stage(offload, states, optimizer_params, acts, largest)
            states, acts, host = moved.states, moved.activations, moved.host
            detail.update(moved.detail)
            detail["optimizer_params"] = int(optimizer_params)
        if (recompute == "full" or (every_nth and len(layers) >= every_nth)) and layers:
            # the layer being recomputed in the backward holds its full activations
            work = max(per_kind[(table.moe[i], "none")] for i in layers)
            if group:  # a whole chunk of the uniform method is rebuilt at once
                work *= min(group, max(len(chunk) for chunk in chunks))
            acts += work
            detail["recompute_working_layer"] = int(work)
        elif recompute == "selective" and selective == "op_sac" and not every_nth and layers:
            # op-level SAC: the layer in its backward holds again what its recompute rebuilt
            work = max(per_kind[(table.moe[i], "none")] - per_kind[(table.moe[i], "selective")] for i in layers)
            acts += work
            detail["recompute_working_layer"] = int(work)
        if first:
            emb_acts = held[0] * (8 * tokens + (tokens * h / ts if lay.dropout else 0))
            acts += emb_acts
            detail["embedding_activations"] = int(emb_acts)
        # MTP blocks: their layer, its inputs and their own logits, where the layout puts them (else with the head)
        mtp_acts = arch.num_mtp_layers * (
            per_kind[(table.moe[arch.num_layers - 1], stored_mode)] + 4 * 2 * tokens * h / ts + logits_bytes
        ) if arch.num_mtp_layers and pipeline.mtp_trained and rank == pipeline.mtp_at else 0.0
        if last:
            out_acts = logits_bytes + mtp_acts
            acts += out_acts
            detail["logits_and_loss"] = int(out_acts)
        elif mtp_acts:
            acts += mtp_acts
            detail["mtp_activations"] = int(mtp_acts)
        other = other_fixed
        transient = acts
        walk = (gathered and conv.step_peak == "backward_walk" and not offload.activations and not group
                and job.lora is None)
        if walk:
            units, held_other = _walk_units(
                job, plan, conv, tensors, table, layers, layer_modes, per_kind, selective, every_nth, detail,
                first=first, last=last, dense_dp=dense_dp, expert_dp=expert_dp, norm_width=norm_width,
                layer_acts=detail["layer_activations"], emb_acts=detail.get("embedding_activations", 0),
                out_acts=detail.get("logits_and_loss", 0), tokens=tokens, vocab=vocab)
            moment = fsdp_step_peak(conv, units, held_other + detail.get("mtp_activations", 0),
                                    grads_absent=conv.grads_set_to_none and m == 1,
                                    reserve_fraction=card.allocator_reserve_fraction)
            acts = moment.activations
            absent = min(moment.absent_grads, states["gradients"])  # none on the GPU when offloaded to the host
            states["gradients"] -= absent
            detail["gathered_layers"] = int(moment.transient)
            detail["gradients_absent_at_peak"] = int(absent)
            detail["freed_gradients_reserved"] = int(freed_grads_reserved(conv, absent))
            walk_moments[rank] = moment.name
            other += moment.transient
            transient = acts + moment.transient
        elif gathered:
            # the stage's FSDP units in forward order: embedding, decoder layers, output layer (with the final norm)
            units = [detail["embedding_params"]] if first else []
            units += [table.tp_sharded[i] / tp + table.replicated[i] + table.experts[i] / (plan.ep * plan.etp)
                      for i in layers]
            units += [detail["output_layer_params"] + norm_width] if last else []
            detail["gathered_layers"] = int(gathered_transient(conv, units))
            other += detail["gathered_layers"]
            transient += detail["gathered_layers"]
        # the caching allocator reserves more than it hands out for what is freed and re-allocated every step
        detail["allocator_reserve"] = (int(card.allocator_reserve_fraction * transient)
                                       + detail.get("freed_gradients_reserved", 0))
        other += detail["allocator_reserve"]
        weights, grads, opt = (int(states[c]) for c in ("weights", "gradients", "optimizer"))
        total = weights + grads + opt + int(acts) + int(other)
        stages.append(StageMemory(
            stage=rank, layers=len(layers), weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt,
            activations_bytes=int(acts), other_bytes=int(other), total_bytes=total, detail=detail,
            host_bytes=int(host),
        ))

    peak = max(stages, key=lambda s: s.total_bytes)
    capacity = job.gpu.memory_bytes
    fit_bytes, fit_basis = fit_figure(stages, plan, card)
    assumptions = _assumptions(job, plan, conv_name, tensors, lay, m, vocab, expert_dp, dense_dp, card)
    if job.lora is not None:
        assumptions.append(lora_assumption(job, plan))
    if peak.stage in walk_moments:
        assumptions.append(_walk_assumption(conv, peak, walk_moments[peak.stage], m))
    # a node's GPUs usually share one pipeline stage (TP, EP and DP ranks fill a node first); the worst stage bounds it
    host_per_node = max(s.host_bytes for s in stages) * job.gpus_per_node
    if offload.any:
        assumptions.append(offload_assumption(job, plan, offload, host_per_node))
    return MemoryReport(
        model=arch.name, framework=job.framework, plan=plan, stages=stages, peak_bytes=peak.total_bytes,
        peak_stage=peak.stage, capacity_bytes=capacity, fits=fit_bytes <= capacity,
        headroom_bytes=capacity - fit_bytes, fit_bytes=fit_bytes, fit_basis=fit_basis,
        host_bytes_per_node=host_per_node,
        host_capacity_bytes=job.cpu_memory_per_node, assumptions=assumptions + job.notes, warnings=warnings,
    )


def fit_figure(stages: list[StageMemory], plan: Plan, card) -> tuple[int, str]:
    """(bytes, basis) that decide whether the job fits. Without expandable segments the reserved peak: cached free
    blocks of split segments cannot be handed back, so the reserve is what runs out. With them the allocator unmaps
    every cached free page and maps it where the failing allocation needs it before raising OOM (PyTorch
    CUDACachingAllocator.cpp, Note [Expandable Segments], release_cached_blocks -> unmap_block), so the allocated
    peak decides, plus the page rounding of the free ranges next to live blocks (cards/memory.yaml)."""
    figure = max(peak_fit_bytes(s.total_bytes, s.detail.get("allocator_reserve", 0), plan, card) for s in stages)
    return int(figure), "allocated" if plan.expandable_segments else "reserved"


def peak_fit_bytes(peak: float, reserve: float, plan: Plan, card) -> float:
    """The figure one peak that holds `reserve` bytes of allocator reserve fits by (fit_figure): the peak itself, or
    with expandable segments that peak less its reserve plus the page slack (cards/memory.yaml)."""
    return peak - reserve + card.expandable_segments_slack_bytes if plan.expandable_segments else peak


# --------------------------------------------------------------------------- torch FSDP2: when the step peaks


class FsdpUnit(NamedTuple):
    """One fully_shard unit of a stage, in forward order, for the backward walk (bytes per GPU)."""

    name: str
    params: float  # its parameters (all-gathered while it runs, reduce-scattered in its post_backward)
    stored: float  # what one micro-batch keeps for its backward (the output unit: the loss at its peak)
    working: float = 0.0  # what its backward rebuilds on top (recompute)
    grads: float = 0.0  # its sharded gradients (allocated by its reduce-scatter when the trainer freed them)
    in_loss: bool = False  # its reduce-scatter runs inside the chunked loss, once per chunk, its params gathered
    kept: float = 0.0  # what of its activations is alive at its reduce-scatter (in_loss: the chunk's logits)
    loss: bool = False  # its `stored` is the loss, which peaks before the unit's pre_backward hook fires


class StepMoment(NamedTuple):
    """A moment of the backward: activations alive, FSDP transient (gathered params, unsharded grads and their
    reduce-scatter input) and the sharded gradients not allocated yet."""

    name: str
    activations: float
    transient: float
    absent_grads: float


def fsdp_backward_moments(conv, units: list[FsdpUnit], held_other: float, grads_absent: bool) -> list[StepMoment]:
    """Every moment of the backward, unit by unit in reverse forward order, as torch's fully_shard runs it
    (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): in pre_backward the unit is all-gathered
    (`unsharded_param_bytes`) and the unit before it prefetched (`prefetched_bytes`), while its own saved activations
    and whatever its recompute rebuilds are alive, beside the saved activations of the units backward has not reached
    (`held_other`: other micro-batches in flight), and the reduce-scatter input of the unit reduced just before is still
    held (`retained_reduce_bytes`: post_backward keeps reduce_scatter_max_input_buffers = 1 until the next unit's
    post_backward recycles it); in post_backward its saved activations are freed, reshard() frees its parameters, and
    foreach_reduce copies its unsharded grads into the reduce-scatter input (`gathered_layers` x `gathered_bytes`).
    The output unit's loss peaks in the cross-entropy's backward, before the unit's pre_backward hook (registered on
    its outputs) fires, so nothing is prefetched yet; its parameters stay gathered from its forward
    (reshard_after_forward=False in torchtitan's apply_fsdp_to_decoder), unless the trainer resharded it after the
    forward (`output_resharded_at_loss`). A unit that reduces inside the chunked loss
    (`in_loss`) does so once per chunk with its parameters gathered, the previous chunk's reduce-scatter input held and
    the chunk's `kept` logits alive; its buffers are gone by the time the decoder's backward starts. With
    `grads_absent` (the trainer set the gradients to None; one micro-batch per step) a unit's sharded gradient exists
    only after its own reduce-scatter, so the units not yet reduced are absent. With `output_held_bytes` the output
    unit is the root module, whose forward inputs (token ids) need no gradient, so its post_backward waits for the
    end-of-backward callback: its gathered parameters and unsharded gradients stay through every later moment, and
    its reduce-scatter comes last, after the embedding's."""
    out = []
    root = units[-1] if units and units[-1].loss and conv.output_held_bytes else None
    for k in range(len(units) - 1, -1, -1):
        u = units[k]
        before = held_other + sum(v.stored for v in units[:k])
        prefetch = conv.prefetched_bytes * units[k - 1].params if k else 0.0
        held = conv.output_held_bytes * root.params if root and u is not root else 0.0
        absent = (sum(v.grads for v in units[:k + 1]) + (root.grads if held else 0.0)) if grads_absent else 0.0
        gathered = 0.0 if u.loss and conv.output_resharded_at_loss else conv.unsharded_param_bytes * u.params
        # the last reduce-scatter input still held: this unit's previous chunk, or the unit reduced just before
        last = u if u.in_loss else units[k + 1] if k + 1 < len(units) and not units[k + 1].in_loss else None
        retained = conv.retained_reduce_bytes * last.params if last and last is not root else 0.0
        out.append(StepMoment(f"{u.name} backward", before + u.stored + u.working,
                              gathered + (0.0 if u.loss else prefetch) + retained + held, absent))
        if u is root:
            continue
        reduce = conv.gathered_layers * conv.gathered_bytes * u.params + prefetch
        out.append(StepMoment(f"{u.name} reduce-scatter", before + u.kept,
                              reduce + (gathered + retained if u.in_loss else 0.0) + held, absent))
    if root:
        retained = conv.retained_reduce_bytes * units[0].params if len(units) > 1 else 0.0
        out.append(StepMoment(f"{root.name} reduce-scatter (end of backward)", held_other,
                              conv.gathered_layers * conv.gathered_bytes * root.params + retained,
                              root.grads if grads_absent else 0.0))
    return out


def fsdp_step_peak(conv, units: list[FsdpUnit], held_other: float, *, grads_absent: bool,
                   reserve_fraction: float) -> StepMoment:
    """The moment of the backward walk with the largest peak: activations and transient (plus the caching
    allocator's reserve over them, as the estimate counts it) less the gradients not allocated yet."""
    moments = fsdp_backward_moments(conv, units, held_other, grads_absent)
    return max(moments, key=lambda s: (1 + reserve_fraction) * (s.activations + s.transient) - s.absent_grads
               + freed_grads_reserved(conv, s.absent_grads))


def freed_grads_reserved(conv, absent: float) -> float:
    """The sharded gradients the trainer freed (zero_grad(set_to_none=True)) that the caching allocator still holds
    when the step peaks: fully_shard allocates each unit's sharded gradient, a view of its reduce-scatter output, in
    the reduce-scatter stream (torch _fsdp_collectives.py foreach_reduce), and a freed block goes back to the pool of
    the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp: free blocks are found by stream and size), so
    the default stream's activations and loss cannot reuse it. Reserved, not allocated (`freed_grads_stay_reserved`,
    cards/memory.yaml); with expandable segments the out-of-memory retry unmaps it, as the rest of the reserve."""
    return absent if conv.freed_grads_stay_reserved else 0.0


def _walk_units(job: Job, plan: Plan, conv, tensors, table: _ParamTable, layers: list[int], modes: dict[int, str],
                per_kind: dict, selective: str, every_nth: int, detail: dict[str, int], *, first: bool, last: bool,
                dense_dp: float, expert_dp: float, norm_width: int, layer_acts: float, emb_acts: float,
                out_acts: float, tokens: float, vocab: float) -> tuple[list[FsdpUnit], float]:
    """The stage's FSDP units in forward order (embedding on the first stage, each decoder layer, the output layer
    with the final norm on the last; torchtitan's apply_fsdp_to_decoder) with one micro-batch's activations each,
    and the activations of the other micro-batches in flight."""
    ep_etp = plan.ep * plan.etp

    def grads(dense: float, experts: float = 0.0) -> float:
        return (state_bytes(tensors, dense, dense_dp)["gradients"]
                + state_bytes(tensors, experts, expert_dp)["gradients"])

    units = []
    if first:
        emb = detail["embedding_params"]
        units.append(FsdpUnit("embedding", emb, emb_acts, grads=grads(emb)))
    one_batch = 0.0
    for i in layers:
        moe, mode = table.moe[i], modes[i]
        stored = per_kind[(moe, mode)]
        one_batch += stored
        if mode == "full":  # checkpointed: its backward rebuilds the layer's activations
            working = per_kind[(moe, "none")]
        elif mode == "selective" and selective == "op_sac":  # op-level SAC: what the recompute rebuilds
            working = per_kind[(moe, "none")] - stored
        else:
            working = 0.0
        dense = table.tp_sharded[i] / plan.tp + table.replicated[i]
        experts = table.experts[i] / ep_etp
        units.append(FsdpUnit(f"layer {i}", dense + experts, stored, working, grads(dense, experts)))
    if last:
        head = detail["output_layer_params"] + norm_width
        kept = 0.0
        if conv.output_reduce_in_loss:  # the chunk's loss tensors are freed but for its logits (and their gradient)
            logits = job_logits(conv, tokens, vocab, plan.tp)
            kept = out_acts - (conv.logits_bytes_per_element - conv.loss_reduce_bytes_per_element) * logits
        units.append(FsdpUnit("output layer and loss", head, out_acts, grads=grads(head),
                              in_loss=conv.output_reduce_in_loss, kept=kept, loss=True))
    return units, max(0.0, layer_acts - one_batch)


def job_logits(conv, tokens: float, vocab: float, tp: int) -> float:
    """Logits of one loss chunk on one GPU (memory_states.output_activations' count)."""
    return tokens / conv.loss_chunks * vocab / tp


def _walk_assumption(conv, stage: StageMemory, moment: str, m: int) -> str:
    """What the backward walk found on the peak stage."""
    grads = ("the trainer sets the gradients to None each step, so a unit's sharded gradients exist only after its "
             f"reduce-scatter ({stage.detail.get('gradients_absent_at_peak', 0) / GIB:.2f} GiB not yet allocated"
             + ("; still reserved: the caching allocator keeps the freed blocks in the reduce-scatter stream's pool)"
                if conv.freed_grads_stay_reserved else ")")
             if conv.grads_set_to_none and m == 1 else
             "every sharded gradient allocated" + (" (accumulated over the step's micro-batches)"
                                                   if conv.grads_set_to_none else " (zeroed in place, not freed)"))
    return (f"FSDP2 step peak walked unit by unit through the backward (cards/memory.yaml step_peak): stage "
            f"{stage.stage} peaks at the {moment} moment, {stage.activations_bytes / GIB:.2f} GiB of activations "
            f"and {stage.detail.get('gathered_layers', 0) / GIB:.2f} GiB of gathered parameters, unsharded gradients "
            f"and reduce-scatter input; {grads}.")


def offload_assumption(job: Job, plan: Plan, offload, host_per_node: int) -> str:
    """What the offload knobs did, in the framework's terms (cards/frameworks/*.yaml offload, cards/offload.yaml)."""
    parts = []
    moved = [f"{cls} {share:.0%}" for cls, share in offload.in_step.items() if share]
    if moved:
        parts.append("in the step on the host: " + ", ".join(moved)
                     + (f" (the CPU optimizer steps {offload.cpu_optimizer:.0%} of this GPU's shard, with fp32 "
                        "parameters, a gradient copy and Adam moments on the host)" if offload.cpu_optimizer else ""))
    if offload.phase:
        parts.append("between RL phases only (the training step's peak is unchanged): "
                     + ", ".join(sorted(offload.phase)))
    if offload.activations:
        parts.append("saved activations on the host except the layers in flight")
    return (f"Offload on {framework_card(job.framework).display_name}: " + "; ".join(parts)
            + f". Host memory per node: {host_per_node / GIB:,.1f} GiB (the worst stage x {job.gpus_per_node} GPUs)"
            + (f" of {job.cpu_memory_per_node / GIB:,.0f} GiB." if job.cpu_memory_per_node else "."))


def lora_states(job: Job, plan: Plan, tensors, layers: list[int], states: dict[str, float], dense_dp: float,
                expert_dp: float, detail: dict[str, int]) -> dict[str, float]:
    """A LoRA stage's model states: the frozen base keeps only its weight bytes (no gradient buffer, master copy or
    moments: Megatron's DDP and optimizer take only requires_grad parameters, as does torch's), and the adapters
    this rank holds (meshplan/arithmetic/lora.py) carry the convention's every tensor, sharded as the dense and expert
    parameters are."""
    from meshplan.arithmetic.lora import adapter_params, lora_engine

    assert job.lora is not None
    dense, experts = adapter_params(job.model, layers, job.lora, lora_engine(job.framework, plan.zero_stage),
                                    tp=plan.tp, ep=plan.ep, etp=plan.etp)
    out = {"weights": states["weights"], "gradients": 0.0, "optimizer": 0.0}
    for params, group in ((dense, dense_dp), (experts, expert_dp)):
        for cls, value in state_bytes(tensors, params, group).items():
            out[cls] += value
    detail["lora_adapter_params"] = int(dense + experts)
    return out


def lora_assumption(job: Job, plan: Plan) -> str:
    """What the LoRA estimate kept and left out."""
    from meshplan.arithmetic.lora import lora_engine

    assert job.lora is not None
    engine = lora_engine(job.framework, plan.zero_stage)
    how = engine.adapters if engine else "fused"
    return (f"LoRA rank {job.lora.rank} on {', '.join(job.lora.targets)} ({how} adapters): base weights frozen "
            "(weight bytes only, no gradients or optimizer state); adapters A (in x r) and B (r x out) sharded over "
            "TP as Megatron-Bridge's ParallelLinearAdapter shards them, with the full training states. Activations "
            "are kept as for full training (a frozen linear without an adapter need not save its input: an "
            "overestimate when not every linear is adapted).")


def _assumptions(job, plan, conv_name, tensors, lay, m, vocab, expert_dp, dense_dp, card) -> list[str]:
    sp = "/tp (sequence parallel)" if lay.sp else "replicated over TP (no sequence parallelism)"
    out = [
        f"Model states per parameter ({conv_name} convention, zero_stage {plan.zero_stage}): "
        f"{describe_tensors(tensors)}; 'sharded' = over dp*cp = {dense_dp}"
        + (f" for dense parameters and over expert-dp = world/(pp*ep*etp) = {expert_dp:g} for routed experts."
           if job.model.moe else "."),
        "Parameters per stage: its decoder layers (attention, MLP and shared experts / tp; norms and router "
        "replicated; routed experts / (ep*etp)); embedding on the first stage; output layer (a tied copy when "
        "pp > 1), final norm and MTP blocks on the last stage.",
        f"Vocabulary padded to {vocab} (multiple of {card.conventions[conv_name].vocab_pad_multiple}*tp)."
        if vocab != job.model.vocab_size else "Vocabulary not padded.",
        "Activations per layer after Korthikanti et al. 2022, generalised (GQA K/V of kv_heads*head_dim, gated "
        f"MLP fc1 output 2*ffn, MLA latents, MoE top-k rows + router + dispatch copies): tokens per GPU = "
        f"seq/cp * micro_batch = {lay.tokens}; norm and dropout tensors {sp}; the rest / tp.",
        "Attention: " + ("flash (no s^2 tensor; fp32 log-sum-exp kept)" if lay.flash
                         else "unfused (softmax" + (" + dropout mask/output" if lay.dropout else "") + " s^2 tensors)")
        + (", dropout masks kept." if lay.dropout else ", no dropout."),
        f"Recompute {plan.recompute}: "
        + {"none": "every tensor above is stored.",
           "selective": "core attention recomputed (its s^2 / log-sum-exp tensors are not stored).",
           "full": "only each recomputed layer's input is stored, plus one layer's full activations while it "
                   "is recomputed in the backward"
                   + (f" ({plan.recompute_layers} layers per chunk recomputed)." if plan.recompute_layers
                      is not None else ".")}[plan.recompute],
        ("Layers per stage balanced by compute as nanotron does (decoder layers and the output layer, "
         "models/base.py build_model), so the first stages hold more layers than L/pp."
         if card.conventions[conv_name].pipeline_partition == "compute_balanced" and plan.pp > 1
         and plan.first_stage_layers is None and plan.last_stage_layers is None
         else f"Layers per stage: the pipeline layout {plan.pipeline_layout!r} (its decoder layers t per stage)."
         if plan.pipeline_layout is not None
         else "Layers per stage: an even split with the embedding/loss counted as layers (the first/last stage "
              "one decoder layer lighter)." if plan.account_for_embedding or plan.account_for_loss
         else "Layers per stage: an even split (remainder on the first stages) unless first/last stage sizes "
              "are given."),
        f"Micro-batches in flight from the schedule ({m} micro-batches per step): "
        + ("1F1B, stage r holds min(m, pp - r)." if plan.vpp == 1 or plan.pp == 1 else
           "interleaved 1F1B, Megatron's warm-up (pp - r - 1)*2 + (vpp - 1)*pp forwards + 1, capped at m*vpp."),
        _loss_assumption(card.conventions[conv_name]),
        f"Other: fixed overhead {card.fixed_overhead_bytes / GIB:.2f} GiB (workspaces, communication buffers; "
        f"calibrated, cards/memory.yaml) + CUDA context {card.cuda_context_bytes / GIB:.2f} GiB (outside torch's "
        f"accounting) + the caching allocator's reserve, {card.allocator_reserve_fraction:.0%} of the memory freed "
        "and re-allocated every step (activations, logits, gathered layers): peak reserved, not just allocated"
        + (("; FSDP units gathered moment by moment through the backward (cards/memory.yaml step_peak)."
            if card.conventions[conv_name].step_peak == "backward_walk"
            else "; FSDP/ZeRO-3 gathered units at the worst unit's backward peak (cards/memory.yaml).")
           if any(t.shard == "dp" and t.tensor_class == "weights" for t in tensors) else "."),
        "Not modelled: CUDA-graph pools.",
    ]
    if job.model.moe is not None:
        out.append(routing_assumption(job, plan))
    if plan.expandable_segments:
        out.append(f"Fit decided by the allocated peak: with expandable segments the caching allocator unmaps its "
                   f"cached free pages before an out-of-memory error, so the reserve above is reported (what "
                   f"nvidia-smi and max_memory_reserved show) but does not decide; page rounding "
                   f"{card.expandable_segments_slack_bytes / (1 << 20):.0f} MiB is added instead (cards/memory.yaml).")
    if job.precision == "fp8":
        out.append(_fp8_assumption(with_precision(job, plan)[1], fp8_param_gather(job, plan)))
    if job.model.moe is not None and plan.moe_token_dispatcher == "flex":
        out.append("Flex dispatcher: DeepEP / HybridEP allocate their own NVLink and RDMA buffers outside "
                   "PyTorch's allocator; they are not counted (their size depends on the backend's settings).")
    return out


def _fp8_assumption(conv, gather: bool) -> str:
    """What fp8 keeps under this convention (cards/memory.yaml: fp8_weights, fp8_weight_bytes, fp8_saved_inputs)."""
    if conv.fp8_weights == "transformer_engine":
        weight = (f"fp8 primary weights in place of the bf16 ones ({conv.fp8_weight_bytes:+g} B per linear-layer "
                  "parameter)" if gather else f"{conv.fp8_weight_bytes:g} B of fp8 weight per linear-layer parameter "
                  "beside the bf16 one (Transformer Engine)")
    elif conv.fp8_weight_bytes:
        weight = f"{conv.fp8_weight_bytes:g} B of fp8 weight copy per linear-layer parameter"
    else:
        weight = "no fp8 weight kept between calls (cast per call" + (", all-gathered in fp8)" if gather else ")")
    inputs = ("linear-layer inputs saved in 1 byte" if conv.fp8_saved_inputs == "fp8"
              else "linear-layer inputs saved in bf16, as without fp8")
    return f"fp8: {weight}; {inputs}."


def _loss_assumption(conv) -> str:
    chunks = (f" of one of {conv.loss_chunks} sequence chunks at a time (the framework's chunked loss)"
              if conv.loss_chunks > 1 else " of the whole micro-batch")
    return (f"Last stage: output-layer input and logits/loss at {conv.logits_bytes_per_element:g} bytes per logit"
            f"{chunks} (bf16 logits and the cross-entropy's fp32 tensors at its peak; cards/memory.yaml).")


# --------------------------------------------------------------------------- for rules and search


def memory_summary(report: MemoryReport) -> MemorySummary:
    return MemorySummary(
        peak_bytes=report.peak_bytes, peak_stage=report.peak_stage, capacity_bytes=report.capacity_bytes,
        fits=report.fits, headroom_bytes=report.headroom_bytes, fit_bytes=report.fit_bytes, fit_basis=report.fit_basis,
        host_bytes_per_node=report.host_bytes_per_node,
    )


def ep_rank_load(job: Job, plan: Plan) -> float:
    """Routed tokens on the most loaded expert-parallel rank over the mean (job.moe_routing_imbalance), which the
    step waits for (time) and holds (memory). Megatron-Core's routing is dropless unless a capacity factor is set
    (moe_expert_capacity_factor, which meshplan's plans never set), so nothing caps it. With ep = 1 the one rank
    holds every expert: an imbalance moves tokens between its experts but not the rank's total, so 1.0."""
    return job.moe_routing_imbalance if job.model.moe is not None and plan.ep > 1 else 1.0


def routing_assumption(job: Job, plan: Plan) -> str:
    """The assumptions line saying which routing imbalance the figures use."""
    load = ep_rank_load(job, plan)
    if load == 1.0 and job.moe_routing_imbalance > 1.0:
        return (f"Routing imbalance {job.moe_routing_imbalance:g} given, no effect at ep=1: the one expert-parallel "
                "rank holds every expert, so its routed tokens are the mean.")
    if load == 1.0:
        return ("Routing balanced (moe_routing_imbalance 1.0): every expert-parallel rank routed the mean token "
                "count, as NVIDIA's benchmark recipes force (moe_router_force_load_balancing); real routing is "
                "seldom that even, pass moe_routing_imbalance to see its cost.")
    return (f"Routing imbalance {load:g}: the most loaded expert-parallel rank computes, permutes, receives and keeps "
            f"{load:g}x the mean routed tokens (dropless, no capacity factor caps it); the step waits for it.")


def every_nth_blocks(plan: Plan) -> int:
    """N of torchtitan 0.2.x's per-layer selective AC (every N-th block fully checkpointed), 0 when the plan uses
    op-level SAC or no selective recompute."""
    option = plan.selective_ac_option
    return int(option) if plan.recompute == "selective" and option not in (None, "op") else 0


def uniform_group(plan: Plan) -> int:
    """Layers per checkpointed chunk under Megatron's uniform full recompute with recompute_layers > 1 (0: one
    layer per chunk, or another method)."""
    if plan.recompute != "full" or plan.recompute_method != "uniform" or (plan.recompute_layers or 1) <= 1:
        return 0
    return plan.recompute_layers or 0
