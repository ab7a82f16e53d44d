"""The framework card's engines (cards/frameworks/*.yaml `engine`, `optimizer_step`): which engine runs the model at
each ZeRO stage and its byte convention (a preset of cards/memory.yaml), and the optimizer implementation each engine
builds. Apart from cards.py, which holds the card."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshplan.knowledge.release_lines import in_any_line
from meshplan.schema.choices import CpPadding, Engine, MegatronLoss

# the byte presets of cards/memory.yaml
MemoryConvention = Literal["megatron", "megatron_fsdp", "deepspeed", "fsdp2", "fsdp2_chunked_loss", "fsdp2_hf",
                           "fsdp2_automodel", "fsdp2_kempnerforge", "nanotron"]
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TorchRingCp(_Card):
    """The engines whose cp runs through torch's context_parallel (torch.distributed.tensor.experimental
    _attention.py _templated_ring_attention and its backward): K/V all-gathered once over the CP ranks, the local
    queries against each rank's block in turn with head-tail load balancing, each block's output merged into an fp32
    running output by its log-sum-exp, dK/dV accumulated in fp32 and passed rank to rank
    (context_parallel.torch_ring_time prices it). `repeated_kv_releases`: the releases whose model repeats K and V to
    every query head before SDPA (repeat_kv), so the ring moves and accumulates them at the query heads' width.
    `shards_over_cp`: the framework's FSDP2 shards over the data-shard and CP ranks together whenever cp > 1, so a
    data-shard degree of 1 at cp > 1 still shards the states over the CP ranks (zero_stage 3, not replication)."""

    engines: list[Engine]
    repeated_kv_releases: list[str] = []
    source: str
    shards_over_cp: bool = False
    shards_over_cp_source: str | None = None

    def repeats_kv(self, release: str | None) -> bool:
        """Whether `release`'s model hands SDPA K and V repeated to every query head (repeated_kv_releases)."""
        return in_any_line(release, self.repeated_kv_releases)


class ReplicaShard(_Card):
    """The engines whose ZeRO-0 (data-parallel replication, data_parallel_shard_degree 1) is FSDP2's fully_shard over
    a shard group of one data-parallel rank (x cp) with every data-parallel rank a replica (HSDP): the model states,
    the units' gathers and reduces and their transients of ZeRO-3 at dp_replicate = dp, the replicas' all-reduce
    with each unit's reduce (memory_states.replicates_by_sharding reads it). `ddp_releases`: the releases that ran
    DDP there instead (torch's replicate over the whole model, the states replicated, no unit's transient)."""

    engines: list[Engine]
    ddp_releases: list[str] = []
    source: str

    def shards(self, engine: Engine, release: str | None) -> bool:
        """Whether `engine` of `release` runs its ZeRO-0 as fully_shard over a shard of one (not one of ddp_releases;
        a release left out is the card's own)."""
        return engine in self.engines and not in_any_line(release, self.ddp_releases)


class RlLossPasses(_Card):
    """An RL engine's loss path as its actor runs it, HBM bytes per logit of the vocabulary shard a rank holds (the
    card's engine.rl_loss, counted from the engine's code there): the temperature division, the log-probs kernel
    (beside the Megatron-Core cross-entropy the engine calls, engine.megatron_loss, whose own bytes are
    cards/memory.yaml megatron_cross_entropy's) and the entropy, forward + backward in the update
    (`update_hbm_bytes_per_logit`, with `entropy_update_hbm_bytes_per_logit` added where the entropy is in the loss:
    RLJob.entropy_coeff), forward alone in a no-grad log-prob pass (`forward_hbm_bytes_per_logit`, the reference's,
    with `old_log_prob_entropy_hbm_bytes_per_logit` added in the old policy's pass where the engine computes the
    entropy there), and what the update keeps per logit at the loss's peak (`logits_bytes_per_element`, in place of
    the convention's or the Megatron loss's) and a no-grad pass at its own (`log_prob_logits_bytes_per_element`, the
    worse of the old policy's and the reference's, the bf16 logits among them). Read by perf.loss_hbm_bytes,
    perf.log_prob_loss_bytes and memory_states.rl_loss_bytes."""

    update_hbm_bytes_per_logit: float = Field(ge=0)
    entropy_update_hbm_bytes_per_logit: float = Field(ge=0)
    forward_hbm_bytes_per_logit: float = Field(ge=0)
    old_log_prob_entropy_hbm_bytes_per_logit: float = Field(0.0, ge=0)
    logits_bytes_per_element: float = Field(gt=0)
    log_prob_logits_bytes_per_element: float = Field(gt=0)
    # An entropy computed chunk by chunk over slices of the logits (SkyRL's): with its gradient, each chunk's slice
    # backward zero-fills a gradient of the whole logits and adds it into theirs, `entropy_chunk_bytes_per_logit` per
    # logit of the micro-batch per chunk (perf.entropy_chunks counts them: `entropy_chunk_tokens` tokens a chunk, or
    # as many as `entropy_chunk_budget_bytes` holds at 4 bf16 copies of the rank's vocabulary shard a token, rounded
    # down to a power of two)
    entropy_chunk_bytes_per_logit: float = Field(0.0, ge=0)
    entropy_chunk_tokens: int | None = Field(None, ge=1)
    entropy_chunk_budget_bytes: int | None = Field(None, ge=1)
    source: str


class EngineFacts(_Card):
    """Which engine runs the model at each ZeRO stage (the engines rules.yaml's `backends` name), and the byte
    convention of ZeRO-3 where it is not the card's memory_convention."""

    by_zero_stage: dict[int, Engine]
    zero3_memory_convention: MemoryConvention | None = None
    ulysses: list[Engine] = []  # engines whose cp is Ulysses sequence parallelism: all-to-alls, any cp_comm_type
    cp_padding: dict[Engine, CpPadding] = {}  # engines padding a micro-batch to their cp split (no length refused)
    torch_cp: TorchRingCp | None = None  # engines whose cp is torch's context_parallel ring (TorchRingCp)
    # engines whose ZeRO-0 is fully_shard over a shard of one with dp replicas (ReplicaShard: torchtitan 0.3)
    replica_shard: ReplicaShard | None = None
    builds_model_mtp: dict[Engine, bool]  # whether the engine trains a checkpoint's own MTP blocks when not asked
    # where given, the model types (config.json model_type) whose own model code those engines build the MTP blocks
    # of; any other model trains none (NeMo AutoModel: its deepseek_v3 code builds none, its nemotron_v3 does)
    builds_model_mtp_types: list[str] | None = None
    builds_model_mtp_source: str
    # engines whose training step computes the loss itself, outside the model, with one of Megatron-Core's
    # cross-entropies whatever the config's cross_entropy_loss_fusion says (verl's Megatron engine, Megatron-DeepSpeed:
    # Megatron's unfused vocab_parallel_cross_entropy); request.resolve writes it into the Job as the loss it runs
    megatron_loss: dict[Engine, MegatronLoss] = {}
    megatron_loss_source: str | None = None
    # the RL actor's loss path per engine (RlLossPasses: temperature division, log-probs, entropy), verl's and SkyRL's
    rl_loss: dict[Engine, RlLossPasses] = {}
    why: str

    @model_validator(mode="after")
    def _every_stage(self) -> EngineFacts:
        if set(self.by_zero_stage) != set(ZERO_STAGES):
            raise ValueError(f"by_zero_stage needs exactly the stages {list(ZERO_STAGES)}, "
                             f"got {sorted(self.by_zero_stage)}")
        if set(self.by_zero_stage.values()) - set(self.builds_model_mtp):
            raise ValueError(f"builds_model_mtp needs every engine of by_zero_stage, "
                             f"got {sorted(self.builds_model_mtp)}")
        if set(self.megatron_loss) - set(self.by_zero_stage.values()):
            raise ValueError(f"megatron_loss names an engine no ZeRO stage runs: {sorted(self.megatron_loss)}")
        if self.megatron_loss and not self.megatron_loss_source:
            raise ValueError("megatron_loss needs megatron_loss_source (the engine's code that calls the loss)")
        if self.replica_shard is not None and self.by_zero_stage[0] not in self.replica_shard.engines:
            raise ValueError(f"replica_shard names the engines whose ZeRO-0 it describes; ZeRO-0 runs "
                             f"{self.by_zero_stage[0]!r}, not among {self.replica_shard.engines}")
        if set(self.rl_loss) - set(self.by_zero_stage.values()):
            raise ValueError(f"rl_loss names an engine no ZeRO stage runs: {sorted(self.rl_loss)}")
        return self


# How an engine runs its optimizer step on CUDA, which decides the step's own temporaries (cards/memory.yaml
# optimizer_steps, memory_states.optimizer_step_temporaries)
OptimizerImplementation = Literal["fused", "foreach", "for_loop", "megatron_distributed", "deepspeed_zero"]


class OptimizerStepFacts(_Card):
    """Which optimizer implementation each engine of the framework builds on CUDA when its config leaves the choice
    to the default (Adam/AdamW)."""

    by_engine: dict[Engine, OptimizerImplementation]
    source: str


class AccumulationPass(_Card):
    """One ZeRO stage's gradient accumulation outside the weight-gradient GEMM: HBM bytes per parameter of the
    stage that each micro-batch's backward moves to fold its gradient into the step's sum, and whether the step's
    first micro-batch pays it too (a cast-and-add into a zeroed buffer) or not (autograd's AccumulateGrad keeps the
    first gradient as it is and adds the later ones in place)."""

    bytes_per_param: float = Field(ge=0)
    first_micro_batch: bool

    def passes(self, micro_batches: int) -> int:
        """The micro-batches of a step that pay the pass."""
        return micro_batches if self.first_micro_batch else max(micro_batches - 1, 0)


class GradAccumulationPasses(_Card):
    """The gradient accumulation pass per ZeRO stage where the framework's engine runs one outside the GEMM (the
    card's `grad_accumulation_pass`); a stage left out takes the calibration's grad_accum_bytes_per_param on every
    micro-batch (Megatron-Core's fused wgrad accumulation: 0)."""

    by_zero_stage: dict[int, AccumulationPass]
    source: str

    @model_validator(mode="after")
    def _known_stages(self) -> GradAccumulationPasses:
        if set(self.by_zero_stage) - set(ZERO_STAGES):
            raise ValueError(f"by_zero_stage takes the stages {list(ZERO_STAGES)}, got {sorted(self.by_zero_stage)}")
        return self


class VisionTowerEngines(BaseModel):
    """The framework's engines that build a multimodal config's vision tower and projector beside the text model
    (Architecture.vision, Llama 4's): they load the model through transformers' AutoModelForImageTextToText, so the
    tower's weights are held (and trained, or frozen under LoRA with the attention projections PEFT's target names
    match adapted). An engine left out builds the text model only."""

    model_config = ConfigDict(extra="forbid")

    engines: list[Engine]
    source: str

    def builds(self, engine: Engine) -> bool:
        return engine in self.engines

