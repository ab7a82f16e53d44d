"""One pipeline stage's memory per GPU, step by step: the parameters it holds (memory_terms.stage_params), their
model states (Muon's one momentum, LoRA's frozen base, fp8 weight copies), the activations of the micro-batches
it keeps in flight, what the offload knobs move to the host, the layer being recomputed in the backward, the
embedding, MTP and loss activations, the FSDP/ZeRO-3 gathered units (or FSDP2's backward walk, fsdp_walk.py) and
the caching allocator's reserve.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter
from typing import NamedTuple

from meshplan.arithmetic.lora import adapter_params, lora_engine
from meshplan.arithmetic.memory_states import (
    Convention,
    accumulated_grad_bytes,
    decoupled_grads,
    experts_in_units,
    frozen_gathered_transient,
    gathered_transient,
    keeps_units,
    lazy_state_bytes,
    optimizer_step_temporaries,
    pipeline_held,
    state_bytes,
    step_segment_bytes,
)
from meshplan.arithmetic.offload import offload_stage
from meshplan.arithmetic.schedule import in_flight
from meshplan.estimate.fsdp_walk import WalkStage, freed_grads_reserved, stage_step_peak
from meshplan.estimate.layer_records import scope_memo
from meshplan.estimate.memory_terms import (
    MEMORY_PER_PLAN_FIELDS,
    PIPELINE_SHAPE_FIELDS,
    STATES_BY_SIZE_FIELDS,
    STATES_UNREAD_FIELDS,
    MemoryTerms,
    StageParams,
    layer_on_rank,
    param_table,
    stage_params,
    vision_weight_bytes,
)
from meshplan.estimate.muon_memory import muon_saved, muon_step_bytes
from meshplan.estimate.recompute import recomputed_layers
from meshplan.knowledge.gdn_config import pipeline_unit
from meshplan.knowledge.model_counts import per_architecture
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Plan
from meshplan.schema.reports import StageMemory

STEP_MOMENT = "optimizer step"


class StageResult(NamedTuple):
    """A stage's memory, and the moment it peaks at where the convention walks the backward or the optimizer step
    decides (else None); the moment of its allocated peak, where that is another one."""

    memory: StageMemory
    moment: str | None
    allocated_moment: str | None = None


class HeldActivations(NamedTuple):
    """The decoder layers' activations of the micro-batches a stage holds at its peak."""

    bytes: float
    held: tuple[int, ...]  # micro-batches in flight per virtual chunk
    modes: dict[int, str]  # the recompute mode each layer ran in (one micro-batch), for the backward walk


class Overheads(NamedTuple):
    """What a stage holds beside its model states at one moment of the step: activations, and the fixed and
    transient rest, less the sharded gradients not allocated yet."""

    activations: float
    other: float
    transient: float  # what is freed and re-allocated every step
    moment: str | None
    absent: float = 0.0  # sharded gradients not allocated at this moment (FSDP2's walk, grads set to None)
    freed_reserved: float = 0.0  # of those, what the caching allocator still holds (fsdp_walk.freed_grads_reserved)
    gathered: float | None = None  # FSDP/ZeRO-3 gathered units at this moment (detail gathered_layers)
    step_temporaries: float = 0.0  # what optimizer.step() allocates (the optimizer step moment)
    accumulated: float = 0.0  # unsharded gradients held between micro-batches (memory_states.accumulated_grad_bytes)
    # the optimizer step moment's segments of their own (memory_states.step_segment_bytes), and what the backward left
    # reserved beneath them beyond this moment's allocated bytes and reserve (with_backward_cache)
    segments: float = 0.0
    cached: float = 0.0


class StageStates(NamedTuple):
    """What of a stage no micro-batch or recompute field changes (memory_terms.MEMORY_PER_PLAN_FIELDS): its
    parameters, their model states and the report's detail of them, the optimizer step's moment and the optimizer
    state allocated inside the first step. Shared by the plans of a layout: no caller mutates it."""

    params: StageParams
    states: dict[str, float]
    detail: dict[str, int]  # the first entries of the stage's detail, in order
    step: Overheads  # step_moment
    lazy: float  # lazy_optimizer_state
    gathered: float  # gathered_units where the weights are sharded (terms.gathered), else 0


def stage_states(terms: MemoryTerms, rank: int, chunks) -> StageStates:
    """StageStates of pipeline stage `rank` (`chunks`: the layout's, terms.pipeline.chunks[rank]), once per rank of
    the terms' layout (terms.stages), and inside a shared_layers scope once per states_key: a stage of another rank
    or layout with the same key gives the same states, only its params' layers are this stage's own."""
    hit = terms.stages.get(rank)
    if hit is None:
        memo = scope_memo("stage_states")
        key = states_key(terms, rank, chunks) if memo is not None else None
        shared = memo.get(key) if memo is not None else None
        if shared is None:
            hit = _stage_states(terms, rank, chunks)
            if memo is not None:
                memo[key] = (terms.job, hit)  # the entry keeps the job alive, so its id stays its own
        else:
            same = shared[1]
            hit = StageStates(StageParams(list(chain.from_iterable(chunks)), *same.params[1:]), *same[1:])
        terms.stages[rank] = hit
    return hit


def _stage_states(terms: MemoryTerms, rank: int, chunks) -> StageStates:
    detail: dict[str, int] = {}
    params = stage_params(terms, rank, chunks)
    if params.first:
        detail["embedding_params"] = params.embedding
    if params.last:
        detail["output_layer_params"] = params.output_layer
    if params.mtp:
        detail["mtp_params"] = params.mtp_params
    states = model_states(terms, params, detail)
    return StageStates(params, states, detail, step_moment(terms, params, states), lazy_optimizer_state(terms, params),
                       gathered_units(terms, params) if terms.gathered else 0.0)


_STATES_FIELDS = tuple(name for name in Plan.model_fields if name not in MEMORY_PER_PLAN_FIELDS
                       and name not in PIPELINE_SHAPE_FIELDS | STATES_BY_SIZE_FIELDS | STATES_UNREAD_FIELDS)
_STATES_KEY = itemgetter(*_STATES_FIELDS)  # every one a hashable value (Plan's only list field is left out)


def states_key(terms: MemoryTerms, rank: int, chunks) -> tuple:
    """What a stage's StageStates read: the job, the plan's fields but the per-plan, pipeline-shape and unread ones
    (MEMORY_PER_PLAN_FIELDS, PIPELINE_SHAPE_FIELDS, STATES_UNREAD_FIELDS), the data-parallel sizes in place of the
    fields read only through them (STATES_BY_SIZE_FIELDS), whether the stage holds the embedding, the output layer
    and the MTP blocks (memory_terms.stage_params' tests), and its layers in order by value (layer_classes: every
    per-layer term of the states is read from the ParamTable columns those compare); a LoRA job's by index (its
    adapters are counted per layer, arithmetic/lora.adapter_params)."""
    pipeline, arch = terms.pipeline, terms.job.model
    layers = tuple(chain.from_iterable(chunks))
    mtp = bool(arch.num_mtp_layers and pipeline.mtp_trained and rank == pipeline.mtp_at)
    by_value = layers if terms.job.lora is not None else tuple(map(layer_classes(arch).__getitem__, layers))
    return (id(terms.job), _STATES_KEY(terms.plan.__dict__), terms.dense_dp, terms.expert_dp, rank == 0,
            rank == pipeline.head_rank, mtp, by_value)


@per_architecture
def layer_classes(arch: Architecture) -> tuple[int, ...]:
    """Per decoder layer, a number shared by exactly the layers whose ParamTable entries (TP-sharded, replicated,
    routed-expert and linear parameters, MoE or not) are all equal."""
    table, seen = param_table(arch), {}
    rows = zip(table.tp_sharded, table.replicated, table.experts, table.linear_dense, table.moe, strict=True)
    return tuple(seen.setdefault(row, len(seen)) for row in rows)


def stage_memory(terms: MemoryTerms, rank: int, chunks) -> StageResult:
    """The memory per GPU of pipeline stage `rank` (its virtual chunks' layers in `chunks`: terms.pipeline's)."""
    peak = stage_peak(terms, rank, chunks)
    params, detail, moments, allocs, rest = peak.params, peak.detail, peak.moments, peak.allocs, peak.rest
    allocated = moments[peak.top]
    detail["allocated_peak"] = int(allocs[peak.top])
    detail["first_iteration_allocated_peak"] = int(first_iteration_allocated(terms, params, moments, allocs,
                                                                             peak.lazy))
    if rest.gathered is not None:
        detail["gathered_layers"] = int(rest.gathered)
    if moments[-1].step_temporaries:
        detail["optimizer_step_temporaries"] = int(moments[-1].step_temporaries)
    if moments[-1].segments:  # the step's tensors in segments of their own, over the backward's reserve
        detail["optimizer_step_segments"] = int(moments[-1].segments)
        detail["backward_reserve_at_step"] = int(moments[-1].cached)
    if any(o.moment is not None and o.moment != STEP_MOMENT for o in moments):  # FSDP2's walk
        detail["gradients_absent_at_peak"] = int(rest.absent)
        detail["freed_gradients_reserved"] = int(rest.freed_reserved)
    if rest.accumulated:
        detail["unsharded_accumulated_gradients"] = int(rest.accumulated)
    total = peak_total(terms, peak.states, rest)
    detail["allocator_reserve"] = total.reserve
    memory = StageMemory(
        stage=rank, layers=len(params.layers), weights_bytes=total.weights, gradients_bytes=total.gradients,
        optimizer_bytes=total.optimizer, activations_bytes=int(rest.activations), other_bytes=int(total.other),
        total_bytes=total.total, detail=detail, host_bytes=int(peak.host),
    )
    return StageResult(memory, rest.moment, allocated.moment if allocated is not rest else None)


class StagePeak(NamedTuple):
    """A stage's moments and the ones it peaks at (stage_peak), before its report is written."""

    params: StageParams
    states: dict[str, float]  # on the GPU, after what the offload knobs move
    detail: dict[str, int]  # the report's detail so far
    host: float
    moments: list[Overheads]  # the backward's candidates, then the optimizer step's
    allocs: list[float]  # each moment's allocated bytes
    rest: Overheads  # the reserved peak's moment
    top: int  # the allocated peak's moment (index)
    lazy: float


def stage_peak(terms: MemoryTerms, rank: int, chunks) -> StagePeak:
    """Stage `rank`'s model states, activations and moments, and the moments of its reserved and allocated peaks."""
    shared = stage_states(terms, rank, chunks)
    params, states, detail = shared.params, shared.states, dict(shared.detail)
    acts = held_activations(terms, rank, chunks, walks(terms))  # the modes only for FSDP2's walk (_overheads)
    detail["microbatches_in_flight"] = sum(acts.held)
    detail["layer_activations"] = int(acts.bytes)
    stored, host = acts.bytes, 0.0
    if terms.offload.any:
        states, stored, host = _offloaded(terms, params, states, stored, detail, acts.held)
    work = recompute_working_layer(terms, params, chunks)
    if work is not None:
        stored += work
        detail["recompute_working_layer"] = int(work)
    stored = _edge_activations(terms, params, acts.held, stored, detail)
    moments = _overheads(terms, params, acts, states, stored, detail, shared.gathered)
    # the reported moment: the reserved peak; the allocated peak is found at its own moment
    allocs = [allocated_bytes(terms, states, o) for o in moments]  # each moment's allocated bytes, once
    reserved = [reserved_bytes(terms, states, o, a) for o, a in zip(moments, allocs, strict=True)]
    step = with_backward_cache(terms, states, shared.step, max(reserved))
    moments.append(step)
    allocs.append(allocated_bytes(terms, states, step))
    reserved.append(reserved_bytes(terms, states, step, allocs[-1]))
    rest = moments[reserved.index(max(reserved))]  # the first of the largest, as max() picks
    return StagePeak(params, states, detail, host, moments, allocs, rest, allocs.index(max(allocs)), shared.lazy)


class StageFit(NamedTuple):
    """What memory_fit reads of a stage's report (stage_fit): its total, allocated peak and host bytes, and the
    moment of its reserved peak."""

    total: int
    allocated: int
    host: int
    moment: str | None


def stage_fit(terms: MemoryTerms, rank: int, chunks) -> StageFit:
    """stage_memory's total_bytes, detail allocated_peak, host_bytes and moment, without its report."""
    if not terms.offload.any and not walks(terms):
        return _plain_fit(terms, rank, chunks)
    peak = stage_peak(terms, rank, chunks)
    return StageFit(peak_total(terms, peak.states, peak.rest).total, int(peak.allocs[peak.top]), int(peak.host),
                    peak.rest.moment)


def _plain_fit(terms: MemoryTerms, rank: int, chunks) -> StageFit:
    """stage_fit of a stage with nothing offloaded and no FSDP2 walk, inside a shared_layers scope once per
    plain_fit_key (_plain_stage_fit: the same StageFit for the same key)."""
    shared = stage_states(terms, rank, chunks)
    memo = scope_memo("stage_fits")
    if memo is None:
        return _plain_stage_fit(terms, shared, rank, chunks)
    key = plain_fit_key(terms, shared, rank, chunks)
    hit = memo.get(key)
    if hit is None:  # the entry keeps the states and activations dicts alive, so their ids stay their own
        hit = memo[key] = (shared.states, terms.per_kind, _plain_stage_fit(terms, shared, rank, chunks))
    return hit[2]


def plain_fit_key(terms: MemoryTerms, shared: StageStates, rank: int, chunks) -> tuple:
    """What _plain_stage_fit reads of a stage beside what its StageStates pins: the states' memo entry (the states
    dict's id: one per stage_states entry, so one job, its states_key's plan fields, ends and layers by value in
    order), the layers per virtual chunk (with those, each chunk's layers by value), the micro-batches held per
    chunk, one layer's activations per kind and mode (the dict's id: per_kind_activations gives one per value), the
    micro-batches per step (the unsharded gradients held between them, memory_states.accumulated_grad_bytes), the
    recompute fields and switches the activations' and working layer's modes read, and the micro-batch's tokens,
    dropout and logits bytes (the edge activations: the activations dict's Layout pins them too, they are kept
    explicit); the rest (the sequence-parallel split, the gathered layers, the fixed overhead, the recompute flavour)
    follows from the job and the states' plan fields."""
    plan = terms.plan
    return (id(shared.states), tuple(map(len, chunks)), stage_held(terms, rank), id(terms.per_kind), terms.m,
            plan.recompute, plan.recompute_layers, plan.recompute_method, terms.group, terms.every_nth, terms.tokens,
            terms.lay.dropout, terms.logits_bytes)


def _plain_stage_fit(terms: MemoryTerms, shared: StageStates, rank: int, chunks) -> StageFit:
    """_plain_fit computed: stage_peak's sums in its order without the report's detail or the layers' modes. Its
    moments are the backward's one (_overheads: every activation, and the gathered units where the weights are
    sharded) and the optimizer step's; the reserved peak is the first of the larger (as max() and index() pick in
    stage_peak), the allocated peak the larger; no host bytes."""
    params, states = shared.params, shared.states
    acts = held_activations(terms, rank, chunks, False)
    stored = acts.bytes
    work = recompute_working_layer(terms, params, chunks)
    if work is not None:
        stored += work
    stored = _edge_activations(terms, params, acts.held, stored, {})
    back = _overheads(terms, params, acts, states, stored, {}, shared.gathered)[0]
    alloc_back = allocated_bytes(terms, states, back)
    reserved_back = reserved_bytes(terms, states, back, alloc_back)
    step = with_backward_cache(terms, states, shared.step, reserved_back)
    alloc_step = allocated_bytes(terms, states, step)
    rest = back if reserved_back >= reserved_bytes(terms, states, step, alloc_step) else step
    return StageFit(peak_total(terms, states, rest).total, int(max(alloc_back, alloc_step)), 0, rest.moment)


class PeakTotal(NamedTuple):
    """A stage's report figures when moment `o` is its reserved peak (peak_total)."""

    weights: int
    gradients: int
    optimizer: int
    reserve: int  # the allocator's reserve (detail allocator_reserve)
    other: float  # the fixed and transient rest with that reserve
    total: int


def peak_total(terms: MemoryTerms, states: dict[str, float], o: Overheads) -> PeakTotal:
    """The stage's model states, allocator reserve, other bytes and total at moment `o` (its reserved peak): the
    gradients less those not allocated yet, and the caching allocator's reserve over what is freed and re-allocated
    every step plus the freed gradients it keeps and, at a step whose tensors take segments of their own, the
    backward's cache beneath them (with_backward_cache); the unsharded gradients held between micro-batches are
    gradients."""
    reserve = int(terms.card.allocator_reserve_fraction * o.transient) + int(o.freed_reserved) + int(o.cached)
    other = o.other + reserve
    weights, opt = int(states["weights"]), int(states["optimizer"])
    grads = int(states["gradients"] - o.absent) + int(o.accumulated)
    return PeakTotal(weights, grads, opt, reserve, other, weights + grads + opt + int(o.activations) + int(other))


def allocated_bytes(terms: MemoryTerms, states: dict[str, float], o: Overheads) -> float:
    """What torch's allocator hands out at moment `o` (with the fixed overhead and CUDA context, as the total)."""
    return (int(states["weights"]) + int(int(states["gradients"]) - o.absent) + int(o.accumulated)
            + int(states["optimizer"]) + int(o.activations) + int(o.other))


def reserved_bytes(terms: MemoryTerms, states: dict[str, float], o: Overheads,
                   allocated: float | None = None) -> float:
    """What the caching allocator holds at moment `o`: the allocated bytes, its reserve over what churns every step,
    the freed gradients it keeps in the reduce-scatter stream's pool and the backward's cache beneath a step's own
    segments (`allocated`: allocated_bytes at `o`, when the caller has it)."""
    if allocated is None:
        allocated = allocated_bytes(terms, states, o)
    return (allocated + int(terms.card.allocator_reserve_fraction * o.transient)
            + int(o.freed_reserved) + int(o.cached))


def step_moment(terms: MemoryTerms, params: StageParams, states: dict[str, float]) -> Overheads:
    """The moment of optimizer.step(): every gradient allocated, the activations gone, and what the step of the
    framework's implementation allocates on top (memory_states.optimizer_step_temporaries), over the parameters this
    GPU's optimizer steps (its shard where the optimizer is sharded, less what the CPU optimizer steps); under Muon
    also its working set on the largest matrix (muon_step_bytes), and the segments of their own its whole-partition
    tensors take (memory_states.step_segment_bytes; with_backward_cache adds the backward's reserve beneath them). A
    LoRA job's adapters are left out (none)."""
    temp = segments = 0.0
    if terms.job.lora is None:
        stepped = (params.dense / terms.dense_dp + params.experts / terms.expert_dp if terms.optimizer_sharded
                   else params.dense + params.experts) * (1 - terms.offload.cpu_optimizer)
        temp = optimizer_step_temporaries(
            terms.step, terms.tensors, stepped=stepped, largest_tensor=largest_tensor(terms, params),
            zero_stage=terms.plan.zero_stage, decoupled=decoupled_grads(terms.job, terms.plan),
        ) + muon_step_bytes(terms, params)
        segments = step_segment_bytes(terms.step, stepped=stepped, zero_stage=terms.plan.zero_stage,
                                      largest_tensor=largest_tensor(terms, params, per_shard=False))
    return Overheads(0.0, terms.other_fixed + temp, temp, STEP_MOMENT, gathered=0.0 if terms.gathered else None,
                     step_temporaries=temp, segments=segments)


def with_backward_cache(terms: MemoryTerms, states: dict[str, float], step: Overheads, backward: float) -> Overheads:
    """The optimizer step's moment `step` where its whole-partition tensors take segments of their own
    (Overheads.segments, memory_states.step_segment_bytes): the caching allocator hands no segment back inside a
    step, so what it reserved at the backward's reserved peak (`backward`: reserved_bytes there) stays reserved
    and the step's own segments come on top; at least the step's own reserved figure. Unchanged where it has
    none."""
    if not step.segments:
        return step
    own = reserved_bytes(terms, states, step)
    return step._replace(cached=max(0.0, backward + step.segments - own))


def first_iteration_allocated(terms: MemoryTerms, params: StageParams, moments: list[Overheads],
                              allocs: list[float], lazy: float | None = None) -> float:
    """The allocated peak of the first iteration, what a peak read after iteration 1 shows: an implementation that
    allocates its optimizer state inside the first step (cards/memory.yaml optimizer_steps state_allocated) runs the
    first forward and backward without it, so the backward's moments count that much less, and the first step's
    moment counts it whole (`moments`/`allocs`: the stage's moments, the step's last, and their allocated bytes;
    `lazy`: lazy_optimizer_state, where the caller has it)."""
    if lazy is None:
        lazy = lazy_optimizer_state(terms, params)
    backward = [a - lazy for o, a in zip(moments, allocs, strict=True) if o.moment != STEP_MOMENT]
    step = [a for o, a in zip(moments, allocs, strict=True) if o.moment == STEP_MOMENT]
    return max(backward + step)


def lazy_optimizer_state(terms: MemoryTerms, params: StageParams) -> float:
    """The optimizer-state bytes this GPU allocates inside the first step (memory_states.lazy_state_bytes): the
    moments (and, under Megatron's precision-aware optimizer, the master FusedAdam holds) over its dense and expert
    parameters (a LoRA job's: its adapters), each sharded over its group, less what Muon does not keep, less the
    share the optimizer keeps on the host."""
    plan, tensors, step = terms.plan, terms.tensors, terms.step
    if step.state_allocated != "first_step":
        return 0.0
    if terms.job.lora is not None:
        dense, experts = adapter_params(terms.job.model, params.layers, terms.job.lora,
                                        lora_engine(terms.job.card, plan.zero_stage),
                                        tp=plan.tp, ep=plan.ep, etp=plan.etp, mtp=params.mtp)
        kept = 0.0
    else:
        dense, experts = params.dense, params.experts
        kept = muon_saved(terms, params)
    decoupled = decoupled_grads(terms.job, plan)
    lazy = (lazy_state_bytes(step, tensors, dense, terms.dense_dp, decoupled)
            + lazy_state_bytes(step, tensors, experts, terms.expert_dp, decoupled) - kept)
    return lazy * (1 - terms.offload.in_step.get("optimizer", 0.0))


def largest_tensor(terms: MemoryTerms, params: StageParams, per_shard: bool = True) -> float:
    """The stage's largest parameter tensor on this GPU (the per-tensor loop's step): the embedding or output table, a
    dense MLP projection (ffn x hidden / tp) or a MoE layer's routed-expert projection held as one 3-D tensor (local
    experts x expert ffn x hidden / etp), over its sharding group where the optimizer is sharded (and `per_shard`;
    unsharded: the tensor as the model holds it, its gradient's elements)."""
    arch, plan, moe = terms.job.model, terms.plan, terms.table.moe
    dense = [params.embedding, params.output_layer]
    experts = [0.0]
    kinds = {moe[i] and arch.moe is not None for i in params.layers}  # every MoE layer's is the same size, as a dense's
    if True in kinds:
        experts.append(arch.moe.num_experts / plan.ep * arch.moe.expert_ffn_hidden_size
                       * arch.moe.expert_width(arch.hidden_size) / plan.etp)
    if False in kinds:
        dense.append(arch.ffn_hidden_size * arch.hidden_size / plan.tp)
    if not terms.optimizer_sharded or not per_shard:
        return max(*dense, *experts)
    return max(max(dense) / terms.dense_dp, max(experts) / terms.expert_dp)


def model_states(terms: MemoryTerms, params: StageParams, detail: dict[str, int]) -> dict[str, float]:
    """Weights, gradients and optimizer bytes per GPU: the convention's tensors over the dense and the expert
    parameters, each sharded over its own data-parallel group."""
    tensors, conv = terms.tensors, terms.conv
    dense, experts = params.dense, params.experts
    states = state_bytes(tensors, dense, terms.dense_dp)
    for cls, value in state_bytes(tensors, experts, terms.expert_dp).items():
        states[cls] += value
    # Muon: one momentum instead of Adam's two on the decoder's (and MTP's) matrices; the output layer stays on Adam
    states["optimizer"] -= muon_saved(terms, params)
    if terms.job.lora is not None:  # LoRA: the frozen base keeps its weights only, the adapters carry every state
        states = lora_states(terms, params, states, detail)
    vision = vision_weight_bytes(terms, params, detail)
    states["weights"] += vision.bytes
    if terms.job.precision == "fp8" and conv.fp8_weight_bytes:
        fp8_params = fp8_weight_params(conv, params)
        if conv.fp8_weights_sharded:  # Megatron-FSDP's fp8 primary weights: the rank's shard of each
            fp8_params = (fp8_params - params.experts) / terms.dense_dp + params.experts / terms.expert_dp
        states["weights"] += conv.fp8_weight_bytes * fp8_params
        detail["fp8_weight_copies"] = int(conv.fp8_weight_bytes * fp8_params)
    detail["params_on_gpu"] = int(dense + experts)
    # the parameters whose stored weights this GPU holds: their shard where the weights are sharded (ZeRO-3, FSDP),
    # as a model built the same way keeps them (the RL step's reference model: rl/memory.reference_bytes)
    sharded = any(t.tensor_class == "weights" and t.shard == "dp" for t in tensors)
    detail["weight_params"] = int(dense / terms.dense_dp + experts / terms.expert_dp if sharded else dense + experts)
    detail["weight_params"] += int(vision.params / terms.dense_dp if sharded else vision.params)
    return states


def fp8_weight_params(conv: Convention, params: StageParams) -> float:
    """The rank's parameters that take the convention's fp8 weight bytes (an fp8 copy, or with fp8 primary weights
    the fp8 weight in place of the bf16 one, frozen or trained alike): its linear layers, less the output layer where
    those weights are Transformer Engine's, as Megatron-Core builds that layer as tensor_parallel.ColumnParallelLinear,
    no TE module, so fp8_autocast and fp8_model_init leave its weight bf16 (NVIDIA/Megatron-LM d98e8a6
    megatron/core/models/gpt/gpt_model.py; its TE head, TELMHeadColumnParallelLinear, only with fp8_output_proj under
    mxfp8, not modelled), as the distributed optimizer's all-gather counts it
    (sharding_traffic.optimizer_gather_bytes)."""
    return params.linear - (params.head if conv.fp8_weights == "transformer_engine" else 0.0)


def lora_states(terms: MemoryTerms, params: StageParams, states: dict[str, float],
                detail: dict[str, int]) -> dict[str, float]:
    """A LoRA stage's model states: the frozen base keeps only its weight bytes (no gradient buffer, master copy or
    moments: Megatron's DDP and optimizer take only requires_grad parameters, as does torch's), and the adapters
    this rank holds (meshplan/arithmetic/lora.py) carry the convention's every tensor, sharded as the dense and expert
    parameters are."""
    job, plan = terms.job, terms.plan
    assert job.lora is not None
    dense, experts = adapter_params(job.model, params.layers, job.lora, lora_engine(job.card, plan.zero_stage),
                                    tp=plan.tp, ep=plan.ep, etp=plan.etp, mtp=params.mtp)
    out = {"weights": states["weights"], "gradients": 0.0, "optimizer": 0.0}
    for count, group in ((dense, terms.dense_dp), (experts, terms.expert_dp)):
        for cls, value in state_bytes(terms.tensors, count, group).items():
            out[cls] += value
    detail["lora_adapter_params"] = int(dense + experts)
    return out


def held_activations(terms: MemoryTerms, rank: int, chunks, modes: bool = True) -> HeldActivations:
    """Each layer's activations in the mode the plan's recompute runs it in, times the micro-batches its chunk
    holds at the stage's peak (the schedule's in_flight). `modes`: whether the caller reads the modes (FSDP2's walk);
    without, a one-mode stage leaves them empty."""
    plan, per_kind, group, every_nth = terms.plan, terms.per_kind, terms.group, terms.every_nth
    held = stage_held(terms, rank)
    if not (group or every_nth) and (plan.recompute != "full" or plan.recompute_layers is None
                                     or plan.recompute_method == "uniform"):
        return _one_mode_activations(terms, chunks, held, "full" if plan.recompute == "full" else terms.stored_mode,
                                     modes)
    acts = 0.0
    built = 0
    modes: dict[int, str] = {}
    for chunk, count in zip(chunks, held, strict=True):
        chunk_bytes = 0.0
        for pos, i in enumerate(chunk):
            built += 1
            mode = terms.stored_mode
            full = plan.recompute == "full" and pos < recomputed_layers(plan, len(chunk))
            if full and group and pos % group:
                continue  # inside a checkpointed chunk (memory.checkpoint_group): only its first input is kept
            if full:
                mode = "full"
            elif every_nth:
                # torchtitan 0.2.x selective_ac_option N: the k-th block built on a rank (k from 1, over its
                # chunks) is fully checkpointed when k % N == 0 (activation_checkpoint.py _apply_layer_sac)
                mode = "full" if built % every_nth == 0 else "none"
            modes[i] = mode
            chunk_bytes += per_kind[(terms.table.kind[i], mode)]
        acts += count * chunk_bytes
    return HeldActivations(acts, held, modes)


def stage_held(terms: MemoryTerms, rank: int) -> tuple[int, ...]:
    """Micro-batches stage `rank` holds at its peak per virtual chunk (the schedule's in_flight), once per
    (micro-batch size, rank) of the terms' layout (terms.held): of MEMORY_PER_PLAN_FIELDS only the micro-batch size
    reaches them (through the micro-batches per step)."""
    plan = terms.plan
    key = (plan.micro_batch_size, rank)
    hit = terms.held.get(key)
    if hit is None:
        runs = plan.schedule_runs(terms.job.global_batch_size)  # the schedule's micro-batches are one run's
        hit = terms.held[key] = in_flight(rank, plan.pp, terms.vpp, terms.m // runs,
                                          terms.job.card.pipeline.group, plan.runs_schedule)
    return hit


def _one_mode_activations(terms: MemoryTerms, chunks, held: tuple[int, ...], mode: str,
                          modes: bool = True) -> HeldActivations:
    """held_activations where every layer runs in one recompute mode (no uniform chunks, no every-N-th block, no
    full recompute of only the first layers): the same sums, layer by layer in order (the modes only if `modes`)."""
    kind, per_kind = terms.table.kind, terms.per_kind
    if terms.table.arch.layer_pattern is None:  # MoE or not
        bytes_of = {False: per_kind[(False, mode)], True: per_kind[(True, mode)]}
    else:  # a hybrid's layer kinds
        bytes_of = {k: v for (k, m), v in per_kind.items() if m == mode}
    acts = 0.0
    for chunk, count in zip(chunks, held, strict=True):
        chunk_bytes = 0.0
        for i in chunk:
            chunk_bytes += bytes_of[kind[i]]
        acts += count * chunk_bytes
    return HeldActivations(acts, held, dict.fromkeys(chain.from_iterable(chunks), mode) if modes else {})


def _offloaded(terms: MemoryTerms, params: StageParams, states: dict[str, float], acts: float,
               detail: dict[str, int], held: tuple[int, ...] = (1,)) -> tuple[dict[str, float], float, float]:
    """(states, activations, host bytes) after the offload knobs move what they move to host memory (the layer-wise
    offload's layers in the stage's order, over the micro-batches its chunks hold: `held`)."""
    if terms.optimizer_sharded:
        optimizer_params = params.dense / terms.dense_dp + params.experts / terms.expert_dp
    else:
        optimizer_params = params.dense + params.experts
    largest = max((terms.per_kind[(terms.table.kind[i], terms.stored_mode)] for i in params.layers), default=0.0)
    layer_bytes = decoder_layer_bytes(terms, params) if terms.offload.layers else []
    moved = offload_stage(terms.offload, states, optimizer_params, acts, largest, layer_bytes, max(held, default=1))
    detail.update(moved.detail)
    detail["optimizer_params"] = int(optimizer_params)
    return moved.states, moved.activations, moved.host


def decoder_layer_bytes(terms: MemoryTerms, params: StageParams) -> list[float]:
    """What each of the stage's decoder layers saves for one micro-batch, in order: Megatron-Core's layer-wise offload
    counts the TransformerBlock's layers, a Gated DeltaNet hybrid's two pattern layers each
    (gdn_config.pipeline_unit)."""
    unit = pipeline_unit(terms.job.model)
    per_layer = [terms.per_kind[(terms.table.kind[i], terms.stored_mode)] for i in params.layers]
    return [sum(per_layer[i:i + unit]) for i in range(0, len(per_layer), unit)]


def recompute_working_layer(terms: MemoryTerms, params: StageParams, chunks) -> float | None:
    """What the layer being recomputed in its backward holds on top (None: no recompute rebuilds a layer)."""
    plan, per_kind, moe, layers = terms.plan, terms.per_kind, terms.table.kind, params.layers
    if (plan.recompute == "full" or (terms.every_nth and len(layers) >= terms.every_nth)) and layers:
        # the layer being recomputed in the backward holds its full activations
        if terms.group:  # a whole checkpointed chunk (memory.checkpoint_group) is rebuilt at once
            return max(sum(per_kind[(moe[i], "none")] for i in chunk[pos:pos + terms.group])
                       for chunk in chunks for pos in range(0, len(chunk), terms.group))
        return max(per_kind[(moe[i], "none")] for i in layers)
    if plan.recompute == "selective" and terms.selective == "op_sac" and not terms.every_nth and layers:
        # op-level SAC: the layer in its backward holds again what its recompute rebuilt
        return max(per_kind[(moe[i], "none")] - per_kind[(moe[i], "selective")] for i in layers)
    return None


def _edge_activations(terms: MemoryTerms, params: StageParams, held: tuple[int, ...], acts: float,
                      detail: dict[str, int]) -> float:
    """`acts` plus the embedding's activations on the first stage, and the MTP blocks' (their layers: the last
    decoder layer's kind, or a hybrid's mtp_layer_pattern; their inputs and their own logits, where the layout
    puts them, else with the head) and the logits and loss on the last."""
    arch, tokens, h = terms.job.model, terms.tokens, terms.job.model.hidden_size
    if params.first:
        emb_acts = held[0] * (8 * tokens + (tokens * h / terms.ts if terms.lay.dropout else 0))
        acts += emb_acts
        detail["embedding_activations"] = int(emb_acts)
    block_kinds = list(arch.mtp_layer_pattern or (terms.table.kind[arch.num_layers - 1],))
    mtp_acts = arch.num_mtp_layers * (
        sum(terms.per_kind[(kind, terms.stored_mode)] for kind in block_kinds) + 4 * 2 * tokens * h / terms.ts
        + terms.logits_bytes
    ) if params.mtp else 0.0
    if params.last:
        out_acts = terms.logits_bytes + mtp_acts
        acts += out_acts
        detail["logits_and_loss"] = int(out_acts)
    elif mtp_acts:
        acts += mtp_acts
        detail["mtp_activations"] = int(mtp_acts)
    return acts


def _overheads(terms: MemoryTerms, params: StageParams, held: HeldActivations, states: dict[str, float],
               acts: float, detail: dict[str, int], gathered: float) -> list[Overheads]:
    """The backward's candidate moments: the fixed overhead plus the FSDP/ZeRO-3 gathered units, at the moments
    FSDP2's backward walk finds (its reserved and its allocated peak, which also decide the activations alive and the
    gradients not yet allocated), else at the worst unit's backward with every activation (`gathered`: the stage's
    gathered_units)."""
    conv = terms.conv
    if walks(terms):
        out = []
        for moment in stage_step_peak(WalkStage(
                terms=terms, params=params, modes=held.modes, layer_acts=detail["layer_activations"],
                emb_acts=detail.get("embedding_activations", 0), out_acts=detail.get("logits_and_loss", 0),
                mtp_acts=detail.get("mtp_activations", 0))):
            absent = min(moment.absent_grads, states["gradients"])  # none on the GPU when offloaded to the host
            out.append(Overheads(moment.activations, terms.other_fixed + moment.transient,
                                 moment.activations + moment.transient + moment.accumulated, moment.name,
                                 absent=absent, freed_reserved=freed_grads_reserved(conv, absent),
                                 gathered=moment.transient, accumulated=moment.accumulated))
        return out
    if terms.gathered:  # every unit's unsharded gradient held where the sync waits for the last micro-batch
        card, stage_params = terms.job.card, params.dense + unit_experts(terms, params.experts)
        plan = terms.plan
        frozen = terms.job.lora is not None
        held = accumulated_grad_bytes(card, terms.m, True, plan.pp, plan.defer_fsdp_grad_sync, frozen,
                                      plan.grad_reduce_in_fp32) * stage_params
        if pipeline_held(card, plan.pp, keeps_units(terms.job, plan)):  # every unit gathered but the worst one's
            gathered += terms.conv.unsharded_param_bytes * stage_params
        return [Overheads(acts, terms.other_fixed + int(gathered), acts + int(gathered) + held, None,
                          gathered=gathered, accumulated=held)]
    return [Overheads(acts, terms.other_fixed, acts, None)]


def walks(terms: MemoryTerms) -> bool:
    """Whether the stages' backward moments are FSDP2's walk (fsdp_walk.stage_step_peak), not one moment with every
    activation."""
    return bool(terms.gathered and terms.conv.step_peak == "backward_walk" and not terms.offload.activations
                and not terms.group and terms.job.lora is None)


def gathered_units(terms: MemoryTerms, params: StageParams) -> float:
    """FSDP/ZeRO-3's gathered units at the worst unit's backward (memory_states.gathered_transient; LoRA's frozen
    base: frozen_gathered_transient) over the stage's units in forward order: embedding, decoder layers, output layer
    (with the final norm)."""
    units = [params.embedding] if params.first else []
    units += layer_unit_params(terms, params.layers)
    units += [params.output_layer + terms.norm_width] if params.last else []
    return (frozen_gathered_transient if terms.job.lora is not None else gathered_transient)(terms.conv, units)


def forward_gathered(terms: MemoryTerms, params: StageParams) -> float:
    """FSDP's gathered parameters at the worst moment of a forward-only pass (an RL step's log-prob passes), which
    the training step's backward figure (gathered_units) does not give; 0 where the weights are not sharded. The root
    unit (the output layer and final norm; the embedding too where it is tied, as the RL frameworks' apply_fsdp2
    leaves it there) is gathered at the root's pre-forward and held through the whole forward, beside the unit that
    runs (`unsharded_param_bytes`) and the next one prefetched (`prefetched_bytes`), in forward order: the embedding
    where untied, then the decoder layers."""
    if not terms.gathered:
        return 0.0
    conv = terms.conv
    running = conv.unsharded_param_bytes or conv.prefetched_bytes
    tied = params.first and params.last and not params.output_layer
    root = (params.output_layer + terms.norm_width if params.last else 0.0) + (params.embedding if tied else 0.0)
    units = [params.embedding] if params.first and not tied else []
    units += layer_unit_params(terms, params.layers)
    step = max((running * p + conv.prefetched_bytes * (units[k + 1] if k + 1 < len(units) else 0.0)
                for k, p in enumerate(units)), default=0.0)
    return running * root + step


def layer_unit_params(terms: MemoryTerms, layers: list[int]) -> list[float]:
    """Each of these decoder layers' FSDP unit on this rank, in order: its dense parameters and the routed experts the
    unit holds (memory_terms.layer_on_rank, unit_experts)."""
    plan, table = terms.plan, terms.table
    split = plan.ep * plan.etp
    units = []
    for i in layers:
        dense, routed = layer_on_rank(table, i, plan.tp, split)
        units.append(dense + unit_experts(terms, routed))
    return units


def unit_experts(terms: MemoryTerms, experts: float) -> float:
    """Of a rank's routed-expert parameters, those in its FSDP units (gathered, reduced, their unsharded gradient
    held): none where the framework's fully_shard ignores them at full EP (memory_states.experts_in_units)."""
    return experts if experts_in_units(terms.job.card, terms.plan.ep, terms.expert_dp) else 0.0


class Dominance:
    """The middle stages (neither embedding, output layer nor MTP) memory_fit evaluated for one plan, to leave out
    the stages whose fit figure, total and host bytes provably are at most one of theirs (covers)."""

    def __init__(self, terms: MemoryTerms):
        # no offload: every stage's host bytes are 0 and its activations stay on the GPU; no FSDP2 walk: a stage's
        # moments are its backward, with every activation, and the optimizer step's
        self.terms = terms
        self.on = not terms.offload.any and not walks(terms)
        self.seen: list[tuple[StageStates, tuple[int, ...], tuple[int, ...], int, bool]] = []

    def covers(self, rank: int, chunks) -> bool:
        """Whether stage `rank` is at most a middle stage already evaluated: it is a middle stage with the same model
        states (the same stage_states memo entry: the same layers by value) and the same layers per virtual chunk,
        holding no more micro-batches in any chunk. Its activations are then the same per-chunk sums times no larger
        counts, so its backward moment is at most the other's term by term, its optimizer step's the same (or, where the
        step's tensors take segments of their own, its backward's reserve plus the same segments: with_backward_cache,
        then the peak of both), and every
        step from them to the totals (float sums, products by non-negative counts, int()) is monotone: its reserved
        peak (total_bytes) is at most the other's, unless it peaks at the optimizer step where the other peaks in its
        backward (a step total the other's total then bounds: checked; where it peaks in its backward the other does
        too, and at the step both have the same total). Its fit figure is then at most the other's: the reserved
        peak, or with expandable segments the allocated peak (the larger of the two moments', each at most the
        other's) plus the page slack. Host bytes are 0."""
        if not self.on or not self.seen:
            return False
        terms = self.terms
        mine = stage_states(terms, rank, chunks)
        if not _middle(mine.params):
            return False
        lengths, held = tuple(map(len, chunks)), stage_held(terms, rank)
        for states, their_lengths, their_held, total, step_peak in self.seen:
            if (states.states is mine.states and their_lengths == lengths
                    and all(a <= b for a, b in zip(held, their_held, strict=True))
                    and (step_peak or peak_total(terms, mine.states, mine.step).total <= total)):
                return True
        return False

    def add(self, rank: int, chunks, total: int, moment: str | None) -> None:
        """Stage `rank` evaluated: its total_bytes (its reserved peak), and the moment that peak is at."""
        if self.on:
            mine = stage_states(self.terms, rank, chunks)
            if _middle(mine.params):
                self.seen.append((mine, tuple(map(len, chunks)), stage_held(self.terms, rank), total,
                                  moment == STEP_MOMENT))


def _middle(params: StageParams) -> bool:
    return not (params.first or params.last or params.mtp)
