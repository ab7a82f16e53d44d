"""`meshplan import` and `--config`: real upstream files read into the request, field by field with their line.

The files under tests/configs/ are kept verbatim; tests/configs/SOURCES.txt names each one's repository, path and
commit. Every stated field is asserted; a rendered config read back gives the request it was rendered from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read import import_config, import_file
from meshplan.adapters.read.keys import convert
from meshplan.adapters.read.shell import read_script
from meshplan.core.errors import MeshplanError
from meshplan.faces import cli
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CONFIGS = Path(__file__).parent / "configs"


def imported(name: str, **kw):
    return import_file(str(CONFIGS / name), **kw)


def line_of(result, field: str) -> int:
    return int(result.sources[field].split(":", 1)[1].split(" ", 1)[0])


# --------------------------------------------------------------------------- every upstream file, every field

EXPECTED = {
    # NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh: bash arrays, an fp8 `if`, ${1:-...} defaults
    "megatron_llama3_8b_h100_fp8.sh": ("megatron-core", {
        "model": "llama-3-8b", "num_gpus": 8, "gpus_per_node": 8, "seq_length": 8192, "tp": 1, "cp": 1,
        "micro_batch_size": 1, "global_batch_size": 128, "sequence_parallel": True, "zero_stage": 1,
        "precision": "fp8", "fp8_param_gather": True, "grad_reduce_in_fp32": False, "attention_backend": "fused",
        "dropout": False, "tp_comm_overlap": False}),
    # NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh: no --use-distributed-optimizer, no SP
    "megatron_gpt3_175b.sh": ("megatron-core", {
        "model": "gpt3-175b", "num_gpus": 8, "tp": 8, "pp": 16, "micro_batch_size": 1, "global_batch_size": 1536,
        "seq_length": 2048, "zero_stage": 0, "sequence_parallel": False}),
    # NVIDIA/Megatron-LM examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh: Megatron-FSDP
    "megatron_fsdp_llama3_8b.sh": ("megatron-core", {
        "model": "llama-3-8b", "num_gpus": 8, "zero_stage": 3, "precision": "fp8", "seq_length": 8192,
        "micro_batch_size": 1, "global_batch_size": 128}),
    # deepspeedai/Megatron-DeepSpeed examples_deepspeed/pretrain_llama2_distributed.sh: a heredoc ds_config
    "mds_pretrain_llama2.sh": ("deepspeed", {
        "num_gpus": 8, "tp": 2, "pp": 2, "seq_length": 2048, "zero_stage": 0, "micro_batch_size": 4,
        "global_batch_size": 32}),
    "ds_finetune_hf_llama.json": ("deepspeed", {
        "global_batch_size": 256, "micro_batch_size": 16, "zero_stage": 0, "tp": 1, "pp": 1}),
    "ds_zero_stage_1_baseline.json": ("deepspeed", {"global_batch_size": 512, "zero_stage": 1, "tp": 1, "pp": 1}),
    # volcengine/verl examples: Hydra overrides, ppo_mini_batch_size in prompts
    "verl_qwen2_7b_math_megatron.sh": ("verl", {
        "job": "rl", "algorithm": "grpo", "model": "Qwen/Qwen2-7B-Instruct", "num_gpus": 8, "tp": 2, "pp": 2,
        "micro_batch_size": 4, "prompts_per_step": 1024, "prompt_length": 1024, "response_length": 1024,
        "samples_per_prompt": 5, "rollout_tp": 2, "rollout_engine": "vllm",
        "rollout_memory_fraction": 0.6}),
    "verl_qwen3moe_30b_megatron_96gb.sh": ("verl", {
        "algorithm": "dapo",  # adv_estimator grpo with use_kl_loss and use_kl_in_reward False: no reference model
        "model": "Qwen/Qwen3-30B-A3B-Base", "num_gpus": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 8, "etp": 1,
        "param_offload": True, "optimizer_offload": True, "optimizer_offload_fraction": 1.0,
        "micro_batch_size": 1,  # use_dynamic_bsz: a budget of prompt + response tokens, not the script's 2
        "samples_per_prompt": 16, "prompt_length": 2048, "response_length": 8192, "rollout_tp": 4,
        "bias_activation_fusion": True}),  # override_transformer_config.bias_activation_fusion=True
    # verl's one-step-off recipe (verl.experimental.one_step_off_policy.main_ppo): the rollout on a pool of its own,
    # rollout.nnodes x rollout.n_gpus_per_node (2 nodes x 2), beside the trainer's 2 x 6; once refused (no launcher)
    "verl_one_step_off_dapo_7b_megatron.sh": ("verl", {
        "job": "rl", "algorithm": "dapo", "placement": "separate", "rollout_gpus": 4, "num_gpus": 16, "tp": 2,
        "pp": 2, "rollout_tp": 2, "samples_per_prompt": 12, "prompts_per_step": 512, "gpus_per_node": None}),
    # NovaSky-AI/SkyRL examples/train/megatron: the megatron and FSDP strategies
    "skyrl_run_megatron.sh": ("skyrl", {
        # no recompute key: SkyRL's Megatron default (transformer_config_kwargs full, uniform, 1 layer), not none
        "recompute": "full", "recompute_method": "uniform", "recompute_layers": 1,
        "model": "Qwen/Qwen3-0.6B", "num_gpus": 4, "tp": 2, "pp": 2, "cp": 1, "zero_stage": 1,
        "micro_batch_size": 4, "prompts_per_step": 128, "samples_per_prompt": 5,
        "prompt_length": 512, "response_length": 1024, "rollout_tp": 1}),
    "skyrl_run_fsdp_baseline.sh": ("skyrl", {
        "model": "Qwen/Qwen3-0.6B", "num_gpus": 4, "zero_stage": 3, "tp": 1, "micro_batch_size": 4,
        "recompute": "full"}),  # trainer.gradient_checkpointing left at SkyRL's True
    # SkyRL's SFT entry point with strategy=fsdp and a LoRA (main_sft's SFTConfig: model.lora, fsdp_config): once read
    # as the Megatron strategy (zero_stage 1) with the LoRA keys "no meshplan field"; then as job sft beside the rank,
    # which the request refuses: a LoRA job
    "skyrl_run_sft_lora.sh": ("skyrl", {
        "job": "lora", "model": "Qwen/Qwen2.5-0.5B-Instruct", "num_gpus": 1, "zero_stage": 3, "tp": 1, "pp": 1,
        "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 512, "lora_rank": 32,
        "lora_targets": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "param_offload": False}),
    # SkyRL's DAPO example: its own entry point (examples.train.algorithms.dapo.main_dapo, main_base's config), once
    # taken for verl's (main_dapo) and then refused; grpo with use_kl_loss=false is meshplan's dapo
    "skyrl_run_dapo_gsm8k.sh": ("skyrl", {
        "job": "rl", "algorithm": "dapo", "model": "Qwen/Qwen2.5-1.5B-Instruct", "num_gpus": 4, "zero_stage": 3,
        "micro_batch_size": 64, "prompts_per_step": 1024, "samples_per_prompt": 5, "prompt_length": 512,
        "response_length": 1024, "rollout_tp": 1, "rollout_engine": "vllm", "rollout_memory_fraction": 0.8,
        "rollout_enforce_eager": True}),
    # pytorch/torchtitan 238fa99: the 0.2-generation TOML job files
    "torchtitan_llama3_8b.toml": ("torchtitan", {
        "model": "llama-3.1-8b", "seq_length": 8192, "tp": 1, "pp": 1, "cp": 1, "recompute": "selective",
        "selective_ac_option": "op", "torch_compile": False, "zero_stage": 3, "micro_batch_size": 1}),
    "torchtitan_llama3_70b.toml": ("torchtitan", {
        "model": "llama-3.1-70b", "seq_length": 8192, "tp": 8, "recompute": "full", "micro_batch_size": 8,
        "zero_stage": 3}),
    # KempnerInstitute/KempnerForge configs/train
    "kempnerforge_7b_16gpu_fp8.toml": ("kempnerforge", {
        "model": "llama-3-8b", "micro_batch_size": 8, "seq_length": 4096, "precision": "fp8",
        "recompute": "full", "torch_compile": True, "zero_stage": 3}),
    "kempnerforge_70b_32gpu_tp4_pp4.toml": ("kempnerforge", {
        "model": "llama-3-70b", "tp": 4, "pp": 4, "dp": 2, "zero_stage": 3, "micro_batch_size": 1,
        "global_batch_size": 1 * 4 * 2, "recompute": "full", "torch_compile": False, "seq_length": 4096}),
    # NVIDIA-NeMo/Megatron-Bridge run_recipe.py launches
    "bridge_qwen3_vl_peft_energon.sh": ("megatron-bridge", {
        "num_gpus": 1, "seq_length": 4096, "global_batch_size": 2, "micro_batch_size": 1}),
    "bridge_qwen3_600m_sft_128k.sh": ("megatron-bridge", {"num_gpus": 8}),
    # NVIDIA/Megatron-LM 651cc107 (2021): `sh -c "${run_cmd}"` under srun, --checkpoint-activations
    "megatron_gpt3_175b_2021.sh": ("megatron-core", {
        "model": "gpt3-175b", "tp": 8, "pp": 16, "seq_length": 2048, "micro_batch_size": 1,
        "global_batch_size": 1536, "recompute": "full", "zero_stage": 0}),
    # bigscience-workshop/bigscience tr11-176B-ml.slurm (BLOOM): Megatron-DeepSpeed under srun bash -c "$LAUNCHER $CMD",
    # #SBATCH --nodes, a commented-out flag ending in a backslash, ALiBi and --pad-vocab-size-to
    "mds_bloom_176b.slurm": ("deepspeed", {
        "model": "bloom-176b", "num_gpus": 24 * 8, "gpus_per_node": 8, "tp": 4, "pp": 12, "seq_length": 2048,
        "recompute": "full", "zero_stage": 0, "micro_batch_size": 2, "global_batch_size": 2048}),
    # NVIDIA-NeMo/Automodel examples/llm_benchmark: recipe YAMLs (distributed, step_scheduler, model.backend, peft)
    "automodel_deepseek_v3_te_deepep.yaml": ("nemo-automodel", {
        "model": "deepseek-ai/DeepSeek-V3", "global_batch_size": 256, "tp": 1, "cp": 1, "pp": 4, "ep": 64,
        "sequence_parallel": False, "recompute": "full", "zero_stage": 3, "moe_token_dispatcher": "flex",
        "attention_backend": "fused", "micro_batch_size": 1, "seq_length": 4096,
        "vpp": 7}),  # layers_per_stage 2: ceil(61 / 2) = 31 virtual stages, rounded down to 28 = 4 x 7
    "automodel_llama3_3_70b_instruct_peft_benchmark.yaml": ("nemo-automodel", {
        "global_batch_size": 32, "micro_batch_size": 1, "tp": 8, "cp": 1, "pp": 1, "zero_stage": 3,
        "recompute": "none", "lora_rank": 16, "seq_length": 4096,
        "lora_targets": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]}),  # '*_proj'
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_upstream_file_states_each_field(name):
    framework, fields = EXPECTED[name]
    result = imported(name)
    assert result.framework == framework
    for field, value in fields.items():
        assert result.request.get(field) == value, (field, result.request.get(field), result.sources.get(field))
        assert value is None or result.sources[field].startswith(str(CONFIGS / name))  # None: the file says nothing


def test_every_framework_has_two_upstream_files():
    frameworks = [framework for framework, _ in EXPECTED.values()]
    for framework in ("megatron-core", "megatron-bridge", "verl", "skyrl", "torchtitan", "kempnerforge", "deepspeed",
                      "nemo-automodel"):
        assert frameworks.count(framework) >= 2, framework
    listed = (CONFIGS / "SOURCES.txt").read_text()
    for name in EXPECTED:
        assert f"{name}: github.com/" in listed and " @ " in listed.split(name, 1)[1].split("\n", 1)[0]


def test_sources_name_the_line_and_the_variable():
    result = imported("megatron_llama3_8b_h100_fp8.sh")
    assert result.sources["tp"].endswith(":117 --tensor-model-parallel-size ($MODEL_PARALLEL_ARGS at line 116)")
    assert line_of(result, "seq_length") == 64  # inside the MODEL_ARGS array, from SEQ_LENGTH=8192
    assert line_of(result, "precision") == 107  # DTYPE_ARGS+=(...) inside `if [[ "$DTYPE" == "fp8" ]]`
    mds = imported("mds_pretrain_llama2.sh")
    assert mds.sources["tp"].endswith("--tensor-model-parallel-size ($TP at line 14)")
    assert line_of(mds, "zero_stage") == 73  # "stage" inside the heredoc that writes the ds_config


def test_defaults_come_from_the_card_and_megatron_switches_left_out_are_off():
    gpt3 = imported("megatron_gpt3_175b.sh")
    assert gpt3.defaults["zero_stage"] == 0 and gpt3.defaults["sequence_parallel"] is False
    fp8 = imported("megatron_llama3_8b_h100_fp8.sh")
    assert fp8.defaults["fp8_recipe"] == "delayed"  # cards/frameworks/megatron-core.yaml defaults.fp8_recipe
    assert "pp" not in fp8.request and fp8.defaults["pp"] == 1
    verl = imported("verl_qwen2_7b_math_megatron.sh")
    assert verl.defaults["zero_stage"] == 1 and verl.defaults["expandable_segments"] is True
    kf = imported("kempnerforge_7b_16gpu_fp8.toml")
    assert kf.request["torch_compile"] is True  # stated: compile_model = true


def test_unsupported_and_unresolved_are_reported_not_guessed():
    fp8 = imported("megatron_llama3_8b_h100_fp8.sh")
    assert fp8.request["grad_reduce_overlap"] is True  # --overlap-grad-reduce: read, no longer unsupported
    assert any("--fp8-amax-history-len" in u for u in fp8.unsupported)
    assert not any("--lr" in u.split()[1] for u in fp8.unsupported)  # training hyper-parameters are no layout
    assert any("`if [ ! -f pretrain_gpt.py ]` not evaluated" in u for u in fp8.unresolved)
    tt = imported("torchtitan_llama3_8b.toml")
    assert "num_gpus" not in tt.request and any(u.startswith("num_gpus") for u in tt.unresolved)
    assert "dp" not in tt.request  # data_parallel_shard_degree = -1: the GPUs left over
    bridge = imported("bridge_qwen3_600m_sft_128k.sh")
    assert any("recipe's own layout" in u for u in bridge.unresolved)  # the recipe's body is in its module
    assert any("qwen3_600m: not in meshplan's catalog" in u for u in bridge.unresolved)  # its name's model


def test_torchtitan_without_a_global_batch_steps_on_local_batch_times_dp(tmp_path):
    """torchtitan's global_batch_size left out (-1) is local_batch_size x dp, one micro-step per step: a TOML with
    local_batch_size 2 on TP8 x dp 8 was estimated at meshplan's 4.2M-token default (512 sequences, 32 micro-batches,
    93 s per step) instead of its own 16-sequence step."""
    text = (CONFIGS / "torchtitan_llama3_70b.toml").read_text()
    assert "local_batch_size = 8" in text and "global_batch_size" not in text
    left = api.import_file(str(CONFIGS / "torchtitan_llama3_70b.toml"))  # dp_shard -1: the GPUs left over
    assert "global_batch_size" not in left.request and left.batch_per_dp == 8
    assert api.request_from_config(left, {"num_gpus": 64}).global_batch_size == 8 * 64 // 8  # TP8: dp 8
    assert api.request_from_config(left, {"num_gpus": 64, "global_batch_size": 256}).global_batch_size == 256
    path = tmp_path / "train.toml"
    path.write_text(text.replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 4"))
    stated = api.import_file(str(path))
    assert stated.request["global_batch_size"] == 32 and "local_batch_size x dp" in stated.sources["global_batch_size"]
    path.write_text(text.replace("local_batch_size = 8", "local_batch_size = 8\nglobal_batch_size = 128"))
    assert api.import_file(str(path)).request["global_batch_size"] == 128  # the file's own stays


def test_torchtitan_0_1_training_compile_is_read_as_compile_enable_and_said(tmp_path):
    """torchtitan 0.1's [training] compile (config_manager.py Training.compile; #1608 renamed it compile.enable) was
    'no meshplan field' and torch_compile left False; it is read as compile.enable, the note saying it is 0.1's name
    and that 0.2.0 and later refuse it at launch."""
    path = tmp_path / "tt.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "70B"\n\n[parallelism]\ntensor_parallel_degree = 8\n'
                    'data_parallel_shard_degree = -1\n\n[training]\ncompile = true\n')
    read = api.import_file(str(path))
    assert read.request["torch_compile"] is True and read.sources["torch_compile"].endswith(":10 training.compile")
    assert not any("training.compile" in u for u in read.unsupported)
    said = next(n for n in read.notes if "training.compile" in n)
    assert "0.1's name for compile.enable" in said and "0.2.0 and later refuse" in said
    path.write_text(path.read_text().replace("compile = true", "compile = false"))
    assert api.import_file(str(path)).request["torch_compile"] is False  # the value read, not a switch turned on


TT_01 = ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n\n[training]\nlocal_batch_size = 8\n'
         'seq_len = 8192\n\n[parallelism]\ndata_parallel_shard_degree = 2\n')
"""A torchtitan 0.1 TOML (v0.1.0 config_manager.py JobConfig: the float8 converter's 0.1 name), 8B, dp_shard 2."""


def _tt01(tmp_path, extra: str):
    path = tmp_path / "tt01.toml"
    path.write_text(TT_01 + extra)
    return api.import_file(str(path))


def test_torchtitan_0_1_float8_all_gather_is_read_as_its_0_2_key(tmp_path):
    """0.1's [float8] enable_fsdp_float8_all_gather (0.2.0 moved the section to [quantize.linear.float8]) was 'no
    meshplan field' and fp8_param_gather left off; it is read as the 0.2 key, the note naming the move."""
    read = _tt01(tmp_path, "\n[float8]\nenable_fsdp_float8_all_gather = true\n")
    assert read.request["fp8_param_gather"] is True
    assert read.sources["fp8_param_gather"].endswith(":14 float8.enable_fsdp_float8_all_gather")
    assert not any("enable_fsdp_float8_all_gather" in u for u in read.unsupported)
    assert any("0.2.0 moved to [quantize.linear.float8]" in n for n in read.notes)
    assert _tt01(tmp_path, "\n[float8]\nenable_fsdp_float8_all_gather = false\n").request["fp8_param_gather"] is False


@pytest.mark.parametrize("section", ["float8", "quantize.linear.float8"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchtitan_float8_recipe_name_is_read_in_either_release(tmp_path, section, recipe):
    """recipe_name under 0.1's [float8] or 0.2's [quantize.linear.float8] is fp8_recipe; the 0.2 key was dropped
    unsaid before (both of the card's recipe knobs left it to the torchtitan reader, which read neither), so a
    tensorwise file ran the card's default, rowwise."""
    read = _tt01(tmp_path, f'\n[{section}]\nrecipe_name = "{recipe}"\n')
    assert (read.request["precision"], read.request["fp8_recipe"]) == ("fp8", recipe)
    assert read.sources["fp8_recipe"].endswith(f":14 {section}.recipe_name")


def test_torchtitan_float8_recipe_without_the_converter_does_nothing(tmp_path):
    """Without a float8 converter torchtitan converts no linear: the recipe is said, not read; a recipe meshplan has
    no model of stays said and unread (the existing rowwise_with_gw_hp test's words)."""
    path = tmp_path / "tt01.toml"
    path.write_text(TT_01.replace('converters = ["float8"]\n', "") + '\n[float8]\nrecipe_name = "tensorwise"\n')
    read = api.import_file(str(path))
    assert "fp8_recipe" not in read.request and read.request.get("precision") != "fp8"
    assert any("no float8 converter" in n for n in read.notes)
    hp = _tt01(tmp_path, '\n[float8]\nrecipe_name = "rowwise_with_gw_hp"\n')
    assert "fp8_recipe" not in hp.request and any("no meshplan fp8_recipe" in u for u in hp.unsupported)


def test_torchtitan_0_1_memory_estimation_enabled_is_no_misspelling(tmp_path):
    """0.1's memory_estimation.enabled (0.2's enable) was flagged one slip from compile.enable ('did you mean
    enable?'), a warning every estimate from the file led with; it is 0.1's name, said, and no meshplan field."""
    read = _tt01(tmp_path, "\n[memory_estimation]\nenabled = true\n")
    assert not read.misspelt
    assert any("memory_estimation.enabled = True: no meshplan field" == u.split(" ", 1)[1] for u in read.unsupported)
    assert any("0.1's name for memory_estimation.enable" in n for n in read.notes)


def test_torchtitan_batch_size_before_0_1_is_read_as_local_batch_size(tmp_path):
    """The 2024-12 benchmarks' tree (9dec370) named the micro-batch training.batch_size (#1238 renamed it
    local_batch_size before v0.1.0): it was 'no meshplan field' and the micro-batch left to the default."""
    path = tmp_path / "tt2412.toml"
    path.write_text(TT_01.replace("local_batch_size = 8", "batch_size = 4"))
    read = api.import_file(str(path))
    assert read.request["micro_batch_size"] == 4 and read.request["global_batch_size"] == 4 * 2  # dp_shard 2
    assert read.sources["micro_batch_size"].endswith(":7 training.batch_size")
    assert any("name for training.local_batch_size before v0.1.0" in n for n in read.notes)


def test_torchtitan_0_1_split_points_are_the_stages_they_state(tmp_path):
    """0.1's pipeline_parallel_split_points (the module each later stage starts at; 0.2.0 dropped the key) was 'no
    meshplan field' and the split left even: four stages of 32 layers starting at layers 9, 17, 25 hold 9, 8, 8, 7,
    stated as first/last stage layers, over the generated split pipeline_parallel_layers_per_stage would give."""
    split = ('pipeline_parallel_degree = 4\npipeline_parallel_layers_per_stage = 8\n'
             'pipeline_parallel_split_points = ["layers.9", "layers.17", "layers.25"]\n')
    path = tmp_path / "split.toml"
    path.write_text(TT_01 + split)
    read = api.import_file(str(path))
    assert (read.request["first_stage_layers"], read.request["last_stage_layers"]) == (9, 7)
    assert read.sources["first_stage_layers"].endswith("parallelism.pipeline_parallel_split_points")
    assert any("0.1's manual split into 4 stages" in n for n in read.notes)
    _job, plan = resolve(api.request_from_config(read, {"num_gpus": 8}))
    assert (plan.first_stage_layers, plan.last_stage_layers, plan.pp) == (9, 7, 4)
    path.write_text(TT_01 + split.replace('"layers.9", ', ""))  # 3 stages on 4 ranks: torchtitan refuses it
    refused = api.import_file(str(path))
    assert "first_stage_layers" not in refused.request
    assert any("3 stages over pp=4" in u for u in refused.unresolved)


def test_torchtitan_0_1_split_points_of_a_multi_stage_schedule_set_vpp(tmp_path):
    """Four split points on two ranks under Interleaved1F1B: five stages cannot loop over 2 ranks (refused); three
    points make four virtual stages, vpp 2, their uneven layers said; at pp 1 the key does nothing (said)."""
    path = tmp_path / "vpp.toml"
    head = TT_01 + 'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "Interleaved1F1B"\n'
    path.write_text(head + 'pipeline_parallel_split_points = ["layers.7", "layers.15", "layers.23"]\n')
    read = api.import_file(str(path))
    assert read.request["vpp"] == 2 and "first_stage_layers" not in read.request
    assert any("virtual stages hold [7, 8, 8, 9]" in n for n in read.notes)
    path.write_text(head + 'pipeline_parallel_split_points = ["layers.7", "layers.15", "layers.23", "layers.28"]\n')
    assert any("5 stages over pp=2" in u for u in api.import_file(str(path)).unresolved)
    path.write_text(TT_01 + 'pipeline_parallel_split_points = ["layers.16"]\n')
    flat = api.import_file(str(path))
    assert any("no pipeline at pp 1" in n for n in flat.notes) and "first_stage_layers" not in flat.request


# --------------------------------------------------------------------------- the shell reader


def test_shell_defaults_continuations_comments_and_no_execution(tmp_path):
    marker = tmp_path / "ran"
    text = f"""#!/bin/bash
TP=${{TP:-4}}   # the default is used: TP is not set before
PP=${{PP-2}}
touch {marker}
OUT=$(touch {marker}; echo x)
NNODES=2
torchrun --nnodes $NNODES --nproc-per-node 8 pretrain_gpt.py \\
    --tensor-model-parallel-size $TP \\
    # a comment line inside the command is not a flag
    --pipeline-model-parallel-size ${{PP}} --seq-length $((1024 * 4)) --micro-batch-size $MISSING \\
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32
"""
    result = import_config(text, "job.sh")
    assert not marker.exists()  # nothing in a file is ever run
    assert result.request["tp"] == 4 and result.sources["tp"] == "job.sh:8 --tensor-model-parallel-size ($TP at line 2)"
    assert result.request["num_gpus"] == 16
    # the comment line ends the command: line 8 sets nothing meshplan reads, so its unset $MISSING is a note
    assert any("$MISSING is not set in the script" in n and "sets nothing meshplan reads" in n for n in result.notes)
    assert any("command's output: not run" in u for u in result.unresolved)


def test_an_unset_variable_on_a_line_meshplan_does_not_read_is_a_note():
    """verl's and SkyRL's scripts set data.train_files=$HOME/data/...: every RL script in tests/configs listed its
    $HOME lines as 'not read (pass these as flags)' and check as what it could not read. A line that sets nothing
    meshplan reads says it in the notes; one whose variable feeds a read key ($MODEL_PATH) stays unresolved."""
    text = ("MODEL_PATH=$HOME/models/Qwen2.5-7B\npython3 -m verl.trainer.main_ppo \\\n"
            "    data.train_files=$HOME/data/gsm8k/train.parquet \\\n    actor_rollout_ref.model.path=$MODEL_PATH \\\n"
            "    trainer.n_gpus_per_node=8 trainer.nnodes=1\n")
    result = import_config(text, "run.sh")
    assert result.unresolved == ["run.sh:1 $HOME is not set in the script: left empty"]
    assert "run.sh:3 $HOME is not set in the script: left empty; the line sets nothing meshplan reads" in result.notes


def test_shell_forms_of_2021_launch_scripts():
    """A comment line's trailing backslash continues nothing; "\\$X" stays a literal $X; a command run through
    `bash -c "..."` is read; `#SBATCH --nodes=N` is the SLURM_NNODES the launch line reads."""
    script = read_script('#SBATCH --nodes=3\nA=1\n#  --old-flag \\\nB="x $A"\nbash -c "run \\$RANK $B"\n'
                         'echo $SLURM_NNODES\n', "s.sh")
    assert [[w.text for w in c.words] for c in script.commands] == [["bash", "-c", "run $RANK x 1"], ["echo", "3"]]
    text = ('#SBATCH --nodes=2\nCMD="pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 1024"\n'
            'srun bash -c "torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 $CMD"\n')
    result = import_config(text, framework="megatron-core")
    assert (result.request["tp"], result.request["num_gpus"], result.request["seq_length"]) == (2, 16, 1024)


def test_shell_comment_line_ends_the_command_as_bash_does():
    """A comment line inside a backslash-continued command ends it (bash reads `#` to the end of the joined line)."""
    script = read_script("python train.py \\\n  --a 1 \\\n  # note \\\n  --b 2\n")
    assert [w.text for w in script.commands[0].words] == ["python", "train.py", "--a", "1"]


def test_shell_if_else_and_unknown_condition():
    script = read_script('MODE=fp8\nif [ "$MODE" = "bf16" ]; then\n X=1\nelif [[ $MODE == fp8 ]]; then\n X=2\n'
                         'else\n X=3\nfi\nif [ -f /etc/passwd ]; then\n Y=1\nfi\n')
    assert script.env["X"].value == "2" and "Y" not in script.env
    assert any("not evaluated" in u for u in script.unresolved)


def test_hydra_prefixes():
    text = """python3 -m verl.trainer.main_ppo \\
  trainer.nnodes=1 trainer.n_gpus_per_node=8 \\
  +actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \\
  ++actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \\
  ~actor_rollout_ref.actor.megatron.context_parallel_size \\
  actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
"""
    result = import_config(text)
    assert result.framework == "verl" and result.variant == "megatron"
    assert result.request["tp"] == 4 and result.request["pp"] == 2 and "cp" not in result.request
    assert any("deleted (Hydra '~')" in n for n in result.notes)


# --------------------------------------------------------------------------- bad files


def test_bad_files_name_the_line(tmp_path):
    with pytest.raises(MeshplanError, match=r"ds.json:3: not valid JSON"):
        bad = tmp_path / "ds.json"
        bad.write_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": }\n}\n')
        import_file(str(bad))
    with pytest.raises(MeshplanError, match=r"not valid TOML .*line 3"):
        bad = tmp_path / "job.toml"
        bad.write_text("[parallelism]\ntensor_parallel_degree = 2\npipeline_parallel_degree = = 2\n")
        import_file(str(bad))
    with pytest.raises(MeshplanError, match=r"job.sh:2 --tensor-model-parallel-size: 'four' is not a valid tp"):
        import_config("torchrun pretrain_gpt.py \\\n  --tensor-model-parallel-size four\n", "job.sh")
    with pytest.raises(MeshplanError, match="cannot tell which framework this shell file"):
        import_config("echo hello\n")
    with pytest.raises(MeshplanError, match="is never closed by `fi`"):
        import_config("if [ 1 -eq 1 ]; then\n torchrun pretrain_gpt.py --tensor-model-parallel-size 2\n")


def test_a_whole_number_field_refuses_a_fraction_or_an_infinity_instead_of_truncating_it(tmp_path):
    """ZeRO stage 2.5 was read as stage 2 and 1e400 (JSON's infinity) raised OverflowError: both are the file's
    error, named with its key and the stages DeepSpeed's ZeroStageEnum takes; 3.0 is still stage 3."""
    for stage, shown in (("2.5", "2.5"), ("1e400", "Infinity")):
        text = '{"zero_optimization": {"stage": ' + stage + "}}"
        with pytest.raises(MeshplanError, match=rf"zero_optimization.stage = {shown}: DeepSpeed takes one of 0, 1, 2, "
                                                "3 there"):
            import_config(text, "ds.json")
    assert import_config('{"zero_optimization": {"stage": 3.0}}', "ds.json").request["zero_stage"] == 3
    with pytest.raises(MeshplanError, match=r"'2.5' is not a valid tp \(expected a whole number"):
        import_config("torchrun pretrain_gpt.py \\\n  --tensor-model-parallel-size 2.5\n", "job.sh")


def test_a_value_no_whole_number_or_number_is_worded_as_the_file_error_not_as_python_s():
    """'1e3' for a degree (argparse's type=int refuses it) said "invalid literal for int() with base 10: '1e3'", a
    TOML list [2] "int() argument must be a string, a bytes-like object or a real number, not 'list'", and a list
    for a real field float()'s words: each is now the reader's own sentence."""
    with pytest.raises(MeshplanError, match=r"'1e3' is not a valid tp \(expected a whole number, got '1e3'\)\. Fix"):
        import_config("torchrun pretrain_gpt.py \\\n  --tensor-model-parallel-size 1e3\n", "job.sh")
    with pytest.raises(MeshplanError, match=r"parallelism.tensor_parallel_degree: \[2\] is not a valid tp "
                                            r"\(expected a whole number, got \[2\]\)\. Fix"):
        import_config("[parallelism]\ntensor_parallel_degree = [2]\n", "job.toml")
    assert convert("headroom", "0.2") == 0.2 and convert("tp", "8.0") == 8
    with pytest.raises(ValueError, match=r"^expected a number, got \[0.2\]$"):
        convert("headroom", [0.2])


def test_a_framework_given_for_a_format_it_is_not_read_from_names_what_would_work():
    """Told the framework, the refusal said 'Pass --framework', which was passed: it names the formats that framework
    is read from and the frameworks read from this format instead."""
    with pytest.raises(MeshplanError, match=r"reads torchtitan from shell or toml files, not from a json file") as exc:
        import_config('{"zero_optimization": {"stage": 3}}', "ds.json", framework="torchtitan")
    assert "Pass --framework" not in exc.value.fix and "(deepspeed)" in exc.value.fix


def test_a_value_flag_left_alone_by_an_unset_variable_is_unresolved_and_a_flag_beside_fills_it():
    """`--micro-batch-size $MBS` with MBS set at launch (MBS=2 bash train.sh) refused the whole script ("True is not a
    valid micro_batch_size"), and no flag beside the file could help; `--micro-batch-size=$MBS` was already left
    unresolved. Both are now, and the field given beside the file is used."""
    script = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --micro-batch-size $MBS \\\n"
              "  --global-batch-size 64 --context-parallel-size\n")
    imported = import_config(script, "job.sh")
    assert "micro_batch_size" not in imported.request and "cp" not in imported.request
    assert "job.sh:1 --micro-batch-size: no value (an unset variable?)" in imported.unresolved
    assert "job.sh:2 --context-parallel-size: no value (an unset variable?)" in imported.unresolved
    request = api.request_from_config(imported, {"model": "llama-3.1-8b", "num_gpus": 8, "micro_batch_size": 2})
    assert (request.micro_batch_size, request.tp) == (2, 2)


def test_a_node_count_the_file_does_not_give_is_not_taken_as_one_node():
    """`--nnodes $NODES` (set at launch) was read as one node, num_gpus 8 'stated by the file'; torchrun's elastic
    `--nnodes 1:4`, or 'abc', raised ValueError out of the import; `--nnodes=$NODES` was read as one node too."""
    line = "torchrun --nproc_per_node 8 --nnodes {} pretrain_gpt.py --tensor-model-parallel-size 2\n"
    for nodes, said in (("$NODES", "nodes has no value"), ("1:4", "nodes '1:4' is not a count"),
                        ("abc", "nodes 'abc' is not a count")):
        imported = import_config(line.format(nodes), "job.sh")
        assert "num_gpus" not in imported.request, nodes
        assert f"num_gpus: the file's {said} (pass --num-gpus)" in imported.unresolved, imported.unresolved
    imported = import_config(line.replace("--nnodes {}", "--nnodes=$NODES"), "job.sh")
    assert "num_gpus" not in imported.request
    assert import_config(line.format("2:2"), "job.sh").request["num_gpus"] == 16  # torchrun's MIN:MAX, one count
    with pytest.raises(MeshplanError, match=r"job.sh:1 --attention-dropout: 'abc' is not a dropout probability"):
        import_config("torchrun pretrain_gpt.py --attention-dropout abc\n", "job.sh")


@pytest.mark.parametrize("word", ["gpu", "auto", "cpu"])
def test_torchruns_own_process_counts_leave_the_gpus_per_node_unsaid(word):
    """torchrun's --nproc_per_node takes "gpu", "auto", "cpu" (torch/distributed/run.py determine_local_world_size):
    the node's count at launch. It refused the whole script ('gpu' is not a valid gpus_per_node); now the rest is
    read, the GPU count is left to the flags beside the file, and the note says why."""
    imported = import_config(f"torchrun --nproc_per_node {word} --nnodes 2 pretrain_gpt.py "
                             "--tensor-model-parallel-size 2 --micro-batch-size 2\n", "job.sh")
    assert imported.request["tp"] == 2 and imported.request["micro_batch_size"] == 2
    assert "num_gpus" not in imported.request and "gpus_per_node" not in imported.request
    assert f"num_gpus: the file's gpus_per_node '{word}' is not a count (pass --num-gpus)" in imported.unresolved
    assert any("job.sh:1 --nproc_per_node = " + word in note and "determine_local_world_size" in note
               for note in imported.notes)
    request = api.request_from_config(imported, {"model": "llama-3.1-8b", "num_gpus": 16})
    assert (request.num_gpus, request.tp) == (16, 2)


@pytest.mark.parametrize("value", ["nan", "inf", "-0.1", "1.5"])
@pytest.mark.parametrize("flag", ["--hidden-dropout", "--attention-dropout"])
def test_a_dropout_that_is_no_probability_is_refused(flag, value):
    """`--hidden-dropout nan` was read as dropout off (nan > 0 is false; --hidden-dropout was not read at all): every
    dropout key the card names is read, and a value outside 0..1 is the file's error, named with its line."""
    with pytest.raises(MeshplanError, match=rf"job.sh:1 {flag}: '{value}' is not a dropout probability"):
        import_config(f"torchrun pretrain_gpt.py --attention-dropout 0.0 {flag} {value}\n", "job.sh")
    on = import_config("torchrun pretrain_gpt.py --attention-dropout 0.0 --hidden-dropout 0.1\n", "job.sh")
    assert on.request["dropout"] is True  # hidden dropout on: its masks are kept


MUTATIONS = [  # (file, its text, the mutated text, what the answer says): each raised out of the import before
    ("kempnerforge_70b_32gpu_tp4_pp4.toml", "dp_shard = 2", "dp_shard = 1e400", "is not a whole number"),  # Overflow
    ("kempnerforge_70b_32gpu_tp4_pp4.toml", "dp_shard = 2", "dp_shard = [1]", "is not a whole number"),  # TypeError
    ("kempnerforge_70b_32gpu_tp4_pp4.toml", "grad_accum_steps = 4", "grad_accum_steps = nan", "is not a whole"),
    ("automodel_deepseek_v3_te_deepep.yaml", "local_batch_size: 4", "local_batch_size: abc", "is not a whole number"),
    ("automodel_deepseek_v3_te_deepep.yaml", "layers_per_stage: 2", "layers_per_stage: 0", "is not a whole number"),
    ("automodel_deepseek_v3_te_deepep.yaml", "layers_per_stage: 2", "layers_per_stage: 99999", "virtual stages, fewer"),
    ("skyrl_run_fsdp_baseline.sh", "policy_mini_batch_size=64", "policy_mini_batch_size=abc", "is not a whole number"),
    ("megatron_fsdp_llama3_8b.sh", "--rotary-base 1000000", "--rotary-base abc", None),  # read, no model matches it
    ("megatron_mixtral_8x7b.sh", "--num-layers 32", "--num-layers 5000", "outside 1 to 1,024 layers"),  # 10**20: OOM
]


@pytest.mark.parametrize(("name", "old", "new", "said"), MUTATIONS)
def test_a_value_a_reader_converts_itself_is_the_files_error_not_a_traceback(name, old, new, said):
    """Found by replacing numbers of the sample configs with abc, 1e400, nan, [1], 0, 10**20: ValueError, TypeError,
    OverflowError and ZeroDivisionError out of the readers' own int()/float(), and a MoE layer list of 10**20 layers
    that filled the memory."""
    text = (CONFIGS / name).read_text()
    assert old in text
    try:
        imported = import_config(text.replace(old, new, 1), name)
    except MeshplanError as exc:
        assert said is not None and said in str(exc), str(exc)
        assert f"{name}:" in str(exc)  # the file and its line
        return
    assert said is None or any(said in u for u in imported.unresolved), imported.unresolved


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge", "verl", "skyrl"])
def test_an_uneven_split_and_no_recompute_read_back_from_the_rendered_config(framework):
    """Megatron-Core's --decoder-first-pipeline-num-layers was read as nothing (the estimate then split evenly);
    verl's and SkyRL's num_layers_in_first/last_pipeline_stage too; and their recompute_granularity=null, what render
    writes for no recompute, was refused ('null' is not a valid recompute), so a rendered RL config could not be
    imported at all."""
    job = {"job": "rl"} if framework in ("verl", "skyrl") else {}
    req = Request(model="llama-3.1-8b", num_gpus=16, pp=4, first_stage_layers=6, last_stage_layers=6, zero_stage=1,
                  framework=framework, **job)
    rendered = api.render_config(framework, req, force=True)
    imported = api.import_config(rendered.text, path="x", framework=framework)
    assert (imported.request.get("first_stage_layers"), imported.request.get("last_stage_layers")) == (6, 6)
    assert imported.request.get("recompute", "none") == "none"


def test_json_auto_values_are_left_to_the_trainer():
    result = import_config('{"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",\n'
                           ' "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}', "ds.json")
    assert result.request["zero_stage"] == 3 and result.request["param_offload"] is True
    assert "micro_batch_size" not in result.request
    assert sum('"auto"' in u for u in result.unresolved) == 2


def test_json_autotp_size_is_the_tensor_parallel_degree():
    """DeepSpeedExamples training/tensor_parallel's ds_config sets `"tensor_parallel": {"autotp_size": 4}` (AutoTP
    training): import stated 'tp = 1 (a ds_config alone: no tensor parallelism)' beside 'autotp_size = 4: no meshplan
    field', and check estimated a TP1 job. The GPUs are dp x tp (DeepSpeed's dp = world / autotp_size)."""
    result = import_config('{"train_micro_batch_size_per_gpu": 2, "train_batch_size": 16,\n'
                           ' "gradient_accumulation_steps": 1,\n "tensor_parallel": {"autotp_size": 4}}', "ds.json")
    assert result.request["tp"] == 4 and result.sources["tp"] == "ds.json:3 tensor_parallel.autotp_size"
    assert result.request["dp"] == 8 and result.request["num_gpus"] == 32
    assert not any("autotp_size" in u for u in result.unsupported)
    assert import_config('{"zero_optimization": {"stage": 2}}', "ds.json").request["tp"] == 1


@pytest.mark.parametrize(("name", "why"), [
    ("ds_zero_stage_1_baseline.json", "names no model"),
    ("bridge_qwen3_600m_sft_128k.sh", "qwen3_600m: not in meshplan's catalog"),
    ("automodel_llama3_3_70b_instruct_peft_benchmark.yaml", "Llama-3.3-70B-Instruct is not in meshplan's catalog"),
])
def test_check_of_a_file_without_a_readable_model_names_the_file(name, why):
    """`check --config ds_config.json` (a ds_config never names its model) answered 'A model is required. Fix: Pass
    model: a catalog key (see list_models) ...', the API's words, naming neither the file nor why its model was not
    read, where import names both."""
    imported = import_file(str(CONFIGS / name))
    with pytest.raises(MeshplanError) as exc:
        api.request_from_config(imported, {"num_gpus": 8})
    assert str(exc.value).startswith(f"{CONFIGS / name}: ") and why in str(exc.value) and "--model" in str(exc.value)


def test_a_file_without_its_gpu_count_is_not_checked_on_one_data_parallel_rank(tmp_path):
    """KempnerForge's configs/train/7b_32gpu_fsdp.toml (dp_shard = -1: every GPU left over; the count is SLURM's)
    was checked as TP1 PP1 DP1: 'needs 117.0 GiB ... more GPUs or meshplan recommend are needed', the FSDP job
    estimated on one GPU, while import says the file does not give the count. The request from such a file asks for
    it; a file that states dp, or a count given beside it, is estimated as before."""
    path = tmp_path / "7b_32gpu_fsdp.toml"
    path.write_text("[model]\ndim = 4096\nn_layers = 32\nn_heads = 32\nn_kv_heads = 8\nvocab_size = 128256\n"
                    "[distributed]\ndp_shard = -1\ntp = 1\npp = 1\n", encoding="utf-8")
    imported = import_file(str(path))
    with pytest.raises(MeshplanError, match=r"the GPU count is not read .*--num-gpus"):
        api.request_from_config(imported)
    assert api.request_from_config(imported, {"num_gpus": 32}).num_gpus == 32
    assert api.request_from_config(imported, scan_gpus=True).num_gpus is None  # min-gpus finds the count itself
    stated = import_file(str(CONFIGS / "kempnerforge_70b_32gpu_tp4_pp4.toml"))  # dp_shard 2: tp x pp x dp GPUs
    assert api.check_config(api.request_from_config(stated), config=stated).plan.dp == 2


# --------------------------------------------------------------------------- round trip: render -> import

ROUND_TRIPS = [
    ("megatron-core", {}, {}),
    ("megatron-bridge", {"variant": "python"}, {}),
    ("verl", {}, {}),
    ("verl", {"variant": "fsdp"}, {"zero_stage": 3, "tp": 1, "pp": 1}),
    ("skyrl", {}, {}),
    ("skyrl", {"variant": "fsdp"}, {"zero_stage": 3, "tp": 1, "pp": 1}),
    ("torchtitan", {}, {}),
    ("torchtitan", {"version": "0.2"}, {}),
    ("kempnerforge", {}, {}),
    ("deepspeed", {}, {}),
    ("nemo-automodel", {}, {}),
]


@pytest.mark.parametrize(("framework", "options", "layout"), ROUND_TRIPS)
def test_render_then_import_gives_the_same_request(framework, options, layout):
    fields = {"model": "llama-3.1-8b", "num_gpus": 16, "tp": 2, "pp": 2, "global_batch_size": 64,
              "micro_batch_size": 1, "recompute": "full", "framework": framework, **layout}
    rendered = api.render_config(framework, parse_request(fields), **options)
    result = api.import_config(rendered.text, framework=framework)
    request = api.request_from_config(result, {"model": "llama-3.1-8b", "num_gpus": 16})  # where a file lacks them
    for name in ("tp", "pp", "micro_batch_size", "global_batch_size", "recompute", "num_gpus", "framework"):
        assert getattr(request, name) == fields[name], name
    assert result.request.get("zero_stage", result.defaults.get("zero_stage")) == api.check_config(
        parse_request(fields)).plan.zero_stage


# --------------------------------------------------------------------------- faces


def test_cli_import_json_shape(capsys):
    assert cli.main(["import", str(CONFIGS / "torchtitan_llama3_70b.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"framework", "request", "sources", "defaults", "unsupported"} <= set(out)
    assert out["framework"] == "torchtitan" and out["request"]["tp"] == 8
    assert out["sources"]["tp"].endswith("torchtitan_llama3_70b.toml:41 parallelism.tensor_parallel_degree")


def test_cli_import_text_and_bad_file(capsys, tmp_path):
    assert cli.main(["import", str(CONFIGS / "skyrl_run_megatron.sh")]) == 0
    out = capsys.readouterr().out
    assert "stated by the file:" in out and "tp = 2" in out and "skyrl_run_megatron.sh:" in out
    assert cli.main(["import", str(tmp_path / "missing.sh")]) == 2
    assert "Cannot read" in capsys.readouterr().err


def test_config_flag_with_overrides(capsys):
    path = str(CONFIGS / "torchtitan_llama3_70b.toml")
    assert cli.main(["check", "--config", path, "--num-gpus", "64", "--json"]) in (0, 1)
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["tp"] == 8 and report["plan"]["dp"] == 8 and report["framework"] == "torchtitan"
    assert cli.main(["memory", "--config", path, "--num-gpus", "64", "--tp", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["tp"] == 4  # the flag beside --config wins


def test_api_and_mcp_tool_agree_on_config_text():
    from meshplan.faces.mcp import tools

    text = (CONFIGS / "kempnerforge_70b_32gpu_tp4_pp4.toml").read_text()
    via_api = api.estimate_memory(api.request_from_config(api.import_config(text), {"num_gpus": 32}))
    via_tool = tools.estimate_memory(model="llama-3-70b", num_gpus=32, config_text=text)
    assert via_tool.peak_bytes == via_api.peak_bytes and via_tool.plan.pp == 4


# --------------------------------------------------------------------------- what the rows' sources set (issue 24)

MLM_AWARE = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
             "--seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 --use-distributed-optimizer "
             "--use-precision-aware-optimizer{dtype}\n")


def test_precision_aware_switch_and_moment_dtype_read_together():
    """--use-precision-aware-optimizer is a switch, not a dtype: the moments' dtype comes from --exp-avg-dtype (Bridge:
    optimizer.exp_avg_dtype, a torch dtype), only with the switch on; the switch alone is fp32 moments."""
    bf16 = import_config(MLM_AWARE.format(dtype=" --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16"), "run.sh")
    assert bf16.request["optimizer_state_dtype"] == "bf16" and bf16.sources["optimizer_state_dtype"].endswith(
        "--exp-avg-dtype")
    alone = import_config(MLM_AWARE.format(dtype=""), "run.sh")
    assert "optimizer_state_dtype" not in alone.request
    assert any("default fp32 moments" in n for n in alone.notes)
    recipe = BRIDGE_RECIPE.format(aware="False", dtype="torch.bfloat16")
    off = import_config(recipe, "glm.py:glm45_air_106b_pretrain_32gpu_h100_bf16_config")
    assert "optimizer_state_dtype" not in off.request and any("leaves off" in n for n in off.notes)
    on = import_config(BRIDGE_RECIPE.format(aware="True", dtype="torch.bfloat16"),
                       "glm.py:glm45_air_106b_pretrain_32gpu_h100_bf16_config")
    assert on.request["optimizer_state_dtype"] == "bf16"


BRIDGE_RECIPE = '''
import torch
from megatron.bridge import AutoBridge
from megatron.bridge.training.config import ConfigContainer


def glm45_air_106b_pretrain_32gpu_h100_bf16_config() -> ConfigContainer:
    cfg = _pretrain_common()
    cfg.model = AutoBridge.from_hf_pretrained("zai-org/GLM-4.5-Air").to_megatron_provider(load_weights=False)
    cfg.model.tensor_model_parallel_size = 1
    cfg.model.pipeline_model_parallel_size = 4
    cfg.model.num_layers_in_first_pipeline_stage = 11
    cfg.model.num_layers_in_last_pipeline_stage = 11
    cfg.model.expert_model_parallel_size = 8
    cfg.optimizer.use_precision_aware_optimizer = {aware}
    cfg.optimizer.exp_avg_dtype = {dtype}
    return cfg
'''


def test_bridge_recipe_model_and_uneven_stages():
    """A Bridge recipe's AutoBridge.from_hf_pretrained id is its model (the catalog key of that Hugging Face id, the
    name's model no longer reported as unread), and num_layers_in_first/last_pipeline_stage its end stages."""
    result = import_config(BRIDGE_RECIPE.format(aware="False", dtype="torch.float32"),
                           "glm.py:glm45_air_106b_pretrain_32gpu_h100_bf16_config")
    assert result.request["model"] == "glm-4.5-air" and "from_hf_pretrained" in result.sources["model"]
    assert not any(u.startswith("model ") for u in result.unresolved)
    assert result.request["first_stage_layers"] == 11 and result.request["last_stage_layers"] == 11
    assert result.request["num_gpus"] == 32 and result.request["ep"] == 8


VERL_DYNAMIC = """python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_megatron_trainer.yaml' \\
    data.max_prompt_length=2048 data.max_response_length=9632 data.train_batch_size=32 \\
    actor_rollout_ref.model.path=Qwen/Qwen3-235B-A22B actor_rollout_ref.rollout.n=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.actor.use_dynamic_bsz={dynamic} \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget} \\
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=8 \\
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4 \\
    actor_rollout_ref.actor.megatron.context_parallel_size={cp} \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.account_for_loss_in_pipeline_split=True \\
    +actor_rollout_ref.actor.megatron.override_transformer_config.account_for_embedding_in_pipeline_split=True \\
    trainer.n_gpus_per_node=8 trainer.nnodes=4
"""


def test_verl_token_budget_micro_batches_and_pipeline_accounting():
    """verl's use_dynamic_bsz packs micro-batches to ppo_max_token_len_per_gpu (times cp) and ignores
    ppo_micro_batch_size_per_gpu: budget * cp // (prompt + response) sequences; Megatron-Core's
    account_for_*_in_pipeline_split passed through override_transformer_config are read, not dropped as a data split."""
    packed = import_config(VERL_DYNAMIC.format(dynamic="True", budget=11680, cp=1), "run.sh")
    assert packed.request["micro_batch_size"] == 1 and "use_dynamic_bsz" in packed.sources["micro_batch_size"]
    assert any("ppo_micro_batch_size_per_gpu = 2 is not used" in n for n in packed.notes)
    assert packed.request["account_for_embedding"] is True and packed.request["account_for_loss"] is True
    assert import_config(VERL_DYNAMIC.format(dynamic="True", budget=4 * 11680, cp=2), "run.sh"
                         ).request["micro_batch_size"] == 8
    short = import_config(VERL_DYNAMIC.format(dynamic="True", budget=4096, cp=1), "run.sh")
    # verl asserts max_token_len >= the longest sequence: a budget below it is said, not read as one sequence
    assert "use_dynamic_bsz" not in short.sources.get("micro_batch_size", "")
    assert any("4096 tokens per micro-batch is below the longest sequence (11680 tokens" in u for u in short.unresolved)
    fixed = import_config(VERL_DYNAMIC.format(dynamic="False", budget=11680, cp=1), "run.sh")
    assert fixed.request["micro_batch_size"] == 2


def test_nested_default_and_a_local_model_copy_named_by_its_folder():
    """${X:-"${HOME}/verl"} keeps its nested reference (bash's nesting, not the first '}'); a model path that is not on
    this machine and whose last folder is a catalog model's name is that model, with the path in its source."""
    text = ('RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}\nMODEL_PATH=$RAY_DATA_HOME/models/Qwen3-235B-A22B\n'
            "python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=${MODEL_PATH} trainer.nnodes=4 "
            "trainer.n_gpus_per_node=8\n")
    script = read_script(text, "run.sh")
    assert script.env["RAY_DATA_HOME"].value == "/verl"  # $HOME unset in the script: empty, and said
    assert any("$HOME is not set" in u for u in script.unresolved)
    result = import_config(text, "run.sh")
    assert result.request["model"] == "Qwen3-235B-A22B"
    assert "/verl/models/Qwen3-235B-A22B" in result.sources["model"] and "local copy" in result.sources["model"]
    unknown = import_config(text.replace("Qwen3-235B-A22B", "my-own-model"), "run.sh")
    assert unknown.request["model"] == "/verl/models/my-own-model"  # no catalog name: left as the file says


# --------------------------------------------------------------------------- RL: algorithm and rollout round trip

RL_ROUND_TRIP = {"model": "qwen3-30b-a3b", "num_gpus": 16, "job": "rl", "zero_stage": 3, "micro_batch_size": 1,
                 "samples_per_prompt": 8, "prompts_per_step": 128, "rollout_tp": 2, "rollout_dp": 2, "rollout_ep": 4,
                 "rollout_memory_fraction": 0.7, "rollout_enforce_eager": True}


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "ppo"])
def test_a_rendered_rl_config_reads_back_its_algorithm(framework, algorithm):
    """A PPO config (adv_estimator gae, what render writes) was refused on import ("'gae' is not a valid algorithm"):
    the card maps the key straight to the request field, so the reader's gae -> ppo never ran. DAPO (grpo without the
    KL term, so no reference model) was read back as grpo, an estimate with a reference model the run never loads."""
    fields = {**RL_ROUND_TRIP, "framework": framework, "algorithm": algorithm}
    rendered = api.render_config(framework, parse_request(fields), force=True)
    imported = api.import_config(rendered.text, path="run.sh", framework=framework)
    assert imported.request["algorithm"] == algorithm, imported.sources.get("algorithm")


@pytest.mark.parametrize(("framework", "kl", "algorithm"), [
    ("verl", "", "dapo"),  # verl's actor.use_kl_loss defaults to false: no reference model
    ("verl", " actor_rollout_ref.actor.use_kl_loss=True", "grpo"),
    ("verl", " algorithm.use_kl_in_reward=True", "grpo"),
    ("skyrl", "", "grpo"),  # SkyRL's trainer.algorithm.use_kl_loss defaults to true
    ("skyrl", " trainer.algorithm.use_kl_loss=false", "dapo"),
])
def test_the_reference_model_follows_the_kl_settings_and_their_defaults(framework, kl, algorithm):
    """verl loads the reference model when use_kl_loss or use_kl_in_reward (verl/trainer/ppo/utils.py
    need_reference_policy; both false by default); SkyRL likewise (skyrl/train/utils/utils.py, use_kl_loss true by
    default). A GRPO script without one is meshplan's dapo (no reference, no critic)."""
    launch = {"verl": "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo",
              "skyrl": "python -m skyrl.train.entrypoints.main_base trainer.algorithm.advantage_estimator=grpo"}
    result = import_config(launch[framework] + kl + "\n", "run.sh")
    assert result.request["algorithm"] == algorithm


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_a_rendered_rl_config_reads_back_its_rollout_engine(framework):
    """The rollout engine's data_parallel_size was dropped without a word (its `data` part matched the data-settings
    pattern) and expert_parallel_size and enforce_eager were "no meshplan field", though render writes all three from
    rollout_dp, rollout_ep and rollout_enforce_eager: the imported job ran a different engine."""
    fields = {**RL_ROUND_TRIP, "framework": framework, "algorithm": "grpo"}
    rendered = api.render_config(framework, parse_request(fields), force=True)
    imported = api.import_config(rendered.text, path="run.sh", framework=framework)
    for name in ("rollout_tp", "rollout_dp", "rollout_ep", "rollout_memory_fraction", "rollout_enforce_eager"):
        assert imported.request.get(name) == fields[name], name
    assert not any("parallel_size" in u or "enforce_eager" in u for u in imported.unsupported), imported.unsupported


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_skyrl_separate_pools_read_back_as_the_job_rendered(algorithm):
    """SkyRL with colocate_all false was read as a colocated job on the policy's GPUs alone (num_gpus 4 of 16): the
    rollout engine's own GPUs (num_engines x TP x DP) and PPO's critic's were left out and colocate_all was "no meshplan
    field"."""
    fields = {**RL_ROUND_TRIP, "framework": "skyrl", "algorithm": algorithm, "placement": "separate",
              "rollout_gpus": 8}
    rendered = api.render_config("skyrl", parse_request(fields), force=True)
    imported = api.import_config(rendered.text, path="run.sh", framework="skyrl")
    request = api.request_from_config(imported, {})
    assert (request.placement, request.rollout_gpus, request.num_gpus) == ("separate", 8, 16)
    assert api.check_config(request).plan.dp == api.check_config(parse_request(fields)).plan.dp


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("zero_stage", [1, 3])  # the Megatron engine (Megatron-Bridge names), FSDP (PEFT names)
@pytest.mark.parametrize("targets", [["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
                                     ["linear_qkv", "linear_fc2"]])
def test_a_rendered_lora_rl_config_reads_back_its_targets(framework, zero_stage, targets):
    """The FSDP engines' target_modules (Hugging Face PEFT: all-linear, what render writes for the four, or the
    projections q_proj, k_proj ...) were refused on import ("['all-linear'] is not a valid lora_targets")."""
    fields = {**RL_ROUND_TRIP, "model": "qwen2.5-7b", "rollout_ep": 1, "framework": framework, "algorithm": "grpo",
              "zero_stage": zero_stage, "lora_rank": 16, "lora_targets": targets}
    rendered = api.render_config(framework, parse_request(fields), force=True)
    imported = api.import_config(rendered.text, path="run.sh", framework=framework)
    assert (imported.request["lora_rank"], imported.request["lora_targets"]) == (16, targets)


def test_peft_projections_that_make_no_whole_linear_are_said():
    """q_proj alone is part of Megatron's fused linear_qkv: meshplan cannot adapt it alone, and says so."""
    result = import_config("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.lora_rank=8 "
                           "actor_rollout_ref.model.target_modules=[q_proj,v_proj,o_proj]\n", "run.sh")
    assert result.request["lora_targets"] == ["linear_proj"]
    assert any("q_proj" in u and "v_proj" in u for u in result.unsupported), result.unsupported


@pytest.mark.parametrize(("launch", "epochs", "log_prob"), [
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
     "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    ("python -m skyrl.train.entrypoints.main_base trainer.micro_train_batch_size_per_gpu=4",
     "trainer.update_epochs_per_batch", "trainer.micro_forward_batch_size_per_gpu"),
])
def test_update_passes_are_read_and_a_log_prob_micro_batch_meshplan_does_not_model_is_said(launch, epochs, log_prob):
    """ppo_epochs / update_epochs_per_batch (update passes per RL step) and the log-prob pass's own micro-batch were
    dropped without a word (their `epochs` and `log` parts matched the settings that say nothing about memory or
    speed); the passes are now the request's update_epochs, the log-prob phase still runs the training micro-batch."""
    read = import_config(f"{launch} {epochs}=3 {log_prob}=32\n", "run.sh")
    assert read.request["update_epochs"] == 3 and not any(epochs in u for u in read.unsupported), read.unsupported
    assert any(log_prob in u and "micro_batch_size 4" in u for u in read.unsupported), read.unsupported
    same = import_config(f"{launch} {epochs}=1 {log_prob}=4\n", "run.sh")
    assert same.request["update_epochs"] == 1
    assert not any(epochs in u or log_prob in u for u in same.unsupported), same.unsupported


def test_a_reward_model_the_run_loads_is_said():
    """verl's reward_model.enable=True loads a reward model beside the actor (10 of its example scripts); its keys were
    skipped with the other models' layouts and nothing said the estimate leaves a whole model out."""
    launch = "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo reward_model.model.path=x/rm "
    said = import_config(launch + "reward_model.enable=True\n", "run.sh").unsupported
    assert any("reward_model.enable" in u and "reward model" in u for u in said), said
    assert not any("reward model" in u for u in import_config(launch + "reward_model.enable=False\n",
                                                                "run.sh").unsupported)


@pytest.mark.parametrize(("launch", "recompute"), [
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.strategy=fsdp2", "full"),  # gradient checkpointing on
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.strategy=fsdp2 "
     "actor_rollout_ref.model.enable_gradient_checkpointing=False", "none"),
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.strategy=megatron", None),  # recompute_* null: none
    ("python -m skyrl.train.entrypoints.main_base trainer.strategy=fsdp2", "full"),
    ("python -m skyrl.train.entrypoints.main_base trainer.strategy=megatron", "full"),
    ("python -m skyrl.train.entrypoints.main_base trainer.strategy=megatron trainer.gradient_checkpointing=false "
     "trainer.policy.megatron_config.transformer_config_kwargs.recompute_granularity=full", "none"),
])
def test_recompute_left_out_is_the_frameworks_default(launch, recompute):
    """verl's FSDP actor (model.enable_gradient_checkpointing True by default) and SkyRL's FSDP and Megatron workers
    (trainer.gradient_checkpointing True; Megatron's transformer_config_kwargs default to full, uniform, 1 layer)
    checkpoint every layer unless told not to, but a file that left the keys out was read as no recompute; SkyRL's
    Megatron worker drops the recompute settings when gradient_checkpointing is false."""
    result = import_config(launch + "\n", "run.sh")
    assert result.request.get("recompute") == recompute, result.sources.get("recompute")


@pytest.mark.parametrize(("estimator", "enable", "said"), [
    ("grpo", "True", "a critic is trained"), ("gae", "False", "trains no critic"), ("gae", "True", None)])
def test_verl_critic_enable_against_the_estimator_is_said(estimator, enable, said):
    """verl trains a critic when critic.enable says so, else for gae alone (verl/trainer/ppo/utils.py need_critic); the
    critic.* keys were skipped with the other models' layouts, so a grpo run with critic.enable=True was estimated
    without its critic (and gae with critic.enable=False with one) and nothing said so."""
    result = import_config(f"python3 -m verl.trainer.main_ppo algorithm.adv_estimator={estimator} "
                           f"actor_rollout_ref.actor.use_kl_loss=True critic.enable={enable}\n", "run.sh")
    found = [u for u in result.unsupported + result.notes if "critic.enable" in u]
    assert (said in found[0]) if said else not found, found


def test_min_gpus_from_a_file_that_states_its_gpu_count(capsys):
    """`min-gpus --config FILE` (and minimum_gpus with config_text) was refused for every launch script ('num_gpus
    cannot be given (got 8). Fix: Leave num_gpus out'): the file states the count the scan is to find, and the user
    gave none. The file's count is left out of the scan; one given beside the file is still refused."""
    from mcp_calls import call_tool

    path = str(CONFIGS / "megatron_llama3_8b_h100_fp8.sh")
    assert cli.main(["min-gpus", "--config", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_gpus"] >= 1
    assert cli.main(["min-gpus", "--config", path, "--num-gpus", "8"]) == 2
    assert "num_gpus cannot be given" in capsys.readouterr().err
    result = call_tool("minimum_gpus", {"config_text": (CONFIGS / "skyrl_run_megatron.sh").read_text(),
                                        "model": "qwen3-8b"})
    assert not result.is_error, result.content[0].text


@pytest.mark.parametrize(("layout", "micro"), [
    ("actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", 16),
    ("actor_rollout_ref.actor.strategy=megatron actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", 16),
    ("actor_rollout_ref.actor.strategy=fsdp2", 8),
])
def test_verl_deprecated_global_micro_batch_is_divided_by_the_data_parallel_size(layout, micro):
    """verl's deprecated actor.ppo_micro_batch_size (six of its example scripts) counts sequences over the data-parallel
    ranks: fsdp_workers.py divides it by the FSDP mesh over Ulysses, megatron_workers.py by Megatron's DP, into
    ppo_micro_batch_size_per_gpu. It was 'no meshplan field' and the micro-batch left to the default."""
    result = import_config("python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node=8 "
                           f"actor_rollout_ref.actor.ppo_micro_batch_size=64 {layout}\n", "run.sh")
    assert result.request["micro_batch_size"] == micro, result.sources.get("micro_batch_size")
    assert not any("ppo_micro_batch_size =" in u for u in result.unsupported), result.unsupported


def test_both_readers_take_the_data_parallel_size_from_one_function(monkeypatch):
    """torchtitan's local_batch_size x dp (request_values) and verl's global micro-batch / dp (hydra) each worked
    dp out from the GPU count on their own, and disagreed where tp x pp x cp does not divide it: torchtitan's gave
    no global batch, verl's floored it (8 GPUs at TP3: a micro-batch of 64 / 2). Both ask arithmetic/mesh's
    file_data_parallel now: a count that is no whole number of replicas has no data-parallel size."""
    from meshplan.adapters import read
    from meshplan.adapters.read import hydra
    from meshplan.arithmetic import mesh

    assert (mesh.file_data_parallel(64, 8), mesh.file_data_parallel(16, 2, 2, 2), mesh.file_data_parallel(8, 3),
            mesh.file_data_parallel(4, 8)) == (8, 2, None, None)
    asked = []
    counted = lambda *a: asked.append(a) or mesh.file_data_parallel(*a)  # noqa: E731
    monkeypatch.setattr(read, "file_data_parallel", counted)
    monkeypatch.setattr(hydra, "file_data_parallel", counted)
    left = api.import_file(str(CONFIGS / "torchtitan_llama3_70b.toml"))
    assert api.request_from_config(left, {"num_gpus": 64}).global_batch_size == 64 and asked == [(64, 8, 1, 1)]
    result = import_config("python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node=8 "
                           "actor_rollout_ref.actor.ppo_micro_batch_size=64 actor_rollout_ref.actor.strategy=megatron "
                           "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3\n", "run.sh")
    assert asked[1:] == [(8, 3, 1, 1)] and "micro_batch_size" not in result.request
    assert any("ppo_micro_batch_size = 64" in u and "does not divide" in u for u in result.unresolved), \
        result.unresolved


def test_skyrl_fsdp_size_render_writes_is_read():
    """render writes SkyRL's trainer.policy.fsdp_config.fsdp_size=-1 (shard over every rank) and import called it
    'no meshplan field'; a shard group of its own (fsdp_size > 0, hybrid sharding) is said as verl's is."""
    fields = {**RL_ROUND_TRIP, "model": "qwen2.5-7b", "rollout_ep": 1, "framework": "skyrl", "algorithm": "grpo"}
    text = api.render_config("skyrl", parse_request(fields), force=True).text
    assert not any("fsdp_size" in u for u in api.import_config(text, framework="skyrl").unsupported)
    hybrid = api.import_config(text.replace("fsdp_size=-1", "fsdp_size=4"), framework="skyrl")
    assert any("fsdp_size = 4" in n and "dp_replicate" in n for n in hybrid.notes), hybrid.notes


@pytest.mark.parametrize("job", ["rl", "sft"])
def test_skyrl_sequence_parallel_render_writes_is_read(job):
    """render writes transformer_config_kwargs.sequence_parallel=false where a request turns SkyRL's own SP (tp > 1)
    off, and SkyRL applies it over its own (megatron_worker.py); import called it 'no meshplan field' and read SP on,
    so check --config of meshplan's own render estimated another run than the request (Llama-3.1-8B TP2 on 8 H100:
    48.5 GiB asked, 46.2 GiB read back)."""
    fields = {"model": "llama-3.1-8b", "framework": "skyrl", "num_gpus": 8, "zero_stage": 1, "tp": 2, "job": job,
              "sequence_parallel": False}
    text = api.render_config("skyrl", parse_request(fields), force=True).text
    imported = api.import_config(text, path="run.sh", framework="skyrl")
    assert imported.request["sequence_parallel"] is False
    assert not any("sequence_parallel" in u for u in imported.unsupported), imported.unsupported
    request = api.request_from_config(imported, {})
    assert api.estimate_memory(request).peak_bytes == api.estimate_memory(parse_request(fields)).peak_bytes


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen2.5-7b"])
def test_a_rendered_megatron_deepspeed_script_builds_the_untied_model_it_was_planned_for(model):
    """The Megatron-DeepSpeed render left out --untie-embeddings-and-output-weights (megatron/arguments.py, 4efb479:
    store_true, tied by default), so the script built Llama-3.1-8B with its output layer tied to the embedding, not
    the model meshplan planned, and `meshplan import` of it matched no catalog model."""
    fields = {"model": model, "num_gpus": 8, "tp": 2, "global_batch_size": 64, "micro_batch_size": 1,
              "framework": "deepspeed"}
    text = api.render_config("deepspeed", parse_request(fields), force=True).text
    assert "--untie-embeddings-and-output-weights" in text
    read = api.import_config(text, framework="deepspeed").request.get("model")  # Llama-3-8B's shape is Llama-3.1's
    assert read is not None and api.describe_model(read).total_params == api.describe_model(model).total_params


@pytest.mark.parametrize(("launch", "algorithm"), [
    ("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True", "ppo"),  # verl's default: gae
    ("python -m skyrl.train.entrypoints.main_base trainer.algorithm.use_kl_loss=false", "dapo"),  # SkyRL's: grpo
])
def test_an_estimator_left_out_is_the_frameworks_default(launch, algorithm):
    """verl's algorithm.adv_estimator defaults to gae (ppo_trainer.yaml: PPO, with a critic, need_critic) and SkyRL's
    advantage_estimator to grpo; a file leaving it out was estimated as meshplan's default, grpo: a verl PPO run
    without its critic."""
    result = import_config(launch + "\n", "run.sh")
    assert result.request["algorithm"] == algorithm and "not given" in result.sources["algorithm"]


def test_verl_grad_offload_is_said_to_have_no_effect_not_unknown():
    """import of a verl Megatron script (run_qwen2-7b_seq_balance_math_megatron.sh and a dozen other examples) said
    actor.megatron.grad_offload = True: 'no meshplan field'. verl never acts on the key (b178a3c reads it into
    _is_offload_grad and uses that nowhere; param_offload releases the gradient buffer; 0.9.1 dropped it), so it is
    not meshplan's grad_offload: the import says why, and param_offload stays what decides."""
    result = import_config("python3 -m verl.trainer.main_ppo model_engine=megatron trainer.nnodes=1 "
                           "trainer.n_gpus_per_node=8 actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
                           "actor_rollout_ref.actor.megatron.param_offload=True "
                           "actor_rollout_ref.actor.megatron.grad_offload=True critic.megatron.grad_offload=True\n",
                           "run.sh")
    assert not any("grad_offload" in u for u in result.unsupported + result.unresolved), result.unsupported
    said = [n for n in result.notes if "actor.megatron.grad_offload = True: no effect" in n]
    assert len(said) == 1 and "param_offload decides" in said[0], result.notes  # the critic's keys: said apart
    assert "grad_offload" not in result.request and result.request["param_offload"] is True


def test_verl_dist_checkpointing_is_said_to_be_a_checkpoint_format():
    """verl's run_moonlight16b_a3b_gsm8k_megatron.sh sets actor.megatron.use_dist_checkpointing=True, which import
    listed as 'no meshplan field': it picks the format weights load from and checkpoints save in (verl 0.9.1
    transformer_impl.py), the same model on the GPU; the import says so."""
    result = import_config("python3 -m verl.trainer.main_ppo model_engine=megatron trainer.nnodes=1 "
                           "trainer.n_gpus_per_node=8 actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
                           "actor_rollout_ref.actor.megatron.use_dist_checkpointing=True\n", "run.sh")
    assert not any("use_dist_checkpointing" in u for u in result.unsupported), result.unsupported
    assert any("use_dist_checkpointing = True: the format the weights are loaded from" in n for n in result.notes)


BRIDGE_LAYOUTS = [{"num_gpus": 64, "tp": 2, "pp": 4},
                  {"num_gpus": 64, "tp": 1, "pp": 2, "cp": 2, "recompute": "full", "recompute_method": "uniform",
                   "recompute_layers": 1},
                  {"num_gpus": 64, "tp": 2, "pp": 2, "vpp": 2, "recompute": "selective", "precision": "fp8",
                   "optimizer_offload_fraction": 0.5}]


def test_a_rendered_bridge_file_imports_back_without_noise():
    """render megatron-bridge then import showed render's own keys as 'no meshplan field': the model's architecture
    (model.layernorm_epsilon, gated_linear_unit, rope_scaling, ..., which render restates the recipe's model with),
    optimizer.use_distributed_optimizer (ZeRO-1's other half) and optimizer.overlap_cpu_optimizer_d2h_h2d. Every key
    render writes, for every catalog model, both variants, is now read: a layout field, the model's architecture
    (checked against the recipe's model where the file names one), or said with what it does."""
    from meshplan.adapters.architecture import FIELDS, megatron_architecture
    from meshplan.knowledge.catalog import catalog_architecture, catalog_keys

    for model in catalog_keys():
        assert {s.field for s in megatron_architecture(catalog_architecture(model), 4096)[0] if s.field} <= FIELDS
        for layout in BRIDGE_LAYOUTS:
            req = parse_request({"model": model, "framework": "megatron-bridge", **layout})
            for variant in ("python", "run_recipe"):
                text = api.render_config("megatron-bridge", req, variant=variant, force=True).text
                read = api.import_config(text, framework="megatron-bridge",
                                         config_format="shell" if variant == "run_recipe" else None)
                assert read.unsupported == [], (model, layout, variant, read.unsupported)
                assert read.request["tp"] == layout["tp"] and read.request["zero_stage"] == 1
    req = parse_request({"model": "llama-3.1-8b", "framework": "megatron-bridge", "num_gpus": 8, "tp": 2})
    text = api.render_config("megatron-bridge", req, variant="run_recipe").text.replace(
        '"${RECIPE:?set RECIPE to the recipe function of your model}"', "llama31_8b_pretrain_config")
    read = api.import_config(text, framework="megatron-bridge", config_format="shell")
    assert read.request["model"] == "llama-3.1-8b" and read.unsupported == []
    assert any("model.rope_scaling_factor: llama-3.1-8b's architecture, each as it states it" in n for n in read.notes)
    changed = api.import_config(text.replace("model.layernorm_epsilon=1e-05", "model.layernorm_epsilon=1e-06"),
                                framework="megatron-bridge", config_format="shell")
    assert any("model.layernorm_epsilon = 1e-06: not llama-3.1-8b's (its 1e-05)" in u for u in changed.unsupported)


def test_a_rendered_megatron_core_script_imports_back_without_noise():
    """render megatron-core then import listed architecture flags render writes (--use-rope-scaling,
    --rope-scaling-factor, --rope-type, --mscale, --add-qkv-bias, --qk-layernorm, ...) as 'no meshplan field', and
    dropped others unread (--normalization, --norm-epsilon, --rotary-base: a file's value other than the model's was
    never said). Every architecture flag render writes, for every catalog model, is now the model's: compared with
    the model the file's shape names, each that differs said (as the Bridge round trip does)."""
    from meshplan.adapters.architecture import CORE_FLAGS, megatron_architecture
    from meshplan.knowledge.catalog import catalog_architecture, catalog_keys

    for model in catalog_keys():
        flags = {s.flag[0] for s in megatron_architecture(catalog_architecture(model), 4096)[0] if s.flag}
        assert flags <= CORE_FLAGS, (model, flags - CORE_FLAGS)
        req = parse_request({"model": model, "framework": "megatron-core", "num_gpus": 64, "tp": 2, "pp": 2})
        read = api.import_config(api.render_config("megatron-core", req, force=True).text)
        assert read.unsupported == [], (model, read.unsupported)
        assert read.request["tp"] == 2 and read.request["pp"] == 2
    req = parse_request({"model": "llama-3.1-8b", "framework": "megatron-core", "num_gpus": 8, "tp": 2})
    text = api.render_config("megatron-core", req).text
    read = api.import_config(text)
    assert read.request["model"] == "llama-3.1-8b" and read.unsupported == []
    assert any("--rope-scaling-factor, --disable-bias-linear: llama-3.1-8b's architecture, each as it states it" in n
               for n in read.notes)
    changed = api.import_config(text.replace("--norm-epsilon 1e-05", "--norm-epsilon 1e-06"))
    assert any("--norm-epsilon = 1e-06: not llama-3.1-8b's (its 1e-05)" in u for u in changed.unsupported)


def test_verl_remove_padding_is_said_not_noise():
    """actor_rollout_ref.model.use_remove_padding=True, in 87 of verl's own example scripts (volcengine/verl b178a3c
    examples/), was 'no meshplan field'; it drops the micro-batch's pad tokens (rmpad), verl's default, and meshplan
    plans each sequence at its length either way: the import says so."""
    result = import_config("python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node=8 "
                           "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
                           "actor_rollout_ref.model.use_remove_padding=True\n", "run.sh")
    assert not any("use_remove_padding" in u for u in result.unsupported), result.unsupported
    assert any("use_remove_padding = True: the micro-batch's pad tokens removed" in n for n in result.notes)


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_a_skyrl_main_sft_lora_script_is_a_lora_job(zero_stage):
    """render skyrl of a LoRA job writes main_sft with model.lora.rank (SkyRL's run_sft_lora.sh does the same); its
    import stated job=sft beside lora_rank, which the request refuses ('LoRA fields, not for job=sft'), so `check
    --config` of the file failed. main_sft with a LoRA rank is a LoRA job."""
    fields = {"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 8, "job": "lora", "lora_rank": 16,
              "zero_stage": zero_stage, "recompute": "full"}
    text = api.render_config("skyrl", parse_request(fields), force=True).text
    read = api.import_config(text, framework="skyrl")
    assert (read.request["job"], read.request["lora_rank"]) == ("lora", 16)
    report = api.check_config(api.request_from_config(read), config=read)
    assert report.plan.zero_stage == zero_stage


def test_skyrl_examples_optimizer_and_dataset_keys_are_not_noise():
    """Importing SkyRL's own examples (NovaSky-AI/SkyRL a956457 examples/train/sft/run_sft_fsdp.sh, run_sft_megatron_
    apigen_mt.sh, the GRPO scripts) listed the gradient clip, the LR scheduler, the chat dataset's column names, which
    tokens the loss counts and the policy-loss formula as 'no meshplan field', 44 lines of max_grad_norm alone over
    its examples: none of them changes a step's memory or time, like the learning rate and seed beside them."""
    sft = import_config("python -m skyrl.train.main_sft strategy=fsdp model.path=Qwen/Qwen2.5-0.5B-Instruct "
                        "messages_key=messages tools_key=tools system_key=system train_on_what=all_assistant_messages "
                        "max_length=512 batch_size=4 micro_train_batch_size_per_gpu=2 optimizer_config.lr=1e-6 "
                        "optimizer_config.max_grad_norm=1.0 optimizer_config.scheduler=constant_with_warmup "
                        "placement.num_nodes=1 placement.num_gpus_per_node=1\n", "run_sft_fsdp.sh")
    rl = import_config("python -m skyrl.train.entrypoints.main_base trainer.strategy=fsdp2 "
                       "trainer.policy.model.path=Qwen/Qwen2.5-1.5B-Instruct trainer.policy.optimizer_config.lr=1e-6 "
                       "trainer.policy.optimizer_config.max_grad_norm=0.5 trainer.algorithm.policy_loss_type=regular "
                       "trainer.placement.policy_num_gpus_per_node=4\n", "run_gsm8k.sh")
    assert sft.unsupported == [] and rl.unsupported == [], sft.unsupported + rl.unsupported
    assert sft.request["job"] == "sft" and sft.request["micro_batch_size"] == 2
    # LoRA's alpha scales the adapters' output (alpha / rank): no memory or time (SkyRL's run_sft_lora.sh, verl's
    # actor_rollout_ref.model.lora_alpha in 9 of its examples)
    lora = import_config("python -m skyrl.train.main_sft strategy=fsdp model.path=Qwen/Qwen2.5-0.5B-Instruct "
                         "model.lora.rank=32 model.lora.alpha=16 placement.num_gpus_per_node=1\n", "run_sft_lora.sh")
    verl = import_config("python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=8 actor_rollout_ref.model.path="
                         "Qwen/Qwen2.5-3B-Instruct actor_rollout_ref.model.lora_rank=64 "
                         "actor_rollout_ref.model.lora_alpha=32\n", "run.sh")
    assert lora.unsupported == [] and verl.unsupported == [], lora.unsupported + verl.unsupported


@pytest.mark.parametrize("job", ["sft", "rl"])
def test_a_rendered_skyrl_script_imports_back_without_noise(job):
    """render skyrl (main_sft for a training job, main_base for an RL one) with CP and a CPU-optimizer share, then
    import, listed remove_microbatch_padding (which render writes for CP: SkyRL requires it) and the CPU optimizer's
    companion keys (optimizer_cpu_offload, use_precision_aware_optimizer, overlap_cpu_optimizer_d2h_h2d) as 'no
    meshplan field'. Each is read back: the layout and the share as stated, the others said with what they do."""
    fields = {"model": "qwen3-30b-a3b", "framework": "skyrl", "num_gpus": 16, "ep": 8, "cp": 2,
              "optimizer_offload_fraction": 0.5, "job": job}
    result = api.render_config("skyrl", parse_request(fields), force=True)
    read = api.import_config(result.text, framework="skyrl")
    assert result.variant == job and read.unsupported == [], read.unsupported
    assert (read.request["cp"], read.request["ep"], read.request["optimizer_offload_fraction"]) == (2, 8, 0.5)
    said = " ".join(read.notes)
    assert "remove_microbatch_padding = true: the micro-batches' sequences packed" in said
    assert "overlap_cpu_optimizer_d2h_h2d = true: the CPU optimizer's D2H/H2D copies" in said


def test_a_rendered_megatron_moe_script_reads_back_its_kernel_and_cpu_optimizer_switches():
    """render megatron-core of an MoE model with a CPU-optimizer share, then import, listed --moe-grouped-gemm and
    --overlap-cpu-optimizer-d2h-h2d (both written by render) as 'no meshplan field'; each is said with what meshplan
    counts for it."""
    fields = {"model": "qwen3-30b-a3b", "framework": "megatron-core", "num_gpus": 16, "ep": 8,
              "optimizer_offload_fraction": 0.5}
    read = api.import_config(api.render_config("megatron-core", parse_request(fields), force=True).text)
    assert not any("grouped-gemm" in u or "overlap-cpu" in u for u in read.unsupported), read.unsupported
    said = " ".join(read.notes)
    assert "--moe-grouped-gemm = True: the routed experts' GEMMs grouped" in said
    assert "--overlap-cpu-optimizer-d2h-h2d = True: the CPU optimizer's D2H/H2D copies" in said


@pytest.mark.parametrize("sp", [False, True])
def test_torchtitan_negated_switch_reads_back_as_the_field(sp):
    """render torchtitan of tp=2 without sequence parallelism writes tyro's --parallelism.no_enable_sequence_parallel;
    import listed it as 'no meshplan field' and took sequence_parallel's default (on with TP), so memory --config of
    the rendered script estimated another layout (23.2 GiB, not the plan's 25.5 GiB)."""
    from meshplan.adapters.render import render
    from meshplan.request.resolve import resolve

    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="torchtitan", tp=2,
                                sequence_parallel=sp))
    got = import_config(render("torchtitan", job, plan).text, "run_torchtitan.sh")
    assert got.unsupported == [] and got.request["sequence_parallel"] is sp, (got.unsupported, got.request)
    _, back = resolve(api.request_from_config(got, {"model": "llama-3.1-8b", "gpu": "h100"}))
    assert back == plan


def test_a_python_file_meshplan_cannot_place_is_said_as_python():
    """A .py meshplan cannot place was 'this shell file' (Megatron-Bridge's alias module recipes/llama/llama3.py):
    it is a Python file, with what meshplan reads in Python, and a module that only imports from others names them."""
    alias = ("from megatron.bridge.recipes.llama.llama3_8b import *  # noqa\n"
             "from .llama3_70b import llama3_70b_pretrain_config\n")
    with pytest.raises(MeshplanError) as exc:
        import_config(alias, "recipes/llama/llama3.py")
    said = str(exc.value)
    assert "this Python file" in said and "shell" not in said.split("Fix:")[0], said
    assert "only imports from other modules (megatron.bridge.recipes.llama.llama3_8b, .llama3_70b)" in said, said
    assert "Megatron-Bridge recipe module" in said
    with pytest.raises(MeshplanError, match=r"this Python file is for\. "):  # by its content, with no path
        import_config("import os\n\ndef main():\n    print(os.getcwd())\n")
    # told the framework, its launch-line reader said 'not a Megatron-Bridge launch script'
    with pytest.raises(MeshplanError, match=r"reads no megatron-bridge settings from this Python file: it only "
                                            r"imports from other modules"):
        import_config(alias, "recipes/llama/llama3.py", framework="megatron-bridge")


GSPO_WRAPPER = """set -x
# bash examples/train/algorithms/gspo/run_gspo_gsm8k.sh

bash examples/train/gsm8k/run_gsm8k.sh \\
  trainer.algorithm.policy_loss_type="gspo" \\
  trainer.algorithm.loss_reduction="sequence_mean" \\
  trainer.micro_forward_batch_size_per_gpu=16 \\
  trainer.micro_train_batch_size_per_gpu=16 \\
  trainer.run_name="gspo_gsm8k" \\
  "$@"
"""


def test_a_wrapper_that_calls_another_script_names_it():
    """SkyRL's run_gspo_gsm8k.sh (examples/train/algorithms/gspo) runs `bash examples/train/gsm8k/run_gsm8k.sh` with
    overrides and launches nothing itself: it was 'cannot tell which framework' (and with --framework skyrl, 'no
    command launches ...'), naming no file to pass. Both now name the called script and its line."""
    for framework in (None, "skyrl"):
        with pytest.raises(MeshplanError) as exc:
            import_config(GSPO_WRAPPER, "run_gspo_gsm8k.sh", framework=framework)
        said = str(exc.value)
        assert "calls examples/train/gsm8k/run_gsm8k.sh (line 4), which holds the launch" in said, said
        assert "Pass examples/train/gsm8k/run_gsm8k.sh, with this file's overrides added" in said, said
    with pytest.raises(MeshplanError, match=r"it launches no trainer itself but calls \./run\.sh \(line 1\)"):
        import_config("NUM_GPUS=4 ./run.sh trainer.epochs=1\n", "wrap.sh")
    with pytest.raises(MeshplanError, match=r"this shell file is for\. "):  # sourcing an env file is no launch
        import_config("source env.sh\necho done\n", "x.sh")


def test_a_ds_config_with_a_key_given_twice_is_refused_as_deepspeed_refuses_it():
    """json.loads kept the last of two zero_optimization sections, so the file read as ZeRO-3 though DeepSpeed refuses
    it (runtime/config.py: object_pairs_hook dict_raise_error_on_duplicate_keys, 'Duplicate keys in DeepSpeed
    config'); the same key in two objects is no duplicate."""
    text = ('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},\n'
            ' "zero_optimization": {"stage": 3}}\n')
    with pytest.raises(MeshplanError, match=r"ds_config\.json: the key 'zero_optimization' is given twice in one "
                                            r"JSON object; DeepSpeed refuses such a config"):
        api.import_config(text, path="ds_config.json")
    fine = '{"train_batch_size": 64, "fp16": {"enabled": false}, "bf16": {"enabled": true}}\n'
    assert api.import_config(fine, path="ds_config.json").request["global_batch_size"] == 64


def test_a_ds_config_s_gpu_count_is_read_only_from_a_whole_batch_triple():
    """A rendered ds_config with its train_batch_size edited from 1,024 to 500 (micro 2, 32 accumulation steps): the
    reader floored 500 / 64 to dp = 7 and stated 7 GPUs, where DeepSpeed's batch assertion (runtime/config.py:
    train_batch_size = micro x gradient_accumulation_steps x world size) refuses it on every count; and a ds_config
    with no accumulation steps was checked on one GPU, said nowhere. Both now leave the GPU count to the request
    (refused without --num-gpus, as a launch script that states none is), the first saying why."""
    base = {"train_batch_size": 1024, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 32,
            "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    whole = api.import_config(json.dumps(base), path="ds_config.json")
    assert whole.request["dp"] == 16 and whole.request["num_gpus"] == 16
    off = api.import_config(json.dumps({**base, "train_batch_size": 500}), path="ds_config.json")
    assert "dp" not in off.request and "num_gpus" not in off.request
    assert any("500 is not micro x" in line and "DeepSpeed's batch assertion" in line for line in off.unresolved)
    no_steps = {k: v for k, v in base.items() if k != "gradient_accumulation_steps"}
    for text in (json.dumps({**base, "train_batch_size": 500}), json.dumps(no_steps)):
        imported = api.import_config(text, path="ds_config.json")
        assert [left.fields for left in imported.left_to_request] == [["num_gpus"]]
        with pytest.raises(MeshplanError, match="the GPU count is not read"):
            api.request_from_config(imported, {"model": "llama-3.1-8b"})


def test_a_load_key_is_irrelevant_only_where_it_loads_a_checkpoint_or_startup_weights(tmp_path):
    """The irrelevant-key list (adapters/read/keys.IRRELEVANT) held `load` as a word anywhere in a key, so every key
    with a `load` part was dropped unsaid: Megatron's --moe-router-load-balancing-type (the router's loss), a
    quantized-base switch such as load_in_4bit on a framework without a quantized-base reader. Only a checkpoint's
    load (--load, --no-load-optim, --no-load-rng, --load-main-params-from-ckpt) and the rollout's startup weight
    format (rollout.load_format: the weights are synced from the actor each step) say nothing of a step."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096 "
                      "--micro-batch-size 1 --global-batch-size 64 --load /ckpt --no-load-optim --no-load-rng "
                      "--load-main-params-from-ckpt --moe-router-load-balancing-type sinkhorn\n")
    read = import_file(str(script))
    said = " ".join(read.unsupported)
    assert "--moe-router-load-balancing-type" in said
    assert not any(k in said for k in ("--load ", "--no-load-optim", "--no-load-rng", "--load-main-params"))
    verl = tmp_path / "run.sh"
    verl.write_text("python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node=8 "
                    "actor_rollout_ref.rollout.load_format=dummy +actor_rollout_ref.model.load_in_4bit=true\n")
    read = import_file(str(verl))
    said = " ".join(read.unsupported)
    assert "load_in_4bit" in said and "load_format" not in said


def test_a_ds_config_offloading_to_nvme_says_it_is_estimated_as_cpu_offload(tmp_path):
    """DeepSpeed's offload devices are none, cpu and nvme (offload_config.py OffloadDeviceEnum); nvme (ZeRO-Infinity)
    was read as the CPU offload with nothing said, though its host memory and transfer time are another run's."""
    config = tmp_path / "ds.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, '
                      '"offload_param": {"device": "nvme"}, "offload_optimizer": {"device": "cpu"}}}')
    read = import_file(str(config))
    assert read.request["param_offload"] is True and read.request["optimizer_offload"] is True
    said = [u for u in read.unsupported if "nvme" in u]
    assert len(said) == 1 and "offload_param.device = nvme" in said[0] and "param_offload=true" in said[0], said


def test_a_recipe_name_is_reported_not_dropped_as_a_run_name(tmp_path):
    """The irrelevant-key list held `name` and `recipe` as words anywhere in a key, so torchtitan's older [float8]
    recipe_name (the FP8 recipe: tensorwise, rowwise, rowwise_with_gw_hp) was dropped unsaid; a section's own
    `name` (a run's, a scheduler's) and Megatron-Bridge's --recipe stay irrelevant."""
    toml = tmp_path / "job.toml"
    toml.write_text('[job]\nname = "run7"\n[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n'
                    '[float8]\nrecipe_name = "rowwise_with_gw_hp"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
                    '[lr_scheduler]\nname = "linear"\n')
    said = " ".join(import_file(str(toml)).unsupported)
    assert "float8.recipe_name = rowwise_with_gw_hp" in said
    assert "job.name" not in said and "lr_scheduler.name" not in said and "model.name" not in said


def test_keys_that_touch_a_step_are_reported_not_hidden_by_a_word_inside_them(tmp_path):
    """IRRELEVANT's words matched inside other keys: save\\w* hid --distribute-saved-activations (TP-sharded saved
    inputs under full recompute), entropy\\w* (an RL coefficient) --cross-entropy-loss-fusion (now read), checkpoint and
    activation torchtitan's activation_checkpoint section (its memory_budget). And torchtitan's mode memory_budget
    refused the whole file ('not a valid recompute'); it is now said, the rest read."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096 "
                      "--micro-batch-size 1 --global-batch-size 64 --recompute-granularity full --recompute-method "
                      "uniform --recompute-num-layers 1 --distribute-saved-activations --cross-entropy-loss-fusion "
                      "--save /x --save-interval 100\n")
    imported = import_file(str(script))
    said = " ".join(imported.unsupported)
    assert "--distribute-saved-activations" in said and "--save" not in said
    # the loss's fusion is read since it is a request field (tests/test_cross_entropy_fusion.py)
    assert imported.request["cross_entropy_loss_fusion"] is True and "--cross-entropy-loss-fusion" not in said
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
                    '[activation_checkpoint]\nmode = "memory_budget"\nmemory_budget = 0.5\n')
    read = import_file(str(toml))
    said = [u for u in read.unsupported if "activation_checkpoint" in u]
    assert "recompute" not in read.request and len(said) == 2, said
    assert "mode = memory_budget: a recompute mode meshplan does not model" in said[0]


def test_words_inside_keys_no_longer_hide_keys_that_touch_a_step(tmp_path):
    """IRRELEVANT held mode, steps, split, freq, data, enabled and bf16 as words anywhere in a key, so real keys that
    change a step were dropped unsaid: Megatron-Core's --muon-tp-mode / --muon-num-ns-steps / --muon-no-split-qkv
    (meshplan times duplicated, 5 and split, cards/frameworks/megatron-core.yaml muon) and --linear-attention-freq
    (megatron/training/arguments.py); DeepSpeed's communication_data_type, data_types.grad_accum_dtype,
    bf16.bf16_master_weights_and_grads and amp.enabled (deepspeed/runtime/constants.py, bf16 config); verl's
    actor_rollout_ref.model.tiled_mlp.enabled (trainer/config/model/hf_model.yaml). A run's mode, step count, data
    split and verl's data section stay irrelevant."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --seq-length 4096 "
                      "--micro-batch-size 1 --global-batch-size 64 --optimizer muon --muon-tp-mode blockwise "
                      "--muon-num-ns-steps 7 --muon-no-split-qkv --linear-attention-freq 4 --split 949,50,1 "
                      "--data-path /d --save-interval 100 --train-iters 10 "
                      "--heterogeneous-layers-config-path /m.json\n")
    read = import_file(str(script))
    said = " ".join(read.unsupported)
    assert any("--heterogeneous-layers-config-path = /m.json: a heterogeneous model" in n for n in read.notes)
    for key in ("--muon-tp-mode", "--muon-num-ns-steps", "--muon-no-split-qkv", "--linear-attention-freq"):
        assert f"{key} = " in said, key
    assert not any(k in said for k in ("--split", "--data-path", "--save-interval", "--train-iters")), said
    config = tmp_path / "ds_config.json"
    config.write_text('{"train_micro_batch_size_per_gpu": 1, "communication_data_type": "fp32", '
                      '"data_types": {"grad_accum_dtype": "fp32"}, "amp": {"enabled": true}, '
                      '"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}, '
                      '"flops_profiler": {"enabled": true}, "zero_optimization": {"stage": 2}}')
    said = " ".join(import_file(str(config)).unsupported)
    for key in ("communication_data_type", "data_types.grad_accum_dtype", "amp.enabled",
                "bf16.bf16_master_weights_and_grads"):
        assert f"{key} = " in said, key
    assert "bf16.enabled" not in said and "flops_profiler" not in said, said
    verl = tmp_path / "run.sh"
    verl.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 data.max_prompt_length=1024 "
                    "data.max_response_length=1024 data.shuffle=True "
                    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct "
                    "actor_rollout_ref.actor.ppo_mini_batch_size=16 "
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 "
                    "actor_rollout_ref.model.tiled_mlp.enabled=True actor_rollout_ref.rollout.mode=async "
                    "trainer.n_gpus_per_node=8 trainer.nnodes=1\n")
    said = " ".join(import_file(str(verl)).unsupported)
    assert "actor_rollout_ref.model.tiled_mlp.enabled = True" in said
    assert "data.shuffle" not in said and "rollout.mode" not in said, said


@pytest.mark.parametrize(("text", "where"), [
    ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 --foo\x1b[2J 1\n", "1: a control "
     "character, U+001B, at column 81"),
    ('{"train_micro_batch_size_per_gpu": 1,\n "zero_optimization": {"stage": 2}, "x": "a\x00b"}', "2: a control "
     "character, U+0000, at column 44")])
def test_a_config_with_control_characters_is_refused_not_echoed(text, where):
    """A launch script with a terminal escape in a flag (--foo\\x1b[2J) was read and its key printed raw by `meshplan
    import` ('--foo^[[2J = 1: no meshplan field' clears the user's screen), a NUL likewise; over MCP the same text came
    back in the answer. The file is refused, naming the line, the code point and the column."""
    with pytest.raises(MeshplanError) as refused:
        api.import_config(text, path="run.sh")
    assert str(refused.value).startswith(f"run.sh:{where};")
    assert not re.search(r"[\x00-\x08\x0b\x0e-\x1f\x7f]", str(refused.value))
    tabbed = "torchrun --nproc-per-node 8 pretrain_gpt.py \\\n\t--tensor-model-parallel-size 2 --seq-length 4096\r\n"
    assert api.import_config(tabbed, path="run.sh").request["tp"] == 2


def test_a_switch_the_file_sets_to_no_true_or_false_is_named_as_written():
    """A switch key's value no true/false reads ('maybe', 3) was handed on as None, so the error said "None is not a
    valid ... got None": it now names what the file wrote (Megatron-Bridge's fp8 store key, a torchtitan switch)."""
    text = "cfg.model.activation_func_fp8_input_store = 'maybe'\n"
    with pytest.raises(MeshplanError, match=r"model.activation_func_fp8_input_store: 'maybe' is not a valid "
                                            r"fp8_activation_input_store \(expected true or false, got 'maybe'\)"):
        import_config(text, "overrides.py", framework="megatron-bridge")
    assert import_config("cfg.model.activation_func_fp8_input_store = True\n", "overrides.py",
                         framework="megatron-bridge").request["fp8_activation_input_store"] is True


def test_an_unknown_framework_beside_a_file_is_refused_as_the_request_field_is():
    """import_config's framework is the Request's field: refused in its words (what was given, the frameworks
    allowed, the near spelling), as the MCP tools refuse it in their arguments before they read the file (the api said
    'Unknown framework', MCP 'framework: Input should be ...': face_fuzz seed 12, draw 133)."""
    text = "#!/bin/bash\ntorchrun pretrain_gpt.py --tensor-model-parallel-size 2\n"
    with pytest.raises(MeshplanError) as from_file:
        api.import_config(text, framework="DEEPSPEED")
    with pytest.raises(MeshplanError) as from_request:
        parse_request({"model": "llama-3.1-8b", "framework": "DEEPSPEED"})
    assert str(from_file.value) == str(from_request.value)
    assert "deepspeed" in str(from_file.value) and "DEEPSPEED" in str(from_file.value)


def test_a_file_of_no_framework_names_the_field_on_every_face():
    """A text no reader places, sent as MCP's config_text, was told 'Pass --framework', a flag the MCP tool has not:
    the fix names the field on both faces (--framework; MCP: framework) and the frameworks read from that format."""
    with pytest.raises(MeshplanError, match="cannot tell which framework this shell file") as exc:
        import_config("--tensor-model-parallel-size 2\n", "<config_text>")
    assert exc.value.fix.startswith("Pass the framework (--framework; MCP: framework); meshplan reads: "), exc.value.fix


SKYRL_TRAIN_FLAT = """uv run --isolated --extra vllm -m skyrl_train.entrypoints.main_base \\
  trainer.algorithm.advantage_estimator="grpo" \\
  trainer.policy.model.path="Qwen/Qwen2.5-7B-Instruct" \\
  trainer.placement.colocate_all=true \\
  trainer.strategy=fsdp2 \\
  trainer.placement.policy_num_gpus_per_node=8 \\
  generator.num_inference_engines=4 \\
  generator.inference_engine_tensor_parallel_size=2 \\
  generator.backend=vllm \\
  generator.gpu_memory_utilization=0.6 \\
  generator.n_samples_per_prompt=5
"""


def test_skyrl_train_flat_generator_keys_are_the_rollout_settings():
    """A script on skyrl_train's launcher (skyrl_train.entrypoints.main_base, a launcher the card reads) with its flat
    generator keys (skyrl-train/skyrl_train/config/ppo_base_config.yaml: inference_engine_tensor_parallel_size,
    gpu_memory_utilization, backend, num_inference_engines) had them said as 'no meshplan field', and the rollout
    estimated at TP1 and a 0.8 memory fraction: they are read as the rollout's settings, as 0.4's
    generator.inference_engine.* keys are."""
    imported = import_config(SKYRL_TRAIN_FLAT, "run_gsm8k.sh")
    assert imported.framework == "skyrl"
    assert {k: imported.request.get(k) for k in ("rollout_tp", "rollout_memory_fraction", "rollout_engine")} == {
        "rollout_tp": 2, "rollout_memory_fraction": 0.6, "rollout_engine": "vllm"}
    assert imported.sources["rollout_tp"] == "run_gsm8k.sh:8 generator.inference_engine_tensor_parallel_size"
    assert not [u for u in imported.unsupported if "generator.inference_engine_tensor_parallel_size" in u
                or "gpu_memory_utilization" in u or "num_inference_engines" in u], imported.unsupported


def test_a_model_the_catalog_lacks_read_from_a_file_names_its_line():
    """check --config on a SkyRL script whose trainer.policy.model.path is a model outside the catalog said 'Unknown
    model ...' with no word of the file: the refusal names the line it was read from and that a model given beside
    the file overrides it; given beside, the file is checked."""
    text = SKYRL_TRAIN_FLAT.replace("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct")
    imported = import_config(text, "run_gsm8k.sh")
    with pytest.raises(MeshplanError) as exc:
        api.request_from_config(imported, {})
    assert exc.value.reason == ("Unknown model 'Qwen/Qwen2.5-1.5B-Instruct' (read from the file: model at "
                                "run_gsm8k.sh:3 trainer.policy.model.path)."), exc.value.reason
    assert "overrides the file's" in exc.value.fix
    assert api.request_from_config(imported, {"model": "qwen2.5-7b"}).model == "qwen2.5-7b"


def test_a_colocated_skyrl_engine_count_that_does_not_fill_the_policy_gpus_is_said():
    """colocate_all with num_engines 2 x rollout TP 2 on 8 policy GPUs: SkyRL's validate_cfg refuses it (the engines
    must fill the policy's GPUs), and meshplan read the count and said nothing, planning 4 engines. It is said among
    what the check does not cover, with the engines meshplan plans; a count that fills them is not."""
    text = SKYRL_TRAIN_FLAT.replace("generator.num_inference_engines=4", "generator.num_inference_engines=2")
    said = [u for u in import_config(text, "run_gsm8k.sh").unsupported if "validate_cfg" in u]
    assert said == ["run_gsm8k.sh:7 generator.num_inference_engines: 2 engines x rollout TP 2 x DP 1 = 4 GPUs, but "
                    "colocate_all runs them on the policy's 8, and SkyRL's validate_cfg refuses a count that differs; "
                    "meshplan plans the 8 GPUs' 4 engines"], said
    assert not [u for u in import_config(SKYRL_TRAIN_FLAT, "run_gsm8k.sh").unsupported if "validate_cfg" in u]


VERL_FUSIONS = {"masked_softmax_fusion": "no effect on the step's memory or time",
                "apply_rope_fusion": "a kernel choice meshplan neither times nor counts apart",
                "bias_dropout_fusion": "the same saves fused or not",
                "gradient_accumulation_fusion": "which meshplan times as on",
                "persist_layer_norm": "do not read it: no effect",
                "cross_entropy_loss_fusion": "no effect: verl's Megatron engine runs the model without labels"}


@pytest.mark.parametrize("launch, prefix", [
    ("python3 -m verl.trainer.main_ppo model_engine=megatron trainer.nnodes=1 trainer.n_gpus_per_node=8 "
     "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", "+actor_rollout_ref.actor.megatron"),
    ("torchrun --nproc_per_node 8 -m verl.trainer.sft_trainer engine=megatron optim=megatron "
     "model.path=Qwen/Qwen2.5-7B-Instruct", "engine")])
def test_verl_megatron_fusion_switches_are_said_not_unknown(launch, prefix):
    """verl's own fully-async Qwen3-30B-A3B scripts (volcengine/verl b178a3c verl/experimental/fully_async_policy/
    shell/grpo_30b_a3b_base_math_megatron_96_32.sh) set Megatron-Core's fusion switches through
    override_transformer_config; import listed each as 'no meshplan field'. Each is said: what it switches on the
    model verl's Megatron engine builds and what meshplan counts or assumes instead (the SFT trainer's engine.
    keys the same); bias_activation_fusion is read, over the Megatron-Bridge Qwen2 provider's off (the card's
    defaults.bias_activation_fusion)."""
    keys = " ".join(f"{prefix}.override_transformer_config.{key}=True"
                    for key in (*VERL_FUSIONS, "bias_activation_fusion"))
    result = import_config(f"{launch} {keys}\n", "run.sh")
    assert not any("fusion" in u or "persist_layer_norm" in u for u in result.unsupported), result.unsupported
    assert result.request["bias_activation_fusion"] is True
    for key, words in VERL_FUSIONS.items():
        said = [n for n in result.notes if f"override_transformer_config.{key} = True: " in n]
        assert len(said) == 1 and words in said[0], (key, result.notes)


@pytest.mark.parametrize("text, why", [
    ("a: [1, 2", "it does not parse as YAML at line 1, column 9"),
    ("hello there friends\n", "not a mapping of named sections"),
    ("[1, 2, 3]\n", "not a mapping of named sections"),
    ("- tp\n- pp\n", "not a mapping of named sections")])
def test_unplaceable_text_is_not_called_a_shell_file(text, why):
    """Pasted text that shows no format meshplan reads (broken YAML, plain words, a list) was refused as 'this shell
    file', a format it does not show: the refusal says what meshplan tried, each format it reads and why the text is
    none of them, and the readers it has; a text that shows a shell line is still refused as a shell file."""
    with pytest.raises(MeshplanError) as exc:
        import_config(text, "<config_text>")
    said = str(exc.value)
    assert "shell file" not in said and "cannot tell what this text is" in said, said
    assert why in said and "a JSON object" in said and "TOML with a [section]" in said and "a launch script" in said
    assert "verl (yaml)" in exc.value.fix and "MCP: framework and config_format" in exc.value.fix
    with pytest.raises(MeshplanError, match="cannot tell which framework this shell file"):
        import_config("echo hello\n" + text, "<config_text>")
