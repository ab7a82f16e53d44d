"""Proof that rendered snippets use only keys the real frameworks accept, checked against pinned packages.

- Megatron-Core: every flag is defined by megatron-core 0.19.2's parser (arguments.py, read with ast).
- Megatron-Bridge: every cfg.<section>.<field> is a field of that section's dataclass (0.6.2, ast).
- verl: Hydra composes the packaged ppo_trainer.yaml with the overrides (hydra-core in a cached venv).
- SkyRL: every key walks SkyRL 0.4.0's config dataclasses; transformer_config_kwargs keys are
  Megatron-Core TransformerConfig fields.
- torchtitan 0.3.0: its own ConfigManager parses the command line (CPU torch in a cached venv);
  0.2.2: the TOML keys are fields of its JobConfig sections (ast).
- KempnerForge (not on PyPI): every key and value fits cards/kempnerforge_schema.yaml.
- DeepSpeed: ds_config keys and Megatron-DeepSpeed flags are within the lists in its card.
- NeMo AutoModel 0.7.0: its own loader, distributed-section parser, FSDP2 mesh, StepScheduler and section dataclasses
  read each rendered recipe YAML (the package and its dependencies in a cached venv, CPU torch).
"""

from __future__ import annotations

import ast
import json
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
from framework_packages import AUTOMODEL_VENV, TORCHTITAN_VENV, served_answer, venv_python, wheel_tree
from framework_source import SourceTree, megatron_flags
from test_adapters import CASES, GOLDEN_CASES, golden_job_plan

from meshplan.adapters.parse import cli_flags, overrides, parse_plan, python_assignments, shell_tokens
from meshplan.adapters.render import render
from meshplan.knowledge.adapter_knobs import adapter_section
from meshplan.knowledge.cards import framework_card, model_card_names, read_card
from meshplan.knowledge.catalog import catalog_architecture
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

pytestmark = pytest.mark.slow


def rendered_jobs(framework: str):
    """(job, rendering) for every rendering of `framework` the other tests use (the round-trip cases and the golden
    plans), and for Megatron-Core and Megatron-Bridge every catalog model, whose architecture flags differ."""
    out = []
    for fw, variant, fields in CASES:
        if fw == framework:
            job, plan = resolve(Request(framework=fw, **fields))
            out.append((job, render(fw, job, plan, variant=variant)))
    for case in GOLDEN_CASES:
        job, plan = golden_job_plan(framework, case)
        out.append((job, render(framework, job, plan)))
    if framework in ("megatron-core", "megatron-bridge"):
        for key in model_card_names():
            arch = catalog_architecture(key)
            if arch.layer_pattern is not None and arch.gdn is None:  # HybridModel: pretrain_mamba.py
                continue  # (a Gated DeltaNet hybrid is a GPTModel: pretrain_gpt.py, Bridge's GPTModelProvider fields)
            job, plan = resolve(Request(framework=framework, model=key, num_gpus=8, seq_length=8192))
            out += [(job, render(framework, job, plan, variant=v)) for v in adapter_section(job.card).variants]
    return out


def rendered(framework: str):
    return [result for _, result in rendered_jobs(framework)]


@pytest.fixture(scope="module")
def megatron_tree() -> SourceTree:
    return SourceTree(wheel_tree("megatron-core"), wheel_tree("megatron-bridge"))


# --------------------------------------------------------------------------- Megatron-Core / Megatron-Bridge


def test_megatron_core_flags_exist_in_arguments_py(megatron_tree):
    known = megatron_flags(megatron_tree)
    assert "--virtual-pipeline-model-parallel-size" not in known  # the trap the adapter avoids
    for result in rendered("megatron-core"):
        tokens = shell_tokens(result.text)
        flags = set(cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:]))
        assert flags - known == set(), result.text


def test_megatron_core_precision_values_are_argparse_choices(megatron_tree):
    """--exp-avg-dtype / --exp-avg-sq-dtype values are choices of arguments.py; --fp8-recipe values are the Literal of
    TransformerConfig.fp8_recipe, which ArgumentGroupFactory turns into the flag."""
    source = ast.parse((wheel_tree("megatron-core") / "megatron/training/arguments.py").read_text())
    choices = {}
    for call in ast.walk(source):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument" and call.args and \
                isinstance(call.args[0], ast.Constant):
            for kw in call.keywords:
                if kw.arg == "choices" and isinstance(kw.value, ast.List):
                    choices[call.args[0].value] = {e.value for e in kw.value.elts}
    recipe = megatron_tree.fields("megatron.core.transformer.transformer_config", "TransformerConfig")["fp8_recipe"]
    choices["--fp8-recipe"] = {e.value for e in ast.walk(recipe) if isinstance(e, ast.Constant)}
    seen = set()
    for result in rendered("megatron-core"):
        tokens = shell_tokens(result.text)
        flags = cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:])
        for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype", "--fp8-recipe"):
            if flag in flags:
                assert flags[flag] in choices[flag], (flag, flags[flag])
                seen.add(flag)
    assert seen == {"--exp-avg-dtype", "--exp-avg-sq-dtype", "--fp8-recipe"}


BRIDGE_SECTIONS = {"model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
                   "train": ("megatron.bridge.training.config", "TrainingConfig"),
                   "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
                   "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
                   "dist": ("megatron.bridge.training.config", "DistributedInitConfig"),
                   "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
                   "checkpoint": ("megatron.bridge.training.config", "CheckpointConfig"),
                   "mixed_precision": ("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig"),
                   "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig"),
                   "peft": ("megatron.bridge.peft.lora", "LoRA")}  # a LoRA job's cfg.peft


def test_megatron_bridge_fields_exist_in_config_dataclasses(megatron_tree):
    container = megatron_tree.fields("megatron.bridge.training.config", "ConfigContainer")
    fields = {s: set(megatron_tree.fields(*where)) for s, where in BRIDGE_SECTIONS.items()}
    # An MLA model's provider is an MLAModelProvider: its yarn fields (beta_fast, mscale ...) are its own.
    mla = set(megatron_tree.fields("megatron.bridge.models.mla_provider", "MLAModelProvider"))
    assert "decoder_first_pipeline_num_layers" not in fields["model"] and "beta_fast" not in fields["model"]
    extra = resolve(Request(framework="megatron-bridge", model="llama-3.1-70b", num_gpus=64, tp=4, pp=4,
                            zero_stage=3, cp=2, cp_comm_type="a2a+p2p", precision="fp8"))
    source = (wheel_tree("megatron-bridge") / "megatron/bridge/training/mixed_precision.py").read_text()
    presets = {f.name for f in ast.walk(ast.parse(source))  # the @register'ed MIXED_PRECISION_RECIPES
               if isinstance(f, ast.FunctionDef) and any(getattr(d, "id", None) == "register"
                                                         for d in f.decorator_list)}
    assert "bf16_with_fp8_current_scaling_mixed" in presets
    recipe = megatron_tree.fields("megatron.core.transformer.transformer_config", "TransformerConfig")["fp8_recipe"]
    recipes = {e.value for e in ast.walk(recipe) if isinstance(e, ast.Constant)}
    assert {"delayed", "tensorwise", "blockwise", "mxfp8"} <= recipes
    for job, result in [*rendered_jobs("megatron-bridge"), (extra[0], render("megatron-bridge", *extra,
                                                                             variant="run_recipe"))]:
        keys = (python_assignments(result.text) if result.format == "python"
                else overrides(shell_tokens(result.text)))
        for key in keys:
            if key == "mixed_precision":  # run_recipe names a registered preset
                assert key in container and keys[key] in presets, keys[key]
                continue
            section, name = key.split(".", 1)
            known = fields[section] | (mla if section == "model" and job.model.mla is not None else set())
            assert section in container and name in known, (job.model.name, key)
        if "mixed_precision.fp8_recipe" in keys:
            assert keys["mixed_precision.fp8_recipe"] in recipes


# --------------------------------------------------------------------------- verl (Hydra compose)

COMPOSE = r"""
import json, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
config_dir, jobs = sys.argv[1], json.loads(sys.stdin.read())
out = []
with initialize_config_dir(config_dir=config_dir, version_base=None):
    for name, overrides, probes in jobs:
        try:
            cfg = compose(config_name=name, overrides=overrides)
            out.append({"ok": True, "values": {p: OmegaConf.select(cfg, p) for p in probes}})
        except Exception as exc:  # the test reports Hydra's own message
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


VERL_DISPATCHER = "critic.megatron.override_transformer_config.moe_token_dispatcher_type"
VERL_OPTIM = ("use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype", "main_grads_dtype")


def verl_optim_expected(plan) -> list:
    """What verl's McoreOptimizerConfig holds after composition for a plan: the precision-aware switch on with bf16
    moments or gradients (render's verl_precision_aware), else its packaged defaults (optim/megatron.yaml)."""
    moments = plan.optimizer_state_dtype or "fp32"
    grads = "bf16" if plan.grad_reduce_in_fp32 is False else "fp32"
    return [moments != "fp32" or grads != "fp32", moments, moments, grads]


def test_verl_overrides_compose_with_the_packaged_yaml(tmp_path):
    python = venv_python("hydra", ["hydra-core==1.3.2"], python_version="3.11")
    config_dir = wheel_tree("verl") / "verl" / "trainer" / "config"
    results = rendered("verl")
    jobs = []
    for result in results:
        tokens = shell_tokens(result.text)
        sft = result.variant.startswith("sft")  # the SFT trainer on sft_trainer_engine.yaml (training jobs)
        ov = tokens[tokens.index("verl.trainer.sft_trainer" if sft else "verl.trainer.main_ppo") + 1:]
        if sft:
            probes = ["engine._target_", "optim._target_", "engine.tensor_model_parallel_size",
                      "engine.pipeline_model_parallel_size", "engine.ulysses_sequence_parallel_size",
                      "engine.context_parallel_size", "data.micro_batch_size_per_gpu",
                      *(f"optim.{k}" for k in VERL_OPTIM)]
        elif result.variant == "megatron":
            probes = ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
                      "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size",
                      "critic.megatron.expert_model_parallel_size", "actor_rollout_ref.actor.strategy",
                      VERL_DISPATCHER, *(f"{role}.optim.{k}" for role in ("actor_rollout_ref.actor", "critic")
                                         for k in VERL_OPTIM)]
        else:
            probes = ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
                      "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
                      "critic.fsdp.ulysses_sequence_parallel_size", "actor_rollout_ref.actor.strategy"]
        jobs.append(["sft_trainer_engine" if sft else "ppo_trainer", ov, probes])
    jobs.append(["ppo_trainer", ["actor_rollout_ref.actor.megatron.grad_offload=true", "model_engine=megatron"],
                 []])  # a stale key
    proc = subprocess.run([str(python), "-c", COMPOSE, str(config_dir)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not answers[-1]["ok"]  # Hydra does reject an unknown key: the check has teeth
    for result, answer in zip(results, answers[:-1], strict=True):
        assert answer["ok"], f"{answer.get('error')}\n{result.text}"
        values = answer["values"]
        if result.variant == "sft-megatron":  # the Megatron engine's config (McoreEngineConfig) and optimizer
            assert values["engine._target_"] == "verl.workers.config.McoreEngineConfig"
            assert values["optim._target_"] == "verl.workers.config.McoreOptimizerConfig"
            assert (values["engine.tensor_model_parallel_size"], values["engine.pipeline_model_parallel_size"],
                    values["engine.context_parallel_size"]) == (result.plan.tp, result.plan.pp, result.plan.cp)
            assert values["data.micro_batch_size_per_gpu"] == result.plan.micro_batch_size
            assert [values[f"optim.{k}"] for k in VERL_OPTIM] == verl_optim_expected(result.plan)
        elif result.variant == "sft-fsdp":
            assert values["engine.ulysses_sequence_parallel_size"] == result.plan.cp
        elif result.variant == "megatron":
            assert values["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == result.plan.tp
            assert values["actor_rollout_ref.ref.megatron.pipeline_model_parallel_size"] == result.plan.pp
            assert values["critic.megatron.expert_model_parallel_size"] == result.plan.ep
            assert values["actor_rollout_ref.actor.strategy"] == "megatron"
            moe = "moe_token_dispatcher" in parse_plan("verl", result.variant, result.text, 0)
            assert values[VERL_DISPATCHER] == (result.plan.moe_token_dispatcher if moe else None)
            for role in ("actor_rollout_ref.actor", "critic"):  # each trained model's optimizer (the critic rendered)
                assert [values[f"{role}.optim.{k}"] for k in VERL_OPTIM] == verl_optim_expected(result.plan), role
        else:  # the keys each engine reads (verl 0.9.1: actor/ref fsdp_config, critic.fsdp; the critic is rendered
            # for a job that is no RL job or is PPO)
            for key in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"):
                assert values[f"{key}.ulysses_sequence_parallel_size"] == result.plan.cp, key


READ_BACK = r"""
import json, sys
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
parser, out = OverridesParser.create(), []
for hydra, dotlist in json.loads(sys.stdin.read()):
    out.append([OmegaConf.create({"v": parser.parse_override("v=" + hydra).value()}).v,  # verl, run_recipe.py
                OmegaConf.from_cli(["v=" + dotlist]).v])  # SkyRL: from_cli reads a YAML scalar
print(json.dumps(out))
"""

TRICKY = ["C:\\models\\llama", "end\\", "end\\\\", "it's", "x\\'y", "\\'", "${oops}", "p\\${x}", "$${x}", "${",
          "org/model with space", "a'b\"c", "x\nrm -rf ~", "Qwen/Qwen2.5-7B", "null", "True", "yes", "on", "NaN", "inf",
          "~", "1.5", "1e-05", "a: b", "[x]", "a,b", "", "é😀"]


def test_override_values_read_back_unchanged_by_hydra_and_omegaconf():
    """What the quoting tests in test_render_refusal.py pin down, checked against the real readers."""
    from meshplan.adapters.render import dotlist_value, hydra_value

    python = venv_python("hydra", ["hydra-core==1.3.2"], python_version="3.11")
    values = [*TRICKY, 1e-05, 0.5, 7, True, None]
    proc = subprocess.run([str(python), "-c", READ_BACK], input=json.dumps(
        [[hydra_value(v), dotlist_value(v)] for v in values]), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for value, (hydra, dotlist) in zip(values, json.loads(proc.stdout), strict=True):
        assert hydra == value and dotlist == value, (value, hydra_value(value), dotlist_value(value), hydra, dotlist)


# --------------------------------------------------------------------------- SkyRL (dataclass walk)


def _walk(tree: SourceTree, module: str, cls: str, key: str, transformer_fields: set[str],
          optimizer_fields: set[str] = frozenset()) -> None:
    head, _, rest = key.partition(".")
    fields = tree.fields(module, cls)
    assert head in fields, f"{key}: no field {head!r} in {cls}"
    if not rest:
        return
    annotation = fields[head]
    type_name = annotation.id if hasattr(annotation, "id") else getattr(annotation, "value", None)
    type_name = type_name.id if hasattr(type_name, "id") else type_name
    if head == "transformer_config_kwargs":
        assert rest in transformer_fields, f"{key}: {rest!r} is not a Megatron-Core TransformerConfig field"
        return
    if head == "optimizer_config_kwargs":  # passed to Megatron-Core's OptimizerConfig (init_megatron_optim_config)
        assert rest in optimizer_fields, f"{key}: {rest!r} is not a Megatron-Core OptimizerConfig field"
        return
    assert isinstance(type_name, str) and tree.resolve(module, type_name), f"{key}: {head} is not a config class"
    _walk(tree, *tree.resolve(module, type_name)[0:1], type_name, rest, transformer_fields, optimizer_fields)


def test_skyrl_keys_exist_in_its_config_dataclasses(megatron_tree):
    tree = SourceTree(wheel_tree("skyrl"))
    transformer = set(megatron_tree.fields("megatron.core.transformer.transformer_config", "TransformerConfig"))
    optimizer = set(megatron_tree.fields("megatron.core.optimizer.optimizer_config", "OptimizerConfig"))
    assert {"exp_avg_dtype", "use_precision_aware_optimizer", "optimizer_offload_fraction"} <= optimizer
    assert "virtual_pipeline_model_parallel_size" not in tree.fields("skyrl.train.config.config", "MegatronConfig")
    for result in rendered("skyrl"):
        root = ("skyrl.train.config.sft_config", "SFTConfig") if result.variant in ("sft", "sft-fsdp") else (
            "skyrl.train.config.config", "SkyRLTrainConfig")
        keys = overrides(shell_tokens(result.text))
        assert keys and not any(k.startswith("+") for k in keys)
        for key in keys:
            _walk(tree, *root, key, transformer, optimizer)
    with pytest.raises(AssertionError):
        _walk(tree, "skyrl.train.config.config", "SkyRLTrainConfig",
              "trainer.policy.megatron_config.sequence_parallel", transformer)


# --------------------------------------------------------------------------- torchtitan


PARSE = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
from torchtitan.config.manager import ConfigManager
out = []
for args in json.loads(sys.stdin.read()):
    try:
        c = ConfigManager().parse_args(args)
        p, t = c.parallelism, c.training
        out.append({"ok": True, "tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree,
                    "cp": p.context_parallel_degree, "ep": p.expert_parallel_degree,
                    "dp_shard": p.data_parallel_shard_degree, "dp_replicate": p.data_parallel_replicate_degree,
                    "sp": p.enable_sequence_parallel, "local": t.local_batch_size,
                    "reduce": t.mixed_precision_reduce,
                    "ac": type(c.activation_checkpoint).__qualname__ if c.activation_checkpoint else "none"})
    except SystemExit as exc:
        out.append({"ok": False, "error": f"exit {exc.code}"})
print("RESULT " + json.dumps(out))
"""


def test_torchtitan_config_manager_parses_the_rendered_command_line():
    python = venv_python("torchtitan", TORCHTITAN_VENV, python_version="3.11")
    results = [r for r in rendered("torchtitan") if r.version == "0.3.0"]
    jobs = []
    for result in results:
        tokens = shell_tokens(result.text)
        jobs.append(tokens[tokens.index("torchtitan.train") + 1:])
    jobs.append(["--module", "qwen3", "--config", "qwen3_30b_a3b", "--parallelism.expert_tensor_parallel_degree",
                 "2"])  # removed in 0.3.0: must be rejected
    proc = subprocess.run([str(python), "-c", PARSE], input=json.dumps(jobs), capture_output=True, text=True,
                          timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-4000:]
    answers = json.loads(line[len("RESULT "):])
    assert not answers[-1]["ok"]
    for result, answer in zip(results, answers[:-1], strict=True):
        assert answer["ok"], result.text
        plan = result.plan
        assert (answer["tp"], answer["pp"], answer["cp"], answer["ep"]) == (plan.tp, plan.pp, plan.cp, plan.ep)
        assert answer["dp_shard"] * answer["dp_replicate"] == plan.dp
        assert answer["sp"] == plan.sequence_parallel
        assert answer["reduce"] == "float32"  # the only value it takes; rendered when grad_reduce_in_fp32 is asked
        assert answer["ac"] == {"none": "none", "full": "FullAC.Config", "selective": "SelectiveAC.Config"}[
            plan.recompute]


def test_torchtitan_0_2_toml_keys_are_job_config_fields():
    tree = SourceTree(wheel_tree("torchtitan", "0.2.2"))
    sections = {"parallelism": "Parallelism", "training": "Training", "activation_checkpoint": "ActivationCheckpoint"}
    optional = {"compile": "Compile"}  # rendered with torch_compile
    flex = dict(model="deepseek-v3", num_gpus=256, pp=8, ep=32, global_batch_size=1024, first_stage_layers=5,
                last_stage_layers=8, moe_token_dispatcher="flex")
    float8 = dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=64, precision="fp8", fp8_recipe="tensorwise",
                  fp8_param_gather=True, grad_reduce_in_fp32=True)
    mx = dict(model="llama-3.1-8b", gpu="b200", num_gpus=8, global_batch_size=64, precision="fp8", fp8_recipe="mxfp8")
    quantize = {"float8": "Float8Linear", "mx": "MXLinear"}
    converters = set()
    rendered_keys = set()
    named_models = set()
    for fields in [f for fw, _variant, f in CASES if fw == "torchtitan"] + [flex, float8, mx]:
        job, plan = resolve(Request(framework="torchtitan", **fields))
        if plan.zero_stage not in (0, 3):
            continue
        doc = tomllib.loads(render("torchtitan", job, plan, version="0.2").text)
        for section, cls in sections.items():
            known = set(tree.fields("torchtitan.config.job_config", cls))
            assert set(doc[section]) <= known, (section, set(doc[section]) - known)
            rendered_keys |= set(doc[section])
        for section, cls in optional.items():
            if section in doc:
                assert set(doc[section]) <= set(tree.fields("torchtitan.config.job_config", cls))
                rendered_keys |= {f"{section}.{k}" for k in doc[section]}
        assert set(doc) - set(sections) <= {"model", "quantize", "compile"}
        if "name" in doc.get("model", {}):  # a model the release has: its module, and the flavor among its args
            assert set(doc["model"]) <= set(tree.fields("torchtitan.config.job_config", "Model"))
            module = wheel_tree("torchtitan", "0.2.2") / "torchtitan/models" / doc["model"]["name"] / "__init__.py"
            assert f'"{doc["model"]["flavor"]}":' in module.read_text(), doc["model"]
            named_models.add(fields["model"])
        for name in doc.get("model", {}).get("converters", []):
            kind = name.rsplit(".", 1)[1]
            converters.add(name)
            section = doc["quantize"]["linear"][kind]
            known = tree.fields("torchtitan.config.job_config", quantize[kind])
            assert set(section) <= set(known), set(section) - set(known)
            if kind == "float8":
                assert section["recipe_name"] in {e.value for e in ast.walk(known["recipe_name"])
                                                  if isinstance(e, ast.Constant)}
        if "expert_parallel_comm_backend" in doc["parallelism"]:
            # the value is one of the field's Literal choices
            annotation = tree.fields("torchtitan.config.job_config", "Parallelism")["expert_parallel_comm_backend"]
            choices = {e.value for e in ast.walk(annotation) if isinstance(e, ast.Constant)}
            assert choices == {"standard", "deepep"}
            assert doc["parallelism"]["expert_parallel_comm_backend"] in choices
    assert "expert_parallel_comm_backend" in rendered_keys
    assert "mixed_precision_reduce" in rendered_keys
    assert "compile.enable" in rendered_keys
    # the converter names torchtitan 0.2.2 registers (components/quantization: register_model_converter)
    registered = {c.args[1].value for f in ("float8.py", "mx.py") for c in ast.walk(ast.parse(
        (wheel_tree("torchtitan", "0.2.2") / "torchtitan/components/quantization" / f).read_text()))
        if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "register_model_converter"}
    assert converters == {"quantize.linear.float8", "quantize.linear.mx"} and converters <= registered
    assert {"llama-3.1-8b", "deepseek-v3"} <= named_models  # the cases render these; each named as 0.2.2 has it


# --------------------------------------------------------------------------- KempnerForge, DeepSpeed


def test_kempnerforge_keys_and_values_fit_its_documented_schema():
    schema = read_card("kempnerforge_schema")["sections"]
    types = {"int": int, "str": str, "float": (int, float), "bool": bool}
    for result in rendered("kempnerforge"):
        doc = tomllib.loads(result.text)
        assert {"distributed", "train"} <= set(doc) <= {"distributed", "train", "optimizer", "model"}
        for section, values in doc.items():
            for key, value in values.items():
                spec = schema[section]["fields"].get(key)
                assert spec is not None, f"[{section}] {key} is not a KempnerForge key"
                assert isinstance(value, types[spec["type"]]), (key, value)
                assert value in spec.get("choices", [value]), (key, value)


def test_deepspeed_keys_are_in_its_card():
    card = framework_card("deepspeed")
    ds_keys, mds_flags = set(card.ds_config_keys), set(card.megatron_deepspeed_flags)

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]

    for result in rendered("deepspeed"):
        if result.format == "json":
            config = json.loads(result.text)
        else:
            config = json.loads(result.text.split("<<'DS_CONFIG'\n", 1)[1].split("\nDS_CONFIG\n", 1)[0])
            tokens = shell_tokens(result.text.split("\nDS_CONFIG\n", 1)[1])
            assert set(cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:])) <= mds_flags
        assert set(flat(config)) <= ds_keys
        assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                               * config["gradient_accumulation_steps"] * result.plan.dp)


def test_megatron_deepspeed_script_builds_the_model_it_was_rendered_for(tmp_path):
    """Megatron-DeepSpeed ties the output layer to the embedding unless --untie-embeddings-and-output-weights, and
    sizes each head hidden / heads unless --kv-channels: the script for Llama-3.1-8B trained a model 0.5B smaller
    than the one estimated, and `meshplan import` of it found no catalog model. Each script now reads back as its
    own model, and a tied model's has no untie flag."""
    from meshplan import api

    tied = tmp_path / "config.json"  # Qwen2-1.5B's shape: tied embeddings (no catalog model has them)
    tied.write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
        "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "hidden_act": "silu"}))
    for model, untied, kv_channels in (("llama-3.1-8b", True, None), ("qwen3-32b", True, "128"),
                                       (str(tied), False, None)):
        result = render("deepspeed", *resolve(Request(framework="deepspeed", model=model, num_gpus=16, tp=2, pp=2)))
        flags = cli_flags(shell_tokens(result.text.split("\nDS_CONFIG\n", 1)[1]))
        assert ("--untie-embeddings-and-output-weights" in flags) == untied, model
        assert flags.get("--kv-channels") == kv_channels, model
        if untied:
            script = tmp_path / "pretrain.sh"
            script.write_text(result.text)
            # Llama 3 and 3.1 8B state the same flags here; import takes the first and notes the others
            assert api.import_file(str(script), framework="deepspeed").request["model"] in (model, "llama-3-8b")


# --------------------------------------------------------------------------- NeMo AutoModel


def _automodel_cases():
    """(job, plan, rendering) for every AutoModel rendering the other tests use."""
    out = []
    for job, result in rendered_jobs("nemo-automodel"):
        out.append((job, result.plan, result))
    return out


def automodel_verdicts(cases: list[dict]) -> list[dict]:
    """AutoModel's own code over each rendered YAML (tests/framework_probes/automodel_probe.py in its venv), from
    the probe's server (framework_packages.served_answer): torch and AutoModel, about 14 s of CPU, are imported once
    per test process, not once for each of the three tests that ask."""
    probe = Path(__file__).parent / "framework_probes" / "automodel_probe.py"
    return served_answer(probe, cases, lambda: venv_python("nemo-automodel", AUTOMODEL_VENV, python_version="3.11"),
                         cwd=tempfile.gettempdir())


def test_automodel_loads_the_rendered_yaml_with_its_own_code():
    """Each rendered recipe YAML through AutoModel 0.7.0's loader, parse_distributed_section, its FSDP2 mesh, its
    StepScheduler, its pipeline stage count and the BackendConfig / PeftConfig / FP8Config it builds: the layout it
    makes is the plan's."""
    rendered_cases = _automodel_cases()
    cases = [{"id": str(i), "yaml": r.text, "num_gpus": job.num_gpus, "num_layers": job.model.num_layers}
             for i, (job, _, r) in enumerate(rendered_cases)]
    for answer, (job, plan, result) in zip(automodel_verdicts(cases), rendered_cases, strict=True):
        assert answer["ok"], (answer["error"], result.text)
        assert answer["sizes"] == {"tp_size": plan.tp, "pp_size": plan.pp, "cp_size": plan.cp, "ep_size": plan.ep,
                                   "dp_size": plan.dp}
        if plan.zero_stage == 0:
            assert answer["strategy"] == "DDPConfig" and answer["mesh"] is None
            assert answer["grad_acc_steps"] == job.global_batch_size // (plan.micro_batch_size * plan.dp)
            continue
        assert answer["strategy"] == "FSDP2Config"
        assert answer["mesh"]["shape"] == [plan.pp, plan.dp_replicate, plan.dp // plan.dp_replicate, plan.cp,
                                           plan.tp]  # pp, dp_replicate, dp_shard ...
        assert answer["sequence_parallel"] == plan.sequence_parallel
        assert answer["reshard_after_forward"] is (False if plan.zero_stage == 2 else None)
        assert answer["async_tp"] == plan.tp_comm_overlap
        assert answer["offload"] == ("CPUOffloadPolicy" if plan.param_offload else "NoneType")
        assert answer["ac"] == {"none": False, "full": True, "selective": "selective"}[plan.recompute]
        if plan.ep > 1:
            assert answer["moe_mesh"] == {"ep_shard": plan.dp * plan.cp * plan.tp // plan.ep, "ep": plan.ep}
        microbatches = job.global_batch_size // (plan.micro_batch_size * plan.dp)
        if plan.pp > 1:  # one pipeline run per accumulation step, over Plan.pipeline_microbatches (default: all)
            per_run = plan.pipeline_microbatches or microbatches
            assert answer["grad_acc_steps"] == microbatches // per_run
            assert answer["pipeline"]["microbatches"] == per_run
            assert answer["pipeline"]["stages"] == plan.pp * plan.vpp
            assert answer["pipeline"]["schedule"] == ("ScheduleInterleaved1F1B" if plan.vpp > 1 else "Schedule1F1B")
            if answer["pipeline"]["fqns"]:
                layers = [sum(n.startswith("model.layers.") for n in stage) for stage in answer["pipeline"]["fqns"]]
                assert layers[0] == plan.first_stage_layers and layers[-1] == plan.last_stage_layers
                assert sum(layers) == job.model.num_layers
        else:
            assert answer["grad_acc_steps"] == microbatches
        if job.model.moe is not None and plan.ep > 1:
            assert answer["backend"]["dispatcher"] == ("deepep" if plan.moe_token_dispatcher == "flex" else "torch")
        if plan.attention_backend != "auto":
            assert answer["backend"]["attn"] == {"flash": "sdpa", "fused": "te", "unfused": "eager"}[
                plan.attention_backend]
        if job.lora is not None:
            assert answer["peft"]["dim"] == job.lora.rank
        if job.precision == "fp8":
            assert answer["fp8"]["enabled"] and answer["fp8"]["recipe"] == (plan.fp8_recipe or "tensorwise")
            assert answer["fp8"]["gather"] == bool(plan.fp8_param_gather)
        assert answer.get("compile", False) == plan.torch_compile


# Layouts AutoModel refuses, rendered anyway (the adapter's builder, no rules), each with the rule that says so.
AUTOMODEL_REFUSED = [
    ("AM002", dict(model="qwen3-30b-a3b", num_gpus=24, ep=16, global_batch_size=48)),  # 24 % 16
    ("AM004", dict(model="llama-3.1-8b", num_gpus=16, tp=2, zero_stage=0, global_batch_size=64)),
    ("BS001", dict(model="llama-3.1-8b", num_gpus=8, global_batch_size=60, micro_batch_size=2)),
]


# The rules AutoModel's own code decides in the probe (its mesh, StepScheduler and parse_distributed_section)
AUTOMODEL_COMPARED = frozenset({"AM001", "AM002", "AM004", "BS001"})


def _automodel_sample(n: int) -> list[dict]:
    """Seeded layouts over GPU counts, degrees, ZeRO stages and batches, valid and not (explicit dp sometimes)."""
    import random

    rng = random.Random(24)
    out = []
    for _ in range(n):
        model = rng.choice(["llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b"])
        fields = dict(model=model, num_gpus=rng.choice([8, 12, 16, 24, 32]), tp=rng.choice([1, 2, 4]),
                      pp=rng.choice([1, 1, 2]), cp=rng.choice([1, 1, 2]), zero_stage=rng.choice([0, 3, 3]),
                      micro_batch_size=rng.choice([1, 2]), global_batch_size=rng.choice([48, 60, 64, 128]))
        if model != "llama-3.1-8b":
            fields["ep"] = rng.choice([1, 2, 4, 8, 16])
        if rng.random() < 0.25:
            fields["dp"] = rng.choice([1, 2, 4])
        out.append(fields)
    return out


def test_automodel_verdicts_agree_with_check_config_on_a_sample():
    """On seeded layouts, AutoModel's own code (its mesh, StepScheduler) refuses exactly those check_config refuses
    with AM001, AM002, AM004 or BS001; layouts with another meshplan error (heads, layers, micro-batches per run), or
    that the renderer refuses, are left out. The sample holds both verdicts."""
    from meshplan.check.config import check_config
    from meshplan.core.errors import MeshplanError

    cases, ours = [], []
    for i, fields in enumerate(_automodel_sample(80)):
        try:
            job, plan = resolve(Request(framework="nemo-automodel", **fields))
            text = render("nemo-automodel", job, plan).text
        except MeshplanError:
            continue
        errors = {f.id for f in check_config(job, plan, include_memory=False).findings if f.severity == "error"}
        if errors - AUTOMODEL_COMPARED:
            continue
        cases.append({"id": str(i), "yaml": text, "num_gpus": job.num_gpus, "num_layers": job.model.num_layers})
        ours.append(errors)
    answers = automodel_verdicts(cases)
    assert {a["ok"] for a in answers} == {True, False} and len(answers) >= 20
    for answer, errors, case in zip(answers, ours, cases, strict=True):
        assert answer["ok"] == (not errors), (errors, answer.get("error"), case["yaml"])


def test_automodel_refuses_what_its_rules_refuse():
    """AM002, AM004 and BS001 against AutoModel's own code: the layout check_config refuses, AutoModel's mesh or
    StepScheduler refuses too, in its own words."""
    from meshplan.check.config import check_config

    cases, expected = [], []
    for rule, fields in AUTOMODEL_REFUSED:
        job, plan = resolve(Request(framework="nemo-automodel", **fields))
        assert rule in {f.id for f in check_config(job, plan).findings if f.severity == "error"}, rule
        text = render("nemo-automodel", job, plan).text
        cases.append({"id": rule, "yaml": text, "num_gpus": job.num_gpus, "num_layers": job.model.num_layers})
        expected.append(rule)
    for answer, rule in zip(automodel_verdicts(cases), expected, strict=True):
        assert not answer["ok"], rule
        assert {"AM002": "must be a multiple of ep_size", "AM004": "ddp does not support tensor parallelism",
                "BS001": "must be divisible by local_batch_size * dp_size"}[rule] in answer["error"], answer["error"]
