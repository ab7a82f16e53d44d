"""Gated DeltaNet hybrids (model_type qwen3_next: Qwen3-Next): their config.json read as transformers' Qwen3NextConfig
reads it, written as Megatron-Core's hybrid pattern (G Gated DeltaNet, * attention, E MoE, - MLP), their exact
parameter counts against transformers' own model and the published ones, and what a GDN layer saves, costs and
which frameworks run it."""

from __future__ import annotations

import json

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import published_mismatches
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.knowledge.model_counts import gdn_params, layer_params

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json (its fields; transformers_version 4.57.0.dev0)
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "decoder_sparse_step": 1, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512,
    "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000000, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936}


def test_qwen3_next_reads_as_megatron_cores_hybrid_pattern():
    """Qwen3NextConfig.layer_types: every 4th decoder layer full attention; each decoder layer its mixer then its
    sparse MoE block (decoder_sparse_step 1, no mlp_only_layers)."""
    arch = architecture_from_config(QWEN3_NEXT_80B)
    assert arch.layer_pattern == "GEGEGE*E" * 12 and arch.num_layers == 96
    g = arch.gdn
    assert (g.num_key_heads, g.num_value_heads, g.key_head_dim, g.value_head_dim, g.conv_kernel, g.chunk_size) == \
        (16, 32, 128, 128, 4, 64)
    assert (g.key_dim, g.value_dim, g.conv_dim, g.in_proj_width) == (2048, 4096, 8192, 12352)
    assert arch.attention_output_gate and arch.qk_norm == "head" and arch.norms_per_layer == 1
    assert arch.rope is not None and arch.rope.fraction == 0.25 and arch.mamba is None
    assert arch.moe.moe_layers == list(range(1, 96, 2)) and arch.moe.shared_expert_gate


def test_layer_types_and_mlp_only_layers_follow_qwen3nextconfig():
    cfg = {**QWEN3_NEXT_80B, "num_hidden_layers": 4, "mlp_only_layers": [1],
           "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]}
    assert architecture_from_config(cfg).layer_pattern == "*EG-GE*E"


def test_a_gdn_layer_counts_what_qwen3nextgateddeltanet_builds():
    """Worked by hand from Qwen3NextGatedDeltaNet: in_proj_qkvz 2048 x (2 x 2048 + 2 x 4096), in_proj_ba 2048 x 64,
    conv1d 8192 x 4 (no bias), dt_bias and A_log 32 each, the gated norm over one value head (128), out_proj
    4096 x 2048; and the layer's input RMSNorm. The gated attention's q_proj is 2048 x 16 x 256 x 2."""
    arch = architecture_from_config(QWEN3_NEXT_80B)
    mixer = 2048 * 12288 + 2048 * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * 2048
    assert gdn_params(arch) == mixer
    assert layer_params(arch, 0) == {"attention": 0, "norms": 2048, "dense_mlp": 0, "routed_experts": 0,
                                     "shared_experts": 0, "router": 0, "latent_proj": 0, "gdn": mixer}
    q, kv, o, qk_norms = 2048 * 8192, 2 * 2048 * 512, 4096 * 2048, 2 * 256
    assert layer_params(arch, 6)["attention"] == q + kv + o + qk_norms


def test_qwen3_next_80b_counts_transformers_model_exactly_and_the_published_figures():
    """79,674,391,296: sum(p.numel()) of Qwen3NextForCausalLM built by transformers 5.9.0 from this config.json on
    the meta device. Published (Qwen/Qwen3-Next-80B-A3B-Instruct model card): 80B total, 79B non-embedding, 3B
    activated (the non-embedding active count, 3.253B)."""
    report = api.describe_model("qwen3-next-80b-a3b")
    assert report.total_params == 79_674_391_296
    assert report.active_params == 3_874_929_408
    assert report.active_params_non_embedding == 3_252_599_552
    assert report.non_embedding_params == 79_052_061_440
    assert published_mismatches(report) == []
    assert architecture_from_config(QWEN3_NEXT_80B).model_dump(exclude={"key", "name", "hf_id", "origin"}) == \
        report.architecture.model_dump(exclude={"key", "name", "hf_id", "origin"})


@pytest.mark.parametrize("change, words", [
    ({"linear_num_value_heads": 24}, "multiple of linear_num_key_heads"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 48"),
])
def test_a_wrong_gdn_config_is_refused_naming_the_field(change, words):
    with pytest.raises(MeshplanError, match=words):
        architecture_from_config({**QWEN3_NEXT_80B, **change})


def test_describe_reads_a_qwen3_next_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_NEXT_80B))
    assert api.describe_model(str(path)).total_params == 79_674_391_296
