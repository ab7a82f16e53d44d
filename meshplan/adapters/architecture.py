"""The model's own architecture in Megatron-Core's terms: rope base and scaling, activation, norm and qk-norm,
group-limited routing (HF n_group / topk_group; Megatron-Bridge's model_bridge.py CONFIG_MAPPING maps them the same).

One list of settings serves both Megatron faces. Each names the TransformerConfig / GPTModelProvider field
(`cfg.model.<field>` in Megatron-Bridge) and, where one exists, the pretrain_gpt.py flag that sets it
(megatron-core 0.19.2: training/arguments.py, and argument_utils.py core_transformer_config_from_args,
which copies same-named args onto the config). What a face cannot express becomes a note that says what
to add, so a rendered command never drops an architecture fact silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshplan.knowledge.gdn_config import PATTERN_LAYERS_PER_DECODER_LAYER, decoder_flags
from meshplan.schema.model import Architecture, RopeSpec

Flag = tuple[str, Any]  # (flag, value); value None = a switch

TANH_GELU = frozenset({"gelu_pytorch_tanh", "gelu_new", "gelu_fast"})
# Norms whose weight is applied as (1 + w): Gemma's RMSNorm, Nemotron's LayerNorm1P. Megatron calls it a
# zero-centred gamma (--apply-layernorm-1p); Megatron-Bridge's gemma2_bridge.py sets it for Gemma 2.
# Qwen3-Next's Qwen3NextRMSNorm (and Qwen3.5's) scales by (1 + weight), weight initialised at zero; Megatron-Bridge's
# Qwen3NextBridge sets layernorm_zero_centered_gamma
ZERO_CENTERED_NORM = frozenset({"gemma2", "gemma3_text", "nemotron", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_text"})
# Megatron-Core's llama3 rope scaling fixes everything but the factor (RotaryEmbedding._apply_scaling,
# core/models/common/embeddings/rotary_pos_embedding.py): low_freq_factor 1, high_freq_factor 4, context 8192.
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# gpt-oss's MLP as Megatron-Bridge's gpt_oss_bridge.py builds it: quick_gelu gated, +1 on the linear half,
# clamped at the config's swiglu_limit (Architecture.swiglu_limit).
GPT_OSS_GLU_OFFSET = 1.0


FIELDS = frozenset({
    "normalization", "layernorm_epsilon", "layernorm_zero_centered_gamma", "gated_linear_unit", "glu_linear_offset",
    "activation_func_clamp_value", "position_embedding_type", "rotary_base", "rotary_percent", "rope_type",
    "apply_rope_fusion", "rope_scaling", "rope_scaling_factor", "qk_layernorm", "moe_router_num_groups",
    "moe_router_group_topk", "yarn_correction_range_round_to_int", "hybrid_layer_pattern", "mamba_num_heads",
    "mamba_head_dim", "mamba_num_groups", "mamba_state_dim", "mamba_chunk_size", "moe_latent_size",
    "mtp_hybrid_override_pattern", "attention_output_gate", "experimental_attention_variant", "linear_attention_freq",
    "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
    "linear_num_value_heads",
    *(p + name for p in ("", "yarn_") for name in ("rotary_scaling_factor", "original_max_position_embeddings",
                                                   "beta_fast", "beta_slow", "mscale", "mscale_all_dim"))})
"""Every TransformerConfig field megatron_architecture may set (Megatron-Bridge's cfg.model.<field>): the keys a
rendered Bridge file restates the model with, which its import reads back as the model's, not as layout settings
(tests/test_import_config.py renders every catalog model and holds the settings to this set)."""

CORE_FLAGS = frozenset({
    "--normalization", "--norm-epsilon", "--apply-layernorm-1p", "--swiglu", "--quick-geglu", "--squared-relu",
    "--glu-linear-offset", "--activation-func-clamp-value", "--position-embedding-type", "--rotary-base",
    "--rotary-percent", "--rope-type", "--no-rope-fusion", "--use-rope-scaling", "--rope-scaling-factor",
    "--rotary-scaling-factor", "--yarn-original-max-position-embeddings", "--yarn-beta-fast", "--yarn-beta-slow",
    "--mscale", "--mscale-all-dim", "--no-yarn-correction-range-round-to-int", "--qk-layernorm",
    "--moe-router-num-groups", "--moe-router-group-topk", "--disable-bias-linear", "--add-qkv-bias",
    "--hybrid-layer-pattern", "--mamba-num-heads", "--mamba-head-dim", "--mamba-num-groups", "--mamba-state-dim",
    "--moe-latent-size", "--mtp-hybrid-override-pattern", "--attention-output-gate",
    "--linear-attention-freq", "--linear-conv-kernel-dim", "--linear-key-head-dim", "--linear-value-head-dim",
    "--linear-num-key-heads", "--linear-num-value-heads"})
"""Every pretrain_gpt.py flag megatron_architecture (Setting.flag) and bias_flags may write: the flags a rendered
Megatron-Core script restates the model with, which its import reads back as the model's
(tests/test_import_config.py renders every catalog model and holds the flags to this set)."""


@dataclass(frozen=True)
class Setting:
    """One architecture fact: the config field and its value, and the flag that sets it (None: no flag does)."""

    field: str | None  # None: a flag with no plain config value (an activation function)
    value: Any
    flag: Flag | None
    default: Any = None  # Megatron's own value: a field no flag sets needs no note when it already has it
    explained: bool = False  # a field no flag sets whose note is written where it is made


def _rope(m: Architecture, rope: RopeSpec) -> tuple[list[Setting], list[str]]:
    """Rope base, share and scaling. MLA models take yarn by default in Megatron (MLATransformerConfig
    rope_type), so an unscaled MLA model says rope_type rope; their position_embedding_type is rope all the same:
    left at Megatron-LM's default, learned_absolute, GPTModel's LanguageModelEmbedding adds a learned table of
    max_position_embeddings rows beside MLA's own rotary (Megatron-LM d98e8a6 language_model_embedding.py
    add_position_embedding; its DeepSeek-V2-Lite, DeepSeek-R1 and DeepSeek-V3 scripts,
    examples/post_training/modelopt/conf/deepseek-ai/*.sh and examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh, pass
    --position-embedding-type rope beside --multi-latent-attention). Other models say yarn there where scaled so."""
    out: list[Setting] = []
    notes: list[str] = []
    mla = m.mla is not None
    kind = rope.scaling
    embedding = "yarn" if kind == "yarn" and not mla else "rope"
    out.append(Setting("position_embedding_type", embedding, ("--position-embedding-type", embedding)))
    if rope.theta is None:
        notes.append(f"meshplan does not know {m.name}'s rope base (no rope_theta in its config as given): Megatron "
                     "uses 10000 unless told; add --rotary-base (cfg.model.rotary_base) with the model's rope_theta.")
    elif rope.theta.is_integer():
        out.append(Setting("rotary_base", int(rope.theta), ("--rotary-base", int(rope.theta))))
    else:  # --rotary-base is parsed as an int
        out.append(Setting("rotary_base", rope.theta, None, default=10000))
    if rope.fraction != 1:
        out.append(Setting("rotary_percent", rope.fraction, ("--rotary-percent", rope.fraction)))
    if mla:
        out.append(Setting("rope_type", "yarn" if kind == "yarn" else "rope",
                           ("--rope-type", "yarn" if kind == "yarn" else "rope")))
        # MLATransformerConfig.__post_init__: "apply_rope_fusion for MLA only works with YARN"; DSA asserts it off
        # ("RoPE fusion is not supported for DSAttention", transformer_config.py d98e8a6)
        if kind != "yarn" or m.dsa is not None:
            out.append(Setting("apply_rope_fusion", False, ("--no-rope-fusion", None)))
    if kind is None:
        return out, notes
    if kind == "llama3" and not mla:
        given = {"low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
                 "original_max_position_embeddings": rope.original_max_position_embeddings}
        if all(given[k] is None or given[k] == v for k, v in LLAMA3_FIXED.items()) and rope.factor:
            out += [Setting("rope_scaling", True, ("--use-rope-scaling", None)),
                    Setting("rope_scaling_factor", rope.factor, ("--rope-scaling-factor", rope.factor))]
        else:
            differ = ", ".join(f"{k}={given[k]:g}" for k, v in LLAMA3_FIXED.items() if given[k] not in (None, v))
            notes.append(f"{m.name} uses llama3 rope scaling with factor {rope.factor:g} and {differ}, but "
                         "Megatron-Core's llama3 scaling fixes low_freq_factor 1, high_freq_factor 4 and an original "
                         "context of 8192 (RotaryEmbedding._apply_scaling): neither --use-rope-scaling nor "
                         "cfg.model.rope_scaling reproduces it; the model needs its own rotary embedding.")
    elif kind == "yarn":
        prefix = "" if mla else "yarn_"
        out.append(Setting(f"{prefix}rotary_scaling_factor", rope.factor, ("--rotary-scaling-factor", rope.factor)))
        # MLA reads these under their plain names, which no flag sets (the --yarn-* flags feed only the
        # non-MLA yarn embedding, argument_utils.py _apply_yarn_config_from_args).
        for name, value, default in (("original_max_position_embeddings", rope.original_max_position_embeddings, 4096),
                                     ("beta_fast", rope.beta_fast, 32.0), ("beta_slow", rope.beta_slow, 1.0)):
            if value is not None:
                flag = None if mla else (f"--yarn-{name.replace('_', '-')}", value)
                out.append(Setting(prefix + name, value, flag, default=default))
        for name, value in (("mscale", rope.mscale), ("mscale_all_dim", rope.mscale_all_dim)):
            if value is not None:
                out.append(Setting(prefix + name, value, (f"--{name.replace('_', '-')}", value)))
        if rope.truncate is False and not mla:
            out.append(Setting("yarn_correction_range_round_to_int", False,
                               ("--no-yarn-correction-range-round-to-int", None)))
    else:
        notes.append(f"{m.name} uses {kind} rope scaling (factor {rope.factor}), which Megatron-Core has no "
                     "setting for: extend the context by other means or train without it.")
    return out, notes


def _activation(m: Architecture) -> tuple[list[Setting], list[str]]:
    act, name = m.activation, m.name
    if m.swiglu_limit is not None:  # gpt-oss's clamped GLU
        return [Setting("gated_linear_unit", True, ("--quick-geglu", None)),
                Setting("glu_linear_offset", GPT_OSS_GLU_OFFSET, ("--glu-linear-offset", GPT_OSS_GLU_OFFSET)),
                Setting("activation_func_clamp_value", m.swiglu_limit,
                        ("--activation-func-clamp-value", m.swiglu_limit))], []
    if m.is_swiglu:
        return [Setting("gated_linear_unit", True, ("--swiglu", None))], []
    if m.gated_mlp and act in TANH_GELU:
        return [Setting("gated_linear_unit", True, None, explained=True)], [
            f"{name}'s MLP is GeGLU with the tanh GELU (hidden_act {act}). pretrain_gpt.py has no flag for it "
            "(--swiglu is SiLU-gated, --quick-geglu is x*sigmoid(1.702x)): build the TransformerConfig with "
            "gated_linear_unit=True and activation_func=megatron.core.activations.fast_gelu, as Megatron-Bridge's "
            "gemma2_bridge.py does."]
    if m.gated_mlp:
        return [Setting("gated_linear_unit", True, None, explained=True)], [
            f"{name}'s MLP is gated with {act}, which no pretrain_gpt.py flag selects: set the TransformerConfig's "
            "activation_func yourself."]
    if act == "relu2":
        return [Setting(None, "squared_relu", ("--squared-relu", None))], []
    if act in TANH_GELU:
        return [], [f"{name} uses the tanh GELU (hidden_act {act}); Megatron's default is the exact (erf) GELU and "
                    "no flag selects the tanh one (--openai-gelu is parsed but unused in megatron-core 0.19.2): set "
                    "activation_func in the TransformerConfig to match the checkpoint exactly."]
    if act == "gelu":
        return [], []  # Megatron's default activation
    return [], [f"{name} uses the activation {act}, which no pretrain_gpt.py flag selects: set activation_func."]


def _features(m: Architecture, seq_length: int) -> list[str]:
    """What pretrain_gpt.py's GPT layer cannot build at all, per model family."""
    name = m.name
    if m.model_type == "gemma2":
        return [f"{name} also has norms after attention and after the MLP (4 per layer), attention-logit and "
                "final-logit soft-capping, query_pre_attn_scalar and a sliding window on every other layer; "
                "pretrain_gpt.py builds none of them: train it through Megatron-Bridge, whose gemma2_bridge.py sets "
                "them from the checkpoint."]
    if m.model_type == "gemma3_text":
        return [f"{name} also has norms after attention and after the MLP (4 per layer), q/k norms, "
                "query_pre_attn_scalar, and sliding-window layers interleaved with global ones (layer_types; 5:1 "
                "by default) whose rotary base differs (rope_local_base_freq); pretrain_gpt.py builds none of that "
                "pattern: train it through Megatron-Bridge, whose gemma3_bridge.py sets them from the checkpoint."]
    if m.model_type == "glm4":
        return [f"{name} also normalises the attention output and the MLP output before each residual add "
                "(post_self_attn_layernorm, post_mlp_layernorm: 4 norms per layer); pretrain_gpt.py's GPT layer "
                "has neither: build a layer spec with them to match the checkpoint."]
    if m.model_type == "llama4_text":
        chunk = (f"attends within {m.attention_chunk_size:,}-token chunks on {m.chunked_layers} of its "
                 f"{m.num_layers} layers" if m.chunked_layers else "has no chunked layer")
        return [f"{name} skips RoPE on every fourth layer, {chunk} and (where use_qk_norm) applies a weightless L2 "
                "norm to q and k; pretrain_gpt.py cannot build that layer pattern (--no-rope-freq skips the rotary, "
                "nothing chunks), and Megatron-Bridge 0.6.2 registers no Llama 4 bridge: train it through "
                "torchtitan 0.2.2's llama4 or a transformers engine (the framework card's attention.chunked_source)."]
    if m.model_type == "gpt_oss":
        return [f"{name} also has learned attention sinks and a {m.sliding_window}-token window on every other layer: "
                f"add --softmax-type learnable --window-size {(m.sliding_window or 1) - 1},0 "
                "--window-attn-skip-freq 2 (cfg.model.softmax_type, window_size, window_attn_skip_freq), as "
                "Megatron-Bridge's gpt_oss_bridge.py sets."]
    if m.qk_norm == "full":
        return [f"{name}'s q/k norms span the whole projection (all heads), while Megatron's qk_layernorm normalises "
                "each head: --qk-layernorm alone does not match the checkpoint; Megatron-Bridge's OLMoE provider "
                "(olmoe_provider.py) swaps in an attention that does."]
    if m.sliding_window and seq_length > m.sliding_window:
        some = (f"; only {m.windowed_layers} of its {m.num_layers} layers do: add --window-attn-skip-freq (a list "
                "marking them, cfg.model.window_attn_skip_freq) too" if m.windowed_layers < m.num_layers else "")
        return [f"{name} attends to the last {m.sliding_window} tokens only (sliding_window) and the sequences here "
                f"are longer: add --window-size {m.sliding_window - 1},0 (cfg.model.window_size){some}."]
    return []


# Megatron-Core's MambaMixer builds its conv1d with d_conv 4 and its SSD scan with chunk_size 128 unless told
# (megatron/core/ssm/mamba_mixer.py; DEFAULT_MAMBA_CHUNK_SIZE in Megatron-Bridge's hybrid_provider.py); no
# pretrain_mamba.py flag sets either.
MAMBA_CONV_KERNEL, MAMBA_CHUNK_SIZE = 4, 128


def _hybrid(m: Architecture) -> tuple[list[Setting], list[str]]:
    """A hybrid (nemotron_h) model's layer pattern and Mamba-2 mixer as Megatron-Core's HybridModel takes them:
    Megatron-Bridge's NemotronHBridge maps config.json's hybrid_override_pattern, mamba_num_heads, mamba_head_dim,
    n_groups, ssm_state_size and chunk_size to hybrid_layer_pattern, mamba_* (nemotron_h_bridge.py CONFIG_MAPPING),
    and sets position_embedding_type 'none' (no rotary embedding); pretrain_mamba.py takes the same as
    --hybrid-layer-pattern (which gives the depth: no --num-layers) and the TransformerConfig's --mamba-* flags
    (Megatron-LM examples/post_training/modelopt/conf/nvidia/Nemotron-H-8B-Base-8K.sh, d98e8a6)."""
    mm = m.mamba
    assert mm is not None and m.layer_pattern is not None
    out = [Setting("position_embedding_type", "none", ("--position-embedding-type", "none")),
           Setting("hybrid_layer_pattern", m.layer_pattern, ("--hybrid-layer-pattern", m.layer_pattern)),
           Setting("mamba_num_heads", mm.num_heads, ("--mamba-num-heads", mm.num_heads)),
           Setting("mamba_head_dim", mm.head_dim, ("--mamba-head-dim", mm.head_dim)),
           Setting("mamba_num_groups", mm.n_groups, ("--mamba-num-groups", mm.n_groups)),
           Setting("mamba_state_dim", mm.state_size, ("--mamba-state-dim", mm.state_size)),
           Setting("mamba_chunk_size", mm.chunk_size, None, default=MAMBA_CHUNK_SIZE)]
    if m.moe is not None and m.moe.latent_size:  # NemotronHBridge maps moe_latent_size as it is
        out.append(Setting("moe_latent_size", m.moe.latent_size, ("--moe-latent-size", m.moe.latent_size)))
    if m.num_mtp_layers and m.mtp_layer_pattern:
        # NemotronHBridge: mtp_hybrid_override_pattern; Megatron-LM's validate_args turns the flag into the unified
        # --hybrid-layer-pattern 'main/MTP' itself
        out.append(Setting("mtp_hybrid_override_pattern", m.mtp_layer_pattern,
                           ("--mtp-hybrid-override-pattern", m.mtp_layer_pattern)))
    notes = [] if mm.conv_kernel == MAMBA_CONV_KERNEL else [
        f"{m.name}'s Mamba-2 conv1d is {mm.conv_kernel} wide, but Megatron-Core's MambaMixer builds d_conv "
        f"{MAMBA_CONV_KERNEL} and no setting changes it: build the mixer with d_conv={mm.conv_kernel}."]
    return out, notes


def linear_attention_freq(pattern: str) -> int | list[int]:
    """Megatron-Core's linear_attention_freq of a Gated DeltaNet hybrid's pattern (two letters per decoder layer): N
    where every N-th decoder layer is full attention and the rest Gated DeltaNet (get_linear_attention_pattern's int
    form), else the per-layer list, 1 linear and 0 full attention."""
    flags = decoder_flags(pattern, 0, "G")
    for n in range(1, len(flags) + 1):
        if flags == [0 if (i + 1) % n == 0 else 1 for i in range(len(flags))]:
            return n
    return flags


def _output_gate(m: Architecture) -> list[Setting]:
    """Gated attention (TransformerConfig.attention_output_gate, --attention-output-gate): Qwen3-Next's, or a launch
    script's GPT model's; the one place render writes it (a GPT model's was dropped without a word). Megatron-Core
    refuses it beside MLA, which the flag reader refuses (knowledge/flag_models.py)."""
    return [Setting("attention_output_gate", True, ("--attention-output-gate", None))] if m.attention_output_gate \
        else []


def pattern_expression(flags: int | list[int]) -> int | str:
    """A per-layer list as the Python list expression Megatron-LM's --linear-attention-freq / --moe-layer-freq take
    (arguments.py la_freq_type / moe_freq_type evaluate a string with '['); an int as it is."""
    return flags if isinstance(flags, int) else "[" + ",".join(map(str, flags)) + "]"


def _gdn_hybrid(m: Architecture) -> tuple[list[Setting], list[str]]:
    """A Gated DeltaNet hybrid (qwen3_next) as Megatron-Core's GPTModel builds it, one TransformerLayer per decoder
    layer (its mixer and its MLP or MoE): experimental_attention_variant gated_delta_net with linear_attention_freq
    (gpt_builders.py: get_transformer_block_with_experimental_attention_variant_spec), the GDN shapes as the
    TransformerConfig's linear_* fields, gated attention (attention_output_gate) with its rotary share. Megatron-
    Bridge's Qwen3NextBridge sets the same fields (qwen3_next_bridge.py provider_bridge) and pretrain_gpt.py takes
    them as flags (Megatron-LM's gpt3_mcore_te_tp2_pp1_gdn test names them); megatron-core 0.19.2 accepts only the
    'gated_delta_net' spelling (d98e8a6 reads it as 'gdn'). The MTP block of this path repeats the last decoder
    layer (gpt_builders.py: decoder_layer_specs[-1]), so a model whose last layer is not full attention gets a note."""
    g, pattern = m.gdn, m.layer_pattern
    assert g is not None and pattern is not None
    out, notes = _rope(m, m.rope) if m.rope is not None else ([], [])
    freq = linear_attention_freq(pattern)
    # pretrain_gpt.py's --experimental-attention-variant is written beside DSA's (megatron.py architecture_flags):
    # the import reads it with the card's read.gated_delta_net, not as a restated field
    out += [Setting("experimental_attention_variant", "gated_delta_net", None, explained=True),
            Setting("linear_attention_freq", freq, ("--linear-attention-freq", pattern_expression(freq))),
            Setting("linear_conv_kernel_dim", g.conv_kernel, ("--linear-conv-kernel-dim", g.conv_kernel)),
            Setting("linear_key_head_dim", g.key_head_dim, ("--linear-key-head-dim", g.key_head_dim)),
            Setting("linear_value_head_dim", g.value_head_dim, ("--linear-value-head-dim", g.value_head_dim)),
            Setting("linear_num_key_heads", g.num_key_heads, ("--linear-num-key-heads", g.num_key_heads)),
            Setting("linear_num_value_heads", g.num_value_heads, ("--linear-num-value-heads", g.num_value_heads))]
    out += _output_gate(m)
    last = pattern[-PATTERN_LAYERS_PER_DECODER_LAYER:]
    if m.num_mtp_layers and m.mtp_layer_pattern and m.mtp_layer_pattern != last:
        notes.append(f"{m.name}'s MTP block is a '{m.mtp_layer_pattern}' layer, but Megatron-Core's GPTModel builds "
                     f"its MTP layer as the last decoder layer, '{last}' (gpt_builders.py): give the MTP layer its "
                     "own spec, or train without MTP.")
    return out, notes


def megatron_architecture(m: Architecture, seq_length: int) -> tuple[list[Setting], list[str], list[str]]:
    """(settings, notes, core notes): the architecture facts as Megatron-Core fields and flags; what neither face
    can express; and what only pretrain_gpt.py lacks (Megatron-Bridge's model bridges set activations and
    layer patterns from the checkpoint)."""
    settings = [Setting("normalization", "RMSNorm" if m.norm_type == "rmsnorm" else "LayerNorm",
                        ("--normalization", "RMSNorm" if m.norm_type == "rmsnorm" else "LayerNorm"))]
    notes: list[str] = []
    if m.norm_eps is not None:
        settings.append(Setting("layernorm_epsilon", m.norm_eps, ("--norm-epsilon", m.norm_eps)))
    else:
        notes.append(f"meshplan does not know {m.name}'s norm epsilon (none in its config as given): Megatron uses "
                     "1e-5 unless told; add --norm-epsilon (cfg.model.layernorm_epsilon) with the model's value.")
    if m.model_type in ZERO_CENTERED_NORM:
        settings.append(Setting("layernorm_zero_centered_gamma", True, ("--apply-layernorm-1p", None)))
    act, core_notes = _activation(m)
    settings += act
    if m.gdn is not None:
        hybrid, hybrid_notes = _gdn_hybrid(m)
        settings += hybrid
        notes += hybrid_notes
    elif m.layer_pattern is not None:
        hybrid, hybrid_notes = _hybrid(m)
        settings += hybrid
        notes += hybrid_notes
    elif m.rope is not None:
        rope, rope_notes = _rope(m, m.rope)
        settings += rope
        notes += rope_notes
    else:
        settings.append(Setting("position_embedding_type", "learned_absolute",
                                ("--position-embedding-type", "learned_absolute")))
    if m.gdn is None:  # a Gated DeltaNet hybrid's is written with its pattern (_gdn_hybrid)
        settings += _output_gate(m)
    if m.qk_norm != "none" or m.mla is not None:  # MLA: q_a_layernorm and kv_a_layernorm (gpt_layer_specs.py)
        settings.append(Setting("qk_layernorm", True, ("--qk-layernorm", None)))
    if m.moe is not None and m.moe.num_groups > 1:
        # n_group / topk_group: Megatron-Core routes unlimited unless told (transformer_config.py, flags from its
        # fields; moe/README.md and examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh pass 8 / 4 for DeepSeek-V3)
        settings += [Setting("moe_router_num_groups", m.moe.num_groups,
                             ("--moe-router-num-groups", m.moe.num_groups)),
                     Setting("moe_router_group_topk", m.moe.group_topk, ("--moe-router-group-topk", m.moe.group_topk))]
    return settings, notes, core_notes + _features(m, seq_length)


def core_flags(settings: list[Setting]) -> tuple[list[Flag], list[str]]:
    """The pretrain_gpt.py flags of the settings, and a note for each field no flag sets that needs a value."""
    flags = [s.flag for s in settings if s.flag is not None]
    unset = [s for s in settings if s.flag is None and s.field and s.value != s.default and not s.explained]
    notes = [f"pretrain_gpt.py has no flag for {', '.join(f'{s.field}={s.value!r}' for s in unset)}: set "
             f"{'it' if len(unset) == 1 else 'them'} on the TransformerConfig (a custom model provider), or render for "
             "Megatron-Bridge, which takes the fields."] if unset else []
    return flags, notes


def restated(key: str) -> bool:
    """Whether a Megatron-Bridge key (model.<field>) restates the model's architecture (FIELDS)."""
    return key.startswith("model.") and key[len("model."):] in FIELDS


def core_restated(key: str) -> bool:
    """Whether a pretrain_gpt.py flag restates the model's architecture (CORE_FLAGS), in either spelling."""
    return key.replace("_", "-") in CORE_FLAGS


def bias_flags(m: Architecture) -> list[Flag]:
    """The linear biases as pretrain_gpt.py flags: --disable-bias-linear drops every one, --add-qkv-bias beside it
    keeps q/k/v's (megatron/training/arguments.py sets add_qkv_bias with add_bias_linear); a model with output or MLP
    biases keeps Megatron's default, all on."""
    if m.o_bias or m.mlp_bias:
        return []
    return [("--disable-bias-linear", None), *([("--add-qkv-bias", None)] if m.qkv_bias else [])]


def core_values(m: Architecture) -> list[tuple[str, Any]]:
    """The model's architecture as the pretrain_gpt.py flags render writes (CORE_FLAGS), a switch as True (as a
    script's switch reads)."""
    flags = core_flags(megatron_architecture(m, 0)[0])[0] + bias_flags(m)
    return [(flag, True if value is None else value) for flag, value in flags]


def bridge_fields(settings: list[Setting]) -> list[tuple[str, Any]]:
    """The settings as Megatron-Bridge cfg.model fields (an activation function has no plain value to assign)."""
    return [(f"model.{s.field}", s.value) for s in settings if s.field]
