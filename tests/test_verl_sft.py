"""verl's SFT trainer (`torchrun -m verl.trainer.sft_trainer`, verl 0.9.1, and the older
`verl.trainer.fsdp_sft_trainer`): its launch scripts and Hydra YAML read into a training job, its batch assert as rule
VL003, and render of a training job on the FSDP engine writing it, read back as the same job. Before, the scripts were
read as verl's RL trainer (job rl, the SFT keys 'no meshplan field'), the YAML refused, and render wrote main_ppo for
a training job."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read import import_config, import_file
from meshplan.adapters.render import render
from meshplan.faces.cli import main
from meshplan.request.resolve import resolve
from meshplan.rules.engine import structural_findings
from meshplan.schema.request import Request

CONFIGS = Path(__file__).parent / "configs"

# volcengine/verl b178a3c examples/sft (tests/configs/SOURCES.txt): the GPU count is the script's $1
EXAMPLES = {
    "verl_sft_deepseek_6b7.sh": {
        "job": "sft", "model": "deepseek-ai/deepseek-coder-6.7b-instruct", "micro_batch_size": 4, "cp": None,
        "global_batch_size": 256, "seq_length": 1024, "recompute": "full", "zero_stage": 3, "tp": 1, "pp": 1},
    "verl_sft_qwen_05_peft.sh": {
        "job": "lora", "model": "Qwen/Qwen2.5-0.5B-Instruct", "lora_rank": 32, "micro_batch_size": 4,
        "lora_targets": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "global_batch_size": 256},
    # data.micro_batch_size (deprecated) is read by no trainer: micro_batch_size_per_gpu's default 4 runs
    "verl_sft_qwen_05_sp2.sh": {"job": "sft", "cp": 2, "micro_batch_size": 4, "zero_stage": 3},
    # verl/trainer/config/sft_trainer.yaml itself: every default, nothing unread
    "verl_sft_trainer.yaml": {
        "job": "sft", "model": "~/models/gemma-1.1-7b-it", "global_batch_size": 256, "micro_batch_size": 4,
        "seq_length": 1024, "recompute": "full", "cp": 1, "zero_stage": 3, "lora_rank": None, "lora_targets": None},
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_verl_sft_examples_are_training_jobs(name):
    got = import_file(str(CONFIGS / name))
    assert (got.framework, got.variant) == ("verl", "sft-fsdp")
    for field, value in EXAMPLES[name].items():
        assert got.request.get(field) == value, (field, got.request, got.sources)
    assert got.unsupported == [], got.unsupported


def test_the_sft_scripts_gpu_count_is_torchruns():
    text = (CONFIGS / "verl_sft_qwen_05_sp2.sh").read_text().replace("$nproc_per_node", "4", 1)
    got = import_config(text, "run_qwen_05_sp2.sh")
    assert (got.request["num_gpus"], got.request["gpus_per_node"]) == (4, 4)
    assert "trainer.n_gpus_per_node" not in str(got.sources)


def test_the_engine_trainer_packs_micro_batches_to_its_token_budget_by_default():
    """sft_trainer_engine.yaml: use_dynamic_bsz True, max_token_len_per_gpu 8192 (x Ulysses) over max_length 1024."""
    script = "torchrun --nnodes=1 --nproc_per_node=8 -m verl.trainer.sft_trainer model.path=Qwen/Qwen2.5-7B {}\n"
    packed = import_config(script.format("engine.ulysses_sequence_parallel_size=2"), "sft.sh")
    assert (packed.request["micro_batch_size"], packed.request["num_gpus"], packed.request["cp"]) == (16, 8, 2)
    fixed = import_config(script.format("data.use_dynamic_bsz=false data.micro_batch_size_per_gpu=2"), "sft.sh")
    assert fixed.request["micro_batch_size"] == 2 and fixed.unsupported == []


@pytest.mark.parametrize(("words", "said"), [
    ("ulysses_sequence_parallel_size=2", "refuses to start"),  # use_remove_padding False by default there
    ("model.fsdp_config.cpu_offload=true model.fsdp_config.offload_params=true", "CPUOffload"),
    ("model.use_liger=true", "Liger"),
    ("model.strategy=ddp", "FSDP"),
])
def test_what_the_sft_trainer_runs_but_meshplan_does_not_model_is_said(words, said):
    got = import_config("torchrun --nproc_per_node=8 -m verl.trainer.fsdp_sft_trainer "
                        f"model.partial_pretrain=Qwen/Qwen2.5-7B {words}\n", "sft.sh")
    assert any(said in line for line in got.unsupported), got.unsupported


def test_lora_rank_zero_is_no_lora():
    got = import_config("torchrun --nproc_per_node=8 -m verl.trainer.fsdp_sft_trainer model.lora_rank=0 "
                        "model.target_modules=all-linear model.partial_pretrain=Qwen/Qwen2.5-7B\n", "sft.sh")
    assert got.request["job"] == "sft" and "lora_rank" not in got.request and "lora_targets" not in got.request


PLANS = [
    dict(cp=2, micro_batch_size=2, global_batch_size=64, recompute="full"),
    dict(cp=1, micro_batch_size=1, global_batch_size=32, recompute="none", param_offload=True,
         optimizer_offload=True, attention_backend="unfused"),
    dict(cp=4, micro_batch_size=1, global_batch_size=16, job="lora", recompute="full", activation_offload=True),
]


@pytest.mark.parametrize("fields", PLANS)
def test_render_writes_the_sft_trainer_and_reads_back_the_same_job(fields):
    request = Request(model="qwen2.5-7b", gpu="h100", num_gpus=16, framework="verl", zero_stage=3, **fields)
    job, plan = resolve(request)
    result = render("verl", job, plan)
    assert result.variant == "sft-fsdp" and "-m verl.trainer.sft_trainer" in result.text
    assert "main_ppo" not in result.text and "actor_rollout_ref" not in result.text
    imported = import_config(result.text, "run_verl_sft.sh")
    assert imported.unsupported == [] and imported.variant == "sft-fsdp", imported.unsupported
    back_job, back_plan = resolve(api.request_from_config(imported, {"model": "qwen2.5-7b", "gpu": "h100"}))
    assert back_plan == plan
    assert (back_job.rl, back_job.global_batch_size, back_job.seq_length, back_job.lora, back_job.num_gpus) == (
        None, job.global_batch_size, job.seq_length, job.lora, job.num_gpus)


def test_the_sft_trainers_batch_assert_is_vl003_not_the_ppo_trainers():
    """A training job on verl's FSDP engine: VL003 (train_batch_size over dp in whole micro-batches), not VL001's
    n_gpus minimal batch of main_ppo, which the SFT trainer never checks."""
    ids = [f.id for f in structural_findings(*resolve(Request(
        model="llama-3.1-8b", num_gpus=8, framework="verl", zero_stage=3, cp=2, micro_batch_size=4,
        global_batch_size=24)))]
    assert "VL003" in ids and "VL001" not in ids
    ids = [f.id for f in structural_findings(*resolve(Request(
        model="llama-3.1-8b", num_gpus=8, framework="verl", zero_stage=3, cp=2, micro_batch_size=1,
        global_batch_size=12)))]  # 12 over dp 4 in micro-batches of 1: the SFT trainer runs it; main_ppo wanted 8 | 12
    assert ids.count("VL003") == 0 and "VL001" not in ids


def test_check_config_of_an_sft_script(tmp_path, capsys):
    path = tmp_path / "run_qwen_05_sp2.sh"
    path.write_text((CONFIGS / "verl_sft_qwen_05_sp2.sh").read_text())
    assert main(["check", "--config", str(path), "--num-gpus", "8", "--model", "qwen2.5-7b"]) == 0
    out = capsys.readouterr().out
    assert "TP1 PP1 CP2 DP4" in out and "ulysses_sequence_parallel_size" in out


@pytest.mark.parametrize(("launcher", "key"), [("fsdp_sft_trainer", "ulysses_sequence_parallel_size"),
                                               ("sft_trainer", "engine.ulysses_sequence_parallel_size")])
def test_a_fix_is_written_in_the_entry_points_own_key(launcher, key):
    """check's fix of a field the file leaves out: fsdp_sft_trainer's top-level Ulysses key, not sft_trainer's
    engine key (which fsdp_sft_trainer's config has not: Hydra refuses it), also for a LoRA job."""
    from meshplan.adapters.read.fixes import file_change

    imported = import_config(f"torchrun --nproc_per_node=8 -m verl.trainer.{launcher} model.lora_rank=8\n", "sft.sh")
    assert file_change(imported, "cp", 2).text == f"{key}=2"


@pytest.mark.parametrize(("words", "unsupported", "variant"), [
    ("engine=fsdp optim=fsdp model=hf_model", False, "sft-fsdp"),
    ("engine=megatron optim=megatron", False, "sft-megatron"), ("engine=veomni optim=veomni", True, "sft-fsdp")])
def test_the_engine_trainers_config_groups(words, unsupported, variant):
    """sft_trainer_engine.yaml's groups (run_sft_engine.sh writes engine=${backend} optim=${backend}): FSDP and
    Megatron are what meshplan reads (read.sft engines), another engine is said; all were 'no meshplan field'."""
    got = import_config(f"torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer {words}\n", "sft.sh")
    assert bool(got.unsupported) is unsupported and all("no meshplan field" not in u for u in got.unsupported)
    assert got.variant == variant


def test_yaml_errors_name_the_line_and_the_kind_of_file_on_both_yaml_readers():
    """verl's SFT YAML and AutoModel's recipe share adapters/read/settings.yaml_settings (compose, the bad line, a
    non-mapping refused): each names its own kind of file. verl's error said only 'Fix that line.' before."""
    from meshplan.adapters.read.settings import yaml_settings
    from meshplan.core.errors import MeshplanError

    with pytest.raises(MeshplanError, match=r"^sft\.yaml:4: not valid YAML") as bad:
        import_config("engine:\n  strategy: fsdp2\n  fsdp_size: [1\nmodel:\n  path: x\n", "sft.yaml")
    assert "verl's SFT config is one YAML mapping" in bad.value.fix
    with pytest.raises(MeshplanError, match=r"^r\.yaml: the YAML is a list \(2 items\), not a mapping of "
                                                 r"keys; verl's SFT config is a YAML mapping") as listed:
        yaml_settings("- 1\n- 2\n", "r.yaml", "verl's SFT config", "Pass sft_trainer.yaml or a copy.")
    assert listed.value.fix == "Pass sft_trainer.yaml or a copy."
    with pytest.raises(MeshplanError, match=r"^r\.yaml: the YAML is a list \(1 item\), not a mapping of keys; "
                                                 r"an AutoModel recipe is a YAML mapping"):
        import_config("- distributed\n", "r.yaml", framework="nemo-automodel", config_format="yaml")
    got = yaml_settings("a:\n  b: null\n  c: [1, 2]\n  p:\n    _target_: x\n", "f.yaml", "a file", "-",
                        switches=("p",))
    assert [(s.key, s.value, s.line) for s in got] == [("a.b", "null", 2), ("a.c", [1, 2], 3), ("a.p", True, 4)]


def test_an_empty_configuration_names_every_format_read():
    """The fix named 'a launch script, TOML or JSON file', leaving out the YAML that verl's SFT trainer and AutoModel
    are read from."""
    from meshplan.core.errors import MeshplanError

    with pytest.raises(MeshplanError, match="the configuration is empty") as empty:
        import_config("  \n", "sft.yaml")
    assert empty.value.fix == "Pass a launch script or a TOML, JSON or YAML file."


@pytest.mark.parametrize(("job", "key"), [("sft", "model.use_remove_padding"),
                                          ("rl", "actor_rollout_ref.model.use_remove_padding")])
def test_vl002_names_the_key_of_the_trainer_render_writes(job, key):
    """VL002 told a training job (verl's SFT trainer, whose config has no actor_rollout_ref) to set
    actor_rollout_ref.model.use_remove_padding; it names the key render writes for that trainer."""
    request = Request(model="qwen2.5-7b", gpu="h100", num_gpus=16, framework="verl", zero_stage=3, cp=2, job=job,
                      micro_batch_size=1, global_batch_size=64)
    job_, plan = resolve(request)
    (finding,) = [f for f in structural_findings(job_, plan) if f.id == "VL002"]
    assert f"requires {key}=True, that key's default" in finding.message  # said where a file sets it True already
    assert finding.fix.startswith(f"Leave {key} at True")
    assert f" {key}=true" in render("verl", job_, plan).text


# verl b178a3c verl/trainer/config/sft_trainer_engine.yaml's shape: no `model:` or `engine:` section (both come from
# its defaults list), so neither was told by the old `^engine:` / `^model:` lines
ENGINE_YAML = ("defaults:\n  - model@model: hf_model\n  - engine@engine: fsdp\n  - optim@optim: fsdp\n  - _self_\n"
               "data:\n  train_batch_size: 128\n  micro_batch_size_per_gpu: 2\n  max_length: 2048\n"
               "checkpoint:\n  save_contents: [model, optimizer]\n"
               "trainer:\n  n_gpus_per_node: 8\n  nnodes: 2\n")
NO_MODEL = "data:\n  train_batch_size: 64\n  max_length: 4096\noptim:\n  lr: 1e-5\ntrainer:\n  n_gpus_per_node: 8\n"


@pytest.mark.parametrize("text", [ENGINE_YAML, NO_MODEL, "engine:\n  ulysses_sequence_parallel_size: 2\n"
                                  "data:\n  train_batch_size: 64\n"])
def test_a_verl_sft_yaml_without_a_model_section_is_told_by_its_sections(text):
    """Passed as config_text (no path) it was taken for a shell script ('cannot tell which framework this shell file
    is for'), and as a .yaml file read as a NeMo AutoModel recipe: the format is told from the YAML's top-level keys
    (the card's read.sft sections). Fails before."""
    got = import_config(text)
    assert (got.config_format, got.framework, got.variant, got.request["job"]) == ("yaml", "verl", "sft-fsdp", "sft")
    assert got.request["global_batch_size"] in (128, 64)
    assert import_config(text, "sft.yaml", config_format="yaml").framework == "verl"


def test_the_packaged_engine_yaml_reads_its_gpus_and_batch():
    """The packaged config read as verl's (it was read as an AutoModel recipe stating nothing); its trainer.nnodes and
    n_gpus_per_node are sft_trainer_ray.py's, torchrun sets this trainer's world."""
    got = import_config(ENGINE_YAML, "sft_trainer_engine.yaml", config_format="yaml")
    assert (got.framework, got.request["global_batch_size"], got.request["seq_length"]) == ("verl", 128, 2048)
    assert any(u.startswith("num_gpus: ") for u in got.unresolved)


@pytest.mark.parametrize("face", ["import", "check"])
def test_a_yaml_mapping_of_neither_config_names_its_keys(tmp_path, capsys, face):
    """A YAML mapping that is neither an AutoModel recipe nor verl's SFT config is refused with its keys, as config_text
    and as a file (before: 'this shell file', or read as an AutoModel recipe stating nothing)."""
    from meshplan.core.errors import MeshplanError

    text = "wandb:\n  project: x\ndata:\n  train_batch_size: 64\n"
    with pytest.raises(MeshplanError, match=r"cannot tell which framework this YAML file is for: its top-level keys "
                                            r"\(wandb, data\)") as exc:
        import_config(text)
    assert "not wandb" in str(exc.value) and "--framework" in exc.value.fix
    path = tmp_path / "job.yaml"
    path.write_text(text)
    assert main([face, *(["--config"] if face == "check" else []), str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which framework this YAML file is for" in err and "Traceback" not in err


def test_the_mcp_tools_read_a_verl_sft_yaml_as_config_text():
    from meshplan.faces.mcp import tools

    answer = tools.check_config(model="qwen2.5-7b", gpu="h100", config_text=NO_MODEL, num_gpus=8)
    assert answer.framework == "verl" and answer.plan.zero_stage == 3


# ----------------------------------------------------- verl's model.target_parameters (PEFT's ParamWrapper on experts)

TARGET_PARAMETERS = ("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer {engine}model.path=Qwen/Qwen3-30B-A3B "
                     "data.train_batch_size=64 {lora}model.target_parameters=[mlp.experts.gate_up_proj,"
                     "mlp.experts.down_proj]\n")


def test_target_parameters_on_the_fsdp_engine_is_read_as_lora_target_parameters(tmp_path, capsys):
    """verl 0.9.1 hands model.target_parameters to PEFT (workers/engine/fsdp/transformer_impl.py LoraConfig), whose
    ParamWrapper adapts the routed experts' 3D weights. It was refused an estimate; now it is read as the job's
    lora_target_parameters (an entry ending with gate_up_proj or down_proj, as PEFT matches it) and the job is
    estimated with them (fails before: refused)."""
    from meshplan.core.errors import MeshplanError

    text = TARGET_PARAMETERS.format(engine="", lora="model.lora_rank=16 ")
    got = import_config(text, "sft.sh")
    assert not [u for u in got.unsupported if "target_parameters" in u]
    assert got.request["lora_target_parameters"] == ["gate_up_proj", "down_proj"]
    assert got.sources["lora_target_parameters"] == "sft.sh:1 model.target_parameters"
    req = api.request_from_config(got, {"gpu": "h100"})
    assert req.lora_target_parameters == ["gate_up_proj", "down_proj"] and req.lora_rank == 16
    path = tmp_path / "sft.sh"
    path.write_text(text)
    main(["check", "--config", str(path), "--gpu", "h100"])
    assert "Traceback" not in capsys.readouterr().err
    rl = import_config("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B "
                       "actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.target_parameters=[down_proj] "
                       "trainer.n_gpus_per_node=8 trainer.nnodes=1 data.train_batch_size=64\n", "rl.sh")
    assert api.request_from_config(rl, {"gpu": "h100"}).lora_target_parameters == ["down_proj"]
    other = import_config(TARGET_PARAMETERS.format(engine="", lora="model.lora_rank=16 ").replace(
        "mlp.experts.down_proj]", "mlp.router.weight]"), "sft.sh")
    with pytest.raises(MeshplanError, match=r"mlp\.router\.weight names no routed-expert weight meshplan counts"):
        api.request_from_config(other, {"gpu": "h100"})


def test_target_parameters_beside_no_lora_or_on_the_megatron_engine_is_only_said():
    """Without a LoRA rank nothing is adapted, and verl's Megatron engine builds Megatron-Bridge's LoRA from
    model.lora, reading no target_parameters: those files still estimate."""
    full = import_config(TARGET_PARAMETERS.format(engine="", lora=""), "sft.sh")
    assert api.request_from_config(full, {"gpu": "h100"}).job == "sft"
    megatron = import_config(TARGET_PARAMETERS.format(engine="engine=megatron optim=megatron ",
                                                      lora="model.lora.rank=16 "), "sft.sh")
    assert any("not read by the engine the file runs (sft-megatron)" in n for n in megatron.notes)
    assert api.request_from_config(megatron, {"gpu": "h100"}).lora_rank == 16


def test_cp002_on_a_ulysses_engine_names_its_all_to_alls_and_no_tp():
    """CP002 told verl's FSDP engine (Ulysses, no TP) that the attention could not hide 'the exchange of K/V chunks'
    and to 'shard memory with TP/SP'; its all-to-alls are what nothing overlaps, and where cp=1 fits and the estimate
    says it is faster, the fix names it with its figure."""
    from meshplan.adapters.read.fixes import fix_changes
    from meshplan.check.config import check_config

    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework="verl", zero_stage=3, cp=2,
                                job="sft", micro_batch_size=1, global_batch_size=64))
    (f,) = [f for f in check_config(job, plan).findings if f.id == "CP002"]
    assert "all-to-alls" in f.message and "K/V chunks" not in f.message and "TP/SP" not in f.fix
    assert f.fix.startswith("Use cp=1 (dp=8): predicted "), f.fix
    assert fix_changes(f.fix, {"cp": 2}) == [{"cp": 1, "dp": 8}]  # the edit check --config writes


def test_a_key_written_twice_is_refused_in_verls_yaml_as_omegaconf_refuses_it_and_kept_last_in_automodels():
    """verl's SFT config goes through Hydra's OmegaConf loader, which refuses a duplicate key ('found duplicate key');
    it was read with the last value kept, a config verl would not start. AutoModel's yaml.safe_load keeps the last,
    as meshplan does."""
    from meshplan.core.errors import MeshplanError

    verl = ("engine:\n  strategy: fsdp2\n  ulysses_sequence_parallel_size: 1\n  ulysses_sequence_parallel_size: 2\n"
            "model:\n  path: Qwen/Qwen3-8B\n")
    with pytest.raises(MeshplanError, match=r"^sft\.yaml:4: the key 'ulysses_sequence_parallel_size' is written twice "
                                            r"in one mapping; verl's Hydra loader \(OmegaConf\) refuses it"):
        import_config(verl, "sft.yaml")
    automodel = "distributed:\n  tp_size: 2\n  tp_size: 4\nstep_scheduler:\n  global_batch_size: 32\n"
    assert import_config(automodel, "recipe.yaml").request["tp"] == 4
