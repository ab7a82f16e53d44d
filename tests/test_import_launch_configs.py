"""Launch scripts that name their config file. AutoModel launch scripts (its functional tests' L2_*.sh): the
recipe the command's --config names, read with the command's --dotted.key overrides over it
(components/config/_arg_parser.py parse_cli_argv, loader.translate_value),
and the GPU count from the command's launcher. Refused before as 'cannot tell which framework this shell file is
for'. Fixtures: excerpts of NVIDIA-NeMo/Automodel 36044ad files."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main

# tests/functional_tests/hf_transformer_llm/L2_HF_Transformer_LLM_FSDP2_TP2.sh (excerpt: its launch line)
TP2_SCRIPT = """set -xeuo pipefail # Exit immediately if a command exits with a non-zero status

TRANSFORMERS_OFFLINE=1 python -m torch.distributed.run --nproc_per_node=2 --nnodes=1 -m coverage run \\
examples/llm_finetune/finetune.py \\
  --config examples/llm_finetune/llama3_2/llama3_2_1b_squad.yaml \\
  --model.pretrained_model_name_or_path $TEST_DATA_DIR/hf_mixtral_2l/ \\
  --step_scheduler.max_steps 3 \\
  --step_scheduler.global_batch_size 8 \\
  --step_scheduler.local_batch_size 8 \\
  --loss_fn._target_ nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy \\
  --distributed.dp_size none \\
  --distributed.tp_size 2 \\
  --distributed.cp_size 1 \\
  --distributed.sequence_parallel false \\
  --distributed.activation_checkpointing true
"""

# tests/functional_tests/hf_transformer_finetune/L2_HF_Transformer_SFT.sh (excerpt): no launcher, one process
ONE_PROCESS_SCRIPT = """TRANSFORMERS_OFFLINE=1 coverage run \\
examples/llm_finetune/finetune.py \\
  --config examples/llm_finetune/llama3_2/llama3_2_1b_squad.yaml \\
  --step_scheduler.max_steps 3 \\
  --step_scheduler.global_batch_size 8 \\
  --step_scheduler.local_batch_size 8
"""

# examples/llm_finetune/llama3_2/llama3_2_1b_squad.yaml (excerpt; its model swapped for a catalog one below)
RECIPE = """step_scheduler:
  global_batch_size: 64
  local_batch_size: 8
  ckpt_every_steps: 1000

model:
  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: {model}

distributed:
  strategy: fsdp2
  dp_size: none
  tp_size: 1
  cp_size: 1
  sequence_parallel: false
"""

RECIPE_PATH = "examples/llm_finetune/llama3_2/llama3_2_1b_squad.yaml"


def _repo(tmp_path, script: str, model: str = "Qwen/Qwen2.5-7B"):
    """A repository root holding the recipe, with the script under tests/functional_tests/ as AutoModel keeps it."""
    recipe = tmp_path / RECIPE_PATH
    recipe.parent.mkdir(parents=True)
    recipe.write_text(RECIPE.format(model=model))
    path = tmp_path / "tests/functional_tests/hf_transformer_llm/L2_job.sh"
    path.parent.mkdir(parents=True)
    path.write_text(script)
    return path, recipe


def test_a_functional_test_script_is_read_as_its_recipe_with_the_commands_overrides(tmp_path):
    path, recipe = _repo(tmp_path, TP2_SCRIPT)
    got = api.import_file(str(path))
    assert (got.framework, got.variant) == ("nemo-automodel", "launch")
    # the command's overrides win over the recipe, each cited at the script's line
    assert got.request["tp"] == 2 and f"{path}:" in got.sources["tp"] and "--distributed.tp_size" in got.sources["tp"]
    assert got.request["global_batch_size"] == 8 and got.request["micro_batch_size"] == 8
    assert got.request["recompute"] == "full"
    # what only the recipe sets is read from it, cited at the recipe's own line
    assert got.request["zero_stage"] == 3 and got.sources["zero_stage"].startswith(f"{recipe}:11 distributed.strategy")
    # torch.distributed.run --nproc_per_node=2 --nnodes=1: two ranks
    assert got.request["num_gpus"] == 2 and "--nproc_per_node" in got.sources["num_gpus"]
    # the model override is an unset variable's path: not read, and said
    assert "model" not in got.request
    assert any("--distributed.dp_size = null: the framework's default" in n for n in got.notes)
    assert any("read from" in a and "repository root" in a for a in got.assumed)


def test_a_script_with_no_launcher_runs_one_process(tmp_path):
    path, _ = _repo(tmp_path, ONE_PROCESS_SCRIPT)
    got = api.import_file(str(path))
    assert got.request["num_gpus"] == 1
    assert "started by no launcher (one process)" in got.sources["num_gpus"]
    assert got.request["global_batch_size"] == 8  # the override, not the recipe's 64
    req = api.request_from_config(got)
    assert (req.model, req.num_gpus, req.tp) == ("Qwen/Qwen2.5-7B", 1, 1)


def test_torchrun_without_a_count_starts_its_default_one_per_node(tmp_path):
    script = ONE_PROCESS_SCRIPT.replace("coverage run", "torchrun --nnodes=1")
    path, _ = _repo(tmp_path, script)
    got = api.import_file(str(path))
    assert got.request["num_gpus"] == 1
    assert any("without --nproc-per-node" in n for n in got.notes)


def test_the_request_resolves_through_check(tmp_path, capsys):
    path, _ = _repo(tmp_path, TP2_SCRIPT.replace("$TEST_DATA_DIR/hf_mixtral_2l/", "Qwen/Qwen2.5-7B"))
    req = api.request_from_config(api.import_file(str(path)))
    assert (req.model, req.framework, req.num_gpus, req.tp, req.zero_stage) == (
        "Qwen/Qwen2.5-7B", "nemo-automodel", 2, 2, 3)


@pytest.mark.parametrize("script, said", [
    (TP2_SCRIPT.replace(f"--config {RECIPE_PATH}", "--config examples/missing.yaml"), "the file is not found"),
    (TP2_SCRIPT.replace(f"--config {RECIPE_PATH} ", ""), "no --config (or -c) recipe is given"),
])
def test_a_recipe_that_cannot_be_read_is_a_clear_error_on_every_face(tmp_path, capsys, script, said):
    path, _ = _repo(tmp_path, script)
    with pytest.raises(MeshplanError, match=said.replace("(", r"\(").replace(")", r"\)")):
        api.import_file(str(path))
    assert main(["import", str(path)]) != 0
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_a_pasted_script_names_a_recipe_it_cannot_follow(tmp_path):
    """The MCP face takes the script's text: no folder to find the recipe in, said so."""
    with pytest.raises(MeshplanError, match="a pasted script has no folder"):
        api.import_config(TP2_SCRIPT)


# KempnerForge scripts/slurm/7b_requeue.sh at 5666d0d (excerpt): srun starts a rank per task, 4 nodes x 4 tasks
KF_SCRIPT = """#!/bin/bash
#SBATCH --job-name=kf-7b-adamw
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
set -euo pipefail

CONFIG="configs/train/7b_16gpu_adamw.toml"

OVERRIDES="$@"

srun --kill-on-bad-exit=1 \\
    uv run python scripts/train.py "${{CONFIG}}" ${{OVERRIDES}} {extra}
"""

# configs/train/7b_16gpu_adamw.toml at 5666d0d (excerpt): dp_shard -1, the GPUs left over
KF_TOML = """[model]
dim = 4096
n_layers = 32
n_heads = 32
n_kv_heads = 8
vocab_size = 128256
ffn_dim_multiplier = 1.3
norm_type = "rmsnorm"
activation = "silu"
max_seq_len = 4096
rope_theta = 500000.0
tie_embeddings = false

[train]
batch_size = 8
seq_len = 4096
grad_accum_steps = 4

[distributed]
dp_shard = {dp_shard}
dp_replicate = 1
tp = 1
pp = 1
"""


def _kf(tmp_path, nodes: int = 4, dp_shard: int = -1, extra: str = ""):
    toml = tmp_path / "configs/train/7b_16gpu_adamw.toml"
    toml.parent.mkdir(parents=True)
    toml.write_text(KF_TOML.format(dp_shard=dp_shard))
    path = tmp_path / "scripts/slurm/7b_requeue.sh"
    path.parent.mkdir(parents=True)
    path.write_text(KF_SCRIPT.format(nodes=nodes, extra=extra))
    return path, toml


def test_a_kempnerforge_slurm_script_reads_the_toml_it_runs_on_the_ranks_srun_starts(tmp_path):
    path, toml = _kf(tmp_path)
    got = api.import_file(str(path))
    assert (got.framework, got.variant) == ("kempnerforge", "launch")
    assert got.request["model"] == "llama-3-8b" and got.sources["model"].startswith(f"{toml} [model]")
    assert got.request["micro_batch_size"] == 8 and got.sources["micro_batch_size"].startswith(f"{toml}:")
    # the TOML leaves dp to the GPUs: srun's 4 nodes x 4 tasks per node
    assert got.request["num_gpus"] == 16 and "#SBATCH --ntasks-per-node" in got.sources["num_gpus"]
    req = api.request_from_config(got)
    assert (req.model, req.num_gpus, req.framework) == ("llama-3-8b", 16, "kempnerforge")


def test_the_tomls_degrees_state_the_count_and_a_launch_that_differs_is_said(tmp_path):
    path, _ = _kf(tmp_path, nodes=6, dp_shard=16)
    got = api.import_file(str(path))
    assert got.request["num_gpus"] == 16 and "validate_world_size" in got.sources["num_gpus"]
    assert any("starts 24 ranks" in u and "refuses the run" in u for u in got.unsupported)


def test_a_commands_override_wins_over_the_toml(tmp_path):
    path, _ = _kf(tmp_path, extra="--train.batch_size=2")
    got = api.import_file(str(path))
    assert got.request["micro_batch_size"] == 2 and f"{path}:" in got.sources["micro_batch_size"]


def test_a_script_taking_its_toml_as_an_argument_is_refused_with_what_to_pass(tmp_path, capsys):
    path, _ = _kf(tmp_path)
    path.write_text(path.read_text().replace('CONFIG="configs/train/7b_16gpu_adamw.toml"', 'CONFIG="${1:?Usage}"'))
    assert main(["import", str(path)]) != 0
    err = capsys.readouterr().err
    assert "Pass the config file the script runs" in err and "Traceback" not in err


def test_srun_starting_the_entry_point_counts_a_rank_per_task(tmp_path):
    script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n" + ONE_PROCESS_SCRIPT.replace(
        "TRANSFORMERS_OFFLINE=1 coverage run", "srun python")
    path, _ = _repo(tmp_path, script)
    got = api.import_file(str(path))
    assert got.request["num_gpus"] == 16 and "#SBATCH --ntasks-per-node" in got.sources["num_gpus"]
