"""Per-GPU, per-pipeline-stage memory of a training job: will it fit, and where does the memory go?

For each pipeline stage: the parameters that stage's GPU holds (its layers sharded by TP, its routed
experts by EP*ETP, embedding on the first stage, output layer, final norm and MTP on the last), times
the framework's byte table (cards/memory.yaml, via memory_states); plus the activations of the
micro-batches the real schedule keeps in flight on that stage (schedule.py), per layer from
activations.py; plus logits and the fp32 loss on the last stage; plus one calibrated fixed overhead,
the CUDA context and the caching allocator's reserve over the memory that churns every step (peak
reserved, which is what runs out). The worst stage decides whether the job fits.

Here: the estimate, the terms its stages share (memory_terms), the report's assumptions and fit figure. One
stage's memory step by step is memory_stage.py; torch FSDP2's backward walk, fsdp_walk.py.
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from operator import itemgetter
from typing import NamedTuple

from meshplan.arithmetic import mesh
from meshplan.arithmetic.activations import (
    DEFAULT_RECOMPUTE_MODULES,
    Layout,
    Shape,
    activation_mode,
    attention_saves,
    layer_activations,
    moe_bytes,
    shape_of,
)
from meshplan.arithmetic.lora import lora_engine
from meshplan.arithmetic.mamba import hybrid_layer_activations
from meshplan.arithmetic.memory_states import (
    Convention,
    StateTensor,
    activation_saves,
    as_the_plan_runs,
    built_vocab,
    describe_tensors,
    expert_gate_bytes,
    fp8_attention_saves,
    fp8_inputs,
    fp8_out_proj_copy,
    fp8_param_gather,
    keeps_units,
    loss_upcast,
    megatron_loss_name,
    memory_card,
    mixer_rows,
    optimizer_implementation,
    output_activations,
    pipeline_held,
    replicates_by_sharding,
    state_replicas,
    swiglu_input_bytes,
    unfused_glu_bytes,
    with_precision,
)
from meshplan.arithmetic.offload import OffloadPlan, job_offload_plan, offload_time
from meshplan.arithmetic.schedule import plan_stages
from meshplan.core.units import GIB
from meshplan.estimate.attention_time import op_sac_recomputes_attention
from meshplan.estimate.fsdp_walk import walk_assumption
from meshplan.estimate.layer_records import scope_memo
from meshplan.estimate.memory_stage import STEP_MOMENT, Dominance, forward_gathered, stage_fit, stage_memory
from meshplan.estimate.memory_terms import (
    MEMORY_PER_PLAN_FIELDS,
    LayoutTerms,
    MemoryTerms,
    adapter_kind_bytes,
    kind_adapters,
    param_table_for,
    stage_params,
)
from meshplan.knowledge.adapter_knobs import shared_expert_overlap
from meshplan.knowledge.engine_card import OptimizerImplementation
from meshplan.knowledge.gdn_config import pipeline_unit, split_layers
from meshplan.knowledge.model_counts import per_architecture
from meshplan.knowledge.moe_card import stacks_experts
from meshplan.rules.context import rank_tokens, runs_ulysses
from meshplan.rules.engine import require_estimable
from meshplan.schema.model import Architecture, layer_kind_counts
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import MemoryReport, MemorySummary, StageMemory

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
    own_ep = mesh.own_ep_ranks_note(job, plan)
    return warnings + ([own_ep] if own_ep else [])


def _world(job: Job, plan: Plan) -> tuple[int, float, list[str]]:
    """World size of the layout and the expert-data-parallel size (mesh.expert_dp) (the world-size and
    expert-grid rules of the framework already hold: they block the estimate)."""
    world = mesh.world_size(job.card.world_size_law, plan)
    warnings = []
    group = mesh.expert_group(plan)
    if job.model.moe is not None and world % group:
        warnings.append(
            f"world {world} is not divisible by pp*ep*etp = {group}; expert-data-parallel size taken as "
            f"{world / group:.2f} (run `meshplan check`)."
        )
    return world, mesh.expert_dp(world, plan, job.card.world_size_law), warnings


def state_shards(job: Job, plan: Plan, expert_dp: float | None = None) -> tuple[int, float]:
    """The ranks a layout's sharded model states are split over (LayoutTerms.dense_dp, expert_dp): the dense
    parameters' over dp x cp, the routed experts' over expert-dp (mesh.expert_dp, `expert_dp` where the caller has
    it), each over one replica's ranks under hybrid sharding (memory_states.state_replicas: dp_replicate, or every
    data-parallel rank where ZeRO-0 is fully_shard over a shard of one, torchtitan 0.3). The search reads them to
    find the ZeRO stages that are one plan at a layout (search/zero_stages.one_plan_key)."""
    if expert_dp is None:
        law = job.card.world_size_law
        expert_dp = mesh.expert_dp(mesh.world_size(law, plan), plan, law)
    replicas = state_replicas(job, plan)  # dp_replicate, or dp where ZeRO-0 is fully_shard over a shard of one
    return plan.dp * plan.cp // replicas, expert_dp / replicas


# --------------------------------------------------------------------------- the estimate


def attention_switches(job: Job, conv, plan: Plan) -> tuple[bool, bool]:
    """(flash, dropout) of the plan's attention: unfused attention materialises the scores, flash and fused keep only
    q, k, v, the output and the log-sum-exp; auto and a dropout left out are the framework's memory convention's
    (cards/memory.yaml). A model whose framework-built attention falls back to the unfused path under dropout (the
    card's attention.unfused_with_dropout: Megatron-Bridge's Gemma 2) is unfused whenever dropout is on, whatever
    the backend. Every estimator reads them here (Plan.attention_backend, Plan.dropout)."""
    flash = conv.flash_attention if plan.attention_backend == "auto" else plan.attention_backend != "unfused"
    dropout = conv.dropout if plan.dropout is None else plan.dropout
    att = job.card.attention
    if dropout and att is not None and job.model.model_type in att.unfused_with_dropout:
        flash = False
    return flash, dropout


def estimate_memory(job: Job, plan: Plan) -> MemoryReport:
    """Per-GPU memory of every pipeline stage (the attention backend and dropout: attention_switches).

    Raises EstimateBlocked (a MeshplanError naming the rule) when the plan breaks a rule of the framework
    that no estimate can proceed past (every structural error: rules/engine.py blocking_rules)."""
    require_estimable(job, plan)
    warnings = _assumed(job, plan)
    terms = memory_terms(job, plan, warnings)
    rows = [stage_memory(terms, rank, chunks) for rank, chunks in enumerate(terms.pipeline.chunks)]
    stages = [row.memory for row in rows]
    peak = max(stages, key=lambda s: s.total_bytes)
    capacity = job.gpu.memory_bytes
    fit_bytes, fit_basis = fit_figure(stages, plan, terms.card)
    assumptions = _assumptions(terms)
    if replicates_by_sharding(job.card, plan.zero_stage, job.framework_version):
        assumptions.append(replica_shard_assumption(job, plan))
    if job.lora is not None:
        assumptions.append(lora_assumption(job, plan))
    moment = rows[peak.stage].moment
    if moment is not None and moment != STEP_MOMENT:  # the moment the peak stage peaks at, where the backward is walked
        held = pipeline_held(job.card, plan.pp, keeps_units(job, plan))
        assumptions.append(walk_assumption(terms.conv, peak, moment, terms.m, held,
                                           "bf16" if plan.grad_reduce_in_fp32 is False else "fp32"))
    assumptions.extend(step_assumptions(terms, peak, rows[peak.stage]))
    # a node's GPUs usually share one pipeline stage (TP, EP and DP ranks fill a node first); the worst stage bounds it
    host_per_node = max(s.host_bytes for s in stages) * mesh.ranks_per_node(job)
    if terms.offload.any:
        assumptions.append(offload_assumption(job, plan, terms.offload, host_per_node))
    return MemoryReport(
        model=job.model.name, framework=job.framework, plan=plan, stages=stages, peak_bytes=peak.total_bytes,
        peak_stage=peak.stage, capacity_bytes=capacity, fits=fit_bytes <= memory_budget(job),
        headroom_bytes=capacity - fit_bytes, fit_bytes=fit_bytes, fit_basis=fit_basis,
        host_bytes_per_node=host_per_node,
        host_capacity_bytes=job.cpu_memory_per_node, assumptions=assumptions + job.notes, warnings=warnings,
    )


class FitVerdict(NamedTuple):
    """What memory_fit found of a plan's report without building it: the largest fit figure, host bytes per node and
    stage total among the stages it evaluated (the report's fit_bytes, host_bytes_per_node and peak_bytes when
    `complete`), and the stage found over the budget or the host limit, where one was (then not every stage was
    evaluated). Not complete with `over` None: every stage was read and fits the budget, the host is over (the RL
    actor engine, search/rl_actor.py, which reads the host after the GPU's whole verdict)."""

    figure: int
    host_per_node: int
    complete: bool
    over: int | None
    peak: int  # the largest stage total_bytes evaluated: the report's peak_bytes when complete, else a floor of it
    # False where the host was found over before any stage's GPU figure was worked out (the RL actor engine, from the
    # host it already knows): `figure` and `peak` are then 0, floors of any, and whether the GPU is over too is not told
    gpu_read: bool = True


def memory_fit(job: Job, plan: Plan, budget: int, host: int | None = None, first: int = 0,
               checked: bool = False) -> FitVerdict:
    """Whether estimate_memory's report of the plan fits `budget` (fit_bytes <= budget) with host_bytes_per_node
    <= `host` where given, from the same stages (stage_memory) without the report: stage `first` first (the one the
    caller expects over), then the others in order, stopping at the first over. A fitting plan evaluates every stage
    and so gives the report's exact figures; one over stops early with a floor of them. Raises as estimate_memory;
    `checked`: the caller found no error among the plan's structural rules (check_config), so none blocks it."""
    if not checked:
        require_estimable(job, plan)
    terms = memory_terms(job, plan, [])
    chunks = terms.pipeline.chunks
    first = first if 0 <= first < len(chunks) else 0
    # stage `first` alone first: most plans a search asks end there (over, or one stage); the rest walk on
    figure, host_node, peak, moment = _stage_figures(job, terms, first, chunks[first])
    if figure > budget or (host is not None and host_node > host):
        return FitVerdict(figure, host_node, False, first, peak)
    if len(chunks) == 1:
        return FitVerdict(figure, host_node, True, None, peak)
    # a stage no more than one evaluated before changes neither the figure, the peak nor `over`
    dominance = Dominance(terms)
    dominance.add(first, chunks[first], peak, moment)
    for rank in range(len(chunks)):
        if rank == first or dominance.covers(rank, chunks[rank]):
            continue
        fig, stage_host, total, moment = _stage_figures(job, terms, rank, chunks[rank])
        figure, host_node, peak = max(figure, fig), max(host_node, stage_host), max(peak, total)
        if fig > budget or (host is not None and stage_host > host):
            return FitVerdict(figure, host_node, False, rank, peak)
        dominance.add(rank, chunks[rank], total, moment)
    return FitVerdict(figure, host_node, True, None, peak)


def _stage_figures(job: Job, terms: MemoryTerms, rank: int, chunks) -> tuple[int, int, int, str | None]:
    """A stage's fit figure (stage_fit_bytes), host bytes per node, total_bytes and reserved peak's moment, from
    stage_fit: the report's figures without its report."""
    stage = stage_fit(terms, rank, chunks)
    return (int(peak_fit_bytes(stage.total, stage.total - stage.allocated, terms.plan, terms.card)),
            stage.host * mesh.ranks_per_node(job), stage.total, stage.moment)


def memory_terms(job: Job, plan: Plan, warnings: list[str]) -> MemoryTerms:
    """The terms every stage shares: the byte convention with the plan's precision knobs, the data-parallel sizes,
    the padded vocabulary, the pipeline layout, one layer's activations per kind and recompute mode, what the
    offload knobs move. What it assumed where the layout breaks a rule that does not block goes to `warnings`."""
    base = layout_terms(job, plan)
    warnings += base.warnings
    if job.global_batch_size % (plan.micro_batch_size * plan.dp):
        warnings.append(
            f"global_batch_size {job.global_batch_size} is not a multiple of micro_batch_size*dp = "
            f"{plan.micro_batch_size * plan.dp}; micro-batches rounded down (run `meshplan check`)."
        )
    tokens, lay, per_kind, logits_bytes = micro_batch_terms(job, plan, base)
    return built_terms(base, dict(
        job=job, plan=plan, m=plan.num_microbatches(job.global_batch_size), tokens=tokens, lay=lay,
        per_kind=per_kind, stored_mode="selective" if plan.recompute == "selective" else "none",
        every_nth=every_nth_blocks(plan), group=checkpoint_group(plan, job.model), logits_bytes=logits_bytes,
    ))


def forward_gathered_bytes(job: Job, plan: Plan) -> list[float]:
    """Per pipeline stage, FSDP's gathered parameters at the worst moment of a forward-only pass
    (memory_stage.forward_gathered): what an RL step's log-prob passes hold beside their activations. Read from the
    layout alone (no micro-batch)."""
    terms = built_terms(layout_terms(job, plan), dict(job=job, plan=plan))
    return [forward_gathered(terms, stage_params(terms, rank, chunks))
            for rank, chunks in enumerate(terms.pipeline.chunks)]


_FROM_LAYOUT = tuple(f.name for f in fields(MemoryTerms) if f.name in {g.name for g in fields(LayoutTerms)})


def built_terms(base: LayoutTerms, own: dict) -> MemoryTerms:
    """MemoryTerms(**own, and the rest of its fields from `base`, its LayoutTerms): filled in by copy, the fields the
    layout's plans share from one dict kept on it (base.shared), without the frozen dataclass's field-by-field
    __init__ (it checks nothing; tests/test_memory_memo.py holds the copy to the constructor's record)."""
    shared = base.shared
    if not shared:
        shared.update((name, getattr(base, name)) for name in _FROM_LAYOUT)
    terms = object.__new__(MemoryTerms)
    values = terms.__dict__
    values.update(shared)
    values.update(own)
    return terms


_LAYOUT_FIELDS = tuple(name for name in Plan.model_fields if name not in MEMORY_PER_PLAN_FIELDS)
_LAYOUT_KEY = itemgetter(*_LAYOUT_FIELDS)  # every one a hashable value (Plan's only list field is left out)


def layout_terms(job: Job, plan: Plan) -> LayoutTerms:
    """The plan's LayoutTerms, once per job and plan fields but MEMORY_PER_PLAN_FIELDS inside a shared_layers scope
    (layer_records.scope_memo; the entry keeps the job alive, so its id stays its own); outside one, its own."""
    memo = scope_memo("memory_layouts")
    if memo is None:
        return _layout_terms(job, plan)
    key = (id(job), _LAYOUT_KEY(plan.__dict__))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (job, _layout_terms(job, plan))
    return hit[1]


def _layout_terms(job: Job, plan: Plan) -> LayoutTerms:
    """What the stages share that no micro-batch or recompute field changes (LayoutTerms)."""
    arch = job.model
    conv_name, conv, tensors, offload, implementation = engine_terms(job, plan)
    conv = as_the_plan_runs(conv, plan)  # per layout: what it frees before each step
    card = memory_card()
    _, expert_dp, world_warnings = _world(job, plan)
    vocab = built_vocab(arch.vocab_size, conv, plan.tp)
    pipeline = plan_stages(job, plan)
    sharded_weights = any(t.shard == "dp" and t.tensor_class == "weights" for t in tensors)
    dense_dp, expert_dp = state_shards(job, plan, expert_dp)
    return LayoutTerms(
        conv_name=conv_name, conv=conv, tensors=tensors, card=card,
        dense_dp=dense_dp, expert_dp=expert_dp, vocab=vocab,
        pipeline=pipeline, table=param_table_for(arch, job.card.moe_whole_over_tp),
        ts=plan.tp if plan.sequence_parallel else 1,
        norm_width=arch.hidden_size * (2 if arch.norm_type == "layernorm" else 1),
        selective=job.card.recompute.selective,  # what this framework's "selective" saves
        gathered=conv.gathered_layers if sharded_weights else 0,
        other_fixed=card.fixed_overhead_bytes + card.cuda_context_bytes,
        # what the offload knobs move to host memory on this framework's engine (cards/frameworks/*.yaml offload)
        offload=offload,
        optimizer_sharded=any(t.shard == "dp" for t in tensors if t.tensor_class == "optimizer"),
        step=card.optimizer_steps[implementation],
        warnings=(*world_warnings, *pipeline.warnings), layer_layout=_layer_layout(job, plan, conv, 0),
    )


class EngineTerms(NamedTuple):
    """What of a layout's terms the engine's precision, optimizer and offload knobs decide (engine_terms)."""

    conv_name: str
    conv: Convention  # the convention with the plan's precision knobs (memory_states.with_precision)
    tensors: list[StateTensor]
    offload: OffloadPlan  # what the offload knobs move to host memory on this framework's engine (offload_plan)
    implementation: OptimizerImplementation  # the engine's Adam step (memory_states.optimizer_implementation)


ENGINE_FIELDS = ("zero_stage", "fp8_recipe", "optimizer_state_dtype", "fp8_param_gather", "grad_reduce_in_fp32",
                 "torch_compile", "param_offload", "grad_offload", "optimizer_offload", "optimizer_offload_fraction",
                 "activation_offload")
"""The plan fields with_precision, offload_plan and optimizer_implementation read (tests/test_memory_memo.py records
their reads)."""
_ENGINE_KEY = itemgetter(*ENGINE_FIELDS)


def engine_terms(job: Job, plan: Plan) -> EngineTerms:
    """The plan's EngineTerms, inside a shared_layers scope once per job and ENGINE_FIELDS (layouts of other degrees
    or pipeline shapes share them; the entry keeps the job alive, so its id stays its own); outside one, its own."""
    memo = scope_memo("memory_engines")
    key = (id(job), _ENGINE_KEY(plan.__dict__)) if memo is not None else None
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        hit = (job, EngineTerms(*with_precision(job, plan), job_offload_plan(job, plan),
                                optimizer_implementation(job, plan)))
        if memo is not None:
            memo[key] = hit
    return hit[1]


def micro_batch_terms(job: Job, plan: Plan, base: LayoutTerms) -> tuple[int, Layout, dict[tuple[bool, str], float],
                                                                         float]:
    """(tokens of one micro-batch on one GPU, one layer's Layout, its activations per kind and recompute mode, what
    the output layer and loss keep of one micro-batch): once per micro-batch size and recompute modules of the
    layout (base.micro_batches), the rest of the plan's recompute fields being read by no term of them."""
    modules = selective_modules(plan)
    key = (plan.micro_batch_size, modules)
    hit = base.micro_batches.get(key)
    if hit is None:
        arch, conv = job.model, base.conv
        tokens = rank_tokens(job, plan.micro_batch_size, plan.tp, plan.cp, plan.zero_stage)
        lay = Layout(tokens, *base.layer_layout[1:])  # _layer_layout(job, plan, conv, tokens): only tokens differ
        hit = base.micro_batches[key] = (
            tokens, lay, _per_kind(job, lay, base.selective, modules, plan.zero_stage),
            # final-norm and output-layer inputs plus the logits and loss of one micro-batch (chunked where the loss
            # is)
            output_activations(conv, tokens, base.vocab, plan.tp, arch.hidden_size, base.ts,
                               plan.micro_batch_size))
    return hit


def selective_modules(plan: Plan) -> tuple[str, ...]:
    """The modules a plan's selective recompute runs: its recompute_modules, else Megatron's default."""
    return tuple(plan.recompute_modules or DEFAULT_RECOMPUTE_MODULES)


def _layer_layout(job: Job, plan: Plan, conv, tokens: int) -> Layout:
    """What of the plan and the convention changes one layer's activations (no MEMORY_PER_PLAN_FIELDS but through
    `tokens`: memory_terms' tests hold it to it)."""
    flash, dropout = attention_switches(job, conv, plan)
    return Layout(
        tokens=tokens, seq_kv=job.seq_length, tp=plan.tp, sp=plan.sequence_parallel, etp=plan.etp,
        flash=flash, dropout=dropout,
        swiglu_unfused=conv.swiglu_unfused, fp8=fp8_inputs(job, conv), ep=plan.ep,
        moe=moe_bytes(conv, job.model, plan.moe_token_dispatcher, job.moe_fake_balanced_gate),
        qkv_fused=conv.qkv_projections == "fused",
        attn=attention_saves(conv), routed_load=ep_rank_load(job, plan),
        fp8_out_proj_copy=fp8_out_proj_copy(job, plan, conv), moe_whole=job.card.moe_whole_over_tp,
        stacked_experts=stacks_experts(job.card.moe_expert_weights),
        param_wrapper=tuple(job.lora.target_parameters) if job.lora is not None else (),
        **mixer_rows(job),
        ulysses=plan.cp if runs_ulysses(job.card, plan.zero_stage) else 1,
        dsa_cp=plan.cp if job.model.dsa is not None else 1,
        # read by op-level SAC's count only (activations._op_sac), so no recompute field is read here
        attention_recomputed=flash and op_sac_recomputes_attention(job, plan.attention_backend, plan.zero_stage),
        softcap_scores=not flash and job.card.attention is not None
        and job.model.model_type in job.card.attention.unfused_softcap,
        act=activation_saves(conv, job.model.activation),
        expert_gate=expert_gate_bytes(conv, job.model.model_type),
        act_input_bytes=swiglu_input_bytes(job), fp8_attention=fp8_attention_saves(job, plan.cp),
        shared_expert_overlap=shared_expert_overlap(job, plan),
        unfused_glu=unfused_glu_bytes(job),
    )


def _per_kind(job: Job, lay: Layout, selective: str, modules: tuple[str, ...],
              zero_stage: int) -> dict[tuple[bool, str], float]:
    """One layer's activations for one micro-batch, per (MoE layer, recompute mode); a LoRA job's with its adapters'
    (lora_per_kind)."""
    shape = architecture_shape(job.model)
    if job.lora is None:
        return per_kind_activations(shape, lay, selective, modules)
    engine = lora_engine(job.card, zero_stage)
    return lora_per_kind(shape, lay, selective, modules, kind_adapters(job.model, job.lora, engine), job.lora.rank,
                         engine.adapter_saves if engine is not None else "parallel_adapter",
                         frozenset(job.lora.targets))


architecture_shape = per_architecture(shape_of)  # one Shape per model object


@lru_cache(maxsize=4096)  # a pure function of values: the search's layouts share a few hundred Layouts
def per_kind_activations(shape: Shape, lay: Layout, selective: str,
                         modules: tuple[str, ...]) -> dict[tuple[bool, str], float]:
    """_per_kind of a model's Shape (the same dict for the same values: no caller mutates it); a hybrid model's keyed
    by its layer kinds (M, *, -, E: ParamTable.kind) instead of whether the layer is MoE."""
    if shape.kinds:
        return {(kind, mode): sum(hybrid_layer_activations(shape, lay, kind, mode, modules).values())
                for kind in shape.kinds for mode in ("none", "selective", "full")}
    return {
        (moe, mode): sum(layer_activations(shape, lay, moe, activation_mode(mode, selective), modules).values())
        for moe in (False, True) for mode in ("none", "selective", "full")
    }


@lru_cache(maxsize=1024)
def lora_per_kind(shape: Shape, lay: Layout, selective: str, modules: tuple[str, ...], adapters: tuple, rank: int,
                  style: str, targets: frozenset[str] = frozenset()) -> dict[tuple[bool, str], float]:
    """per_kind_activations with each key's adapters (memory_terms.adapter_kind_bytes), one dict per value."""
    return {key: v + adapter_kind_bytes(shape, lay, key, modules, adapters, rank, style, targets, selective)
            for key, v in per_kind_activations(shape, lay, selective, modules).items()}


def fit_figure(stages: list[StageMemory], plan: Plan, card) -> tuple[int, str]:
    """(bytes, basis) that decide whether the job fits. Without expandable segments the reserved peak: cached free
    blocks of split segments cannot be handed back, so the reserve is what runs out. With them the allocator unmaps
    every cached free page and maps it where the failing allocation needs it before raising OOM (PyTorch
    CUDACachingAllocator.cpp, Note [Expandable Segments], release_cached_blocks -> unmap_block), so the allocated
    peak decides, plus the page rounding of the free ranges next to live blocks (cards/memory.yaml)."""
    figure = max(stage_fit_bytes(s, plan, card) for s in stages)
    return int(figure), "allocated" if plan.expandable_segments else "reserved"


def stage_fit_bytes(stage: StageMemory, plan: Plan, card) -> float:
    """One stage's share of fit_figure: its reserved peak, or with expandable segments its allocated peak plus the
    page slack."""
    return peak_fit_bytes(stage.total_bytes, stage.total_bytes - stage_allocated(stage), plan, card)


def budget_bytes(capacity: int, headroom: float) -> int:
    """Bytes a plan may use and still fit when `headroom` of the memory must stay free: capacity x (1 - headroom)."""
    return int(capacity * (1.0 - headroom))


def memory_budget(job: Job) -> int:
    """What `fits` compares with: the whole memory, or less the share the request asked to keep free (Job.headroom,
    Request.headroom; the one policy recommend also ranks by, meshplan/search/policy.py)."""
    return budget_bytes(job.gpu.memory_bytes, job.headroom or 0.0)


def peak_fit_bytes(peak: float, reserve: float, plan: Plan, card) -> float:
    """The figure one peak that holds `reserve` bytes of allocator reserve fits by (fit_figure): the peak itself, or
    with expandable segments that peak less its reserve plus the page slack (cards/memory.yaml)."""
    return peak - reserve + card.expandable_segments_slack_bytes if plan.expandable_segments else peak


def stage_allocated(stage: StageMemory) -> int:
    """A stage's allocated peak (what torch's allocator hands out, with the fixed overhead and CUDA context, as
    total_bytes), found at its own moment of the step (memory_stage: the backward's and the optimizer step's)."""
    return stage.detail.get("allocated_peak", stage.total_bytes - stage.detail.get("allocator_reserve", 0))


def step_assumptions(terms: MemoryTerms, stage: StageMemory, row) -> list[str]:
    """What the optimizer step's moment and the allocated peak's own moment did on the peak stage."""
    out = []
    temp = stage.detail.get("optimizer_step_temporaries", 0)
    name = optimizer_implementation(terms.job, terms.plan)
    if temp or row.moment == STEP_MOMENT:
        out.append(f"Optimizer step ({name} on this engine, cards/memory.yaml optimizer_steps): a moment of its own, "
                   f"every gradient allocated and the activations freed, with {temp / GIB:.2f} GiB of the step's "
                   "temporaries on top" + ("; it is the peak stage's peak." if row.moment == STEP_MOMENT
                                            else "; the peak stage's allocated peak, while its reserved peak stays "
                                                 "the backward's (whose churning memory carries the allocator's "
                                                 "reserve)." if row.allocated_moment == STEP_MOMENT
                                            else "; below the backward's peak here."))
    segments = stage.detail.get("optimizer_step_segments", 0)
    if segments:
        out.append(f"The step's whole-partition tensors (reduce bucket, gradient partition, its flat and fp32 copies) "
                   f"take {segments / GIB:.2f} GiB of segments of their own: PyTorch's caching allocator cannot carve "
                   f"them out of the backward's cached blocks and hands none back, so the step's reserved figure is "
                   f"the backward's ({stage.detail.get('backward_reserve_at_step', 0) / GIB:.2f} GiB of it still "
                   "cached) plus these (cards/memory.yaml optimizer_steps.deepspeed_zero.segments).")
    if row.allocated_moment is not None:
        out.append(f"Allocated peak {stage_allocated(stage) / GIB:.2f} GiB (with context and overhead) at its own "
                   f"moment, the {row.allocated_moment}, not at the reserved peak's "
                   f"({row.moment or 'backward'}).")
    return out


def offload_assumption(job: Job, plan: Plan, offload, host_per_node: int) -> str:
    """What the offload knobs did, in the framework's terms (cards/frameworks/*.yaml offload, cards/offload.yaml)."""
    parts = []
    moved = [f"{cls} {share:.0%}" for cls, share in offload.in_step.items() if share]
    if moved:
        parts.append("in the step on the host: " + ", ".join(moved)
                     + (f" (the CPU optimizer steps {offload.cpu_optimizer:.0%} of this GPU's shard, with fp32 "
                        "parameters, a gradient copy and Adam moments on the host)" if offload.cpu_optimizer else ""))
    if offload.phase - offload.phase_freed:
        parts.append("between RL phases only (the training step's peak is unchanged): "
                     + ", ".join(sorted(offload.phase - offload.phase_freed)))
    if offload.phase_freed:
        parts.append("released between RL phases, no host copy: " + ", ".join(sorted(offload.phase_freed)))
    if offload.activations:
        parts.append("saved activations on the host except the layers in flight")
    if offload.layers:
        layers = split_layers(job.model) // max(1, plan.pp)
        sent = min(offload.layers, layers - 1)
        parts.append(f"the saved tensors of the first {sent} of {layers} layers on the host (Megatron-Core's "
                     "cpu_offloading_num_layers through Transformer Engine's offload context: the GPU holds at most "
                     f"{layers - sent} layers' at once, cards/offload.yaml layer_offload_source)")
    return (f"Offload on {job.card.display_name}: " + "; ".join(parts)
            + f". Host memory per node: {host_per_node / GIB:,.1f} GiB (the worst stage x "
              f"{mesh.ranks_per_node(job)} GPU{'s' if mesh.ranks_per_node(job) > 1 else ''})"
            + (f" of {job.cpu_memory_per_node / GIB:,.0f} GiB." if job.cpu_memory_per_node else "."))


def replica_shard_assumption(job: Job, plan: Plan) -> str:
    """What a ZeRO-0 the framework runs as fully_shard over a shard of one is estimated as (memory_states.
    replicates_by_sharding; the card's engine.replica_shard)."""
    release = job.framework_version or job.card.version
    return (f"zero_stage 0 on {job.card.display_name} {release} (data_parallel_shard_degree 1, "
            f"data_parallel_replicate_degree {plan.dp}) is FSDP2's fully_shard over a shard of "
            f"{plan.cp} rank{'s' if plan.cp > 1 else ''} (cp) with {plan.dp} replicas, not DDP: estimated as "
            f"zero_stage 3 at dp_replicate {plan.dp} (its states, each unit's bf16 parameters gathered and its fp32 "
            "reduce input, fully_shard's copies, the replicas' fp32 all-reduce with each unit's reduce; "
            f"cards/frameworks/{job.framework}.yaml engine.replica_shard).")


def lora_assumption(job: Job, plan: Plan) -> str:
    """What the LoRA estimate kept and left out."""
    assert job.lora is not None
    engine = lora_engine(job.card, plan.zero_stage)
    how = engine.adapters if engine else "fused"
    peft = engine is not None and engine.adapter_saves == "peft"
    shards = ("as Hugging Face PEFT's lora.Linear wraps each targeted nn.Linear" if peft else
              "sharded over TP as Megatron-Bridge's ParallelLinearAdapter shards them")
    keeps = ("lora_A's input, the base linear's own tensor, and its rank-r output" if peft else
             "each A's rank-r output; under sequence parallelism the column-parallel adapters keep their input "
             "all-gathered")
    return (f"LoRA rank {job.lora.rank} on {', '.join(job.lora.targets)} ({how} adapters): base weights frozen "
            f"(weight bytes only, no gradients or optimizer state); adapters A (in x r) and B (r x out) {shards}, "
            f"with the full training states. Activations are full training's plus what the adapters keep ({keeps}), "
            "less what a frozen norm keeps only for its weight's gradient (Hugging Face's RMSNorm: its bf16 "
            "normalised tensor; a fused norm kernel keeps its input whatever its weight) and the inputs of the "
            "frozen linears without an adapter, which keep none "
            "(arithmetic/activations.frozen_linear_bytes; MLA's projections and the router's input still counted).")


def _assumptions(terms: MemoryTerms) -> list[str]:
    """The assumptions list of the report: the states, parameters, activations, schedule, loss and overheads."""
    job, plan, conv_name, tensors, lay, m = terms.job, terms.plan, terms.conv_name, terms.tensors, terms.lay, terms.m
    vocab, expert_dp, dense_dp, card = terms.vocab, terms.expert_dp, terms.dense_dp, terms.card
    sp = "/tp (sequence parallel)" if lay.sp else "replicated over TP (no sequence parallelism)"
    replicas = state_replicas(job, plan)
    over = "/dp" if replicas != plan.dp_replicate else "/dp_replicate"
    out = [
        f"Model states per parameter ({conv_name} convention, zero_stage {plan.zero_stage}): "
        f"{describe_tensors(tensors)}; 'sharded' = over dp*cp"
        + (f"{over} (hybrid sharding, {replicas} replicas)" if replicas > 1 else "")
        + f" = {dense_dp}"
        + (f" for dense parameters and over expert-dp = {mesh.expert_dp_formula(job.card.world_size_law)}"
           f"{over if replicas > 1 else ''} = {expert_dp:g} for routed experts."
           if job.model.moe else "."),
        "Parameters per stage: its decoder layers (attention, MLP and shared experts / tp; norms and router "
        "replicated; routed experts / (ep*etp)); embedding on the first stage; output layer (a tied copy when "
        "pp > 1), final norm and MTP blocks on the last stage.",
        f"Vocabulary padded to {vocab} (multiple of {card.conventions[conv_name].vocab_pad_multiple}*tp)."
        if vocab != job.model.vocab_size else "Vocabulary not padded.",
        "Activations per layer after Korthikanti et al. 2022, generalised (GQA K/V of kv_heads*head_dim, gated "
        f"MLP fc1 output 2*ffn, MLA latents, MoE top-k rows + router + dispatch copies): tokens per GPU = "
        f"seq/cp * micro_batch = {lay.tokens}; norm and dropout tensors {sp}; the rest / tp"
        + (" but an MoE block's, whole on every TP rank (TP leaves it whole: the card's moe_tp)."
           if job.model.moe and lay.moe_whole and plan.tp > 1 else "."),
        "Attention: " + ("flash (no s^2 tensor; fp32 log-sum-exp kept)" if lay.flash
                         else "unfused (softmax" + (" + dropout mask/output" if lay.dropout else "") + " s^2 tensors)")
        + (", dropout masks kept." if lay.dropout else ", no dropout."),
        f"Recompute {plan.recompute}: "
        + {"none": "every tensor above is stored.",
           "selective": _selective_words(plan),
           "full": "only each recomputed layer's input is stored, plus one layer's full activations while it "
                   "is recomputed in the backward"
                   + _recompute_layers_words(plan)}[plan.recompute],
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
        _loss_assumption(card.conventions[conv_name], job, plan),
        f"Other: fixed overhead {card.fixed_overhead_bytes / GIB:.2f} GiB (workspaces, communication buffers; "
        f"calibrated, cards/memory.yaml) + CUDA context {card.cuda_context_bytes / GIB:.2f} GiB (outside torch's "
        f"accounting) + the caching allocator's reserve, {card.allocator_reserve_fraction:.0%} of the memory freed "
        "and re-allocated every step (activations, logits, gathered layers): peak reserved, not just allocated"
        + (("; FSDP units gathered moment by moment through the backward (cards/memory.yaml step_peak)."
            if card.conventions[conv_name].step_peak == "backward_walk"
            else "; FSDP/ZeRO-3 gathered units at the worst unit's backward peak (cards/memory.yaml).")
           if any(t.shard == "dp" and t.tensor_class == "weights" for t in tensors) else "."),
        "Not modelled: CUDA-graph pools" + (f" (cuda_graph_impl={plan.cuda_graph_impl}: Megatron-Core measures "
                                            "them at capture, cuda_graphs.py; no source gives a figure to count)."
                                            if plan.cuda_graph_impl != "none" else "."),
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
    if plan.optimizer == "muon":  # the Model states line above names the convention's Adam moments
        out.append("Optimizer muon: one fp32 momentum (4 B) in place of Adam's two moments on the decoder's 2-D "
                   "matrices (attention, MLP, routed and shared experts), sharded as the moments are; the embedding, "
                   "output layer, norms and biases stay on Adam (cards/memory.yaml optimizers). Muon's optimizer-step "
                   "temporaries are not counted.")
    if job.model.moe is not None and plan.moe_token_dispatcher == "flex":
        out.append("Flex dispatcher: DeepEP / HybridEP allocate their own NVLink and RDMA buffers outside "
                   "PyTorch's allocator; they are not counted (their size depends on the backend's settings).")
    if job.model.layer_pattern is not None:
        out.append(hybrid_assumption(job.model.layer_pattern))
    return out


def hybrid_assumption(pattern: str) -> str:
    """How a hybrid model's layers are counted (arithmetic/mamba.py, arithmetic/gdn.py)."""
    if "G" in pattern:
        return (f"Hybrid layers ({layer_kind_counts(pattern)}): each one norm and one mixer (a decoder layer "
                "is two); a Gated DeltaNet layer keeps what Megatron-Core's GatedDeltaNet and FLA's kernels save "
                "(in_proj's input and output, the l2-normed q and k and their copies at the value heads, v, the decay "
                "and beta, the chunk matrices A, the gated norm's input, gate and output, out_proj's input: "
                "cards/memory.yaml gdn_layer; the chunk states are recomputed), its weights split over TP by heads; "
                "its attention layers keep their output gate. No measured run of a Gated DeltaNet model backs the "
                "band.")
    return (f"Hybrid layers ({layer_kind_counts(pattern)}): each one norm and one mixer; a Mamba-2 layer keeps what "
            "Megatron-Core's memory-efficient path saves (in_proj's input and output zxBCdt, the scan output, the "
            "gated norm's input and rstd, out_proj's input: cards/memory.yaml mamba2_layer), its weights split over "
            "TP by heads and groups; its attention layers have no rotary embedding. No measured run of a hybrid backs "
            "the band.")


def _fp8_assumption(conv, gather: bool) -> str:
    """What fp8 keeps under this convention (cards/memory.yaml: fp8_weights, fp8_weight_bytes, fp8_saved_inputs)."""
    if conv.fp8_weights == "transformer_engine":
        weight = (f"fp8 primary weights in place of the bf16 ones ({conv.fp8_weight_bytes:+g} B per linear-layer "
                  "parameter)" if gather else f"{conv.fp8_weight_bytes:g} B of fp8 weight per linear-layer parameter "
                  "beside the bf16 one (Transformer Engine)") + "; the output layer, no Transformer Engine module, bf16"
    elif conv.fp8_weight_bytes:
        weight = f"{conv.fp8_weight_bytes:g} B of fp8 weight copy per linear-layer parameter"
    else:
        weight = "no fp8 weight kept between calls (cast per call" + (", all-gathered in fp8)" if gather else ")")
    inputs = ("linear-layer inputs saved in 1 byte" if conv.fp8_saved_inputs == "fp8"
              else "linear-layer inputs saved in bf16, as without fp8")
    return f"fp8: {weight}; {inputs}."


def _loss_assumption(conv, job: Job, plan: Plan) -> str:
    bf16 = loss_upcast(job, conv)  # loss_fp32_upcast false: the cross-entropy's tensors in bf16
    per_logit = bf16.get("logits_bytes_per_element", conv.logits_bytes_per_element)
    tensors = "bf16 (loss_fp32_upcast false)" if bf16 else "fp32"
    default = f"bf16 logits and the cross-entropy's {tensors} tensors"
    chunks = (f" of one of {conv.loss_chunks} sequence chunks at a time (the framework's chunked loss)"
              if conv.loss_chunks > 1 else " of the whole micro-batch")
    whole = "; the logits whole on every TP rank (gathered before the loss)" * (conv.logits_over_tp == "replicated")
    return (f"Last stage: output-layer input and logits/loss at {per_logit:g} bytes per logit"
            f"{chunks} ({MEGATRON_LOSS_KEPT.get(megatron_loss_name(job, plan) or '', default)} at its peak{whole}; "
            "cards/memory.yaml).")


# What each of Megatron-Core's cross-entropies keeps at its peak, as the memory's assumptions say it
# (cards/memory.yaml megatron_cross_entropy, memory_states.megatron_loss_name)
MEGATRON_LOSS_KEPT = {
    "unfused": "Megatron-Core's unfused vocab-parallel cross-entropy: the fp32 copy of the logits, softmax and "
               "gradient in place, beside the bf16 gradient",
    "native": "Megatron-Core's fused native cross-entropy: the fp32 softmax, gradient in place, beside the bf16 "
              "gradient",
    "te": "Transformer Engine's fused cross-entropy: the bf16 logits, the gradient written in place over them",
}


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


def checkpoint_group(plan: Plan, arch: Architecture) -> int:
    """The model's layers one checkpoint of Megatron's full recompute holds where that is more than one (0: one layer
    a checkpoint, or no full recompute): the uniform method's recompute_layers > 1; else a Gated DeltaNet hybrid's
    decoder layer, two pattern layers, which its GPTModel checkpoints as one TransformerLayer (transformer_block.py
    _checkpointed_forward: the uniform method's chunks of recompute_num_layers TransformerLayers, one where it is 1,
    and each of the block method's first recompute_num_layers), so the layer's input alone is kept
    (gdn_config.pipeline_unit)."""
    if plan.recompute != "full":
        return 0
    if plan.recompute_method == "uniform" and (plan.recompute_layers or 1) > 1:
        return plan.recompute_layers or 0
    unit = pipeline_unit(arch)
    return unit if unit > 1 else 0


def step_offload_time(job: Job, plan: Plan, *, compute_s: float) -> tuple[float, str]:
    """offload.offload_time for a whole step, read from the memory estimate's worst-hosting stage: its CPU optimizer's
    parameters, the activations one micro-batch sends to the host, and the parameter shard an in-step parameter
    offload brings back for each gather (its 16-bit copy). Zero, with no estimate, when nothing is offloaded."""
    if not job_offload_plan(job, plan).any:
        return 0.0, ""
    report = estimate_memory(job, plan)
    stage = max(report.stages, key=lambda s: s.host_bytes)
    in_flight = max(1, stage.detail.get("microbatches_in_flight", 1))
    return offload_time(
        job, plan, optimizer_params=stage.detail.get("optimizer_params", 0),
        host_activation_bytes=stage.detail.get("host_activations", 0) / in_flight,
        param_bytes_moved=2 * stage.detail.get("optimizer_params", 0), compute_s=compute_s,
    )


def _selective_words(plan: Plan) -> str:
    """What selective recompute leaves unstored, from the modules the plan names (Megatron's recompute_modules),
    so a list without core_attn is not reported as recomputing core attention."""
    if plan.recompute_modules is None or list(plan.recompute_modules) == ["core_attn"]:
        return "core attention recomputed (its s^2 / log-sum-exp tensors are not stored)."
    named = ", ".join(plan.recompute_modules)
    kept = "" if "core_attn" in plan.recompute_modules else "; core attention's tensors are stored"
    return f"the modules {named} recomputed (their outputs not stored{kept})."


def _recompute_layers_words(plan: Plan) -> str:
    """Which layers full recompute covers, in the words of the method memory_stage.held_activations applies:
    uniform chunks every layer; block (given, or left out with recompute_layers set) only the first
    recompute_layers of each stage, the rest store every tensor (so the text never names chunks the figure lacks)."""
    if plan.recompute_layers is None:
        return "."
    if plan.recompute_method == "uniform":
        return f" (every layer, in chunks of {plan.recompute_layers} recomputed together)."
    given = "block" if plan.recompute_method == "block" else "block, the method taken when recompute_layers is set"
    return (f" (only the first {plan.recompute_layers} layers of each stage recomputed (recompute_method {given});"
            " the other layers store every tensor above).")
