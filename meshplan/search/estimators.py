"""The estimators the search calls, bundled so tests can count or fake them, and the cost model's best step time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshplan.arithmetic.flops import model_flops_per_step
from meshplan.arithmetic.lora import frozen_flops_per_token
from meshplan.check.config import StructuralCheck, check_config
from meshplan.estimate.memory import FitVerdict, estimate_memory, memory_fit, memory_summary
from meshplan.estimate.perf import (
    StageCp,
    StageWork,
    StepTerms,
    estimate_throughput,
    exposed_pipeline_p2p,
    pipeline_unit,
    stage_cp,
    stage_work,
    step_terms,
    throughput_of,
)
from meshplan.estimate.sharding_floor import sharding_floor
from meshplan.estimate.sync_floor import SyncRates, sync_rates
from meshplan.knowledge.calibration import calibration
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import CheckReport, MemoryReport, MemorySummary, ThroughputReport
from meshplan.search.policy import memory_rule_id


@dataclass
class Engine:
    """The estimators the search calls; injected so tests can count or fake them."""

    memory: Callable[[Job, Plan], MemoryReport]
    throughput: Callable[[Job, Plan], ThroughputReport]
    # structural rules only (no memory estimate); where it has a `first_error_of` (config.StructuralCheck), the
    # search asks that for the first error's finding instead of building the report
    check: Callable[[Job, Plan], CheckReport]
    full_check: Callable[[Job, Plan], CheckReport]  # every rule, memory included
    summary: Callable[[MemoryReport], MemorySummary]
    memory_rule: str = "MEM001"
    efficiency_cap: float = 1.0  # best fraction of peak the cost model ever achieves (for the lower bound)
    peak_flops: Callable[[Job], float] | None = None
    moe_layer_fixed_s: float = 0.0  # MoE host sync per layer per micro-batch (kept whole in the bound)
    # The throughput estimate in two parts, so the search can drop a plan on its step's floor before replaying its
    # pipeline (the costly part): `terms` then `finish` give exactly `throughput`. None: the search calls `throughput`.
    terms: Callable[[Job, Plan], StepTerms] | None = None
    finish: Callable[[StepTerms], ThroughputReport] | None = None
    # What the per-token references read of a plan's step (perf.stage_work: `terms`' m and slowest row's compute,
    # recompute, TP, CP, EP, bit for bit, without the once-per-step terms; one layer of each kind and the head, what
    # search/rank_chains.py weighs a last rank by). None: the references read `terms` (and no layer's work).
    stage_work: Callable[[Job, Plan], StageWork] | None = None
    # What the context-parallel references read (perf.stage_cp: `terms`' m and slowest row's cp, bit for bit, without
    # the layers' other terms). None: they read stage_work (or `terms`).
    stage_cp: Callable[[Job, Plan], StageCp] | None = None
    # A non-interleaved plan's exposed pipeline send/receive per micro-batch (its breakdown's pp_comm_s / m) without
    # building its step, for the pipeline bound; None from it where only the step's terms give it. None: the bound
    # reads it from the plan's step terms.
    pp_unit: Callable[[Job, Plan], float | None] | None = None
    # pp_unit's arithmetic whatever the rules say of the plan (perf.pipeline_unit: it reads only the plan's degrees,
    # micro-batch and sequence parallelism), once per those. None: the bound asks pp_unit per base plan.
    pipeline_unit: Callable[[Job, Plan], float | None] | None = None
    # Whether `memory`'s report would fit a budget (and a host limit), without the report (memory.memory_fit: the
    # same stages, stopping at the first over). None: the search reads `memory`'s report.
    memory_fit: Callable[..., FitVerdict] | None = None
    # Seconds per micro-batch a ZeRO-2/3 / FSDP plan's slowest stage takes at least at any recompute, from the sharding
    # traffic each micro-batch moves (sharding_floor.sharding_floor: m x it is under `terms`' floor). None: no such
    # bound (the search carries such plans at the keys of their layout's other stages).
    sharding_floor: Callable[[Job, Plan], float] | None = None
    # What the floor of a plan's once-per-step DP term reads of its grid and ZeRO stage (sync_floor.sync_rates; its
    # `floor` of the first rank's parameters: that term, added after the pipeline, is at least the rank's traffic less
    # a share of one micro-batch's compute and recompute). None: no such bound.
    sync_rates: Callable[[Job, Plan], SyncRates | None] | None = None


def default_engine(framework: str) -> Engine:
    """meshplan's own estimators, with the framework's calibration for the search's bounds."""
    cal = calibration(framework)
    return Engine(
        memory=estimate_memory,
        throughput=estimate_throughput,
        check=StructuralCheck(),
        full_check=check_config,
        summary=memory_summary,
        memory_rule=memory_rule_id(),
        efficiency_cap=max(cal.gemm_peak_fraction, cal.attention_peak_fraction),
        peak_flops=lambda job: max(job.gpu.bf16_flops, (job.gpu.fp8_flops or 0.0) * cal.fp8_gemm_relative_efficiency
                                   if job.precision == "fp8" else 0.0),
        moe_layer_fixed_s=cal.moe_host_sync_s,
        terms=step_terms,
        finish=throughput_of,
        stage_work=stage_work,
        stage_cp=stage_cp,
        pp_unit=exposed_pipeline_p2p,
        pipeline_unit=pipeline_unit,
        memory_fit=memory_fit,
        sharding_floor=sharding_floor,
        sync_rates=sync_rates,
    )


def ideal_time(job: Job, engine: Engine) -> float:
    """Step time at the cost model's best achievable fraction of peak on every GPU, with no communication; a LoRA
    job's FLOPs without the frozen linears' weight gradients (lora.frozen_flops_per_token)."""
    peak = engine.peak_flops(job) if engine.peak_flops else job.gpu.bf16_flops
    if job.lora is not None:
        flops = frozen_flops_per_token(job.model, job.seq_length) * job.seq_length * job.global_batch_size
    else:
        flops = model_flops_per_step(job.model, job.seq_length, job.global_batch_size)
    return flops / (job.num_gpus * peak * engine.efficiency_cap)


def reference_seconds(engine: Engine, job: Job, plan: Plan, part: str) -> tuple[float, StageWork | None]:
    """What a per-token reference of the search's bounds reads of one plan's step (search/bounds._per_token): its CP
    seconds (`part` "cp"), else its compute, recompute, TP and EP, through the Engine's cheapest estimator that gives
    them to the last bit (perf.throughput_of: m x the slowest stage's); with the StageWork it read, if any (its layers'
    and head's parts)."""
    if engine.terms is None:
        x = engine.throughput(job, plan).breakdown
        return (x.cp_comm_s if part == "cp" else x.compute_s + x.recompute_s + x.tp_comm_s + x.ep_comm_s), None
    work = None
    if part == "cp" and engine.stage_cp is not None:  # only its CP seconds (perf.stage_cp)
        row = engine.stage_cp(job, plan)
        m = row.m
    elif engine.stage_work is not None:  # only what they read of the step (perf.stage_work)
        row = work = engine.stage_work(job, plan)
        m = row.m
    else:
        t = engine.terms(job, plan)
        row, m = t.rows[t.worst], t.m  # type: ignore[assignment]
    return (m * row.cp if part == "cp" else m * row.compute + m * row.recompute + m * row.tp + m * row.ep), work
