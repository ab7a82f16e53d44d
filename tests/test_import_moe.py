"""A Megatron-style launch script of an MoE or MLA model is read as that model, never as the dense model of the same
width and depth (meshplan/adapters/read/model_match.py): every architecture field the script states, or leaves to
the framework's default, is compared with each catalog model; where none matches, the fields that differ are named
and the model is left for the user to pass. The fixtures are upstream files (tests/configs/SOURCES.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read import import_config, import_file
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.flag_models import moe_pattern as _pattern
from meshplan.knowledge.model_counts import total_params

CONFIGS = Path(__file__).parent / "configs"


@pytest.mark.parametrize(("name", "model", "ep"), [
    ("megatron_mixtral_8x7b.sh", "mixtral-8x7b", 8),  # was llama-3-8b: the same 32 x 4096 x 14336 shape
    ("megatron_qwen3_30b_a3b_excerpt.sh", "qwen3-30b-a3b", 2),
    ("megatron_deepseek_v3_excerpt.sh", "deepseek-v3", 8),  # MLA, shared expert, [0]*3+[1]*58 MoE layers, groups
])
def test_moe_scripts_import_as_their_model(name, model, ep, capsys):
    imported = import_file(str(CONFIGS / name))
    assert imported.request["model"] == model and imported.request["ep"] == ep
    assert "--num-experts" in imported.sources["model"]
    assert not any(" --num-experts " in u or " --moe-router-topk " in u for u in imported.unsupported)
    assert cli.main(["import", str(CONFIGS / name)]) == 0
    assert f"model = {model}" in capsys.readouterr().out


def test_mcp_config_text_reads_the_moe_model():
    from meshplan.faces.mcp import tools

    text = (CONFIGS / "megatron_mixtral_8x7b.sh").read_text()
    args = {"config_text": text, "num_gpus": 32}  # as strict_arguments passes them: the arguments sent alone
    request = tools.to_request(args)
    assert request.model == "mixtral-8x7b" and request.ep == 8 and request.pp == 4


def test_dense_scripts_keep_their_dense_model():
    for name, model in (("megatron_llama3_8b_h100_fp8.sh", "llama-3-8b"), ("megatron_gpt3_175b.sh", "gpt3-175b"),
                        ("mds_bloom_176b.slurm", "bloom-176b")):
        assert import_file(str(CONFIGS / name)).request["model"] == model


def test_moe_flags_that_match_no_catalog_model_name_the_differences():
    """Megatron-DeepSpeed's GPT-3 1.3B with 128 experts on every second layer: no catalog model; the expert
    parallel size is still read, and estimating from the file is a clear error, not a dense model."""
    path = str(CONFIGS / "mds_gpt_1.3b_moe128.sh")
    imported = import_file(path)
    assert "model" not in imported.request and imported.request["ep"] == 64
    line = next(u for u in imported.unresolved if u.startswith("model:"))
    assert "MoE architecture" in line and "--num-experts 128" in line and "MoE layers 1,3,...,23" in line
    with pytest.raises(MeshplanError, match=r"the file's model is not read.*--num-experts 128"):
        api.request_from_config(imported, {"num_gpus": 64})
    assert api.request_from_config(imported, {"num_gpus": 64, "model": "olmoe-1b-7b"}).model == "olmoe-1b-7b"


def test_per_layer_expert_counts_are_refused_by_name():
    """PR-MoE's --num-experts 64 ... 128 128 (one count per MoE layer) is no model meshplan builds."""
    imported = import_file(str(CONFIGS / "mds_gpt_1.3b_pr_moe.sh"))
    assert "model" not in imported.request
    assert any("64 64" in u and "expert count per MoE layer" in u for u in imported.unresolved)


MIXTRAL = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
           "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --swiglu "
           "--untie-embeddings-and-output-weights --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 "
           "--expert-model-parallel-size 8{extra}\n")


@pytest.mark.parametrize(("extra", "differs"), [
    (" --num-experts 16", "--num-experts 16 (mixtral-8x7b: 8)"),
    (" --num-experts 8 --moe-router-topk 4", "--moe-router-topk 4 (mixtral-8x7b: 2)"),
    (" --num-experts 8 --moe-ffn-hidden-size 2048", "--moe-ffn-hidden-size 2048 (mixtral-8x7b: 14336)"),
    (" --num-experts 8 --moe-layer-freq 2", "MoE layers 0,2,...,30) (mixtral-8x7b: MoE layers 0-31)"),
    (" --num-experts 8 --kv-channels 64", "--kv-channels 64 (mixtral-8x7b: 128)"),
    (" --num-experts 8 --multi-latent-attention", "--multi-latent-attention (mixtral-8x7b: off)"),
])
def test_each_stated_moe_field_is_compared(extra, differs):
    imported = import_config(MIXTRAL.format(extra=extra), "run.sh")
    assert "model" not in imported.request
    assert differs in next(u for u in imported.unresolved if u.startswith("model:"))


def test_absent_flags_are_megatron_defaults():
    """Without --num-experts Megatron-LM builds a dense MLP (llama, not Mixtral); without --swiglu a GeLU MLP,
    which no Llama is."""
    assert import_config(MIXTRAL.format(extra=""), "run.sh").request["model"] in ("llama-3-8b", "llama-3.1-8b",
                                                                                  "mistral-7b")
    plain = import_config(MIXTRAL.format(extra="").replace(" --swiglu", ""), "run.sh")
    assert "model" not in plain.request
    assert any("--swiglu not given (" in u for u in plain.unresolved)


def test_moe_layer_pattern_is_read_not_run():
    assert _pattern("[0]*3+[1]*58") == [0] * 3 + [1] * 58
    assert _pattern("([1]*3+[0]*2)*2") == [1, 1, 1, 0, 0] * 2
    for bad in ("__import__('os')", "[0]*3+[1]*", "[1.5]*2", "[0]*(1<<40)"):
        with pytest.raises((ValueError, SyntaxError)):
            _pattern(bad)
    imported = import_config(MIXTRAL.format(extra=" --num-experts 8 --moe-layer-freq [0]*3+[1]*2"), "run.sh")
    assert any("--moe-layer-freq" in u and "5 entries for 32 layers" in u for u in imported.unresolved)


def test_query_groups_need_group_query_attention():
    """Megatron-LM passes --num-query-groups only with --group-query-attention (argument_utils.py): without it the
    model has one KV head per query head, which Mixtral does not."""
    imported = import_config(MIXTRAL.format(extra=" --num-experts 8").replace(" --group-query-attention", ""), "run.sh")
    assert "model" not in imported.request
    line = next(u for u in imported.unresolved if u.startswith("model:"))
    assert "--num-query-groups 8 without --group-query-attention: 32 (mixtral-8x7b: 8)" in line
    assert any("ignored without --group-query-attention" in n for n in imported.notes)


def test_an_unset_expert_count_reads_no_model():
    """`--num-experts $E` with E unset: the script is an MoE script of unknown size, never its dense namesake."""
    imported = import_config(MIXTRAL.format(extra=" --num-experts $E --moe-router-topk 2"), "run.sh")
    assert "model" not in imported.request
    assert any(u.startswith("model: --num-experts") for u in imported.unresolved)


def test_mcp_config_text_of_an_unmatched_moe_script_is_a_clear_error():
    from meshplan.faces.mcp import tools

    text = (CONFIGS / "mds_gpt_1.3b_moe128.sh").read_text()
    args = {"config_text": text, "num_gpus": 64}  # as strict_arguments passes them: the arguments sent alone
    with pytest.raises(MeshplanError, match="no catalog model has this MoE architecture"):
        tools.to_request(args)


def test_kempnerforge_experts_are_read():
    """KempnerForge's [model] num_experts (0 = dense, kempnerforge/config/model.py): the 7B file with 8 experts is
    no longer llama-3-8b."""
    text = (CONFIGS / "kempnerforge_7b_16gpu_fp8.toml").read_text()
    assert import_config(text, "7b.toml").request["model"] == "llama-3-8b"
    moe = import_config(text.replace("[model]\n", "[model]\nnum_experts = 8\nmoe_top_k = 2\n"), "7b_moe.toml")
    # Mixtral's shape but for the vocabulary: no catalog model, so built as KempnerForge builds it (never the dense
    # model the file was before): Mixtral's count plus the 96,256 extra rows of the embedding and the output layer
    name = moe.request["model"]
    assert name.startswith("kempnerforge model section: ") and "num_experts=8" in name
    built, mixtral = resolve_model(name), resolve_model("mixtral-8x7b")
    assert built.moe.num_experts == 8 and built.moe.top_k == 2 and built.moe.moe_layers == list(range(32))
    assert total_params(built) == total_params(mixtral) + 2 * (128256 - 32000) * 4096
    assert not any("num_experts" in u for u in moe.unsupported)


KF_MOE = """[model]
dim = 4096
n_layers = 32
n_heads = 32
n_kv_heads = 8
vocab_size = 32000
ffn_hidden_dim = 14336
num_experts = 8
moe_top_k = 2
[train]
batch_size = 1
seq_len = 4096
[distributed]
dp_shard = 4
tp = 2
"""


def test_kempnerforge_moe_file_defaults_sequence_parallel_off():
    """KempnerForge turns sequence parallelism off for MoE models (card defaults.sequence_parallel_off_for): an MoE
    file with tp 2 says so among the framework's defaults, a dense one of the same width keeps it on; a file whose
    model meshplan cannot name leaves it to the model the request gives."""
    moe = import_config(KF_MOE, "moe.toml", framework="kempnerforge")
    assert moe.request["model"] == "mixtral-8x7b" and moe.defaults["sequence_parallel"] is False
    dense = import_config(KF_MOE.replace("num_experts = 8\nmoe_top_k = 2\n", "").replace("32000", "128256"),
                          "dense.toml", framework="kempnerforge")
    assert dense.request["model"] == "llama-3-8b" and dense.defaults["sequence_parallel"] is True
    six = import_config(KF_MOE.replace("num_experts = 8", "num_experts = 6"), "x.toml", framework="kempnerforge")
    assert "num_experts=6" in six.request["model"] and six.defaults["sequence_parallel"] is False  # built: MoE
    unknown = import_config(KF_MOE.replace("num_experts = 8", 'num_experts = 8\nmodel_type = "mot"'), "x.toml",
                            framework="kempnerforge")  # a registry builder meshplan does not count
    assert "model" not in unknown.request and "sequence_parallel" not in unknown.defaults
    assert any("model_type = 'mot'" in u.said for u in unknown.left_to_request)
    assert any(n.startswith("sequence_parallel: the framework's default depends on the model") for n in unknown.notes)
    req = api.request_from_config(unknown, {"model": "mixtral-8x7b", "num_gpus": 8})
    assert api.estimate_memory(req).plan.sequence_parallel is False


BRIDGE = "python scripts/training/run_recipe.py --recipe qwen3_30b_a3b_pretrain_config{extra}\n"


def test_bridge_recipe_model_under_architecture_overrides():
    """run_recipe.py's model.* overrides change the recipe's model: the recipe's model stands only where every
    override states what it has; otherwise the file's model is not read, the changed fields named."""
    assert import_config(BRIDGE.format(extra=""), "run.sh").request["model"] == "qwen3-30b-a3b"
    same = import_config(BRIDGE.format(extra=" model.num_moe_experts=128 model.moe_router_topk=8"), "run.sh")
    assert same.request["model"] == "qwen3-30b-a3b" and not same.unsupported
    changed = import_config(BRIDGE.format(extra=" model.num_moe_experts=64 model.tensor_model_parallel_size=2"),
                            "run.sh")
    assert "model" not in changed.request and changed.request["tp"] == 2
    line = next(u for u in changed.unresolved if u.startswith("model:"))
    assert "nearest: qwen3-30b-a3b differs in model.num_moe_experts=64 (qwen3-30b-a3b: 128);" in line
    with pytest.raises(MeshplanError, match=r"model\.num_moe_experts=64"):
        api.request_from_config(changed, {"num_gpus": 8})


def test_group_query_attention_without_groups_is_one_group():
    """--group-query-attention alone: Megatron-LM's --num-query-groups defaults to 1 (one KV head)."""
    imported = import_config(MIXTRAL.format(extra=" --num-experts 8").replace(" --num-query-groups 8", ""), "run.sh")
    assert "model" not in imported.request
    assert "--group-query-attention without --num-query-groups: 1 (mixtral-8x7b: 8)" in next(
        u for u in imported.unresolved if u.startswith("model:"))


def test_bridge_recipe_module_architecture_assignments(tmp_path):
    """A recipe module's cfg.model.* architecture assignments apply to the model it builds from, as run_recipe.py's
    overrides do: a Mixtral recipe with 16 experts is not mixtral-8x7b."""
    text = ("def mixtral_8x7b_pretrain_8gpu_h100_bf16_config() -> ConfigContainer:\n    cfg = ConfigContainer()\n"
            "    cfg.model = AutoBridge.from_hf_pretrained('mistralai/Mixtral-8x7B-v0.1').to_megatron_provider()\n"
            "    cfg.model.num_moe_experts = {experts}\n    cfg.model.expert_model_parallel_size = 8\n    return cfg\n")
    path = tmp_path / "recipes.py"
    path.write_text(text.format(experts=8), encoding="utf-8")
    same = import_file(str(path))
    assert same.request["model"] == "mixtral-8x7b" and same.request["ep"] == 8 and not same.unsupported
    path.write_text(text.format(experts=16), encoding="utf-8")
    changed = import_file(str(path))
    assert "model" not in changed.request and changed.request["ep"] == 8
    assert any("mixtral-8x7b differs in model.num_moe_experts=16 (mixtral-8x7b: 8)" in u for u in changed.unresolved)


def test_bridge_override_that_cannot_be_read_reads_no_model():
    imported = import_config(BRIDGE.format(extra=" model.num_moe_experts=$E"), "run.sh")
    assert "model" not in imported.request
    assert any(u.startswith("model: run.sh:1 model.num_moe_experts") for u in imported.unresolved)
