"""What `meshplan import` made of the frameworks' own example and config files (bench/real_configs.py draws them from
the repositories): short excerpts in their formats under tests/data/real_configs/ (README.md there names each
original), each read as the file it imitates is, on the api and the CLI."""

from pathlib import Path

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.model_counts import total_params

DATA = Path(__file__).resolve().parent / "data" / "real_configs"


@pytest.mark.parametrize(("name", "found"), [("pyrightconfig.json", "typeCheckingMode"),
                                             ("golden_values.json", "lm loss, iteration-time")])
def test_a_json_with_no_deepspeed_key_is_refused_with_its_keys(name, found):
    with pytest.raises(MeshplanError) as err:
        api.import_file(str(DATA / name))
    said = str(err.value)
    assert "not a deepspeed ds_config" in said and found in said and "train_micro_batch_size_per_gpu" in said


def test_a_toml_of_no_job_sections_is_refused_not_read_as_torchtitan(capsys):
    assert main(["import", str(DATA / "pyproject.toml")]) == 2
    err = capsys.readouterr().err
    assert "not a torchtitan TOML job file" in err and "build-system, project, tool" in err
    assert "Traceback" not in err


def test_a_ds_config_with_one_known_key_is_still_read():
    imported = api.import_config('{"zero_optimization": {"stage": 2}}', config_format="json")
    assert imported.framework == "deepspeed" and imported.request["zero_stage"] == 2


def _kempnerforge_count(d, layers, heads, kv, vocab, mult, tied):
    """KempnerForge's own ModelConfig.num_params_estimate for a dense model (kempnerforge/config/model.py 5666d0d):
    q/k/v/o, SwiGLU gate/up/down of computed_ffn_hidden_dim, two norms per layer, embedding, output, final norm."""
    h = 256 * -(-int(4 * d * (2 / 3) * mult) // 256)
    hd = d // heads
    attn = d * heads * hd + 2 * d * kv * hd + heads * hd * d
    return layers * (attn + 3 * d * h + 2 * d) + vocab * d + (0 if tied else vocab * d) + d


def test_a_kempnerforge_model_section_builds_the_model_exactly():
    imported = api.import_file(str(DATA / "kempnerforge_13b_tp4_pp2.toml"))
    name = imported.request["model"]
    assert name.startswith("kempnerforge model section: dim=5120 n_layers=40")
    arch = resolve_model(name)
    assert arch.ffn_hidden_size == 17920  # 256 x ceil(int(4 x 5120 x 2/3 x 1.3) / 256)
    assert total_params(arch) == _kempnerforge_count(5120, 40, 40, 8, 128256, 1.3, False) == 14_840_386_560
    # the fields the file leaves out, at ModelConfig's defaults, said
    note = next(n for n in imported.notes if n.startswith("model: the [model] section's architecture"))
    assert "left to its defaults" in note and "norm_type rmsnorm" in note and "activation silu" in note
    assert "ffn_hidden_dim 17920 (computed" in note
    # dp_shard 4 x tp 4 x pp 2 is KempnerForge's world size
    assert imported.request["num_gpus"] == 32
    req = api.request_from_config(imported, {"gpu": "h100"})
    assert api.estimate_memory(req).plan.tp == 4


def test_a_kempnerforge_file_with_ep_states_its_gpu_count_with_the_ep_ranks():
    """KempnerForge's DistributedConfig.validate_world_size: dp_replicate x dp_shard x tp x pp x cp x ep is the world
    size, ep a mesh dimension of its own (configs/train/moe_ep_32gpu.toml: '8 nodes x 4 GPUs', 4 x 4 x 2)."""
    imported = api.import_file(str(DATA / "kempnerforge_moe_ep_32gpu.toml"))
    assert (imported.request["dp"], imported.request["tp"], imported.request["ep"]) == (4, 4, 2)
    assert imported.request["num_gpus"] == 4 * 4 * 2
    assert "ep 2" in imported.sources["num_gpus"]
    req = api.request_from_config(imported, {"gpu": "h100"})
    plan = api.estimate_memory(req).plan
    assert (plan.dp, plan.ep) == (4, 2)  # ep's ranks beside the data-parallel ones, not carved from them


def test_a_catalog_architecture_in_a_model_section_is_the_catalog_model():
    text = (DATA / "kempnerforge_13b_tp4_pp2.toml").read_text()
    text = text.replace("dim = 5120", "dim = 4096").replace("n_layers = 40", "n_layers = 32").replace(
        "n_heads = 40", "n_heads = 32")
    assert api.import_config(text, path="8b.toml").request["model"] == "llama-3-8b"


def test_a_model_section_field_kempnerforge_refuses_is_said_not_built():
    text = (DATA / "kempnerforge_13b_tp4_pp2.toml").read_text().replace("n_kv_heads = 8", "n_kv_heads = 7")
    imported = api.import_config(text, path="bad.toml")
    assert "model" not in imported.request
    assert any("n_heads 40 is not divisible by n_kv_heads 7" in u.said for u in imported.left_to_request)


def test_a_vlm_file_leaves_its_model_to_the_request():
    imported = api.import_file(str(DATA / "kempnerforge_vlm.toml"))
    assert "model" not in imported.request
    said = next(u.said for u in imported.left_to_request if "model" in u.fields)
    assert "[vlm]" in said and "vision encoder" in said


def test_a_bridge_command_held_in_a_variable_and_run_by_bash_lc_is_read():
    imported = api.import_file(str(DATA / "bridge_slurm_pretrain.sh"))
    request = imported.request
    assert imported.framework == "megatron-bridge"
    # PARALLELISM_CONFIG 2,4,8,1 split at IFS=',' into TP PP EP CP, through CLI_OVERRIDES and CMD
    assert (request["tp"], request["pp"], request["ep"], request["cp"]) == (2, 4, 8, 1)
    assert request["global_batch_size"] == 128 and request["seq_length"] == 4096
    # 8 nodes x torch.distributed.run's 4 per node, not srun's one task per node
    assert request["model"] == "qwen3-30b-a3b" and request["num_gpus"] == 32
    assert "$CMD" in imported.sources["tp"]
    # `uv run --no-sync python -m torch.distributed.run ...`: uv's options are not the job's (was '--no-sync = python')
    assert not any("--no-sync" in line for line in imported.unsupported)


def test_a_loop_over_layouts_is_read_once_and_named():
    imported = api.import_file(str(DATA / "bridge_slurm_sft_loop.sh"))
    request = imported.request
    assert (request["tp"], request["pp"], request["ep"], request["cp"]) == (4, 1, 8, 1)
    assert request["sequence_parallel"] is True
    # srun starts `bash -c "$CMD"` once per task: #SBATCH --nodes 2 x --ntasks-per-node 8 ranks
    assert request["num_gpus"] == 16 and "#SBATCH --ntasks-per-node" in imported.sources["gpus_per_node"]
    loop = next(a for a in imported.assumed if "`for CONFIG in ...`" in a)
    assert "runs its body 3 times" in loop and "4,1,8,1,True; 2,2,8,1,True; 2,1,8,2,True" in loop
    assert "read once, with CONFIG = 4,1,8,1,True" in loop


def test_a_loop_over_a_command_output_is_still_not_run():
    from meshplan.adapters.read.shell import read_script

    script = read_script("for N in $(seq 1 4); do\n  X=$N\ndone\n", "s.sh")
    assert "X" not in script.env and not script.loops
    assert any("a `for` block is not run" in u for u in script.unresolved)


def test_a_verl_hydra_yaml_is_read_as_its_overrides():
    imported = api.import_file(str(DATA / "verl_multiturn_grpo.yaml"))
    assert imported.framework == "verl" and imported.variant == "megatron"  # defaults: ppo_megatron_trainer
    request = imported.request
    assert request["model"] == "Qwen/Qwen2.5-3B-Instruct" and request["tp"] == 2 and request["num_gpus"] == 8
    assert request["prompts_per_step"] == 256 and request["samples_per_prompt"] == 8
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in imported.sources["tp"]
    said = next(a for a in imported.assumed if "ppo_megatron_trainer" in a)
    assert "not given" in said and "_self_" not in said
    # the same keys as a launch script's overrides read the same
    script = ("python3 -m verl.trainer.main_ppo --config-name ppo_megatron_trainer data.max_prompt_length=1024 "
              "data.max_response_length=1024 data.train_batch_size=256 "
              "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct "
              "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=sglang "
              "actor_rollout_ref.rollout.n=8 algorithm.adv_estimator=grpo trainer.nnodes=1 trainer.n_gpus_per_node=8\n")
    from_script = api.import_config(script, path="run.sh")
    assert {k: v for k, v in from_script.request.items() if k != "expandable_segments"} == \
        {k: v for k, v in request.items() if k != "expandable_segments"}


def test_a_skyrl_trainer_yaml_is_read_and_plans():
    imported = api.import_file(str(DATA / "skyrl_trainer.yaml"))
    assert imported.framework == "skyrl" and imported.request["num_gpus"] == 4
    assert imported.request["algorithm"] == "grpo" and imported.request["global_batch_size"] == 320
    # its model, Qwen2.5-1.5B-Instruct, is not in the catalog: refused with the file's line, and planned with one beside
    with pytest.raises(MeshplanError, match=r"Unknown model 'Qwen/Qwen2.5-1.5B-Instruct' \(read from the file: model "
                                            r"at .*skyrl_trainer.yaml:9 trainer.policy.model.path\)"):
        api.request_from_config(imported, {"gpu": "h100"})
    req = api.request_from_config(imported, {"gpu": "h100", "model": "qwen2.5-7b"})
    assert req.framework == "skyrl" and req.num_gpus == 4
    assert api.estimate_memory(req).model == "Qwen2.5-7B"


def test_a_yaml_of_neither_config_is_still_refused_with_its_keys():
    """Refused naming every YAML config meshplan tells by its keys, SkyRL's trainer and generator among them (it had
    named only AutoModel's recipe and verl's SFT config: a SkyRL file missing `trainer:` was told nothing of SkyRL)."""
    with pytest.raises(MeshplanError, match="cannot tell which framework this YAML file is for") as exc:
        api.import_config("agent_cls: x.Agent\ntools:\n  enable_bash_tool: true\ngenerator:\n  n: 8\n",
                          config_format="yaml")
    for config in ("SkyRL's RL trainer config (`trainer:` and `generator:`)", "verl's RL trainer config "
                   "(`actor_rollout_ref:`)", "(`MODEL_ARGS:`)", "a NeMo AutoModel recipe", "verl's SFT trainer config"):
        assert config in str(exc.value), config
    assert "skyrl" in exc.value.fix


def test_a_megatron_functional_test_model_config_is_read_as_its_launch_line():
    imported = api.import_file(str(DATA / "megatron_model_config.yaml"))
    request, sources = imported.request, imported.sources
    assert imported.framework == "megatron-core"
    assert (request["tp"], request["pp"], request["micro_batch_size"], request["global_batch_size"]) == (2, 2, 4, 32)
    assert request["recompute"] == "full" and request["sequence_parallel"] is False
    assert sources["tp"].endswith("megatron_model_config.yaml:16 --tensor-model-parallel-size")  # the YAML's line
    assert request["model"].startswith("megatron-core flags: --num-layers 12 --hidden-size 512")
    assert any("read as pretrain_gpt.py's" in a and "GPU count" in a for a in imported.assumed)
    assert not any("TENSORBOARD_PATH" in u for u in imported.unresolved)  # values kept literal, never expanded


def test_a_functional_test_with_gpt2s_bpe_files_builds_its_model_with_gpt2s_vocabulary():
    """--vocab-file without --tokenizer-type runs pretrain_gpt.py's default GPT2BPETokenizer, whose vocabulary is
    GPT-2's 50,257 (the card's read.tokenizer_vocab): the model builds, said as assumed (the files are not read)."""
    imported = api.import_file(str(DATA / "megatron_gpt2bpe_model_config.yaml"))
    name = imported.request["model"]
    assert name.startswith("megatron-core flags: --num-layers 32") and "--tokenizer-type GPT2BPETokenizer" in name
    arch = resolve_model(name)
    assert arch.vocab_size == 50257
    h, f, layers, kv, hd = 3072, 8192, 32, 8, 128  # untied, SwiGLU, GQA, RMSNorm, no biases, rope
    per_layer = h * 32 * hd + 2 * h * kv * hd + 32 * hd * h + 3 * h * f + 2 * h
    assert total_params(arch) == layers * per_layer + 2 * 50257 * h + h
    said = next(a for a in imported.assumed if a.startswith("model: vocab_size 50,257"))
    assert "GPT2BPETokenizer" in said and "GPT-2's BPE files" in said and "--make-vocab-size-divisible-by x tp" in said
    # the GPU count given beside the file, it plans; at tp 2 the estimate pads 50,257 to 128 x 2 x 197 = 50,432
    req = api.request_from_config(imported, {"num_gpus": 8, "gpu": "h100", "tp": 2})
    assert req.model == name and req.num_gpus == 8
    assert "Vocabulary padded to 50432 (multiple of 128*tp)." in api.estimate_memory(req).assumptions
    # a tokenizer whose vocabulary is its own file's still names what to add
    text = (DATA / "megatron_gpt2bpe_model_config.yaml").read_text().replace(
        "  --vocab-file:", "  --tokenizer-type: Llama2Tokenizer\n  --vocab-file:")
    unread = " ".join(api.import_config(text, path="model_config.yaml").unresolved)
    assert "--tokenizer-type Llama2Tokenizer: its vocabulary is its file's" in unread and "add --vocab-size N" in unread
    # --vocab-size given wins over the tokenizer's
    text = (DATA / "megatron_gpt2bpe_model_config.yaml").read_text().replace(
        "  --vocab-file:", "  --vocab-size: 32000\n  --vocab-file:")
    assert resolve_model(api.import_config(text, path="model_config.yaml").request["model"]).vocab_size == 32000


def test_a_file_without_its_gpu_count_names_the_flag_and_every_face_takes_it(capsys):
    """A Megatron-LM functional test's model_config.yaml states no GPU count (its CI recipe does): the refusal and
    import's next step name --num-gpus, and the CLI's check, the api and the MCP tools take it beside the file."""
    path = DATA / "megatron_gpt2bpe_model_config.yaml"
    imported = api.import_file(str(path))
    with pytest.raises(MeshplanError, match=r"GPU count is not read") as refused:
        api.request_from_config(imported)
    assert "--num-gpus" in refused.value.fix and "num_gpus argument" in refused.value.fix
    assert main(["import", str(path)]) == 0
    assert f"next: meshplan check --config {path} --num-gpus NUM_GPUS" in capsys.readouterr().out
    assert api.request_from_config(imported, {"num_gpus": 16}).num_gpus == 16
    assert main(["check", "--config", str(path), "--num-gpus", "16", "--gpu", "h100"]) in (0, 1)
    out = capsys.readouterr().out
    assert "TP1 PP2 DP8" in out and "GPU count is not read" not in out
    answer = tools.check_config(config_text=path.read_text(), config_format="yaml", gpu="h100", num_gpus=16)
    assert answer.plan.dp == 8


def test_a_config_files_own_usage_comment_states_its_gpu_count_said_as_assumed():
    """KempnerForge's configs/train/7b_16gpu_fp8.toml leaves dp_shard to the GPUs left over and launches itself in a
    comment, srun --nodes=4 --ntasks-per-node=4 (a rank per task): 16 GPUs, read as the file's word, not a setting."""
    text = (DATA / "kempnerforge_7b_16gpu_fp8.toml").read_text()
    imported = api.import_config(text, path="configs/train/7b_16gpu_fp8.toml")
    assert imported.request["num_gpus"] == 4 * 4
    assert "comment's nodes 4" in imported.sources["num_gpus"]
    assert "comment's ranks per node 4" in imported.sources["num_gpus"]
    assert any(a.startswith("num_gpus: read from the file's own usage comment (line 5") for a in imported.assumed)
    assert api.request_from_config(imported, {"gpu": "h100"}).num_gpus == 16
    # a comment that names another file is not this file's launch
    assert "num_gpus" not in api.import_config(text, path="configs/train/other.toml").request
    # comments that launch it more than one way (configs/train/7b.toml: one GPU, torchrun 4, sbatch 4 nodes) state none
    ways = text.replace("# Usage:", "# Single GPU:  python scripts/train.py configs/train/7b_16gpu_fp8.toml\n# Usage:")
    imported = api.import_config(ways, path="configs/train/7b_16gpu_fp8.toml")
    assert "num_gpus" not in imported.request
    assert any("launch it more than one way" in n for n in imported.notes)


def test_a_usage_comment_the_file_calls_a_placeholder_or_its_layout_does_not_tile_is_not_read():
    """NeMo AutoModel's recipes share 'To run this recipe: automodel FILE --nproc-per-node 8 / Adjust --nproc-per-node
    to the number of GPUs available on your machine' (gpt_oss_20b_single_gpu_peft.yaml too): a placeholder, not
    read. Without that line, gpt_oss_120b.yaml's ep_size 64 still cannot run on the comment's 8 GPUs: not read."""
    text = (DATA / "automodel_gpt_oss_120b.yaml").read_text()
    path = "examples/llm_finetune/gpt_oss/gpt_oss_120b.yaml"
    imported = api.import_config(text, path=path)
    assert "num_gpus" not in imported.request
    assert any("is a placeholder its line 3 says to adjust" in n for n in imported.notes)
    text = text.replace("# Adjust --nproc-per-node to the number of GPUs available on your machine.\n", "")
    imported = api.import_config(text, path=path)
    assert "num_gpus" not in imported.request
    assert any("launches 8 GPUs, which its own layout (tp 1 x pp 1 x cp 1 x ep 64) does not tile" in n
               for n in imported.notes)
    imported = api.import_config(text.replace("ep_size: 64", "ep_size: 8"), path=path)
    assert imported.request["num_gpus"] == 8 and imported.request["gpus_per_node"] == 8


def test_a_verl_script_that_sets_no_trainer_world_runs_on_verls_default():
    """verl's main_ppo runs trainer.nnodes x trainer.n_gpus_per_node GPUs, 1 x 8 in ppo_trainer.yaml: a script that
    sets neither (examples/rollout_correction/run_with_rollout_corr.sh) runs on 8, stated as the default."""
    imported = api.import_file(str(DATA / "verl_rollout_corr.sh"))
    assert imported.request["num_gpus"] == 8 and imported.defaults["num_gpus"] == 8
    assert "read.trainer_world" in imported.sources["num_gpus"]
    assert api.request_from_config(imported, {"gpu": "h100"}).num_gpus == 8
    text = (DATA / "verl_rollout_corr.sh").read_text()
    set_two = api.import_config(text.replace("trainer.total_epochs=10", "trainer.nnodes=2 trainer.n_gpus_per_node=8"),
                                path="run.sh")
    assert set_two.request["num_gpus"] == 16 and "trainer.nnodes" in set_two.sources["num_gpus"]
    unset = api.import_config(text.replace("trainer.total_epochs=10", "trainer.n_gpus_per_node=$GPUS"), path="run.sh")
    assert "num_gpus" not in unset.request  # a key without a value is said, never defaulted over


def test_a_tiktokenizer_without_vocab_size_builds_megatrons_default_vocabulary():
    """Megatron-LM's TikTokenizer takes --vocab-size where given, else DEFAULT_TIKTOKEN_MAX_VOCAB 2**17."""
    name = ("megatron-core flags: --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
            "--max-position-embeddings 512 --tokenizer-type TikTokenizer")
    assert resolve_model(name).vocab_size == 131072
    assert resolve_model(name + " --vocab-size 1000").vocab_size == 1000


@pytest.mark.parametrize(("path", "extra", "said"), [
    ("tests/functional_tests/test_cases/bert/bert_tp2/model_config.yaml", "", "of BERT"),
    ("model_config.yaml", "MODE: inference\n", "MODE inference"),
    ("model_config.yaml", "", "of T5"),
])
def test_a_functional_test_meshplan_does_not_plan_is_refused(path, extra, said):
    text = (DATA / "megatron_model_config.yaml").read_text() + extra
    if said == "of T5":
        text = text.replace("  --num-layers: 12\n", "  --encoder-num-layers: 12\n  --decoder-num-layers: 12\n")
    with pytest.raises(MeshplanError, match=said):
        api.import_config(text, path=path)


MLM_CI = DATA / "megatron_ci"
MLM_CASE = "tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp2_pp2_resume_torch_dist/model_config.yaml"


def test_a_functional_test_in_its_checkout_runs_on_its_ci_recipes_gpus():
    """Megatron-LM's CI runs a test_cases/{model}/{test_case}/model_config.yaml as the recipes listing it allocate:
    recipe_parser.flatten_workload's spec with each products row over it, nodes x GPUs per node (gb200's script
    exports GPUS_PER_NODE={gpus}: 2 x 4; h100's leaves _run_training.sh's default 8: 1 x 8)."""
    imported = api.import_file(str(MLM_CI / MLM_CASE))
    assert imported.request["num_gpus"] == 8
    assert "recipes/gb200/gpt.yaml:29" in imported.sources["num_gpus"]  # the line listing the test case
    said = next(a for a in imported.assumed if a.startswith("num_gpus: 8, the CI recipe's workload"))
    assert "not a setting of the file" in said and "3 more agreeing" in said
    assert not any("num_gpus" in u.fields for u in imported.left_to_request)
    req = api.request_from_config(imported, {"gpu": "h100"})
    assert (req.num_gpus, req.tp, req.pp) == (8, 2, 2)


def _ci_copy(tmp_path, recipe_edit=None):
    import shutil

    root = tmp_path / "Megatron-LM"
    shutil.copytree(MLM_CI, root)
    if recipe_edit:
        recipe = root / "tests/test_utils/recipes/gb200/gpt.yaml"
        recipe.write_text(recipe_edit(recipe.read_text()))
    return root


def test_ci_recipes_that_disagree_on_the_count_leave_it_unread(tmp_path):
    root = _ci_copy(tmp_path, lambda t: t.replace("  nodes: 2\n", "  nodes: 1\n"))  # gb200: 1 x 4, h100: 1 x 8
    imported = api.import_file(str(root / MLM_CASE))
    assert "num_gpus" not in imported.request
    note = next(n for n in imported.notes if n.startswith("num_gpus: the CI recipes"))
    assert "do not agree on one GPU count" in note and "nodes 1 x 4 per node" in note and "nodes 1 x 8" in note
    with pytest.raises(MeshplanError, match="GPU count is not read"):
        api.request_from_config(imported)


def test_a_recipe_gpus_the_launcher_does_not_start_is_not_read(tmp_path):
    # no GPUS_PER_NODE export: _run_training.sh starts its default 8 per node, not the 4 the recipe allocates
    root = _ci_copy(tmp_path, lambda t: t.replace("    export GPUS_PER_NODE={gpus}\n", ""))
    imported = api.import_file(str(root / MLM_CASE))
    assert "num_gpus" not in imported.request
    assert any("nodes 2 x gpus 4, while its launcher starts 8 per node" in n for n in imported.notes)


def test_a_test_case_no_recipe_lists_is_said(tmp_path):
    root = _ci_copy(tmp_path)
    other = root / MLM_CASE.replace("gpt3_mcore_te_tp2_pp2_resume_torch_dist", "gpt3_mcore_reruns_disable")
    other.parent.mkdir(parents=True)
    other.write_text((root / MLM_CASE).read_text())
    imported = api.import_file(str(other))
    assert "num_gpus" not in imported.request
    assert any("no CI recipe under tests/test_utils/recipes lists test case gpt3_mcore_reruns_disable" in n
               for n in imported.notes)


def test_an_automodel_recipe_runs_on_the_gpus_its_ci_block_launches():
    """AutoModel's CI launches a recipe as torchrun --nproc-per-node=${CONFIG_NPROC_PER_NODE}
    --nnodes=${TEST_NODE_COUNT} (tests/ci_tests/scripts/finetune_launcher.sh; generate_ci_tests.py CI_KEY_TO_VAR:
    ci.nproc_per_node, ci.nodes, 1 node where left out): the recipe's ci: block is its GPU count where its settings
    give none."""
    imported = api.import_file(str(DATA / "automodel_ci_nproc.yaml"))
    assert imported.request["num_gpus"] == 4 and imported.request["ep"] == 4
    assert imported.sources["num_gpus"].endswith("automodel_ci_nproc.yaml:30 ci.nproc_per_node")
    said = next(a for a in imported.assumed if "AutoModel's CI run of the recipe" in a)
    assert said.startswith("num_gpus: 1 x 4") and "no ci.nodes: 1 node" in said
    req = api.request_from_config(imported, {"gpu": "h100"})
    assert (req.model, req.num_gpus, req.ep) == ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 4, 4)


@pytest.mark.parametrize(("ci", "said"), [
    ("ci:\n  nodes: 2\n", "AutoModel's CI runs the recipe on 2 node(s) of its cluster's default GPUs per node"),
    ("ci:\n  nodes: 2\n  nproc_per_node: 4\n  node_multiplier: true\n", "scales the recipe's nodes at run time"),
])
def test_an_automodel_ci_block_without_a_count_is_said_not_read(ci, said):
    text = (DATA / "automodel_ci_nproc.yaml").read_text().split("ci:\n")[0] + ci
    imported = api.import_config(text, path="recipe.yaml")
    assert "num_gpus" not in imported.request
    assert any(said in n for n in imported.notes)


def test_an_automodel_ci_block_with_nodes_counts_them():
    text = (DATA / "automodel_ci_nproc.yaml").read_text().replace("  nproc_per_node: 4\n",
                                                                  "  nodes: 2\n  nproc_per_node: 4\n")
    imported = api.import_config(text, path="recipe.yaml")
    assert imported.request["num_gpus"] == 8
    assert "ci.nodes" in imported.sources["num_gpus"] and "ci.nproc_per_node" in imported.sources["num_gpus"]


def test_a_verl_trainer_yaml_at_its_defaults_is_read_not_refused():
    """verl's own trainer YAMLs (tests/trainer/config/legacy_ppo_trainer.yaml, _generated_ppo_trainer.yaml) hold its
    defaults: lora_rank 0 (no LoRA: fsdp_workers.py _is_lora = lora_rank > 0), null micro-batch sizes (OmegaConf's
    None: unset) and rollout.name ??? (OmegaConf's MISSING, for the launch to give); each was refused as an invalid
    value ('0 is not a valid lora_rank', "'null' is not a whole number", "'???' is not a valid rollout_engine")."""
    imported = api.import_file(str(DATA / "verl_legacy_ppo_trainer.yaml"))
    request = imported.request
    assert "lora_rank" not in request and request.get("job") == "rl"
    assert request["micro_batch_size"] == 8 and "rollout_engine" not in request
    notes = " | ".join(imported.notes)
    assert "model.lora_rank = 0: no LoRA (verl's default)" in notes
    assert "actor.ppo_micro_batch_size = null: the framework's default" in notes
    assert "rollout.log_prob_micro_batch_size_per_gpu = null: the framework's default" in notes
    assert "rollout.name = ???: OmegaConf's missing value" in notes
    req = api.request_from_config(imported, {"gpu": "h100"})
    assert (req.num_gpus, req.lora_rank, req.micro_batch_size) == (8, None, 8)


def test_a_verl_lora_rank_above_zero_is_still_a_lora_job():
    text = (DATA / "verl_legacy_ppo_trainer.yaml").read_text().replace("lora_rank: 0", "lora_rank: 32")
    imported = api.import_config(text, path="ppo_trainer.yaml")
    assert imported.request["lora_rank"] == 32
    assert imported.sources["lora_rank"].endswith(":14 actor_rollout_ref.model.lora_rank")


AUTOMODEL_CLI = DATA / "automodel_cli"


def test_automodels_cli_reads_its_positional_recipe_with_the_overrides_and_nproc():
    """`automodel RECIPE.yaml --nproc-per-node 8 --distributed.tp_size 2` (the recipes' own 'To run this recipe' line,
    nemo_automodel/cli/app.py: the recipe positional, --nproc-per-node argparse's, the rest parse_cli_argv's
    overrides): refused before as a shell file of no framework."""
    imported = api.import_file(str(AUTOMODEL_CLI / "scripts" / "benchmark_llama3_1_8b.sh"))
    assert imported.framework == "nemo-automodel"
    assert imported.request["model"] == "meta-llama/Llama-3.1-8B" and imported.request["lora_rank"] == 16
    assert imported.request["tp"] == 2 and "--distributed.tp_size" in imported.sources["tp"]
    assert imported.request["num_gpus"] == 8 and "automodel --nproc-per-node" in imported.sources["num_gpus"]
    assert imported.sources["global_batch_size"].endswith("llama3_1_8b_peft_benchmark.yaml:8 "
                                                          "step_scheduler.global_batch_size")
    req = api.request_from_config(imported, {"gpu": "h100"})
    assert (req.tp, req.num_gpus) == (2, 8)


def test_automodels_cli_module_under_torchrun_runs_on_torchruns_ranks():
    """slurm.sub's `torchrun ... -m nemo_automodel.cli.app ${CONFIG}`: the CLI runs the recipe in-process on
    torchrun's 2 x 8 ranks (InteractiveLauncher); the override written `--a.b=v`."""
    imported = api.import_file(str(AUTOMODEL_CLI / "scripts" / "torchrun_app.sh"))
    assert imported.request["num_gpus"] == 16 and imported.request["tp"] == 4
    assert any("in-process on its ranks" in n for n in imported.notes)


def test_automodels_cli_without_a_count_or_a_recipe_says_which(tmp_path):
    """No --nproc-per-node: the CLI takes every GPU of the node, which the script does not say (left to the request);
    no recipe: refused with the CLI's own usage."""
    script = (AUTOMODEL_CLI / "scripts" / "benchmark_llama3_1_8b.sh").read_text()
    at = AUTOMODEL_CLI / "scripts" / "x.sh"
    no_count = api.import_config(script.replace(" --nproc-per-node 8", ""), path=str(at))
    assert "num_gpus" not in no_count.request
    assert any("every GPU of the node" in line for line in no_count.unresolved)
    assert api.request_from_config(no_count, {"num_gpus": 8, "gpu": "h100"}).num_gpus == 8
    with pytest.raises(MeshplanError) as err:
        api.import_config("#!/bin/bash\nautomodel --nproc-per-node 8\n", path=str(at))
    assert "no recipe YAML is given" in str(err.value) and "automodel <config.yaml>" in str(err.value)


KEMPNERFORGE = DATA / "kempnerforge_repo"


def test_a_kempnerforge_benchmark_reads_its_launch_functions_first_call():
    """benchmarks/moe_packed/retry_e64.sh: `run_experiment NAME "ARGS"` twice, the function's body launching `srun ...
    python scripts/train.py configs/train/debug.toml $args ...`: read with the first call's arguments ($1, $2 and
    `local args="$2"`), every call said. Refused before ('no command launches scripts/train.py')."""
    imported = api.import_file(str(KEMPNERFORGE / "benchmarks" / "moe_packed" / "retry_e64.sh"))
    request = imported.request
    assert imported.framework == "kempnerforge"
    assert (request["ep"], request["dp"], request["num_gpus"], request["micro_batch_size"]) == (4, 2, 8, 1)
    assert request["model"].startswith("kempnerforge model section: dim=2048 n_layers=24") and \
        "num_experts=64" in request["model"]
    said = next(a for a in imported.assumed if "the function `run_experiment` is called 2 times" in a)
    assert "05b_8gpu_moe_e64_fsdp2_ep4_unpacked_bs1" in said
    assert "line 61: 06b_8gpu_moe_e64_fsdp2_ep4_packed_bs1" in said
    assert api.request_from_config(imported, {"gpu": "h200"}).num_gpus == 8


def test_a_kempnerforge_script_whose_config_is_its_own_argument_is_refused_with_the_argument_named():
    """scripts/slurm/multinode.sh: CONFIG="${1:?Usage: ...}" then `srun ... python scripts/train.py "${CONFIG}"`: the
    TOML is given when the script runs, not in it (said before as 'an empty word')."""
    with pytest.raises(MeshplanError) as err:
        api.import_file(str(KEMPNERFORGE / "scripts" / "slurm" / "multinode.sh"))
    said = str(err.value)
    assert "the config TOML is CONFIG, set at line 33 from the script's own argument $1" in said
    assert "meshplan import configs/train/7b.toml" in said and "an empty word" not in said


def test_a_kempnerforge_loop_over_stated_tomls_is_a_job_each_and_a_glob_is_refused():
    """`for CONFIG in A.toml B.toml; do srun python scripts/train.py $CONFIG; done`: each path a job, the first read
    and every one said; a loop over a glob (files the script does not state) is refused, naming the loop."""
    at = KEMPNERFORGE / "scripts" / "slurm" / "sweep.sh"
    loop = ("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n"
            "for CONFIG in configs/train/debug.toml configs/train/7b.toml; do\n"
            "    srun uv run python scripts/train.py \"$CONFIG\" --distributed.dp_shard=4\ndone\n")
    imported = api.import_config(loop, path=str(at))
    assert imported.request["dp"] == 4 and "configs/train/debug.toml" in imported.sources["micro_batch_size"]
    said = next(a for a in imported.assumed if "`for CONFIG in ...` runs its body 2 times" in a)
    assert "configs/train/debug.toml; configs/train/7b.toml" in said
    array = loop.replace("for CONFIG in configs/train/debug.toml configs/train/7b.toml",
                         "CONFIGS=(configs/train/debug.toml configs/train/7b.toml)\nfor CONFIG in ${CONFIGS[@]}")
    assert api.import_config(array, path=str(at)).request["dp"] == 4  # an array's words: stated, no glob
    with pytest.raises(MeshplanError) as err:
        api.import_config(loop.replace("configs/train/debug.toml configs/train/7b.toml", "configs/train/*.toml"),
                          path=str(at))
    said = str(err.value)
    assert "sweep.sh:5: the command launching scripts/train.py is inside a block meshplan cannot read statically" in \
        said and "sweep.sh:4 a `for` block is not run" in said
