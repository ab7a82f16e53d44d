"""The attention core of one layer on one rank: which flash kernel the job runs and at what fraction of peak, or
unfused attention's batched GEMMs and memory-bound passes over the full scores."""

from __future__ import annotations

import math

from meshplan.arithmetic.flops import Gemm, attention_core_flops, dsa_loss_target_flops, indexer_score_flops
from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD, gemm_seconds
from meshplan.estimate.layer_records import LayerContext
from meshplan.knowledge.calibration import (
    FLASH_ATTENTION_PASSES_PER_FORWARD,
    Calibration,
    attention_fraction,
    attention_tiles,
)
from meshplan.knowledge.releases import job_attention_kernel as attention_kernel
from meshplan.schema.model import Architecture, RopeSpec
from meshplan.schema.plan import Job

# The indexer's scores with its KL loss on: the forward, and a backward that recomputes them (FusedDSAIndexerLoss
# saves q, weights and k, not the s x s scores) and takes the gradients of q and k, one pass each: 4x the forward
# (Megatron-Core d98e8a6 experimental_attention_variant/dsa.py FusedDSAIndexerLoss, bwd_fused_indexer_loss_naive).
# The loss's target (the main attention's scores over the attended keys) runs in the forward and again in that
# backward: 2x.
INDEXER_PASSES_PER_FORWARD = 4.0
DSA_TARGET_PASSES = 2.0


_UNWINDOWED: dict[int, tuple[Architecture, Architecture]] = {}  # id(model) -> (model, the model without windows)


def trained_model(job: Job) -> Architecture:
    """The model as the job's framework builds it: job.model, or, where its model code ignores the model's sliding
    window (the card's attention.windowed_model_types: KempnerForge's SDPA, torchtitan's Llama and Qwen models) or its
    chunked attention (attention.chunked_model_types: Megatron-Core and Megatron-Bridge run Llama 4's every layer
    full), the same model with every layer full, which its attention then runs and its MFU counts. The copy is kept
    per model object so every call hands back the same one (the layer memos key on it)."""
    arch = job.model
    card = job.card.attention
    windowed = arch.windowed_layers and card is not None and not card.builds_window(arch.model_type)
    chunked = arch.chunked_layers and (card is None or not card.builds_chunks(arch.model_type))
    if not windowed and not chunked:
        return arch
    hit = _UNWINDOWED.get(id(arch))
    if hit is None or hit[0] is not arch:
        if len(_UNWINDOWED) > 64:
            _UNWINDOWED.clear()
        hit = _UNWINDOWED[id(arch)] = (arch, arch.model_copy(update={
            "sliding_window": None, "sliding_window_layers": None, "attention_chunk_size": None,
            "chunked_attention_layers": None}))
    return hit[1]


def yarn_concentration(rope: RopeSpec) -> float:
    """The YaRN concentration factor Megatron-Core scales cos and sin by (NVIDIA/Megatron-LM core_v0.16.0
    yarn_rotary_pos_embedding.py _yarn_get_concentration_factor): _yarn_get_mscale(factor) = 0.1 ln(factor) + 1
    where mscale or mscale_all_dim is unset, else the ratio of the two at the factor (1 at a factor of 1 or less)."""
    factor = rope.factor or 1.0

    def mscale(scale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale * math.log(factor) + 1.0

    if rope.mscale is None or rope.mscale_all_dim is None:
        return mscale(1.0)
    return mscale(rope.mscale) / mscale(rope.mscale_all_dim)


def runs_unfused_rope(job: Job, zero_stage: int) -> bool:
    """Whether the job's attention applies its rotary embedding with Megatron-Core's unfused ops, not Transformer
    Engine's fused kernel (the elementwise passes cards/calibration.yaml unfused_rope_passes counts over the rotated
    queries and keys): a non-MLA YaRN model on a framework whose card says its attention does so for any such model
    (Megatron-Bridge, and verl's and SkyRL's Megatron engines on its providers: the provider turns apply_rope_fusion
    off beside position_embedding_type yarn) or for one whose concentration factor is not 1 (Megatron-Core: TE's fused
    RoPE takes no mscale). Not on the engine `zero_stage` selects where that engine trains transformers' own modeling
    code (the card's eager_model_code: verl's and SkyRL's FSDP engines), whose rotary hf_eager_* passes count. Why:
    gpt-oss trains so."""
    card, rope = job.card.attention, job.model.rope
    if card is None or card.unfused_yarn_rope is None or rope is None or rope.scaling != "yarn" or job.model.mla:
        return False
    if job.card.eager_model_at(zero_stage):  # transformers' rotary, in the hf_eager_* query and key passes
        return False
    return card.unfused_yarn_rope == "any" or yarn_concentration(rope) != 1.0


def attention_efficiency(job: Job, cal: Calibration, kernel: str | None = None,
                         backend: str = "auto", zero_stage: int | None = None) -> tuple[str | None, float]:
    """(kernel, fraction of BF16 peak) of the flash attention the job runs: with backend auto the kernel its framework
    release picks on the GPU's generation for the engine of `zero_stage` and for an MLA model (the framework card's
    attention section: AttentionSemantics.kernel_for), with flash or fused the kernel
    that backend is in the framework (the card's attention.backends); a model whose core attention the framework's
    model code builds itself the kernel that attention runs whatever the backend (attention.model_kernels:
    Megatron-Bridge's Gemma 2, torchtitan's Llama 4, FlexAttention; or the release's, releases.kernel_before_change:
    NeMo AutoModel's gpt-oss before 2b7c02cfc); at that kernel's fraction for the generation
    (cards/calibration.yaml attention_kernels; else attention_peak_fraction). FlashAttention-2 reaches ~35% of an
    H100's peak where cuDNN / FA3-class kernels reach ~50% (FA3 paper), so the same trainer runs attention slower
    on an older release that still picked FA2. `kernel` names the one a run used instead (bench only: a published
    run of a trainer meshplan does not support, scored with another framework's card, e.g. LLM Foundry's Triton
    attention, which no framework meshplan renders can be told to run)."""
    if kernel is None:
        kernel = attention_kernel(job, backend, zero_stage)
    return kernel, attention_fraction(cal, kernel, job.gpu.arch)


def op_sac_recomputes_attention(job: Job, backend: str = "auto", zero_stage: int | None = None) -> bool:
    """Whether the framework's op-level SAC recomputes the job's attention: its release's save list lacks the kernel
    the job runs (the card's recompute.unsaved_attention: torchtitan 0.1.x's list has no cuDNN attention, which it
    runs on Blackwell). The kernel is looked up only where the card lists any (a list without one recomputes none:
    the stages' Recompute asks this of every estimate, perf.recompute_of)."""
    recompute = job.card.recompute
    kernel = attention_kernel(job, backend, zero_stage) if recompute.unsaved_attention else None
    return recompute.recomputes_attention(job.framework_version, kernel)


def op_sac_may_recompute_attention(job: Job) -> bool:
    """Whether op-level SAC recomputes the attention of any plan of the job: its release's save list lacks a kernel
    some plan may run (auto's on each ZeRO stage's engine, or a backend a plan names: op_sac_recomputes_attention of
    each). What a bound under every plan's estimate takes (search/floors.py: a recomputed attention keeps neither its
    output nor its log-sum-exp, the fewer bytes), so a request naming a backend whose kernel the list lacks, where
    auto's is kept, has no floor over its estimate."""
    card = job.card
    if card.attention is None or card.recompute.selective != "op_sac":
        return False
    return any(op_sac_recomputes_attention(job, backend, zero) for backend in ("auto", *card.attention.backends)
               for zero in (None, *card.engine.by_zero_stage))


def unfused_attention_seconds(ctx: LayerContext) -> tuple[float, float]:
    """(forward, forward + backward) of attention without flash attention, on one rank.

    Q.K^T and P.V run as batched GEMMs over the full s x s scores (the causal mask saves nothing), and
    the scores take memory-bound passes: scale-mask-softmax, and attention dropout when it is on
    (bytes per score from the card). This is Megatron-LM before FlashAttention (2021-22 papers) and
    `--attention-backend unfused`.
    """
    arch, sh, cal = ctx.arch, ctx.shard, ctx.cal
    heads = arch.num_attention_heads / sh.tp
    if arch.mla is not None:
        qk_width = arch.mla.qk_head_dim
        v_width = arch.mla.v_head_dim
    else:
        qk_width = v_width = arch.head_dim
    queries = ctx.seq / ctx.plan.cp  # per sequence on this rank; keys span the whole sequence
    batched = sh.tokens / queries * heads  # (micro-batch sequences) x (local heads) independent products
    scores = Gemm("attention_scores", queries, ctx.seq, qk_width, batched, fp8=False)
    context = Gemm("attention_context", queries, v_width, ctx.seq, batched, fp8=False)
    gemm = gemm_seconds([scores, context], cal, ctx.bf16_peak, None)
    elements = batched * queries * ctx.seq
    fwd_bytes = cal.softmax_bytes_per_score_fwd + (cal.dropout_bytes_per_score_fwd if ctx.dropout else 0.0)
    bwd_bytes = cal.softmax_bytes_per_score_bwd + (cal.dropout_bytes_per_score_bwd if ctx.dropout else 0.0)
    forward = gemm / TRAINING_PASSES_PER_FORWARD + elements * fwd_bytes / ctx.hbm
    return forward, gemm + elements * (fwd_bytes + bwd_bytes) / ctx.hbm


def dsa_indexer_seconds(ctx: LayerContext) -> tuple[float, float]:
    """(forward, forward + backward) of one layer's lightning indexer scores and its KL loss's target on one rank, at
    the attention kernel's fraction of BF16 peak: Megatron-Core's indexer kernels run in BF16 (dsa.py
    _compute_index_scores 'a BF16 implementation of the fp8_index logic'; ops/tilelang_indexer_fwd.py T.bfloat16), not
    the FP8 of DeepSeek's own kernels. (0, 0) without DSA."""
    arch = ctx.arch
    if arch.dsa is None:
        return 0.0, 0.0
    rate = ctx.bf16_peak * ctx.attention_fraction
    scores = indexer_score_flops(arch, ctx.shard, ctx.seq)
    target = dsa_loss_target_flops(arch, ctx.shard, ctx.seq)
    return (scores + target) / rate, (INDEXER_PASSES_PER_FORWARD * scores + DSA_TARGET_PASSES * target) / rate


def attention_seconds(ctx: LayerContext) -> tuple[float, float]:
    """(forward, forward + backward) of one layer's attention core: flash attention's FLOPs at the kernel's
    fraction of BF16 peak with a 2.5x backward (a window in the whole tiles the kernel computes: calibration.yaml
    attention_kernels local_tiles), or unfused attention; a DSA model's sparse core (its own kernels
    whatever the backend) with its indexer (dsa_indexer_seconds)."""
    if ctx.arch.dsa is not None:
        forward = attention_core_flops(ctx.arch, ctx.shard, ctx.seq) / (ctx.bf16_peak * ctx.attention_fraction)
        index_fwd, index = dsa_indexer_seconds(ctx)
        return forward + index_fwd, FLASH_ATTENTION_PASSES_PER_FORWARD * forward + index
    if ctx.flash:
        tiles = attention_tiles(ctx.attention_kernel, ctx.arch.head_dim) if ctx.arch.windowed_layers else None
        forward = attention_core_flops(ctx.arch, ctx.shard, ctx.seq, tiles) / (ctx.bf16_peak * ctx.attention_fraction)
        return forward, FLASH_ATTENTION_PASSES_PER_FORWARD * forward
    return unfused_attention_seconds(ctx)
