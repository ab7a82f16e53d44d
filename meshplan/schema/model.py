"""What a model is: its architecture as config.json states it (MoE, MLA, rotary embedding), and its parameter counts.

knowledge/model_config.py builds an `Architecture` from a config.json; knowledge/model_counts.py counts it.
"""

# ruff: noqa: RUF012 (pydantic copies a mutable default per instance; ruff cannot see across files that StrictModel is a pydantic model)

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.schema.choices import StrictModel

# The hidden_act names that are SiLU (transformers' ACT2FN maps "silu" and "swish" to nn.SiLU), which Megatron-Core
# runs as F.silu: gated, its SwiGLU.
SILU = frozenset({"silu", "swish"})


class MoESpec(StrictModel):
    """Routed and shared experts of a mixture-of-experts model."""

    num_experts: int = Field(ge=1, description="Routed experts per MoE layer")
    top_k: int = Field(ge=1, description="Routed experts each token uses")
    expert_ffn_hidden_size: int = Field(ge=1, description="FFN width of one routed expert")
    num_shared_experts: int = Field(0, ge=0)
    shared_expert_ffn_hidden_size: int = Field(0, ge=0, description="Total FFN width of all shared experts")
    shared_expert_gate: bool = Field(False, description="A hidden x 1 sigmoid gate scaling the shared experts' output "
                                                        "(Qwen2-MoE's shared_expert_gate)")
    moe_layers: list[int] = Field(description="Indices (0-based) of the decoder layers that are MoE")
    router_linear: bool = Field(False, description="transformers builds the router as an nn.Linear module, not a "
                                                   "bare weight (DeepSeek-V2's DeepseekV2Moe.gate), so PEFT's "
                                                   "all-linear adapts it; its parameters are the same hidden x "
                                                   "experts")
    router_returns_tuple: bool = Field(False, description="transformers builds the router as an nn.Linear subclass "
                                                          "whose forward returns (scores, logits) (Llama 4's "
                                                          "Llama4Router): PEFT's all-linear wraps it and the LoRA "
                                                          "layer's forward fails on the tuple, so the PEFT engines' "
                                                          "target_modules name the projections instead")
    router_bias: bool = False
    expert_bias: bool = Field(False, description="Biases on the expert linear layers (gpt-oss)")
    score_correction_bias: bool = Field(False, description="DeepSeek-V3 style per-expert routing bias")
    num_groups: int = Field(1, ge=1, description="n_group: routed experts split into this many equal groups")
    group_topk: int = Field(1, ge=1, description="topk_group: groups a token's experts may come from")
    latent_size: int | None = Field(None, ge=1, description="moe_latent_size (Nemotron 3's LatentMoE, Megatron-Core "
                                                            "MoELayer fc1_latent_proj / fc2_latent_proj): the routed "
                                                            "experts are dispatched and run at this width, projected "
                                                            "down from and back up to the hidden size by two linears "
                                                            "duplicated on every TP rank; the router and the shared "
                                                            "experts read the hidden size. None: no latent projection")

    def expert_width(self, hidden_size: int) -> int:
        """The width a routed expert reads and writes, and a dispatched token carries: the latent size of a latent
        MoE, else the hidden size."""
        return self.latent_size or hidden_size


class MLASpec(StrictModel):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2, Moonlight)."""

    q_lora_rank: int | None = None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        """A query's and a key's width per head, its position-free part and its rotary part (DeepSeek-V3's 128 + 64;
        transformers' DeepseekV3Config.qk_head_dim): every count of MLA's Q/K heads reads it here."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class DSASpec(StrictModel):
    """DeepSeek Sparse Attention (DeepSeek-V3.2): a lightning indexer per layer scores every preceding key for each
    query with index_n_heads heads of index_head_dim (its q from MLA's q latent, one shared k from the hidden state,
    per-head weights), and MLA attends only to the index_topk best-scored keys (DeepSeek's inference/model.py
    Indexer; Megatron-Core's DSAIndexer / DSAttention)."""

    index_n_heads: int = Field(ge=1, description="index_n_heads: the indexer's query heads")
    index_head_dim: int = Field(ge=1, description="index_head_dim: the width of an indexer head and its shared key")
    index_topk: int = Field(ge=1, description="index_topk: keys each query attends to (at most its position)")


# A hybrid model's layer kinds by their pattern letter (Megatron-Core's hybrid layer Symbols, core_v0.19.0
# mamba_hybrid_layer_allocation.py), in the order every per-kind walk takes them: the activations' Shape.kinds, the
# step time's HYBRID_KINDS, the assumptions' and the model report's counts
LAYER_KINDS = {"M": "Mamba-2", "G": "Gated DeltaNet", "*": "attention", "-": "MLP", "E": "MoE"}
# Its token mixers: the kinds with no FFN, whose layer runs the first TP pair and the sequence-wide traffic CP adds
MIXER_KINDS = ("M", "G", "*")


def layer_kind_counts(pattern: str) -> str:
    """A hybrid pattern's layers counted by kind, '24 Mamba-2, 4 attention, 24 MLP': LAYER_KINDS' order, a kind the
    pattern lacks left out. The one wording of every answer that counts them (memory's and throughput's hybrid
    assumptions, the RL refusal), which had each worded them their own way."""
    return ", ".join(f"{pattern.count(k)} {name}" for k, name in LAYER_KINDS.items() if k in pattern)


class MambaSpec(StrictModel):
    """A Mamba-2 mixer's shapes as config.json states them (transformers' NemotronHMamba2Mixer, Megatron-Core's
    MambaMixer): the inner width is heads x head_dim, and B and C carry n_groups x ssm_state_size channels each."""

    num_heads: int = Field(ge=1, description="mamba_num_heads")
    head_dim: int = Field(ge=1, description="mamba_head_dim")
    state_size: int = Field(ge=1, description="ssm_state_size: the SSM state per head channel")
    n_groups: int = Field(ge=1, description="n_groups: heads sharing one B and C")
    conv_kernel: int = Field(ge=1, description="conv_kernel: the causal depthwise conv1d's width")
    chunk_size: int = Field(ge=1, description="chunk_size: the SSD scan's chunk length")
    conv_bias: bool = Field(True, description="use_conv_bias")
    proj_bias: bool = Field(False, description="use_bias: biases on in_proj and out_proj")

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels through conv1d: x, B and C."""
        return self.d_inner + 2 * self.n_groups * self.state_size


class GatedDeltaNetSpec(StrictModel):
    """A Gated DeltaNet mixer's shapes as config.json states them (transformers' Qwen3NextGatedDeltaNet, Megatron-Core's
    GatedDeltaNet, megatron/core/ssm/gated_delta_net): q and k of key heads, v and the output gate z of value heads,
    a decay (alpha) and a write strength (beta) per value head, the depthwise causal conv1d over q, k and v."""

    num_key_heads: int = Field(ge=1, description="linear_num_key_heads")
    num_value_heads: int = Field(ge=1, description="linear_num_value_heads (a multiple of the key heads)")
    key_head_dim: int = Field(ge=1, description="linear_key_head_dim")
    value_head_dim: int = Field(ge=1, description="linear_value_head_dim")
    conv_kernel: int = Field(ge=1, description="linear_conv_kernel_dim: the causal depthwise conv1d's width")
    chunk_size: int = Field(ge=1, description="The chunk length of FLA's chunk_gated_delta_rule, which Megatron-Core "
                                              "and transformers call; no config.json field sets it (cards/"
                                              "calibration.yaml gdn_kernel)")

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels through conv1d: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def in_proj_width(self) -> int:
        """in_proj's output: q, k, v, z and beta, alpha per value head (in_proj_qkvz and in_proj_ba in transformers,
        one in_proj in Megatron-Core)."""
        return 2 * self.key_dim + 2 * self.value_dim + 2 * self.num_value_heads


class RopeSpec(StrictModel):
    """Rotary position embedding as config.json states it: rope_theta, rope_scaling (or transformers 5's
    rope_parameters) and partial_rotary_factor. It decides no count; the adapters render it."""

    theta: float | None = Field(None, gt=0, description="rope_theta, the rotary base; None when the config omits it")
    fraction: float = Field(1.0, gt=0, le=1, description="partial_rotary_factor: share of head dims that rotate")
    scaling: str | None = Field(None, description="rope_scaling's rope_type (llama3, yarn, linear, ...); None: none")
    factor: float | None = Field(None, gt=0)
    original_max_position_embeddings: int | None = Field(None, ge=1)
    low_freq_factor: float | None = Field(None, gt=0, description="llama3 scaling")
    high_freq_factor: float | None = Field(None, gt=0, description="llama3 scaling")
    beta_fast: float | None = Field(None, gt=0, description="yarn scaling")
    beta_slow: float | None = Field(None, gt=0, description="yarn scaling")
    mscale: float | None = Field(None, ge=0, description="yarn scaling")
    mscale_all_dim: float | None = Field(None, ge=0, description="yarn scaling")
    truncate: bool | None = Field(None, description="yarn: round the correction range to whole dims (default true)")


class VisionTower(StrictModel):
    """A Llama 4 vision tower and its projector as config.json's vision_config states them (transformers'
    Llama4VisionConfig): the model Llama4ForConditionalGeneration builds beside the text model, which the engines that
    load it build and hold (knowledge/model_counts.py vision_params counts it)."""

    hidden_size: int = Field(ge=1, description="hidden_size: the encoder's width")
    num_layers: int = Field(ge=1, description="num_hidden_layers: Llama4VisionEncoderLayer blocks")
    num_heads: int = Field(ge=1, description="num_attention_heads (head_dim = hidden_size // heads)")
    intermediate_size: int = Field(ge=1, description="intermediate_size: the encoder MLP's width, and the pixel "
                                                     "shuffle's output width the adapter MLP reads")
    image_size: int = Field(ge=1, description="image_size: a tile's side in pixels")
    patch_size: int = Field(ge=1, description="patch_size: a patch's side in pixels")
    num_channels: int = Field(3, ge=1)
    projector_input_dim: int = Field(ge=1, description="The adapter MLP's fc1 output width")
    projector_output_dim: int = Field(ge=1, description="The adapter MLP's fc2 width")
    vision_output_dim: int = Field(ge=1, description="The multi-modal projector's input width (its output: the text "
                                                     "model's hidden size)")


class Architecture(StrictModel):
    """The shapes that decide parameter count, memory and FLOPs; field meanings follow HF config.json."""

    key: str | None = Field(None, description="Catalog key, when the model is in the catalog")
    name: str
    hf_id: str | None = None
    model_type: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    ffn_hidden_size: int = Field(ge=1, description="Dense FFN width (dense layers only)")
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    activation: str = "silu"
    swiglu_limit: float | None = Field(None, gt=0, description="gpt-oss's clamped GLU: the gate clamped above and the "
                                                               "linear half to +-limit, quick-GELU (alpha 1.702) on "
                                                               "the gate, the linear half + 1 (HF swiglu_limit; "
                                                               "Megatron-Core activation_func_clamp_value); None: "
                                                               "the activation hidden_act names")
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: Literal["none", "head", "full"] = "none"
    attention_output_gate: bool = Field(False, description="q_proj also yields a sigmoid gate per query channel that "
                                                           "scales attention's output before o_proj (Qwen3-Next's "
                                                           "gated attention; Megatron-Core attention_output_gate)")
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norms_per_layer: int = 2
    learned_position_embeddings: int = Field(0, ge=0, description="Rows of a learned absolute position table")
    attention_sinks: bool = False
    alibi: bool = Field(False, description="ALiBi: linear attention biases per head instead of position embeddings "
                                            "(BLOOM); no rope, no position table")
    parallel_attention: bool = Field(False, description="Attention and MLP both read the layer's input and add into "
                                                        "one residual (GPT-J, GPT-NeoX use_parallel_residual)")
    embedding_norm: bool = Field(False, description="A norm right after the input embedding (BLOOM's "
                                                    "word_embeddings_layernorm)")
    output_bias: bool = Field(False, description="A bias on the output layer (GPT-J's lm_head)")
    sliding_window: int | None = Field(None, ge=1, description="Tokens a windowed layer's query attends to, itself "
                                                              "included (HF sliding_window; Megatron-Core window_size "
                                                              "(sliding_window - 1, 0)); None: every layer full")
    sliding_window_layers: int | None = Field(None, ge=0, description="How many layers attend over the window (HF "
                                                                      "layer_types 'sliding_attention'); None: every "
                                                                      "layer where sliding_window is set")
    attention_chunk_size: int | None = Field(None, ge=1, description="Tokens per chunk of a chunked layer (HF "
                                                                     "Llama4TextConfig attention_chunk_size): query i "
                                                                     "attends to the keys of its own chunk up to "
                                                                     "itself; None: no chunked layer")
    chunked_attention_layers: int | None = Field(None, ge=0, description="How many layers attend within the chunk "
                                                                         "(HF layer_types 'chunked_attention', the "
                                                                         "RoPE layers of Llama 4's iRoPE); None: "
                                                                         "every layer where the chunk is set")
    rope: RopeSpec | None = Field(None, description="Rotary embedding; None with learned absolute positions")
    norm_eps: float | None = Field(None, gt=0, lt=1, description="Norm epsilon; None when the config omits it")
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    dsa: DSASpec | None = Field(None, description="DeepSeek Sparse Attention's indexer beside MLA (deepseek_v32); "
                                                  "None: dense attention")
    layer_pattern: str | None = Field(None, description="A hybrid model's layers, one character each "
                                                        "(hybrid_override_pattern: M Mamba-2, G Gated DeltaNet, "
                                                        "* attention, - MLP, E MoE); None: every layer is attention "
                                                        "and an MLP or MoE")
    mamba: MambaSpec | None = Field(None, description="The Mamba-2 mixer of a hybrid model's M layers")
    gdn: GatedDeltaNetSpec | None = Field(None, description="The Gated DeltaNet mixer of a hybrid model's G layers")
    num_mtp_layers: int = Field(0, ge=0, description="Multi-token-prediction blocks (not in the total)")
    mtp_layer_pattern: str | None = Field(None, description="A hybrid model's MTP block, one character per layer as "
                                                            "layer_pattern (mtp_hybrid_override_pattern: Nemotron 3 "
                                                            "Super's '*E', an attention and an MoE layer); None: an "
                                                            "MTP block repeats the last decoder layer")
    mtp_repeated_layer: bool = Field(False, description="One MTP block's weights applied at every depth (Megatron-Core "
                                                        "mtp_use_repeated_layer): its parameters counted once, its "
                                                        "FLOPs and activations once per depth")
    vision: VisionTower | None = Field(None, description="The vision tower and projector a multimodal config states "
                                                         "(Llama 4's vision_config; not in the total)")
    generic: bool = Field(False, description="True when built from a size alone, not a real config")
    origin: str = Field("catalog", description="catalog | config.json path | generic size | a launch "
                                                "script's architecture flags the model is built from")

    @property
    def windowed_layers(self) -> int:
        """Layers that attend over sliding_window tokens; the others attend to every earlier token."""
        return self._local_layers(self.sliding_window, self.sliding_window_layers)

    @property
    def chunked_layers(self) -> int:
        """Layers that attend within their attention_chunk_size chunk; the others as windowed_layers says."""
        return self._local_layers(self.attention_chunk_size, self.chunked_attention_layers)

    def _local_layers(self, span: int | None, layers: int | None) -> int:
        """How many layers a local-attention kind covers: none without its span, every layer where the config gives
        the span alone, else the count it gives (at most the model's layers)."""
        if span is None:
            return 0
        return self.num_layers if layers is None else min(layers, self.num_layers)

    @property
    def local_attention(self) -> tuple[int, int | None]:
        """(layers, span): the layers whose query reaches back at most `span` keys, so an engine's KV cache and a
        decode step need only those: the windowed layers at their window, else the chunked layers at their chunk
        (a query sees its own chunk); (0, None) where every layer is full."""
        if self.windowed_layers:
            return self.windowed_layers, self.sliding_window
        if self.chunked_layers:
            return self.chunked_layers, self.attention_chunk_size
        return 0, None

    @model_validator(mode="after")
    def _one_kind_of_local_attention(self) -> Architecture:
        if self.windowed_layers and self.chunked_layers:
            raise ValueError("a model with both sliding-window and chunked layers is not modelled")
        return self

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def has_shared_experts(self) -> bool:
        """An MoE model with shared experts: the only part Megatron-Core's moe_shared_expert_overlap acts on."""
        return self.moe is not None and self.moe.num_shared_experts > 0

    @property
    def is_swiglu(self) -> bool:
        """A SwiGLU MLP as Megatron-Core builds it (gated_linear_unit with F.silu): gpt-oss's clamped GLU is not one
        though its hidden_act says silu (Megatron-Bridge's gpt_oss_bridge.py runs it as quick_gelu gated), so
        TransformerConfig refuses activation_func_fp8_input_store there and Megatron's --swiglu is not its flag."""
        return self.gated_mlp and self.activation in SILU and self.swiglu_limit is None

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and index in self.moe.moe_layers  # a list scan: no set built per ask

    @property
    def indexer_query_input(self) -> int:
        """The width DSA's indexer reads its queries from (wq_b's input): MLA's q latent, hidden_size where the model
        has none (DeepSeek's Indexer takes q_lora_rank; Megatron-Core's DSAIndexer falls back to hidden_size)."""
        return (self.mla.q_lora_rank if self.mla is not None else None) or self.hidden_size

    @property
    def cp_comm_type_default(self) -> str:
        """The CP communication a request that leaves cp_comm_type out gets: all-gather for a DSA model, the only
        one Megatron-Core's DSAttention runs (rule DSA003), else the p2p ring."""
        return "allgather" if self.dsa is not None else "p2p"

    def layer_kind(self, index: int) -> str:
        """A hybrid model's layer's letter (LAYER_KINDS: 'M', 'G', '*', '-' or 'E'); 'block' for every layer of a model
        that has no pattern (attention and an MLP or MoE in one layer)."""
        return self.layer_pattern[index] if self.layer_pattern is not None else "block"



class ComponentCount(StrictModel):
    name: str
    params: int
    active_params: int
    note: str = ""


class ModelReport(StrictModel):
    """Parameter counts of one model, exact from its config, under each vendor's convention."""

    name: str
    key: str | None
    hf_id: str | None
    model_type: str
    origin: str
    generic: bool
    total_params: int = Field(description="All weights: embeddings, head (if untied), norms, biases; no MTP")
    active_params: int = Field(description="What one token touches: top-k routed experts, embeddings and head")
    active_params_excl_input_embedding: int = Field(description="DeepSeek / gpt-oss convention")
    active_params_non_embedding: int = Field(description="Without input embedding and head (Moonlight, GLM)")
    non_embedding_params: int = Field(description="Total without input embedding and head (Qwen, Gemma)")
    mtp_params: int = Field(description="Multi-token-prediction blocks, not in the total")
    vision_params: int = Field(0, description="The vision tower and multi-modal projector (Llama 4's), not in the "
                                              "total: built and held by the engines that load the multimodal model")
    components: list[ComponentCount]
    architecture: Architecture
    published: dict | None = Field(None, description="Published counts and their source (catalog models)")
    assumptions: list[str] = []


class ModelSummary(StrictModel):
    key: str
    name: str
    hf_id: str | None
    model_type: str
    family: str
    total_params: int
    active_params: int

