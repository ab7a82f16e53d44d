"""The job-wide terms of a memory estimate, which every pipeline stage is built from (memory.memory_terms fills
them): the parameters per layer split by how they shard, the byte convention with the plan's precision knobs, the
data-parallel sizes, the pipeline layout, one layer's activations per kind and recompute mode, the offload plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import NamedTuple

from meshplan.arithmetic.activations import (
    Layout,
    Shape,
    activation_mode,
    frozen_linear_bytes,
    frozen_norm_bytes,
    routed_rows,
)
from meshplan.arithmetic.lora import adapter_activation_bytes, adapter_saves, vision_adapters
from meshplan.arithmetic.memory_states import (
    Convention,
    MemoryCard,
    OptimizerStepBytes,
    StateTensor,
    built_vocab,
    convention,
    state_bytes,
)
from meshplan.arithmetic.offload import OffloadPlan
from meshplan.arithmetic.schedule import Stages
from meshplan.estimate.layer_records import scope_memo
from meshplan.knowledge.lora_card import LoraEngine
from meshplan.knowledge.model_counts import (
    gdn_linear_params,
    indexer_params,
    layer_params,
    mamba_linear_params,
    mtp_block_layers,
    mtp_params,
    mtp_weight_blocks,
    per_architecture,
    vision_params,
)
from meshplan.knowledge.tp_card import head_tp
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, LoraSpec, Plan


class ParamTable:
    """Per-layer parameters split by how they shard: over TP, not at all, over EP*ETP; linear-layer share (TP-split,
    and kept whole). `moe_whole`: the framework's TP leaves the MoE block whole (the card's moe_tp), so an MoE layer's
    shared experts are whole on every TP rank, as its router is."""

    __slots__ = ("arch", "experts", "kind", "linear_dense", "linear_whole", "moe", "mtp", "replicated", "tp_sharded")

    def __init__(self, arch: Architecture, moe_whole: bool = False):
        self.arch = arch
        self.tp_sharded: list[int] = []
        self.replicated: list[int] = []
        self.experts: list[int] = []
        self.linear_dense: list[int] = []
        self.linear_whole: list[int] = []
        self.moe: list[bool] = []
        # the key of a layer's activations (MemoryTerms.per_kind): whether it is MoE, or a hybrid's layer kind
        self.kind: list[bool | str] = []
        for i in range(arch.num_layers):
            p = layer_params(arch, i)
            whole = p["shared_experts"] if moe_whole and arch.is_moe_layer(i) else 0
            # a Mamba-2 mixer is split over TP whole (heads and groups: in_proj, conv1d, A_log, D, dt_bias, its norm,
            # out_proj); its in_proj and out_proj are its linear layers. A Gated DeltaNet mixer too (heads: in_proj,
            # conv1d, dt_bias, A_log split over TP, megatron/core/ssm/gated_delta_net/common.py; its gated norm's one
            # value head wide weight replicated, counted with them)
            mamba, gdn = p.get("mamba", 0), p.get("gdn", 0)
            # DSA's indexer: its linears duplicated on every TP rank (Megatron-Core DSAIndexer parallel_mode
            # "duplicated"), held whole as a latent MoE's projections are
            index = indexer_params(arch) if p["attention"] else 0
            sharded = p["attention"] - index + p["dense_mlp"] + p["shared_experts"] - whole + mamba + gdn
            self.tp_sharded.append(sharded)
            self.replicated.append(p["norms"] + p["router"] + p["latent_proj"] + whole + index)
            self.experts.append(p["routed_experts"])
            self.linear_dense.append(sharded - mamba - gdn + (mamba_linear_params(arch) if mamba else 0)
                                     + (gdn_linear_params(arch) if gdn else 0))
            self.linear_whole.append(whole + p["latent_proj"] + index)  # latent MoE projections, DSA indexer: TELinear
            self.moe.append(arch.is_moe_layer(i))
            self.kind.append(arch.layer_kind(i) if arch.layer_pattern is not None else arch.is_moe_layer(i))
        self.mtp = (0, 0, 0)
        if arch.num_mtp_layers:
            block = mtp_block_layers(arch)
            total = mtp_params(arch)
            experts = mtp_weight_blocks(arch) * sum(p["routed_experts"] for p in block)
            h = arch.hidden_size
            sharded = mtp_weight_blocks(arch) * (2 * h * h + sum(p["attention"] + p["dense_mlp"] + p["shared_experts"]
                                                                 + p.get("mamba", 0) + p.get("gdn", 0)
                                                                 for p in block))
            self.mtp = (sharded, total - experts - sharded, experts)


param_table = per_architecture(ParamTable)
_whole_moe_table = per_architecture(partial(ParamTable, moe_whole=True))


def param_table_for(arch: Architecture, moe_whole: bool) -> ParamTable:
    """The model's ParamTable where the framework's TP cuts the MoE block as Megatron-Core does, or leaves it whole
    (FrameworkCard.moe_whole_over_tp: the shared experts replicated over TP). Cached per architecture."""
    return _whole_moe_table(arch) if moe_whole and arch.moe is not None else param_table(arch)


class RankParts(NamedTuple):
    """Which parameters one rank holds, from the framework card's facts: its decoder layers' TP shards with what its
    TP keeps whole (norms, routers, and the shared experts where moe_whole_over_tp), the routed experts over EP x ETP,
    the embedding split over TP or whole (the convention's embedding_over_tp), the output layer over TP or whole
    (output_head_tp, head_tp) and the final norm. One home: the memory's stage states (stage_params) and the time's
    FSDP traffic, optimizer step and DP floor (estimate/stage_time.py, sharding_traffic.py, sync_floor.py) read it."""

    table: ParamTable
    tp: int
    expert_split: int  # ep x etp
    embedding: float  # on the first stage
    head: float  # the output layer on the last stage (0: tied to the embedding on one stage)
    norm: int  # the final norm's parameters, beside the output layer
    vision: int = 0  # the vision tower and projector on the first stage where the engine builds them (vision_built):
    # weights only, not in held (vision_weight_bytes)

    def layer(self, i: int) -> tuple[float, float]:
        """(dense, routed) parameters of decoder layer `i` on this rank (layer_on_rank)."""
        return layer_on_rank(self.table, i, self.tp, self.expert_split)

    def sums(self, layers) -> tuple[int, int, int]:
        """These decoder layers' parameters, unsharded: (what TP splits, what it keeps whole, routed experts)."""
        return table_sums(self.table, layers)

    def layers(self, layers) -> tuple[float, float]:
        """(dense, routed) parameters of these decoder layers on this rank (summed, then split)."""
        return self.split(self.sums(layers))

    def split(self, sums: tuple[float, float, float]) -> tuple[float, float]:
        """(dense, routed) parameters on this rank of decoder layers whose unsharded parameters are `sums`."""
        sharded, replicated, experts = sums
        return sharded / self.tp + replicated, experts / self.expert_split

    def linear(self, layers) -> float:
        """The linear-layer parameters of these decoder layers on this rank: their TP-split linears over TP, those TP
        keeps whole, and their routed experts over EP x ETP. The memory's fp8 weight copies (stage_params) and the
        step's fp8 weight casts (stage_time.fp8_cast_weights) read it."""
        table = self.table
        return (sum(map(table.linear_dense.__getitem__, layers)) / self.tp
                + sum(map(table.linear_whole.__getitem__, layers)) + self.layers(layers)[1])

    def held(self, layers, *, first: bool, last: bool, mtp: bool) -> tuple[float, float]:
        """(dense, routed) parameters a rank holding these decoder layers holds, with the embedding (`first`), the
        output layer and final norm (`last`) and the MTP blocks (`mtp`)."""
        return self.held_sums(self.sums(layers), first=first, last=last, mtp=mtp)

    def held_sums(self, sums: tuple[float, float, float], *, first: bool, last: bool,
                  mtp: bool) -> tuple[float, float]:
        """held, of decoder layers whose unsharded parameters are `sums` (RankParts.sums)."""
        dense, experts = self.split(sums)
        if first:
            dense += self.embedding
        if last:
            dense += self.head + self.norm
        if mtp:
            mtp_sharded, mtp_repl, mtp_experts = self.table.mtp
            dense += mtp_sharded / self.tp + mtp_repl
            experts += mtp_experts / self.expert_split
        return dense, experts


def layer_on_rank(table: ParamTable, i: int, tp: int, expert_split: int) -> tuple[float, float]:
    """(dense, routed) parameters of decoder layer `i` on one rank: its TP shard with what TP keeps whole, its routed
    experts over EP x ETP (`expert_split`). The one per-layer split RankParts, the memory's FSDP units
    (memory_stage.layer_unit_params) and FSDP2's backward walk (fsdp_walk) read."""
    return table.tp_sharded[i] / tp + table.replicated[i], table.experts[i] / expert_split


def table_sums(table: ParamTable, layers) -> tuple[int, int, int]:
    """These decoder layers' parameters, unsharded: (what TP splits, what it keeps whole, routed experts)."""
    return (sum(map(table.tp_sharded.__getitem__, layers)), sum(map(table.replicated.__getitem__, layers)),
            sum(map(table.experts.__getitem__, layers)))


def job_layer_sums(job: Job, layers) -> tuple[int, int, int]:
    """table_sums of the job's model as its framework's TP cuts it (the card's moe_whole_over_tp)."""
    return table_sums(param_table_for(job.model, job.card.moe_whole_over_tp), layers)


def rank_parts(arch: Architecture, card, conv: Convention, plan: Plan, vocab: int) -> RankParts:
    """RankParts of a plan on the framework `card` under the byte convention `conv`, the vocabulary `vocab` wide."""
    h = arch.hidden_size
    rows = plan.tp if conv.embedding_over_tp == "vocab_parallel" else 1  # KempnerForge keeps it whole
    split = head_tp(card.output_head_tp, plan.tp, plan.sequence_parallel)
    return RankParts(table=param_table_for(arch, card.moe_whole_over_tp), tp=plan.tp, expert_split=plan.ep * plan.etp,
                     embedding=vocab * h / rows + arch.learned_position_embeddings * h,
                     head=vocab * h / split if (not arch.tie_word_embeddings or plan.pp > 1) else 0,
                     norm=h * (2 if arch.norm_type == "layernorm" else 1),
                     vision=vision_params(arch) if vision_built(arch, card, plan.zero_stage) else 0)


def vision_built(arch: Architecture, card, zero_stage: int) -> bool:
    """Whether the engine of this ZeRO stage builds the model's vision tower and projector beside its text model
    (the card's vision_tower engines: verl's and SkyRL's FSDP, which load Llama4ForConditionalGeneration); the first
    stage holds them whole, as the FSDP engines run no TP or pipeline on them."""
    return arch.vision is not None and card.vision_tower is not None and card.vision_tower.builds(
        card.engine_at(zero_stage))


def time_rank_parts(job: Job, plan: Plan) -> RankParts:
    """The RankParts the step time reads: the plan's byte convention, the vocabulary the framework builds
    (memory_states.built_vocab, as the memory's). Kept per search scope (shared_layers) by what rank_parts reads of the
    plan: the search asks it for thousands of plans that share a few grids."""
    memo = scope_memo("rank_parts")
    key = (id(job.model), id(job.card), job.framework_version, plan.zero_stage, plan.tp, plan.ep * plan.etp,
           plan.pp > 1, plan.sequence_parallel)
    hit = memo.get(key) if memo is not None else None
    if hit is not None and hit[0] is job.model and hit[1] is job.card:
        return hit[2]
    conv = convention(job.card, plan.zero_stage, job.framework_version)[1]
    parts = rank_parts(job.model, job.card, conv, plan, built_vocab(job.model.vocab_size, conv, plan.tp))
    if memo is not None:
        memo[key] = (job.model, job.card, parts)
    return parts


MEMORY_PER_PLAN_FIELDS = frozenset({"micro_batch_size", "recompute", "recompute_layers", "recompute_method",
                                    "recompute_modules", "selective_ac_option"})
"""Plan fields a layout's memory terms (LayoutTerms) and its stages' model states (memory_stage.StageStates) never
read: the micro-batch and the recompute. So the plans of one search that differ only in these share them
(memory.layout_terms); tests/test_memory_memo.py holds the estimate to it field by field."""

PIPELINE_SHAPE_FIELDS = frozenset({"vpp", "pipeline_schedule", "pipeline_microbatches", "first_stage_layers",
                                   "last_stage_layers", "pipeline_layout", "account_for_embedding", "account_for_loss"})
"""Plan fields that change a stage's model states (memory_stage.StageStates) only through which layers the stage
holds and whether it holds the embedding, the output layer or the MTP blocks: the pipeline's shape. So stages of one
search with the same layers (by value, memory_stage.layer_classes) and the same ends share their states across
layouts that differ only in these (memory_stage.stage_states); tests/test_memory_memo.py holds them to it."""

STATES_BY_SIZE_FIELDS = frozenset({"cp", "dp"})
"""Plan fields a stage's model states (memory_stage.StageStates) read only through the layout's data-parallel sizes
(LayoutTerms.dense_dp and expert_dp), so the states' memo key holds those two sizes instead of these (layouts of
one search with the same dp*cp, e.g. cp=2 dp=8 and cp=1 dp=16, share their stages' states); tests/test_memory_memo.py
holds them to it."""

STATES_UNREAD_FIELDS = frozenset({"cp_comm_type", "moe_token_dispatcher", "moe_a2a_overlap", "tp_comm_overlap",
                                  "attention_backend", "dropout", "expandable_segments",
                                  "grad_reduce_overlap"})
"""Plan fields no term of a stage's model states reads (they change its activations, its step time or the fit
figure, not its parameters, their states, the optimizer step or the gathered units): left out of the states' memo
key; tests/test_memory_memo.py holds them to it."""


@dataclass(frozen=True, kw_only=True)
class LayoutTerms:
    """What MemoryTerms holds that no field of MEMORY_PER_PLAN_FIELDS changes (memory.layout_terms builds it), the
    warnings it gave, and the memos of the plans that share it: per (micro-batch size, recompute modules) the
    activation terms (memory.micro_batch_terms), per pipeline rank the stage's model states
    (memory_stage.stage_states), per (micro-batch size, rank) the micro-batches the stage holds in flight
    (memory_stage.stage_held: no recompute field changes them)."""

    conv_name: str
    conv: Convention
    tensors: list[StateTensor]
    card: MemoryCard
    dense_dp: int
    expert_dp: float
    vocab: int
    pipeline: Stages
    table: ParamTable
    ts: int
    norm_width: int
    selective: str
    gathered: int
    other_fixed: float
    offload: OffloadPlan
    optimizer_sharded: bool
    step: OptimizerStepBytes
    warnings: tuple[str, ...]
    layer_layout: Layout  # one layer's Layout of 0 tokens: memory.micro_batch_terms puts in a micro-batch's
    micro_batches: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)
    held: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)  # the MemoryTerms fields of its own, by name (memory.built_terms)


@dataclass(frozen=True, kw_only=True)
class MemoryTerms:
    """What every stage of one (job, plan) shares."""

    job: Job
    plan: Plan
    conv_name: str  # the byte convention (cards/memory.yaml), with the plan's precision knobs in `conv`
    conv: Convention
    tensors: list[StateTensor]  # the convention's model-state tensors
    card: MemoryCard
    dense_dp: int  # dp*cp: what dense parameters' sharded states are split over
    expert_dp: float  # mesh.expert_dp: what routed experts' sharded states are split over
    vocab: int  # padded
    pipeline: Stages
    table: ParamTable
    ts: int  # what sequence parallelism splits (tp, else 1)
    norm_width: int  # the final norm's parameters
    m: int  # micro-batches per step
    tokens: int  # tokens of one micro-batch on one GPU
    lay: Layout
    selective: str  # what the framework's "selective" recompute saves
    per_kind: dict[tuple[bool | str, str], float]  # one layer's activations per (ParamTable.kind, recompute mode)
    stored_mode: str  # the mode a layer not fully recomputed runs in
    every_nth: int  # torchtitan 0.2.x's per-layer selective AC: every N-th block fully checkpointed (0: none)
    group: int  # Megatron's full recompute: layers checkpointed together (memory.checkpoint_group; 0: one each)
    gathered: int  # FSDP/ZeRO-3 gathered layers (0 when the weights are not sharded)
    other_fixed: float  # fixed overhead and CUDA context
    logits_bytes: float  # what the output layer and loss keep of one micro-batch
    offload: OffloadPlan
    optimizer_sharded: bool
    step: OptimizerStepBytes  # what the engine's optimizer.step() allocates (cards/memory.yaml optimizer_steps)
    # per pipeline rank, the stage's model states (memory_stage.stage_states): the LayoutTerms' memo where the terms
    # come from one, shared by the plans of the layout
    stages: dict = field(default_factory=dict)
    held: dict = field(default_factory=dict)  # per (micro-batch size, rank): memory_stage.stage_held, the layout's

    @property
    def vpp(self) -> int:
        return len(self.pipeline.chunks[0])


class StageParams(NamedTuple):
    """The parameters one stage's GPU holds (per GPU: TP, EP and ETP shards)."""

    layers: list[int]  # its decoder layers, over its virtual chunks
    first: bool  # it holds the embedding
    last: bool  # it holds the output layer, the final norm and the loss
    mtp: bool  # it holds the MTP blocks
    dense: float  # parameters sharded over dp*cp (TP shards and replicated ones)
    experts: float  # routed-expert parameters, sharded over expert-dp
    linear: float  # linear-layer parameters (fp8 weight copies, Muon's matrices)
    head: float  # the output layer (0 when tied to the embedding on one stage)
    embedding: int  # the embedding's parameters (first stage)
    output_layer: int  # the output layer's parameters (last stage)
    mtp_params: int  # the MTP blocks' parameters
    vision_params: int = 0  # the vision tower and projector (first stage, where the engine builds them)


def stage_params(terms: MemoryTerms, rank: int, chunks) -> StageParams:
    """Its decoder layers sharded by TP (routed experts by EP*ETP), the embedding on the first stage (split by TP
    unless the convention keeps it whole), the output layer (a tied copy when pp > 1) and final norm on the last, the
    MTP blocks where the layout puts them: RankParts, the time's too."""
    arch, plan, table, pipeline = terms.job.model, terms.plan, terms.table, terms.pipeline
    tp = plan.tp
    layers = list(chain.from_iterable(chunks))
    first, last = rank == 0, rank == pipeline.head_rank
    has_mtp = bool(arch.num_mtp_layers and pipeline.mtp_trained and rank == pipeline.mtp_at)
    parts = rank_parts(arch, terms.job.card, terms.conv, plan, terms.vocab)
    dense, experts = parts.held(layers, first=first, last=last, mtp=has_mtp)
    linear = parts.linear(layers)
    embedding = int(parts.embedding) if first else 0
    head = parts.head if last else 0.0
    linear += head
    output_layer = int(head)
    mtp = 0
    if has_mtp:
        mtp_sharded, mtp_repl, mtp_experts = table.mtp
        linear += mtp_sharded / tp + mtp_experts / (plan.ep * plan.etp)
        mtp = int(mtp_sharded / tp + mtp_repl + mtp_experts / (plan.ep * plan.etp))
    return StageParams(layers=layers, first=first, last=last, mtp=has_mtp, dense=dense, experts=experts,
                       linear=linear, head=head, embedding=embedding, output_layer=output_layer, mtp_params=mtp,
                       vision_params=parts.vision if first else 0)


class VisionWeights(NamedTuple):
    params: int  # the tower's, the projector's and (LoRA) its adapters' parameters on the stage
    bytes: float  # their weight bytes on this GPU


def vision_weight_bytes(terms: MemoryTerms, params: StageParams, detail: dict[str, int]) -> VisionWeights:
    """The vision tower and projector the first stage holds where the engine builds them (StageParams.vision_params)
    and, under LoRA, the adapters PEFT puts on its attention (arithmetic/lora.vision_adapters): weights only, sharded
    as the dense weights are. On text-only data Llama4ForConditionalGeneration never calls its vision_model (no
    pixel_values), so none of them gets a gradient, and torch's optimizers keep no state for a parameter whose grad is
    None; their gradient sync and optimizer step are left out of the time for the same reason."""
    if not params.vision_params:
        return VisionWeights(0, 0.0)
    job = terms.job
    adapters = sum(a.params(job.lora.rank) for a in vision_adapters(job.model, job.lora)) if job.lora else 0
    detail["vision_params"] = params.vision_params
    if adapters:
        detail["vision_adapter_params"] = adapters
    count = params.vision_params + adapters
    weights = [t for t in terms.tensors if t.tensor_class == "weights"]
    return VisionWeights(count, sum(state_bytes(weights, count, terms.dense_dp).values()))


def kind_adapters(arch: Architecture, spec: LoraSpec, engine: LoraEngine | None) -> tuple[tuple, ...]:
    """(layer kind, its adapters) for each key of the per-kind activations (memory.per_kind_activations): a hybrid's
    pattern letters, else whether the layer is MoE, each read off the first layer of that kind."""
    kinds: dict = {}
    for index in range(arch.num_layers):
        kind = arch.layer_kind(index) if arch.layer_pattern is not None else arch.is_moe_layer(index)
        if kind not in kinds:
            kinds[kind] = adapter_saves(arch, index, spec, engine)
    return tuple(kinds.items())


def adapter_kind_bytes(shape: Shape, lay: Layout, key: tuple, modules: tuple[str, ...],
                       adapters: tuple[tuple, ...], rank: int, style: str, targets: frozenset[str] = frozenset(),
                       selective: str = "core_attention") -> float:
    """What the adapters of one per-kind key (kind, recompute mode) keep per micro-batch (arithmetic/lora.py
    adapter_activation_bytes), less what the frozen norms do not keep (activations.frozen_norm_bytes) and what the
    linears without an adapter (not in `targets`) do not keep (activations.frozen_linear_bytes, under the framework's
    `selective`): nothing under full recompute (the layer keeps its input only), an MLP's or MoE block's
    adapters nothing under selective recompute of that module (mlp, moe), which re-runs them with the block."""
    kind, mode = key
    saves = dict(adapters).get(kind, ())
    if mode == "full":
        return 0.0
    frozen = frozen_norm_bytes(shape, lay)  # the frozen norms' weight multiplies keep less (a PEFT engine's)
    if targets and not shape.kinds:  # a hybrid's kind keys are letters, not whether the layer is MoE
        frozen += frozen_linear_bytes(shape, lay, targets, bool(kind), activation_mode(mode, selective), modules,
                                      experts_adapted=any(a.expert for a in saves))
    if mode == "selective" and {"mlp", "moe"} & set(modules):
        saves = tuple(a for a in saves if not a.mlp)
    return adapter_activation_bytes(saves, rank, style, tokens=lay.tokens, routed_rows=routed_rows(shape, lay),
                                    tp=lay.tp, sp=lay.sp, fp8=lay.fp8) - frozen
