"""What a rule's condition sees: a job and plan with the derived numbers most rules read (`Context`, each worked out
once per check), and which engine runs the model at a ZeRO stage (`backend_of`), whether it runs cp as Ulysses
(`runs_ulysses`) or through torch's ring (`torch_ring`), how it pads to the cp split (`cp_padding_of`) and the tokens
a cp rank computes so (`rank_tokens`).
Apart from the registry (rules/engine.py), which runs the conditions over it and keeps their verdicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from meshplan.arithmetic import mesh
from meshplan.arithmetic.activations import cp_rank_tokens
from meshplan.core.once import once
from meshplan.knowledge.cards import Engine, FrameworkCard
from meshplan.knowledge.engine_card import TorchRingCp
from meshplan.knowledge.rl_card import RLCard
from meshplan.schema.choices import CpPadding
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import MemoryReport

Backend = Engine  # the engines a framework card's engine.by_zero_stage names
BACKENDS: tuple[str, ...] = get_args(Engine)


def backend_of(card: FrameworkCard, zero_stage: int) -> Backend:
    """Which engine runs the model at this ZeRO stage: the framework card's engine.by_zero_stage (verl and SkyRL
    switch from Megatron-Core to FSDP at zero_stage 3)."""
    return card.engine_at(zero_stage)


def runs_ulysses(card: FrameworkCard, zero_stage: int) -> bool:
    """Whether the engine this ZeRO stage selects runs cp as DeepSpeed-Ulysses sequence parallelism (the card's
    engine.ulysses: verl's and SkyRL's FSDP engines), whatever cp_comm_type says: those engines have no comm type
    and the plan keeps the default p2p. Rule CP002's words, the estimate's cp_time (LayerContext.ulysses) and memory
    layout, and the search's CP references (one per mechanism its ZeRO stages run: search/bounds.py) read it."""
    return card.engine_at(zero_stage) in card.engine.ulysses


def torch_ring(card: FrameworkCard, zero_stage: int) -> TorchRingCp | None:
    """The card's torch context_parallel ring (engine.torch_cp: torchtitan's FSDP2) where the engine this ZeRO stage
    selects runs cp through it, whatever cp_comm_type says; None where it runs another mechanism. The one reading of
    it: runs_torch_cp and ring_repeats_kv ask it."""
    ring = card.engine.torch_cp
    return ring if ring is not None and card.engine_at(zero_stage) in ring.engines else None


def runs_torch_cp(card: FrameworkCard, zero_stage: int) -> bool:
    """Whether the engine this ZeRO stage selects runs cp through torch's context_parallel ring (torch_ring); the
    estimate's cp_time (LayerContext.torch_cp) and the search's CP references read it."""
    return torch_ring(card, zero_stage) is not None


def ring_repeats_kv(job: Job, zero_stage: int) -> bool:
    """Whether the torch ring this ZeRO stage runs (torch_ring) moves and accumulates K and V at the query heads'
    width: the job's release hands SDPA K and V repeated to every query head (TorchRingCp.repeats_kv). False where
    the stage runs no torch ring (LayerContext.kv_repeated, which only its time reads)."""
    ring = torch_ring(job.card, zero_stage)
    return ring is not None and ring.repeats_kv(job.framework_version)


def cp_padding_of(card: FrameworkCard, zero_stage: int) -> CpPadding | None:
    """How the engine this ZeRO stage selects pads a micro-batch to its cp split (the card's engine.cp_padding:
    verl's and SkyRL's engines, per sequence on Megatron, the packed total under Ulysses), None where it pads
    nothing and a length 2*cp does not divide is refused (CP001). The memory's tokens per rank read it
    (arithmetic/activations.cp_rank_tokens)."""
    return card.engine.cp_padding.get(card.engine_at(zero_stage))


def rank_tokens(job: Job, micro_batch: int, tp: int, cp: int, zero_stage: int) -> int:
    """Tokens one cp rank computes of a micro-batch of `micro_batch` sequences, the padding of the engine this ZeRO
    stage selects included (cp_rank_tokens at cp_padding_of): what the memory holds, the step time runs
    (estimate/perf.layer_context, pipeline_p2p) and the search's per-token references divide by (search/bounds.py),
    so bound and estimate count the same tokens. The padded tokens cost time but are no useful work: tokens/s and
    MFU count the job's real tokens (perf._report)."""
    return cp_rank_tokens(job.seq_length, micro_batch, tp, cp, cp_padding_of(job.card, zero_stage))


def pads_every_cp_split(card: FrameworkCard) -> bool:
    """Whether every engine the card runs pads the sequence to its cp split itself, so that no sequence length
    rules a cp out (the search's space keeps every cp there; where some engine does not, the rules refuse per plan)."""
    return set(card.engine.by_zero_stage.values()) <= set(card.engine.cp_padding)


@dataclass(frozen=True)
class Context:
    """A job and plan with the derived numbers most rules need, computed once per check."""

    job: Job
    plan: Plan
    memory_report: MemoryReport | None = None  # set for the memory rules only

    @property
    def arch(self):
        return self.job.model

    @property
    def framework(self) -> str:
        return self.job.framework

    @property
    def card(self) -> FrameworkCard:
        """The job's framework card (the resolver attached it: Job.card)."""
        return self.job.card

    @property
    def rl_card(self) -> RLCard | None:
        """The `rl` section of the job's framework card (Job.rl_card)."""
        return self.job.rl_card

    @property
    def world(self) -> int:
        return self.job.num_gpus

    def request_gpus(self, trainer: int) -> int:
        """The request's num_gpus for `trainer` GPUs of the trainer (the job's world): an RL job whose rollout runs
        apart adds the engine's GPUs and, where PPO's critic runs on as many of its own, those (mesh.rl_job_gpus), so
        a world-size fix names the count to pass, not the trainer's (which the request's count would split again)."""
        rl = self.job.rl
        if self.rl_card is None or rl is None or self.plan.placement != "separate":
            return trainer
        apart = self.rl_card.critic_on_own_gpus(rl.algorithm, self.plan.placement)
        return mesh.rl_job_gpus(trainer, apart, self.plan.placement, self.plan.rollout_gpus)

    def world_words(self) -> str:
        """How a world-size rule names the GPU count: num_gpus, and where it is not the trainer's (an RL job placed
        apart) the trainer's count beside it."""
        total = self.request_gpus(self.world)
        return f"num_gpus={total}" if total == self.world else f"num_gpus={total} (the trainer's {self.world} GPUs)"

    def gpu_counts(self, unit: int) -> list[int]:
        """The trainer's GPU counts just below and above its world that `unit` divides (none under one unit)."""
        below = (self.world // unit) * unit
        return [c for c in (below, below + unit) if c > 0]

    def gpus_fix(self, unit: int, multiples: bool = True, counts: list[int] | None = None) -> str:
        """The GPU counts just below and above the trainer's world that `unit` divides (gpu_counts, or `counts` of
        them), as the request's num_gpus ('24 or 32 (multiples of 8)'; an RL job placed apart: '26 or 34 (the
        trainer's 24 or 32, multiples of 8)'); without `multiples`, '24 or 32' or '26 or 34: the trainer's 24 or 32'."""
        counts = self.gpu_counts(unit) if counts is None else counts
        said = " or ".join(str(self.request_gpus(c)) for c in counts)
        trainer = " or ".join(map(str, counts))
        if not multiples:
            return said if said == trainer else f"{said}: the trainer's {trainer}"
        return f"{said} (multiples of {unit})" if said == trainer else \
            f"{said} (the trainer's {trainer}, multiples of {unit})"

    @once
    def backend(self) -> Backend:
        return backend_of(self.job.card, self.plan.zero_stage)

    @once
    def law(self) -> str:
        return self.job.card.world_size_law

    @property
    def model_parallel(self) -> int:
        return self.plan.tp * self.plan.pp * self.plan.cp

    @once
    def expert_grid(self) -> int:
        return mesh.expert_group(self.plan)

    @once
    def fast_domain(self) -> int:
        """GPUs one GPU reaches over NVLink/xGMI, in the job's ranks (mesh.job_domain)."""
        return mesh.job_domain(self.job)

    @property
    def fix_domain(self) -> int:
        """The fast domain a fix's degree is held to: the job's (fast_domain), or where the request left num_gpus out
        that of the GPU's own node (mesh.fast_domain), as a larger degree brings its GPUs with it
        (Job.world_follows_layout) and the nodes they fill (12 implied GPUs launch 4 per node, 32 fill 8-GPU nodes)."""
        if self.job.world_follows_layout:
            return mesh.fast_domain(self.job.gpu, self.job.gpu.gpus_per_node)
        return self.fast_domain

    @once
    def microbatches(self) -> int:
        """Micro-batches per run of the pipeline schedule: schedule_batch / (mbs * dp), floored (rules check
        divisibility), over the schedule's runs per step (Plan.pipeline_microbatches: torchtitan runs it per
        accumulation step); once per Context (several rules read it)."""
        batch = self.schedule_batch
        m = batch // (self.plan.micro_batch_size * self.plan.dp)
        return m // self.plan.schedule_runs(batch)

    @once
    def per_mini_batch(self) -> bool:
        """Whether one run of the pipeline schedule takes an RL job's mini-batch rather than its step: where the job
        names a mini-batch smaller than the step, its update runs the schedule and steps the optimizer once per
        mini-batch (verl's update_policy, rl/memory.update_micro_batches). Not where the framework packs the
        sequences to a token budget (the card's rl.packed_micro_batches, at mean lengths under the longest): that
        count is the packing's, which verl rounds up to a multiple of pp where virtual stages interleave."""
        rl = self.job.rl
        if rl is None or not rl.splits_step:
            return False
        return not (self.job.rl_card.packed_micro_batches and rl.token_share < 1)

    @property
    def schedule_batch(self) -> int:
        """The sequences one run of the pipeline schedule takes: the step's, or the mini-batch's (per_mini_batch)."""
        return self.job.rl.mini_batch_sequences if self.per_mini_batch else self.job.global_batch_size

    @property
    def schedule_run(self) -> str:
        """What one run of the schedule is, in words."""
        return "mini-batch" if self.per_mini_batch else "step"

    @property
    def num_experts(self) -> int:
        return self.arch.moe.num_experts if self.arch.moe else 0
