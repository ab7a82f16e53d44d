"""How far meshplan's estimates were from measured runs like the one asked about, and what no run has checked.

Every throughput and memory report carries an `ErrorBand`: the regime the request falls in (dense or MoE,
Megatron-family or torch-native FSDP engine, EP inside the NVLink domain or across it, CP, RL, offload), the
median |error| and signed bias meshplan measured there, how many runs that rests on, and the terms of this
estimate that no measured run exercised. The figures live in cards/accuracy.yaml, which
bench/accuracy_card.py regenerates from the bench scripts by classifying every measured run with the same
`regime` and `terms` used here, so a band always describes runs of its own kind.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic.mesh import job_domain, mesh_groups
from meshplan.arithmetic.offload import job_offload_plan
from meshplan.estimate.attention_time import attention_kernel
from meshplan.knowledge.calibration import attention_fraction_assumed
from meshplan.knowledge.cards import load_card
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import ErrorBand, MemoryReport, ThroughputReport

Kind = Literal["throughput", "memory"]
R = TypeVar("R", MemoryReport, ThroughputReport)

# The regimes a request can fall in, with their words. FSDP throughput is per GPU ("fsdp-<gpu key>"): the GEMM
# efficiency torch-native trainers reach differs by GPU generation (bench/README.md: H100 rows far off, A100 rows
# within a few %), so a band measured on one GPU does not speak for another.
LABELS: dict[Kind, dict[str, str]] = {
    "throughput": {
        "rl-step": "RL step (rollout + training)",
        "context-parallel": "context parallel (CP > 1)",
        "moe-megatron-cross-node-ep": "MoE, Megatron family, EP across NVLink domains",
        "moe-megatron-in-node-ep": "MoE, Megatron family, EP inside the NVLink domain",
        "moe-torch-native": "MoE, torch-native FSDP engine",
        "moe-deepspeed": "MoE, DeepSpeed",
        "megatron-fsdp": "dense, Megatron-FSDP (ZeRO-3)",
        "dense-megatron": "dense, Megatron family",
        "dense-nanotron": "dense, nanotron",
        "dense-deepspeed": "dense, DeepSpeed",
    },
    "memory": {
        "rl-phases": "RL phases (rollout engine + trainer)",
        "offload": "offload to host",
        "fsdp": "torch-native FSDP engine",
        "megatron-moe": "MoE, Megatron family",
        "megatron-dense": "dense, Megatron family",
        "nanotron-dense": "dense, nanotron",
        "deepspeed": "DeepSpeed",
    },
}
FSDP_PREFIX = "fsdp-"


class SourceRuns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    script: str = Field(description="The bench script that measured these runs (bench/*.py)")
    set: str = Field(description="The data set it scored")
    runs: int = Field(ge=1)


class RegimeFigures(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    median_error: float | None = Field(None, ge=0, description="Median |predicted / measured - 1|")
    bias: float | None = Field(None, description="Median predicted / measured - 1")
    runs: int = Field(0, ge=0)
    sources: list[SourceRuns] = []
    unvalidated: str | None = Field(None, description="Why no run measured it (runs 0)")


class KindFigures(BaseModel):
    model_config = ConfigDict(extra="forbid")

    regimes: dict[str, RegimeFigures]
    terms: dict[str, int] = Field(description="Measured runs that exercise each term (0 or absent: unvalidated)")


class AccuracyCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str
    generated_by: str
    measured: str = Field(description="The date bench/accuracy_card.py ran the bench scripts")
    throughput: KindFigures
    memory: KindFigures


def accuracy_card() -> AccuracyCard:
    return load_card("accuracy", AccuracyCard)


# --------------------------------------------------------------------------- classification


def _engine(job: Job, plan: Plan) -> str:
    return job.card.engine_at(plan.zero_stage)


def _ep_crosses(job: Job, plan: Plan) -> bool:
    domain = job_domain(job)
    moe_ep = job.model.moe is not None and plan.ep > 1
    return moe_ep and mesh_groups(plan, law=job.card.world_size_law).ep.crosses(domain)


def _offloads(job: Job, plan: Plan) -> bool:
    """Whether anything leaves the GPU, in the framework's own meaning of its knobs (offload.offload_plan)."""
    return job_offload_plan(job, plan).any


def regime_name(job: Job, plan: Plan, kind: Kind) -> str:
    """The regime a request falls in: the first that applies, most specific mechanism first."""
    engine = _engine(job, plan)
    moe = job.model.moe is not None
    if kind == "memory":
        if job.rl is not None:
            return "rl-phases"
        if _offloads(job, plan):
            return "offload"
        if engine == "megatron":
            return "megatron-moe" if moe else "megatron-dense"
        return {"fsdp": "fsdp", "nanotron": "nanotron-dense"}.get(engine, "deepspeed")
    if job.rl is not None:
        return "rl-step"
    if plan.cp > 1:
        return "context-parallel"
    if moe:
        if engine == "megatron":
            return "moe-megatron-cross-node-ep" if _ep_crosses(job, plan) else "moe-megatron-in-node-ep"
        return "moe-deepspeed" if engine == "deepspeed" else "moe-torch-native"
    if engine == "megatron":
        return "megatron-fsdp" if plan.zero_stage == 3 else "dense-megatron"
    if engine == "fsdp":
        return FSDP_PREFIX + job.gpu.key
    return "dense-nanotron" if engine == "nanotron" else "dense-deepspeed"


def regime_label(name: str, kind: Kind) -> str:
    if kind == "throughput" and name.startswith(FSDP_PREFIX):
        return f"dense, torch-native FSDP on {name.removeprefix(FSDP_PREFIX)}"
    return LABELS[kind][name]


def terms(job: Job, plan: Plan, kind: Kind) -> list[str]:
    """The mechanisms this estimate leans on that a measured run may or may not have exercised, as short phrases.

    bench/accuracy_card.py counts them over the measured runs; a term no run has is reported as unvalidated."""
    out = [f"framework {job.framework}", f"GPU {job.gpu.key}"]
    engine = _engine(job, plan)
    moe = job.model.moe is not None
    domain = job_domain(job)
    if job.precision == "fp8":
        out.append("FP8")
    if job.model.mamba is not None:  # a hybrid's Mamba-2 layers (arithmetic/mamba.py)
        out.append("Mamba-2 layers")
    if job.model.gdn is not None:  # a hybrid's Gated DeltaNet layers (arithmetic/gdn.py)
        out.append("Gated DeltaNet layers")
    if moe and plan.ep > 1:
        out.append("EP > 1")
        if _ep_crosses(job, plan):
            out.append("cross-node EP")
            if plan.moe_token_dispatcher == "flex":
                out.append("flex dispatcher across nodes")
        if plan.moe_a2a_overlap and kind == "throughput":
            out.append("EP overlap across nodes" if _ep_crosses(job, plan) else "EP overlap in the node")
    if moe and plan.etp > 1:
        out.append("ETP > 1")
    if plan.cp > 1:
        out.append("CP > 1")
        if mesh_groups(plan, law=job.card.world_size_law).cp.crosses(domain):
            out.append("CP across nodes")
        if plan.cp_comm_type != "p2p":
            out.append(f"CP {plan.cp_comm_type} exchange")
    if plan.zero_stage == 3:
        if engine == "megatron":
            out.append("Megatron-FSDP overlap" if kind == "throughput" else "Megatron-FSDP bytes")
        else:
            out.append("ZeRO-3/FSDP sharding")
        if moe:
            out.append("ZeRO-3/FSDP with MoE")
    if plan.vpp > 1:
        out.append("interleaved pipeline")
    if _offloads(job, plan):
        out.append("offload time" if kind == "throughput" else "offloaded bytes")
    if job.rl is not None:
        out.append("RL step" if kind == "throughput" else "RL phases")
    kernel = attention_kernel(job, plan.attention_backend, plan.zero_stage) if kind == "throughput" else None
    if attention_fraction_assumed(kernel, job.gpu.arch):  # no published figure: no run can have measured it
        out.append(f"{kernel} attention on {job.gpu.arch} (fraction assumed)")
    return out


def regime(job: Job, plan: Plan, kind: Kind) -> ErrorBand:
    """The error measured in this request's regime and the terms no measured run validated (cards/accuracy.yaml)."""
    figures = getattr(accuracy_card(), kind)
    name = regime_name(job, plan, kind)
    label = regime_label(name, kind)
    found = figures.regimes.get(name)
    unvalidated = [t for t in terms(job, plan, kind) if not figures.terms.get(t)]
    if found is None or not found.runs:
        why = found.unvalidated if found is not None and found.unvalidated else "no measured run in this regime"
        unvalidated.insert(0, why)
    runs = found.runs if found is not None else 0
    source = ", ".join(f"{s.script} ({s.set}, {s.runs})" for s in found.sources) if found is not None else ""
    median = found.median_error if runs else None
    bias = found.bias if runs else None
    if median is not None:  # the bias's sign in words: '-86%' alone did not say the estimate runs short of the run
        side = ": predicted low" if round(bias, 2) < 0 else ": predicted high" if round(bias, 2) > 0 else ""
        text = (f"±{median:.0%} ({label}; measured on {runs} run{'s' if runs != 1 else ''}, "
                f"median bias {bias:+.0%}{side})")
    else:
        text = f"error unknown ({label})"
    if unvalidated:
        text += "; unvalidated: " + ", ".join(unvalidated)
    return ErrorBand(regime=name, label=label, median_error=median, bias=bias, runs=runs, source=source,
                     unvalidated=unvalidated, text=text)


def with_band(report: R, job: Job, plan: Plan) -> R:
    """`report` with the error band of its regime attached."""
    kind: Kind = "memory" if isinstance(report, MemoryReport) else "throughput"
    return report.model_copy(update={"error_band": regime(job, plan, kind)})
