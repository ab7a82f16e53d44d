"""A config meshplan renders, read back by `meshplan import` (the reader of the user's own files, not the round-trip
parser of tests/test_adapters.py), states the plan it was rendered from: each field the request set comes back with
its value. Each case here came back changed or was refused before its fix: the MoE dispatcher (dropped on every
Megatron-backed framework), Megatron-Bridge's grad_reduce_in_fp32 (read inverted), its fp8_recipe (not read), its
mixed-precision presets (FP8 dropped), its dist_muon (refused), Megatron-LM's --recompute-modules list (all but its
first module dropped), torchtitan's data-parallel degree (its replicate degree dropped from dp, and plain replication
read as hybrid sharding), torchtitan's stages per rank (an Interleaved1F1B config read as vpp 1), Megatron-LM's
--num-virtual-stages-per-pipeline-rank (rendered beside uneven first/last stages, read as vpp 1), and torchtitan's
switches rendered last, before the activation-checkpoint subcommand
(refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CONFIGS = Path(__file__).parent / "configs"
WORLD = ("model", "num_gpus", "gpu")  # what a python snippet leaves to its launch; passed beside the file

CASES = [
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1,
                                 global_batch_size=4096, moe_token_dispatcher="flex")),
    ("megatron-bridge", None, dict(model="qwen3-30b-a3b", num_gpus=32, pp=2, ep=16, global_batch_size=256,
                                   moe_token_dispatcher="flex")),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", gpu="gb200", num_gpus=64, pp=2, ep=32,
                                           global_batch_size=256, moe_token_dispatcher="flex")),
    ("verl", None, dict(model="qwen3-30b-a3b", num_gpus=32, tp=2, pp=2, ep=8, global_batch_size=256,
                        moe_token_dispatcher="flex")),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=32, tp=2, pp=2, ep=8, global_batch_size=320,
                         moe_token_dispatcher="flex")),
    ("megatron-bridge", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=2, global_batch_size=512,
                                   precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=False,
                                   optimizer_state_dtype="fp16", grad_reduce_in_fp32=False)),
    ("megatron-bridge", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, global_batch_size=64,
                                   grad_reduce_in_fp32=False)),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", gpu="b200", num_gpus=16, ep=8,
                                           global_batch_size=256, precision="fp8", fp8_recipe="mxfp8",
                                           fp8_param_gather=True, optimizer_state_dtype="bf16")),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=256,
                                           optimizer="muon")),
    ("megatron-core", None, dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1,
                                 global_batch_size=4096, recompute="selective",
                                 recompute_modules=["mla_up_proj", "moe_act"])),
    ("megatron-core", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, vpp=2, first_stage_layers=18,
                                 last_stage_layers=18, global_batch_size=512)),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=32, zero_stage=3, dp_replicate=4, dp=32,
                              global_batch_size=128)),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, zero_stage=0, dp=4, dp_replicate=1,
                              global_batch_size=64)),
    ("torchtitan", None, dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, vpp=2, global_batch_size=512,
                              recompute="selective")),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, torch_compile=True)),
    # the flex dispatcher's backend set against the machine's (HybridEP on H100, as Megatron-Bridge v0.4.1's H100
    # Qwen3-30B preset runs it): read back from each framework's own key
    ("megatron-core", None, dict(model="qwen3-30b-a3b", num_gpus=32, ep=16, global_batch_size=256,
                                 moe_token_dispatcher="flex", moe_flex_backend="hybridep")),
    ("megatron-bridge", None, dict(model="qwen3-30b-a3b", num_gpus=32, ep=16, global_batch_size=256,
                                   moe_token_dispatcher="flex", moe_flex_backend="hybridep")),
    ("megatron-bridge", "run_recipe", dict(model="qwen3-30b-a3b", num_gpus=32, ep=16, global_batch_size=256,
                                           moe_token_dispatcher="flex", moe_flex_backend="hybridep")),
    ("verl", None, dict(model="qwen3-30b-a3b", num_gpus=32, tp=2, pp=2, ep=8, global_batch_size=256,
                        moe_token_dispatcher="flex", moe_flex_backend="hybridep")),
    ("skyrl", None, dict(model="qwen3-30b-a3b", num_gpus=32, tp=2, pp=2, ep=8, global_batch_size=320,
                         moe_token_dispatcher="flex", moe_flex_backend="hybridep")),
    ("nemo-automodel", None, dict(model="qwen3-30b-a3b", num_gpus=32, ep=16, global_batch_size=256, zero_stage=3,
                                  moe_token_dispatcher="flex", moe_flex_backend="hybridep")),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, param_offload=True)),
    ("torchtitan", None, dict(model="llama-3.1-8b", num_gpus=8, tp=2, global_batch_size=64, torch_compile=True,
                              tp_comm_overlap=True)),
]


@pytest.mark.parametrize(("framework", "variant", "fields"), CASES,
                         ids=[f"{c[0]}-{c[1] or 'default'}-{'-'.join(k for k in c[2] if k not in WORLD)}"
                              for c in CASES])
def test_a_rendered_config_imports_as_the_plan_it_was_rendered_from(framework, variant, fields):
    request = Request(framework=framework, **fields)
    rendered = api.render_config(framework, request, force=True, **({"variant": variant} if variant else {}))
    imported = api.import_config(rendered.text, path="run.py" if rendered.format == "python" else "run.sh",
                                 framework=framework)
    back = api.request_from_config(imported, {k: v for k, v in fields.items() if k in WORLD})
    assert _fields(back, fields) == _fields(request, fields)


def _fields(request: Request, names) -> dict:
    """The request's fields as resolved: on the plan (the layout and knobs) or the job (batch, precision)."""
    job, plan = resolve(request)
    return {k: getattr(plan, k) if k in type(plan).model_fields else getattr(job, k)
            for k in names if k not in WORLD}


@pytest.mark.parametrize(("name", "line"), [
    ("megatron_deepseek_v3_excerpt.sh", "--moe-token-dispatcher-type"),
    ("bridge_glm5_h100.py", "model.moe_token_dispatcher_type"),
    ("verl_qwen3moe_30b_megatron_96gb.sh", "override_transformer_config.moe_token_dispatcher_type"),
])
def test_upstream_files_with_the_flex_dispatcher_read_it(name, line):
    imported = api.import_file(str(CONFIGS / name))
    assert imported.request["moe_token_dispatcher"] == "flex" and imported.sources["moe_token_dispatcher"].endswith(
        line)


def test_a_dispatcher_meshplan_does_not_time_is_said_not_read_as_another():
    text = ("torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
            "--moe-token-dispatcher-type allgather")
    imported = api.import_config(text, path="train.sh", framework="megatron-core")
    assert "moe_token_dispatcher" not in imported.request
    assert any("--moe-token-dispatcher-type = allgather" in u and "alltoall and flex" in u
               for u in imported.unsupported)


def test_glm5_recipe_reads_its_bf16_gradient_reduce():
    """cfg.mixed_precision.grad_reduce_in_fp32 = False (the recipe's line 98) was read as True."""
    imported = api.import_file(str(CONFIGS / "bridge_glm5_h100.py"))
    assert imported.request["grad_reduce_in_fp32"] is False
    assert imported.sources["grad_reduce_in_fp32"].endswith(":98 mixed_precision.grad_reduce_in_fp32")


@pytest.mark.parametrize(("line", "facts"), [
    ("cfg.mixed_precision = get_mixed_precision_config('bf16_with_fp8_delayed_scaling_mixed')",
     {"precision": "fp8", "fp8_recipe": "delayed", "fp8_param_gather": True}),
    ('cfg.mixed_precision = "bf16_with_fp8_subchannel_scaling_mixed"',
     {"precision": "fp8", "fp8_recipe": "blockwise", "fp8_param_gather": False}),
    ("cfg.mixed_precision = 'bf16_mixed'", {"precision": "bf16"}),
])
def test_a_bridge_preset_states_its_precision(line, facts):
    imported = api.import_config(f"{line}\ncfg.model.tensor_model_parallel_size = 2\n", path="recipe.py",
                                 framework="megatron-bridge")
    assert {k: imported.request.get(k) for k in facts} == facts


def test_a_bridge_field_after_its_preset_wins_and_an_unknown_preset_is_said():
    text = ("cfg.mixed_precision = get_mixed_precision_config('bf16_with_fp8_current_scaling_mixed')\n"
            "cfg.mixed_precision.fp8_param_gather = False\n")
    imported = api.import_config(text, path="recipe.py", framework="megatron-bridge")
    assert imported.request["fp8_param_gather"] is False and imported.request["fp8_recipe"] == "tensorwise"
    unknown = api.import_config("cfg.mixed_precision = 'fp16_mixed'\ncfg.model.tensor_model_parallel_size = 2\n",
                                path="recipe.py", framework="megatron-bridge")
    assert "precision" not in unknown.request
    assert any("fp16_mixed: not a mixed-precision preset meshplan knows" in u for u in unknown.unsupported)


def test_a_ds_config_says_recompute_is_the_model_codes_on_render_and_on_import():
    """A plain ds_config rendered with recompute=full carried no word that nothing in it turns recomputation on, and
    read back it said both "recompute: not read (pass --recompute)" and "recompute = none: left to the framework's
    default". Now it says once what it runs at and why: none, assumed (deepspeed.initialize turns no checkpointing
    on; the section configures deepspeed.checkpointing for the model code), with what cpu_checkpointing then does;
    before, it was 'not read' while check ran at none without a word."""
    request = Request(framework="deepspeed", model="llama-3.1-8b", num_gpus=8, zero_stage=3, recompute="full",
                      activation_offload=True, global_batch_size=64)
    rendered = api.render_config("deepspeed", request)
    assert any("a ds_config turns no recomputation on" in n and "deepspeed.checkpointing.checkpoint" in n
               for n in rendered.notes)
    imported = api.import_config(rendered.text, path="ds_config.json", framework="deepspeed")
    assert imported.defaults["recompute"] == "none" and not any("recompute" in u for u in imported.unresolved)
    said = [a for a in imported.assumed if a.startswith("recompute = none: deepspeed.initialize turns no")]
    assert said and "activation_checkpointing section" in said[0] and "(activation_offload)" in said[0]
    assert "--recompute full" in said[0]
    plain = api.render_config("deepspeed", request.model_copy(update={"recompute": "none",
                                                                       "activation_offload": False}))
    assert not any("turns no recomputation on" in n for n in plain.notes)


def test_upstream_deepseek_v3_script_reads_every_recompute_module():
    """Megatron-LM's DeepSeek-V3 example's `--recompute-modules mlp moe mla_up_proj layernorm` read as ['mlp']."""
    imported = api.import_file(str(CONFIGS / "megatron_deepseek_v3_excerpt.sh"))
    assert imported.request["recompute_modules"] == ["mlp", "moe", "mla_up_proj", "layernorm"]


def test_upstream_deepseek_v3_scripts_rope_position_embedding_is_the_models_own():
    """Megatron-LM's DeepSeek scripts pass --position-embedding-type rope beside --multi-latent-attention (left out,
    GPTModel adds a learned table of max_position_embeddings rows): read as the model's, not 'not deepseek-v3's'; and
    meshplan's own MLA render writes it, so the render imports back without the note."""
    imported = api.import_file(str(CONFIGS / "megatron_deepseek_v3_excerpt.sh"))
    assert not any("--position-embedding-type" in u for u in imported.unsupported)
    rendered = api.render_config("megatron-core", Request(model="deepseek-v2-lite", num_gpus=32, tp=2, pp=2, ep=8,
                                                          etp=1, first_stage_layers=14, last_stage_layers=13))
    assert "--position-embedding-type rope" in rendered.text


SKYRL_CUSTOM_ENTRY = """\
uv run --isolated --extra fsdp -m examples.train.multiply.main_multiply \\
  trainer.strategy=fsdp2 \\
  trainer.policy.model.path="Qwen/Qwen3-8B" \\
  trainer.placement.policy_num_gpus_per_node=8 \\
  trainer.train_batch_size=64 \\
  generator.n_samples_per_prompt=4
"""


def test_a_skyrl_custom_entry_point_over_main_bases_config_is_read_and_said():
    """Most of SkyRL's examples launch their own entry point (examples.train.multiply.main_multiply:
    SkyRLTrainConfig.from_cli_overrides, then main_base's BasePPOExp); each was refused as 'not a SkyRL launch
    script', though its keys had told the format."""
    imported = api.import_config(SKYRL_CUSTOM_ENTRY, path="run_multiply.sh")
    assert imported.framework == "skyrl"
    assert imported.request["prompts_per_step"] == 64 and imported.request["samples_per_prompt"] == 4
    assert imported.request["num_gpus"] == 8 and imported.request["model"] == "Qwen/Qwen3-8B"
    assert any("examples.train.multiply.main_multiply: not one of SkyRL's entry points" in n
               and "is not read" in n for n in imported.notes)


def test_a_command_with_one_framework_key_is_no_custom_entry_point():
    from meshplan.core.errors import MeshplanError

    text = "python prepare_data.py trainer.policy.model.path=Qwen/Qwen3-8B --output_dir /data\n"
    with pytest.raises(MeshplanError, match="no command launches"):
        api.import_config(text, path="prep.sh", framework="skyrl")


@pytest.mark.parametrize(("per_stage", "vpp"), [(None, 2), (4, 4)])
def test_torchtitan_multi_stage_schedule_states_its_stages_per_rank(per_stage, vpp):
    """torchtitan's pipeline_parallel.py: without layers_per_stage a multi-stage schedule runs 2 stages per rank; with
    it ceil((layers + first_less + last_less) / layers_per_stage) virtual stages over pp (Llama-3.1-8B: 32 + 0 + 0
    over 4 per stage, 8 stages on pp 2)."""
    lines = ["--parallelism.pipeline_parallel_first_stage_less_layers 0",
             "--parallelism.pipeline_parallel_last_stage_less_layers 0"]
    if per_stage is not None:
        lines.append(f"--parallelism.pipeline_parallel_layers_per_stage {per_stage}")
    text = ("torchrun --nnodes 1 --nproc-per-node 8 -m torchtitan.train --module llama3 --config llama3_8b "
            "--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 "
            "--parallelism.pipeline_parallel_schedule Interleaved1F1B " + " ".join(lines) + "\n")
    imported = api.import_config(text, path="run.sh", framework="torchtitan")
    assert imported.request["vpp"] == vpp


def test_keys_meshplan_reads_elsewhere_are_said_not_called_inexpressible():
    """Bridge's ddp.grad_reduce_in_fp32 (overwritten by mixed_precision's, which is read) was listed as 'no meshplan
    field' beside the field that decides it."""
    imported = api.import_file(str(CONFIGS / "bridge_glm5_h100.py"))
    assert not any(" ddp.grad_reduce_in_fp32 = " in u for u in imported.unsupported)
    assert any(" ddp.grad_reduce_in_fp32 = " in n for n in imported.notes)


@pytest.mark.parametrize(("name", "key", "backend"), [
    ("bridge_glm5_h100.py", "model.moe_flex_dispatcher_backend", "deepep"),
    ("megatron_deepseek_v3_excerpt.sh", "--moe-flex-dispatcher-backend", "hybridep"),
])
def test_the_flex_dispatchers_backend_is_read_beside_it(name, key, backend):
    """The flex dispatcher's backend was said, not read (the estimate was the machine's backend's); it is the request's
    moe_flex_backend now (flex57), which the estimate times and render writes back."""
    imported = api.import_file(str(CONFIGS / name))
    assert imported.request["moe_flex_backend"] == backend
    assert imported.sources["moe_flex_backend"].endswith(key)


def test_a_backend_beside_the_alltoall_dispatcher_is_said_not_read():
    """Megatron-Bridge's recipes set moe_flex_dispatcher_backend beside the alltoall dispatcher (apply_flex_dispatcher_
    backend switching to flex on the GPUs it allows): the alltoall dispatcher never reads it, so it is said."""
    text = ("cfg.model.moe_token_dispatcher_type = 'alltoall'\ncfg.model.moe_flex_dispatcher_backend = 'hybridep'\n"
            "cfg.model.tensor_model_parallel_size = 2\n")
    imported = api.import_config(text, path="recipe.py", framework="megatron-bridge")
    assert "moe_flex_backend" not in imported.request
    assert any("moe_flex_dispatcher_backend = hybridep: no effect beside the alltoall dispatcher" in n
               for n in imported.notes), imported.notes


@pytest.mark.parametrize(("lines", "said"), [
    (["exp_avg_dtype = torch.bfloat16", "exp_avg_sq_dtype = torch.bfloat16"], None),
    (["exp_avg_dtype = torch.bfloat16", "exp_avg_sq_dtype = torch.float32"], "than the first (torch.bfloat16)"),
    (["exp_avg_sq_dtype = torch.bfloat16"], "than the first (fp32, exp_avg_dtype's default)"),
])
def test_adams_second_moment_dtype_is_read_beside_the_first(lines, said):
    """Render writes optimizer.exp_avg_sq_dtype beside exp_avg_dtype, and import listed it as 'no meshplan field';
    a second moment in another dtype than the first, which the one optimizer_state_dtype cannot hold, was not said."""
    text = "\n".join(["cfg.optimizer.use_precision_aware_optimizer = True",
                      *(f"cfg.optimizer.{line}" for line in lines), "cfg.model.tensor_model_parallel_size = 2", ""])
    imported = api.import_config(text, path="recipe.py", framework="megatron-bridge")
    second = [u for u in imported.unsupported if "exp_avg_sq_dtype" in u]
    if said is None:
        assert not second and imported.request["optimizer_state_dtype"] == "bf16"
    else:
        assert len(second) == 1 and "the second moment in another dtype " + said in second[0]


def test_check_of_a_ds_config_says_the_recompute_it_ran_at():
    """check --config of a plain ds_config ran at recompute none and said only that the file's recompute was 'not
    read (the check does not cover it)': now the report's config_assumed says it ran at none and why, and a
    --recompute given beside the file takes the line away (fails before: no config_assumed)."""
    text = ('{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,\n'
            ' "zero_optimization": {"stage": 2},\n "activation_checkpointing": {"partition_activations": false}}')
    imported = api.import_config(text, path="ds_config.json", framework="deepspeed")
    given = {"model": "llama-3.1-8b", "gpu": "h100", "seq_length": 4096}
    report = api.check_config(api.request_from_config(imported, given), config=imported)
    assert report.plan.recompute == "none"
    assert [a for a in report.config_assumed if a.startswith("recompute = none") and "ds_config.json:3" in a]
    assert not [u for u in report.config_unread if "recompute" in u]
    full = api.check_config(api.request_from_config(imported, {**given, "recompute": "full"}), config=imported)
    assert full.plan.recompute == "full" and not full.config_assumed


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_a_training_job_written_as_an_rl_launcher_reads_back_at_its_sequence_length(framework):
    """An RL variant of a training job wrote no prompt or response length, so the launcher ran, and import read it
    back, at the framework's default lengths (verl's 512 + 512 = 1,024 tokens) instead of the job's 8,192; now both
    are written, summing to seq_length in the framework's default proportion (adapters/rl.training_lengths)."""
    from meshplan.adapters.read import import_config

    ask = Request(model="qwen3-8b", num_gpus=8, framework=framework, zero_stage=3, seq_length=8192, recompute="full")
    rendered = api.render_config(framework, ask, variant="fsdp", force=True)
    back = import_config(rendered.text, rendered.filename)
    assert back.request["job"] == "rl"
    assert back.request["prompt_length"] + back.request["response_length"] == 8192, back.request


@pytest.mark.parametrize("framework, ask", [
    ("megatron-bridge", dict(model="deepseek-v3", gpu="gb200", num_gpus=256, pp=8, ep=32, moe_token_dispatcher="flex")),
    ("megatron-core", dict(model="llama-3.1-70b", num_gpus=64, tp=8, cp=2, seq_length=32768, cp_comm_type="a2a+p2p")),
    ("megatron-bridge", dict(model="llama-3.1-70b", num_gpus=64, tp=8, cp=2, seq_length=32768,
                             cp_comm_type="a2a+p2p")),
])
def test_keys_render_writes_beside_a_setting_are_said_not_reported_unread(framework, ask):
    """Render writes model.moe_shared_expert_overlap false beside the flex dispatcher (as Bridge's
    apply_flex_dispatcher_backend does) and the a2a+p2p group sizes beside cp_comm_type; import listed both as
    'no meshplan field'. The group sizes are now said (the cards' read.said): what meshplan times of them; the
    shared experts' overlap is read into its request field (peaks57: moe_shared_expert_overlap), off."""
    from meshplan.adapters.read import import_config

    rendered = api.render_config(framework, Request(**ask, framework=framework), force=True)
    back = import_config(rendered.text, rendered.filename)
    assert not back.unsupported, back.unsupported
    if ask.get("moe_token_dispatcher") == "flex":
        assert back.request["moe_shared_expert_overlap"] is False
    else:
        assert any("a2a+p2p context parallelism" in n for n in back.notes), back.notes
