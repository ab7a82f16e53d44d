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
                                     "shared_experts": 0, "router": 0, "latent_proj": 0, "mamba": mixer}
    assert sum(layer_params(arch, 1).values()) == 2 * 4096 * 21504 + 4096  # '-': up, down (squared ReLU), norm
    assert sum(layer_params(arch, 7).values()) == 4096 * 4096 * 2 + 2 * 4096 * 1024 + 4096  # '*': q, o, k, v, norm


@pytest.mark.parametrize("key, total, active", [
    ("nemotron-h-8b", 8_100_852_736, 8_100_852_736),
    ("nemotron-h-47b", 46_791_554_816, 46_791_554_816),
    ("nemotron-h-56b", 56_324_350_464, 56_324_350_464),
    ("nemotron-3-nano-30b-a3b", 31_577_940_288, 3_580_076_352),
    ("nemotron-3-super-120b-a12b", 120_668_707_840, 12_770_237_440),
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


def test_nemotron_3_super_counts_megatron_bridges_checkpoint_exactly():
    """Megatron-Bridge's verification card for nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 round-trips 42,683
    tensors of 123,611,033,088 elements: the model and its one MTP block ('*E', enorm, hnorm, eh_proj, final norm).
    The latent MoE worked by hand (Megatron-Core MoELayer): the router 512 x 4096 + its bias, fc1/fc2_latent_proj
    4096 <-> 1024, 512 experts 1024 -> 2688 -> 1024, the shared expert 4096 -> 5376 -> 4096, the layer's norm."""
    report = api.describe_model("nemotron-3-super-120b-a12b")
    assert report.total_params + report.mtp_params == 123_611_033_088
    arch = report.architecture
    assert arch.moe.latent_size == 1024 and (arch.num_mtp_layers, arch.mtp_layer_pattern) == (1, "*E")
    e_layer = arch.layer_pattern.index("E")
    moe = 512 * 4096 + 512 + 2 * 4096 * 1024 + 512 * 2 * 1024 * 2688 + 2 * 4096 * 5376
    assert sum(layer_params(arch, e_layer).values()) == moe + 4096
    assert round(report.active_params_excl_input_embedding / 1e9) == 12  # the published A12B


def test_a_latent_moe_dispatches_and_runs_its_experts_at_the_latent_width():
    """Megatron-Core MoELayer.preprocess projects the hidden state down (fc1_latent_proj) before the dispatcher and
    postprocess projects the combined tokens back up: the experts' GEMMs read 1024 channels, the projections run on
    every routed token, and Megatron-LM's moe_layer_flops counts 4 L f top-k + 4 h L + 4 h f_shared."""
    from meshplan.arithmetic.flops import Shard, hybrid_flops_per_token, moe_gemms

    arch = catalog_architecture("nemotron-3-super-120b-a12b")
    gemms = {g.name: g for g in moe_gemms(arch, Shard(tokens=8192, tp=1, ep=8, etp=1, sp=False))}
    assert (gemms["latent_down"].n, gemms["latent_down"].k) == (1024, 4096)
    assert (gemms["latent_up"].n, gemms["latent_up"].k) == (4096, 1024)
    assert gemms["expert_fc1"].k == 1024 and gemms["expert_fc2"].n == 1024
    assert gemms["shared_expert_fc1"].k == 4096
    plain = arch.model_copy(update={"moe": arch.moe.model_copy(update={"latent_size": None}), "num_mtp_layers": 0})
    h, lat, e = 4096, 1024, 2688
    assert hybrid_flops_per_token(arch, 8192) - hybrid_flops_per_token(plain, 8192) == 3 * 40 * (
        4 * lat * e * 22 + 4 * h * lat - 4 * h * e * 22)
    # each MTP depth: its block's layers once (get_hybrid_layer_counts) and its logits
    moe = 4 * lat * e * 22 + 4 * h * lat + 4 * h * 5376
    attention = 4 * h * h * (1 + 2 / 32) + 2 * 8192 * h
    assert hybrid_flops_per_token(arch, 8192, 2) - hybrid_flops_per_token(arch, 8192) == 3 * 2 * (
        moe + attention + 2 * h * 131072)


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
    ({"num_nextn_predict_layers": 1}, "needs mtp_hybrid_override_pattern"),
    ({"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E"}, "'E', a layer kind"),
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


def test_a_hybrid_rank_without_the_mtp_block_does_not_hold_its_share_of_the_work():
    """The references a pipeline bound divides by pp train the MTP block too (stage_time.layer_kinds appends its
    '*E' on the stage that holds it): a head rank holding half of each kind of the main pattern and not the MTP block
    holds less than half of the attention and MoE layers trained, so it is not taken for 1/pp of the work (which
    would let the bound exceed the estimate)."""
    from meshplan.search.rank_chains import holds_its_share, hybrid_rank_load, model_layers, trained_pattern

    arch = catalog_architecture("nemotron-3-super-120b-a12b")
    assert trained_pattern(arch).count("*") == 9 and model_layers(arch) == (90, 41)
    half = [k for k in "M*E" for _ in range(arch.layer_pattern.count(k) // 2)]
    assert not holds_its_share(hybrid_rank_load(arch, arch.layer_pattern, half, head=1), arch, pp=2)
    assert holds_its_share(hybrid_rank_load(arch, arch.layer_pattern, [*half, "*", "E"], head=1), arch, pp=2)


def test_a_latent_moe_layer_keeps_and_sends_latent_wide_tokens():
    """Megatron-Core's latent MoE dispatches fc1_latent_proj's output: the experts' fc1 input (each routed copy) is
    latent-wide, fc2_latent_proj keeps its latent-wide input (the combined tokens), and the dispatcher's bytes are
    latent-wide; the layer input the router and the shared expert read stays hidden-wide."""
    from meshplan.arithmetic.activations import Layout, shape_of
    from meshplan.arithmetic.mamba import hybrid_layer_activations

    arch = catalog_architecture("nemotron-3-super-120b-a12b")
    plain = arch.model_copy(update={"moe": arch.moe.model_copy(update={"latent_size": None})})
    t = 4096
    lay = Layout(tokens=t, seq_kv=t, tp=1, sp=False, etp=1, flash=True, dropout=False, swiglu_unfused=False,
                 fp8=False)
    latent, full = (hybrid_layer_activations(shape_of(a), lay, "E", "none")["moe"] for a in (arch, plain))
    assert full - latent == 2 * t * 22 * (4096 - 1024) - 2 * t * 1024  # routed copies narrower; fc2_latent_proj input
