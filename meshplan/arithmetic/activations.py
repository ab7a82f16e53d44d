"""Activation bytes one micro-batch leaves on one GPU, per decoder layer and per component.

After Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, section 4 and Table 2): every tensor autograd keeps for the backward pass, counted
once. Generalised here (shared/reference/estimators.md section 2.3) to GQA (K and V of g*d, not h),
gated MLPs (fc1 output 2f wide), MLA (latents and per-head K/V), MoE (the experts' tensors of the top-k
routed copies, the router's and dispatcher's state per framework in MoeBytes, shared experts), flash
attention (no s^2 tensor, an fp32 log-sum-exp instead), context parallelism (tokens / cp), sequence
parallelism (norm and dropout tensors / tp) and fp8 (linear-layer inputs kept in one byte). With
dropout on, flash off, GeLU MLP of 4h, MHA this reproduces Korthikanti's sbh(34 + 5as/h) exactly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from meshplan.schema.choices import CpPadding
from meshplan.schema.model import LAYER_KINDS, Architecture

BF16 = 2


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def cp_rank_tokens(seq: int, micro_batch: int, tp: int, cp: int, padding: CpPadding | None) -> int:
    """Tokens one context-parallel rank holds of a micro-batch of `micro_batch` sequences of `seq` tokens, padding
    included, as the engine pads (its card's engine.cp_padding): `per_sequence` each sequence up to a multiple of
    tp*2*cp (tp at cp 1: verl's Megatron engine, preprocess_packed_seqs' align_size; SkyRL's,
    get_packed_seq_align_size), `packed` the micro-batch's sequences packed into one row and its total up to a
    multiple of cp (Ulysses: verl's ulysses_pad, SkyRL's ulysses_pad_and_slice_inputs), None: no padding, each rank
    a ceil(seq / cp) of every sequence (Megatron-Core, whose CP001 asks 2*cp to divide seq). The padded tokens run
    through every layer like real ones, so they cost activations and time."""
    if padding == "packed":
        return _round_up(micro_batch * seq, cp) // cp
    if padding == "per_sequence":
        return micro_batch * _round_up(seq, tp * 2 * cp if cp > 1 else tp) // cp
    return -(-seq // cp) * micro_batch


def least_rank_tokens(seq: int, micro_batch: int, cp: int) -> int:
    """The fewest tokens a context-parallel rank computes of a micro-batch under any padding cp_rank_tokens knows:
    the packed micro-batch's total over cp, rounded up (each sequence padded, or each rank's ceil(seq / cp) of
    every sequence, holds at least as many). The search's lower bounds read it, so none counts padding an engine
    may not add."""
    return -(-(seq * micro_batch) // cp)


class Shape(NamedTuple):
    """The numbers of an Architecture that activations depend on (hashable, for caching)."""

    h: int
    a: int
    g: int
    d: int
    f: int
    gated: bool
    vocab: int
    experts: int
    top_k: int
    f_expert: int
    f_shared: int
    mla: tuple[int, int, int, int, int] | None  # q_lora (0 = none), kv_lora, d_nope, d_rope, d_v
    rope: bool  # rotary positions: rotated copies of Q and K are saved next to the fused QKV output
    qk_norm: bool = False  # a norm over each head of Q and K (Qwen3): counted where the norms save fp32 copies
    # a hybrid model's Mamba-2 mixer: (hidden, in_proj width, d_inner, n_groups), arithmetic/mamba.py reads it
    mamba: tuple[int, int, int, int] | None = None
    kinds: str = ""  # a hybrid model's layer kinds (of M, G, *, -, E, in that order); "" for every other model
    # a Gated DeltaNet mixer: (hidden, in_proj width, l2-normed q and k, q and k at the value heads, value width,
    # value heads, value heads x chunk), arithmetic/gdn.py reads it
    gdn: tuple[int, int, int, int, int, int, int] | None = None
    out_gate: bool = False  # attention's output gate (Architecture.attention_output_gate)
    latent: int = 0  # a latent MoE's moe_latent_size: its routed experts' width (MoESpec.expert_width); 0: none
    # DSA's indexer: (index_n_heads, index_head_dim, index_topk, the width its queries are read from,
    # Architecture.indexer_query_input); None: none
    dsa: tuple[int, int, int, int] | None = None

    @property
    def expert_h(self) -> int:
        """The width a routed token carries and an expert reads: the latent size of a latent MoE, else h."""
        return self.latent or self.h


def gdn_widths(arch: Architecture) -> tuple[int, int, int, int, int, int, int]:
    """Shape.gdn of a Gated DeltaNet mixer: the widths per token its saved tensors have (before TP), in the order the
    card's gdn_layer rows name them (arithmetic/gdn.py GDN_WIDTHS)."""
    g = arch.gdn
    assert g is not None
    return (arch.hidden_size, g.in_proj_width, 2 * g.key_dim, 2 * g.num_value_heads * g.key_head_dim, g.value_dim,
            g.num_value_heads, g.num_value_heads * g.chunk_size)


def shape_of(arch: Architecture) -> Shape:
    moe, mla = arch.moe, arch.mla
    return Shape(
        h=arch.hidden_size, a=arch.num_attention_heads, g=arch.num_kv_heads, d=arch.head_dim,
        f=arch.ffn_hidden_size, gated=arch.gated_mlp, vocab=arch.vocab_size,
        experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
        f_expert=moe.expert_ffn_hidden_size if moe else 0,
        f_shared=moe.shared_expert_ffn_hidden_size if moe else 0,
        mla=(mla.q_lora_rank or 0, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim)
        if mla else None,
        # rotary positions unless learned ones; a Mamba-2 hybrid's attention applies none (NemotronHAttention,
        # Megatron-Core's HybridModel's position_embedding_type default 'none'), a Gated DeltaNet hybrid's its own
        rope=arch.learned_position_embeddings == 0 and (arch.layer_pattern is None or arch.gdn is not None),
        qk_norm=arch.qk_norm == "head",
        mamba=(arch.hidden_size, 2 * arch.mamba.d_inner + 2 * arch.mamba.n_groups * arch.mamba.state_size
               + arch.mamba.num_heads, arch.mamba.d_inner, arch.mamba.n_groups) if arch.mamba else None,
        kinds="".join(k for k in LAYER_KINDS if k in (arch.layer_pattern or "")),
        gdn=gdn_widths(arch) if arch.gdn else None,
        out_gate=arch.attention_output_gate,
        latent=(moe.latent_size or 0) if moe else 0,
        dsa=(arch.dsa.index_n_heads, arch.dsa.index_head_dim, arch.dsa.index_topk, arch.indexer_query_input)
        if arch.dsa else None,
    )


class MoeBytes(NamedTuple):
    """What a framework's MoE layer keeps for the backward outside its experts' fc1/activation/fc2 tensors, per
    micro-batch: per token on the rank that routes it, and per routed token copy (top-k copies of each token) on
    the rank whose experts compute it. The audit behind each count is cards/moe_memory_audit.md."""

    per_token_expert: float  # bytes per token and expert: router scores, permutation maps [tokens, experts]
    per_token_topk: float    # bytes per token and top-k slot: top-k probabilities and expert ids
    per_token: float         # bytes per token
    per_copy: float          # bytes per routed copy besides hidden-wide tensors: its routing probability
    hidden_bytes: float      # bytes per hidden element kept per routed copy besides the expert fc1 input
    bf16_router_input: bool  # under fp8 the router still keeps the bf16 layer input (shared experts an fp8 copy)
    # The router's own copy of its input, bytes per token x hidden (torchtitan: fp32 under autocast); when set, the
    # bf16 layer input is kept only by the shared experts' fc1, if any. 0: the router keeps the layer input itself.
    router_input_bytes: float = 0
    router_weight_bytes: float = 0  # bytes per gate weight element the router's linear keeps (its fp32 copy)
    # the routed experts' activation (and routing-weight multiply) is one fused kernel that keeps only its input, the
    # fc1 output, beside fc2's input: no separate activation output (Layout.swiglu_unfused then reads the dense MLPs)
    fused_experts: bool = False
    # the router keeps its tensors and its input for the backward; False for a gate with no gradient (NeMo AutoModel's
    # FakeBalancedGate: constant weights, arange indices), whose layer input then only shared experts keep
    router_saves: bool = True


# Megatron-Core (megatron/core/transformer/moe, read at NVIDIA/Megatron-LM d98e8a6; Transformer Engine d0067d0),
# as Megatron-Bridge's MoE providers set it: moe_permute_fusion on, moe_router_fusion off, an aux loss, softmax.
MEGATRON_CORE_MOE = MoeBytes(
    # router.py TopKRouter.routing -> moe_utils.compute_routing_scores_for_aux_loss: the fp32 softmax over all
    # experts is saved by softmax for the aux loss (4 B); moe_utils.permute(fused=True) -> TE permutation.py
    # moe_permute (mask map) saves row_id_map, int32 [tokens, 2 * experts + 1] (8 B per expert + 4 B per token).
    # The gating linear (moe_utils.RouterGatingLinearFunction) saves its bf16 input, the layer input counted
    # once; its logits are saved by nothing (topk keeps indices, the softmaxes their outputs).
    per_token_expert=4 + 8,
    # moe_utils.topk_routing_with_score_function: torch.topk keeps its int64 indices (8 B), the softmax over the
    # top-k logits its fp32 output (4 B).
    per_token_topk=8 + 4,
    per_token=4,
    # experts.py TEGroupedMLP.forward -> fusions/fused_bias_swiglu.py WeightedSwiGLUFunction saves the permuted
    # fp32 probs next to fc1's output (4 B per copy, the router's fp32 probs after dispatch).
    per_copy=4,
    # The dispatched tokens are fc1's input (TE GroupedLinear keeps it, counted with the experts). Nothing keeps
    # a second hidden-wide copy: the all-to-all / HybridEP / DeepEP autograd functions save only their handles,
    # permute's index_select and unpermute's scatter_add (probs are applied inside the experts, not at
    # unpermute) save index maps, and the expert output leaves through combine and unpermute unsaved.
    hidden_bytes=0,
    # The router is no fp8 module: RouterGatingLinearFunction saves the bf16 input under fp8 too, and a shared
    # expert's TE fc1 keeps its own fp8 copy of it.
    bf16_router_input=True,
)
# Not re-derived per framework (DeepSpeed, nanotron, the fsdp2 preset: torchtitan 0.2, KempnerForge): fp32 router
# logits and probabilities [tokens, experts], and two hidden-wide copies of every routed token (dispatched and
# combined).
GENERIC_MOE = MoeBytes(per_token_expert=4 + 4, per_token_topk=0, per_token=0, per_copy=0, hidden_bytes=2 * BF16,
                       bf16_router_input=False)
# torchtitan 0.3.0's MoE (torchtitan/models/common/moe.py, token_dispatcher.py LocalTokenDispatcher and
# AllToAllTokenDispatcher, ops/scatter_add.py), what its autograd saves on a GPU (bench/fake_tensor_harness.py
# dumps them under FakeTensorMode, CUDA's fp32 autocast stood in on the CPU).
TORCHTITAN_MOE = MoeBytes(
    # TokenChoiceTopKRouter.forward runs the gate under torch.autocast(dtype=float32): scores [tokens, experts]
    # are fp32 and sigmoid (or softmax) saves its fp32 output.
    per_token_expert=4,
    # topk's int64 expert ids, saved by the gather of their scores (8 B), and the fp32 gathered scores, saved by
    # route_norm's division (4 B).
    per_token_topk=8 + 4,
    # route_norm's fp32 denominator [tokens, 1]. Group-limited routing's own topk indices and mask (DeepSeek-V3:
    # 168 B per token, 0.03% of its MoE layer) are left out: the catalog does not carry the expert groups.
    per_token=4,
    # _local_reorder: the int64 argsort (saved by the score gather) and the int64 token indices (saved by the
    # token gather and by combine's deterministic_scatter_add), and the fp32 scores in expert order (saved by
    # combine's multiply).
    per_copy=8 + 8 + 4,
    # combine: routed_output.to(float32) * scores saves the fp32 expert output of every routed copy. Under EP > 1
    # (AllToAllTokenDispatcher) _permute's int64 permuted indices per received copy (8 B) come on top, not counted
    # (the FakeTensorMode harness runs ep=1).
    hidden_bytes=4,
    bf16_router_input=False,
    # the gate's autocast copies: its fp32 input (saved by the linear for the weight gradient) and fp32 weight
    # (for the input gradient); the bf16 layer input is saved by the shared experts' w1/w3 only.
    router_input_bytes=4,
    router_weight_bytes=4,
)
# Hugging Face transformers 5.9.0's MoE blocks as verl's and SkyRL's FSDP engines run them (integrations/moe.py
# grouped_mm_experts_forward, the default experts_implementation; models/qwen3_moe Qwen3MoeTopKRouter), what autograd
# saves (bench/fake_tensor_hf_harness.py, under FakeTensorMode).
HF_MOE = MoeBytes(
    # the router's fp32 softmax over all experts, saved by softmax (4 B)
    per_token_expert=4,
    # topk's int64 indices (8 B) and, with norm_topk_prob (Qwen3-MoE's config), the in-place division's fp32
    # quotient (4 B) ...
    per_token_topk=8 + 4,
    per_token=4,  # ... and its fp32 denominator [tokens, 1]
    # the int64 token index of the gather (perm // top_k), the int64 sort permutation of the score gather and the
    # int64 inverse permutation of the unsort, the bool sentinel mask of masked_fill_, and the bf16 routing weight
    # the expert output is multiplied by: 8 + 8 + 8 + 1 + 2
    per_copy=27,
    # that multiply also saves the bf16 expert output of every routed copy (the gathered fc1 input is counted
    # with the experts)
    hidden_bytes=2,
    bf16_router_input=False,
)
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
"""Megatron-Core's recompute_modules where a plan names none (TransformerConfig's default): what a plan's selective
recompute runs, in the estimate (estimate/memory.selective_modules) and the search's floors, whose plans never set
them (search/job.py refuses recompute_modules)."""

# NeMo AutoModel's MoE under the DeepEP (flex) dispatcher: components/moe/layers.py GroupedExpertsDeepEP (89e3a9fdd,
# 2025-10-06; components/moe/experts.py at 36044ad3d the same saves) over the vendored Megatron-Core flex dispatcher
# (components/moe/megatron/token_dispatcher.py, moe_permute_fusion=True). Per routed copy: grouped_gemm's ops.gmm
# keeps the permuted tokens (fc1's input, counted with the experts) and the fc2 input; the gate_up bias is added
# with split/cat (saves nothing), so fc1's raw output is freed; the @torch.compile'd activation (quick_geglu_deepep /
# swiglu_oai_deepep: clamp, x * sigmoid(alpha x) * (up + 1), times the routing prob, cast back) keeps its bf16 input
# (the biased fc1 output, gate and up) and the fp32 permuted prob (4 B per copy); nothing else of the expert width.
# The down bias (b * p on the [hidden] bias row), TE's fused unpermute (row_id_map) and DeepEP's fused_combine (its
# handle) keep nothing hidden-wide, nor does DeepEP's fused_dispatch. The router (Gate: linear, topk, softmax, aux
# loss) is not re-derived: the generic count.
AUTOMODEL_DEEPEP_MOE = GENERIC_MOE._replace(per_copy=4, hidden_bytes=0, fused_experts=True)

MOE_BYTES = {"megatron_core": MEGATRON_CORE_MOE, "generic": GENERIC_MOE, "fp32_router": TORCHTITAN_MOE, "hf": HF_MOE,
             "automodel_deepep": AUTOMODEL_DEEPEP_MOE}


def moe_bytes(conv, arch: Architecture, dispatcher: str | None = None, fake_gate: bool = False) -> MoeBytes:
    """What a convention's MoE layer keeps for this model under a token dispatcher: MOE_BYTES[moe_activations], or
    the convention's moe_activations_flex under the flex (DeepEP/HybridEP) one where it has its own, with the router's
    fp32 copies of its input and gate weight where the model's own code makes them (router_fp32_model_types: Hugging
    Face's DeepSeek-V3 and GLM-4-MoE routers upcast, its Qwen3-MoE, Mixtral and gpt-oss routers do not); a fake
    balanced gate (Job.moe_fake_balanced_gate) keeps nothing."""
    flex = conv.moe_activations_flex if dispatcher == "flex" else None
    base = MOE_BYTES[flex or conv.moe_activations]
    if arch.model_type in conv.router_fp32_model_types:
        base = base._replace(router_input_bytes=4, router_weight_bytes=4)
    return base._replace(router_saves=False) if fake_gate else base


def least_moe_bytes(conv, arch: Architecture, fake_gate: bool = False) -> MoeBytes:
    """What a convention's MoE layer keeps at least, whichever dispatcher a plan runs (the search's floors, which do
    not know it): each count the least of moe_bytes' cases, a switch at the side that keeps less."""
    cases = [moe_bytes(conv, arch, d, fake_gate) for d in (None, "flex")]
    least = {f: min(getattr(c, f) for c in cases) for f in MoeBytes._fields
             if f not in ("bf16_router_input", "fused_experts", "router_saves")}
    return MoeBytes(**least, bf16_router_input=all(c.bf16_router_input for c in cases),
                    fused_experts=any(c.fused_experts for c in cases),
                    router_saves=all(c.router_saves for c in cases))


class Fp8AttentionSaves(NamedTuple):
    """What Transformer Engine's FP8 dot-product attention keeps for the backward in place of the bf16 kernel's
    tensors (memory_states.fp8_attention_saves, cards/memory.yaml fp8_saves): bytes per element of Q, K, V and of
    the attention's output, and per head and token of its softmax statistics (None: the convention's
    attention_stats_bytes, what the context-parallel ring keeps)."""

    qkv: float
    output: float
    stats: float | None


class AttentionSaves(NamedTuple):
    """What a framework's attention code keeps beside Q, K, V and its output (cards/memory.yaml conventions:
    rope_saves, mla_v_view, attention_stats_bytes)."""

    # rotated_copies: the fused QKV output lives on beside the rotated Q and K (Megatron, GQA); frequencies: only
    # the complex64 RoPE rows gathered by position (torchtitan); shared_tables: nothing per layer (HF multiplies by
    # cos/sin tables made once per forward, which need no gradient: only they are saved, shared by every layer)
    rope: str = "rotated_copies"
    mla_v_view: bool = False  # MLA's V stays a view of the kv up-projection output: its K-nope half lives on
    stats_bytes: float = 4    # per head and token beside the output: flash's fp32 log-sum-exp 4, flex's with max 8
    # input: a norm keeps its bf16 input (fused kernels; the fp32 rstd left out); fp32_composite: HF's RMSNorm
    # module (x.to(fp32), pow, mean, rsqrt, mul, .to(bf16), weight *) keeps an fp32 copy of its input, the fp32 rstd
    # and the bf16 normalised tensor, not the bf16 input; Q/K head norms (Qwen3) the same
    norms: str = "input"
    # MLA under flash attention with a V head narrower than Q/K's (HF's DeepseekV3Attention): V is padded to the QK
    # width (flash keeps the padded copy) and flash's output, that wide, is sliced into the out-projection's input
    mla_v_pad: bool = False


def attention_saves(conv) -> AttentionSaves:
    """A memory convention's (memory_states.Convention) attention and norm switches."""
    return AttentionSaves(conv.rope_saves, conv.mla_v_view, conv.attention_stats_bytes, conv.norm_saves,
                          conv.mla_v_pad)


def ulysses_heads(kv_heads: int, degree: int) -> int:
    """K/V heads a rank sends through Ulysses' all-to-all and attends with: verl's and SkyRL's
    _ulysses_flash_attention_forward repeat K and V max(degree // kv_heads, 1) times first (repeat_kv), so that the
    degree divides them (UL001 asks kv_heads to divide it or be a multiple of it)."""
    return kv_heads * max(degree // kv_heads, 1)


def _norm(width: float, rows: float, lay: Layout) -> float:
    """What one norm over `width` features of `rows` rows keeps for the backward (AttentionSaves.norms)."""
    if lay.attn.norms == "fp32_composite":
        return rows * (4 * width + BF16 * width + 4)
    return BF16 * rows * width


def frozen_norm_bytes(shape: Shape, lay: Layout) -> float:
    """What one layer's norms do not keep when their weights are frozen (a LoRA job), of what _norm counts: Hugging
    Face's RMSNorm (fp32_composite) multiplies its weight by the bf16 normalised tensor, and torch's mul keeps that
    tensor only for the weight's gradient (the two block norms, MLA's latent norms, Qwen3's per-head Q/K norms; a
    hybrid's layers, which no PEFT engine trains, are left out); a fused norm kernel (input) keeps its input
    whatever its weight (Transformer Engine's LayerNormLinear saves inputmat, mu, rsigma). Measured on a small Llama
    under PEFT (bench/peft_lora_saved_harness.py)."""
    if lay.attn.norms != "fp32_composite" or shape.kinds:
        return 0.0
    t, ts = lay.tokens, lay.tp if lay.sp else 1
    rows = 2 * shape.h / ts
    if shape.mla:
        rows += sum(shape.mla[:2]) / ts
    if shape.qk_norm and not shape.mla:
        rows += (shape.a + shape.g) * shape.d / lay.tp
    return BF16 * t * rows


def frozen_linear_bytes(shape: Shape, lay: Layout, targets: frozenset[str], moe_layer: bool, recompute: str,
                        modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES, experts_adapted: bool = True) -> float:
    """What one layer's activations (layer_activations, under `recompute`) count for the inputs of linears a LoRA job
    leaves without an adapter (not in `targets`) and that nothing else keeps: a frozen linear saves no input, whose
    only use is its weight's gradient, while an adapted one's lora_A (or Megatron-Bridge's linear_in) keeps it.
    Sources: torch's mm keeps mat1 only when mat2 requires grad (PEFT's and AutoModel's nn.Linear bases); Transformer
    Engine (d0067d0) module/linear.py saves inputmat only if backward_needs_input (weight.requires_grad), and
    module/layernorm_linear.py frees ln_out when the weight needs no gradient and return_layernorm_output is off,
    which Megatron-Bridge (peft/utils.py get_adapter_attributes_from_linear) turns on only for the
    TELayerNormColumnParallelLinear it adapts. Taken off:

    - the QKV input (linear_qkv) and the dense MLP's fc1 input (linear_fc1): the norm's output (a frozen Hugging Face
      RMSNorm's weight multiply keeps nothing, frozen_norm_bytes; a fused layernorm-linear keeps its own input);
    - the out-projection input (linear_proj), unless flash attention keeps that very tensor as its output (no
      Ulysses all-to-all or selective core_attn recompute between them);
    - the dense MLP's fc2 input (linear_fc2), the activation product down_proj alone reads;
    - in an MoE layer, the routed experts' fc1 input (the dispatched copies) and fc2 input where they have no adapter
      (the targets lack it, or `experts_adapted` is False: the engine adapts no routed expert) and PEFT's ParamWrapper
      does not wrap that weight (lay.param_wrapper: its delta needs a gradient), and the shared experts' fc2 input:
      TE GroupedLinear (grouped_linear.py) saves inputmats only if weights[0].requires_grad, and torch's grouped_mm
      keeps none for a frozen weight (a small Qwen3-MoE under PEFT, saved_tensors_hooks).
    MLA attention, the router's input, a hybrid's layers and op-level SAC's layer (_op_sac) are left as counted.
    Measured against PEFT on a small Llama with target subsets (bench/peft_lora_saved_harness.py,
    tests/test_lora_activations.py)."""
    if recompute in ("full", "op_sac") or shape.kinds:
        return 0.0
    sel = set(modules) if recompute == "selective" else set()
    t, ts = lay.tokens, lay.tp if lay.sp else 1
    lin = 1 if lay.fp8 else BF16
    out = 0.0
    if not shape.mla:
        if "linear_qkv" not in targets and "layernorm" not in sel:
            out += lin * t * shape.h / ts
        if "linear_proj" not in targets and (not lay.flash or lay.ulysses > 1 or "core_attn" in sel):
            out += BF16 * t * shape.a * shape.d / lay.tp
    if moe_layer and shape.experts:
        return out + _frozen_expert_bytes(shape, lay.moe_view(), targets, sel, experts_adapted)
    if "mlp" in sel:
        return out
    if "linear_fc1" not in targets and "layernorm" not in sel:
        out += lin * t * shape.h / ts
    if "linear_fc2" not in targets:
        out += lin * t * shape.f / lay.tp
    return out


def _frozen_expert_bytes(shape: Shape, lay: Layout, targets: frozenset[str], sel: set[str],
                         experts_adapted: bool) -> float:
    """frozen_linear_bytes' MoE block: what _moe_layer counts for the inputs of its expert linears without an
    adapter."""
    if "moe" in sel:
        return 0.0
    lin, rows, out = 1 if lay.fp8 else BF16, routed_rows(shape, lay), 0.0
    if not ("linear_fc1" in targets and experts_adapted) and "gate_up_proj" not in lay.param_wrapper:
        out += lin * rows * shape.expert_h
    if not ("linear_fc2" in targets and experts_adapted) and "down_proj" not in lay.param_wrapper \
            and "moe_act" not in sel:
        out += lin * rows * shape.f_expert / lay.etp
    if shape.f_shared and "linear_fc2" not in targets and "shared_experts" not in sel:
        out += lin * lay.tokens * shape.f_shared / lay.tp
    return out


class Layout(NamedTuple):
    """What of the plan and conventions changes a layer's activations."""

    tokens: int          # s/cp * b: tokens this rank holds
    seq_kv: int          # keys each query attends to (s): the s^2 term without flash attention
    tp: int
    sp: bool
    etp: int
    flash: bool
    dropout: bool
    swiglu_unfused: bool
    fp8: bool
    ep: int = 1  # expert parallelism: op-level SAC keeps the all-to-all outputs when > 1
    moe: MoeBytes = MEGATRON_CORE_MOE  # what the MoE layer keeps outside its experts (the convention's moe_activations)
    qkv_fused: bool = True  # GQA's Q, K, V from one linear or three (op-SAC counts each mm; qkv_projections)
    attn: AttentionSaves = AttentionSaves()  # what the attention code keeps beside Q, K, V (the convention's switches)
    routed_load: float = 1.0  # routed tokens on this (the most loaded) EP rank over the mean (memory.ep_rank_load)
    # under fp8, the out-projection keeps its own fp8 copy of the attention output beside the bf16 one (memory_states.
    # fp8_out_proj_copy); off by default, the smaller count, so a layout built without it stays a floor
    fp8_out_proj_copy: bool = False
    # TP leaves the MoE block whole (the card's moe_tp, KempnerForge): it keeps TP1's tensors of every token on each
    # TP rank (moe_view); off by default, the smaller count, so a layout built without it stays a floor
    moe_whole: bool = False
    # the MoE layer stacks its local routed experts' weights into new tensors each forward, which its grouped GEMM
    # keeps for the backward (the card's moe_expert_weights, KempnerForge); off by default, the smaller count
    stacked_experts: bool = False
    # the routed experts' 3D weights PEFT's ParamWrappers wrap (LoraSpec.target_parameters): each forward builds W +
    # delta of every local expert, which the experts' GEMMs keep for the backward (param_wrapper_bytes); none by default
    param_wrapper: tuple[str, ...] = ()
    # what a Mamba-2 layer saves (cards/memory.yaml mamba2_layer, Mamba2Layer.terms); empty for a model without one
    mamba: tuple = ()
    # what a Gated DeltaNet layer saves (cards/memory.yaml gdn_layer, GdnLayer.terms); empty for a model without one
    gdn: tuple = ()
    # the Ulysses degree where the engine runs cp as Ulysses (rules/context.runs_ulysses): flash attention keeps K
    # and V at ulysses_heads and its output before the all-to-all that gives the out-projection its input; 1, the
    # smaller count, so a layout built without it stays a floor
    ulysses: int = 1
    # op-level SAC recomputes the attention (its kernel is not in the release's save list: AttentionSemantics'
    # recompute.unsaved_attention, torchtitan 0.1.x's cuDNN), so _op_sac keeps neither its output nor its log-sum-exp;
    # off by default (attention kept, the larger count): the search's floors pass it too
    attention_recomputed: bool = False
    # the CP degree over which a DSA model gathers its latent key and its indexer's key, each kept whole for the
    # backward (Megatron-Core DSAttention, CP all-gather only); 1, the smaller count, so a layout built without it
    # stays a floor
    dsa_cp: int = 1
    # the unfused path caps the scores with softcap * tanh(scores / softcap) and tanh keeps its output, one more
    # bf16 score matrix (the framework card's attention.unfused_softcap); off, the smaller count, by default
    softcap_scores: bool = False
    # what the MLP's activation keeps where the model code's ACT2FN class runs it (memory_states.activation_saves:
    # keeps its input, bytes of intermediates per element); None: a fused kernel that keeps its input (swiglu_unfused
    # says whether a gated one keeps its output too)
    act: tuple[bool, float] | None = None
    # bytes per routed copy and expert-width element the model's own experts gate keeps beside fc2's input, where its
    # code has one in place of act (memory_states.expert_gate_bytes: gpt-oss's clamped GLU under Hugging Face's code);
    # 0, the act count, by default, the smaller, so a layout built without it stays a floor
    expert_gate: float = 0
    # bytes per element of fc1's output that the fused SwiGLU keeps for its backward: 1 under Megatron-Core's
    # activation_func_fp8_input_store (memory_states.swiglu_input_bytes, cards/memory.yaml fp8_saves), else bf16;
    # the estimate and the search's floors both pass the job's
    act_input_bytes: float = BF16
    # Transformer Engine's FP8 dot-product attention (memory_states.fp8_attention_saves); None: the bf16 kernel's
    # tensors. The estimate and the search's floors both pass the job's
    fp8_attention: Fp8AttentionSaves | None = None
    # Megatron-Core's moe_shared_expert_overlap (Job.moe_shared_expert_overlap): the shared experts gather the layer
    # input over SP themselves and their fc1 keeps the gathered copy (_moe_layer). False, the lesser, by default
    shared_expert_overlap: bool = False
    # bytes per element of the activation's output width Megatron-Core's unfused glu() keeps beyond the fused kernel,
    # (dense MLP or shared experts, routed experts) (memory_states.unfused_glu_bytes, Job.bias_activation_fusion off);
    # (0, 0), the fused count, by default. The estimate and the search's floors both pass the job's
    unfused_glu: tuple[float, float] = (0.0, 0.0)

    def moe_view(self) -> Layout:
        """The layout an MoE block's tensors see: this one, or where TP leaves the block whole tp 1 without SP."""
        return self._replace(tp=1, sp=False, moe_whole=False) if self.moe_whole and self.tp > 1 else self


def saved_rows_bytes(rows: tuple, widths: dict[str, int], lay: Layout, sel: set[str]) -> float:
    """A mixer's saved bytes for one micro-batch on one GPU from its card's rows (Mamba2Layer.terms, GdnLayer.terms:
    width, bytes, sp, dropped_by, kept_by, dropout): per token, each row's width over TP (over TP only under SP for
    the hidden-wide rows), less the rows `sel`'s recompute modules drop or a row kept only under another's, and the
    dropout rows without dropout."""
    lin = 1 if lay.fp8 else BF16
    total = 0.0
    for width, nbytes, sp, dropped_by, kept_by, dropout in rows:
        if (dropped_by and dropped_by in sel) or (kept_by and kept_by not in sel) or (dropout and not lay.dropout):
            continue
        split = (lay.tp if lay.sp else 1) if sp else lay.tp
        total += (lin if nbytes == "linear" else nbytes) * lay.tokens * widths[width] / split
    return total


def _mlp(shape: Shape, width: int, rows: float, tp: int, lin: int, unfused: bool, act: bool = True,
         saves: tuple[bool, float] | None = None, one_fc1: bool = False, act_input: float = BF16,
         unfused_glu: float = 0.0) -> float:
    """fc1 output (activation input), optional separate silu output, fc2 input; fc1 input counted by caller.
    act=False: the activation's outputs are recomputed (Megatron's moe_act), only the fc1 output is kept (in bf16:
    the checkpoint keeps its input; the fp8 store is made by the recomputed forward). act_input: the bytes per
    element the fused kernel keeps of fc1's output (Layout.act_input_bytes: 1 under Megatron-Core's
    activation_func_fp8_input_store, which casts it to float8_e4m3fn and frees the bf16 one).
    saves (Layout.act): the model code's activation keeps what it says (its input or not, and intermediates), and a
    gated MLP's multiply keeps the activation's output and up's: Hugging Face's LlamaMLP, down_proj(act_fn(
    gate_proj(x)) * up_proj(x)), its non-gated MLPs (GPT-2's c_fc/act/c_proj, GPT-NeoX's, Nemotron's), and its
    grouped-mm experts (`one_fc1`: gate and up are chunks of one gate_up output, so up's keeps that whole tensor).
    unfused_glu: bytes per element Megatron-Core's unfused glu() keeps beside the fused kernel's (Layout.unfused_glu),
    gated MLPs whose activation is not recomputed."""
    if saves is not None and act:
        keeps_input, inner = saves
        unit = rows * width / tp
        out = (BF16 if keeps_input or (shape.gated and one_fc1) else 0) * unit + inner * unit
        if shape.gated:
            out += 2 * BF16 * unit  # up's output and the activation's, which the multiply keeps
        return out + lin * unit  # fc2 input
    out = (act_input if act else BF16) * rows * (2 if shape.gated else 1) * width / tp
    if not act:
        return out
    if shape.gated and unfused:
        out += BF16 * rows * width / tp
    if shape.gated:
        out += unfused_glu * rows * width / tp
    return out + lin * rows * width / tp


def activation_mode(recompute: str, selective: str) -> str:
    """The `layer_activations` mode of a plan's recompute, given what its framework's "selective" means (framework
    card recompute.selective): core_attention is Megatron's module-wise selective, op_sac torchtitan's op-level SAC."""
    if recompute == "selective" and selective == "op_sac":
        return "op_sac"
    return recompute


@lru_cache(maxsize=8192)
def layer_activations(shape: Shape, lay: Layout, moe_layer: bool, recompute: str,
                      modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES) -> dict[str, float]:
    """Bytes per micro-batch of one layer, by component. recompute: none | selective (Megatron-Core's
    selective recompute of `modules`, its recompute_modules) | op_sac (torchtitan's op-level selective AC) | full.

    What each Megatron module's recompute drops (transformer_config.py recompute_modules; the checkpointed modules
    keep their input): core_attn the softmax/dropout (or flash's log-sum-exp); mlp a dense MLP's tensors past its
    input; moe a MoE layer's past its input; shared_experts the shared experts'; moe_act the routed experts'
    activation outputs (fc2 input); mla_up_proj MLA's per-head Q, K, V (the latents stay); layernorm the two norm
    outputs (the QKV and fc1/router inputs; the norm inputs stay)."""
    sel = set(modules) if recompute == "selective" else set()
    if recompute == "op_sac":
        return _op_sac(shape, lay, moe_layer)
    t, h, tp = lay.tokens, shape.h, lay.tp
    ts = tp if lay.sp else 1  # tensors that sequence parallelism shards
    lin = 1 if lay.fp8 else BF16  # linear-layer inputs: fp8 keeps them in one byte
    if recompute == "full":
        return {"layer_input": BF16 * t * h / ts}
    out: dict[str, float] = {}
    out["norm_inputs"] = 2 * _norm(h, t, lay) / ts
    out["attention"] = _attention(shape, lay, sel, lin)
    # MLP / MoE
    mlp = 0.0 if "layernorm" in sel else lin * t * h / ts  # fc1 (or router + expert) input
    block = lay.moe_view()
    block_ts = block.tp if block.sp else 1  # what SP shards of the MoE block's tensors
    if moe_layer and shape.experts and "moe" in sel:
        out["moe"] = BF16 * t * h / block_ts  # the checkpointed MoE layer keeps its input
    elif moe_layer and shape.experts:
        out["moe"] = _moe_layer(shape, block, sel, lin, 0.0 if "layernorm" in sel else lin * t * h / block_ts)
    elif "mlp" in sel:
        out["mlp"] = BF16 * t * h / ts  # the checkpointed MLP keeps its input
    else:
        mlp += _mlp(shape, shape.f, t, tp, lin, lay.swiglu_unfused, saves=lay.act, act_input=lay.act_input_bytes,
                    unfused_glu=lay.unfused_glu[0])
        out["mlp"] = mlp
    if lay.dropout:
        out["dropout_masks"] = t * h / ts
    return out


def _attention(shape: Shape, lay: Layout, sel: set[str], lin: int) -> float:
    """The attention block's bytes (layer_activations, without recompute or with the selective modules `sel`)."""
    t, h, tp = lay.tokens, shape.h, lay.tp
    ts = tp if lay.sp else 1
    # TE runs FP8 attention in its fused kernel only; a recomputed core_attn (Megatron-Core's
    # _checkpointed_attention_forward) keeps the checkpoint's bf16 Q, K, V and makes the fp8 copies in its recompute
    fp8a = lay.fp8_attention if lay.flash and "core_attn" not in sel else None
    qkv_bytes = BF16 if fp8a is None else fp8a.qkv  # Q, K, V as the attention kernel keeps them
    attn = 0.0 if "layernorm" in sel else lin * t * h / ts  # QKV (or q/kv down-projection) input
    if shape.mla:
        q_lora, kv_lora, d_nope, d_rope, d_v = shape.mla
        if lay.attn.norms == "fp32_composite":  # each latent's norm, and its output (the up-projection input)
            latent = sum(_norm(r, t, lay) + BF16 * t * r for r in (q_lora, kv_lora) if r)
        else:
            latent = 2 * BF16 * t * (q_lora + kv_lora) + BF16 * t * d_rope  # norm input + up-projection input
        attn += latent / ts
        q_dim, v_dim = shape.a * (d_nope + d_rope), shape.a * d_v
        if shape.dsa is not None:
            attn += absorbed_mla_bytes(shape, lay, sel) + indexer_bytes(shape, lay)
        elif "mla_up_proj" not in sel:
            attn += qkv_bytes * t * (2 * q_dim + v_dim) / tp  # per-head Q, K, V
            if lay.attn.mla_v_view and fp8a is None:  # FP8 attention keeps its own fp8 V, not the view
                attn += BF16 * t * shape.a * d_nope / tp  # the K-nope half of the up-projection output V views
        padded = lay.flash and lay.attn.mla_v_pad and d_v < d_nope + d_rope and shape.dsa is None
        if padded and "core_attn" not in sel:
            # V padded to the QK head width for flash, and flash's output at that width, sliced into a new tensor
            attn += BF16 * t * (q_dim - v_dim + q_dim) / tp
    else:
        q_dim, v_dim, padded = shape.a * shape.d, shape.a * shape.d, False
        attn += qkv_bytes * t * (q_dim + 2 * ulysses_heads(shape.g, lay.ulysses) * shape.d) / tp  # as flash keeps them
        if shape.qk_norm and lay.attn.norms == "fp32_composite":  # per-head Q and K norms, each head a row
            attn += (_norm(shape.d, t * shape.a, lay) + _norm(shape.d, t * shape.g, lay)) / tp
    attn += _rope(shape, lay, fp8_qkv=fp8a is not None)
    core = 0.0
    if lay.flash:
        stats = lay.attn.stats_bytes if fp8a is None or fp8a.stats is None else fp8a.stats
        core += stats * t * shape.a / tp  # fp32 log-sum-exp (flex's with max, FP8 attention's M and ZInv) per head
    else:
        scores = shape.a * t * lay.seq_kv / tp
        core += BF16 * scores  # softmax output
        if lay.softcap_scores:
            core += BF16 * scores  # the logit softcap's tanh output
        if lay.dropout:
            core += scores + BF16 * scores  # dropout mask (1 B) and dropout output
    if "core_attn" in sel:
        core = 0.0  # core attention is recomputed from Q, K, V
    attn += core + _attention_output(lay, fp8a) * t * v_dim / tp
    if shape.out_gate:  # Megatron-Core Attention._apply_output_gate keeps the gate and the core output it scales
        attn += 2 * BF16 * t * q_dim / tp
    if lay.ulysses > 1 and lay.flash and not padded and "core_attn" not in sel:
        attn += BF16 * t * v_dim / tp  # flash's own output, before the all-to-all (a padded one is counted above)
    if lay.dropout:
        attn += t * h / ts  # output dropout mask
    return attn


def _attention_output(lay: Layout, fp8a: Fp8AttentionSaves | None) -> float:
    """Bytes per element of the core attention's output kept for the backward, by the kernel and the out-projection.
    The bf16 kernel keeps its output, which is the out-projection's input: under Megatron's delayed-scaling fp8 the
    out-projection keeps its own fp8 copy beside it (Layout.fp8_out_proj_copy), under its other recipes the same bf16
    tensor (save_original_input). FP8 attention keeps its fp8 output and hands the out-projection a dequantized bf16
    one (TE FusedAttnFunc: out_ret = out_fp8.dequantize()), which the out-projection keeps as its fp8 copy under delayed
    scaling and whole under the other recipes."""
    copy = 1 if lay.fp8 and lay.fp8_out_proj_copy else 0
    if fp8a is None:
        return BF16 + copy
    return fp8a.output + (copy if copy else BF16)


# torch.topk's indices are int64, and Megatron-Core's indexer keeps them so (dsa.py fused_qk_topk_naive:
# index_scores.topk(...) then masked_fill(-1)); FusedDSAIndexerLoss saves them for the backward beside q, weights, k
TOPK_INDEX_BYTES = 8


def absorbed_mla_bytes(shape: Shape, lay: Layout, sel: set[str]) -> float:
    """What DSA's absorbed MLA keeps per layer in place of MLA's per-head Q, K, V (Megatron-Core
    AbsorbedMLASelfAttention, NVIDIA/Megatron-LM d98e8a6 experimental_attention_variant/absorbed_mla.py): the per-head
    q-nope the W_UK einsum reads, the absorbed query (kv_lora + rope per head) the sparse kernel reads, the one latent
    key (kv_lora + rope, gathered over SP: whole on every TP rank, and over CP: Layout.dsa_cp times the rows) and the
    core's latent output (kv_lora per head) the W_UV einsum reads. Recomputing mla_up_proj (its qkv_up_checkpoint) drops
    the first two and the key; recomputing core_attn the latent output."""
    assert shape.mla is not None
    _, kv_lora, d_nope, d_rope, _ = shape.mla
    t, tp = lay.tokens, lay.tp
    out = 0.0
    if "mla_up_proj" not in sel:  # the latent key gathered over CP: the whole sequence's rows
        out += BF16 * t * (shape.a * (d_nope + kv_lora + d_rope) / tp + lay.dsa_cp * (kv_lora + d_rope))
    if "core_attn" not in sel:
        out += BF16 * t * shape.a * kv_lora / tp
    return out


def indexer_bytes(shape: Shape, lay: Layout) -> float:
    """What DSA's lightning indexer keeps per layer for its KL loss's backward, on every TP rank over the rows gathered
    over SP (its linears are duplicated): FusedDSAIndexerLoss's saved q (heads x head_dim), weights (a bf16 per head), k
    (head_dim, gathered over CP: Layout.dsa_cp times the rows) and top-k indices (index_topk, TOPK_INDEX_BYTES each),
    k_norm's LayerNorm input (head_dim) and its fp32 mean and rstd; and, under sequence parallelism with tp > 1, the
    indexer's own gathered copies of the layer input and the q latent that its wk, weights_proj and wq_b keep
    (DSAIndexer.forward_before_topk gather_from_sequence_parallel_region). Megatron-Core d98e8a6
    experimental_attention_variant/dsa.py."""
    assert shape.dsa is not None
    heads, head_dim, topk, q_in = shape.dsa
    t = lay.tokens
    out = (BF16 * t * (heads * head_dim + heads + (1 + lay.dsa_cp) * head_dim) + 8 * t
           + TOPK_INDEX_BYTES * t * topk)  # k saved as gathered over CP
    if lay.sp and lay.tp > 1:
        out += BF16 * t * (shape.h + q_in)
    return out


def routed_rows(shape: Shape, lay: Layout) -> float:
    """The routed token copies an MoE layer computes on the most loaded rank per micro-batch: each rank's t x top_k
    copies spread over the EP ranks and gathered over ETP (t x top_k x etp on average), routed_load times that on the
    most loaded rank (dropless, no cap). What the experts' activations and their LoRA adapters' rows read."""
    return lay.tokens * shape.top_k / (lay.tp if lay.sp else 1) * lay.etp * lay.routed_load


def _moe_layer(shape: Shape, lay: Layout, sel: set[str], lin: int, mlp: float) -> float:
    """A MoE layer's bytes (layer_activations) on top of `mlp`, its input as the router and experts keep it."""
    t, h, tp = lay.tokens, shape.h, lay.tp
    ts = tp if lay.sp else 1
    if not lay.moe.router_saves:  # a gate with no gradient: the layer input only for the shared experts' fc1
        mlp = mlp if shape.f_shared else 0.0
    elif lay.moe.router_input_bytes and "layernorm" not in sel:
        # the router's own copy of its input and gate weight; the layer input only if shared experts read it
        mlp = lay.moe.router_input_bytes * t * h / ts + (mlp if shape.f_shared else 0.0)
        mlp += lay.moe.router_weight_bytes * shape.experts * h
    if lay.fp8 and lay.moe.bf16_router_input and lay.moe.router_saves and "layernorm" not in sel:
        # the router keeps the bf16 input; the fp8 copy counted above is the shared experts' fc1's, if any
        mlp += (BF16 if shape.f_shared else BF16 - lin) * t * h / ts
        if shape.latent and shape.f_shared:
            mlp += lin * t * h / ts  # fc1_latent_proj's own fp8 copy beside the shared experts'
    if shape.latent:
        mlp += lin * t * shape.latent / ts  # fc2_latent_proj's input: the combined latent-wide tokens
    if lay.moe.router_saves:
        mlp += _moe_routing(shape, lay, t / ts)
    # routed copies computed on this rank: dropless, each rank's t*top_k copies spread over the EP ranks and
    # gathered over ETP, so t*top_k*etp on average, routed_load times that on the most loaded rank (no cap); a latent
    # MoE's copies are latent-wide (dispatched after fc1_latent_proj)
    rows = routed_rows(shape, lay)
    mlp += rows * (lay.moe.per_copy + lay.moe.hidden_bytes * shape.expert_h)
    mlp += lin * rows * shape.expert_h  # expert fc1 input (the dispatched tokens)
    fused = lay.moe.fused_experts  # the experts' own fused activation, whatever the dense MLP's
    if lay.expert_gate and not fused and "moe_act" not in sel:  # the model's own gate, then fc2's input
        mlp += rows * shape.f_expert / lay.etp * (lay.expert_gate + lin)
    else:
        mlp += _mlp(shape, shape.f_expert, rows, lay.etp, lin, lay.swiglu_unfused and not fused,
                    act="moe_act" not in sel, saves=None if fused else lay.act, one_fc1=True,
                    act_input=lay.act_input_bytes, unfused_glu=0.0 if fused else lay.unfused_glu[1])
    if shape.f_shared and "shared_experts" not in sel:
        mlp += _mlp(shape, shape.f_shared, t, tp, lin, lay.swiglu_unfused, saves=lay.act,
                    act_input=lay.act_input_bytes, unfused_glu=lay.unfused_glu[0])
        if lay.shared_expert_overlap and lay.sp and tp > 1:
            mlp += shared_overlap_input_bytes(t, h, ts, lin, lay.fp8)
    if lay.stacked_experts:
        mlp += stacked_expert_bytes(shape, lay.ep, lay.etp)
    if lay.param_wrapper:
        mlp += param_wrapper_bytes(shape, lay.param_wrapper, lay.ep, lay.etp)
    return mlp


def shared_overlap_input_bytes(tokens: float, hidden: int, ts: int, lin: int, fp8: bool) -> float:
    """What Megatron-Core's moe_shared_expert_overlap adds to an MoE layer's saved bytes under sequence parallelism
    (NVIDIA/Megatron-LM 24bad8e677 transformer/moe/shared_experts.py: pre_forward_comm all-gathers the layer input over
    the TP group into cached_fc1_input on the shared experts' stream, and their linear_fc1, parallel_mode None under the
    overlap, keeps that gathered copy for its backward): the whole sequence's `tokens` x `hidden` at the linear input's
    bytes `lin`, beside the local norm output the router keeps. Under fp8 the gathered fp8 copy replaces the local one
    the shared fc1 would otherwise keep (_moe_layer counts it in the layer input)."""
    whole = lin * tokens * hidden
    return whole - (lin * tokens * hidden / ts if fp8 else 0.0)


def param_wrapper_bytes(shape: Shape, weights: tuple[str, ...], ep: int, etp: int) -> float:
    """Bytes of one MoE layer's W + delta tensors under PEFT's ParamWrappers on `weights` (arithmetic/param_wrapper.py:
    the parametrization's forward returns a new tensor the size of the weight, cached for the layer's forward and saved
    by the experts' GEMMs for their backward), bf16, the local experts' weights over etp: gate_up_proj h x (2 if gated)
    x ffn, down_proj ffn x h."""
    per_expert = {"gate_up_proj": (2 if shape.gated else 1) * shape.expert_h * shape.f_expert,
                  "down_proj": shape.f_expert * shape.expert_h}
    return BF16 * shape.experts / ep * sum(per_expert[w] for w in weights) / etp


def stacked_expert_bytes(shape: Shape, ep: int, etp: int) -> float:
    """Bytes of one MoE layer's stacked copy of its local routed experts' bf16 weights (fc1, gate too where gated,
    and fc2, each expert's shard over ETP): what a framework that stacks them per forward (Layout.stacked_experts)
    writes each forward and keeps until the layer's backward."""
    return BF16 * shape.experts / ep * (3 if shape.gated else 2) * shape.expert_h * shape.f_expert / etp


def _rope(shape: Shape, lay: Layout, fp8_qkv: bool = False) -> float:
    """What rotary embedding keeps per layer beyond the rotated Q and K. Megatron's GQA (rotated_copies): V stays
    a view of the fused QKV output, so that buffer lives on next to the rotated Q and K (its MLA rotates inside
    the per-head Q and K counted above). torchtitan (frequencies): the complex multiply saves only the complex64
    cos/sin rows gathered by position, one pair (8 B) per rotary dimension pair and token, shared by Q and K.
    Hugging Face (shared_tables): nothing per layer, only the model's cos/sin tables are saved. `fp8_qkv`: FP8
    attention keeps its own fp8 Q, K and V (not under a recomputed core_attn, whose checkpoint keeps the bf16 ones)."""
    if not shape.rope:
        return 0.0
    t = lay.tokens
    if lay.attn.rope == "shared_tables":
        return 0.0
    if lay.attn.rope == "frequencies":
        rotary = shape.mla[3] if shape.mla else shape.d
        return 8 * t * rotary / 2
    if shape.mla:
        return 0.0
    if fp8_qkv:
        return 0.0  # FP8 attention keeps fp8 copies of Q, K and V: no bf16 view holds the fused QKV output
    return BF16 * t * (shape.a * shape.d + shape.g * shape.d) / lay.tp


def _moe_routing(shape: Shape, lay: Layout, tokens: float) -> float:
    """Router and permutation bytes a MoE layer keeps per micro-batch for the tokens this rank routes."""
    m = lay.moe
    return tokens * (m.per_token_expert * shape.experts + m.per_token_topk * shape.top_k + m.per_token)


def _op_sac(shape: Shape, lay: Layout, moe_layer: bool) -> dict[str, float]:
    """torchtitan's op-level selective AC (0.3.0 SelectiveAC; 0.2.x selective_ac_option "op"): the block keeps
    its input and the outputs of the compute-intensive ops, everything pointwise and every norm is recomputed.
    Of the mm/linear calls, counted per block in call order, every second one is recomputed; the router-gate mm is
    always recomputed and not counted; topk and the expert all-to-alls are kept; torch._grouped_mm is in no save
    list, so routed experts are recomputed whole. Call order: GQA's fused wqkv (0.3.0) or wq, wk, wv (<= 0.2,
    lay.qkv_fused False), MLA's wq_a/wq_b, wkv_a, wkv_b; attention; wo; then the MLP's w1, w3, w2 (shared experts
    the same, after the routed ones). Under fp8 (torchao's Float8Linear) nothing changes: the policy sees aten.mm
    with Float8TrainingTensor arguments, counts it and keeps its bf16 output, as for bf16 (the subclass runs
    _scaled_mm below the SAC mode, so 0.3.0's save list naming _scaled_mm never sees it); the amax reductions
    kept by aten.max are scalars. torchtitan's 2024-12 list also saved aten.abs: eager, that keeps |x| of every
    fp8 cast; compiled with tensorwise scaling it measured nothing (pytorch/torchtitan #820, which removed it
    2025-02-06) and it is not modelled. Where the release's save list lacks the attention kernel the run picks
    (lay.attention_recomputed: torchtitan 0.1.x and cuDNN, pytorch/torchtitan b39377f9f added it), the attention is
    recomputed: its output and log-sum-exp are not kept (its Q, K, V are rebuilt from the kept mm outputs). Checked
    per layer against torchtitan's own code under FakeTensorMode (bench/data/fake_tensor_memory.json); the fp8
    dispatch with torchao's Float8Linear on the CPU."""
    t, h, tp = lay.tokens, shape.h, lay.tp
    ts = tp if lay.sp else 1
    rs = tp > 1 and lay.sp  # row-parallel outputs: the partial sums, then the kept reduce-scatter output

    def col(width: int, sharded: bool = True) -> float:  # a column-parallel (or replicated) linear's output
        return BF16 * t * width / (tp if sharded else 1)

    def row() -> float:  # a row-parallel linear's output (hidden wide, partial before the reduce-scatter)
        return BF16 * t * h + (BF16 * t * h / ts if rs else 0.0)

    out: dict[str, float] = {"layer_input": BF16 * t * h / ts}
    count = 0

    def mm(nbytes: float) -> float:
        nonlocal count
        count += 1
        return nbytes if count % 2 else 0.0

    # attention
    if shape.mla:
        q_lora, kv_lora, d_nope, d_rope, d_v = shape.mla
        attn = mm(col(q_lora, False)) + mm(col(shape.a * (d_nope + d_rope))) if q_lora \
            else mm(col(shape.a * (d_nope + d_rope)))
        attn += mm(col(kv_lora + d_rope, False)) + mm(col(shape.a * (d_nope + d_v)))
        v_dim = shape.a * d_v
    elif lay.qkv_fused:
        attn = mm(col(shape.a * shape.d + 2 * shape.g * shape.d))
        v_dim = shape.a * shape.d
    else:
        attn = mm(col(shape.a * shape.d)) + mm(col(shape.g * shape.d)) + mm(col(shape.g * shape.d))
        v_dim = shape.a * shape.d
    if not lay.attention_recomputed:
        attn += BF16 * t * v_dim / tp  # attention output
        if lay.flash:
            attn += 4 * t * shape.a / tp  # fp32 log-sum-exp per head and token
        else:
            attn += BF16 * shape.a * t * lay.seq_kv / tp  # the math kernel's attention weights
    attn += mm(row())
    out["attention"] = attn

    def mlp(width: int, rows: float, div: int) -> float:
        if shape.gated:
            return mm(BF16 * rows * width / div) + mm(BF16 * rows * width / div) + mm(row())
        return mm(BF16 * rows * width / div) + mm(row())

    if moe_layer and shape.experts:
        moe = t / ts * shape.top_k * (4 + 8)  # topk: fp32 scores and int64 expert ids
        if lay.ep > 1:
            # dispatch all-to-all output (the copies this rank's experts receive) and combine output (its own)
            moe += (lay.routed_load + 1) * BF16 * t / ts * shape.top_k * h
        if shape.f_shared:
            moe += mlp(shape.f_shared, t, tp)
        out["moe"] = moe
    else:
        out["mlp"] = mlp(shape.f, t, tp)
    return out
