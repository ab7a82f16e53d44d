"""The reports the operations return (memory, step time, rule findings, recommendations, minimum GPUs, rendered
configs): the MCP tools' output schemas. Units are bytes, seconds and FLOP/s.
"""

# ruff: noqa: RUF012 (pydantic copies a mutable default per instance; ruff cannot see across files that StrictModel is a pydantic model)

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from meshplan.core.units import gib
from meshplan.schema.choices import Framework, Severity, StrictModel
from meshplan.schema.imported import ConfigFix
from meshplan.schema.plan import Plan


class StageMemory(StrictModel):
    stage: int
    layers: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other_bytes: int
    total_bytes: int
    detail: dict[str, int] = Field(default_factory=dict, description="Finer breakdown, bytes")
    host_bytes: int = Field(0, description="Host (CPU) memory this stage's GPU offloads to, bytes")


class EngineMemory(StrictModel):
    """One rollout engine GPU: what the engine takes and how many sequences its KV cache holds at once."""

    budget_bytes: float = Field(description="What the memory fraction gives the engine (weights + activations + KV)")
    weights_bytes: float
    working_bytes: float
    kv_bytes: float = Field(description="KV cache the fraction leaves after weights and activations (0: none)")
    cuda_graph_bytes: float
    kv_bytes_per_token: float
    gpu_bytes: float = Field(description="What the engine holds on the GPU while it runs")
    sequences_at_once: int = Field(description="Sequences of prompt + response tokens one engine holds at once")
    note: str


class PhaseMemory(StrictModel):
    """One phase of an RL step on the worst GPU of the pool it runs on (meshplan/rl/memory.py)."""

    phase: Literal["rollout", "log_prob", "actor_update", "critic_update"]
    pool: Literal["trainer", "rollout", "critic"] = Field(
        description="The GPUs it runs on (one pool when colocated; PPO's critic has its own where the framework puts "
                    "it apart from the actor)")
    peak_bytes: int
    fit_bytes: int = Field(description="What decides this phase's fit: its peak, or with expandable segments a "
                                       "training phase's allocated peak (memory.fit_figure)")
    stage: int = Field(description="The trainer's pipeline stage whose GPU peaks (0 on a separate rollout pool)")
    detail: dict[str, int] = Field(default_factory=dict, description="Where the bytes go")
    note: str = ""
    engine: SkipJsonSchema[EngineMemory | None] = Field(
        None, exclude=True, description="The rollout: the engine on that GPU, as rule RL006 reads it; no part of the "
                                        "report or its schema (detail has its bytes)")


class ErrorBand(StrictModel):
    """How far meshplan's estimate was from measured runs like this one (cards/accuracy.yaml,
    meshplan/estimate/accuracy.py)."""

    regime: str = Field(description="The measured regime the request falls in (cards/accuracy.yaml)")
    label: str = Field(description="The regime in words")
    median_error: float | None = Field(description="Median |predicted / measured - 1| there (None: no measured run)")
    bias: float | None = Field(description="Median signed error there: > 0 predicts too high (None: no measured run)")
    runs: int = Field(description="Measured runs the figures come from")
    source: str = Field(description="The bench scripts and data sets that measured it")
    unvalidated: list[str] = Field(description="Terms of this estimate no measured run exercised")
    text: str = Field(description="The band in one line, as the faces print it")


class MemoryReport(StrictModel):
    """Per-GPU memory of every pipeline stage; the worst stage decides whether the job fits."""

    model: str
    framework: str
    plan: Plan
    stages: list[StageMemory]
    peak_bytes: int
    peak_stage: int
    capacity_bytes: int
    fits: bool
    headroom_bytes: int
    fit_bytes: int = Field(0, description="The figure compared with capacity_bytes (fits, headroom_bytes): peak_bytes, "
                                          "or with expandable segments the allocated peak plus page rounding")
    fit_basis: Literal["reserved", "allocated"] = Field(
        "reserved", description="Which peak decided the fit: reserved (peak_bytes, the caching allocator's reserve "
                                "included) or allocated (expandable segments: cached pages are unmapped before OOM)")
    host_bytes_per_node: int = Field(
        0, description="Host memory a node needs for what its GPUs offload (worst stage x the job's GPUs on a node)"
    )
    host_capacity_bytes: int | None = Field(None, description="cpu_memory_per_node when given, bytes")
    phases: list[PhaseMemory] = Field(
        default_factory=list, description="RL job: each phase's peak; peak_bytes is the largest (empty: training job)"
    )
    peak_phase: str | None = Field(None, description="RL job: the phase whose peak is peak_bytes")
    limited_by: Literal["gpu", "host"] | None = Field(
        None, description="What runs out first: GPU memory (a phase over capacity) or host memory (offloads over "
                          "cpu_memory_per_node); None when both fit"
    )
    assumptions: list[str]
    warnings: list[str] = []
    error_band: ErrorBand | None = Field(
        None, description="The error measured in this regime (meshplan/estimate/accuracy.py)")

    @property
    def rollout_starved(self) -> bool:
        """An RL job's rollout engine holds no sequence's KV cache (vLLM and SGLang refuse to start): rule RL006's
        condition, one home for the rule, the faces' warning and check's alternatives."""
        return any(p.phase == "rollout" and p.engine is not None and p.engine.sequences_at_once < 1
                   for p in self.phases)


class ThroughputBreakdown(StrictModel):
    compute_s: float
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    dp_comm_s: float = 0.0
    pp_comm_s: float = 0.0
    bubble_s: float = 0.0
    recompute_s: float = 0.0
    other_s: float = 0.0
    offload_s: float = Field(0.0, description="Exposed host transfers and the CPU optimizer step (offload.py)")


class RLStepTime(StrictModel):
    """Seconds of one RL step by part (meshplan/rl/step_time.py): colocated phases add, a separate rollout pool overlaps
    the next batch's generation with this batch's training (verl one-step-off)."""

    step_s: float
    generation_s: float = Field(description="Prefill and decode of every response (the rollout)")
    prefill_s: float
    decode_s: float
    log_prob_s: float = Field(description="Old-policy, reference (and critic value) forward passes")
    update_s: float = Field(
        description="The actor's (and critic's) training step, meshplan.estimate.perf.estimate_throughput")
    reshard_s: float = Field(description="New weights from the trainer's layout to the engine's")
    offload_s: float = Field(description="Phase offloads: states out to the host and back each step")
    replicas: int = Field(description="Engine replicas: rollout GPUs / (rollout TP x DP)")
    sequences_at_once: int = Field(
        description="Sequences one replica decodes at once: its share of the step, at most what its KV cache and "
                    "max_num_seqs hold")
    decode_waves: int = Field(description="Rounds of sequences_at_once each replica decodes to finish its share")
    decode_step_s: float = Field(description="One decode step at that batch: weights and KV read, all-reduces")
    update_mfu: float = Field(description="The actor update's MFU: its model FLOPs over the update's seconds and "
                                          "the actor's GPUs (verl logs it with its own FLOP count)")
    limited_by: str = Field(description="The part that takes longest")

    def overlap_words(self) -> str:
        """What a reader of the parts needs where they add to more than step_s: a separate pool's generation runs
        beside the training side (rl/step_time.rl_step_time: the step is the longer side plus resharding)."""
        added = self.generation_s + self.log_prob_s + self.update_s + self.reshard_s + self.offload_s
        if added <= self.step_s * (1 + 1e-9):
            return ""
        return (f"the parts add to {added:,.3g} s, more than the step ({self.step_s:,.3g} s): generation overlaps "
                "the training side (separate pools, one step off), so the step is the longer side plus resharding")


class ClusterFactor(StrictModel):
    """A step-time factor stored by `meshplan compare --calibrate` for one cluster, GPU and framework."""

    cluster: str = Field(description="The cluster's name (MESHPLAN_CLUSTER, default 'default')")
    gpu: str = Field(description="The GPU key the factor was measured on")
    framework: Framework
    step_time_factor: float = Field(gt=0, description="measured step time / meshplan's predicted step time")
    runs: int = Field(1, ge=1, description="Compared runs the factor is the median of")
    source: str = Field(description="The log(s) it was measured from")
    path: str = Field(description="The file the factor is stored in")

    def words(self) -> str:
        return (f"calibrated: step time x {self.step_time_factor:.3f} (cluster {self.cluster!r}, {self.gpu}, "
                f"{self.framework}; from {self.runs} run{'s' if self.runs != 1 else ''} in {self.path})")


class ThroughputReport(StrictModel):
    """Predicted step time, tokens/s per GPU and MFU, with where the time goes."""

    model: str
    framework: str
    plan: Plan
    step_time_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    mfu: float
    model_flops_per_step: float
    breakdown: ThroughputBreakdown = Field(description="Where the training step's time goes; an RL job's: the actor's "
                                           "training step over the RL step's batch, one optimizer step "
                                           "(actor_step_words)")
    assumptions: list[str]
    warnings: list[str] = []
    rl: RLStepTime | None = Field(None, description="RL job: the step's parts; step_time_s is the whole RL step")
    error_band: ErrorBand | None = Field(
        None, description="The error measured in this regime (meshplan/estimate/accuracy.py)")
    calibration: ClusterFactor | None = Field(
        None, description="The cluster's step-time factor applied to this answer (meshplan compare --calibrate "
                          "stored it); None: the uncalibrated model")

    def mfu_at(self, tokens_per_s_per_gpu: float) -> float:
        """The MFU of this report's job run at another rate (a measured one, `meshplan compare`): the estimate's own
        model FLOPs per token (arithmetic/flops.model_flops_per_token, the LoRA step's under LoRA) over the same
        GPU's peak (estimate/perf._report), which `mfu` divides by its own rate; so the run's MFU is `mfu` scaled by
        the rate, never a second FLOP count."""
        return self.mfu * tokens_per_s_per_gpu / self.tokens_per_s_per_gpu

    def parts(self) -> dict[str, float]:
        """Where step_time_s goes, part by part (seconds, keyed by field name): an RL step's phases (`rl`: the
        rollout's generation, the log-prob passes, the update, resharding, phase offloads), `breakdown` being the
        actor's training step beside them (actor_step_words); else the training step's breakdown. What the CLI's
        table and the MCP summary word."""
        if self.rl is None:
            return self.breakdown.model_dump()
        r = self.rl
        return {"generation_s": r.generation_s, "log_prob_s": r.log_prob_s, "update_s": r.update_s,
                "reshard_s": r.reshard_s, "offload_s": r.offload_s}

    def actor_step_s(self) -> float:
        """The seconds `breakdown` adds to: the training step's, or for an RL step the actor's training step over the
        RL step's whole batch at its longest lengths, one optimizer step (rl/step_time.rl_step_time's `update`)."""
        return sum(self.breakdown.model_dump().values())

    def actor_step_words(self) -> str:
        """What a reader of an RL step's breakdown needs where it does not add to the update part: it is the actor's
        training step over the batch once, which the RL step's update takes at the responses' mean lengths, once per
        epoch and mini-batch (each its own optimizer step and pipeline flush), with a critic's update beside it where
        the algorithm trains one (rl/step_time.rl_step_time); '' for a training step or where the two agree."""
        if self.rl is None:
            return ""
        actor = self.actor_step_s()
        if abs(self.rl.update_s - actor) <= 1e-6 * max(actor, 1e-9):
            return ""
        return (f"the update by part is the actor's training step over the RL step's batch as one optimizer step, "
                f"{actor:,.3g} s; the RL step's update, {self.rl.update_s:,.3g} s, is that step at the responses' "
                "mean lengths, once per epoch and mini-batch, with a critic's update beside the actor's where the "
                "algorithm trains one (PPO)")


class Finding(StrictModel):
    id: str
    severity: Severity
    title: str = ""
    message: str
    fix: str
    source: str = ""


class MemorySummary(StrictModel):
    peak_bytes: int
    peak_stage: int
    capacity_bytes: int
    fits: bool
    headroom_bytes: int
    fit_bytes: int = 0  # what decided fits (MemoryReport.fit_bytes)
    fit_basis: Literal["reserved", "allocated"] = "reserved"
    host_bytes_per_node: int = Field(0, description="Host memory per node the plan's offloads take (MemoryReport's)")


class CheckReport(StrictModel):
    """Every rule of the framework run over the plan: ok means no error."""

    ok: bool
    framework: str
    model: str
    plan: Plan
    findings: list[Finding]
    memory: MemorySummary | None = None
    next_steps: list[str] = []
    config_fixes: list[ConfigFix] = Field(
        default_factory=list, description="Checked from a config file: each fix as edits of that file, in its own "
                                          "keys and syntax (flags, Hydra overrides, TOML, JSON)")
    config_unread: list[str] = Field(
        default_factory=list, description="Checked from a config file: what it sets that meshplan cannot express, then "
                                          "what could not be read (`meshplan import`'s lists): the check does not "
                                          "cover them")
    config_assumed: list[str] = Field(
        default_factory=list, description="Checked from a config file: the values the check ran at that the file "
                                          "implies but cannot settle (`meshplan import`'s assumed), each with the flag "
                                          "that changes it")


class Candidate(StrictModel):
    rank: int
    plan: Plan
    memory: MemorySummary
    throughput: ThroughputReport
    rationale: str
    equivalents: list[Plan] = Field(
        default_factory=list,
        description="Other layouts with the same predicted step time and peak memory (e.g. a factor moved between CP "
                    "and the micro-batch), folded into this row instead of filling the top K",
    )


RenderFormat = Literal["python", "shell", "yaml", "hydra", "toml", "json"]


class RenderResult(StrictModel):
    """A plan rendered for one framework: the text to paste, and what the reader must know about it."""

    framework: str
    variant: str
    version: str = Field(description="Framework version the snippet targets")
    format: RenderFormat = Field(description="python | shell | yaml | hydra | toml | json")
    text: str = Field(description="The config snippet to paste")
    filename: str = Field(description="A suggested file name for the snippet")
    plan: Plan = Field(description="The layout that was rendered")
    notes: list[str] = Field(default_factory=list, description="Choices the adapter made, and why")
    warnings: list[str] = Field(default_factory=list, description="Things that will surprise a user")


class NearMiss(StrictModel):
    """A layout that almost fits: what an impossible job is closest to, and by how much it is over."""

    plan: Plan
    memory: MemorySummary
    over_bytes: int = Field(description="Peak memory minus capacity on the worst stage")
    rationale: str


class Recommendation(StrictModel):
    """Ranked layouts that fit, why the first one won, and how it compares with the decision tables."""

    model: str
    framework: str
    num_gpus: int = Field(description="The request's GPUs: for an RL job the whole job's (the trainer's, with the "
                                      "rollout engine's and a critic's where they run on GPUs of their own)")
    trainer_gpus: int | None = Field(
        None, description="An RL job whose rollout engine (or PPO's critic) runs on GPUs of its own: the trainer's "
                          "share of num_gpus, the world every actor layout is a layout of")
    candidates: list[Candidate]
    considered: int = Field(description="Layouts in the searched space; = len(candidates) + sum(rejected)")
    rejected: dict[str, int] = Field(
        default_factory=dict,
        description="Layouts not ranked, per rule id (cards/rules.yaml) or SEARCH-* bucket (see assumptions)",
    )
    decision_table: str = ""
    rationale: str = ""
    warnings: list[str] = Field(
        [], description="What the answer warns of: the search's own, then the job's, true of every layout (the rules "
                    "that read no layout field, in check's words: EP014, RL008), said here once; each row's "
                    "rationale names its own plan's")
    assumptions: list[str] = []
    evaluated: int = Field(0, description="Memory and throughput estimates the search computed")
    global_batch_size: int | None = Field(None, description="Sequences per step every layout was compared at")
    gpus_per_node: int | None = Field(
        None, description="Processes launched on each node, every layout compared at: the request's, else the GPU's "
                          "node, or fewer where the GPU count fills no whole node (the rest of each node idle)")
    min_gpus: int | None = Field(None, description="When nothing fits: the smallest GPU count where a layout fits")
    closest: list[NearMiss] = Field(default_factory=list, description="When nothing fits: the nearest misses")
    headroom: float | None = Field(
        None, description="Share of GPU memory every ranked layout leaves free (the request's, else MEM002's default)"
    )
    best_below_headroom: Candidate | None = Field(
        None,
        description="The fastest layout that fits only with less than `headroom` free: given when nothing keeps "
                    "the headroom, or when it is much faster than the best ranked layout (a smaller headroom ranks it)",
    )


class CountFreeFloorProof(StrictModel):
    """Why no GPU count can fit: the least per-GPU memory any layout needs at any count (meshplan/search/count_free.py),
    the term that alone puts it over the budget, at which most memory-saving shape, and what would open it."""

    floor_bytes: int = Field(description="Least per-GPU bytes any layout needs, whatever the GPU count")
    budget_bytes: int = Field(description="Bytes a layout may use: capacity x (1 - headroom)")
    term: Literal["output", "layer"] = Field(
        description="output: one micro-batch's logits and loss on the last stage; layer: one decoder layer's "
                    "activations for one micro-batch")
    term_bytes: int = Field(description="That term's bytes alone (before the allocator reserve and fixed overheads)")
    shape: str = Field(description="The most memory-saving shape the floor was taken at, in words")
    up_to_gpus: int | None = Field(
        None, description="The proof holds up to this GPU count (a degree was bounded by it); None: at any count")
    changes: list[str] = Field(description="The nearest changes under which the floor fits (necessary, not "
                                           "sufficient: the scan then settles the count)")


class MinimumGpus(StrictModel):
    """The smallest GPU count at which some layout passes the rules and fits with the headroom kept.

    Fit is not monotone in the GPU count (a count must be divisible by the layout's degrees), so the counts are
    scanned in increasing order, never bisected; the scan is bounded by counts of work (never by time), and says which
    bound stopped it."""

    model: str
    framework: str
    gpu: str
    num_gpus: int | None = Field(description="The smallest count that fits; None when none fits within the bounds")
    candidate: Candidate | None = Field(None, description="The fastest layout at that count (recommend's #1)")
    headroom: float = Field(description="Share of GPU memory the layout must leave free (the request's, else MEM002's)")
    global_batch_size: int | None = Field(None, description="Sequences per step at that count")
    searched_from: int = Field(description="First GPU count checked (counts below cannot hold the model states)")
    searched_to: int = Field(description="Last GPU count checked")
    counts_checked: int = Field(description="How many GPU counts were checked")
    stepping: str = Field(description="Which counts were checked, in words")
    stopped_by: Literal["found", "max_gpus", "counts", "rules", "memory"] = Field(
        description="found: a count fits; max_gpus: none fits up to the limit; counts: the scan's work bound "
                    "(GPU counts or searches, cards/search.yaml) was hit first; rules: a rule rejects the fixed fields "
                    "at every count; memory: the count-free floor (memory_floor) is over the budget, so no count fits"
    )
    memory_floor: CountFreeFloorProof | None = Field(
        None, description="stopped_by == memory: the proof that no GPU count fits, with what would open it")
    rationale: str
    warnings: list[str] = Field(
        default_factory=list,
        description="What recommend warns of for this request: its answer's at the count found; where none is found, "
                    "the job's own, which recommend says at any count (the rules that read no layout field: "
                    "EP014, RL008)")
    assumptions: list[str] = []


def peak_words(memory: MemoryReport | MemorySummary) -> str:
    """The peak as every answer names it (MCP's summaries, recommend's rationales): the reserved peak, and with
    expandable segments the allocated peak that decides the fit (memory.fit_figure), so a reserved peak inside the
    headroom reads as what it is."""
    decides = (f" (allocated {gib(memory.fit_bytes)}: with expandable segments it decides the fit)"
               if memory.fit_basis == "allocated" else "")
    return f"{gib(memory.peak_bytes)} reserved{decides}"


def finding_line(finding: Finding) -> str:
    """One rule finding as a line of text: id, message and fix, as `meshplan check` words them (render's notes and
    warnings, the estimates' and the recommends' warnings)."""
    return f"{finding.id} ({finding.severity}): {finding.message} Fix: {finding.fix}"
