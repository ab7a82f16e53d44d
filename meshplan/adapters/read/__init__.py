"""Reads the configurations people actually write (launch scripts, Hydra overrides, TOML and JSON job files) into
meshplan's request, field by field with the file's key and line. Nothing in a file is ever run.

One module per format: detect.py (which format a pasted text is, from its content), shell.py (a shell script
read, not run), settings.py (files as key/value/line settings),
keys.py (which request field a framework key sets, from the framework cards), launch.py (Megatron-LM,
Megatron-DeepSpeed, Megatron-Bridge), model_match.py (the catalog model a script's architecture flags describe),
hydra.py (verl, SkyRL), bridge_yaml.py (a Megatron-Bridge override YAML over its recipe),
verl_sft.py (verl's SFT trainer: its launch scripts and YAML),
files.py (torchtitan, KempnerForge, DeepSpeed JSON), automodel.py (a NeMo AutoModel recipe YAML),
pyconfig.py (torchtitan's Python config registry, parsed with ast), mlm_test.py (Megatron-LM's functional-test
model_config.yaml, its MODEL_ARGS read as the launch line); fixes.py (check's fixes in the file's keys).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from meshplan.adapters.read.automodel import automodel_entry, read_automodel_launch, read_automodel_yaml
from meshplan.adapters.read.bridge_recipe import DETECT as BRIDGE_RECIPE
from meshplan.adapters.read.bridge_yaml import LAUNCH as BRIDGE_YAML_LAUNCH
from meshplan.adapters.read.bridge_yaml import read_bridge_yaml, read_bridge_yaml_launch
from meshplan.adapters.read.decoder_split import (
    STAGE_SIZES,
    hybrid_model_assumed,
    in_pattern_layers,
    read_decoder_split,
    refuse_hybrid_model_split,
)
from meshplan.adapters.read.detect import (
    YAML_CONFIGS,
    YAML_FIX,
    detect_format,
    python_module,
    shows_shell,
    unknown_yaml,
    unplaced_python,
    unplaced_text,
    yaml_kind,
)
from meshplan.adapters.read.files import (
    read_deepspeed_json,
    read_kempnerforge,
    read_kempnerforge_launch,
    read_toml_any,
    read_torchtitan_cli,
    read_torchtitan_toml,
)
from meshplan.adapters.read.hydra import read_skyrl, read_skyrl_yaml, read_verl, read_verl_yaml
from meshplan.adapters.read.keys import (
    BASE_NOT_MODELLED,
    LORA_NOT_MODELLED,
    SPLIT_NOT_READ,
    Reading,
    fill_defaults,
    read_section,
)
from meshplan.adapters.read.launch import (
    NoLaunch,
    called_scripts,
    read_allocator,
    read_bridge,
    read_bridge_module,
    read_bridge_python,
    read_megatron,
    recipe_call,
    wrapper_script,
)
from meshplan.adapters.read.lora_keys import (
    all_linear_on_model,
    all_linear_that_fails,
    exclusions_applied,
    patterns_on_model,
    target_parameters_read,
)
from meshplan.adapters.read.mlm_test import read_megatron_test_yaml
from meshplan.adapters.read.pyconfig import DETECT as PYTHON_CONFIG
from meshplan.adapters.read.pyconfig import read_torchtitan_python
from meshplan.adapters.read.settings import yaml_settings
from meshplan.adapters.read.shell import MAX_CONFIG_CHARS, read_script
from meshplan.adapters.read.verl_sft import DETECT as VERL_SFT
from meshplan.adapters.read.verl_sft import read_verl_sft, read_verl_sft_yaml
from meshplan.arithmetic.mesh import file_data_parallel
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.model_config import is_model_config_json
from meshplan.request.parse import checked_fields
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.imported import ImportedConfig, StatedKey

FORMATS = ("shell", "toml", "json", "yaml")


# C0 and C1 control characters and DEL, but tab, LF, CR and the form feed some Python and shell files hold
CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")


def _megatron_or_deepspeed(text: str, path: str) -> Reading:
    deepspeed = re.search(r"--deepspeed\b|ds_config|deepspeed_config", text) is not None
    return read_megatron(text, path, "deepspeed" if deepspeed else "megatron-core")


BRIDGE_SCRIPT = re.compile(r"(?m)^cfg\.[\w.]+\s*=")  # a Python script setting a Bridge recipe's cfg.* fields


def _bridge_script(text: str) -> bool:
    """A Python script setting a Bridge recipe's cfg.* fields, or calling a recipe it imports from
    megatron.bridge.recipes (launch.recipe_call: Bridge's quickstart's `config = llama32_1b_pretrain_config()`)."""
    return bool(BRIDGE_SCRIPT.search(text)) or ("megatron.bridge.recipes" in text and recipe_call(text) is not None)


def _read_as_python(text: str) -> bool:
    """Whether a Python reader takes the text: torchtitan's config_registry.py, a Bridge recipe module or cfg.* script
    (what _shell_reader and READERS send to them)."""
    return bool(PYTHON_CONFIG.search(text) or BRIDGE_RECIPE.search(text) or _bridge_script(text))


def _shell_reader(text: str) -> Callable[[str, str], Reading] | None:
    """The reader of a shell script, by the entry point it launches."""
    if PYTHON_CONFIG.search(text):  # torchtitan's config_registry.py generation (before any launcher word)
        return read_torchtitan_python
    if BRIDGE_RECIPE.search(text):  # a Megatron-Bridge recipe module (def ...() -> ConfigContainer:)
        return read_bridge_module
    if VERL_SFT.search(text):  # verl's SFT trainer, before the RL reader's verl.trainer
        return read_verl_sft
    if not BRIDGE_SCRIPT.search(text) and _bridge_script(text):  # a script calling a recipe it imports
        return read_bridge_python
    # verl's keys (actor_rollout_ref.*) or SkyRL's (generator.*, trainer.policy.*) before the entry point's name:
    # verl's DAPO recipe and SkyRL's DAPO example both run a main_dapo
    for pattern, reader in ((r"verl\.trainer|main_ppo|actor_rollout_ref\.", read_verl),
                            (r"skyrl|(?:^|\s)\+*(?:generator|trainer\.policy)\.[\w.]+=", read_skyrl),
                            (r"main_dapo", read_verl),
                            (BRIDGE_SCRIPT.pattern, read_bridge_python),
                            (r"run_recipe\.py", read_bridge), (r"torchtitan\.train", read_torchtitan_cli),
                            (automodel_entry(), read_automodel_launch),
                            (r"(?:^|[\s/])scripts/train\.py\s", read_kempnerforge_launch),
                            (BRIDGE_YAML_LAUNCH.pattern, read_bridge_yaml_launch),
                            (r"pretrain_\w+\.py|finetune_llama\.py", _megatron_or_deepspeed)):
        if re.search(pattern, text):
            return reader
    return None


READERS: dict[tuple[str, str], Callable[[str, str], Reading]] = {
    ("megatron-core", "shell"): lambda t, p: read_megatron(t, p, "megatron-core"),
    ("megatron-core", "yaml"): read_megatron_test_yaml,
    ("deepspeed", "shell"): lambda t, p: read_megatron(t, p, "deepspeed"),
    ("deepspeed", "json"): read_deepspeed_json,
    ("megatron-bridge", "shell"): lambda t, p: (read_bridge_module if BRIDGE_RECIPE.search(t) else read_bridge_python
                                                if _bridge_script(t) and "run_recipe.py" not in t
                                                else read_bridge_yaml_launch if BRIDGE_YAML_LAUNCH.search(t)
                                                and "run_recipe.py" not in t else read_bridge)(t, p),
    ("megatron-bridge", "yaml"): read_bridge_yaml,
    ("verl", "shell"): lambda t, p: (read_verl_sft if VERL_SFT.search(t) else read_verl)(t, p),
    ("verl", "yaml"): lambda t, p: (read_verl_yaml if yaml_kind(t) == "verl" else read_verl_sft_yaml)(t, p),
    ("skyrl", "shell"): read_skyrl,
    ("skyrl", "yaml"): read_skyrl_yaml,
    ("torchtitan", "shell"): lambda t, p: (read_torchtitan_python if PYTHON_CONFIG.search(t) else read_torchtitan_cli)(
        t, p),
    ("torchtitan", "toml"): read_torchtitan_toml,
    ("kempnerforge", "toml"): read_kempnerforge,
    ("kempnerforge", "shell"): read_kempnerforge_launch,
    ("nemo-automodel", "yaml"): read_automodel_yaml,
    ("nemo-automodel", "shell"): read_automodel_launch,
}


def _yaml_reader(text: str, path: str) -> Callable[[str, str], Reading]:
    """The reader of the YAML config the text is (detect.yaml_kind, by its top-level keys: an AutoModel recipe, verl's
    or SkyRL's RL trainer config, Megatron-LM's functional-test model_config.yaml or verl's SFT trainer config); a
    file that is no YAML mapping, with no framework named, is refused as what it is (a list, a value), and a mapping
    that is none of them with its keys, not read as a broken AutoModel recipe."""
    kind = yaml_kind(text)
    if kind is not None:
        return {"verl-sft": read_verl_sft_yaml, "verl": read_verl_yaml, "skyrl": read_skyrl_yaml,
                "megatron-test": read_megatron_test_yaml, "megatron-bridge": read_bridge_yaml}.get(kind,
                                                                                   read_automodel_yaml)
    yaml_settings(text, path, YAML_CONFIGS, YAML_FIX)  # a syntax error or no mapping: said in every reader's words
    raise unknown_yaml(text, path)


def _called(text: str, path: str) -> list[tuple[str, int]]:
    """The scripts a shell file no reader places runs (launch.called_scripts); none where it does not parse."""
    try:
        return called_scripts(read_script(text, path))
    except MeshplanError:
        return []


def import_config(text: str, path: str = "<config_text>", framework: str | None = None,
                  config_format: str | None = None) -> ImportedConfig:
    """The request a configuration file states (see ImportedConfig). `framework` and `config_format` are detected
    when left out; an unreadable file is a MeshplanError naming the line. Every parser and reader here descends into
    a nested value by recursion (json, tomllib, PyYAML's composer, the readers' own walks), so a file nested hundreds
    of levels deep, within MAX_CONFIG_CHARS, would end in Python's RecursionError: it is refused here, once for all."""
    try:
        return _import_config(text, path, framework, config_format)
    except RecursionError:
        raise MeshplanError(f"{path}: nested deeper than meshplan reads (brackets, braces or indented sections "
                            "hundreds of levels inside one another); a configuration nests a few levels.",
                            fix="Pass the launch script or job file the run reads.") from None


def _import_config(text: str, path: str, framework: str | None, config_format: str | None) -> ImportedConfig:
    if not isinstance(text, str) or not text.strip():
        files = [f.upper() for f in FORMATS if f != "shell"]  # every format a reader takes, YAML too
        raise MeshplanError(f"{path}: the configuration is empty.",
                            fix=f"Pass a launch script or a {', '.join(files[:-1])} or {files[-1]} file.")
    if len(text) > MAX_CONFIG_CHARS:
        # 'more than', not len(text): import_file reads a file only one character past the limit, so its count was
        # 1,048,577 for any longer file
        raise MeshplanError(f"{path}: more than {MAX_CONFIG_CHARS:,} characters; a configuration is at most that.",
                            fix="Pass the launch script or job file itself.")
    if control := CONTROL.search(text):  # echoed in a note, a NUL or a terminal escape reaches the user's screen
        line = text.count("\n", 0, control.start()) + 1
        column = control.start() - text.rfind("\n", 0, control.start())
        raise MeshplanError(f"{path}:{line}: a control character, U+{ord(control.group()):04X}, at column {column}; a "
                            "configuration is text, with no control character but tabs, line and page breaks.",
                            fix="Pass the text file the run reads (not a binary file), or remove the character (a "
                                "paste from a terminal can carry escapes).")
    if framework is not None and framework not in FRAMEWORKS:  # the Request's field, refused in its words
        checked_fields({"framework": framework})
        raise MeshplanError(f"Unknown framework {framework!r}.", fix=f"Use one of: {', '.join(FRAMEWORKS)}.")
    if config_format is not None and config_format not in FORMATS:
        raise MeshplanError(f"Unknown config_format {config_format!r}.", fix=f"Use one of: {', '.join(FORMATS)}.")
    fmt = config_format or detect_format(text)
    if framework is None and fmt == "json" and is_model_config_json(text):  # not 'not a deepspeed ds_config'
        raise MeshplanError(f"{path}: a Hugging Face config.json (it names model_type or architectures), a model, "
                            "not a framework's config.",
                            fix="Pass it as the model: --model FILE on the CLI; on MCP and over HTTP its text as "
                                "model or config_text.")
    if framework is None:
        reader = _yaml_reader(text, path) if fmt == "yaml" else \
            {"json": read_deepspeed_json, "toml": read_toml_any}.get(fmt) or _shell_reader(text)
    else:
        reader = READERS.get((framework, fmt))
    if reader is None:
        readable = ", ".join(f"{f} ({k})" for f, k in READERS)
        if framework is not None:  # told the framework: passing it again cannot help, another format or framework can
            kinds = " or ".join(k for f, k in READERS if f == framework)
            readers = " or ".join(f for f, k in READERS if k == fmt)
            if not kinds:  # no reader for the framework at all (nanotron): no format to suggest
                raise MeshplanError(f"{path}: meshplan reads no {framework} file.",
                                    fix=f"Pass the framework this {fmt} file is for ({readers}), or pass the "
                                        f"{framework} job's fields as arguments. meshplan reads: {readable}.")
            raise MeshplanError(f"{path}: meshplan reads {framework} from {kinds} files, not from a {fmt} file.",
                                fix=f"Pass {framework}'s {kinds} file, or the framework this {fmt} file is for "
                                    f"({readers}), or the file's format if it is not {fmt}.")
        if fmt == "shell" and (tree := python_module(text, path)) is not None:  # a .py file no reader places
            raise unplaced_python(tree, path, readable)
        if fmt == "shell" and (called := _called(text, path)):  # a wrapper: the launch is in the script it calls
            raise wrapper_script(path, called)
        if fmt == "shell" and config_format is None and not shows_shell(text):  # no format it shows: say so
            raise unplaced_text(text, path, readable)
        raise MeshplanError(f"{path}: meshplan cannot tell which framework this {fmt} file is for.",
                            fix=f"Pass the framework (--framework; MCP: framework); meshplan reads: {readable}.")
    try:
        reading = reader(text, path)
    except NoLaunch:
        if framework is not None and fmt == "shell" and not _read_as_python(text) and \
                (tree := python_module(text, path)) is not None:  # not 'not a ... launch script': a Python file
            raise unplaced_python(tree, path, ", ".join(f"{f} ({k})" for f, k in READERS), framework) from None
        raise
    read_allocator(reading)  # a launch script's PYTORCH_CUDA_ALLOC_CONF, once the job is known
    reading.request.setdefault("framework", reading.framework)
    reading.sources.setdefault("framework", f"{path} (read as {reading.framework}"
                                            + (f", {reading.variant})" if reading.variant else ")"))
    fill_defaults(reading)
    all_linear_on_model(reading)  # a PEFT all-linear as every linear of the file's model
    all_linear_that_fails(reading)  # once the model and the engine's ZeRO stage are known
    patterns_on_model(reading)  # Bridge's target_modules path patterns against the model's layers
    exclusions_applied(reading)  # exclude_modules taken out of the targets just read
    target_parameters_read(reading)  # PEFT's target_parameters, once the file's LoRA rank is read
    decoder_split = read_decoder_split(reading)  # a GPTModel's stage sizes, decoder layers of a GDN hybrid
    hybrid_model = hybrid_model_assumed(reading)  # pretrain_mamba.py's HybridModel: said where it plans otherwise
    unset_where_unread(reading)
    return ImportedConfig(framework=reading.framework, variant=reading.variant, path=path, request=reading.request,
                          sources=reading.sources, defaults=reading.defaults, unsupported=reading.unsupported,
                          misspelt=reading.misspelt, unresolved=reading.unresolved,
                          left_to_request=reading.left_to_request, notes=reading.notes,
                          assumed=reading.assumed,
                          config_format=fmt, config_variable=reading.config_variable,
                          batch_per_dp=reading.batch_per_dp,
                          stage_sizes_in_decoder_layers=decoder_split,
                          beside_stated={key: StatedKey(key=s.written or s.key, value=s.value, line=s.line)
                                         for key, s in reading.beside.items()},
                          builds_hybrid_model=hybrid_model)


UNSET = re.compile(r"^(?P<where>.+):(?P<line>\d+) \$\w+ is not set in the script: left empty$")


def unset_where_unread(reading: Reading) -> None:
    """A variable the script leaves unset (shell.py: '$HOME is not set in the script: left empty') on a line that sets
    nothing meshplan reads (verl's and SkyRL's data.train_files=$HOME/data/...) moves from the lines not read, which
    ask for a flag, to the notes: every RL script in tests/configs listed its $HOME lines as 'not read (pass these as
    flags)', and check as what it 'cannot express or could not read'. Where the line sets a field, or another line
    not read is on it, or a variable set on it feeds a setting read, it stays."""
    kept: list[str] = []
    for said in reading.unresolved:
        found = UNSET.match(said)
        # the line itself, or a variable set on it that a read setting names (`($MODEL_PATH at line 33)`)
        at = re.compile(rf"{re.escape(found.group('where'))}:{found.group('line')}\b|at line "
                        rf"{found.group('line')}\b") if found else None
        if at is None or any(at.search(v) for v in reading.sources.values()) or any(
                at.search(u) for u in reading.unresolved if u != said):
            kept.append(said)
        else:
            reading.notes.append(f"{said}; the line sets nothing meshplan reads")
    reading.unresolved[:] = kept


def request_values(imported: ImportedConfig, given: Mapping[str, Any], scan_gpus: bool = False) -> dict[str, Any]:
    """The file's request with the fields given beside it (flags, tool arguments) over it; a framework given beside
    it only chose how the file was read. `scan_gpus` (min-gpus, which finds the GPU count): the file's count is left
    out, where it made every launch script's scan refused ('num_gpus cannot be given')."""
    values = dict(imported.request)
    if scan_gpus:
        values.pop("num_gpus", None)
    values.update({name: value for name, value in given.items() if value is not None})
    if imported.stage_sizes_in_decoder_layers and "model" in values:  # the file's own sizes, not those given
        in_pattern_layers(values, [n for n in STAGE_SIZES if given.get(n) is None], values["model"])
    refuse_hybrid_model_split(imported, values)  # a Gated DeltaNet hybrid's pretrain_mamba.py split HybridModel refuses
    gpus = values.get("num_gpus")
    dp = file_data_parallel(gpus, *(values.get(n, 1) for n in ("tp", "pp", "cp"))) if isinstance(gpus, int) else None
    if imported.batch_per_dp and "global_batch_size" not in values and dp:  # the file's step, dp = the GPUs left over
        values["global_batch_size"] = imported.batch_per_dp * dp
    if "model" not in values:  # said with the file and why, not as a request that forgot its model
        unread = [left.said for left in imported.left_to_request if "model" in left.fields]
        # every reason, the catalog's miss and why the flags build no model either (Megatron-Core refusing them)
        said = "the file's model is not read. " + "; ".join(u.rstrip(".") for u in unread) \
            if unread and "names no model" not in unread[0] else "the file names no model"
        raise MeshplanError(f"{imported.path}: {said}.", fix="Pass the model beside the file (--model, or the "
                                                             "tool's model argument): a catalog key or the model's "
                                                             "config.json.")
    unread_gpus = [left.said for left in imported.left_to_request if left.fields == ["num_gpus"]]
    if unread_gpus and not scan_gpus and not {"num_gpus", "dp"} & set(values):  # else the layout's product: dp 1
        said = unread_gpus[0].removeprefix("num_gpus: ").removesuffix(" (pass --num-gpus)")
        raise MeshplanError(f"{imported.path}: the GPU count is not read ({said}), and the file leaves dp to be the "
                            "GPUs left over: estimated on the layout's own GPUs, dp would be 1.",
                            fix="Pass the GPU count beside the file (--num-gpus, or the tool's num_gpus argument).")
    unmodelled = [line for line in imported.unsupported if line.endswith(LORA_NOT_MODELLED)]
    if unmodelled and (values.get("lora_rank") or values.get("job") == "lora"):
        fix = ("Name targets, or patterns, that adapt each target on every layer, in every place the model holds it "
               "(Megatron-Bridge's own names do), target_parameters ending with gate_up_proj or down_proj, or drop "
               "the key")
        raise MeshplanError(f"{unmodelled[0].removesuffix('; ' + LORA_NOT_MODELLED)}: no estimate of this LoRA job "
                            "would be right.", fix=fix + ".")
    quantized = [line for line in imported.unsupported if line.endswith(BASE_NOT_MODELLED)]
    if quantized:
        facts = read_section(imported.framework).quantized_base
        raise MeshplanError(f"{quantized[0].removesuffix('; ' + BASE_NOT_MODELLED)}: no estimate of a job from this "
                            "file would be right.", fix=facts.fix if facts is not None else "Drop the key.")
    split = [line for line in imported.unresolved if SPLIT_NOT_READ in line]
    if split and not {"first_stage_layers", "last_stage_layers", "pipeline_layout"} & set(values):
        raise MeshplanError(f"{imported.path}: the file's pipeline split is not read: "
                            f"{split[0].split('; ' + SPLIT_NOT_READ)[0]}.",
                            fix="Give the stages' decoder layers beside the file (--first-stage-layers/"
                                "--last-stage-layers or --pipeline-layout, or the tool's first_stage_layers / "
                                "last_stage_layers / pipeline_layout), or a split in the file whose every stage holds "
                                "a decoder layer.")
    return values


def import_file(path: str, framework: str | None = None, config_format: str | None = None) -> ImportedConfig:
    """import_config of a file on disk (a missing or unreadable file is a MeshplanError)."""
    shown = path  # FILE.py:FUNCTION picks one function of a torchtitan config_registry.py
    path = server_files.server_name(path, "config file")  # a remote caller's: inside the folders it may read
    if not os.path.exists(path) and re.search(r"\.py:\w+$", path):
        path = server_files.server_name(path.rsplit(":", 1)[0], "config file")
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as handle:
            text = handle.read(MAX_CONFIG_CHARS + 1)
    except OSError as exc:
        raise MeshplanError(f"Cannot read {path}: {exc.strerror or exc}.", fix="Check the path.") from None
    if config_format is None and path.endswith((".json", ".toml", ".yaml")):
        config_format = path.rsplit(".", 1)[1]
    elif config_format is None and path.endswith(".yml"):
        config_format = "yaml"
    elif config_format is None and path.endswith((".sh", ".bash", ".slurm", ".sbatch")):
        config_format = "shell"
    return import_config(text, shown, framework, config_format)


__all__ = ["FORMATS", "ImportedConfig", "detect_format", "import_config", "import_file", "request_values"]
