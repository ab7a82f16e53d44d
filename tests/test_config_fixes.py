"""`check --config`: each finding's fix also as edits of the checked file, in its own keys and syntax (the key the
file used, at its line, else the framework card's adapter key), on every face."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from meshplan import api
from meshplan.adapters.read import fixes
from meshplan.adapters.read.fixes import config_fixes, file_change, fix_changes, written
from meshplan.faces import cli
from meshplan.schema.reports import Finding
from meshplan.schema.request import Request

CONFIGS = Path(__file__).resolve().parent / "configs"


@pytest.mark.parametrize(("fix", "current", "options"), [
    ("zero_stage=3 (76.5 GiB peak) or pp=2 (62.5 GiB peak) or pp=4 (57.4 GiB peak) fit.", {},
     [{"zero_stage": 3}, {"pp": 2}, {"pp": 4}]),
    ("Use num_gpus = 128 (multiples of 128), or degrees whose product tp*pp*cp divides 8, e.g. one of {1, 2}.", {},
     [{"num_gpus": 128}]),
    ("tp in 2, 4, 8 works.", {}, [{"tp": 2}]),
    ("Set sequence_parallel=false, or use tp>1 if you meant to shard activations.", {"sequence_parallel": True},
     [{"sequence_parallel": False}]),
    ("Set sequence_parallel=false.", {"sequence_parallel": False}, []),  # already so: no change
    ("Drop dp (it is derived: 4) or set num_gpus = dp*tp*pp*cp = 2*4 = 8.", {}, [{"num_gpus": 8}]),
    # a product's value is no assignment of its last factor (it read ep=32 and pp=12 here), and a chain sets each name
    ("Use num_gpus = 32 (multiples of tp*pp*cp*ep = 32) or leave dp to be derived.", {}, [{"num_gpus": 32}]),
    ("Use global_batch_size = 60 or 72 (multiples of mbs*dp*pp = 12), or vpp=1.", {},
     [{"global_batch_size": 60}, {"vpp": 1}]),
    ("Use zero_stage 0-2 for the Megatron engine, or set tp=pp=ep=1 and shard with FSDP.", {},
     [{"tp": 1, "pp": 1, "ep": 1}]),
    # a field the fix drops is cleared where the file sets it (pp=4 with the file's first_stage_layers=31 kept broke
    # PP004/PP007), and named nowhere else
    ("pp=4 (drop first_stage_layers) (46.4 GiB peak) or zero_stage=3 (40.0 GiB peak) fit.",
     {"pp": 2, "first_stage_layers": 31}, [{"pp": 4, "first_stage_layers": None}, {"zero_stage": 3}]),
    ("pp=4 (drop first_stage_layers) (46.4 GiB peak) fits.", {"pp": 2}, [{"pp": 4}]),
])
def test_fix_words_to_field_changes(fix, current, options):
    assert fix_changes(fix, current) == options


@pytest.mark.parametrize(("key", "value", "fmt", "variant", "text"), [
    ("parallelism.tensor_parallel_degree", 4, "toml", None, "[parallelism] tensor_parallel_degree = 4"),
    ("zero_optimization.stage", 3, "json", None, '{"zero_optimization": {"stage": 3}}'),
    ("--tensor-model-parallel-size", 4, "shell", None, "--tensor-model-parallel-size 4"),
    ("--sequence-parallel", False, "shell", None, "(remove --sequence-parallel)"),
    ("--sequence-parallel", True, "shell", None, "--sequence-parallel"),
    ("--parallelism.enable_sequence_parallel", True, "shell", None, "--parallelism.enable_sequence_parallel true"),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", 2, "shell", "megatron",
     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"),
    ("model.sequence_parallel", True, "shell", "python", "cfg.model.sequence_parallel = True"),
])
def test_written_in_the_files_syntax(key, value, fmt, variant, text):
    assert written(key, value, fmt, variant) == text


def test_megatron_script_fixes_use_its_own_flag_and_line():
    imported = api.import_file(str(CONFIGS / "megatron_llama3_8b_h100_fp8.sh"))
    report = api.check_config(api.request_from_config(imported), config=imported)
    fixes = {f.finding: f for f in report.config_fixes}
    line = int(imported.sources["sequence_parallel"].split(":")[1].split()[0])
    assert fixes["SP001"].options == [[file_change(imported, "sequence_parallel", False)]]
    assert fixes["SP001"].options[0][0].text.startswith(f"(remove --sequence-parallel)  # line {line}, was True")
    mem = [[c.text for c in option] for option in fixes["MEM001"].options]
    assert ["--pipeline-model-parallel-size 2"] in mem and ["--pipeline-model-parallel-size 4"] in mem


def test_no_edit_writes_the_value_the_layout_already_has():
    """WS002 on a dense script (megatron_gpt3_175b.sh: TP8 PP16 on 8 GPUs) says 'no ep tiles 8 GPUs at pp=16,
    etp=1': the file leaves etp at its default 1, and check offered `--expert-tensor-parallel-size 1` as WS002's edit,
    a change that changes nothing."""
    imported = api.import_file(str(CONFIGS / "megatron_gpt3_175b.sh"))
    report = api.check_config(api.request_from_config(imported), config=imported)
    assert "WS002" in {f.id for f in report.findings}
    plan = report.plan.model_dump()
    edits = [c for fix in report.config_fixes for option in fix.options for c in option]
    assert edits and not [c.text for c in edits if c.field in plan and plan[c.field] == c.value]


def test_a_dp_the_file_leaves_to_the_gpu_count_follows_without_an_edit():
    """CP002's 'Use cp=1 (dp=16)' on a verl script stating ulysses_sequence_parallel_size 2 and no dp (verl derives
    it) wrote 'dp=16  # meshplan knows no verl key for dp' as a line to paste: the dp follows from the GPU count."""
    text = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \\\n"
            "  actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 trainer.n_gpus_per_node=8 trainer.nnodes=2\n")
    imported = api.import_config(text, path="run.sh")
    change = file_change(imported, "dp", 16)
    assert change.key is None and change.text == "(dp 16 follows: verl derives it from the GPU count, no key to set)"
    assert file_change(imported, "cp", 1).text.startswith("actor_rollout_ref.actor.ulysses_sequence_parallel_size=1")


def test_a_dropped_field_is_the_files_key_removed_at_its_line():
    text = ("torchrun --nproc_per_node 8 pretrain_gpt.py --pipeline-model-parallel-size 2 \\\n"
            "  --decoder-first-pipeline-num-layers 31\n")
    imported = api.import_config(text, path="job.sh")
    change = file_change(imported, "first_stage_layers", None)
    assert (change.key, change.line, change.text) == ("--decoder-first-pipeline-num-layers", 2,
                                                      "(remove --decoder-first-pipeline-num-layers)  # line 2")


def test_torchtitan_toml_fix_is_a_toml_key_of_its_release():
    imported = api.import_file(str(CONFIGS / "torchtitan_llama3_8b.toml"))
    report = api.check_config(api.request_from_config(imported, {"num_gpus": 1}), config=imported)
    texts = [c.text for fix in report.config_fixes for option in fix.options for c in option]
    assert "[training] enable_cpu_offload = true" in texts  # 0.2's TOML key, not 0.3's --training.* flag


def test_tp_stated_in_the_toml_is_changed_at_its_line():
    imported = api.import_file(str(CONFIGS / "torchtitan_llama3_8b.toml"))
    change = file_change(imported, "tp", 2)
    assert change.line == 41 and change.text == "[parallelism] tensor_parallel_degree = 2  # line 41, was 1"


def test_deepspeed_json_keys_and_launcher_flags():
    imported = api.import_file(str(CONFIGS / "ds_zero_stage_1_baseline.json"))
    assert file_change(imported, "zero_stage", 2).text == '{"zero_optimization": {"stage": 2}}  # line 6, was 1'
    assert file_change(imported, "tp", 2).text.endswith("# on the launch command line, not in this file")


def test_a_knob_with_a_vocabulary_is_written_in_the_framework_s_word():
    """MEM001's 'optimizer_offload=true' on a ds_config was written {"offload_optimizer": {"device": true}}, which
    DeepSpeed's OffloadDeviceEnum (none, cpu, nvme) refuses; AutoModel's attention 'flash' as model.backend.attn:
    flash, where its word is sdpa. A fix writes the card's word (AdapterKnob.values) for the value."""
    imported = api.import_file(str(CONFIGS / "ds_zero_stage_1_baseline.json"))
    assert file_change(imported, "optimizer_offload", True).text.startswith(
        '{"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}')
    assert file_change(imported, "param_offload", False).text.startswith(
        '{"zero_optimization": {"offload_param": {"device": "none"}}}')
    assert file_change(imported, "zero_stage", 2).text.startswith('{"zero_optimization": {"stage": 2}}')
    automodel = next(p for p in sorted(CONFIGS.glob("*.yaml")) if api.import_file(str(p)).framework ==
                     "nemo-automodel")
    assert file_change(api.import_file(str(automodel)), "attention_backend", "flash").text.startswith(
        "model.backend.attn=sdpa")


def test_misses_are_no_fixes():
    imported = api.import_file(str(CONFIGS / "torchtitan_llama3_8b.toml"))
    miss = Finding(id="MEM001", severity="error", message="m",
                   fix="none of the nearby layouts fits (micro_batch_size=1: 129.2 GiB); more GPUs are needed.")
    assert config_fixes(imported, [miss]) == []


def test_without_a_config_check_is_unchanged():
    imported = api.import_file(str(CONFIGS / "megatron_llama3_8b_h100_fp8.sh"))
    plain = api.check_config(api.request_from_config(imported))
    assert plain.config_fixes == []
    assert api.check_config(api.request_from_config(imported), config=imported).findings == plain.findings


def test_cli_and_mcp_give_the_same_file_fixes(capsys):
    from meshplan.faces.mcp.server import app

    path = CONFIGS / "megatron_llama3_8b_h100_fp8.sh"
    imported = api.import_file(str(path))
    expected = api.check_config(api.request_from_config(imported), config=imported).config_fixes
    assert cli.main(["check", "--config", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["config_fixes"] == [f.model_dump(mode="json") for f in expected]
    assert cli.main(["check", "--config", str(path)]) == 1
    assert "fixes in your file's own keys" in capsys.readouterr().out

    async def call():
        return await app.call_tool("check_config", {"model": imported.request["model"],
                                                    "config_text": path.read_text(encoding="utf-8")})

    structured = anyio.run(call).structured_content
    texts = [[c["text"] for c in o] for f in structured["config_fixes"] for o in f["options"]]
    assert texts == [[c.text.replace(str(path), "<config_text>") for c in o] for f in expected for o in f.options]


def test_verl_rl_file_with_ppo_mini_batches_is_checkable():
    # ppo_mini_batch_size 128 of train_batch_size 512 prompts: 4 optimizer steps per RL step, read as
    # prompts_per_mini_batch; stating it as global_batch_size made the file's own request invalid
    imported = api.import_file(str(CONFIGS / "verl_qwen3moe_30b_megatron_96gb.sh"))
    assert "global_batch_size" not in imported.request
    assert imported.request["prompts_per_mini_batch"] == 128 and imported.request["prompts_per_step"] == 512
    assert not any("optimizer steps" in u for u in imported.unsupported)
    report = api.check_config(api.request_from_config(imported, {"model": "qwen3-30b-a3b"}), config=imported)
    assert report.framework == "verl" and report.findings


def test_rl005_says_the_micro_batch_tokens_as_tokens():
    """The file on an 80 GB H100 (it is written for 96 GB): the update phase is over, and RL005 listed its packed
    micro-batch's token count among the bytes, 'micro batch tokens 0.0 GiB'; it says the tokens as tokens."""
    imported = api.import_file(str(CONFIGS / "verl_qwen3moe_30b_megatron_96gb.sh"))
    report = api.check_config(api.request_from_config(imported, {"model": "qwen3-30b-a3b", "gpu": "h100"}),
                              config=imported)
    (rl005,) = [f for f in report.findings if f.id == "RL005"]
    assert "the actor_update phase" in rl005.message and "tokens 0.0 GiB" not in rl005.message
    assert "micro-batches of 10,240 tokens" in rl005.message


def test_a_skyrl_sft_script_fix_is_in_main_sft_keys():
    """`check --config` of SkyRL's examples/train/sft/run_sft_megatron.sh (main_sft, SFTConfig's top-level keys) wrote
    its fixes as trainer.policy.megatron_config.tensor_model_parallel_size=2 (the RL entry point's key, which main_sft's
    strict SFTConfig refuses): the import read main_sft's keys as main_base's and recorded the renamed key. The file's
    own key, at its line, is the one a fix writes; a field the file does not set takes main_sft's key from the card."""
    text = ("python -m skyrl.train.main_sft strategy=megatron model.path=Qwen/Qwen3-8B max_length=4096 \\\n"
            "  batch_size=64 micro_train_batch_size_per_gpu=1 placement.num_nodes=1 placement.num_gpus_per_node=8 \\\n"
            "  megatron_config.tensor_model_parallel_size=1 megatron_config.context_parallel_size=1 \\\n"
            "  fsdp_config.cpu_offload=false\n")
    imported = api.import_config(text, path="run_sft_megatron.sh")
    assert imported.sources["tp"] == "run_sft_megatron.sh:3 megatron_config.tensor_model_parallel_size"
    report = api.check_config(api.request_from_config(imported, {"gpu": "a100-40gb"}), config=imported)
    edits = [c.text for fix in report.config_fixes for option in fix.options for c in option]
    assert edits and not [e for e in edits if e.startswith("trainer.")], edits
    assert "megatron_config.tensor_model_parallel_size=2  # line 3, was 1" in edits


def test_a_fix_keeping_expert_tp_beside_a_wider_tp_writes_it_where_the_file_leaves_it_out():
    """MEM001's 'tp=2, etp=1' on a Megatron-Bridge config with no expert_tensor_parallel_size: etp 1 is in effect
    (tp 1), so the edit wrote tp alone, and the file with tp=2 takes Megatron-Core's etp = tp default (etp 2), not the
    layout the fix estimated. A field the resolver derives from one the option changes is written too."""
    request = Request(model="mixtral-8x22b", framework="megatron-bridge", gpu="b200", num_gpus=32,
                          seq_length=32768, pp=2, ep=8, recompute="full", micro_batch_size=4)
    text = api.render_config("megatron-bridge", request, force=True).text
    text = "\n".join(line for line in text.splitlines() if "expert_tensor_parallel_size" not in line)
    imported = api.import_config(text, path="recipe.py", framework="megatron-bridge")
    report = api.check_config(api.request_from_config(imported, {"model": "mixtral-8x22b", "gpu": "b200",
                                                                 "num_gpus": 32}), config=imported)
    mem = next(f for f in report.findings if f.id == "MEM001")
    assert "tp=2, etp=1, sequence_parallel=true (" in mem.fix
    options = [[c.text for c in option] for fix in report.config_fixes if fix.finding == "MEM001"
               for option in fix.options]
    widened = next(option for option in options if any("tensor_model_parallel_size = 2" in t for t in option))
    assert "cfg.model.expert_tensor_parallel_size = 1" in widened
    assert fix_changes("tp=2, etp=1", {}, {"tp": 1, "etp": 1}) == [{"tp": 2, "etp": 1}]
    assert fix_changes("no ep tiles 8 GPUs at pp=16, etp=1", {}, {"pp": 16, "etp": 1}) == []


AUTOMODEL_RECIPE = """step_scheduler:
  global_batch_size: 32
  local_batch_size: 4
model:
  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B
distributed:
  strategy: fsdp2
  dp_size: 8
  tp_size: 1
  cp_size: 1
  pp_size: 1
  ep_size: 1
dataset:
  seq_length: 4096
"""


def test_a_key_that_carries_its_value_is_written_as_the_files_setting():
    """AutoModel's knobs whose card key carries the value ('distributed.activation_checkpointing selective',
    'distributed.strategy ddp') were printed as that key, a line that sets nothing; each is the key set to it in the
    file's syntax, as the fix beside it ('distributed.activation_checkpointing=full')."""
    imported = api.import_config(AUTOMODEL_RECIPE, path="recipe.yaml")
    assert file_change(imported, "recompute", "selective").text == "distributed.activation_checkpointing=selective"
    assert file_change(imported, "zero_stage", 2).text == "distributed.reshard_after_forward=false"


def test_an_automodel_recipe_stating_its_mesh_states_its_gpus():
    """A recipe at dp_size 8 and tp / pp / cp 1 was checked on 8 GPUs while its reading said 'num_gpus: the file does
    not say how many GPUs': AutoModel's mesh is the world, so the sizes give the count, said with its lines."""
    imported = api.import_config(AUTOMODEL_RECIPE, path="recipe.yaml")
    assert imported.request["num_gpus"] == 8
    assert "dp x cp x tp x pp" in imported.sources["num_gpus"]
    assert not any("how many GPUs" in line for line in imported.unresolved)
    unstated = api.import_config(AUTOMODEL_RECIPE.replace("  dp_size: 8\n", ""), path="recipe.yaml")
    assert "num_gpus" not in unstated.request  # dp left to the world: the count is the launcher's


MEGATRON_FSDP_SCRIPT = (
    "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
    "  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \\\n"
    "  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 \\\n"
    "  --ffn-hidden-size 14336 \\\n"
    "  --seq-length 4096 --max-position-embeddings 131072 --micro-batch-size 1 --global-batch-size 64 \\\n"
    "  --bf16 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --vocab-size 128256 \\\n"
    "  --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --ckpt-format {ckpt}\n")
BRIDGE_FSDP_YAML = ("model:\n  tensor_model_parallel_size: 1\n  pipeline_model_parallel_size: 1\n  seq_length: 4096\n"
                    "train:\n  global_batch_size: 64\n  micro_batch_size: 1\nddp:\n  use_distributed_optimizer: true\n"
                    "  use_megatron_fsdp: true\n  data_parallel_sharding_strategy: optim_grads\ncheckpoint:\n"
                    "  ckpt_format: {ckpt}\n")


def _zero3_options(path: Path, given: dict) -> list[list[str]]:
    """The lines of each fix option that moves the file to zero_stage 3 (MEM001's on 8 A100-40GB)."""
    imported = api.import_file(str(path))
    report = api.check_config(api.request_from_config(imported, given), config=imported)
    options = [[c.text for c in option] for fix in report.config_fixes for option in fix.options]
    return [option for option in options if any("optim_grads_params" in text for text in option)]


@pytest.mark.parametrize("ckpt", ["fsdp_dtensor", "torch_dist"])
def test_a_beside_key_the_file_states_is_not_written_again(tmp_path, ckpt):
    """The zero_stage 3 fix wrote ddp.use_megatron_fsdp=true and checkpoint.ckpt_format=fsdp_dtensor (Bridge) and
    --ckpt-format fsdp_dtensor (Megatron-Core) beside the sharding strategy though the file stated them: a second
    line for a key the file has. A key it states with the value is left; one with another value is changed on its
    own line (ImportedConfig.beside_stated). Megatron-Core's strategy itself was the card's whole key,
    '--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params', beside the file's line 7."""
    yaml_path = tmp_path / "override.yaml"
    yaml_path.write_text(BRIDGE_FSDP_YAML.format(ckpt=ckpt))
    bridge = _zero3_options(yaml_path, {"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "a100-40gb"})
    script = tmp_path / "train.sh"
    script.write_text(MEGATRON_FSDP_SCRIPT.format(ckpt=ckpt))
    core = _zero3_options(script, {"gpu": "a100-40gb"})
    assert bridge and core
    for option in bridge:
        assert not any(text.startswith("ddp.use_megatron_fsdp") for text in option)  # line 10 says true
        ckpt_lines = [text for text in option if text.startswith("checkpoint.ckpt_format")]
        assert ckpt_lines == ([] if ckpt == "fsdp_dtensor" else
                              ["checkpoint.ckpt_format=fsdp_dtensor  # line 13, was torch_dist"])
    for option in core:  # the strategy changed on its own line, --use-megatron-fsdp not written a second time
        assert "--data-parallel-sharding-strategy optim_grads_params  # line 7, was optim_grads" in option
        assert not any("--use-megatron-fsdp" in text for text in option)
        ckpt_lines = [text for text in option if text.startswith("--ckpt-format")]
        assert ckpt_lines == ([] if ckpt == "fsdp_dtensor" else
                              ["--ckpt-format fsdp_dtensor  # line 7, was torch_dist"])


def test_a_fixed_fields_card_knob_is_looked_up_once(monkeypatch):
    """beside_changes looked the card's knob up again after file_change had: one look-up per field and value now,
    for a field the file leaves out (recompute on a Bridge override)."""
    imported = api.import_config(BRIDGE_FSDP_YAML.format(ckpt="torch_dist"), path="override.yaml")
    calls = []
    looked_up = fixes._card_knob
    monkeypatch.setattr(fixes, "_card_knob", lambda *args: calls.append(args[1:]) or looked_up(*args))
    changes = fixes._changes(imported, "recompute", "full")
    assert [c.text for c in changes] == ["model.recompute_granularity=full"] and calls == [("recompute", "full")]


def test_megatron_fsdp_fix_writes_the_checkpoint_format_megatron_asserts(tmp_path):
    """Megatron-LM's validate_args asserts --ckpt-format fsdp_dtensor beside --use-megatron-fsdp: a zero_stage 3 fix
    on a pretrain_gpt script writes it (the card's AdapterKnob.beside), as render does."""
    script = tmp_path / "train.sh"
    script.write_text(
        "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
        "  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \\\n"
        "  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 \\\n"
        "  --ffn-hidden-size 14336 \\\n"
        "  --seq-length 4096 --max-position-embeddings 131072 --micro-batch-size 1 --global-batch-size 64 \\\n"
        "  --bf16 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --vocab-size 128256\n")
    imported = api.import_file(str(script))
    report = api.check_config(api.request_from_config(imported, {"gpu": "a100-40gb"}), config=imported)
    options = [[c.text for c in option] for fix in report.config_fixes for option in fix.options]
    fsdp = [option for option in options if any("--use-megatron-fsdp" in text for text in option)]
    assert fsdp and all("--ckpt-format fsdp_dtensor" in option for option in fsdp)
