"""Which format a pasted configuration is in, and which YAML config a YAML mapping is, from its content: a JSON
object, a YAML mapping by its top-level keys (a NeMo AutoModel recipe's `distributed:` / `step_scheduler:`, verl's
SFT trainer config's sections from the card's read.sft entries, verl's and SkyRL's RL trainer configs, Megatron-LM's
functional-test model_config.yaml), TOML with a [section], else a shell script. A YAML mapping that is none of them
is refused with its keys and what each config holds, never read as a shell script or as the wrong framework's file.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import lru_cache

import yaml

from meshplan.adapters.read.bridge_yaml import is_bridge_yaml
from meshplan.adapters.read.hydra import HYDRA_YAML
from meshplan.adapters.read.keys import read_section
from meshplan.adapters.read.mlm_test import MARK as MLM_TEST
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.read_card import SftEntry

AUTOMODEL_MARKERS = ("distributed", "step_scheduler")
"""An AutoModel recipe's own top-level sections (its layout's: automodel.py READ_SECTIONS), in no verl config."""
_HYDRA_NAMES = {"verl": "verl's RL trainer config", "skyrl": "SkyRL's RL trainer config"}
_MARKED = [f"a NeMo AutoModel recipe (`{AUTOMODEL_MARKERS[0]}:` or `{AUTOMODEL_MARKERS[1]}:`)",
           *(f"{_HYDRA_NAMES[framework]} (" + " and ".join(f"`{m}:`" for m in marks) + ")"
             for framework, marks in HYDRA_YAML.items()),
           f"Megatron-LM's functional-test model_config.yaml (`{MLM_TEST}:`)",
           "a Megatron-Bridge override YAML (ConfigContainer sections: `model:`, `train:`, `optimizer:`, `ddp:` ...)"]
"""Every YAML config yaml_kind tells by a top-level key, with that key: what a refusal says meshplan reads."""
YAML_CONFIGS = ("each YAML config meshplan reads (a NeMo AutoModel recipe, verl's or SkyRL's RL trainer config, "
                "Megatron-LM's functional-test model_config.yaml, verl's SFT trainer config, a Megatron-Bridge "
                "override YAML)")
YAML_FIX = (f"Pass {', '.join(_MARKED)} or verl's SFT trainer config (sft_trainer_engine.yaml or a copy), or the "
            "launch script that runs the training.")
_BROKEN_VERL = re.compile(r"(?m)^[ \t]+partial_pretrain:|^ulysses_sequence_parallel_size:|^engine:")
"""verl's SFT YAML told by a line alone where the YAML does not parse (its reader then names the bad line)."""
_KEY = re.compile(r"^[A-Za-z_][\w.@-]*$")  # a config's section name; a shell line read as a key has spaces or quotes


@lru_cache(maxsize=4)  # detect_format, yaml_kind and the refusal each ask of the same text
def yaml_top_keys(text: str) -> tuple[str, ...] | None:
    """The top-level keys of a YAML mapping whose every key is a plain name (None: not YAML, not a mapping, or a
    mapping of words no config writes, as a shell line that YAML happens to parse). Composed only: nothing built."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if not isinstance(root, yaml.MappingNode) or not root.value:
        return None
    keys = [str(k.value) for k, _ in root.value if isinstance(k, yaml.ScalarNode)]
    return tuple(keys) if len(keys) == len(root.value) and all(_KEY.match(k) for k in keys) else None


def verl_sft_entries() -> list[SftEntry]:
    """verl's SFT trainer entry points (its card's read.sft entries), each with its config's top-level sections."""
    sft = read_section("verl").sft
    assert sft is not None, "verl's card has a read.sft section"
    return sft.entries


def verl_sft_sections() -> list[str]:
    """Every top-level key of verl's SFT trainer configs, its entry points' in turn (read.sft entries' sections)."""
    return list(dict.fromkeys(k for e in verl_sft_entries() for k in e.sections))


def yaml_kind(text: str) -> str | None:
    """'automodel', 'megatron-test' (Megatron-LM's functional-test MODEL_ARGS), 'verl' / 'skyrl' (an RL trainer's Hydra
    config: hydra.HYDRA_YAML's sections), 'verl-sft' or 'megatron-bridge' (an override YAML of ConfigContainer
    sections, bridge_yaml.is_bridge_yaml) for the
    YAML config the text is, by its top-level keys (an AutoModel section first; verl's SFT config when every key is one
    of an SFT entry point's sections); a file that does not parse, by its lines, so its
    reader names the bad one; None: neither."""
    keys = yaml_top_keys(text)
    if keys is None:
        if re.search(rf"^({'|'.join(AUTOMODEL_MARKERS)}):[ \t]*(#.*)?$", text, re.M):
            return "automodel"
        return "verl-sft" if _BROKEN_VERL.search(text) and re.search(r"^model:[ \t]*(#.*)?$", text, re.M) else None
    if set(AUTOMODEL_MARKERS) & set(keys):
        return "automodel"
    if MLM_TEST in keys:  # Megatron-LM's functional-test model_config.yaml (its flags as a mapping)
        return "megatron-test"
    for framework, marks in HYDRA_YAML.items():  # an RL trainer's Hydra config (verl's actor_rollout_ref)
        if set(marks) <= set(keys):
            return framework
    if set(keys) - {"defaults"} and any(set(keys) <= set(e.sections) for e in verl_sft_entries()):
        return "verl-sft"
    if is_bridge_yaml(keys):  # ConfigContainer's sections (model:, train:, ddp: ...), after every other config's marks
        return "megatron-bridge"
    return None


def unknown_yaml(text: str, path: str) -> MeshplanError:
    """The error for a YAML mapping that is neither config: its top-level keys beside what each config holds."""
    keys = yaml_top_keys(text) or ()
    verl = verl_sft_sections()
    other = [k for k in keys if k not in verl]
    return MeshplanError(
        f"{path}: meshplan cannot tell which framework this YAML file is for: its top-level keys "
        f"({', '.join(keys)}) match none of the YAML configs it reads: {', '.join(_MARKED)}, or verl's SFT trainer "
        f"config (only {', '.join(verl)}"
        + (f"; not {', '.join(other)}" if other and len(other) < len(keys) else "") + ").",
        fix="If it is one of theirs, pass --framework nemo-automodel, verl, skyrl, megatron-core or megatron-bridge "
            "(the tools' framework argument). " + YAML_FIX)


def detect_format(text: str) -> str:
    """json when the text is a JSON object, yaml when it is a YAML mapping of named sections (an AutoModel recipe,
    verl's SFT trainer config, or one meshplan then says it cannot tell), toml when it parses as TOML with a
    [section], else shell."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return "json"
    if yaml_kind(text) is not None or yaml_top_keys(text) is not None:
        return "yaml"
    if re.search(r"^\s*\[[\w.\"]+\]\s*(#.*)?$", text, re.M):
        try:
            tomllib.loads(text)
            return "toml"
        except tomllib.TOMLDecodeError:
            if not re.search(r"^\s*(export |python|torchrun|uv |bash|srun|deepspeed)", text, re.M):
                return "toml"  # a TOML file with an error: read it as TOML, which names the line
    return "shell"


_SHELL = re.compile(
    r"^[ \t]*(#!|(export|set|source|cd|exec|if|for|while|function|echo|printf|mkdir|module|conda|pip)\b|"
    r"[A-Za-z_]\w*=\S|--?[A-Za-z][\w.-]*([ =]|$)|(python3?|torchrun|deepspeed|bash|sh|srun|sbatch|mpirun|accelerate|"
    r"uv|nohup)\b|.*\\$|.*\$\{?[A-Za-z_])", re.M)
"""A line only a shell script or a command line has: a shebang, a shell builtin, keyword or common command, a
variable set or read, a launcher meshplan's shell readers look for, a command-line flag (a launch line's arguments),
or a line continued with a backslash. Text without one shows no shell script."""


def shows_shell(text: str) -> bool:
    """Whether the text shows a shell script (a _SHELL line): detect_format's last resort is shell, but a refusal calls
    it one only where the text shows it."""
    return _SHELL.search(text) is not None


def unplaced_text(text: str, path: str, readable: str) -> MeshplanError:
    """The error for text detect_format could place in no format and that shows no shell script either (plain words,
    a YAML list or broken YAML): what meshplan tried, each format it reads and why this text is none of them, with
    the readers it has; never a format the text does not show (it was 'this shell file')."""
    yaml_why = "not a mapping of named sections"
    try:
        yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        yaml_why = f"it does not parse as YAML{where}: {getattr(exc, 'problem', None) or 'a syntax error'}"
    return MeshplanError(
        f"{path}: meshplan cannot tell what this text is. It tried each format it reads: a JSON object (the text does "
        f"not open with '{{'), a YAML mapping of a config's sections ({yaml_why}), TOML with a [section] (none), a "
        "Python recipe or config module (none), and a launch script (no shell line: no launcher such as torchrun, "
        "python or deepspeed, no command-line flag, no export or VAR=value).",
        fix="Pass the launch script that runs the training or the framework's config file itself; where the text is "
            "one of these, name its framework and format (CLI: --framework, and --format on import; MCP: framework "
            f"and config_format). meshplan reads: {readable}.")


PYTHON_READ = ("a Megatron-Bridge recipe module (a function returning a ConfigContainer), a Python script that sets "
               "cfg.* on a Bridge recipe, or a torchtitan config_registry.py function")
"""The Python files meshplan reads (bridge_recipe, the Bridge script reader, pyconfig): what an unplaced one is told."""


def python_module(text: str, path: str) -> ast.Module | None:
    """The text as a Python module when it is one (a .py path, or it parses and imports or defines something); a
    shell script rarely parses as Python, and one that does defines nothing."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    return tree if path.endswith(".py") or any(isinstance(n, kinds) for n in tree.body) else None


def unplaced_python(tree: ast.Module, path: str, readable: str, framework: str | None = None) -> MeshplanError:
    """The error for a Python file no reader takes: said as Python (it was 'this shell file'), with what meshplan reads
    in Python; a module that only imports from others (Megatron-Bridge's alias modules, recipes/llama/llama3.py
    re-exporting the recipes) with the modules it imports, the files to pass instead. `framework`: the one the user
    named, whose launch-line reader found no launch in it."""
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]  # docstrings
    sources = list(dict.fromkeys("." * n.level + (n.module or "") for n in imports if isinstance(n, ast.ImportFrom)))
    sources += [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    only_imports = bool(imports) and all(isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign)) for n in body)
    where = (f": it only imports from other modules ({', '.join(sources)}), so the recipe is in one of those"
             if only_imports else "")
    what = (f"meshplan reads no {framework} settings from this Python file" if framework else
            "meshplan cannot tell which framework this Python file is for")
    return MeshplanError(f"{path}: {what}{where}.",
                         fix=("Pass the module that defines the recipe. " if only_imports else "")
                         + f"meshplan reads in Python {PYTHON_READ}; pass --framework for another file it reads: "
                         + f"{readable}.")
