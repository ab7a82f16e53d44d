"""Hybrid Mamba-2 models (model_type nemotron_h: Nemotron-H, Nemotron 3): their config.json read as transformers'
NemotronHConfig reads it, their exact parameter counts against the published ones, and the estimates' refusal
until a Mamba-2 layer's memory and time are modelled."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tree_under_test import tree_env

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import catalog_architecture, describe_architecture
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.knowledge.model_counts import layer_params
from meshplan.request.parse import parse_request

# nvidia/Nemotron-H-8B-Base-8K config.json (the first Nemotron-H files name head_dim attention_head_dim)
NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_head_dim": 128, "chunk_size": 128,
    "conv_kernel": 4, "expand": 2, "hidden_act": "relu2", "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", "intermediate_size": 21504,
    "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 128,
    "mamba_proj_bias": False, "max_position_embeddings": 8192, "mlp_bias": False, "mlp_hidden_act": "relu2",
    "model_type": "nemotron_h", "n_groups": 8, "num_attention_heads": 32, "num_hidden_layers": 52,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "ssm_state_size": 128, "tie_word_embeddings": False,
    "use_bias": False, "use_conv_bias": True, "vocab_size": 131072}


def test_nemotron_h_8b_config_reads_its_pattern_and_mamba_shapes():
    arch = architecture_from_config(NEMOTRON_H_8B)
    assert arch.num_layers == 52 and arch.layer_pattern == NEMOTRON_H_8B["hybrid_override_pattern"]
    m = arch.mamba
    assert (m.num_heads, m.head_dim, m.state_size, m.n_groups, m.conv_kernel, m.chunk_size) == (128, 64, 128, 8, 4, 128)
    assert (m.d_inner, m.conv_dim) == (8192, 8192 + 2 * 8 * 128)
    assert arch.head_dim == 128 and arch.norms_per_layer == 1 and not arch.gated_mlp and arch.rope is None
    assert arch.activation == "relu2" and arch.moe is None


def test_a_mamba_layer_counts_what_nemotronh_mamba2_mixer_builds():
    """Worked by hand from NemotronHMamba2Mixer: in_proj 4096 x (8192 z + 10240 xBC + 128 dt), conv1d 10240 x 4 with
    bias, dt_bias, A_log, D (128 each), the gated norm's 8192, out_proj 8192 x 4096; and the block's RMSNorm."""
    arch = architecture_from_config(NEMOTRON_H_8B)
    mixer = 4096 * 18560 + 10240 * 4 + 10240 + 3 * 128 + 8192 + 8192 * 4096
    assert layer_params(arch, 0) == {"attention": 0, "norms": 4096, "dense_mlp": 0, "routed_experts": 0,
                                     "shared_experts": 0, "router": 0, "mamba": mixer}
    assert sum(layer_params(arch, 1).values()) == 2 * 4096 * 21504 + 4096  # '-': up, down (squared ReLU), norm
    assert sum(layer_params(arch, 7).values()) == 4096 * 4096 * 2 + 2 * 4096 * 1024 + 4096  # '*': q, o, k, v, norm


@pytest.mark.parametrize("key, total, active", [
    ("nemotron-h-8b", 8_100_852_736, 8_100_852_736),
    ("nemotron-h-47b", 46_791_554_816, 46_791_554_816),
    ("nemotron-h-56b", 56_324_350_464, 56_324_350_464),
    ("nemotron-3-nano-30b-a3b", 31_577_940_288, 3_580_076_352),
])
def test_catalog_hybrids_count_exactly_and_within_the_published_figures(key, total, active):
    """Nemotron-H paper (arXiv:2504.03624): 8B, 47B, 56B; Nemotron 3 Nano: 31.6B total, 3.2B active (3.6B with
    embeddings)."""
    report = api.describe_model(key)
    assert (report.total_params, report.active_params) == (total, active)
    published = report.published
    assert abs(report.total_params - published["total"]) <= published["total_rounding"]


def test_nemotron_3_nano_layers_and_experts():
    arch = catalog_architecture("nemotron-3-nano-30b-a3b")
    assert [arch.layer_pattern.count(k) for k in "M*-E"] == [23, 6, 0, 23]
    moe = arch.moe
    assert moe.moe_layers == [i for i, k in enumerate(arch.layer_pattern) if k == "E"]
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_hidden_size, moe.shared_expert_ffn_hidden_size) == (
        128, 6, 1856, 3712)
    assert moe.score_correction_bias and not arch.gated_mlp
    assert round(describe_architecture(arch).active_params_excl_input_embedding / 1e8) == 32  # the report's 3.2B


def test_layers_block_type_gives_the_same_model_as_the_pattern():
    """NemotronHConfig keeps the layers as layers_block_type (newer config.json files write that list)."""
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed = {k: v for k, v in NEMOTRON_H_8B.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[c] for c in NEMOTRON_H_8B["hybrid_override_pattern"]]
    assert architecture_from_config(listed) == architecture_from_config(NEMOTRON_H_8B)


@pytest.mark.parametrize("change, words", [
    ({"num_hidden_layers": 50}, "num_hidden_layers = 50 but hybrid_override_pattern has 52"),
    ({"hybrid_override_pattern": "M-M-X" + "M-" * 24 + "M"}, "'X'"),
    ({"n_groups": 3}, "n_groups = 3 does not divide mamba_num_heads = 128"),
    ({"moe_latent_size": 1024}, "latent MoE"),
    ({"hybrid_override_pattern": None}, "must give hybrid_override_pattern"),
])
def test_a_wrong_hybrid_config_is_refused_naming_the_field(change, words):
    with pytest.raises(MeshplanError, match=words.replace("*", r"\*")):
        architecture_from_config({**NEMOTRON_H_8B, **change})


def test_every_face_answers_for_a_hybrid(tmp_path):
    """describe counts it, memory estimates it (tests/test_hybrid_memory.py), throughput times it layer kind by kind
    (tests/test_hybrid_time.py), check and render answer (tests/test_hybrid_render.py), recommend and min-gpus search
    it (tests/test_search_oracle.py), rather than price each Mamba-2 layer as attention and an MLP."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(NEMOTRON_H_8B))
    assert api.describe_model(str(path)).total_params == 8_100_852_736
    for model in (str(path), "nemotron-3-nano-30b-a3b"):
        req = parse_request({"model": model, "gpu": "h100", "num_gpus": 8})
        assert api.estimate_memory(req).stages
        assert api.estimate_throughput(req).step_time_s > 0
        assert api.check_config(req).plan.tp == 1  # every rule ran (tests/test_hybrid_render.py)
        assert "hybrid_layer_pattern" in api.render_config("megatron-bridge", req, force=True).text
    req = parse_request({"model": "nemotron-h-8b", "gpu": "h100", "num_gpus": 8})
    assert api.recommend(req).candidates  # the search's exactness on hybrids: tests/test_search_oracle.py
    least = api.minimum_gpus(parse_request({"model": "nemotron-h-8b", "gpu": "h100"}))
    assert least.num_gpus == 2 and least.candidate is not None  # 1 H100 holds it only with offloads (not searched)


def test_cli_describe_shows_the_layer_pattern():
    out = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "describe", "nemotron-h-8b"],
                         capture_output=True, text=True, env=tree_env(), check=False)
    assert "layer pattern M-M-M-M*-M" in out.stdout and "Mamba-2 128 heads x 64, state 128" in out.stdout


def test_a_gpt_script_of_a_hybrids_shape_is_not_named_the_hybrid():
    """A Megatron-LM GPT script whose flags state Nemotron-H-8B's depth, widths and heads builds 52 attention and MLP
    layers, not the hybrid's pattern: the import builds its model from its flags instead of naming the catalog's
    Nemotron-H (whose estimates would then be refused, or made for the wrong layers)."""
    text = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --num-layers 52 --hidden-size 4096 "
            "--ffn-hidden-size 21504 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
            "--kv-channels 128 --squared-relu --untie-embeddings-and-output-weights --seq-length 8192 "
            "--max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 256 --vocab-size 131072 --bf16 "
            "--position-embedding-type none --normalization RMSNorm --disable-bias-linear\n")
    model = api.import_config(text, path="gpt.sh", framework="megatron-core").request["model"]
    assert model.startswith("megatron-core flags: --num-layers 52")
