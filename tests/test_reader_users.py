"""What a user meets reading their own configs through the faces (meshplan import, check --config, compare --config):
a YAML file that is no mapping is named as what it is, not called an AutoModel recipe."""

import pytest

from meshplan.faces.cli import main

NOT_MAPPINGS = [("- a\n- b\n", "the YAML is a list (2 items)"), ("just a string\n", "the YAML is a single value"),
                ("# nothing yet\n", "the YAML holds no document")]


@pytest.mark.parametrize(("text", "said"), NOT_MAPPINGS)
@pytest.mark.parametrize("face", ["import", "check", "compare"])
def test_a_yaml_that_is_no_mapping_says_what_it_is(tmp_path, capsys, text, said, face):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    log = tmp_path / "run.log"
    log.write_text("step 1\n")
    args = {"import": ["import", str(path)], "check": ["check", "--config", str(path)],
            "compare": ["compare", "--config", str(path), "--log", str(log)]}[face]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert said in err and "not a mapping" in err and "Traceback" not in err
    assert "an AutoModel recipe is" not in err  # no framework was named: not called an AutoModel recipe
    assert "NeMo AutoModel recipe" in err and "verl's SFT trainer config" in err  # what meshplan reads from YAML


def test_a_named_framework_keeps_its_own_words(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text("- a\n")
    assert main(["import", str(path), "--framework", "nemo-automodel"]) == 2
    err = capsys.readouterr().err
    assert "the YAML is a list (1 item)" in err and "an AutoModel recipe is a YAML mapping" in err


# ------------------------------------------------------------------- PYTORCH_CUDA_ALLOC_CONF in every shell reader

CONFIGS = __import__("pathlib").Path(__file__).parent / "configs"
SHELL_SCRIPTS = {  # one launch script of each shell reader, and the framework it is read as
    "megatron_llama3_8b_h100_fp8.sh": "megatron-core", "mds_gpt_1.3b_moe128.sh": "deepspeed",
    "bridge_qwen3_600m_sft_128k.sh": "megatron-bridge", "skyrl_run_megatron.sh": "skyrl",
    "verl_sft_qwen_05_sp2.sh": "verl"}
TORCHTITAN = ("torchrun --nproc_per_node=8 -m torchtitan.train --model.name llama3 --model.flavor 8B "
              "--training.local_batch_size 2 --training.seq_len 8192\n")


def _imported(tmp_path, name: str, env: str, prefix: str = "export "):
    from meshplan.adapters.read import import_file

    text = TORCHTITAN if name == "torchtitan" else (CONFIGS / name).read_text()
    path = tmp_path / "job.sh"
    path.write_text(f"{prefix}{env}\n{text}" if prefix else text.replace("torchrun ", f"{env} torchrun ", 1))
    return import_file(str(path))


@pytest.mark.parametrize("name", [*SHELL_SCRIPTS, "torchtitan"])
@pytest.mark.parametrize("on", [True, False])
def test_every_shell_reader_reads_the_allocator_the_script_exports(tmp_path, name, on):
    """Only verl's SFT reader read it before: a Megatron-LM, DeepSpeed, Bridge, SkyRL or torchtitan script that
    exported expandable_segments:False was estimated on the card's launcher default."""
    got = _imported(tmp_path, name, f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:{on}")
    if name == "skyrl_run_megatron.sh":  # SkyRL's workers set it themselves after building the model (card over_env)
        assert "expandable_segments" not in got.request and got.defaults["expandable_segments"] is True
        assert any("not read, SkyRL sets it itself" in n for n in got.notes)
        return
    assert got.request["expandable_segments"] is on
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments" in got.sources["expandable_segments"]
    assert got.framework == SHELL_SCRIPTS.get(name, "torchtitan")
    if name in ("torchtitan", "megatron_llama3_8b_h100_fp8.sh", "verl_sft_qwen_05_sp2.sh"):  # `torchrun ` lines
        inline = _imported(tmp_path, name, f"PYTORCH_ALLOC_CONF=expandable_segments:{on}", prefix="")
        assert inline.request["expandable_segments"] is on, "the launch line's own prefix"


def test_a_framework_that_sets_the_allocator_itself_wins_and_says_so(tmp_path):
    """verl's RL workers set expandable segments on before every training phase: the script's False is said, not
    read (the card's over_env, from verl 0.9.1 engine_workers.py update_weights)."""
    got = _imported(tmp_path, "verl_qwen2_7b_math_megatron.sh", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    assert "expandable_segments" not in got.request and got.defaults["expandable_segments"] is True
    said = [n for n in got.notes if "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False: not read" in n]
    assert said and "set_expandable_segments(True)" in said[0]


def test_options_meshplan_does_not_model_are_named(tmp_path):
    got = _imported(tmp_path, "megatron_llama3_8b_h100_fp8.sh",
                    "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512,garbage_collection_threshold:0.6,"
                    "expandable_segments:True,frobnicate:1")
    assert got.request["expandable_segments"] is True
    notes = " | ".join(got.notes)
    assert "max_split_size_mb:512 is not modelled" in notes and "garbage_collection_threshold:0.6 is not modelled" \
        in notes and "frobnicate is not an allocator option meshplan knows" in notes
    only = _imported(tmp_path, "megatron_llama3_8b_h100_fp8.sh", "PYTORCH_ALLOC_CONF=max_split_size_mb:256")
    assert "expandable_segments" not in only.sources or "PYTORCH" not in only.sources["expandable_segments"]
    assert any("max_split_size_mb:256 is not modelled" in n for n in only.notes)


@pytest.mark.parametrize(("env", "said"), [
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true", "expandable_segments:true is not a value PyTorch takes"),
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments", "'expandable_segments' is not an allocator option"),
    ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nexport PYTORCH_ALLOC_CONF=expandable_segments:False",
     "set expandable_segments both ways")])
def test_a_malformed_allocator_setting_is_an_error_naming_what_is_allowed(tmp_path, capsys, env, said):
    path = tmp_path / "job.sh"
    path.write_text(f"export {env}\n" + (CONFIGS / "megatron_llama3_8b_h100_fp8.sh").read_text())
    assert main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_a_torchrun_line_of_ones_own_runs_pytorchs_allocator_not_run_train_shs(tmp_path, capsys):
    """torchtitan's expandable segments are set by its run_train.sh alone (PYTORCH_ALLOC_CONF on its torchrun line;
    torchtitan/train.py sets none): a user's own `torchrun -m torchtitan.train` line that exports nothing ran on
    PyTorch's default, and was estimated on run_train.sh's (fails before: expandable_segments was left to the card's
    True). A TOML job file alone is still taken as launched by run_train.sh, and says so."""
    import json

    from meshplan.adapters.read import import_file

    path = tmp_path / "job.sh"
    path.write_text(TORCHTITAN)
    got = import_file(str(path))
    assert got.request["expandable_segments"] is False
    assert "not through run_train.sh" in got.sources["expandable_segments"]
    main(["check", "--config", str(path), "--num-gpus", "8", "--gpu", "h100", "--json"])
    assert json.loads(capsys.readouterr().out)["memory"]["fit_basis"] == "reserved"
    main(["memory", "--config", str(path), "--num-gpus", "8", "--gpu", "h100", "--json"])
    said = [n for n in json.loads(capsys.readouterr().out)["assumptions"] if n.startswith("expandable_segments=")]
    assert said and "PyTorch's default allocator" in said[0] and "only in run_train.sh" in said[0]
    toml = import_file(str(CONFIGS / "torchtitan_llama3_8b.toml"))
    assert "expandable_segments" not in toml.request and toml.defaults["expandable_segments"] is True
    assert any(n.startswith("expandable_segments = True") and "launched by run_train.sh" in n for n in toml.notes)


def test_check_config_estimates_on_the_scripts_allocator(tmp_path, capsys):
    """The fit basis follows the script: torchtitan's card default is on, a script exporting False is reserved."""
    import json

    path = tmp_path / "job.sh"
    for on, basis in ((True, "allocated"), (False, "reserved")):
        path.write_text(f"PYTORCH_ALLOC_CONF=expandable_segments:{on} {TORCHTITAN}")
        main(["check", "--config", str(path), "--num-gpus", "8", "--gpu", "h100", "--json"])
        assert json.loads(capsys.readouterr().out)["memory"]["fit_basis"] == basis


# --------------------------------------------------------------------------- SkyRL's separate pools do not overlap

SKYRL_APART = {"model": "qwen3-8b", "gpu": "h100", "num_gpus": 16, "framework": "skyrl", "job": "rl",
               "algorithm": "grpo", "placement": "separate", "rollout_gpus": 8}


def test_skyrl_apart_adds_its_parts_and_verl_one_step_off_overlaps():
    """SkyRL's RayPPOTrainer awaits the generation, then trains, then syncs (skyrl 0.4.0 trainer.py); meshplan took
    the larger of generation and the training side, as verl's one-step-off recipe runs, so the rollout TP never
    showed in the step (recommend listed rows differing only in it, at equal step times)."""
    from meshplan import api
    from meshplan.request.parse import parse_request

    s = api.estimate_throughput(parse_request(SKYRL_APART)).rl
    assert s.step_s == pytest.approx(s.generation_s + s.log_prob_s + s.update_s + s.offload_s + s.reshard_s)
    v = api.estimate_throughput(parse_request({**SKYRL_APART, "framework": "verl"})).rl
    assert v.step_s == pytest.approx(max(v.generation_s, v.log_prob_s + v.update_s + v.offload_s) + v.reshard_s)


def test_skyrl_apart_recommend_ranks_rollout_tp_by_its_generation():
    from meshplan import api
    from meshplan.request.parse import parse_request

    rec = api.recommend(parse_request(SKYRL_APART))
    rows = [(c.plan.model_dump(exclude={"rollout_tp"}), c.throughput.step_time_s) for c in rec.candidates]
    twins = [(a[1], b[1]) for k, a in enumerate(rows) for b in rows[k + 1:] if a[0] == b[0]]
    assert twins and all(x != pytest.approx(y, rel=1e-9) for x, y in twins)  # same layout, other rollout TP: timed


# --------------------------------------------------------------------------- verl's SFT trainer on the Megatron engine

VERL_TRAIN = {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 8, "framework": "verl", "tp": 4}


@pytest.mark.parametrize("zero", [0, 1])
def test_a_verl_training_job_below_zero_3_renders_the_sft_trainer_on_megatron(tmp_path, capsys, zero):
    """render wrote main_ppo (the RL trainer: a rollout engine and a reference model the estimate leaves out) for a
    training job at ZeRO 0-2; verl 0.9.1's sft_trainer runs the Megatron engine (engine=megatron), whose
    use_distributed_optimizer is ZeRO 1 or 0. Read back, the script is the same training job."""
    path = tmp_path / "run.sh"
    assert main(["render", "verl", "--model", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8", "--tp", "4",
                 "--zero-stage", str(zero), "--pp", "2", "--recompute", "full"]) == 0
    text = capsys.readouterr().out
    path.write_text(text)
    assert "-m verl.trainer.sft_trainer" in text and "main_ppo" not in text and "rollout" not in text
    for words in ("engine=megatron", "optim=megatron", "engine.tensor_model_parallel_size=4",
                  "engine.pipeline_model_parallel_size=2",
                  f"engine.use_distributed_optimizer={str(bool(zero)).lower()}",
                  "++engine.override_transformer_config.recompute_granularity=full"):
        assert words in text, words
    assert main(["import", str(path), "--json"]) == 0
    import json

    got = json.loads(capsys.readouterr().out)
    assert got["variant"] == "sft-megatron" and not got["unsupported"]
    assert {k: got["request"][k] for k in ("job", "tp", "pp", "zero_stage", "recompute")} == {
        "job": "sft", "tp": 4, "pp": 2, "zero_stage": zero, "recompute": "full"}


def test_a_verl_training_job_at_zero_2_is_refused_with_its_rule(capsys):
    assert main(["render", "verl", "--model", "llama-3.1-8b", "--gpu", "h100", "--num-gpus", "8", "--tp", "4",
                 "--zero-stage", "2"]) != 0
    err = capsys.readouterr().err
    # AD001 names the stages whose config writes tp=4
    assert "AD001" in err and "zero_stage=2" in err and "sft-megatron" in err and "Use zero_stage=0 or 1" in err


def test_verl_sft_batch_rule_is_the_sft_trainers_on_either_engine():
    """A training job on the Megatron engine is the SFT trainer's: VL003 (its batch over dp in micro-batches), not
    the PPO trainer's VL001."""
    from meshplan import api
    from meshplan.request.parse import parse_request

    report = api.check_config(parse_request({**VERL_TRAIN, "global_batch_size": 7}))  # 7 over dp 2
    ids = [f.id for f in report.findings]
    assert "VL003" in ids and "VL001" not in ids


MEGATRON_SFT = """#!/bin/bash
torchrun --standalone --nnodes=1 --nproc-per-node=8 -m verl.trainer.sft_trainer \\
    data.train_files=/data/train.parquet data.train_batch_size=128 data.use_dynamic_bsz=False \\
    data.micro_batch_size_per_gpu=2 data.max_length=2048 model.path=Qwen/Qwen2.5-7B-Instruct \\
    model.enable_gradient_checkpointing=True engine=megatron optim=megatron optim.lr=1e-5 \\
    engine.tensor_model_parallel_size=2 engine.pipeline_model_parallel_size=2 engine.context_parallel_size=2 \\
    engine.use_distributed_optimizer=False ++engine.override_transformer_config.recompute_granularity=selective \\
    engine.use_mbridge=True
"""


def test_import_and_check_read_verl_sft_on_the_megatron_engine(tmp_path, capsys):
    """engine=megatron was 'another engine than FSDP ... meshplan does not read', and the file was read as the FSDP
    engine's job (ZeRO 3, no TP or PP) with its Megatron keys unread."""
    from meshplan.adapters.read import import_file

    path = tmp_path / "sft.sh"
    path.write_text(MEGATRON_SFT)
    got = import_file(str(path))
    assert (got.framework, got.variant, got.unsupported) == ("verl", "sft-megatron", [])
    assert {k: got.request[k] for k in ("job", "tp", "pp", "cp", "zero_stage", "recompute", "micro_batch_size",
                                         "global_batch_size", "num_gpus")} == {
        "job": "sft", "tp": 2, "pp": 2, "cp": 2, "zero_stage": 0, "recompute": "selective", "micro_batch_size": 2,
        "global_batch_size": 128, "num_gpus": 8}
    assert any("enable_gradient_checkpointing = True: not read on the SFT trainer's Megatron engine" in n
               for n in got.notes)
    assert main(["check", "--config", str(path), "--gpu", "h100"]) in (0, 1)
    out = capsys.readouterr().out
    assert "TP2 PP2 CP2 DP1" in out and "Traceback" not in out


def test_the_yaml_defaults_list_names_the_engine(tmp_path):
    from meshplan.adapters.read import import_config

    text = ("defaults:\n  - model@model: hf_model\n  - engine@engine: megatron\n  - optim@optim: megatron\n"
            "  - _self_\nengine:\n  tensor_model_parallel_size: 4\ndata:\n  train_batch_size: 64\n")
    got = import_config(text, "sft.yaml", config_format="yaml")
    assert got.variant == "sft-megatron" and got.request["tp"] == 4 and got.request["recompute"] == "none"
    other = import_config(text.replace("engine@engine: megatron", "engine@engine: veomni"), "sft.yaml",
                          config_format="yaml")
    assert other.variant == "sft-fsdp" and any("another engine than FSDP or Megatron" in u for u in other.unsupported)


# --------------------------------------------------------------------------- a launch command held in a variable

HELD = ("TP=4\nCOMMAND={q}torchrun --nproc_per_node 8 pretrain_gpt.py \\\n    --tensor-model-parallel-size $TP "
        "--pipeline-model-parallel-size 2 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\\n"
        "    --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16 --data-path \"/data/my corpus\"{q}\n"
        "echo starting\n{run}\n")


@pytest.mark.parametrize(("quote", "run"), [
    ('"', "$COMMAND"), ('"', "${COMMAND}"), ('"', "eval $COMMAND"), ('"', 'eval "$COMMAND"'),
    ('"', 'eval "${COMMAND}" 2>&1 | tee train.log'), ("'", "eval $COMMAND"), ("'", 'eval "$COMMAND"')])
def test_a_launch_command_held_in_a_variable_is_read_as_the_launch_line(tmp_path, quote, run):
    """`eval "$COMMAND"` ran one word, the whole string, that named no launcher ('no command launches
    pretrain_gpt.py'), and a single-quoted COMMAND's `$TP` was read as the text '$TP': eval reads its words again as
    a line of the script, as the shell does (quotes inside it, a second expansion). Fails before for the eval forms."""
    from meshplan.adapters.read import import_file

    if quote == '"':
        text = HELD.format(q=quote, run=run).replace('"/data/my corpus"', "/data/corpus")
    else:
        text = HELD.format(q=quote, run=run)
    path = tmp_path / "job.sh"
    path.write_text(text)
    got = import_file(str(path))
    assert got.framework == "megatron-core"
    assert (got.request["tp"], got.request["pp"], got.request["num_gpus"], got.request["global_batch_size"]) == (
        4, 2, 8, 64)
    assert "$COMMAND at line 2" in got.sources["pp"] or "job.sh:2 " in got.sources["pp"], got.sources["pp"]


def test_an_eval_that_never_ends_is_said_not_run():
    from meshplan.adapters.read.shell import read_script

    script = read_script("X='eval $X'\neval $X\n", "loop.sh")
    assert any("eval nested over" in u for u in script.unresolved)


DEEP = {"json": '{"train_batch_size": 8, "a": ' + "[" * 5000 + "]" * 5000 + "}\n",
        "toml": "a = " + "[" * 3000 + "]" * 3000 + "\n[parallelism]\ntensor_parallel_degree = 2\n",
        "yaml": "a: " + "[" * 3000 + "]" * 3000 + "\ndistributed:\n  tp_size: 2\n",
        "yaml-mapping": "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\ndistributed:\n  tp_size: 2\n"}


@pytest.mark.parametrize("kind", list(DEEP))
@pytest.mark.parametrize("face", ["import", "check"])
def test_a_config_nested_hundreds_deep_is_refused_not_a_traceback(tmp_path, capsys, kind, face):
    """Within the size bound, a JSON, TOML or YAML file of nested brackets ended in Python's RecursionError and a
    traceback (exit 1) on every face that reads a config."""
    path = tmp_path / f"job.{kind.split('-')[0]}"
    path.write_text(DEEP[kind])
    args = ["import", str(path)] if face == "import" else ["check", "--config", str(path), "--model", "llama-3.1-8b"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{path}: nested deeper than meshplan reads" in err and "Traceback" not in err
