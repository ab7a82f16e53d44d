"""Megatron-Bridge recipes resolved through their chain: a recipe module read with ast (never run), the recipe's own
cfg assignments over its base's in the same file, and the facts its name states (model, GPUs, GPU, precision), which
also resolve `--recipe NAME` in a run_recipe.py script. The module is kept verbatim in tests/configs/ (SOURCES.txt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read.bridge_recipe import name_facts
from meshplan.core.errors import MeshplanError

CONFIGS = Path(__file__).resolve().parent / "configs"
MODULE = CONFIGS / "bridge_perf_llama3_h100.py"


@pytest.mark.parametrize(("name", "fields"), [
    ("llama3_70b_pretrain_64gpu_h100_fp8cs_config", {"job": "pretrain", "model": "llama-3-70b", "num_gpus": 64,
                                                     "gpu": "h100", "precision": "fp8", "fp8_recipe": "tensorwise"}),
    ("deepseek_v3_pretrain_256gpu_b200_fp8mx_config", {"model": "deepseek-v3", "num_gpus": 256, "gpu": "b200",
                                                       "fp8_recipe": "mxfp8"}),
    ("llama31_405b_peft_32gpu_h100_bf16_config", {"job": "lora", "model": "llama-3.1-405b", "precision": "bf16"}),
    ("qwen3_30b_a3b_pretrain_config", {"job": "pretrain", "model": "qwen3-30b-a3b"}),
])
def test_recipe_name_facts(name, fields):
    found, left = name_facts(name)
    assert {k: found[k] for k in fields} == fields and not left


def test_recipe_name_facts_meshplan_cannot_use_are_said():
    found, left = name_facts("deepseek_v3_pretrain_128gpu_vr200_nvfp4_config")
    assert found["num_gpus"] == 128 and "gpu" not in found and "precision" not in found
    assert any("vr200" in said and fields == ("gpu",) for fields, said in left)
    assert any("nvfp4" in said and fields == ("precision",) for fields, said in left)


def test_perf_recipe_read_through_its_body():
    # llama3_70b_pretrain_64gpu_h100_fp8cs_config: cfg.model.tensor_model_parallel_size = 4, pipeline 8, vpp 5,
    # the layout string, sequence_parallel True, train.global_batch_size 256, micro_batch_size 1
    result = api.import_file(f"{MODULE}:llama3_70b_pretrain_64gpu_h100_fp8cs_config")
    expected = {"tp": 4, "pp": 8, "vpp": 5, "cp": 1, "sequence_parallel": True, "global_batch_size": 256,
                "micro_batch_size": 1, "model": "llama-3-70b", "num_gpus": 64, "gpu": "h100", "precision": "fp8"}
    assert {k: result.request[k] for k in expected} == expected
    assert result.request["pipeline_layout"] == "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"
    assert result.sources["tp"].startswith(f"{MODULE}:") and "recipe name" in result.sources["num_gpus"]
    assert any("llama3_70b_pretrain_config" in n and "other modules" in n for n in result.notes)
    report = api.check_config(api.request_from_config(result), config=result)
    assert report.plan.tp == 4 and report.plan.pp == 8 and report.plan.vpp == 5


def test_unknown_recipe_is_an_error():
    with pytest.raises(MeshplanError, match="no recipe 'llama3_7b_config'"):
        api.import_file(f"{MODULE}:llama3_7b_config")


def _imported(path, text: str, recipe: str):
    """A recipe module written to `path` and one of its recipes imported: (path, ImportedConfig)."""
    path.write_text(text, encoding="utf-8")
    return path, api.import_file(f"{path}:{recipe}")


def test_chain_in_one_file_base_first(tmp_path):
    text = ("def base_pretrain_config() -> ConfigContainer:\n    cfg = ConfigContainer()\n"
            "    cfg.model.tensor_model_parallel_size = 2\n    cfg.train.global_batch_size = 64\n    return cfg\n\n"
            "def llama3_8b_pretrain_8gpu_h100_bf16_config() -> ConfigContainer:\n    cfg = base_pretrain_config()\n"
            "    cfg.model.tensor_model_parallel_size = 4\n    return cfg\n")
    path, result = _imported(tmp_path / "recipes.py", text, "llama3_8b_pretrain_8gpu_h100_bf16_config")
    assert result.request["tp"] == 4 and result.sources["tp"] == f"{path}:9 model.tensor_model_parallel_size"
    assert result.request["global_batch_size"] == 64  # the base's, in the same file
    assert result.request["model"] == "llama-3-8b" and result.request["num_gpus"] == 8


def test_a_module_constant_is_read_as_its_value(tmp_path):
    """Megatron-Bridge's recipes/llama/h100/llama3.py sets `cfg.model.seq_length = SEQUENCE_LENGTH_128K`, a constant
    the module defines (`SEQUENCE_LENGTH_128K: int = 131072`): it was skipped as a helper object, and check estimated
    the 128K recipe at the default 4,096 tokens and called it ok."""
    text = ("SEQUENCE_LENGTH_16K = 16384\nSEQUENCE_LENGTH_128K: int = 131072\n\n"
            "def llama3_8b_pretrain_64gpu_h100_bf16_128k_config() -> ConfigContainer:\n"
            "    cfg = _pretrain_common()\n    cfg.model.context_parallel_size = 8\n"
            "    cfg.model.seq_length = SEQUENCE_LENGTH_128K\n    return cfg\n")
    path, result = _imported(tmp_path / "llama3.py", text, "llama3_8b_pretrain_64gpu_h100_bf16_128k_config")
    assert result.request["seq_length"] == 131072 and result.sources["seq_length"] == f"{path}:7 model.seq_length"


def test_a_layout_a_helper_sets_is_said_not_read_and_not_estimated_as_an_even_split(tmp_path):
    """Megatron-Bridge's recipes/deepseek/h100/deepseek_v3.py sets `cfg.model.pipeline_model_parallel_layout = None`
    and then calls set_deepseek_v3_pipeline_model_parallel_layout(cfg.model), which picks the layout for the pp and
    vpp: the reader saw only the None, and check answered PP001 '61 layers do not split evenly over pp=8 stages, and
    no uneven first/last stage sizes are given' of a recipe that gives one."""
    text = ("def deepseek_v3_pretrain_256gpu_h100_bf16_config() -> ConfigContainer:\n"
            "    cfg = _pretrain_common()\n    cfg.model.pipeline_model_parallel_size = 8\n"
            "    cfg.model.expert_model_parallel_size = 32\n    cfg.model.pipeline_model_parallel_layout = None\n"
            "    set_deepseek_v3_pipeline_model_parallel_layout(cfg.model)\n    return cfg\n")
    _, result = _imported(tmp_path / "deepseek_v3.py", text, "deepseek_v3_pretrain_256gpu_h100_bf16_config")
    assert any("set_deepseek_v3_pipeline_model_parallel_layout" in u and ":6 " in u for u in result.unresolved)
    with pytest.raises(MeshplanError, match=r"pipeline split is not read.*set_deepseek_v3_pipeline_model_parallel"):
        api.request_from_config(result)
    given = api.request_from_config(result, {"pipeline_layout": "Et*3|(tt|)*29,m|L", "vpp": 4})
    assert given.pipeline_layout == "Et*3|(tt|)*29,m|L"


def test_a_layout_the_recipe_computes_is_said_not_read_and_its_attention_enum_is_read(tmp_path):
    """Megatron-Bridge 067f987 recipes/kimi/h100/kimi_k2.py: `cfg.model.pipeline_model_parallel_layout =
    _get_kimi_k2_pipeline_layout(16, 1)`, a call the reader skipped as a helper object, so pp 16 was estimated as an
    even split of Kimi-K2's 61 layers (PP001 on the recipe); gemma3_vl's `cfg.model.attention_backend =
    AttnBackend.auto` was skipped the same way. A computed layout on one stage is no split to read."""
    text = ("def kimi_k2_pretrain_512gpu_h100_bf16_config() -> ConfigContainer:\n"
            "    cfg = _pretrain_common()\n    cfg.model.pipeline_model_parallel_size = 16\n"
            "    cfg.model.pipeline_model_parallel_layout = None\n"
            "    cfg.model.pipeline_model_parallel_layout = _get_kimi_k2_pipeline_layout(16, 1)\n"
            "    cfg.model.attention_backend = AttnBackend.fused\n    return cfg\n")
    _, result = _imported(tmp_path / "kimi_k2.py", text, "kimi_k2_pretrain_512gpu_h100_bf16_config")
    assert any(":5 model.pipeline_model_parallel_layout = _get_kimi_k2_pipeline_layout(16, 1): computed by the "
               "recipe, not read" in u for u in result.unresolved)
    assert result.request["attention_backend"] == "fused"
    with pytest.raises(MeshplanError, match=r"pipeline split is not read.*_get_kimi_k2_pipeline_layout"):
        api.request_from_config(result)
    one = text.replace("pipeline_model_parallel_size = 16", "pipeline_model_parallel_size = 1")
    _, single = _imported(tmp_path / "kimi_pp1.py", one, "kimi_k2_pretrain_512gpu_h100_bf16_config")
    assert not any("computed by the recipe" in u for u in single.unresolved)


def test_run_recipe_script_states_what_the_recipe_name_says():
    result = api.import_file(str(CONFIGS / "bridge_qwen3_600m_sft_128k.sh"))
    assert result.request["job"] == "sft" and result.request["num_gpus"] == 8  # the launcher's count
    assert any("qwen3_600m: not in meshplan's catalog" in u for u in result.unresolved)


def test_a_rendered_megatron_fsdp_layout_imports_with_nothing_unexpressed():
    """render megatron-bridge at zero_stage 3 writes dist.use_megatron_fsdp and ddp.use_megatron_fsdp beside
    ddp.data_parallel_sharding_strategy; import listed both switches under 'meshplan cannot express' though it read
    the layout (zero_stage 3, from the strategy key) whole."""
    from meshplan.adapters.read import import_config
    from meshplan.adapters.render import render
    from meshplan.request.resolve import resolve
    from meshplan.schema.request import Request

    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="megatron-bridge",
                                zero_stage=3))
    got = import_config(render("megatron-bridge", job, plan).text, "layout.py")
    assert got.unsupported == [] and got.request["zero_stage"] == 3, got.unsupported
    assert any("use_megatron_fsdp" in note for note in got.notes)


@pytest.mark.parametrize("recipe", ["moonlight_16b_peft_4gpu_h100_bf16_config",
                                    "moonlight_16b_sft_8gpu_h100_bf16_config"])
def test_a_recipe_whose_model_a_provider_function_builds_maps_to_the_catalog_model(recipe):
    """Megatron-Bridge 067f987's Moonlight recipes build cfg.model through the module's provider functions
    (_moonlight_16b_finetuning_model_provider -> _moonlight_16b_model_provider ->
    AutoBridge.from_hf_pretrained(_MOONLIGHT_16B_MODEL_ID)), and the PEFT recipe keeps 163842 tokenizer rows
    (model.vocab_size) on Moonlight's 163840. Both map to moonlight-16b-a3b through the Hugging Face id, the vocab
    override said, not read as another architecture (fails before: the name moonlight_16b is no catalog key, and the
    vocab override left no catalog model)."""
    result = api.import_file(f"{CONFIGS / 'bridge_moonlight_16b_h100.py'}:{recipe}")
    assert result.request["model"] == "moonlight-16b-a3b"
    assert "from_hf_pretrained('moonshotai/Moonlight-16B-A3B')" in result.sources["model"]
    assert not [u for u in result.unresolved if u.startswith("model")]
    vocab = [u for u in result.unsupported if "vocab_size" in u]
    assert bool(vocab) == ("peft" in recipe) and all("163842" in u and "163840" in u for u in vocab)
    api.check_config(api.request_from_config(result), config=result)


@pytest.mark.parametrize(("body", "overlap"), [
    ("", False),  # _sft_common's ddp: overlap_grad_reduce left at Megatron-Core's False
    ("    cfg.ddp.overlap_grad_reduce = True\n", True),  # the file's own key wins
    ("    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)\n", None),  # may turn it on: left to the default
])
def test_an_sft_recipe_runs_its_base_recipe_s_dp_overlap(tmp_path, body, overlap):
    """Megatron-Bridge's recipes/common.py _sft_common and _peft_common build their DistributedDataParallelConfig
    without overlap_grad_reduce / overlap_param_gather (Megatron-Core's default False) and comm_overlap=None, where
    _pretrain_common sets both True; an SFT or PEFT recipe that sets neither was read as meshplan's default, on."""
    text = ("def llama3_8b_sft_8gpu_h100_bf16_config() -> ConfigContainer:\n    cfg = _sft_common()\n"
            f"    cfg.model.tensor_model_parallel_size = 2\n{body}    return cfg\n")
    _, result = _imported(tmp_path / "llama3_sft.py", text, "llama3_8b_sft_8gpu_h100_bf16_config")
    assert result.request.get("grad_reduce_overlap") is overlap
    if overlap is False:
        assert "recipe name llama3_8b_sft_8gpu_h100_bf16_config" in result.sources["grad_reduce_overlap"]
        req = api.request_from_config(result)
        assert req.grad_reduce_overlap is False
    pretrain = text.replace("_sft_", "_pretrain_").replace("_sft_common", "_pretrain_common")
    _, trained = _imported(tmp_path / "llama3_pretrain.py", pretrain, "llama3_8b_pretrain_8gpu_h100_bf16_config")
    assert trained.request.get("grad_reduce_overlap") is (True if overlap else None)


def test_a_run_recipe_script_of_a_peft_recipe_reads_its_dp_overlap_off():
    text = ("torchrun --nproc_per_node=8 examples/recipes/run_recipe.py "
            "--recipe llama3_8b_peft_8gpu_h100_bf16_config\n")
    result = api.import_config(text, path="peft.sh", framework="megatron-bridge")
    assert result.request["job"] == "lora" and result.request["grad_reduce_overlap"] is False
    overridden = api.import_config(text.rstrip("\n") + " ddp.overlap_grad_reduce=true\n", path="peft.sh",
                                   framework="megatron-bridge")
    assert overridden.request["grad_reduce_overlap"] is True


QUICKSTART = '''from megatron.bridge.recipes.llama import llama3_8b_pretrain_config as pretrain_config
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain


def main() -> None:
    config = pretrain_config()
    config.train.train_iters = 10
    config.train.global_batch_size = 128
    config.train.micro_batch_size = 4
    config.model.tensor_model_parallel_size = 2
    pretrain(config=config, forward_step_func=forward_step)


if __name__ == "__main__":
    main()
'''


def test_a_training_script_that_sets_a_recipes_fields_is_read():
    """Megatron-Bridge's quickstart (tutorials/recipes/llama/00_quickstart_pretrain.py, ananthsub/Megatron-Bridge
    106262f: `config = llama32_1b_pretrain_config()` and `config.train.* = ...` in its main()) was refused as 'cannot
    tell which framework this Python file is for', though the refusal said meshplan reads 'a Python script that sets
    cfg.* on a Bridge recipe'. The recipe imported from megatron.bridge.recipes (an alias followed to its name) states
    the model and job as a recipe module's name does, the fields set on what it returns are read with their lines, and
    the GPU count, which torchrun gives, is left to the request."""
    imported = api.import_config(QUICKSTART, path="train.py")
    assert imported.framework == "megatron-bridge" and imported.variant == "python"
    assert {k: imported.request[k] for k in ("model", "job", "global_batch_size", "micro_batch_size", "tp")} == {
        "model": "llama-3-8b", "job": "pretrain", "global_batch_size": 128, "micro_batch_size": 4, "tp": 2}
    assert imported.sources["micro_batch_size"] == "train.py:10 train.micro_batch_size"
    assert imported.sources["model"] == "train.py:7 recipe name llama3_8b_pretrain_config"
    assert [left.fields for left in imported.left_to_request] == [["num_gpus"]]
    report = api.check_config(api.request_from_config(imported, {"num_gpus": 8}), config=imported)
    assert report.plan.tp == 2 and report.plan.dp == 4


def test_check_fixes_on_a_training_script_set_the_fields_on_its_own_config_name():
    """check's fixes on the quickstart, whose config is `config` (launch.recipe_call), wrote `cfg.train.micro_batch_size
    = 1`, a name the script never defines (NameError where pasted); they set the fields on the script's own name, the
    field the file states on its line and the one it leaves out alike. A cfg.* file keeps cfg."""
    text = QUICKSTART.replace("micro_batch_size = 4", "micro_batch_size = 16")
    imported = api.import_config(text, path="train.py")
    assert imported.config_variable == "config"
    report = api.check_config(api.request_from_config(imported, {"num_gpus": 8}), config=imported)
    fix = next(f for f in report.config_fixes if f.finding == "MEM001")
    texts = [change.text for option in fix.options for change in option]
    assert "config.train.micro_batch_size = 1  # line 10, was 16" in texts
    assert 'config.model.recompute_granularity = "full"' in texts
    assert not any(t.startswith("cfg.") for t in texts)
    renamed = api.import_config(text.replace("config = pretrain_config()", "c = pretrain_config()")
                                .replace("config.", "c.").replace("config=config", "config=c"), path="train.py")
    fixed = api.check_config(api.request_from_config(renamed, {"num_gpus": 8}), config=renamed).config_fixes[0]
    assert fixed.options[0][0].text.startswith("c.train.micro_batch_size = 1")
    cfg_file = api.import_config("cfg.train.micro_batch_size = 16\n", path="cfg.py", framework="megatron-bridge")
    assert cfg_file.config_variable is None
    on_cfg = api.check_config(api.request_from_config(cfg_file, {"num_gpus": 8, "model": "llama-3-8b"}),
                              config=cfg_file)
    assert on_cfg.config_fixes[0].options[0][0].text.startswith("cfg.train.micro_batch_size = 1")
