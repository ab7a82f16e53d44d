"""Step time, tokens/s per GPU and MFU of one training job under one parallel layout.

The model is first-order and explicit, so a reader can redo it by hand:
- every pipeline stage's time per micro-batch is the sum of its GEMMs (each at an achievable
  fraction of peak that depends on its shape), causal flash attention, memory-bound elementwise
  work, a per-layer launch overhead, and the exposed part of its TP / CP / EP / PP traffic
  (layer_time.py, stage_time.py);
- the pipeline runs m micro-batches under the framework's schedule (GPipe, 1F1B, interleaved 1F1B), replayed op by
  op (arithmetic/pipeline_timeline.py): each rank's forward and backward chunks in the schedule's order, each
  waiting for its neighbour stage and one p2p hop; the step is when the last rank ends, for any m (the
  (p-1)/(m*v) bubble of balanced stages is its steady-state limit);
- ZeRO-0/1: once per step the gradients are reduced over the data-parallel group (overlapped with the
  last backward) and ZeRO-1 gathers the parameters back; ZeRO-2/3 and FSDP move their traffic layer by
  layer (all-gathers forward and backward, reduce-scatters in the backward), per micro-batch or once per
  step as the framework schedules it, each hidden behind its neighbour layer's compute
  (sharding_traffic.exposed_sharding); the optimizer streams its state.
Constants come from cards/calibration.yaml (fitted on the Ultra-Scale Playbook sweep, see
bench/README.md); bandwidths and domain sizes from cards/hardware.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from operator import itemgetter
from typing import NamedTuple, TypeVar

from meshplan.arithmetic import mesh
from meshplan.arithmetic.comm import Links, allreduce_time, beside_compute, contended, job_links, p2p_time, ring_time
from meshplan.arithmetic.flops import Shard, logits_gemm, model_flops_per_token, weight_gradient_share
from meshplan.arithmetic.fp8_casts import fp8_casts, weight_cast_bytes
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_seconds
from meshplan.arithmetic.lora import FROZEN_PASSES_PER_FORWARD, lora_engine, lora_flops_per_token
from meshplan.arithmetic.memory_states import (
    Convention,
    built_vocab,
    convention,
    megatron_loss,
    optimizer_sharded,
    optimizer_step_bytes,
    rl_loss,
    state_replicas,
    swiglu_store_cast_bytes,
    uses_fsdp,
)
from meshplan.arithmetic.offload import job_offload_plan
from meshplan.arithmetic.param_wrapper import param_wrapper_step_flops
from meshplan.arithmetic.pipeline_counts import fused_share, steady_share
from meshplan.arithmetic.pipeline_floor import chain_floor
from meshplan.arithmetic.pipeline_timeline import SPLIT_ORDERS, V_ORDERS, Shape, replays_whole, simulate
from meshplan.arithmetic.schedule import Stages, plan_shape, plan_stages
from meshplan.core.errors import MeshplanError
from meshplan.estimate.attention_time import (
    attention_efficiency,
    attention_seconds,
    op_sac_recomputes_attention,
    runs_unfused_rope,
    trained_model,
)
from meshplan.estimate.context_parallel import cp_time
from meshplan.estimate.hybrid_time import hybrid_layers
from meshplan.estimate.layer_records import BF16, FORWARD_AND_BACKWARD, LayerContext, memo_layer, scope_memo
from meshplan.estimate.layer_time import eager_edge_seconds, layer_time, overlapped_twin
from meshplan.estimate.memory import (
    attention_switches,
    ep_rank_load,
    every_nth_blocks,
    selective_modules,
    step_offload_time,
)
from meshplan.estimate.memory_terms import time_rank_parts
from meshplan.estimate.moe_time import a2a_steady_share, dispatcher_passes, expert_launches, moe_host_syncs
from meshplan.estimate.mtp_time import head_with_mtp
from meshplan.estimate.sharding_traffic import (
    DpTraffic,
    dp_hidden_share,
    grad_reduce_bytes,
    optimizer_gather_bytes,
    sharding_schedule,
    units_kept_overlapped,
)
from meshplan.estimate.stage_time import (
    Recompute,
    StageInputs,
    StageTime,
    kinds_cp,
    layer_kinds,
    layer_sums,
    one_layer_work,
    stage_compute,
    stage_kinds,
    stage_rows,
)
from meshplan.estimate.throughput_assumptions import batch_warnings, layout_warnings, throughput_assumptions
from meshplan.estimate.tp_overlap import (
    async_tp_unfused,
    sp_copies,
    tp_input_ops,
    tp_overlap_mode,
    tp_sms,
)
from meshplan.knowledge.adapter_knobs import shared_expert_overlap
from meshplan.knowledge.calibration import Calibration, calibration
from meshplan.knowledge.engine_card import RlLossPasses
from meshplan.knowledge.moe_card import stacks_experts
from meshplan.knowledge.tp_card import head_tp
from meshplan.rules.context import rank_tokens, ring_repeats_kv, runs_torch_cp, runs_ulysses
from meshplan.rules.engine import require_estimable
from meshplan.schema.plan import PLAN_LIST_FIELDS, Job, Plan
from meshplan.schema.reports import ThroughputBreakdown, ThroughputReport

__all__ = ["StageCp", "StageWork", "StepTerms", "estimate_throughput", "exposed_pipeline_p2p", "model_flops_per_token",
           "pipeline_p2p", "stage_cp", "stage_layers", "stage_work", "step_terms", "throughput_of"]

_T = TypeVar("_T")  # what _kept_per_job keeps


class Peaks(NamedTuple):
    """FLOP/s a GEMM runs at (BF16; FP8 where the job runs it, at the card's relative efficiency) and the peak
    MFU is counted against."""

    bf16: float
    fp8: float | None
    mfu: float


class PipelineTime(NamedTuple):
    """The pipeline's seconds per step as its schedule's timeline gives them, the bubble (those seconds beyond m x
    the slowest stage), and the share of the pipeline's GPU-seconds idle."""

    worst: int  # the slowest stage
    seconds: float
    bubble: float
    idle: float = 0.0
    schedule: str = ""


def stage_layers(job: Job, plan: Plan) -> Stages:
    """The decoder layers each pipeline stage holds and the stage with the output layer, as estimate_throughput
    times them: the framework's convention from schedule.plan_stages, the same stages estimate_memory weighs."""
    return plan_stages(job, plan)


def eager_blocks(job: Job, plan: Plan) -> bool:
    """Whether the blocks' memory-bound ops run as separate eager kernels: a framework whose card has a compile
    switch that compiles the blocks (torchtitan, KempnerForge) with torch_compile off. Frameworks without one run
    fused kernels either way (Megatron-Core / Transformer Engine), the count elementwise_passes is."""
    scope = job.card.compile
    return scope is not None and scope.blocks and not plan.torch_compile


def compiled_blocks(job: Job, plan: Plan) -> bool:
    """Whether the blocks run torch.compile'd: a framework whose card has a compile switch that compiles them, on
    (each activation one kernel: cards/calibration.yaml activation_passes' compiled code)."""
    scope = job.card.compile
    return scope is not None and scope.blocks and plan.torch_compile


def hf_eager_code(job: Job, plan: Plan) -> bool:
    """Whether the plan's engine trains transformers' modeling code as eager PyTorch ops (the card's
    eager_model_code: verl's and SkyRL's FSDP engines): its memory-bound passes are hf_eager_*."""
    return job.card.eager_model_at(plan.zero_stage)


def experts_fused(job: Job) -> bool:
    """Whether the framework runs its routed experts' activation as one fused kernel even where its blocks are eager
    (its card's compile.experts_fused: NeMo AutoModel's grouped experts)."""
    scope = job.card.compile
    return scope is not None and scope.experts_fused


class StepTerms(NamedTuple):
    """Everything of a plan's step but its pipeline's timeline (the costly part): the stages' times per micro-batch
    and the once-per-step terms. `floor` bounds the step from below, so a search can drop a plan before replaying
    its pipeline (meshplan/search/engine.py, Level.STEP); `throughput_of` finishes the estimate from them."""

    job: Job
    plan: Plan
    m: int  # micro-batches per step
    peaks: Peaks
    ctx: LayerContext
    inputs: StageInputs
    rows: list[StageTime]
    worst: int  # the slowest stage
    dp_exposed: float
    optimizer: float
    offload_s: float
    offload_how: str
    warnings: list[str]

    @property
    def floor(self) -> float:
        """The step can be no shorter: `_pipeline` takes the larger of m x the slowest stage and the replayed timeline
        (times the schedule's runs), and where the replay runs every micro-batch that timeline is at least each
        rank's chain through the pipeline (pipeline_floor.chain_floor, with no replay); the once-per-step terms add
        to it in throughput_of's order."""
        pipeline = self.m * self.rows[self.worst].total
        if self.plan.pp > 1:
            shape, runs = _pipeline_shape(self.m, self.inputs)
            if replays_whole(shape):
                fwd, bwd, last, _ = _chunk_seconds(self.rows, shape, self.inputs)
                if last is not None:  # chain_floor's rank seconds at most each of its chunks', the last one's excess
                    owner = self.inputs.pipeline.head_rank
                    fwd[owner], bwd[owner] = min(fwd[owner], last[0]), min(bwd[owner], last[1])
                chains = runs * chain_floor(shape, fwd, bwd, self.inputs.pp_hop, None if last is None else last[:2])
                if chains > pipeline:
                    pipeline = chains
        return pipeline + self.dp_exposed + self.optimizer + self.offload_s


def estimate_throughput(
    job: Job, plan: Plan, calibration_override: Calibration | None = None, *,
    attention_kernel: str | None = None,
) -> ThroughputReport:
    """Predicted step time, tokens/s per GPU and MFU of `plan` for `job`, with the time broken down.

    The plan's attention_backend and dropout as memory.attention_switches reads them (unfused: the scores'
    softmax and dropout passes, attention_time.unfused_attention_seconds). `attention_kernel` (bench only)
    overrides the flash kernel for a published run of a trainer meshplan does not support (attention_efficiency).
    Raises EstimateBlocked (a MeshplanError naming the rule) when the plan breaks a rule of the framework
    that no estimate can proceed past (every structural error: rules/engine.py blocking_rules).
    """
    return throughput_of(step_terms(job, plan, calibration_override, attention_kernel=attention_kernel))


def step_terms(job: Job, plan: Plan, calibration_override: Calibration | None = None, *,
               attention_kernel: str | None = None) -> StepTerms:
    """estimate_throughput's terms before its pipeline's timeline (same arguments, same refusals)."""
    require_estimable(job, plan)
    warnings = batch_warnings(job, plan)
    cal = calibration_override or calibration(job.framework)
    m, peaks, ctx = _step_context(job, plan, cal, attention_kernel)
    inputs = stage_inputs(job, plan, ctx)
    rows = stage_rows(inputs)
    totals = [r.total for r in rows]
    worst = max(range(len(totals)), key=totals.__getitem__)
    dp_exposed = optimizer = 0.0
    syncs: dict[tuple[float, float], StepSync] = {}  # step_sync per a stage's parameters (stages alike share them)
    for s, row in enumerate(rows):
        dp_exposed = max(dp_exposed, _dp_exposed(s, row, inputs, syncs))
        # with it, the sharding engine's once-per-step copies on the compute stream (other_s: not communication)
        optimizer = max(optimizer, _optimizer_seconds(row, inputs, m) + row.sharding.step_copies)
    # a framework that runs its schedule once per accumulation step syncs the gradients at each run's last backward
    # (FSDP reshards there too, gathering again in the next run): Plan.pipeline_microbatches
    dp_exposed *= plan.schedule_runs(job.global_batch_size)
    # CPU offload: the CPU Adam step of the offloaded share and the host transfers the compute cannot cover
    offload_s, offload_how = step_offload_time(job, plan, compute_s=m * rows[worst].compute)
    return StepTerms(job, plan, m, peaks, ctx, inputs, rows, worst, dp_exposed, optimizer, offload_s, offload_how,
                     warnings)


def _step_context(job: Job, plan: Plan, cal: Calibration,
                  attention_kernel: str | None = None) -> tuple[int, Peaks, LayerContext]:
    """The step's micro-batches, the GPU's peaks and its layers' context (what step_terms, stage_work and stage_cp
    build alike); the job's links and peaks once per job and calibration inside a shared_layers scope (a search asks
    for hundreds of plans of a few jobs)."""
    m = plan.num_microbatches(job.global_batch_size)
    peaks = _kept_per_job("job_peaks", job, cal, _peaks)
    return m, peaks, layer_context(job, plan, cal, kept_links(job, cal), peaks, m, attention_kernel)


def kept_links(job: Job, cal: Calibration) -> Links:
    """comm.job_links of the job, once per job and calibration inside a shared_layers scope: the step's context and
    the search's floors (sync_floor.sync_rates, sharding_floor, pipeline_unit) ask it of hundreds of plans of a few
    jobs (DeepSeek-V3 on 2,048 H100: 872 asks, 14 jobs). Outside a scope, worked out per call."""
    return _kept_per_job("job_links", job, cal, job_links)


def _kept_per_job(name: str, job: Job, cal: Calibration, work: Callable[[Job, Calibration], _T]) -> _T:
    """work(job, cal), kept in the shared_layers scope's memo `name` per job and calibration by identity (the entry
    keeps both alive, so their ids stay theirs); outside a scope, worked out per call."""
    memo = scope_memo(name)
    if memo is None:
        return work(job, cal)
    key = (id(job), id(cal))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (job, cal, work(job, cal))
    return hit[2]


def _single_stage(job: Job, plan: Plan) -> bool:
    """One pipeline stage and nothing offloaded: stage_work's and stage_cp's own arithmetic, else step_terms'."""
    return plan.pp == 1 and not job_offload_plan(job, plan).any


class StageWork(NamedTuple):
    """What the search's per-token references read of a plan's step (search/bounds._per_token): its micro-batches
    and its slowest stage's compute, recompute, TP, CP and EP seconds per micro-batch, as step_terms' row has them;
    of a one-stage plan, also one layer of each kind's work and one decoder layer's recompute (stage_time.
    one_layer_work: 0 for a kind it has none of) and the output head's compute, what a pipeline rank holding n layers
    of each kind and the head takes at least (search/rank_chains.py)."""

    m: int
    compute: float
    recompute: float
    tp: float
    cp: float
    ep: float
    dense: float = 0.0
    moe: float = 0.0
    dense_rec: float = 0.0
    moe_rec: float = 0.0
    head: float = 0.0


def stage_work(job: Job, plan: Plan) -> StageWork:
    """step_terms(job, plan)'s m and its slowest row's work terms, to the last bit, with the same refusals. A single
    stage without offload is the slowest (the only) one, and those terms read neither the once-per-step terms (DP
    sync, optimizer, offload) nor the stage's parameters, Muon, sharding traffic or host floor: they are left out
    (the search's references are such plans). Offload (whose estimate may refuse) or a pipeline: from step_terms."""
    if not _single_stage(job, plan):
        t = step_terms(job, plan)
        row = t.rows[t.worst]
        return StageWork(t.m, row.compute, row.recompute, row.tp, row.cp, row.ep, *_one_stage_parts(t.inputs))
    require_estimable(job, plan)
    m, inputs, layers, kinds = _one_stage_inputs(job, plan)
    sums = layer_sums(len(layers), kinds, inputs)
    compute, _ = stage_compute(sums, inputs.pipeline.head_rank == 0, inputs)
    return StageWork(m, compute, sums.recompute, sums.tp, sums.cp, sums.ep, *_one_stage_parts(inputs, kinds))


RECOMPUTE_FIELDS = ("recompute", "recompute_layers", "recompute_method", "recompute_modules", "selective_ac_option")
"""The plan fields that reach a single stage's StageInputs only through their `recompute` (recompute_of) and the
plan layer_sums reads them from: stage_work's plans that differ only in these share the rest (_one_stage_inputs)."""


def plan_values_but(unread: frozenset[str] | tuple[str, ...]) -> Callable[[Plan], tuple]:
    """A memo key's values of a plan: its fields but `unread`, in Plan's order, a list field as a tuple (hashable);
    _one_stage_inputs' and kept_head's."""
    kept = tuple(name for name in Plan.model_fields if name not in unread)
    get, lists_at = itemgetter(*kept), tuple(k for k, name in enumerate(kept) if name in PLAN_LIST_FIELDS)

    def values(plan: Plan) -> tuple:
        fields = get(plan.__dict__)
        if any(isinstance(fields[k], list) for k in lists_at):  # a list field set: its values, as a tuple
            fields = tuple(tuple(v) if isinstance(v, list) else v for v in fields)
        return fields

    return values


_BUT_RECOMPUTE = plan_values_but(RECOMPUTE_FIELDS)


def _one_stage_inputs(job: Job, plan: Plan) -> tuple[int, StageInputs, list[int], list[bool]]:
    """stage_work's micro-batches, StageInputs, layers and their kinds of a single-stage plan; inside a shared_layers
    scope once per job (by identity, kept alive by the entry) and plan fields but RECOMPUTE_FIELDS, the inputs of
    another recompute with that plan and its Recompute in place (the search's references at each recompute). Its
    inputs without once_per_step (stage_inputs)."""
    memo, fields = scope_memo("one_stage_inputs"), _BUT_RECOMPUTE(plan)
    hit = memo.get((id(job), fields)) if memo is not None else None
    if hit is not None:
        _, m, inputs, layers, kinds = hit
        if inputs.plan is not plan:
            inputs = replace(inputs, plan=plan, recompute=recompute_of(job, plan))
        return m, inputs, layers, kinds
    m, _, ctx = _step_context(job, plan, calibration(job.framework))
    inputs = stage_inputs(job, plan, ctx, once_per_step=False)
    layers = inputs.pipeline.layers(0)
    hit = (job, m, inputs, layers, stage_kinds(0, layers, inputs))
    if memo is not None:
        memo[(id(job), fields)] = hit
    return hit[1:]  # type: ignore[return-value]


def _one_stage_parts(inputs: StageInputs, kinds: list[bool] | None = None) -> tuple[float, ...]:
    """StageWork's layer and head parts of a one-stage plan's inputs (`kinds`: its stage_kinds, where the caller has
    them); none of a pipeline's (its stages differ)."""
    if inputs.plan.pp != 1:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    layers = inputs.pipeline.layers(0)
    if kinds is None:
        kinds = stage_kinds(0, layers, inputs)
    return (*one_layer_work(len(layers), kinds, inputs), inputs.head if inputs.pipeline.head_rank == 0 else 0.0)


class StageCp(NamedTuple):
    """What the search's context-parallel references read of a plan's step (search/bounds._per_token): its
    micro-batches and its slowest stage's CP seconds per micro-batch, as step_terms' row has them."""

    m: int
    cp: float


def stage_cp(job: Job, plan: Plan) -> StageCp:
    """step_terms(job, plan)'s m and its slowest row's cp, to the last bit, with the same refusals. On a single stage
    without offload (stage_work's case) that is layer_sums' cp: count x one layer's CP traffic per kind, and a layer's
    CP traffic (context_parallel.cp_time) reads of the layer only its attention core (attention_seconds), the same in
    a dense and an MoE layer: so only that is computed, not the layers' GEMMs, MLPs or experts. Otherwise stage_work."""
    if not _single_stage(job, plan) or job.model.layer_pattern is not None:  # a hybrid's CP differs per layer kind
        work = stage_work(job, plan)
        return StageCp(work.m, work.cp)
    require_estimable(job, plan)
    m, _, ctx = _step_context(job, plan, calibration(job.framework))
    pipeline = stage_layers(job, plan)
    _, one = cp_time(ctx, *attention_seconds(ctx))  # layer_time's cp
    return StageCp(m, kinds_cp(layer_kinds(0, pipeline.layers(0), job.model, pipeline), one))


def throughput_of(t: StepTerms) -> ThroughputReport:
    """The estimate from its terms: the pipeline's timeline replayed, the step broken down and worded."""
    job, plan, m, ctx, rows, dp_exposed, optimizer = t.job, t.plan, t.m, t.ctx, t.rows, t.dp_exposed, t.optimizer
    pipeline = _pipeline(rows, m, t.inputs)
    row = rows[pipeline.worst]
    step = pipeline.seconds + dp_exposed + optimizer + t.offload_s
    breakdown = ThroughputBreakdown(
        compute_s=m * row.compute,
        tp_comm_s=m * row.tp,
        cp_comm_s=m * row.cp,
        ep_comm_s=m * row.ep,
        dp_comm_s=m * row.sharding.micro + dp_exposed,
        pp_comm_s=m * row.pp,
        bubble_s=pipeline.bubble,
        recompute_s=m * row.recompute,
        other_s=optimizer + m * (row.launch_bound + row.sharding.copies),
        offload_s=t.offload_s,
    )
    warnings = t.warnings + layout_warnings(job, plan, ctx.lk, m)
    assumptions = throughput_assumptions(job, plan, m, pipeline.worst, ctx.cal, ctx) + _pipeline_words(pipeline) \
        + ([f"Offload: {t.offload_how} (meshplan/arithmetic/offload.py, cards/offload.yaml)."] if t.offload_how
           else [])
    return _report(job, plan, ctx, step, t.peaks, breakdown, assumptions, warnings)


def _peaks(job: Job, cal: Calibration) -> Peaks:
    gpu = job.gpu
    fp8 = gpu.fp8_flops * cal.fp8_gemm_relative_efficiency if job.precision == "fp8" and gpu.fp8_flops else None
    mfu_peak = gpu.fp8_flops if job.precision == "fp8" and gpu.fp8_flops else gpu.bf16_flops
    return Peaks(gpu.bf16_flops, fp8, mfu_peak)


def layer_context(job: Job, plan: Plan, cal: Calibration, lk: Links, peaks: Peaks, m: int,
                  attention_kernel: str | None) -> LayerContext:
    """What the per-layer model needs for this job and plan (`m` micro-batches per step), computed once: what reads
    of the plan only FACT_READS from job_facts, the rest here."""
    tokens = rank_tokens(job, plan.micro_batch_size, plan.tp, plan.cp, plan.zero_stage)  # padding included
    shard = Shard(tokens=tokens, tp=plan.tp, ep=plan.ep, etp=plan.etp, sp=plan.sequence_parallel,
                  moe_whole=job.card.moe_whole_over_tp)
    return LayerContext(
        plan=plan, law=job.card.world_size_law, shard=shard,
        a2a_steady_share=_a2a_steady(job, plan, m) if plan.moe_a2a_overlap else 0.0,
        moe_host_syncs=moe_host_syncs(job, plan), dispatch_passes=dispatcher_passes(job, plan, cal),
        routed_load=ep_rank_load(job, plan),
        consecutive_routing=job.moe_fake_balanced_gate,
        expert_launches=expert_launches(job, plan),
        stacked_experts=stacks_experts(job.card.moe_expert_weights),
        sp_copies=sp_copies(job.card.tp_overlap, plan, job.framework_version),
        fp8_casts=fp8_casts(job, plan), fp8_store_cast_bytes=swiglu_store_cast_bytes(job),
        bias_activation_fusion=job.bias_activation_fusion,
        shared_expert_overlap=shared_expert_overlap(job, plan),
        **job_facts(job, plan, cal, lk, peaks, attention_kernel))


FACT_READS = ("attention_backend", "zero_stage", "dropout", "tp_comm_overlap", "torch_compile")
"""The plan fields job_facts reads (ZeRO stage: the memory convention's flash attention and dropout, the attention
kernel's engine, LoRA's engine); tests/test_layer_memo.py holds it."""


def job_facts(job: Job, plan: Plan, cal: Calibration, lk: Links, peaks: Peaks,
              attention_kernel: str | None) -> dict:
    """layer_context's fields that read of the plan only FACT_READS: the job's model, calibration, links, peaks, HBM
    bandwidth, attention kernel and switches, compile scope and TP overlap. Inside a shared_layers scope once per job,
    calibration, links and peaks (by identity: the entry keeps them alive, so their ids stay theirs), attention kernel
    and the values of FACT_READS."""
    memo = scope_memo("job_facts")
    if memo is None:
        return _job_facts(job, plan, cal, lk, peaks, attention_kernel)
    key = (id(job), id(cal), id(lk), id(peaks), attention_kernel, plan.attention_backend, plan.zero_stage,
           plan.dropout, plan.tp_comm_overlap, plan.torch_compile)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (job, cal, lk, peaks, _job_facts(job, plan, cal, lk, peaks, attention_kernel))
    return hit[-1]


def _job_facts(job: Job, plan: Plan, cal: Calibration, lk: Links, peaks: Peaks,
               attention_kernel: str | None) -> dict:
    _, conv, _ = convention(job.card, plan.zero_stage)
    flash, dropout = attention_switches(job, conv, plan)
    kernel, fraction = attention_efficiency(job, cal, attention_kernel, plan.attention_backend, plan.zero_stage)
    overlap = job.card.tp_overlap
    eager = eager_blocks(job, plan)
    qkv_separate = convention(job.card, plan.zero_stage, job.framework_version)[1].qkv_projections == "separate"
    return dict(
        arch=trained_model(job), seq=job.seq_length, cal=cal, lk=lk, bf16_peak=peaks.bf16, fp8_peak=peaks.fp8,
        hbm=job.gpu.hbm_bandwidth * cal.hbm_efficiency, flash=flash, dropout=dropout, lora=job.lora,
        lora_engine=lora_engine(job.card, plan.zero_stage) if job.lora else None,
        eager=eager, hf_eager=hf_eager_code(job, plan), experts_fused=experts_fused(job),
        compiled=compiled_blocks(job, plan), attention_fraction=fraction,
        attention_kernel=kernel, ulysses=runs_ulysses(job.card, plan.zero_stage), mla_v_pad=flash and conv.mla_v_pad,
        torch_cp=runs_torch_cp(job.card, plan.zero_stage), kv_repeated=ring_repeats_kv(job, plan.zero_stage),
        qkv_separate=qkv_separate,
        unfused_rope=runs_unfused_rope(job, plan.zero_stage),
        gather_dispatch=job.card.moe_dispatch is not None and job.card.moe_dispatch.alltoall_as == "allgather",
        tp_overlap_mode=tp_overlap_mode(job.card, plan), tp_rs_splits=overlap.rs_splits,
        async_tp_unfused=async_tp_unfused(overlap, tp_overlap_mode(job.card, plan), qkv_separate, job.model.gated_mlp),
        tp_input_ops=tp_input_ops(job.card.tp_input_linears, job.model, eager),
        tp_input_regather=overlap.backward_input_gather,
        tp_sms=tp_sms(job.gpu, overlap, peaks.fp8 is not None))


def entropy_chunks(passes: RlLossPasses, tokens: float, vocab_shard: float) -> int:
    """The chunks an engine's chunked entropy cuts a micro-batch's `tokens` (on one rank) into: of the card's
    entropy_chunk_tokens each, or of as many tokens as entropy_chunk_budget_bytes holds at 4 bf16 copies of the
    rank's `vocab_shard` a token, rounded down to a power of two (SkyRL model_utils.py
    _resolve_vocab_entropy_chunk_size); 1 where the entropy is not chunked."""
    if passes.entropy_chunk_tokens is not None:
        chunk = passes.entropy_chunk_tokens
    elif passes.entropy_chunk_budget_bytes is not None:
        fit = max(1, int(passes.entropy_chunk_budget_bytes // (vocab_shard * 2 * 4)))
        chunk = 1 << (fit.bit_length() - 1)
    else:
        return 1
    return max(1, math.ceil(tokens / chunk))


def loss_hbm_bytes(job: Job, plan: Plan, conv: Convention, cal: Calibration,
                   tokens: float | None = None) -> float:
    """HBM bytes per logit the job's cross-entropy moves, forward + backward: an RL actor's loss path where the
    engine's card counts one (memory_states.rl_loss: its temperature division, log-probs and the entropy it computes,
    with its gradient where RLJob.entropy_coeff puts it in the loss) beside the Megatron-Core loss the engine calls;
    else the Megatron-Core loss the job runs (memory_states.megatron_loss: the switch's where the framework has it,
    else the one the plan's engine calls itself; cards/memory.yaml megatron_cross_entropy), else the engine's own loss
    where its convention counts one (loss_hbm_bytes_per_logit), else a fused cross-entropy's (the calibration's
    cross_entropy_bytes_per_logit). A chunked entropy's gradient adds its chunks' whole-logits gradients
    (entropy_chunks over the micro-batch's `tokens` on one rank: the plan's micro-batch where not given)."""
    loss, passes = megatron_loss(job, plan), rl_loss(job, plan)
    if passes is not None:
        entropy = 0.0
        if job.rl.entropy_coeff:
            if tokens is None:
                tokens = plan.micro_batch_size * job.seq_length / plan.cp
            shard = built_vocab(job.model.vocab_size, conv, plan.tp) / (
                1 if conv.logits_over_tp == "replicated" else plan.tp)
            entropy = (passes.entropy_update_hbm_bytes_per_logit
                       + passes.entropy_chunk_bytes_per_logit * entropy_chunks(passes, tokens, shard))
        return (loss.hbm_bytes_per_logit if loss is not None else 0.0) + passes.update_hbm_bytes_per_logit + entropy
    if loss is not None:
        return loss.hbm_bytes_per_logit
    return conv.loss_hbm_bytes_per_logit or cal.cross_entropy_bytes_per_logit


def log_prob_loss_bytes(job: Job, plan: Plan, old_policy: bool) -> float | None:
    """HBM bytes per logit one no-grad log-prob pass of an RL actor moves in its loss path, forward alone: the
    engine's (memory_states.rl_loss forward_hbm_bytes_per_logit; the old policy's pass adds the entropy the engine
    computes there) beside the forward of the Megatron-Core loss it calls (megatron_cross_entropy's
    forward_hbm_bytes_per_logit, a third of the whole where the count has no split); None where the engine's card
    counts none (rl/step_time.log_prob_seconds then keeps a third of the update's)."""
    passes = rl_loss(job, plan)
    if passes is None:
        return None
    loss = megatron_loss(job, plan)
    kernel = 0.0 if loss is None else loss.forward_hbm_bytes_per_logit or loss.hbm_bytes_per_logit / 3
    entropy = passes.old_log_prob_entropy_hbm_bytes_per_logit if old_policy else 0.0
    return kernel + passes.forward_hbm_bytes_per_logit + entropy


class HeadLoss(NamedTuple):
    """What the RL step's log-prob passes weigh their loss paths against on a rank of the output layer's stage
    (rl/step_time.log_prob_loss_seconds), resolved once per job and plan by `head_loss` (one convention lookup)."""

    update_bytes: float  # HBM bytes per logit of the update's loss (loss_hbm_bytes)
    logits: float  # logits that rank holds over the job's whole batch (logits_per_head_rank)


def head_loss(job: Job, plan: Plan) -> HeadLoss:
    """HeadLoss of the plan's engine, with its own convention and calibration."""
    conv = convention(job.card, plan.zero_stage, job.framework_version)[1]
    return HeadLoss(loss_hbm_bytes(job, plan, conv, calibration(job.framework)), logits_per_head_rank(job, plan, conv))


def logits_per_head_rank(job: Job, plan: Plan, conv: Convention) -> float:
    """Logits one rank of the output layer's stage holds over the job's whole batch (global_batch_size x seq_length
    tokens over its plan.dp x cp data- and context-parallel ranks: an RL job's trainer's, whose GPUs are its num_gpus,
    the rollout pool's and a critic's taken out, rl/job._pools; the vocabulary as the head builds it under `conv`,
    over TP where the convention splits the logits): what a pass over the batch's logits reads and writes per byte
    per logit."""
    vocab = built_vocab(job.model.vocab_size, conv, plan.tp)
    tokens = job.global_batch_size * job.seq_length / (plan.dp * plan.cp)
    return tokens * vocab / (1 if conv.logits_over_tp == "replicated" else plan.tp)


def head_seconds(job: Job, plan: Plan, ctx: LayerContext) -> float:
    """The output layer's logits GEMM and cross-entropy per micro-batch on the head stage, forward + backward: the GEMM
    over the head's vocabulary shard (the whole vocabulary where the card leaves the head whole without sequence
    parallelism: tp_card.head_tp), the loss's memory-bound passes over the logits each rank holds (all of them where
    the convention keeps them whole on every TP rank, logits_over_tp: the convention's own loss where it counts one,
    loss_hbm_bytes_per_logit, else a fused cross-entropy's), and the all-gather of the shards' logits into them where
    the head is split. An engine that trains transformers' code eagerly adds its final norm's and embedding's passes
    (layer_time.eager_edge_seconds; on the one stage those engines run)."""
    arch, cal = job.model, ctx.cal
    conv = convention(job.card, plan.zero_stage, job.framework_version)[1]
    vocab = built_vocab(arch.vocab_size, conv, plan.tp)  # as the memory's embedding, head and logits
    split = head_tp(job.card.output_head_tp, plan.tp, plan.sequence_parallel)
    shard = ctx.shard if split == plan.tp else replace(ctx.shard, tp=split)
    head = gemm_seconds([logits_gemm(arch, shard, vocab)], cal, ctx.bf16_peak, None)
    if job.lora is not None:  # a frozen output layer: forward and data gradient only
        head *= FROZEN_PASSES_PER_FORWARD / TRAINING_PASSES_PER_FORWARD
    whole = conv.logits_over_tp == "replicated"
    head += (loss_hbm_bytes(job, plan, conv, cal, ctx.shard.tokens) * ctx.shard.tokens * vocab
             / (1 if whole else plan.tp) / ctx.hbm)
    if ctx.hf_eager and plan.pp == 1:  # transformers' final norm and embedding, eager (those engines run no pipeline)
        head += eager_edge_seconds(ctx, vocab)
    if whole and split > 1:
        groups = mesh.mesh_groups(plan, law=ctx.law)
        head += ring_time(ctx.shard.tokens * vocab * BF16, groups.tp.size, groups.tp.stride, ctx.lk)
    return head


def stage_inputs(job: Job, plan: Plan, ctx: LayerContext, once_per_step: bool = True) -> StageInputs:
    """One layer of each kind the model has (a hybrid's: one per letter of its pattern, hybrid_time.hybrid_layers),
    the stages' layers, the head, the pipeline's p2p, the sharding schedule and its DP groups, Muon: what every
    stage's time reads. Without `once_per_step`, what stage_work reads (its layers' sums, no sharding windows): no
    sharding schedule, DP groups, rank parameters or Muon (None), its head kept_head's."""
    arch, cal, lk = job.model, ctx.cal, ctx.lk
    hybrid = hybrid_layers(ctx) if arch.layer_pattern is not None else None
    if hybrid is not None and plan.optimizer == "muon":
        raise MeshplanError(f"{arch.name} is a hybrid model: meshplan does not time Muon's Newton-Schulz steps on its "
                            "Mamba-2 layers' matrices.", fix="Ask for optimizer adam.")
    dense = hybrid is None and (arch.moe is None or len(arch.moe.moe_layers) < arch.num_layers)
    dense_lt = memo_layer(layer_time, ctx, False) if dense else None  # shared across plans inside a search
    moe_lt = memo_layer(layer_time, ctx, True, overlapped_twin) \
        if hybrid is None and arch.moe is not None and arch.moe.moe_layers else None
    pipeline = stage_layers(job, plan)
    recompute = recompute_of(job, plan)
    # Logits and cross-entropy on the last stage, again per MTP depth; MTP blocks (if the model has them) there too.
    head = kept_head(job, plan, ctx, pipeline) if not once_per_step else \
        head_with_mtp(head_seconds(job, plan, ctx), arch, ctx, pipeline)
    p2p = pipeline_p2p(job, plan, cal, lk)
    pp_hop = p2p.hop
    if once_per_step:
        law = ctx.law
        groups = mesh.mesh_groups(plan, edp=int(mesh.expert_dp(job.num_gpus, plan, law)) if arch.moe else 1, law=law)
        sharding, traffic, parts = sharding_schedule(job, plan), dp_traffic(job, plan, lk, groups, cal), \
            time_rank_parts(job, plan)
    else:
        sharding = traffic = parts = None
    return StageInputs(
        job=job, plan=plan, ctx=ctx, dense=dense_lt, moe=moe_lt, hybrid=hybrid, pipeline=pipeline, recompute=recompute,
        head=head,
        pp_comm=_exposed_p2p(job, plan, cal, pp_hop), pp_hop=pp_hop,
        pp_cross_layer=p2p.cross_layer,
        # Blocking p2p (metadata received and read on the host before each activation/gradient) stops
        # the host running ahead of the GPU: per micro-batch, pp_host_sync of the shorter of host issue
        # time and GPU time is serialised behind the longer one instead of hidden under it.
        host_sync=cal.pp_host_sync if plan.pp > 1 else 0.0,
        sharding=sharding, traffic=traffic,
        # Muon (Megatron-Core's emerging optimizer; the framework card's muon section says how it runs): None = Adam
        muon=job.card.muon if once_per_step and plan.optimizer == "muon" and job.lora is None else None,
        parts=parts)


HEAD_UNREAD = frozenset({"dp", "ep", "etp", "moe_token_dispatcher", "moe_a2a_overlap", *RECOMPUTE_FIELDS})
"""Plan fields head_seconds and head_with_mtp never read (tests/test_head_memo.py holds it): kept_head's key leaves
them out."""
_HEAD_VALUES = plan_values_but(HEAD_UNREAD)


def kept_head(job: Job, plan: Plan, ctx: LayerContext, pipeline: Stages) -> float:
    """head_with_mtp(head_seconds(...)), inside a shared_layers scope once per job_family, calibration and plan fields
    but HEAD_UNREAD (the references stage_work gives differ in their expert grid and global batch); the entry keeps
    the job and calibration alive, so the ids in the key stay theirs."""
    memo = scope_memo("heads")
    if memo is None:
        return head_with_mtp(head_seconds(job, plan, ctx), ctx.arch, ctx, pipeline)
    key = (job_family(job), id(ctx.cal), _HEAD_VALUES(plan))
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (job, ctx.cal, head_with_mtp(head_seconds(job, plan, ctx), ctx.arch, ctx, pipeline))
    return hit[2]


def job_family(job: Job) -> tuple:
    """The job's card and values but its global batch (an object's by identity: model_copy's copies share them),
    kept per job (kept alive) inside a shared_layers scope."""
    memo = scope_memo("job_families")
    hit = memo.get(id(job)) if memo is not None else None
    if hit is None:
        hit = (job, (id(job.card), *(v if type(v) in (int, float, str, bool, type(None)) else id(v)
                                     for name, v in job.__dict__.items() if name != "global_batch_size")))
        if memo is not None:
            memo[id(job)] = hit
    return hit[1]


def recompute_of(job: Job, plan: Plan) -> Recompute:
    """What the plan's recompute repeats, as the stages' time reads it: the framework's "selective", torchtitan's
    every N-th block, Megatron's recompute modules."""
    return Recompute(selective=job.card.recompute.selective, every_nth=every_nth_blocks(plan),
                     modules=selective_modules(plan),
                     attention=op_sac_recomputes_attention(job, plan.attention_backend, plan.zero_stage))


def dp_traffic(job: Job, plan: Plan, lk: Links, groups: mesh.MeshGroups, cal: Calibration) -> DpTraffic:
    """The data-parallel collectives' groups: DP x CP and expert-DP, or with hybrid sharding (memory_states.
    state_replicas over 1: the plan's dp_replicate, or dp where ZeRO-0 is fully_shard over a shard of one) one
    replica's shard groups, the replicas' groups beside them (mesh.replica_groups), and whether the replicas'
    all-reduce runs with each FSDP unit's reduce-scatter (cal.fsdp_hybrid_allreduce_last_microbatch)."""
    replicas = state_replicas(job, plan)
    if replicas == 1:
        return DpTraffic(plan=plan, lk=lk, dense=groups.dp_cp, expert=groups.edp)
    dense, dense_replicas = mesh.replica_groups(groups.dp_cp, replicas)
    expert, expert_replicas = mesh.replica_groups(groups.edp, replicas)
    return DpTraffic(plan=plan, lk=lk, dense=dense, expert=expert, replicas=(dense_replicas, expert_replicas),
                     replicas_with_each_reduce=cal.fsdp_hybrid_allreduce_last_microbatch < 0.5)


class PipelineP2p(NamedTuple):
    """A pipeline's send/receive between neighbouring stages, per micro-batch."""

    hop: float  # one activation (or its gradient) to the next stage
    cross_layer: float  # per layer, where stages cross NVLink domains with host-synchronous p2p (nanotron)


def pipeline_p2p(job: Job, plan: Plan, cal: Calibration, lk: Links) -> PipelineP2p:
    """The pipeline's p2p terms stage_inputs reads (and the search's pipeline bound, through exposed_pipeline_p2p):
    one micro-batch's hidden states (sequence-parallel: a TP shard of them), inside or across NVLink domains."""
    if plan.pp == 1:
        return PipelineP2p(0.0, 0.0)
    tokens = rank_tokens(job, plan.micro_batch_size, plan.tp, plan.cp, plan.zero_stage)  # layer_context's shard.tokens
    cross = mesh.mesh_groups(plan, law=job.card.world_size_law).pp.crosses(lk.domain)
    nbytes = tokens * job.model.hidden_size * BF16 / (plan.tp if plan.sequence_parallel else 1)
    return PipelineP2p(p2p_time(nbytes, cross, lk, cal.pp_latency_inter_s),
                       cal.pp_cross_sync_per_layer_s * plan.tp if cross else 0.0)


def exposed_pipeline_p2p(job: Job, plan: Plan) -> float | None:
    """The exposed pipeline send/receive per micro-batch of a plan without interleaving (every rank's the same): the
    breakdown's pp_comm_s per micro-batch, from pipeline_p2p without building the step (what the search's pipeline
    bound multiplies by vpp). Refused like step_terms (require_estimable); None where the per-layer host sync makes
    it depend on the slowest stage's layers (the step's terms give it)."""
    require_estimable(job, plan)
    cal = calibration(job.framework)
    p2p = pipeline_p2p(job, plan, cal, kept_links(job, cal))
    return None if p2p.cross_layer else max(_exposed_p2p(job, plan, cal, p2p.hop))


def pipeline_unit(job: Job, plan: Plan) -> float:
    """The exposed transfers of exposed_pipeline_p2p (what interleaving multiplies by vpp: one per chunk), whatever
    the rules say of the plan: it reads of the plan only its degrees (tp, cp, dp, pp: the pipeline group's span),
    micro-batch, sequence parallelism and vpp, so a refused plan's is the traffic of any plan with those (the search's
    pipeline bound reads a non-interleaved base's). Without nanotron's per-layer host sync across NVLink domains: that
    is paid per layer, as many on a rank at any vpp, so a bound that multiplies the unit by vpp leaves it out."""
    cal = calibration(job.framework)
    p2p = pipeline_p2p(job, plan, cal, kept_links(job, cal))
    return max(_exposed_p2p(job, plan, cal, p2p.hop))


def _exposed_p2p(job: Job, plan: Plan, cal: Calibration, hop: float) -> tuple[float, ...]:
    """Each pipeline rank's blocking p2p seconds per micro-batch: one transfer after each chunk's forward and backward
    (2 x vpp hops), less pp_overlap; where the framework overlaps the steady state's transfers with compute (its
    card's pipeline.steady_p2p_overlap, with virtual stages: Megatron's overlap_p2p_comm), only those of the rank's
    warm-up and cool-down ops (1 - pipeline_counts.steady_share of its replayed order)."""
    full = (1.0 - cal.pp_overlap) * FORWARD_AND_BACKWARD * plan.vpp * hop
    if plan.pp == 1 or plan.vpp == 1 or not job.card.pipeline.steady_p2p_overlap:
        return (full,) * plan.pp
    m = plan.schedule_microbatches(job.global_batch_size)
    shape = plan_shape(job.card, plan.pp, plan.vpp, m, plan.runs_schedule)
    return tuple(full * (1.0 - steady_share(shape, r)) for r in range(plan.pp))


def _a2a_steady(job: Job, plan: Plan, m: int) -> float:
    """The share of micro-batch chunks whose expert all-to-all the combined 1F1B hides: with a pipeline (the schedule
    moe_a2a_overlap runs, Plan.runs_schedule), the fused steps of its replayed order on the first rank; without one,
    the count of forward_backward_no_pipelining's combined steps (moe_time.a2a_steady_share)."""
    if plan.runs_schedule == "combined_1f1b" and plan.pp > 1:
        return fused_share(plan_shape(job.card, plan.pp, plan.vpp, m, plan.runs_schedule), 0)
    return a2a_steady_share(m, plan.pp, plan.vpp)


def _pipeline(rows: list[StageTime], m: int, inp: StageInputs) -> PipelineTime:
    """The step of the plan's schedule replayed (pipeline_timeline.simulate): each rank's micro-batch time split
    into its forward share (the forward's part of its compute, recompute counted in the backward) and the rest,
    over its virtual chunks, one p2p hop between neighbouring stages."""
    plan = inp.plan
    totals = [r.total for r in rows]
    worst = max(range(len(totals)), key=totals.__getitem__)
    t_max = totals[worst]
    if plan.pp == 1:
        return PipelineTime(worst, m * t_max, 0.0)
    shape, runs = _pipeline_shape(m, inp)
    # the weight gradients' share of each chunk's backward compute, where the order runs them apart
    share = weight_gradient_share(inp.ctx.arch, inp.job.seq_length) if shape.order in SPLIT_ORDERS else None
    chunks = _chunk_seconds(rows, shape, inp, share)
    timeline = simulate(shape, chunks.fwd, chunks.bwd, inp.pp_hop, chunks.wgrad, chunks.last)
    seconds = max(runs * timeline.seconds, m * t_max)
    facts = inp.job.card.pipeline
    name = facts.interleaved if shape.order == "interleaved_1f1b" and facts.interleaved else facts.schedule
    if plan.runs_schedule is not None:
        name = facts.schedules.get(shape.order, shape.order)
    if shape.order in ("interleaved_1f1b", "interleaved_zero_bubble", "combined_1f1b") and shape.vpp > 1:
        name += f" (v={shape.vpp}, {shape.group} micro-batches per chunk in turn)"
    elif shape.order in V_ORDERS:
        name += " (two chunks per rank in a V)"
    if share is not None:
        name += (f", weight gradients apart from the input gradients ({share:.0%} of the backward's FLOPs, the "
                 "linears' weight-gradient GEMMs)")
    if runs > 1:
        name += f", run {runs} times per step over {m // runs} micro-batches each"
    return PipelineTime(worst, seconds, seconds - m * t_max, timeline.idle_share, name)


def _pipeline_shape(m: int, inp: StageInputs) -> tuple[Shape, int]:
    """The schedule `_pipeline` replays (pp > 1) over one of its runs' micro-batches, and its runs per accumulation
    step (torchtitan runs it once per accumulation step)."""
    plan = inp.plan
    runs = plan.schedule_runs(inp.job.global_batch_size)
    return plan_shape(inp.job.card, plan.pp, plan.vpp, m // runs, plan.runs_schedule), runs


class ChunkSeconds(NamedTuple):
    """One micro-batch's seconds per chunk as `_pipeline` replays them (simulate's arguments): each rank's forward and
    backward per chunk, the last virtual stage's (forward, backward, weight-gradient part) where they are not its
    rank's (None elsewhere), and each rank's weight-gradient part of a chunk's backward where the order runs it apart
    from the input gradient (None elsewhere)."""

    fwd: list[float]
    bwd: list[float]
    last: tuple[float, float, float] | None
    wgrad: list[float] | None


def _chunk_seconds(rows: list[StageTime], shape: Shape, inp: StageInputs,
                   wgrad_share: float | None = None) -> ChunkSeconds:
    """Each rank's forward and backward seconds per chunk of one micro-batch, as `_pipeline` replays them, and where
    the head's rank runs more than one chunk, the (forward, backward, weight-gradient part) seconds of the last virtual
    stage's chunk (simulate's `last`; None elsewhere), that rank's fwd / bwd then its other chunks'. The output layer
    and loss run in that chunk alone (Megatron-Core's get_model builds post_process only into the last virtual stage's
    model chunk, is_pipeline_last_stage with its vp_stage), beside its own decoder layers (Stages.chunks: fewer where a
    recipe counts the loss in the split) and the MTP blocks that rank trains (Megatron-Core puts them in the last
    stage); the rest of the rank's micro-batch is shared by its layers and MTP blocks alike (stage_kinds: each costs
    like a layer), the forward the same share of it in every chunk, and the rank's total is the same.

    `wgrad_share`: the weight gradients' share of the backward compute where the order runs them apart (None: it does
    not, and no weight-gradient part is split): each chunk's part; on the head's rank its layers' part by its chunks'
    backward seconds less the head's, the head's own on its chunk alone."""
    fwd = [r.total * _forward_share(r) / shape.vpp for r in rows]
    bwd = [r.total / shape.vpp - f for r, f in zip(rows, fwd, strict=True)]
    wgrad = None if wgrad_share is None else [wgrad_share * (r.compute - r.fwd) / shape.vpp for r in rows]
    owner, head, pipeline = inp.pipeline.head_rank, inp.head, inp.pipeline
    if shape.vpp == 1 or shape.rank_of(shape.stages - 1) != owner:
        return ChunkSeconds(fwd, bwd, None, wgrad)
    units = len(stage_kinds(owner, pipeline.layers(owner), inp))  # its decoder layers and MTP blocks
    last_units = len(pipeline.chunks[owner][-1]) + units - len(pipeline.layers(owner))
    if head <= 0.0 and last_units * shape.vpp == units:  # every chunk alike
        return ChunkSeconds(fwd, bwd, None, wgrad)
    row = rows[owner]
    head_fwd = head / TRAINING_PASSES_PER_FORWARD
    head_bwd = head - head_fwd
    rest_fwd, rest_bwd = row.total * _forward_share(row) - head_fwd, row.total - row.total * _forward_share(row)
    rest_bwd -= head_bwd
    other = (units - last_units) / (shape.vpp - 1) / units if units else 1.0 / shape.vpp
    mine = last_units / units if units else 1.0 / shape.vpp
    fwd[owner], bwd[owner] = rest_fwd * other, rest_bwd * other
    last_fwd, last_bwd = rest_fwd * mine + head_fwd, rest_bwd * mine + head - head_fwd
    if wgrad is None:
        return ChunkSeconds(fwd, bwd, (last_fwd, last_bwd, 0.0), None)
    layers_wgrad = wgrad_share * (row.compute - row.fwd - head_bwd)
    layers_bwd = (shape.vpp - 1) * bwd[owner] + last_bwd - head_bwd  # its chunks' backward seconds less the head's
    wgrad[owner] = layers_wgrad * bwd[owner] / layers_bwd if layers_bwd > 0 else 0.0
    last_wgrad = wgrad_share * head_bwd + (layers_wgrad - (shape.vpp - 1) * wgrad[owner])
    return ChunkSeconds(fwd, bwd, (last_fwd, last_bwd, last_wgrad), wgrad)


def _forward_share(row: StageTime) -> float:
    """The forward's share of a stage's time per micro-batch: its share of the compute, recompute in the backward."""
    work = row.compute + row.recompute
    return row.fwd / work if work > 0 else 1.0 / TRAINING_PASSES_PER_FORWARD


def _pipeline_words(pipeline: PipelineTime) -> list[str]:
    if not pipeline.schedule:
        return []
    return [f"Pipeline schedule {pipeline.schedule}: its timeline leaves {pipeline.idle:.0%} of the pipeline's "
            f"GPU-seconds idle, the stages' unequal work included ({pipeline.bubble:.3g} s of bubble: the step beyond "
            "the micro-batches x the slowest stage)."]


def _dp_exposed(s: int, row: StageTime, inp: StageInputs, syncs: dict | None = None) -> float:
    """Stage `s`'s exposed once-per-step DP traffic: the gradient reduction (overlapped with the last backward, or
    chunk by chunk with the backward after each chunk's last micro-batch where the framework launches it so:
    sync_chunks; later stages finish their backward earlier, which gives them slack) and the ZeRO parameter all-gather
    (with the first forward, or a chunk ahead). `syncs`:
    step_sync per the stage's dense and expert parameters, kept by the caller for one plan's stages (all else it
    reads is the plan's)."""
    plan, cal, traffic = inp.plan, inp.ctx.cal, inp.traffic
    bwd = row.compute - row.fwd + row.recompute
    # later stages finish their last backward (and start their first forward) earlier: slack
    slack = s * bwd / max(1, plan.vpp)
    exposed = 0.0
    if inp.sharding.per_step:  # ZeRO-2/3, FSDP: the once-per-step gathers / reduce-scatters, unit by unit
        exposed = max(0.0, row.sharding.step_gather - s * row.fwd / max(1, plan.vpp))
        exposed += max(0.0, row.sharding.step_reduce - slack)
    edge = stage_edge(s, inp)
    key = (row.dense_params, row.expert_params, edge)
    sync = None if syncs is None else syncs.get(key)
    if sync is None:
        sync = step_sync(inp.job, plan, cal, inp.ctx.lk, traffic, *key[:2], inp.sharding.per_step, edge=edge)
        if syncs is not None:
            syncs[key] = sync
    chunks = sync_chunks(inp.job, plan.pp, plan.vpp, plan.num_microbatches(inp.job.global_batch_size))
    exposed += chunked_reduce_exposed(sync.reduce, sync.reduce_hidden, bwd, chunks, slack, sync.sm_share)
    return exposed + chunked_gather_exposed(sync.gather, sync.gather_hidden, row.fwd, chunks, sync.sm_share)


class SyncChunks(NamedTuple):
    """How a rank's overlapped once-per-step DP sync is launched (the card's pipeline.chunk_dp_sync): in `chunks`
    equal parts, one per virtual chunk, `group` micro-batches of each chunk's work apart (the last micro-batch group's
    size: min(m, pp)); one part at the stage's last backward and first forward where the framework does not."""

    chunks: int = 1
    group: int = 1


def sync_chunks(job: Job, pp: int, vpp: int, m: int | None = None) -> SyncChunks:
    """The SyncChunks of a plan of pp stages of vpp chunks at `m` micro-batches per step (None: the most any m gives,
    pp, what the search's sync floor reads)."""
    if vpp == 1 or not job.card.pipeline.chunk_dp_sync:
        return SyncChunks()
    return SyncChunks(vpp, pp if m is None else min(m, pp))


def chunked_reduce_exposed(seconds: float, share: float, bwd: float, chunks: SyncChunks, slack: float = 0.0,
                           sm_share: float = 0.0) -> float:
    """The exposed part of a rank's gradient reduction of `seconds`, `share` of a chunk's last backward hiding its own
    buckets (0: not overlapped, all of it after the backward), `bwd` the stage's backward per micro-batch. Launched per
    chunk from the last chunk to the first, each once its last micro-batch's backward is done, the reductions queue
    on one stream behind the group x bwd / chunks of backward left after each: chunk c's is done (c + 1) x seconds /
    chunks after the first launch at the latest, c x group x bwd / chunks before the backward ends, so the tail is the
    larger of the last chunk's part and what the window leaves; one chunk is the stage's whole sync. `slack`: how much
    earlier this rank's backward ends than the step's (s chunk-backwards on pipeline rank s), which the last chunk's
    part gains; the queue does not, as the schedule launches each chunk's sync that many chunk-backwards late
    (microbatch_id - pipeline_parallel_rank). `sm_share`: of the SMs the reduction's NCCL kernels hold, so the
    backward beside its hidden seconds runs slower (comm.beside_compute, contended)."""
    if share <= 0.0:
        return max(0.0, seconds - slack)
    op = bwd / chunks.chunks
    if chunks.chunks == 1:
        return max(0.0, beside_compute(seconds, share * op, sm_share) - slack)
    tail = max(seconds / chunks.chunks - slack, seconds - (chunks.chunks - 1) * chunks.group * op)
    exposed = max(0.0, tail - share * op)  # the tail already less the slack; the backward's delay is not
    return max(exposed, contended(0.0, seconds - exposed, sm_share) - slack)


def chunked_gather_exposed(seconds: float, share: float, fwd: float, chunks: SyncChunks,
                           sm_share: float = 0.0) -> float:
    """The exposed part of ZeRO-1/2's parameter all-gather of `seconds`, `share` of a chunk's first forward hiding its
    own buckets (0: not overlapped, all of it before the forward), `fwd` the stage's forward per micro-batch. Per chunk,
    the first chunk's before its first forward and each later one's launched a chunk ahead, with group x fwd / chunks
    of the chunk before it to run beside. `sm_share`: of the SMs the gather's NCCL kernels hold, so the forward beside
    its hidden seconds runs slower (comm.contended)."""
    if share <= 0.0:
        return seconds
    op, part = fwd / chunks.chunks, seconds / chunks.chunks
    exposed = max(0.0, part - share * op) + (chunks.chunks - 1) * max(0.0, part - chunks.group * op)
    return contended(exposed, seconds - exposed, sm_share)


def chunked_share(share: float, chunks: SyncChunks) -> float:
    """The most of one micro-batch's backward (or forward) the chunked sync may hide per second of it, at most
    (chunked_reduce_exposed and chunked_gather_exposed are at least seconds less this times bwd or fwd): the search's
    sync floor (estimate/sync_floor.py)."""
    if share <= 0.0:
        return 0.0
    return (share + (chunks.chunks - 1) * chunks.group) / chunks.chunks


def stage_edge(s: int, inp: StageInputs) -> float:
    """The embedding (first stage) and output layer (head stage) parameters stage `s`'s rank holds: bf16 in an fp8
    parameter all-gather (sharding_traffic.optimizer_gather_bytes)."""
    return (inp.parts.embedding if s == 0 else 0.0) + (inp.parts.head if s == inp.pipeline.head_rank else 0.0)


class StepSync(NamedTuple):
    """A rank's once-per-step DP collectives outside FSDP's units (_dp_exposed): the gradients' reduction, hidden by
    up to `reduce_hidden` of the last micro-batch's backward (of each chunk's, where they are launched per chunk:
    chunked_reduce_exposed), and ZeRO-1/2's all-gather of the updated parameters, hidden by up to `gather_hidden` of
    the next forward (chunked_gather_exposed) (0 and 0 where there is none of either)."""

    reduce: float
    reduce_hidden: float
    gather: float = 0.0
    gather_hidden: float = 0.0
    sm_share: float = 0.0  # of the SMs their NCCL kernels hold beside the compute (DpTraffic.sm_share)


def step_sync(job: Job, plan: Plan, cal: Calibration, lk: Links, traffic: DpTraffic, dense: float, expert: float,
              per_step: bool, edge: float = 0.0) -> StepSync:
    """The once-per-step collectives of a rank holding `dense` and `expert` parameters, `edge` of the dense ones its
    embedding and output layer (ZeRO-1/2's parameter all-gather: sharding_traffic.optimizer_gather_bytes; 0, every
    weight at the gather's own bytes, bounds it from below) (`per_step`: the sharding
    schedule's units move the gradients, so only hybrid sharding's all-reduce across the replicas is left here, where
    it runs once in the last micro-batch, its backward hiding dp_overlap of it: Megatron-FSDP, whose own overlap holds
    with the plan's grad_reduce_overlap off too, sharding_traffic.units_kept_overlapped; with each unit's reduction,
    DpTraffic.reduce, it is the units' own)."""
    grad_bytes = grad_reduce_bytes(plan, cal)  # the plan's grad_reduce_in_fp32, else the framework's default
    # ZeRO-1/2 (not FSDP) may still all-reduce the whole gradient (nanotron without DDP) and may
    # run it after the backward instead of bucket by bucket inside it (zero_grad_* in the card).
    zero_reduce = plan.zero_stage > 0 and not uses_fsdp(job.card, plan.zero_stage)
    # the optimizer on a dp shard, its updated weights all-gathered after the step: ZeRO-1/2, and DeepSpeed's bf16
    # ZeRO-0 (BF16_Optimizer's own sharding, whose gradients are still all-reduced after the backward)
    sharded_opt = optimizer_sharded(job.card, plan.zero_stage, job.framework_version) \
        and not uses_fsdp(job.card, plan.zero_stage)
    if per_step:
        replicas = 0.0 if traffic.replicas_with_each_reduce else traffic.replica_allreduce(dense, expert, grad_bytes)
        sync = StepSync(replicas, cal.dp_overlap)
    elif plan.zero_stage == 0 or cal.zero_grad_allreduce >= 0.5:
        reduce = (allreduce_time(dense * grad_bytes, traffic.dense.size, traffic.dense.stride, lk)
                  + allreduce_time(expert * grad_bytes, traffic.expert.size, traffic.expert.stride, lk))
        reduce += traffic.replica_allreduce(dense, expert, grad_bytes)
        sync = StepSync(reduce, cal.zero_grad_overlap if zero_reduce else cal.dp_overlap)
    else:
        # ZeRO-1/2: the buckets' reduce-scatter, then (hybrid sharding) the shard's all-reduce across the replicas
        sync = StepSync(traffic(dense, expert, grad_bytes) + traffic.replica_allreduce(dense, expert, grad_bytes),
                        cal.zero_grad_overlap)
    if not (per_step and units_kept_overlapped(job, plan)):  # Megatron-FSDP's replica all-reduce stays hidden
        sync = sync._replace(reduce_hidden=dp_hidden_share(plan, sync.reduce_hidden))  # 0 with grad_reduce_overlap off
    sync = sync._replace(sm_share=traffic.sm_share)
    if sharded_opt:
        return sync._replace(gather=traffic(*optimizer_gather_bytes(job, plan, dense, expert, edge), 1.0),
                             gather_hidden=dp_hidden_share(plan, cal.param_gather_overlap))
    return sync


def _optimizer_seconds(row: StageTime, inp: StageInputs, m: int) -> float:
    """The stage's once-per-step memory-bound work: the optimizer step's Adam state traffic on its shard of the
    parameters (Muon's on its matrices, plus their Newton-Schulz iterations), the gradient accumulation over `m`
    micro-batches, and the FP8 weight copies Transformer Engine makes on the step's first micro-batch
    (fp8_casts.weight_cast_bytes per linear weight, StageTime.fp8_weights)."""
    cal, ctx, traffic = inp.ctx.cal, inp.ctx, inp.traffic
    dense_group, expert_group = traffic.dense_group, traffic.expert_group
    shard_group = None if optimizer_sharded(inp.job.card, inp.plan.zero_stage, inp.job.framework_version) else 1
    dense_local = row.dense_params / (shard_group or dense_group)
    expert_local = row.expert_params / (shard_group or expert_group)
    muon_local = (row.muon.dense / (shard_group or dense_group)
                  + row.muon.expert / (shard_group or expert_group))
    adam_bytes = optimizer_step_bytes(inp.job, inp.plan) or cal.optimizer_bytes_per_param  # foreach: more passes
    opt = ((dense_local + expert_local - muon_local) * adam_bytes
           + muon_local * cal.muon_bytes_per_param) / ctx.hbm + row.muon.seconds
    opt += (row.dense_params + row.expert_params) * grad_accumulation_bytes(inp.job, inp.plan, cal, m) / ctx.hbm
    if ctx.fp8_casts is not None:  # Transformer Engine's FP8 weight copies, made on each step's first micro-batch
        opt += row.fp8_weights * weight_cast_bytes(ctx.fp8_casts) / ctx.hbm
    return opt


def grad_accumulation_bytes(job: Job, plan: Plan, cal: Calibration, m: int) -> float:
    """HBM bytes per parameter a step of `m` micro-batches spends adding each micro-batch's gradient to the step's sum
    outside the weight-gradient GEMM: the framework card's pass at the plan's ZeRO stage (grad_accumulation_pass:
    DeepSpeed's BF16_Optimizer cast-and-add into its fp32 buffer every micro-batch, autograd's in-place add after the
    first under ZeRO-1), else the calibration's grad_accum_bytes_per_param every micro-batch."""
    passes = job.card.grad_accumulation_pass
    stage = passes.by_zero_stage.get(plan.zero_stage) if passes is not None else None
    if stage is None:
        return m * cal.grad_accum_bytes_per_param
    return stage.passes(m) * stage.bytes_per_param


def _report(job: Job, plan: Plan, ctx: LayerContext, step: float, peaks: Peaks, breakdown: ThroughputBreakdown,
            assumptions: list[str], warnings: list[str]) -> ThroughputReport:
    """The step's tokens/s and MFU (model FLOPs: the LoRA step's under LoRA), with its breakdown and words."""
    per_token = (lora_flops_per_token(ctx.arch, job.seq_length, job.lora, ctx.lora_engine) if job.lora is not None
                 else model_flops_per_token(ctx.arch, job.seq_length))  # the model as the framework builds it
    flops_step = per_token * job.seq_length * job.global_batch_size
    flops_step += param_wrapper_step_flops(job, plan.micro_batch_size, plan.cp)  # 0 but for PEFT's ParamWrappers
    tokens_step = job.seq_length * job.global_batch_size
    return ThroughputReport(
        model=job.model.name,
        framework=job.framework,
        plan=plan,
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_step / step / job.num_gpus,
        tokens_per_s=tokens_step / step,
        mfu=flops_step / (step * job.num_gpus * peaks.mfu),
        model_flops_per_step=flops_step,
        breakdown=breakdown,
        assumptions=assumptions,
        warnings=warnings,
    )
