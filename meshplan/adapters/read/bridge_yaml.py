"""Megatron-Bridge's YAML override files (`--config-file conf/x.yaml` of its YAML scripts: a mapping of
ConfigContainer sections, `model:`, `train:`, `optimizer:`, `ddp:` ...), read as Bridge applies them: over the
ConfigContainer a recipe returns, each leaf a dotted key (`model.tensor_model_parallel_size`) read through the same key
table as run_recipe.py's KEY=VALUE overrides and a recipe's cfg assignments (keys.py, the card's adapter knobs and
read.keys), so the three spellings of one key cannot drift.

Bridge (067f987 training/utils/omegaconf_utils.py process_config_with_overrides) turns the recipe's ConfigContainer into
an OmegaConf dict, merges the YAML over it (the YAML wins), then sets each leaf on the dataclass it names, skipping
with a warning a key the dataclass does not have: a top-level key that is no ConfigContainer section (the card's
read.sections) is said so, with the sections there are, and nothing under it read. The file states no GPU count
(torchrun's) and rarely a model: a model is read from the Hugging Face id a saved config records
(model.extra_checkpoint_metadata.hf_model_id), else from the recipe the YAML is paired with, the script beside it that
names the file and calls a Bridge recipe (tutorials/recipes/llama/02_pretrain_with_yaml.py: DEFAULT_CONFIG_FILE
conf/llama32_1b_pretrain.yaml, llama32_1b_pretrain_config()); where that recipe's module is in the same checkout it is
read through its chain (bridge_recipe.py) and the YAML applied over it; else the model is left to the request. A
script launching one (`torchrun ... SCRIPT.py --config-file conf/x.yaml key=value`) is read as the recipe, the YAML and
the command's Hydra-style overrides in that order, with torchrun's GPUs.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import yaml

from meshplan.adapters.read.bridge_recipe import name_facts, read_bridge_recipe, sets_comm_overlap, state_name_facts
from meshplan.adapters.read.keys import Reading, key_table, lookup, read_section
from meshplan.adapters.read.launch import BRIDGE_RECIPES, bridge_settings, named_file, read_launch, world
from meshplan.adapters.read.model_match import layout_settings, recipe_overrides, restated_architecture
from meshplan.adapters.read.settings import Setting, yaml_settings
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.allocator_card import ALLOC_ENV
from meshplan.knowledge.catalog import resolve_model

FRAMEWORK = "megatron-bridge"
KIND = "a Megatron-Bridge override YAML"
FIX = ("Start from the ConfigContainer's sections (model:, train:, optimizer:, ddp: ...), as Megatron-Bridge's "
       "conf/*.yaml files do.")
INSTANTIATE = ("_target_", "_call_", "_partial_")
"""The keys Bridge's instantiate reads in a mapping (utils/instantiate_utils.py): no field of the config it builds."""
CONFIG_FILE = "--config-file"  # the flag every Bridge YAML script declares (13 scripts at 067f987; no other spelling)
LAUNCH = re.compile(r"\.py\b[^\n]*(?:\\\n[^\n]*)*?\s--config-file[= ]\s*\S+\.ya?ml\b")
"""A command line running a Python script with a YAML --config-file (a Bridge YAML script's launch)."""
MISSING = "???"  # OmegaConf's mandatory value: Bridge refuses to run until it is set
MAX_SCRIPTS = 64  # the .py files beside a YAML a pairing looks through (a conf/ folder's parent holds a few)
MAX_RECIPE_FILES = 2000  # the recipe modules of a Bridge checkout searched for a recipe's definition


def is_bridge_yaml(keys: tuple[str, ...]) -> bool:
    """Whether a YAML mapping's top-level keys are a Bridge override file's: at least two ConfigContainer sections
    (the card's read.sections), and more of them than other keys (a misspelt section is still Bridge's, said by the
    reader). detect.yaml_kind asks this after the other YAML configs' marks, so theirs are never read as Bridge's."""
    sections = set(read_section(FRAMEWORK).sections)
    known = [k for k in keys if k in sections]
    return len(known) >= 2 and 2 * len(known) > len(keys)


class Paired(NamedTuple):
    """The script that pairs a YAML with a recipe: its path, the recipes it calls (one per line), each imported from
    megatron.bridge.recipes."""

    script: str
    recipes: list[tuple[str, int]]


def recipe_calls(text: str) -> list[tuple[str, int]]:
    """Every `NAME = <recipe>(...)` (or annotated) of a function the script imports from megatron.bridge.recipes, as
    (recipe, line), in line order: a script may pick one of several at run time (03_finetune_with_yaml.py: SFT or
    PEFT by --peft)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    imported = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and BRIDGE_RECIPES.match(node.module or "")
                for alias in node.names}
    calls = [(imported[node.value.func.id], node.lineno) for node in ast.walk(tree)
             if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call)
             and isinstance(node.value.func, ast.Name) and node.value.func.id in imported]
    return sorted(calls, key=lambda c: c[1])


def paired_script(path: str) -> Paired | None:
    """The script beside the YAML (its folder, or the one above: Bridge keeps them in conf/) that names the file and
    calls a Bridge recipe; None for pasted text, or where no script (or more than one, with different recipes) does."""
    if path.startswith("<") or not server_files.is_file(path):
        return None
    here = Path(path).resolve()
    found: list[Paired] = []
    for folder in dict.fromkeys((here.parent, here.parent.parent)):
        if not server_files.is_dir(folder):
            continue
        for script in sorted(folder.glob("*.py"))[:MAX_SCRIPTS]:
            if not server_files.is_file(script):
                continue
            try:
                text = script.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if not re.search(rf"['\"/]{re.escape(here.name)}['\"]", text):
                continue
            calls = recipe_calls(text)
            if calls:
                found.append(Paired(str(script), calls))
    distinct = {tuple(name for name, _ in p.recipes) for p in found}
    return found[0] if len(distinct) == 1 else None


def recipe_module(script: str, name: str) -> tuple[str, str, str] | None:
    """(module path, function, module text) defining the recipe in the Bridge checkout the script sits in (the
    first folder above it holding src/megatron/bridge/recipes): a `def NAME(`, else the function a module re-exports
    as NAME (Bridge's recipes/llama/llama3.py: `llama32_1b_pretrain_1gpu_h100_bf16_config as
    llama32_1b_pretrain_config`)."""
    root = next((folder / "src/megatron/bridge/recipes" for folder in Path(script).resolve().parents
                 if server_files.is_dir(folder / "src/megatron/bridge/recipes")), None)
    if root is None:
        return None
    files = sorted(root.rglob("*.py"))[:MAX_RECIPE_FILES]
    texts: dict[Path, str] = {}
    for file in files:
        if server_files.is_file(file):
            try:
                texts[file] = file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
    for wanted in (name, *(m.group(1) for text in texts.values()
                           for m in re.finditer(rf"\b(\w+)\s+as\s+{re.escape(name)}\b", text))):
        for file, text in texts.items():
            if re.search(rf"^def {re.escape(wanted)}\(", text, re.M):
                return str(file), wanted, text
    return None


def read_bridge_yaml(text: str, path: str) -> Reading:
    """A Bridge override YAML, over the recipe it is paired with where one is found (the YAML wins, as OmegaConf.merge
    gives it), else on its own: its model and GPU count then left to the request unless the file states them."""
    reading = _yaml_over_recipe(text, path, paired_script(path))
    _left(reading, "a Bridge override YAML runs on the GPUs torchrun starts its script on")
    return reading


def _yaml_over_recipe(text: str, path: str, paired: Paired | None) -> Reading:
    """The YAML's settings over the recipe reading of the script that pairs it (or none), each key the YAML sets
    taking the recipe's place."""
    settings = yaml_settings(text, path, KIND, FIX, refuses_duplicates="Megatron-Bridge's loader (OmegaConf)")
    reading = _paired_reading(paired, path) if paired is not None else Reading(FRAMEWORK, path, variant="run_recipe")
    root = yaml.compose(text)  # parsed by yaml_settings already: each top-level key's own line
    tops = {str(k.value): k.start_mark.line + 1 for k, _ in root.value} if isinstance(root, yaml.MappingNode) else {}
    _over(reading, _sections(reading, [replace(s, file=path) for s in settings], tops))
    return reading


def _over(reading: Reading, settings: list[Setting]) -> None:
    """Settings applied over what the reading holds (the recipe's, then the YAML's): the earlier value of each key
    they set dropped first (zero_stage, say, is stated only where not stated yet), then read through the one Bridge
    key table, the model's keys compared with the model read."""
    section = read_section(FRAMEWORK)
    table = key_table(FRAMEWORK, variant=reading.variant)
    for s in settings:
        for name, source in list(reading.sources.items()):
            if name != "framework" and lookup(table, s.key) and re.search(rf"\s{re.escape(s.key)}\b", source):
                reading.request.pop(name, None)
                reading.sources.pop(name, None)
    bridge_settings(reading, layout_settings(settings, section))
    _hf_model(reading)
    recipe_overrides(reading, settings, section)
    restated_architecture(reading, settings, section)


def _left(reading: Reading, gpus: str | None) -> None:
    """The model and (`gpus`: why not) the GPU count, where the files read state neither, left to the request."""
    if "model" not in reading.request and not any("model" in left.fields for left in reading.left_to_request):
        reading.leave(("model",), "model: the YAML names no model (a Bridge override file takes it from the recipe "
                                  "its script starts from; pass --model)")
    if gpus is not None and "num_gpus" not in reading.request:
        reading.leave(("num_gpus",), f"num_gpus: {gpus} (pass --num-gpus)")


def read_bridge_yaml_launch(text: str, path: str) -> Reading:
    """A script launching a Bridge YAML script (`torchrun --nproc_per_node=8 02_pretrain_with_yaml.py --config-file
    conf/x.yaml model.tensor_model_parallel_size=2`, the usage its tutorials and examples give): the YAML it names over
    the recipe the launched script starts from, then the command's Hydra-style overrides over both (Bridge's
    parse_hydra_overrides, struct mode: a top-level key that is no ConfigContainer section is refused, as Bridge
    refuses it), and the GPU count from the launcher."""
    launch = read_launch(text, path, FRAMEWORK, variant="run_recipe", marker=CONFIG_FILE)
    command, k = launch.command, launch.k
    at = next(i for i, w in enumerate(command.words) if i > k and w.text.split("=", 1)[0] == CONFIG_FILE)
    word = command.words[at]
    if "=" in word.text:
        word = replace(word, text=word.text.split("=", 1)[1])
    elif at + 1 < len(command.words):
        word = command.words[at + 1]
    yaml_path, yaml_text = named_file(launch.reading, word, command.words[at].text.split("=", 1)[0], (".yaml", ".yml"),
                                      "the script's")
    paired = None
    try:
        script, script_text = named_file(launch.reading, command.words[k], "", (".py",), "the launched script's")
    except MeshplanError:
        launch.reading.notes.append(f"{path}:{command.line} {command.words[k].text}: the launched script is not "
                                    "found beside this one, so the recipe it starts from is not read")
    else:
        calls = recipe_calls(script_text)
        paired = Paired(script, calls) if calls else None
    reading = _yaml_over_recipe(yaml_text, yaml_path, paired if paired is not None else paired_script(yaml_path))
    for name in ("unresolved", "assumed", "notes", "allocator_env"):
        setattr(reading, name, getattr(launch.reading, name) + getattr(reading, name))
    reading.launch_line = launch.reading.launch_line
    sections = read_section(FRAMEWORK).sections
    overrides: list[Setting] = []
    for s in launch.settings:
        if s.key.split("=", 1)[0] == CONFIG_FILE:
            continue
        if s.key.lstrip("+~").split(".", 1)[0] in sections or s.key.startswith("-"):
            overrides.append(s)
        elif s.key.startswith("+"):  # added to the OmegaConf dict, then skipped by _apply_overrides with a warning
            reading.unsupported.append(f"{s.where(path)} = {s.value}: not a ConfigContainer section, so "
                                       "Megatron-Bridge adds it to the merged config and then skips it (no field of "
                                       "ConfigContainer)")
        else:  # struct mode: Hydra refuses a key the config lacks, unless added with +
            near = difflib.get_close_matches(s.key.split(".", 1)[0], sections, n=1)
            raise MeshplanError(
                f"{s.where(path)}={s.value}: {s.key.split('.', 1)[0]} is not a ConfigContainer section, and "
                "Megatron-Bridge refuses the override (parse_hydra_overrides, struct mode: 'Could not override "
                f"{s.key!r}')" + (f"; did you mean {near[0]}?" if near else "") + ".",
                fix=f"Set a key of one of its sections: {', '.join(sections)}.")
    _over(reading, [replace(s, file=path, key=s.key.lstrip("+")) for s in overrides])
    world(reading)
    _left(reading, None)
    return reading


def _paired_reading(paired: Paired, path: str) -> Reading:
    """The reading of the recipe a script pairs the YAML with: its module read through its chain where the checkout
    holds it, else what the recipe's name states; several recipes (picked at run time) state only the model they
    share. The recipe's GPU count and GPU, which its name may state, are the run's, left to the request."""
    names = list(dict.fromkeys(name for name, _ in paired.recipes))
    line = paired.recipes[0][1]
    where = f"{paired.script}:{line}"
    if len(names) > 1:
        reading = Reading(FRAMEWORK, path, variant="run_recipe")
        models = {name_facts(name)[0].get("model") for name in names}
        if len(models) == 1 and None not in models:
            reading.state("model", models.pop(), f"{where} (its recipes {', '.join(names)} all build it)")
        reading.assumed.append(f"{path}: paired with {paired.script}, which names it and picks one of the recipes "
                               f"{', '.join(names)} at run time: none read (pass --job and the fields they set)")
        return reading
    module = recipe_module(paired.script, names[0])
    if module is not None:
        reading = read_bridge_recipe(module[2], f"{module[0]}:{module[1]}", bridge_settings)
        for name in ("num_gpus", "gpu"):  # the recipe's tuned run, not this script's: torchrun's GPUs
            if name in reading.sources and "recipe name" in reading.sources[name]:
                reading.request.pop(name)
                reading.sources.pop(name)
        reading.variant = "run_recipe"  # the YAML's keys, as Bridge's Hydra overrides write them (fixes.written)
        reading.assumed.append(f"{path}: applied over recipe {names[0]}() ({module[1]} in {module[0]}), which "
                               f"{where} starts from before it merges this file (the script names it)")
        return reading
    reading = Reading(FRAMEWORK, path, variant="run_recipe")
    state_name_facts(reading, names[0], None, sets_comm_overlap(()))
    for name in ("num_gpus", "gpu"):
        if name in reading.request and "recipe name" in reading.sources.get(name, ""):
            reading.request.pop(name)
            reading.sources.pop(name)
    reading.assumed.append(f"{path}: paired with recipe {names[0]}() ({where}, the script that names this file); "
                           "the recipe's module is not in this checkout, so its name's model and job are read and "
                           "the fields its body sets are Megatron-Bridge's (pass the ones the YAML leaves out)")
    return reading


def _sections(reading: Reading, settings: list[Setting], tops: dict[str, int]) -> list[Setting]:
    """The settings Bridge applies: a key under no ConfigContainer section said as Bridge skips it (with the section
    it is one slip from, and the sections there are), Bridge's instantiate keys and OmegaConf's MISSING taken out."""
    sections = read_section(FRAMEWORK).sections
    table = key_table(FRAMEWORK, variant=reading.variant)
    kept: list[Setting] = []
    skipped: dict[str, Setting] = {}
    for s in settings:
        top, _, rest = s.key.partition(".")
        if top not in sections:
            skipped.setdefault(top, s)
            continue
        if top == "env_vars":  # ConfigContainer.env_vars, set before the trainer imports torch: the allocator's read
            if rest in ALLOC_ENV:
                reading.allocator_env.append(replace(s, key=rest))
            continue
        if rest.rsplit(".", 1)[-1] in INSTANTIATE or s.key in INSTANTIATE:
            if s.key == "model._target_":  # the provider class: a family's (GPTModelProvider), never a model's size
                reading.notes.append(f"{s.where(reading.path)} = {s.value}: the model provider Bridge instantiates "
                                     "(a model family's class, not one model: the model is read from the file's "
                                     "recipe or hf_model_id, else passed with --model)")
            continue
        if s.value == MISSING:
            if lookup(table, s.key):
                reading.unresolved.append(f"{s.where(reading.path)} = ???: OmegaConf's MISSING, which Bridge refuses "
                                          "until it is set (pass the field beside the file)")
            continue
        kept.append(s)
    for top, s in skipped.items():
        near = difflib.get_close_matches(top, sections, n=1)
        said = (f"{s.file or reading.path}:{tops.get(top, s.line)} {top}: not a ConfigContainer section, so "
                f"Megatron-Bridge skips it and everything under it (its warning: \"Key '{top}' in overrides not "
                f"found in config object ConfigContainer. Skipping.\")" + (f"; did you mean {near[0]}?" if near else "")
                + f" Its sections: {', '.join(sections)}")
        reading.unsupported.append(said)
        if near:
            reading.misspelt.append(said)
    return kept


def _hf_model(reading: Reading) -> None:
    """The catalog model of the Hugging Face id a saved config records (the card's read.keys target hf_model), where
    the recipe named none."""
    stated = reading.extra.get("hf_model")
    if stated is None or "model" in reading.request:
        return
    value, s = stated
    try:
        key = resolve_model(str(value).strip("'\"")).key
    except MeshplanError:
        reading.notes.append(f"{s.where(reading.path)} = {value}: not in meshplan's catalog")
        return
    reading.state("model", key, s)

