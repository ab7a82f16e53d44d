"""Launch scripts read into a request: Megatron-LM argument lists (and Megatron-DeepSpeed's, with the ds_config the
script writes), Megatron-Bridge's run_recipe.py overrides, torchtitan 0.3 command lines, verl and SkyRL Hydra
overrides. The script is read by shell.py, never run; the keys' meanings come from the framework cards (keys.py).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError

from meshplan.adapters.architecture import core_restated
from meshplan.adapters.common import DROPOUT_ON, PRESET_CALL, absent_defaults, bridge_presets
from meshplan.adapters.read.bridge_recipe import read_bridge_recipe, sets_comm_overlap, state_name_facts
from meshplan.adapters.read.keys import Reading, apply, as_bool, key_table, lookup, read_section
from meshplan.adapters.read.model_match import (
    Stated,
    flags_model,
    layout_settings,
    match_stated,
    recipe_overrides,
    restated_architecture,
    stated_fields,
)
from meshplan.adapters.read.settings import Setting, flag_settings, json_settings
from meshplan.adapters.read.shell import Command, Script, Word, logical_lines, read_script
from meshplan.arithmetic.mesh import ep_has_own_ranks, replica_size
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import adapter_section
from meshplan.knowledge.allocator_card import ALLOC_ENV, ALLOC_OPTIONS, AllocatorSetting
from meshplan.knowledge.cards import framework_card, rl_card
from meshplan.knowledge.read_card import SHAPE_FIELDS, ReadSection, TypedKey


class Launch(NamedTuple):
    """A launch script's training command: the script, the command, its launcher word's index, the reading begun
    (the script's unresolved words in it) and the flags on both sides of the launcher (torchrun's and the trainer's)."""

    script: Script
    command: Command
    k: int
    reading: Reading
    settings: list[Setting]


def read_launch(text: str, path: str, framework: str, variant: str | None = None, marker: str | None = None
                ) -> Launch:
    """The training command of a `framework` launch script (its card's read.launcher, or with `marker` the Python
    command passing that flag: a Bridge YAML script's --config-file), read once for every reader."""
    script = read_script(text, path)
    command, k, custom = marked_command(script, marker) if marker else launch_command(script, framework)
    reading = Reading(framework, path, variant=variant)
    reading.unresolved += script.unresolved
    reading.assumed += script.loops + ([command.call] if command.call else [])
    if custom:
        launchers = read_section(framework).launcher
        reading.notes.append(
            f"{path}:{command.line} {command.words[k].text}: not one of {framework_card(framework).display_name}'s "
            f"entry points ({', '.join(launchers)}); its Hydra overrides are read as theirs, taking it for a custom "
            "entry point over the same config (as SkyRL's examples write them: SkyRLTrainConfig.from_cli_overrides, "
            "then main_base's BasePPOExp); what the entry point itself changes (its environment, an async or "
            "distillation loop, another trainer) is not read")
    reading.allocator_env = _allocator_env(script, command.words[:k])
    _srun_ranks(reading, script, command, k)
    reading.launch_line = f"{path}:{command.line} {command.words[k].text}"
    return Launch(script, command, k, reading, flag_settings(_launcher_words(command.words[:k]))
                  + flag_settings(command.words[k + 1:]))


STARTERS = re.compile(r"^(python[\d.]*|torchrun|deepspeed|accelerate)$")
"""The program that starts the training's processes: the words before it run that program (`uv run --no-sync`,
`srun --mpi=pmix`, `env X=1`), whose options are none of the job's ('--no-sync = python' was read as a setting)."""


def _launcher_words(before: list[Word]) -> list[Word]:
    """The launcher-side words from the program that starts the processes (python, torchrun, deepspeed, accelerate)
    on; all of them where none is named."""
    start = next((i for i, w in enumerate(before) if STARTERS.match(w.text.rsplit("/", 1)[-1])), 0)
    return before[start:]


RANK_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed", "accelerate",
                  "mpirun")
"""Words that start the ranks of a node themselves: with one, srun's task count is not the GPU count."""


def _srun_ranks(reading: Reading, script: Script, command: Command, k: int) -> None:
    """A training command srun starts once per task, with no launcher of its own (`srun python run_recipe.py`, or
    `srun ... bash -c "$CMD"`): every task is a rank, so the GPUs per node are srun's --ntasks-per-node, else
    #SBATCH --ntasks-per-node (SLURM_NTASKS_PER_NODE), and the nodes srun's -N / --nodes, else #SBATCH --nodes; read
    as the launch's own nodes and GPUs per node where its flags give none (Megatron-Bridge's slurm examples)."""
    if rl_card(reading.framework) is not None:
        return  # verl's and SkyRL's entry points start their workers through Ray (or torchrun): srun starts a driver
    runner = [*command.runner, *command.words[:k]]
    texts = [w.text for w in runner]
    if not texts or texts[0].rsplit("/", 1)[-1] != "srun" or any(
            t.rsplit("/", 1)[-1] in RANK_LAUNCHERS for t in texts):
        return
    srun = {s.key: s for s in flag_settings(runner)}
    for name, flags, env in (("gpus_per_node", ("--ntasks-per-node",), "SLURM_NTASKS_PER_NODE"),
                             ("nodes", ("--nodes", "-N"), "SLURM_NNODES")):
        given = next((srun[f] for f in flags if f in srun and srun[f].value is not True), None)
        var = script.env.get(env)
        if given is not None:
            reading.extra[name] = (given.value, replace(given, key=f"srun {given.key}"))
        elif var is not None and name == "gpus_per_node":
            reading.extra[name] = (var.value, Setting("#SBATCH --ntasks-per-node (srun starts a rank per task)",
                                                      var.value, var.line))
        elif var is not None:
            reading.extra[name] = (var.value, Setting("#SBATCH --nodes", var.value, var.line))


def _allocator_env(script: Script, before: list[Word]) -> list[Setting]:
    """PyTorch's allocator settings the training command starts with: `env NAME=value` words before the launcher
    over the script's own assignments (exported, or as the command's prefix)."""
    found = {name: Setting(name, var.value, var.line) for name in ALLOC_ENV if (var := script.env.get(name))}
    for word in before:
        name, eq, value = word.text.partition("=")
        if eq and name in ALLOC_ENV:
            found[name] = Setting(name, value, word.line)
    return [found[name] for name in ALLOC_ENV if name in found]


def read_allocator(reading: Reading) -> None:
    """expandable_segments from the launch's PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF (every shell reader): it
    sets the job's allocator unless the framework's own code sets it at run time over the environment (its card's
    allocator over_env, verl's RL workers), which is said; the allocator options meshplan does not model are named;
    a value PyTorch refuses is an error naming what it takes."""
    values: dict[bool, Setting] = {}
    for s in reading.allocator_env:
        on = _expandable(reading, s)
        if on is not None:
            values.setdefault(on, s)
    if len(values) > 1:
        raise MeshplanError(f"{reading.path}: {' and '.join(_where(reading, s) for s in values.values())} set "
                            "expandable_segments both ways; which one PyTorch reads depends on its release.",
                            fix="Set one of PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF.")
    card = framework_card(reading.framework)
    facts = card.allocator_for(reading.request.get("job") == "rl")
    if not values:
        _own_launch_default(reading, facts)
        return
    (on, s), = values.items()
    if facts is not None and facts.over_env:
        reading.notes.append(f"{_where(reading, s)}: not read, {card.display_name} sets it itself: {facts.over_env} "
                             f"(cards/frameworks/{reading.framework}.yaml allocator)")
        return
    reading.state("expandable_segments", on, _where(reading, s))


def _own_launch_default(reading: Reading, facts: AllocatorSetting | None) -> None:
    """A launch command of the user's own that starts the trainer itself, where only the framework's launch script
    (its card's allocator launch_script: torchtitan's run_train.sh) sets expandable segments, and whose environment
    sets none: PyTorch's default allocator, stated with why; the card's default holds for a job file alone (TOML),
    which run_train.sh launches, and fill_defaults says so."""
    if facts is None or not facts.launch_script or reading.launch_line is None or not facts.expandable_segments:
        return
    reading.state("expandable_segments", False,
                  f"{reading.launch_line}: the script starts the trainer itself, not through {facts.launch_script} "
                  f"({facts.how}), and sets no {' or '.join(ALLOC_ENV)}: PyTorch's default allocator, without "
                  "expandable segments")


def _where(reading: Reading, s: Setting) -> str:
    return f"{s.file or reading.path}:{s.line} {s.key}={s.value}"


def _expandable(reading: Reading, s: Setting) -> bool | None:
    """The expandable_segments one allocator setting states (None: it leaves it at PyTorch's default); its other
    options named as not modelled. PyTorch's own parser refuses an entry without `:` and any value but True/False."""
    text = str(s.value).strip().strip("'\"")
    on = None
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, colon, value = entry.partition(":")
        if not colon or not value:
            raise MeshplanError(f"{_where(reading, s)}: {entry!r} is not an allocator option (PyTorch reads "
                                "comma-separated option:value pairs).",
                                fix="Write it as expandable_segments:True (or False), with any other option as "
                                    "option:value, e.g. max_split_size_mb:512.")
        if name == "expandable_segments":
            if value not in ("True", "False"):
                raise MeshplanError(f"{_where(reading, s)}: expandable_segments:{value} is not a value PyTorch "
                                    "takes ('Expected a single True/False argument for expandable_segments').",
                                    fix="Write expandable_segments:True or expandable_segments:False.")
            on = value == "True"
        elif name in ALLOC_OPTIONS:
            reading.notes.append(f"{_where(reading, s)}: {entry} is not modelled ({ALLOC_OPTIONS[name]}): the "
                                 "estimate takes PyTorch's default for it")
        else:
            reading.notes.append(f"{_where(reading, s)}: {name} is not an allocator option meshplan knows "
                                 f"({', '.join(['expandable_segments', *ALLOC_OPTIONS])}); a PyTorch release that "
                                 "does not know it either refuses it ('Unrecognized CachingAllocator option')")
    return on


CUSTOM_ENTRY_LEAST_KEYS = 2
"""Hydra overrides of the framework's own keys a command must pass for its unknown entry point to be read as a custom
one over the framework's config (launch_command)."""


class NoLaunch(MeshplanError):
    """A script in which no command launches the framework's trainer: import_config says a Python file is one."""


def launch_command(script: Script, framework: str) -> tuple[Command, int, bool]:
    """The command that starts training (its launcher word's index, and whether it is a custom entry point): the last
    one naming a launcher of the framework's card (read.launcher), else the last `python -m MODULE` / `python FILE.py`
    command passing at least CUSTOM_ENTRY_LEAST_KEYS Hydra overrides the framework's card knows (a custom entry point
    over its config, as most of SkyRL's examples launch: examples.train.multiply.main_multiply); refused before, with
    'not a SkyRL launch script', though its keys had told the format."""
    read = read_section(framework)
    launchers = [*read.launcher, *read.cli]
    commands = [*script.commands, *_shell_c_commands(script)]
    found = None
    for command in commands:
        for k, word in enumerate(command.words):
            if any(word.text == name or word.text.endswith("/" + name) for name in launchers):
                found = (command, k, False)
    if found is None:
        table = key_table(framework)
        for command in commands:
            k = _entry_point(command)
            if k is not None and sum(bool(lookup(table, s.key)) for s in flag_settings(command.words[k + 1:])
                                     if not s.key.startswith("-")) >= CUSTOM_ENTRY_LEAST_KEYS:
                found = (command, k, True)
    if found is None and (called := called_scripts(script)):
        raise wrapper_script(script.path, called, f"no command launches {' or '.join(launchers)}: this file")
    hidden = next(((line, name) for line, text in script.unread for name in launchers
                   if re.search(rf"(?:^|[\s/]){re.escape(name)}(?:\s|$)", text)), None)
    if found is None and hidden is not None:
        why = [note for note in script.unresolved if "block is not run" in note or "neither branch read" in note]
        raise NoLaunch(f"{script.path}:{hidden[0]}: the command launching {hidden[1]} is inside a block meshplan "
                       f"cannot read statically ({'; '.join(why[:3]) or 'a loop, a condition or a function'}): a "
                       "loop over words the script does not state (a command's output, a glob), a condition on a "
                       "value known only at run time, or a function never called.",
                       fix="Pass the config file the run reads (with its overrides as flags beside it), or a script "
                           "whose launch line runs at its top level or in a loop over stated words.")
    if found is None:
        raise NoLaunch(f"{script.path}: no command launches {' or '.join(launchers)}, so this is not a "
                            f"{framework_card(framework).display_name} launch script meshplan can read.",
                            fix="Pass the framework (--framework NAME; MCP: framework) if it is another "
                                "framework's, or the script that runs the training (a loop or function around the "
                                "launch line is not read).")
    return found


def named_file(reading: Reading, word: Word, flag: str, suffixes: tuple[str, ...], whose: str) -> tuple[str, str]:
    """The path and text of the config file a launch command names (AutoModel's --config recipe, KempnerForge's
    train.py TOML): an absolute path as is, a relative one from the folder the script runs in, which the file does not
    say: taken as the nearest folder above the script that holds the path (the frameworks' scripts run from the
    repository root: AutoModel's tests/functional_tests/*/L2_*.sh naming examples/..., KempnerForge's scripts/slurm/
    naming configs/train/...), and said as assumed."""
    where = f"{reading.path}:{word.line} " + (" ".join(x for x in (flag, word.text) if x) or "(an empty word)")
    if "$" in word.text or not word.text.endswith(suffixes):
        raise MeshplanError(f"{where}: the file the command runs is not a {' or '.join(suffixes)} path meshplan can "
                            "resolve from the script (a variable set at launch, or no path).",
                            fix="Pass the config file the script runs (meshplan import FILE).")
    given = Path(word.text)
    here = Path(reading.path).resolve()
    folders = [] if reading.path.startswith("<") else [here.parent, *here.parents]
    if given.is_absolute():  # a remote caller's: refused outside the folders it may read (core/server_files.py)
        named = server_files.server_path(given, where)
        found = named if named.is_file() else None
    else:  # the folders above the script, each candidate as far as the caller may read
        found = next((folder / given for folder in folders if server_files.is_file(folder / given)), None)
    if found is None:
        raise MeshplanError(f"{where}: the file is not found "
                            + ("(a pasted script has no folder)" if not folders else
                               f"in any folder above {Path(reading.path).parent}") + f", and {whose} run reads its "
                            "settings from it.",
                            fix="Pass the script from inside its repository, or the config file itself.")
    try:
        text = found.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MeshplanError(f"{where}: {found} cannot be read ({exc}).", fix="Pass the config file itself.") from None
    if not given.is_absolute():
        reading.assumed.append(f"{where}: read from {found}: the path is relative to the folder the script runs in, "
                               f"taken as {found.parents[len(given.parts) - 1]} (the nearest folder above the script "
                               "holding it; the framework's scripts run from the repository root)")
    return str(found), text


SCRIPT_RUNNERS = ("bash", "sh", "zsh")  # what runs another script in a child shell (`source` reads one into this)


def called_scripts(script: Script) -> list[tuple[str, int]]:
    """The shell scripts a script runs, with their lines: `bash x.sh ...` (or sh, zsh) or `./x.sh ...` as a command
    (VAR=value prefixes already read into the environment). A wrapper such as SkyRL's run_gspo_gsm8k.sh calls
    run_gsm8k.sh with overrides and launches no trainer itself: that called script is what holds the launch."""
    found = []
    for command in script.commands:
        words = [w.text for w in command.words]
        k = 1 if words and words[0].rsplit("/", 1)[-1] in SCRIPT_RUNNERS else 0
        if len(words) > k and words[k].endswith(".sh") and (k or "/" in words[0]):
            found.append((words[k], command.line))
    return list(dict.fromkeys(found))


WRAPPER_UNPLACED = "meshplan cannot tell which framework this shell file is for: it launches no trainer itself but"


def wrapper_script(path: str, called: list[tuple[str, int]], what: str = WRAPPER_UNPLACED) -> MeshplanError:
    """The error for a shell file that launches no trainer but calls other scripts (`what`: why it is refused, the
    framework's launchers where one was named): it names them, the file to pass (meshplan reads one file; the
    wrapper's overrides go on that script's command line)."""
    names = ", ".join(f"{name} (line {line})" for name, line in called)
    one = called[0][0] if len(called) == 1 else "the called script that launches the training"
    return MeshplanError(f"{path}: {what} calls {names}, which holds the launch.",
                         fix=f"Pass {one}, with this file's overrides added to its command line (meshplan reads one "
                             "file).")


def marked_command(script: Script, marker: str) -> tuple[Command, int, bool]:
    """The last command that runs a Python entry point and passes `marker` (`--config-file conf/x.yaml`), with its
    entry point's index; NoLaunch where none does."""
    found = None
    for command in [*script.commands, *_shell_c_commands(script)]:
        k = _entry_point(command)
        if k is not None and any(w.text.split("=", 1)[0] == marker for w in command.words[k + 1:]):
            found = (command, k, False)
    if found is None:
        raise NoLaunch(f"{script.path}: no Python command passes {marker}.",
                       fix="Pass the YAML file itself, or the script whose launch line passes it.")
    return found


def _entry_point(command: Command) -> int | None:
    """The index of the word a Python command runs: MODULE after -m, or the first *.py word."""
    texts = [w.text for w in command.words]
    for k, text in enumerate(texts):
        if text == "-m" and k + 1 < len(texts):
            return k + 1
        if text.endswith(".py"):
            return k
    return None


def _shell_c_commands(script: Script) -> list[Command]:
    """The command strings run through `bash -c "..."` / `sh -c "..."` or with other options before the c (`bash -lc`,
    as Megatron-Bridge's slurm examples run `srun ... bash -lc "...; $CMD"`; srun ... bash -c "$LAUNCHER $CMD", as
    BigScience's Megatron-DeepSpeed slurm scripts launch), each of its lines split into words as that shell would."""
    out = []
    for command in script.commands:
        texts = [w.text for w in command.words]
        for k in range(1, len(texts) - 1):
            if re.fullmatch(r"-[a-z]*c", texts[k]) and texts[k - 1].rsplit("/", 1)[-1] in SCRIPT_RUNNERS:
                string = command.words[k + 1]
                for logical in logical_lines(string.text):
                    try:
                        parts = shlex.split(logical.text, comments=True)
                    except ValueError:  # an unclosed quote left by what the outer script could not expand (a
                        parts = logical.text.split()  # $(... <<'EOF' heredoc): its words as written
                    if parts:
                        out.append(Command([Word(p, string.line, string.var, string.var_line) for p in parts],
                                           command.line, command.words[:k - 1]))
    return out


def world(reading: Reading) -> None:
    """num_gpus = nodes x GPUs per node, where the file gives them (one node when only GPUs per node)."""
    nodes, per_node = reading.value("nodes"), reading.request.get("gpus_per_node", reading.value("gpus_per_node"))
    if per_node is None:
        reading.leave(("num_gpus",), "num_gpus: the file does not say how many GPUs (pass --num-gpus)")
        return
    unread = [(name, value) for name, value in (("nodes", nodes), ("gpus_per_node", per_node))
              if name in reading.unread or (value is not None and _count(value) is None)]
    if unread:  # `--nnodes $NODES` set at launch, torchrun's elastic `1:4`, `--nproc_per_node gpu`: not one node
        said = ", ".join(f"{name} {'has no value' if value in (None, True) else repr(value) + ' is not a count'}"
                         for name, value in unread)
        reading.leave(("num_gpus",), f"num_gpus: the file's {said} (pass --num-gpus)")
        return
    count = _count(nodes or 1) * _count(per_node)
    where = [reading.extra[k][1].where(reading.path) for k in ("nodes",) if k in reading.extra]
    where.append(reading.sources.get("gpus_per_node") or reading.extra["gpus_per_node"][1].where(reading.path))
    reading.state("num_gpus", count, " x ".join(where))
    if "gpus_per_node" not in reading.request:
        reading.state("gpus_per_node", per_node, reading.extra["gpus_per_node"][1])


USAGE_RANKS = re.compile(r"--(?:nproc[-_]per[-_]node|ntasks-per-node)[= ]\s*(\d+)\b")
USAGE_NODES = re.compile(r"(?:--nnodes|--nodes)[= ]\s*(\d+)\b|\s-N\s*(\d+)\b")


def usage_comment_world(reading: Reading, text: str) -> None:
    """GPUs per node (and nodes) from the launch line a config file's own comments give for it, where its settings
    say none: `# torchrun --nproc_per_node=4 scripts/train.py configs/train/7b.toml`, `#   srun --nodes=4
    --ntasks-per-node=4 ... 7b_16gpu_fp8.toml` (a rank per task), `# automodel <recipe>.yaml --nproc-per-node 8`.
    Only a comment's command that names this file counts, and only where every such command agrees on the ranks
    per node and gives them (`python train.py FILE` or `sbatch --nodes=4 job.sh FILE` beside it leaves the count
    unread: the launcher's or another script's), and none where a comment says to adjust the count (AutoModel's
    shared "Adjust --nproc-per-node to the number of GPUs available on your machine": a placeholder, which its
    gpt_oss_20b_single_gpu_peft.yaml gives as 8). Said as assumed: a comment is the file's word, not its setting."""
    if "gpus_per_node" in reading.extra or "gpus_per_node" in reading.request or "num_gpus" in reading.request:
        return
    name = reading.path.replace("\\", "/").rsplit("/", 1)[-1]
    lines = text.splitlines()
    commands: list[tuple[int, str]] = []
    k = 0
    while k < len(lines):
        start, line = k, lines[k].strip()
        if not line.startswith("#"):
            k += 1
            continue
        words = line.lstrip("#").strip()
        while words.endswith("\\") and k + 1 < len(lines) and lines[k + 1].strip().startswith("#"):
            k += 1
            words = words[:-1] + " " + lines[k].strip().lstrip("#").strip()
        k += 1
        if re.search(rf"(?:^|[\s/]){re.escape(name)}(?:\s|$)", words):
            commands.append((start + 1, words))
    if not commands:
        return
    placeholder = next((k + 1 for k, line in enumerate(lines) if line.strip().startswith("#") and re.search(
        r"\badjust\b.*(?:nproc[-_]per[-_]node|ntasks-per-node|--nodes|--nnodes)", line, re.I)), None)
    if placeholder is not None:  # AutoModel's recipes: "Adjust --nproc-per-node to the number of GPUs available"
        reading.notes.append(f"num_gpus: the file's usage comment (line {commands[0][0]}) is a placeholder its line "
                             f"{placeholder} says to adjust, so it is not read")
        return
    found = set()
    for _line, words in commands:
        ranks = USAGE_RANKS.search(words)
        nodes = USAGE_NODES.search(words)
        found.add((int(ranks.group(1)) if ranks else None,
                   int(nodes.group(1) or nodes.group(2)) if nodes else None))
    if len(found) != 1 or next(iter(found))[0] is None:
        said = "; ".join(f"line {line}: {words[:80]}" for line, words in commands)
        reading.notes.append(f"num_gpus: the file's comments launch it more than one way or without a per-node "
                             f"count ({said}), so none is read")
        return
    ranks, nodes = next(iter(found))
    line, words = commands[0]
    count = ranks * (nodes or reading.whole("nodes") or 1)
    degrees = {name: int(reading.request.get(name, 1)) for name in ("tp", "pp", "cp", "ep")}
    law = framework_card(reading.framework).world_size_law
    if count % replica_size(law, degrees["tp"], degrees["pp"], degrees["cp"], degrees["ep"]) or (
            not ep_has_own_ranks(law) and (count // degrees["pp"]) % degrees["ep"]):
        said = " x ".join(f"{name} {value}" for name, value in degrees.items())
        reading.notes.append(f"num_gpus: the file's usage comment (line {line}: {words[:120]}) launches {count} GPUs, "
                             f"which its own layout ({said}) does not tile, so it is not read")
        return
    reading.extra["gpus_per_node"] = (ranks, Setting("usage comment", ranks, line,
                                                     written=f"comment's ranks per node {ranks}"))
    if nodes is not None and "nodes" not in reading.extra:
        reading.extra["nodes"] = (nodes, Setting("usage comment", nodes, line, written=f"comment's nodes {nodes}"))
    reading.assumed.append(f"num_gpus: read from the file's own usage comment (line {line}: {words[:100]}), not "
                           "from a setting; pass --num-gpus for the count it runs on")


def _count(value: object) -> int | None:
    """A node or GPU count as a launcher writes it (8, "8", torchrun's "2:2"); None for what is not one (a flag
    alone, an elastic range "1:4", "gpu", "2.5")."""
    if value is True or value is False:
        return None
    text = str(value).strip().strip("'\"")
    low, _, high = text.partition(":")
    return int(low) if low.isdigit() and (not high or high == low) else None


def _flag_shape(reading: Reading, settings: list[Setting], section: ReadSection, words: list[Word]) -> None:
    """The model from its flags (model_match.py); a card's model_shape entry `a|b` takes the first of those flags
    given (Megatron-DeepSpeed's --pad-vocab-size-to beside --vocab-size)."""
    flags = {s.key.replace("_", "-"): s for s in settings}
    values = {k: s.value for k, s in flags.items()}
    shape = dict(zip(SHAPE_FIELDS, (next((values[a] for a in k.split("|") if a in values), None)
                                    for k in section.model_shape), strict=True))
    said = _kv_heads(reading, shape, flags, section)
    stated = stated_fields(reading, section, shape, flags, words)
    if stated is not None and said and "num_kv_heads" in stated:
        stated["num_kv_heads"] = Stated("num_kv_heads", stated["num_kv_heads"].value,
                                        f"{said}: {stated['num_kv_heads'].value}")
    if match_stated(stated, reading, (values.get("--rotary-base"), "--use-rope-scaling" in values)):
        flags_model(reading, flags)


def _kv_heads(reading: Reading, shape: dict[str, Any], flags: dict[str, Setting], section: ReadSection
              ) -> str | None:
    """The KV heads Megatron-LM builds: --num-query-groups only with --group-query-attention (argument_utils.py
    passes it only then), whose argparse default is 1 group; without GQA one KV head per query head. Returns how the
    report says it where that is not the flag's own value."""
    gqa, groups = "--group-query-attention" in flags, "--num-query-groups" in section.model_shape
    if groups and not gqa and "--num-query-groups" in flags:
        shape["num_kv_heads"] = shape["num_attention_heads"]
        reading.notes.append(f"{flags['--num-query-groups'].where(reading.path)}: ignored without "
                             "--group-query-attention (Megatron-LM's argument_utils.py passes num_query_groups only "
                             "with it): one KV head per query head")
        return f"--num-query-groups {flags['--num-query-groups'].value} without --group-query-attention"
    if groups and gqa and shape["num_kv_heads"] is None:
        shape["num_kv_heads"] = 1  # TransformerConfig.num_query_groups' argparse default
        return "--group-query-attention without --num-query-groups"
    if not gqa and shape["num_kv_heads"] is None and shape["num_attention_heads"] is not None:
        shape["num_kv_heads"] = shape["num_attention_heads"]
        return f"{section.model_shape[SHAPE_FIELDS.index('num_kv_heads')]} not given"
    return None


# Megatron-LM's store_false switches of the fused bias + activation: core_transformer_config_from_args (core_v0.16.0
# arguments.py; 0.19's argument_utils.py) takes bias_swiglu_fusion for a --swiglu model and bias_gelu_fusion for any
# other, so the flag of the other kind of activation changes nothing: flag -> whether it is the --swiglu one
ACTIVATION_FUSION_OFF_FLAGS = {"--no-bias-swiglu-fusion": True, "--no-bias-gelu-fusion": False}


def other_activations_switch(reading: Reading, flags: dict[str, Setting]) -> None:
    """Drops a bias_activation_fusion read off from the flag of the other kind of activation than the script's
    (--no-bias-gelu-fusion beside --swiglu, --no-bias-swiglu-fusion without it), with a note: Megatron-LM ignores
    it."""
    stated = [key for key in ACTIVATION_FUSION_OFF_FLAGS if key in flags]
    if not stated or reading.request.get("bias_activation_fusion") is not False:
        return
    swiglu = "--swiglu" in flags
    if any(ACTIVATION_FUSION_OFF_FLAGS[key] == swiglu for key in stated):
        return
    reading.request.pop("bias_activation_fusion")
    reading.sources.pop("bias_activation_fusion", None)
    reading.notes.append(f"{flags[stated[0]].where(reading.path)}: no effect, Megatron-LM reads "
                         f"{'--no-bias-swiglu-fusion' if swiglu else '--no-bias-gelu-fusion'} for this model's "
                         "activation (arguments.py core_transformer_config_from_args)")


def read_megatron(text: str, path: str, framework: str = "megatron-core") -> Reading:
    """A Megatron-LM (or Megatron-DeepSpeed) launch script: torchrun's flags and pretrain_gpt.py's."""
    read = read_section(framework)
    script, command, _, reading, settings = read_launch(
        text, path, framework, variant=None if framework != "deepspeed" else "megatron-deepspeed")
    table = key_table(framework, variant=reading.variant)
    special = frozenset({"vpp", "zero_0", "zero_1", "zero_2", "zero_3", "uneven_pp", "fp8", "micro_batch_size",
                         "global_batch_size"} if framework == "deepspeed" else {"vpp", "zero_0", "zero_1", "zero_2",
                                                                                 "zero_3", "fp8", "uneven_pp"})
    shape_flags = {a for k in read.model_shape for a in k.split("|")} | set(read.model_flags)
    restated = framework == "megatron-core"  # the architecture flags its render writes: the model's (CORE_FLAGS)
    left = apply(reading, [s for s in settings if s.key.replace("_", "-") not in shape_flags
                           and not (restated and core_restated(s.key))], table, special)
    flags = {s.key.replace("_", "-"): s for s in settings}
    other_activations_switch(reading, flags)
    for s, m in left:
        if m.target == "uneven_pp":
            reading.state("first_stage_layers", s.value, s)
    if "precision" in reading.extra or any(m.target == "fp8" for _, m in left):
        s = reading.extra.get("precision", (None, flags.get("--fp8-format")))[1]
        reading.state("precision", "fp8", s)
    _megatron_vpp(reading, flags)
    if framework == "deepspeed":
        _deepspeed_script(reading, script, flags)
    else:
        _megatron_zero(reading, flags)
        for name, value in read.absent.items():
            if name not in reading.request:  # the flag read as absent, named where one sets the field alone
                flag = next((k for k, means in table.items() if any(m.target == name for m in means)), None)
                reading.state(name, value, f"{path} ({f'no {flag}' if flag else 'not given'}: Megatron-LM's "
                                           "default)")
                reading.defaults[name] = value
    _script_defaults(reading, flags)
    _flag_shape(reading, settings, read, command.words)
    if restated:
        restated_architecture(reading, settings, read, core=True)
    world(reading)
    return reading


def _megatron_vpp(reading: Reading, flags: dict[str, Setting]) -> None:
    """vpp as Megatron-LM's validate_args takes it: --num-layers / (pp x --num-layers-per-virtual-pipeline-stage), or
    --num-virtual-stages-per-pipeline-rank itself (the flag that works with uneven first/last stages, and the one
    meshplan renders there: it was left unread, so such a script was read as vpp 1)."""
    per_stage = flags.get("--num-layers-per-virtual-pipeline-stage")
    stages = flags.get("--num-virtual-stages-per-pipeline-rank")
    if per_stage is not None:
        layers, pp = flags.get("--num-layers"), reading.request.get("pp", 1)
        if layers is None:
            reading.unresolved.append(f"{per_stage.where(reading.path)}: vpp needs --num-layers to be read")
        else:
            reading.state("vpp", int(layers.value) // (pp * int(per_stage.value)), per_stage)
    elif stages is not None:
        reading.state("vpp", stages.value, stages)


def _megatron_zero(reading: Reading, flags: dict[str, Setting]) -> None:
    if "--use-megatron-fsdp" in flags:
        strategy = flags.get("--data-parallel-sharding-strategy")
        stage = {"optim_grads": 2, "optim_grads_params": 3, "optim": 1, "no_shard": 0}.get(
            str(strategy.value) if strategy else "optim_grads_params", 3)
        reading.state("zero_stage", stage, strategy or flags["--use-megatron-fsdp"])
    elif "--use-distributed-optimizer" in flags:
        reading.state("zero_stage", 1, flags["--use-distributed-optimizer"])


def _deepspeed_script(reading: Reading, script: Script, flags: dict[str, Setting]) -> None:
    """Megatron-DeepSpeed: the ds_config the script writes (a heredoc) or names, beside the launcher's flags."""
    name = flags.get("--deepspeed-config")
    config = script.files.get(str(name.value)) if name else None
    if config is None and len(script.files) == 1:
        config = next(iter(script.files.values()))
    if config is None:
        reading.unresolved.append("the DeepSpeed config: the script does not write it (pass the JSON file too)")
        return
    text, first = config
    from_json = Reading("deepspeed", reading.path, variant="config")
    read_deepspeed_settings(from_json, [Setting(s.key, s.value, s.line + first - 1)
                                        for s in json_settings(text, reading.path)])
    for field_name, value in from_json.request.items():
        if field_name not in reading.request or field_name == "zero_stage":
            reading.request[field_name] = value
            reading.sources[field_name] = from_json.sources[field_name]
    reading.unresolved += from_json.unresolved
    reading.left_to_request += from_json.left_to_request
    reading.unsupported += from_json.unsupported
    if "recompute" not in reading.request and "--checkpoint-activations" in flags:
        reading.state("recompute", "full", flags["--checkpoint-activations"])


def _script_defaults(reading: Reading, flags: dict[str, Setting]) -> None:
    """What a Megatron-style script runs where it leaves attention and dropout flags out (common.absent_defaults,
    the card's read.absent_by_variant: the launcher's argparse defaults): Megatron-LM's pretrain_gpt.py and
    Megatron-DeepSpeed run dropout on where either dropout flag is missing (0.1 each), whatever the other says, and
    Megatron-DeepSpeed its CoreAttention without a flash switch; meshplan's own defaults (flash, no dropout) would
    describe another run. A script read with no variant is its card's first (Megatron-LM's pretrain_gpt)."""
    section = adapter_section(framework_card(reading.framework))
    variant = reading.variant if reading.variant in section.variants else next(iter(section.variants))
    where = f"cards/frameworks/{reading.framework}.yaml read.absent_by_variant {variant}"
    said = {"dropout": f"a dropout flag left out: the {variant} script's default {DROPOUT_ON}",
            "attention_backend": "no flash switch: Megatron-DeepSpeed's CoreAttention, the scores materialised"}
    for name, value in absent_defaults(reading.framework, variant, flags, reading.request).items():
        if reading.request.get(name) != value:
            reading.state(name, value, f"{reading.path} ({said.get(name, 'not given')}; {where})")
            reading.defaults[name] = value


def _typed_refusal(reading: Reading, s: Setting, typed: TypedKey, words: list[str]) -> MeshplanError:
    forms = {"section": "a JSON object", "section_or_null": "a JSON object or null",
             "bool": f"true or false (or 0 / 1, or one of the strings {', '.join(words)}, any case)",
             "bool_or_null": f"true, false or null (or 0 / 1, or one of the strings {', '.join(words)}, any case)",
             "bool_or_section": "a JSON object (or the deprecated true / false)",
             "choice": f"one of {', '.join(json.dumps(c) for c in typed.choices)}"}[typed.form]
    example = {"bf16": '"bf16": {"enabled": true}', "bfloat16": '"bf16": {"enabled": true}',
               "fp16": '"fp16": {"enabled": true}'}.get(s.key, f'"{s.key.split(".")[-1]}": {forms.split(" (")[0]}')
    return MeshplanError(f"{s.where(reading.path)} = {json.dumps(s.value)}: DeepSpeed takes {forms} there "
                         f"({typed.by}); it refuses this value when deepspeed.initialize loads the file.",
                         fix=f"Write {example}, as DeepSpeed's config takes it.")


def _typed_value(reading: Reading, s: Setting, typed: TypedKey, words: list[str]) -> Any:
    """The value of a key DeepSpeed validates by type, coerced as its pydantic model coerces it ("yes" -> True,
    "2" -> 2); what the model refuses is refused here, naming the key and the forms it takes."""
    section = typed.form in ("section", "section_or_null", "bool_or_section")
    if s.value is None and typed.form in ("section_or_null", "bool_or_null"):
        return None
    if typed.form == "truthy":  # no validation: Python's truth of the JSON value, as DeepSpeed tests it
        if isinstance(s.value, str | list | dict):
            reading.assumed.append(f"{s.where(reading.path)} = {json.dumps(s.value)}: read as {bool(s.value)}, as "
                                   f"DeepSpeed reads it ({typed.by}): a non-empty string is true, \"false\" too; "
                                   "write true or false")
        return bool(s.value)
    try:
        if typed.form == "bool_or_section" and isinstance(s.value, bool):
            return s.value
        if section:  # a leaf where an object belongs (an object's own keys are settings of their own)
            raise ValueError(s.value)
        if typed.form == "choice":
            kind = int if isinstance(typed.choices[0], int) else str
            enum = Enum("Choice", {f"v{c}": c for c in typed.choices}, type=kind)  # type: ignore[misc]
            return TypeAdapter(enum).validate_python(s.value).value
        return TypeAdapter(bool).validate_python(s.value)
    except (ValidationError, ValueError):
        raise _typed_refusal(reading, s, typed, words) from None


def deepspeed_typed(reading: Reading, settings: list[Setting]) -> list[Setting]:
    """A ds_config's settings with the keys DeepSpeed validates by type (the card's read.typed) checked and coerced
    as DeepSpeedConfig does at deepspeed.initialize, "auto" left to the Trainer; the deprecated
    "zero_optimization": true / false read as its stage (1 / 0)."""
    section = read_section("deepspeed")
    out: list[Setting] = []
    for s in settings:
        typed = section.typed.get(s.key)
        if typed is None or str(s.value) == "auto":
            out.append(s)
            continue
        if isinstance(s.value, str) and "$" in s.value:  # a script's variable in a heredoc, set at launch
            reading.unresolved.append(f"{s.where(reading.path)} = {s.value}: set at launch, not read")
            continue
        value = _typed_value(reading, s, typed, section.bool_words)
        if typed.form == "bool_or_section":  # zero/config.py read_zero_config_deprecated
            out.append(replace(s, key=f"{s.key}.stage", value=1 if value else 0, written=s.key))
        elif value is not None:
            out.append(replace(s, value=value))
    return out


def _deepspeed_precision(reading: Reading, settings: list[Setting]) -> None:
    """The precision a ds_config enables: bf16 (or its old name bfloat16) stated with its line; fp16 is reported as
    unsupported (read_deepspeed_settings); neither enabled is said: DeepSpeed then casts nothing, the run's dtype is
    the model code's, which meshplan takes to be bf16."""
    enabled = {s.key.split(".")[0]: s for s in settings if s.key in ("bf16.enabled", "bfloat16.enabled",
                                                                     "fp16.enabled")}
    bf16 = enabled.get("bf16") or enabled.get("bfloat16")
    if any(str(s.value) == "auto" for s in enabled.values()):
        return  # filled by the Trainer from its own --bf16 / --fp16 (reported as unresolved)
    if bf16 is not None and bf16.value is True:
        if "precision" not in reading.request:
            reading.state("precision", "bf16", bf16)
    elif "fp16" not in enabled or enabled["fp16"].value is not True:
        said = "; ".join(f"{s.where(reading.path)} = false" for s in enabled.values()) or "no bf16 or fp16 section"
        reading.assumed.append(
            f"precision = bf16: the file enables neither bf16 nor fp16 ({said}), so DeepSpeed casts nothing "
            "(runtime/engine.py: the model trains in the dtype the model code gives it, fp32 unless it casts); "
            "meshplan estimates bf16 or fp8, no fp32 run")


def read_deepspeed_settings(reading: Reading, settings: list[Setting]) -> Reading:
    """A ds_config's settings: ZeRO stage, batch sizes, offloads, the precision it enables; "auto" values are left to
    the Hugging Face Trainer that fills them (reported, not guessed)."""
    settings = deepspeed_typed(reading, settings)
    _deepspeed_precision(reading, settings)
    auto = [s for s in settings if str(s.value) == "auto"]
    for s in auto:
        reading.unresolved.append(f"{s.where(reading.path)} = \"auto\": filled by the Hugging Face Trainer at launch")
    table = key_table("deepspeed", variant="config")
    special = frozenset({"zero_0", "zero_1", "zero_2", "zero_3", "param_offload", "optimizer_offload"})
    left = apply(reading, [s for s in settings if s not in auto], table, special)
    for s, m in left:
        if m.target.startswith("zero_") and m.target == "zero_0":
            reading.state("zero_stage", s.value, s)
        elif m.target in ("param_offload", "optimizer_offload"):
            device = str(s.value).strip("'\"").lower()
            reading.state(m.target, device in ("cpu", "nvme"), s)
            if device == "nvme":  # ZeRO-Infinity: deepspeed/runtime/zero/offload_config.py OffloadDeviceEnum.nvme
                reading.unsupported.append(
                    f"{s.where(reading.path)} = nvme: ZeRO-Infinity's NVMe offload (the host holds only its "
                    "buffers, and the transfers run at the drive's bandwidth), which meshplan does not model: "
                    f"estimated as {m.target}=true to the CPU, its host memory over and its step time under the "
                    "NVMe run's")
    stage = reading.request.get("zero_stage")
    if "grad_reduce_overlap" not in reading.request and stage in (1, 2):
        # DeepSpeedZeroConfig.overlap_comm None -> stage == 3 (deepspeed/runtime/zero/config.py overlap_comm_valid)
        reading.state("grad_reduce_overlap", False, f"{reading.path} (no zero_optimization.overlap_comm: DeepSpeed's "
                                                    "default below ZeRO-3)")
        reading.defaults["grad_reduce_overlap"] = False
    if reading.value("fp16") is True or as_bool(reading.value("fp16")):
        reading.unsupported.append(f"{reading.extra['fp16'][1].where(reading.path)}: fp16 training (meshplan "
                                   "estimates bf16 or fp8)")
    return reading


def read_bridge_python(text: str, path: str) -> Reading:
    """`cfg.<section>.<field> = value` lines applied to a recipe's ConfigContainer (what `meshplan render
    megatron-bridge` writes), or a training script that calls a recipe imported from megatron.bridge.recipes and sets
    fields of what it returns (`config = llama32_1b_pretrain_config()`, then `config.train.micro_batch_size = 1` in
    its main(): Bridge's tutorials/recipes quickstart), the recipe's name read as a recipe module's is: Python
    literals, never run."""
    reading = Reading("megatron-bridge", path, variant="python")
    settings = [Setting(m.group(1), m.group(2).strip(), text.count("\n", 0, m.start()) + 1)
                for m in re.finditer(r"^cfg\.([\w.]+)\s*=\s*(.+?)\s*(#.*)?$", text, re.M)]
    recipe = None if settings else recipe_call(text)
    if recipe is not None:
        settings = recipe.settings
    if not settings and recipe is None:
        raise MeshplanError(f"{path}: no `cfg.<section>.<field> = value` line and no run_recipe.py command.",
                            fix="Pass the run_recipe.py launch script, or the cfg assignments of your recipe.")
    section = read_section("megatron-bridge")
    bridge_settings(reading, layout_settings(settings, section))
    restated_architecture(reading, settings, section)
    if recipe is None:
        reading.leave(("model", "num_gpus"), "model, num_gpus: cfg assignments apply to a recipe's config (pass "
                                             "--model and --num-gpus)")
        return reading
    state_name_facts(reading, recipe.name, recipe.line, sets_comm_overlap(s.key for s in settings))
    if "num_gpus" not in reading.request:
        reading.leave(("num_gpus",), f"num_gpus: {recipe.name}() runs on the GPUs torchrun starts it on (pass "
                                     "--num-gpus)")
    reading.notes.append(f"read the fields line {recipe.line}'s {recipe.name}() returns are set to in this script "
                         "(the recipe's own values are Megatron-Bridge's, not read: pass what it sets as flags)")
    reading.config_variable = recipe.variable  # check's fixes set the fields on the script's own name for it
    return reading


class RecipeCall(NamedTuple):
    """A script's call of a Bridge recipe (its name, line, the variable it is assigned to) and the fields it sets on
    the config returned."""

    name: str
    line: int
    variable: str
    settings: list[Setting]


BRIDGE_RECIPES = re.compile(r"megatron\.bridge\.recipes(\.|$)")


def recipe_call(text: str) -> RecipeCall | None:
    """The first `NAME = <recipe>()` of a function imported from megatron.bridge.recipes anywhere in the script (its
    main(), an `if __name__` block), with every `NAME.<section>.<field> = value` after it; None where there is none."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    recipes = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and BRIDGE_RECIPES.match(node.module or "")
               for alias in node.names}
    calls = sorted((node.lineno, node.targets[0].id, recipes[node.value.func.id]) for node in ast.walk(tree)
                   if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                   and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                   and node.value.func.id in recipes)
    if not calls:
        return None
    line, name, recipe = calls[0]
    settings = sorted((Setting(ast.unparse(target).removeprefix(f"{name}."), ast.get_source_segment(text, node.value)
                               or ast.unparse(node.value), node.lineno)
                       for node in ast.walk(tree) if isinstance(node, ast.Assign) and node.lineno > line
                       for target in node.targets if isinstance(target, ast.Attribute)
                       and ast.unparse(target).startswith(f"{name}.")), key=lambda s: s.line)
    return RecipeCall(recipe, line, name, settings)


def bridge_settings(reading: Reading, settings: list[Setting]) -> None:
    """A Megatron-Bridge file's ConfigContainer keys (`model.tensor_model_parallel_size`) applied through the card's
    key table, whichever spelling wrote them: a recipe's cfg assignments, run_recipe.py's KEY=VALUE overrides or an
    override YAML's leaves (bridge_yaml.py)."""
    left = apply(reading, settings, key_table("megatron-bridge", variant=reading.variant),
                 frozenset({"zero_0", "zero_1", "zero_2", "zero_3", "fp8", "uneven_pp", "optimizer"}))
    for s, m in left:
        if m.target == "uneven_pp":  # model.num_layers_in_first_pipeline_stage
            reading.state("first_stage_layers", s.value, s)
        elif m.target == "optimizer":  # Bridge's optim.py: a "dist_" prefix asks for the layer-wise distributed one
            reading.state("optimizer", str(s.value).strip("'\"").removeprefix("dist_"), s)
        elif m.target in ("zero_0", "zero_1") and "zero_stage" not in reading.request:
            reading.state("zero_stage", 1 if as_bool(s.value) else 0, s)
        elif m.target in ("zero_2", "zero_3"):
            stage = {"optim_grads": 2, "optim_grads_params": 3}.get(str(s.value).strip("'\""))
            if stage is not None:
                reading.state("zero_stage", stage, s)
        elif m.target == "fp8" and str(s.value).strip("'\"") not in ("null", "None", ""):
            reading.state("precision", "fp8", s)
    _bridge_preset(reading)


def _bridge_preset(reading: Reading) -> None:
    """A registered mixed-precision preset the file names (run_recipe.py's `mixed_precision=<preset>`, a recipe's
    `cfg.mixed_precision = get_mixed_precision_config('<preset>')` or the name alone): its precision, FP8 recipe and
    fp8_param_gather (cards/frameworks/megatron-bridge.yaml mixed_precision_presets), each unless a field of the file
    states it (cfg.mixed_precision.<field> lines apply over the preset). Read by nothing, a preset's FP8 was dropped
    and the job estimated in bf16."""
    stated = reading.extra.get("precision_preset")
    if stated is None:
        return
    value, s = stated
    call = PRESET_CALL.fullmatch(str(value).strip())
    name = call.group(1) if call else str(value).strip().strip("'\"")
    presets = bridge_presets()
    preset = presets.named(name)
    if preset is None:
        reading.unsupported.append(f"{s.where(reading.path)} = {name}: not a mixed-precision preset meshplan knows "
                                   f"({', '.join(p.name for p in presets.presets)})")
        return
    facts: dict[str, Any] = {"precision": "bf16"} if preset.recipe == "bf16" else {
        "precision": "fp8", "fp8_recipe": preset.recipe, "fp8_param_gather": preset.fp8_param_gather}
    for field_name, fact in facts.items():
        if field_name not in reading.request:
            reading.state(field_name, fact, s)


def read_bridge(text: str, path: str) -> Reading:
    """Megatron-Bridge's run_recipe.py: --recipe NAME and KEY=VALUE overrides of the recipe's ConfigContainer."""
    reading, settings = read_launch(text, path, "megatron-bridge", variant="run_recipe")[3:]
    section = read_section("megatron-bridge")  # the model's keys: compared with the recipe's model, never applied
    bridge_settings(reading, layout_settings(settings, section))
    world(reading)
    recipe = reading.value("recipe")
    if recipe is not None:
        state_name_facts(reading, str(recipe), reading.extra["recipe"][1].line,
                         sets_comm_overlap(s.key for s in settings))
        recipe_overrides(reading, settings, section)  # before restated_architecture: it may change the model
        reading.notes.append(f"recipe {recipe}: the fields it sets and the file does not override are the "
                             "recipe's (its name's model, GPUs and precision are read; its body is read from its "
                             "module: meshplan import RECIPE_MODULE.py:NAME)")
        reading.unresolved.append(f"{reading.extra['recipe'][1].where(path)} {recipe}: the recipe's own layout and "
                                  "batch are not in this script (pass the fields the file leaves out)")
    restated_architecture(reading, settings, section)
    return reading


def read_bridge_module(text: str, path: str) -> Reading:
    """A Megatron-Bridge recipe module: one recipe function read through its chain (bridge_recipe.py)."""
    return read_bridge_recipe(text, path, bridge_settings)
