"""Model types read from real Hugging Face config.json files (keys copied from a published checkpoint), each counted
against the total (and for MoE the active count) its publisher states, and run through describe, memory and
recommend so a new family is usable end to end, not only countable."""

import json

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import describe_architecture
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.request.parse import parse_request

# Qwen/Qwen1.5-MoE-A2.7B config.json
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
}

# Qwen/Qwen2-57B-A14B config.json
QWEN2_57B_A14B = {
    **QWEN15_MOE_A27B, "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "sliding_window": 131072, "moe_intermediate_size": 2560, "shared_expert_intermediate_size": 20480,
    "num_experts_per_tok": 8, "num_experts": 64, "transformers_version": "4.40.1",
}


def _runs_end_to_end(config: dict, tmp_path) -> None:
    """describe, memory (8 GPUs, TP 2) and recommend (8 GPUs) through the api, as the CLI calls them."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert api.describe_model(str(path)).total_params > 0
    assert api.estimate_memory(parse_request({"model": str(path), "gpu": "h100", "num_gpus": 8, "tp": 2}))
    assert api.recommend(parse_request({"model": str(path), "gpu": "h100", "num_gpus": 8}), top_k=1)


def _counts(config: dict) -> tuple[int, int]:
    report = describe_architecture(architecture_from_config(config))
    return report.total_params, report.active_params


def test_qwen2_moe_qwen15_moe_a27b_counts(tmp_path):
    """Qwen1.5-MoE-A2.7B model card / Qwen blog: 14.3B in total, 2.7B activated (60 routed experts, top-4, and a
    shared expert 4 x 1408 wide with its own sigmoid gate)."""
    total, active = _counts(QWEN15_MOE_A27B)
    assert total == 14_315_784_192 and round(total / 1e9, 1) == 14.3
    assert active == 2_689_173_504 and round(active / 1e9, 1) == 2.7
    _runs_end_to_end(QWEN15_MOE_A27B, tmp_path)


def test_qwen2_moe_qwen2_57b_a14b_counts():
    """Qwen2 technical report (arXiv 2407.10671, Table 1): 57B total, 14B activated; the hub lists 57.4B."""
    total, active = _counts(QWEN2_57B_A14B)
    assert round(total / 1e9, 1) == 57.4
    assert round(active / 1e9) == 14


def test_qwen2_moe_shared_expert_gate_and_qkv_bias_are_counted():
    """The shared expert's gate is hidden x 1 per MoE layer and q/k/v carry biases (Qwen2MoeAttention,
    bias=config.qkv_bias, default true); qkv_bias false removes exactly those biases."""
    arch = architecture_from_config(QWEN15_MOE_A27B)
    assert arch.moe.shared_expert_gate and arch.moe.num_shared_experts == 1 and arch.qkv_bias and not arch.o_bias
    assert arch.moe.shared_expert_ffn_hidden_size == 5632 and arch.sliding_window is None
    no_bias = architecture_from_config({**QWEN15_MOE_A27B, "qkv_bias": False})
    total, _ = _counts(QWEN15_MOE_A27B)
    assert total - describe_architecture(no_bias).total_params == 24 * 3 * 2048


def test_qwen2_moe_sliding_window_pattern():
    """Qwen2MoeConfig with use_sliding_window windows the even-indexed layers below max_window_layers ((i + 1) % 2
    and i < 21 of 24: layers 0, 2, ..., 20, eleven); a layer_types list, where given, wins."""
    arch = architecture_from_config({**QWEN15_MOE_A27B, "use_sliding_window": True})
    assert arch.sliding_window == 32768 and arch.windowed_layers == 11
    listed = ["sliding_attention"] * 3 + ["full_attention"] * 21
    assert architecture_from_config({**QWEN15_MOE_A27B, "use_sliding_window": True,
                                     "layer_types": listed}).windowed_layers == 3


# microsoft/Phi-3-mini-4k-instruct config.json (auto_map left out)
PHI3_MINI_4K = {
    "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True, "attention_bias": False,
    "vocab_size": 32064,
}

# microsoft/phi-4 config.json
PHI4 = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 100257,
    "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 17920, "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
    "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
    "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 250000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.47.0",
    "use_cache": True, "vocab_size": 100352,
}


def test_phi3_mini_counts(tmp_path):
    """Phi-3 technical report (arXiv 2404.14219): phi-3-mini has 3.8B parameters; the hub lists 3.82B. qkv_proj and
    gate_up_proj are fused (Phi3Attention, Phi3MLP) but hold llama's counts."""
    total, active = _counts(PHI3_MINI_4K)
    assert total == active == 3_821_079_552
    arch = architecture_from_config(PHI3_MINI_4K)
    assert arch.sliding_window == 2047 and arch.gated_mlp and not arch.tie_word_embeddings
    _runs_end_to_end(PHI3_MINI_4K, tmp_path)


def test_phi3_phi4_counts():
    """Phi-4 technical report (arXiv 2412.08905): a 14-billion parameter model; the hub lists 14.7B."""
    total, _ = _counts(PHI4)
    assert total == 14_659_507_200 and round(total / 1e9, 1) == 14.7


def test_phi3_has_no_biases_and_su_rope_is_longrope():
    """Phi3Attention and Phi3MLP build every linear with bias=False whatever the config says, and Phi3Config reads
    the old rope types 'su' and 'yarn' as longrope."""
    assert _counts({**PHI4, "attention_bias": True, "mlp_bias": True}) == _counts(PHI4)
    arch = architecture_from_config({**PHI3_MINI_4K, "rope_scaling": {"type": "su", "short_factor": [1.0] * 48,
                                                                       "long_factor": [1.0] * 48}})
    assert arch.rope.scaling == "longrope"


# google/gemma-3-1b-pt config.json (text only, model_type gemma3_text)
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
    "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
    "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144,
}

# google/gemma-3-27b-pt config.json (multimodal, model_type gemma3): the text_config gives only what differs from
# Gemma3TextConfig's defaults (vocab_size 262208, gelu_pytorch_tanh, 5:1 window pattern, tied embeddings)
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


def test_gemma3_text_1b_counts(tmp_path):
    """Gemma 3 technical report (arXiv 2503.19786, Table 1): the 1B model has 302M embedding and 698M non-embedding
    parameters (tied embeddings, q/k norms over head_dim 256, 4 norms per layer)."""
    report = describe_architecture(architecture_from_config(GEMMA3_1B))
    assert report.total_params == report.active_params == 999_885_952
    assert round(report.non_embedding_params / 1e6) == 698
    assert round((report.total_params - report.non_embedding_params) / 1e6) == 302
    arch = report.architecture
    assert arch.qk_norm == "head" and arch.norms_per_layer == 4 and arch.tie_word_embeddings
    assert arch.activation == "gelu_pytorch_tanh" and arch.sliding_window == 512
    _runs_end_to_end(GEMMA3_1B, tmp_path)


def test_gemma3_multimodal_27b_reads_its_text_model(tmp_path):
    """Gemma 3 report Table 1: the 27B text model has 25,600M non-embedding parameters (its 1,416M embedding row
    also holds the 1152 x 5376 image projector, and the 417M vision encoder is apart: meshplan plans the text
    decoder, as it does Llama 4's). Keys the text_config omits take Gemma3TextConfig's defaults."""
    arch = architecture_from_config(GEMMA3_27B)
    assert arch.model_type == "gemma3_text" and arch.vocab_size == 262_208 and arch.tie_word_embeddings
    assert arch.activation == "gelu_pytorch_tanh" and arch.norm_eps == 1e-6 and arch.rope.theta == 1e6
    report = describe_architecture(arch)
    assert report.non_embedding_params == 25_599_716_096 and round(report.non_embedding_params / 1e6) == 25_600
    assert report.total_params == 25_599_716_096 + 262_208 * 5376
    _runs_end_to_end(GEMMA3_27B, tmp_path)


def test_gemma3_window_pattern():
    """A window is kept while any layer slides (sliding_window_pattern, or layer_types where given); all-global
    layers have none; a layer kind meshplan does not know is refused."""
    assert architecture_from_config({**GEMMA3_1B, "sliding_window_pattern": 1}).sliding_window is None
    every_global = {**GEMMA3_1B, "layer_types": ["full_attention"] * 26}
    assert architecture_from_config(every_global).sliding_window is None
    mixed = {**GEMMA3_1B, "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 20}
    assert architecture_from_config(mixed).sliding_window == 512
    assert architecture_from_config(mixed).windowed_layers == 25
    assert architecture_from_config(GEMMA3_1B).windowed_layers == 26 - 4  # layers 5, 11, 17, 23 global
    with pytest.raises(MeshplanError, match="layer_types"):
        architecture_from_config({**GEMMA3_1B, "layer_types": ["linear_attention"] * 26})


def test_gemma3_megatron_notes_name_the_pattern_not_one_window():
    """Gemma 3's (1 + w) RMSNorm is Megatron's zero-centred gamma, and its core notes send it to Megatron-Bridge's
    gemma3 bridge; a single --window-size on every layer would be wrong for its global layers."""
    from meshplan.adapters.architecture import megatron_architecture

    settings, _, core_notes = megatron_architecture(architecture_from_config(GEMMA3_1B), 4096)
    assert any(s.field == "layernorm_zero_centered_gamma" for s in settings)
    assert any("gemma3_bridge.py" in note for note in core_notes)
    assert not any("--window-size" in note for note in core_notes)


# MiniMaxAI/MiniMax-M2 config.json (auto_map and quantization_config left out; attn_type_list is 62 ones)
MINIMAX_M2 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1] * 62, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 1536, "max_position_embeddings": 196608, "model_type": "minimax_m2",
    "mtp_transformer_layers": 1, "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62,
    "num_key_value_heads": 8, "num_local_experts": 256, "num_mtp_modules": 3, "qk_norm_type": "per_layer",
    "rms_norm_eps": 1e-06, "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid",
    "shared_intermediate_size": 0, "tie_word_embeddings": False, "use_mtp": True, "use_qk_norm": True,
    "use_routing_bias": True, "vocab_size": 200064,
}


def test_minimax_m2_counts(tmp_path):
    """MiniMax-M2 model card: 230B total parameters, 10B active (its active figure leaves out the embedding and
    the output head; the hub lists 229B). Top-8 of 256 experts in every layer, q/k norms over all heads
    (MiniMaxM2Attention), a per-expert routing bias (e_score_correction_bias), half the head dims rotary."""
    report = describe_architecture(architecture_from_config(MINIMAX_M2))
    assert report.total_params == 228_689_764_864 and round(report.total_params / 1e10) == 23
    assert round(report.active_params_non_embedding / 1e9) == 10
    arch = report.architecture
    assert arch.qk_norm == "full" and arch.moe.score_correction_bias and arch.rope.fraction == 0.5
    _runs_end_to_end(MINIMAX_M2, tmp_path)


@pytest.mark.parametrize("config, kind", [
    ({**MINIMAX_M2, "attn_type_list": [0] * 7 + [1]}, "lightning"),
    ({"model_type": "falcon_h1"}, "Mamba-2"),
    ({"model_type": "jamba"}, "Mamba"),
    ({"model_type": "kimi_linear"}, "Kimi Delta Attention"),
])
def test_hybrid_layer_families_are_refused_naming_the_layer_kind(config, kind):
    with pytest.raises(MeshplanError, match=kind):
        architecture_from_config(config)


# THUDM/GLM-4-9B-0414 config.json
GLM4_9B = {
    "architectures": ["Glm4ForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 13696, "max_position_embeddings": 32768, "model_type": "glm4",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.52.0.dev0", "use_cache": True, "vocab_size": 151552,
}


def test_glm4_9b_counts(tmp_path):
    """GLM-4-9B-0414: the hub lists 9.4B parameters (the name says 9B). Four norms per layer (the post-attention
    and post-MLP norms), q/k/v biases but none on o_proj (GlmAttention), fused gate_up_proj of llama's count."""
    report = describe_architecture(architecture_from_config(GLM4_9B))
    assert report.total_params == 9_400_279_040 and round(report.total_params / 1e8) == 94
    arch = report.architecture
    assert arch.norms_per_layer == 4 and arch.qkv_bias and not arch.o_bias and arch.rope.fraction == 0.5
    _runs_end_to_end(GLM4_9B, tmp_path)


def test_glm4_defaults_and_megatron_note():
    """Glm4Config sets partial_rotary_factor 0.5 and attention_bias true when config.json omits them; the
    Megatron notes name the post-norms pretrain_gpt.py's layer lacks."""
    from meshplan.adapters.architecture import megatron_architecture

    bare = {k: v for k, v in GLM4_9B.items() if k not in ("partial_rotary_factor", "attention_bias")}
    arch = architecture_from_config(bare)
    assert arch.rope.fraction == 0.5 and arch.qkv_bias
    assert any("post_mlp_layernorm" in note for note in megatron_architecture(arch, 4096)[2])


def test_a_qwen2_window_beside_use_sliding_window_false_is_no_window():
    """Qwen2.5-7B-Instruct's config.json states sliding_window 131072 beside use_sliding_window false, which
    have. With use_sliding_window true Qwen2Config and Qwen3Config window the layers from max_window_layers on:
    none of 28 at 28, the last 8 at 20."""
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
           "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
           "max_position_embeddings": 32768, "max_window_layers": 28, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064}
    assert architecture_from_config(cfg).sliding_window is None
    assert architecture_from_config({**cfg, "model_type": "qwen3", "head_dim": 128}).sliding_window is None
    assert architecture_from_config({**cfg, "use_sliding_window": True}).sliding_window is None
    late = architecture_from_config({**cfg, "use_sliding_window": True, "max_window_layers": 20})
    assert late.sliding_window == 131072 and late.windowed_layers == 8
    qwen3 = architecture_from_config({**cfg, "model_type": "qwen3", "head_dim": 128, "use_sliding_window": True,
                                      "max_window_layers": 20})
    assert qwen3.windowed_layers == 8
