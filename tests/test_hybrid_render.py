"""A hybrid Mamba-2 model (model_type nemotron_h) checked by every rule and rendered for Megatron-Core and
Megatron-Bridge in the keys Megatron-Bridge's Nemotron-H recipes and Megatron-LM's hybrid examples use; the import of
what render writes gives the job back."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.request.parse import parse_request

H8 = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
HYBRIDS = ("nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b", "nemotron-3-nano-30b-a3b", "nemotron-3-super-120b-a12b")


def _req(model: str = "nemotron-h-8b", **fields):
    return parse_request({"model": model, "gpu": "h100", "num_gpus": 8, **fields})


def test_check_runs_every_rule_on_a_hybrid():
    """Before: check refused every hybrid. Now its rules answer: a layout that fits passes, TP006 names a tp that
    splits no Mamba-2 head group, PP016 a vpp, MEM001 a layout that does not fit with fixes that fit."""
    assert not [f for f in api.check_config(_req(tp=2)).findings if f.severity == "error"]
    assert "TP006" in {f.id for f in api.check_config(_req(tp=3, num_gpus=6)).findings}
    assert "PP016" in {f.id for f in api.check_config(_req(tp=2, pp=2, vpp=2)).findings}
    over = api.check_config(_req())
    assert [f.id for f in over.findings if f.severity == "error"] == ["MEM001"]
    assert "pp=2" in next(f.fix for f in over.findings if f.id == "MEM001")
    assert not [f for f in api.check_config(_req(pp=2)).findings if f.severity == "error"]


def test_megatron_core_renders_the_hybrid_model_not_a_gpt():
    """pretrain_mamba.py with --hybrid-layer-pattern (the depth: no --num-layers), the TransformerConfig's --mamba-*
    flags and no position embedding, as Megatron-LM's Nemotron-H examples pass them; before: pretrain_gpt.py with 52
    attention + MLP layers and a learned position table."""
    text = api.render_config("megatron-core", _req(tp=2)).text
    assert "pretrain_mamba.py" in text and "pretrain_gpt.py" not in text and "--num-layers" not in text
    for flag in (f"--hybrid-layer-pattern '{H8}'", "--mamba-num-heads 128", "--mamba-head-dim 64",
                 "--mamba-num-groups 8", "--mamba-state-dim 128", "--position-embedding-type none", "--squared-relu"):
        assert flag in text, flag
    nano = api.render_config("megatron-core", _req("nemotron-3-nano-30b-a3b", num_gpus=16, ep=8, pp=2),
                             force=True).text
    assert "--num-experts 128" in nano and "--moe-layer-freq" not in nano  # its MoE layers are the pattern's E


def test_megatron_bridge_renders_the_recipes_keys():
    """Megatron-Bridge's HybridModelProvider fields, as its nemotronh recipes set them (hybrid_layer_pattern,
    mamba_*), and position_embedding_type 'none' as NemotronHBridge sets it; before: learned_absolute."""
    text = api.render_config("megatron-bridge", _req(tp=2)).text
    for line in (f"cfg.model.hybrid_layer_pattern = '{H8}'", "cfg.model.mamba_num_heads = 128",
                 "cfg.model.mamba_head_dim = 64", "cfg.model.mamba_num_groups = 8", "cfg.model.mamba_state_dim = 128",
                 "cfg.model.position_embedding_type = 'none'"):
        assert line in text, line
    assert "learned_absolute" not in text


@pytest.mark.parametrize("model", HYBRIDS)
def test_render_then_import_gives_the_hybrid_job_back(model):
    """The rendered Megatron-Core script imports back as the same catalog model and layout (its pattern and mixer
    compared with every catalog model's: a GPT script never matches a hybrid, nor the reverse), and the same job's
    request checks to the same plan."""
    fields = {"model": model, "gpu": "h100", "num_gpus": 64, "tp": 2, "pp": 2, "micro_batch_size": 1,
              "global_batch_size": 256, "framework": "megatron-core"}
    text = api.render_config("megatron-core", parse_request(fields), force=True).text
    read = api.import_config(text)
    assert read.request["model"] == model and read.unsupported == [] and read.unresolved == []
    back = api.request_from_config(read, {"gpu": "h100"})
    for name in ("tp", "pp", "micro_batch_size", "global_batch_size", "num_gpus", "framework"):
        assert getattr(back, name) == fields[name], name
    assert back.model == model and api.check_config(back).plan.tp == 2


def test_bridge_recipe_render_imports_back_as_the_recipes_model():
    text = api.render_config("megatron-bridge", _req(tp=2), variant="run_recipe").text.replace(
        '"${RECIPE:?set RECIPE to the recipe function of your model}"', "nemotronh_8b_pretrain_config")
    read = api.import_config(text, framework="megatron-bridge", config_format="shell")
    assert read.request["model"] == "nemotron-h-8b" and read.request["tp"] == 2 and read.unsupported == []
    assert any("model.hybrid_layer_pattern, model.mamba_num_heads" in n and "nemotron-h-8b's architecture" in n
               for n in read.notes)
    changed = api.import_config(text.replace("model.mamba_state_dim=128", "model.mamba_state_dim=64"),
                                framework="megatron-bridge", config_format="shell")
    assert any("model.mamba_state_dim = 64: not nemotron-h-8b's" in u for u in changed.unsupported)


def test_a_script_with_another_pattern_matches_no_catalog_model():
    text = api.render_config("megatron-core", _req(tp=2)).text.replace(H8, H8.replace("*", "M"))
    read = api.import_config(text)
    assert "model" not in read.request
    assert any("nearest: nemotron-h-8b differs in --hybrid-layer-pattern" in u for u in read.unresolved)
    assert any("states a hybrid model's layers" in u for u in read.unresolved)


def test_a_hybrid_script_of_another_width_is_told_the_nearest_hybrids():
    """A pretrain_mamba.py script of a 3,072-wide hybrid matched no catalog model, and its nearest were Nemotron-4
    340B and Llama 3 8B, two plain transformers: the nearest are now the catalog's hybrids, as an MoE script's are
    MoE models."""
    text = api.render_config("megatron-core", _req(tp=2)).text.replace("--hidden-size 4096", "--hidden-size 3072")
    line = next(u for u in api.import_config(text).unresolved if "nearest:" in u)
    assert "this hybrid architecture" in line and "nearest: nemotron-h-" in line
    assert "nemotron-4-340b" not in line and "llama" not in line


def test_bridge_names_nemotron_3_nano_by_its_recipes_name():
    """Megatron-Bridge's recipes call NVIDIA-Nemotron-3-Nano-30B-A3B nemotron_3_nano (recipes/nemotronh/
    nemotron_3_nano.py nemotron_3_nano_pretrain_config): the catalog model of that alias, not 'not in the catalog'."""
    req = _req("nemotron-3-nano-30b-a3b", num_gpus=16, ep=8)
    text = api.render_config("megatron-bridge", req, variant="run_recipe", force=True).text.replace(
        '"${RECIPE:?set RECIPE to the recipe function of your model}"', "nemotron_3_nano_pretrain_config")
    read = api.import_config(text, framework="megatron-bridge", config_format="shell")
    assert read.request["model"] == "nemotron-3-nano-30b-a3b" and read.request["ep"] == 8
    assert read.unsupported == [] and not any("not in meshplan's catalog" in u for u in read.unresolved)
