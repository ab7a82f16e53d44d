"""Megatron-Bridge override YAML files (meshplan/adapters/read/bridge_yaml.py): told from every other YAML config by
ConfigContainer's sections, read through the one Bridge key table, a section Bridge would skip said, the recipe a
script pairs the file with read under it (the YAML wins), and every face answering for one.

Fixtures: tests/configs_bridge_yaml/*.yaml, five of Bridge's own conf/ files (SOURCES.txt: 067f987)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import yaml
from mcp.server.mcpserver.exceptions import ToolError

from meshplan import api
from meshplan.adapters.read import import_config, import_file, request_values
from meshplan.adapters.read.detect import yaml_kind
from meshplan.adapters.read.keys import read_section
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.schema.request import Request

HERE = Path(__file__).parent
FIXTURES = HERE / "configs_bridge_yaml"
CONFIGS = HERE / "configs"

# each of Bridge's own files, the request fields it states (nothing beside it: no model, no GPU count)
EXPECTED = {
    "llama32_1b_pretrain.yaml": {"tp": 1, "pp": 1, "cp": 1, "seq_length": 4096, "global_batch_size": 8,
                                 "micro_batch_size": 1},
    "llama32_1b_finetune.yaml": {"tp": 1, "pp": 1, "cp": 1, "seq_length": 4096, "global_batch_size": 128,
                                 "micro_batch_size": 2, "lora_rank": 8},
    "qwen3_next_80b_a3b_finetune_override_example.yaml": {"seq_length": 2048, "global_batch_size": 64,
                                                          "micro_batch_size": 1, "cross_entropy_loss_fusion": False},
    "qwen3_vl_pretrain_override_example.yaml": {"tp": 1, "pp": 1, "cp": 1, "cp_comm_type": "p2p",
                                                "recompute": "full", "recompute_method": "uniform",
                                                "recompute_layers": 1, "global_batch_size": 8,
                                                "micro_batch_size": 4, "cross_entropy_loss_fusion": False},
    "llama32_3b-1b_distill_override_example.yaml": {"tp": 2, "pp": 1, "cp": 1, "sequence_parallel": True,
                                                    "global_batch_size": 8, "micro_batch_size": 1},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_of_bridges_own_override_files_reads_to_its_layout(name):
    text = (FIXTURES / name).read_text()
    assert yaml_kind(text) == "megatron-bridge"
    for got in (import_file(str(FIXTURES / name)), import_config(text, config_format="yaml"), import_config(text)):
        assert got.framework == "megatron-bridge" and got.config_format == "yaml"
        assert {k: got.request.get(k) for k in EXPECTED[name]} == EXPECTED[name]
        assert "model" not in got.request and "num_gpus" not in got.request
        assert {tuple(left.fields) for left in got.left_to_request} == {("model",), ("num_gpus",)}
    src = import_file(str(FIXTURES / name)).sources
    assert src["micro_batch_size"].endswith(" train.micro_batch_size")  # cited with the file's own key and line
    assert src["micro_batch_size"].startswith(f"{FIXTURES / name}:")


def test_the_file_states_nothing_of_the_model_and_gpus_so_both_are_asked_for():
    path = str(FIXTURES / "llama32_1b_pretrain.yaml")
    imported = import_file(path)
    with pytest.raises(MeshplanError, match="names no model"):
        request_values(imported, {})
    with pytest.raises(MeshplanError, match="GPU count is not read"):
        request_values(imported, {"model": "llama-3.1-8b"})
    values = request_values(imported, {"model": "llama-3.1-8b", "num_gpus": 8})
    assert values["tp"] == 1 and values["global_batch_size"] == 8 and values["framework"] == "megatron-bridge"


def test_other_yaml_configs_are_not_read_as_bridges():
    """AutoModel's recipes (model:, dataset:, optimizer: beside distributed:), verl's SFT config (model:,
    checkpoint:, optim:), SkyRL's and Megatron-LM's keep their readers; a mapping of unknown keys is still refused."""
    for name, kind in (("automodel_deepseek_v3_te_deepep.yaml", "automodel"),
                       ("automodel_llama3_3_70b_instruct_peft_benchmark.yaml", "automodel"),
                       ("verl_sft_trainer.yaml", "verl-sft")):
        assert yaml_kind((CONFIGS / name).read_text()) == kind, name
    assert yaml_kind("trainer:\n  x: 1\ngenerator:\n  n: 8\n") == "skyrl"
    assert yaml_kind("MODEL_ARGS:\n  --num-layers: 2\nTEST_TYPE: regular\n") == "megatron-test"
    assert yaml_kind("model:\n  partial_pretrain: x\ncheckpoint:\n  save: y\n") == "verl-sft"
    assert yaml_kind("train:\n  micro_batch_size: 1\n") is None  # one section alone says nothing
    assert yaml_kind("wandb:\n  project: x\nmodel:\n  a: 1\nfoo: 2\n") is None  # most keys no section
    with pytest.raises(MeshplanError, match="cannot tell which framework this YAML file is for"):
        import_config("wandb:\n  project: x\ndata:\n  train_batch_size: 64\n")


def test_a_top_level_key_bridge_does_not_have_is_said_as_bridge_skips_it():
    text = "model:\n  tensor_model_parallel_size: 2\noptimiser:\n  lr: 1.0e-4\ntrain:\n  micro_batch_size: 1\n"
    got = import_config(text, path="job.yaml")
    said = [u for u in got.unsupported if "optimiser" in u]
    assert len(said) == 1 and said == got.misspelt
    assert said[0].startswith("job.yaml:3 optimiser: not a ConfigContainer section")
    assert "did you mean optimizer?" in said[0] and "Key 'optimiser' in overrides not found" in said[0]
    for section in read_section("megatron-bridge").sections:  # the sections Bridge has, named
        assert section in said[0]
    assert got.request["tp"] == 2 and got.request["micro_batch_size"] == 1
    # a key inside a section meshplan does not model is listed, and one a slip from a read key is named so
    got = import_config("model:\n  tensor_model_paralel_size: 2\n  moe_router_fusion: true\ntrain:\n"
                        "  micro_batch_size: 1\n")
    assert any("model.tensor_model_paralel_size" in m and "tensor_model_parallel_size" in m for m in got.misspelt)
    assert any(u.startswith("<config_text>:3 model.moe_router_fusion = True: no meshplan field")
               for u in got.unsupported)
    assert "tp" not in got.request


def test_missing_values_instantiate_keys_and_env_vars():
    """OmegaConf's ??? is said (Bridge refuses to run until set), never read as a value; `_target_` is Bridge's
    instantiate key, no field; env_vars' allocator setting is the run's environment."""
    text = ("env_vars:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:False\n  NCCL_NVLS_ENABLE: 0\n"
            "model:\n  _target_: megatron.bridge.models.gpt_provider.GPTModelProvider\n"
            "  tensor_model_parallel_size: 2\ntrain:\n  micro_batch_size: ???\n  global_batch_size: 64\n")
    got = import_config(text, path="job.yaml")
    assert "micro_batch_size" not in got.request and got.request["global_batch_size"] == 64
    assert any(u.startswith("job.yaml:8 train.micro_batch_size = ???: OmegaConf's MISSING") for u in got.unresolved)
    assert any("GPTModelProvider: the model provider Bridge instantiates" in n for n in got.notes)
    assert not any("_target_" in u or "NCCL" in u for u in got.unsupported)
    assert got.request["expandable_segments"] is False
    assert got.sources["expandable_segments"].startswith("job.yaml:2 PYTORCH_CUDA_ALLOC_CONF")


def test_the_hugging_face_model_a_saved_config_records_is_the_model():
    text = ("model:\n  tensor_model_parallel_size: 2\n  extra_checkpoint_metadata:\n"
            "    hf_model_id: meta-llama/Llama-3.1-8B\ntrain:\n  global_batch_size: 64\n")
    got = import_config(text, path="run_config.yaml")
    assert got.request["model"] == "llama-3.1-8b"
    assert got.sources["model"] == "run_config.yaml:4 model.extra_checkpoint_metadata.hf_model_id"
    unknown = import_config(text.replace("meta-llama/Llama-3.1-8B", "org/unknown-model"))
    assert "model" not in unknown.request and any("not in meshplan's catalog" in n for n in unknown.notes)


def _bridge_checkout(root: Path, yaml_text: str, recipe: str) -> Path:
    """A Bridge checkout's layout: a recipe module under src/megatron/bridge/recipes, re-exported under a short name
    as recipes/llama/llama3.py does, and a script that pairs conf/job.yaml with the recipe (02_pretrain_with_yaml.py's
    shape)."""
    recipes = root / "src/megatron/bridge/recipes/llama"
    (recipes / "h100").mkdir(parents=True)
    shutil.copy(CONFIGS / "bridge_perf_llama3_h100.py", recipes / "h100/llama3.py")
    (recipes / "__init__.py").write_text(f"from .h100.llama3 import {recipe} as llama3_70b_yaml_config\n")
    script_dir = root / "tutorials/recipes/llama"
    (script_dir / "conf").mkdir(parents=True)
    (script_dir / "conf/job.yaml").write_text(yaml_text)
    (script_dir / "train_with_yaml.py").write_text(
        "from pathlib import Path\nfrom megatron.bridge.recipes.llama import llama3_70b_yaml_config\n"
        "DEFAULT_CONFIG_FILE = Path(__file__).parent / 'conf' / 'job.yaml'\n\n\ndef main():\n"
        "    config = llama3_70b_yaml_config()\n    return config\n")
    return script_dir / "conf/job.yaml"


def test_a_yaml_paired_with_a_recipe_is_applied_over_it(tmp_path):
    """The script beside the file names it and starts from a recipe: the recipe's module, found in the checkout, is
    read through its chain and the YAML applied over it; the recipe's name's GPU count is its tuned run's, not
    torchrun's, so it is left to the request."""
    recipe = "llama3_70b_pretrain_64gpu_h100_bf16_config"
    path = _bridge_checkout(tmp_path, "model:\n  tensor_model_parallel_size: 8\ntrain:\n  micro_batch_size: 2\n"
                                      "dist:\n  use_torch_fsdp2: false\n", recipe)
    own = import_file(f"{tmp_path}/src/megatron/bridge/recipes/llama/h100/llama3.py:{recipe}")
    got = import_file(str(path))
    assert own.request["tp"] == 4 and got.request["tp"] == 8  # the YAML wins
    assert got.request["micro_batch_size"] == 2
    for field in ("pp", "cp", "vpp", "global_batch_size", "model", "precision", "job"):  # the recipe's stand
        assert got.request[field] == own.request[field], field
    assert got.sources["tp"] == f"{path}:2 model.tensor_model_parallel_size"
    assert got.sources["pp"] == own.sources["pp"]  # cited in the recipe's module
    assert "num_gpus" not in got.request and "num_gpus" in own.request
    assert any(f"applied over recipe llama3_70b_yaml_config() ({recipe} in" in a for a in got.assumed)
    assert any(u.startswith(f"{path}:6 dist.use_torch_fsdp2") for u in got.unsupported)
    values = request_values(got, {"num_gpus": 64})
    assert values["model"] == "llama-3-70b" and values["tp"] == 8


def test_a_script_picking_its_recipe_at_run_time_pairs_no_recipe(tmp_path):
    path = _bridge_checkout(tmp_path, "model:\n  tensor_model_parallel_size: 8\ntrain:\n  micro_batch_size: 2\n",
                            "llama3_70b_pretrain_64gpu_h100_bf16_config")
    script = path.parent.parent / "train_with_yaml.py"
    script.write_text(script.read_text().replace(
        "    config = llama3_70b_yaml_config()\n",
        "    if flag:\n        config = llama3_70b_yaml_config()\n    else:\n"
        "        config = llama3_8b_sft_8gpu_h100_bf16_config()\n").replace(
        "import llama3_70b_yaml_config", "import llama3_70b_yaml_config, llama3_8b_sft_8gpu_h100_bf16_config"))
    got = import_file(str(path))
    assert got.request["tp"] == 8 and "model" not in got.request and "job" not in got.request
    assert any("picks one of the recipes" in a for a in got.assumed)


def _yaml_of_python_render(text: str) -> str:
    """The `cfg.<section>.<field> = value` lines of a Python render as the override YAML of the same keys."""
    nested: dict = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign):
            parts = ast.unparse(node.targets[0]).split(".")[1:]
            at = nested
            for part in parts[:-1]:
                at = at.setdefault(part, {})
            at[parts[-1]] = ast.literal_eval(node.value)
    return yaml.safe_dump(nested, sort_keys=False)


@pytest.mark.parametrize("layout", [
    {"model": "llama-3.1-8b", "num_gpus": 16, "tp": 2, "pp": 2},
    {"model": "llama-3.1-8b", "num_gpus": 16, "tp": 4, "recompute": "full", "recompute_layers": 1,
     "recompute_method": "uniform", "zero_stage": 0},
    {"model": "mixtral-8x7b", "num_gpus": 32, "tp": 2, "pp": 2, "ep": 4, "etp": 1, "cp": 2},
])
def test_the_render_read_back_as_an_override_yaml_is_the_same_plan(layout):
    """Bridge's render is Python (cfg.* lines; the run_recipe variant a KEY=VALUE command line), no YAML: its keys
    written as an override YAML read back to the request the Python render reads back to, and to the rendered plan."""
    req = Request(framework="megatron-bridge", gpu="h100", **layout)
    rendered = api.render_config("megatron-bridge", req)
    assert rendered.format == "python"
    text = _yaml_of_python_render(rendered.text)
    as_yaml, as_python = import_config(text, path="job.yaml"), import_config(rendered.text, path="job.py")
    assert as_yaml.framework == "megatron-bridge" and as_yaml.config_format == "yaml"
    assert as_yaml.request == as_python.request
    given = {"model": layout["model"], "num_gpus": layout["num_gpus"], "gpu": "h100"}
    plan = api.check_config(api.request_from_config(as_yaml, given), config=as_yaml).plan
    assert plan == rendered.plan


def test_every_face_checks_an_override_yaml_the_same(capsys):
    path = FIXTURES / "qwen3_vl_pretrain_override_example.yaml"
    given = {"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100"}
    imported = api.import_file(str(path))
    report = api.check_config(api.request_from_config(imported, given), config=imported)
    assert report.plan.tp == 1 and report.plan.micro_batch_size == 4 and report.plan.recompute == "full"
    answer = tools.check_config(config_text=path.read_text(), **given)
    assert answer.plan == report.plan and answer.ok == report.ok
    assert main(["check", "--config", str(path), "--model", "llama-3.1-8b", "--num-gpus", "8", "--gpu", "h100",
                 "--json"]) in (0, 1)
    out = capsys.readouterr().out
    assert json.loads(out)["plan"] == report.plan.model_dump(mode="json")
    with pytest.raises(ToolError, match="names no model"):  # the MCP tool without a model: said, no traceback
        tools.check_config(config_text=path.read_text(), num_gpus=8)


def test_a_launch_of_a_yaml_script_reads_the_recipe_the_yaml_and_the_command_line_in_that_order(tmp_path):
    """`torchrun ... SCRIPT.py --config-file conf/x.yaml key=value`, as Bridge's tutorials run them: the recipe the
    script starts from, the YAML over it, the Hydra-style overrides over both, the GPUs torchrun starts."""
    recipe = "llama3_70b_pretrain_64gpu_h100_bf16_config"
    path = _bridge_checkout(tmp_path, "model:\n  tensor_model_parallel_size: 8\ntrain:\n  micro_batch_size: 2\n",
                            recipe)
    run = path.parent.parent / "run.sh"
    run.write_text("torchrun --nproc_per_node=8 --nnodes=2 train_with_yaml.py \\\n  --config-file conf/job.yaml \\\n"
                   "  model.tensor_model_parallel_size=2 +rng.seed=3\n")
    got = import_file(str(run))
    assert got.framework == "megatron-bridge" and got.config_format == "shell"
    assert got.request["tp"] == 2 and got.sources["tp"] == f"{run}:3 model.tensor_model_parallel_size"
    assert got.request["micro_batch_size"] == 2 and got.sources["micro_batch_size"].startswith(f"{path}:4 ")
    assert got.request["pp"] == 4 and got.request["model"] == "llama-3-70b"  # the recipe's
    assert got.request["num_gpus"] == 16
    assert not got.left_to_request
    # a top-level key Bridge does not have: refused as its struct-mode Hydra parse refuses it; added with +, said
    run.write_text("torchrun --nproc_per_node=8 train_with_yaml.py --config-file conf/job.yaml optimiser.lr=1\n")
    with pytest.raises(MeshplanError, match=r"optimiser is not a ConfigContainer section, and Megatron-Bridge "
                                            r"refuses the override .*did you mean optimizer\?") as exc:
        import_file(str(run))
    assert "ddp" in exc.value.fix
    run.write_text("torchrun --nproc_per_node=8 train_with_yaml.py --config-file conf/job.yaml +optimiser.lr=1\n")
    assert any("+optimiser.lr = 1: not a ConfigContainer section" in u for u in import_file(str(run)).unsupported)
    assert main(["check", "--config", str(run), "--gpu", "h100"]) in (0, 1)  # the CLI face on the launch


def test_zero_stage_fixes_write_megatron_fsdp_as_bridge_reads_it(tmp_path):
    """A MEM001 fix of zero_stage on a Megatron-Bridge file writes the sharding strategy's word with the switch it is
    read beside (ddp.use_megatron_fsdp, Bridge 067f987 config.py) and the distributed optimizer as a boolean: it wrote
    ddp.data_parallel_sharding_strategy=3 and ddp.use_distributed_optimizer=1."""
    path = tmp_path / "override.yaml"
    path.write_text("model:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n"
                    "  seq_length: 4096\ntrain:\n  global_batch_size: 64\n  micro_batch_size: 1\n"
                    "ddp:\n  use_distributed_optimizer: false\n")
    imported = api.import_file(str(path))
    given = {"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100"}
    report = api.check_config(api.request_from_config(imported, given), config=imported)
    options = [[c.text for c in option] for fix in report.config_fixes for option in fix.options]
    assert ["ddp.use_distributed_optimizer=true  # line 9, was false"] in options
    assert ["ddp.data_parallel_sharding_strategy=optim_grads_params", "ddp.use_megatron_fsdp=true",
            "checkpoint.ckpt_format=fsdp_dtensor"] in options
    assert not any("sharding_strategy=3" in text or "=1 " in text for option in options for text in option)
