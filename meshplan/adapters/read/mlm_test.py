"""Megatron-LM's functional-test configs (tests/functional_tests/test_cases/**/model_config.yaml): a training run's
pretrain_gpt.py flags written as a YAML mapping, MODEL_ARGS (`--num-layers: 12`, `--bf16: true`), beside ENV_VARS,
TEST_TYPE and MODE. The flags are read as the launch line they stand for, each at its own YAML line, by the Megatron-LM
reader itself (launch.read_megatron): one reader of Megatron-LM's flags.

The file does not name its entry point (Megatron-LM's CI recipe does: tests/test_utils/recipes/*.yaml
TRAINING_SCRIPT_PATH) nor its GPU count: pretrain_gpt.py is taken (pretrain_mamba.py where a hybrid layer pattern
is given) and said; the GPU count is the CI recipes' that list the test case (`ci_recipe_world`), where the file sits
in a Megatron-LM checkout that holds them and every recipe row agrees. A test of inference or RL (MODE), and BERT's
and T5's tests, are refused: no training run of a model meshplan plans.
"""

from __future__ import annotations

import itertools
import re
import shlex
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import yaml

from meshplan.adapters.read.keys import Reading, read_section
from meshplan.adapters.read.launch import read_megatron
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.read_card import CiRecipes

MARK = "MODEL_ARGS"
"""The top-level key that marks the file (adapters/read/detect.yaml_kind)."""
HYBRID_FLAGS = ("--hybrid-override-pattern", "--hybrid-layer-pattern")
NOT_GPT = {"/bert/": "BERT", "/t5/": "T5", "/multimodal-llava/": "LLaVA", "/mimo/": "MIMO"}
"""test_cases folders whose runs are not pretrain_gpt.py / pretrain_mamba.py (their own pretrain_*.py)."""
ENCODER_DECODER = ("--encoder-num-layers", "--decoder-num-layers")  # T5's, in a pasted file without its path
FIX = ("Pass the launch script of a GPT or hybrid training run, or the run's flags on a `torchrun pretrain_gpt.py "
       "...` line.")


def _scalar(node: yaml.Node) -> str | None:
    """A flag's value as its launch line writes it (None: a switch left off, or no value)."""
    if isinstance(node, yaml.SequenceNode):
        return " ".join(shlex.quote(str(n.value)) for n in node.value if isinstance(n, yaml.ScalarNode))
    if not isinstance(node, yaml.ScalarNode) or node.value in ("", "null", "~"):
        return None
    return shlex.quote(node.value)


def read_megatron_test_yaml(text: str, path: str) -> Reading:
    """A model_config.yaml's MODEL_ARGS read as the launch line `python pretrain_gpt.py --flag value ...`, each flag on
    its own YAML line (so every source and error cites the file's line), ENV_VARS as the line's environment."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise MeshplanError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)}).", fix=FIX) from None
    top = {str(k.value): (k, v) for k, v in root.value} if isinstance(root, yaml.MappingNode) else {}
    args = top.get(MARK, (None, None))[1]
    if not isinstance(args, yaml.MappingNode):
        raise MeshplanError(f"{path}: {MARK} is not a mapping of Megatron-LM flags.", fix=FIX)
    mode = top.get("MODE", (None, None))[1]
    if isinstance(mode, yaml.ScalarNode) and mode.value in ("inference", "rl"):
        raise MeshplanError(f"{path}:{mode.start_mark.line + 1}: MODE {mode.value}: a Megatron-LM functional test of "
                            f"{mode.value}, not the training run meshplan plans.", fix=FIX)
    flags = [(str(k.value), v, k.start_mark.line + 1) for k, v in args.value if isinstance(k, yaml.ScalarNode)]
    other = next((name for folder, name in NOT_GPT.items() if folder in path.replace("\\", "/")), None)
    if other is None and any(flag in ENCODER_DECODER for flag, _, _ in flags):
        other = "T5"
    if other is not None:
        raise MeshplanError(f"{path}: a Megatron-LM functional test of {other}, trained by its own pretrain_*.py, not "
                            "the GPT or hybrid model meshplan plans.", fix=FIX)
    entry = "pretrain_mamba.py" if any(flag in HYBRID_FLAGS for flag, _, _ in flags) else "pretrain_gpt.py"
    lines = [""] * (text.count("\n") + 2)
    first, last = top[MARK][0].start_mark.line, max(line for _, _, line in flags)
    env = top.get("ENV_VARS", (None, None))[1]
    prefix = ""
    if isinstance(env, yaml.MappingNode):  # the environment the run starts with (PYTORCH_CUDA_ALLOC_CONF)
        prefix = " ".join(f"{k.value}={shlex.quote(str(v.value))}" for k, v in env.value
                          if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode))
    words = {}  # 0-based line -> the flag written there, as the launch line writes it
    for flag, value, line in flags:
        word = _scalar(value)
        if flag.startswith("--") and word not in (None, "false", "False"):  # a switch left off: not on the line
            words[line - 1] = f"{flag} {'' if word in ('true', 'True') else word}".rstrip()
    lines[first] = f"{prefix} python {entry} \\".lstrip()
    for k in range(first + 1, last):  # every line to the last flag's continues the one launch line
        lines[k] = f"  {words.get(k, '')}" + (" \\" if k < last - 1 else "")
    reading = read_megatron("\n".join(lines), path, "megatron-core")
    reading.assumed.append(
        f"{path}:{first + 1} {MARK}: a Megatron-LM functional test's flags, read as {entry}'s: the file names neither "
        "its entry point (Megatron-LM's CI recipe does, tests/test_utils/recipes/*.yaml) nor its GPU count")
    if "num_gpus" not in reading.request:
        _ci_world(reading, top)
    return reading


class RecipeRow(NamedTuple):
    """One CI workload of a test case: where its recipe lists it, and the ranks it launches."""

    where: str  # recipe path:line
    nodes: int | None
    per_node: int | None  # None: the recipe's spec.gpus and the launcher's ranks per node disagree
    said: str


def _case(path: str, ci: CiRecipes) -> tuple[Path, str, str] | None:
    """(repository root, model folder, test case) of a test config at <root>/<test_cases>/<model>/<case>/<name>."""
    parts = PurePosixPath(path.replace("\\", "/")).parts
    folder = PurePosixPath(ci.test_cases).parts
    k = len(parts) - len(folder) - 3
    if k < 0 or parts[k:k + len(folder)] != folder or parts[-1] != ci.config_name:
        return None
    return Path(*parts[:k]) if k else Path("."), parts[-3], parts[-2]


@lru_cache(maxsize=512)
def _recipe_rows(recipe: str, mtime_ns: int, size: int, default_per_node: int) -> tuple[tuple[Any, ...], ...]:
    """Every workload a recipe flattens to, as recipe_parser.py flattens it: (model, test_case, nodes, ranks per
    node, spec.gpus, the line its test_case is listed on); cached per file version (the bench reads one tree
    hundreds of times)."""
    text = Path(recipe).read_text(errors="replace")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
        return ()
    spec, lines = data["spec"], text.splitlines()
    out = []
    for product in data.get("products") or []:
        if not isinstance(product, dict) or "products" not in product or not product.get("test_case"):
            continue
        case = str(product["test_case"][0])
        line = next((k + 1 for k, t in enumerate(lines) if re.search(rf"test_case:\s*\[\s*{re.escape(case)}\s*[\],]",
                                                                       t) and not t.lstrip().startswith("#")), None)
        for row in product["products"] or []:
            if not isinstance(row, dict):
                continue
            keys = [k for k in row if k != "cadence"]
            values = [v if isinstance(v, list) else [v] for v in (row[k] for k in keys)]
            for combo in itertools.product(*values):
                flat = {**spec, **dict(zip(keys, combo, strict=True))}
                out.append((str(flat.get("model")), case, flat.get("nodes"), _per_node(flat, default_per_node),
                            flat.get("gpus"), line))
    return tuple(out)


def _per_node(spec: dict, default: int) -> int | None:
    """The ranks per node the recipe's test launches: GPUS_PER_NODE as its script sets it ({gpus}, or a number),
    else the launcher's default, which must be the spec's gpus (None where the two disagree)."""
    script = str(spec.get("script") or "")
    gpus = spec.get("gpus")
    if re.search(r"\bGPUS_PER_NODE=\{gpus\}", script):
        return gpus if isinstance(gpus, int) else None
    literal = re.search(r"\bGPUS_PER_NODE=(\d+)\b", script)
    if literal:
        return int(literal.group(1))
    return default if gpus in (None, default) else None


def ci_recipe_world(path: str, ci: CiRecipes) -> list[RecipeRow] | str | None:
    """The CI workloads that run this test config, from the recipes beside it in its own checkout (None: the file is
    not at a test config's place in one; a string: why no count is read)."""
    case = _case(path, ci)
    if case is None:
        return None
    root, model, test = case
    folder = root / ci.recipes
    if not server_files.is_dir(folder):
        return f"the CI recipes ({ci.recipes}) are not in the file's checkout"
    rows = []
    for recipe in sorted(folder.rglob("*.yaml")):
        if not server_files.is_file(recipe):  # a remote caller's: inside the folders it may read
            continue
        stat = recipe.stat()
        for m, c, nodes, per_node, gpus, line in _recipe_rows(str(recipe), stat.st_mtime_ns, stat.st_size,
                                                            ci.default_gpus_per_node):
            if m == model and c == test:
                where = f"{recipe}:{line}" if line else str(recipe)
                said = (f"nodes {nodes} x {per_node} per node" if per_node is not None else
                        f"nodes {nodes} x gpus {gpus}, while its launcher starts {ci.default_gpus_per_node} per node")
                rows.append(RecipeRow(where, nodes if isinstance(nodes, int) else None, per_node,
                                      f"{recipe.relative_to(folder)}: {said}"))
    if not rows:
        return f"no CI recipe under {ci.recipes} lists test case {test} of model {model}"
    return rows


def _ci_world(reading: Reading, top: dict) -> None:
    """num_gpus from the CI recipes that run the test (ci_recipe_world), where every workload launches the same
    count; said as assumed (the recipe's allocation, not the file's setting)."""
    ci = read_section("megatron-core").ci_recipes
    if ci is None:
        return
    runs = top.get("MODEL_ENV_VARS", (None, None))[1]
    found = ci_recipe_world(reading.path, ci)
    if found is None:
        return
    if isinstance(runs, yaml.MappingNode):
        found = "the file's MODEL_ENV_VARS gives each of its runs its own GPUS_PER_NODE (run_ci_test.sh)"
    if isinstance(found, str):
        reading.notes.append(f"num_gpus: {found}, so none is read")
        return
    counts = {r.nodes * r.per_node if r.nodes and r.per_node else None for r in found}
    if len(counts) != 1 or None in counts:
        said = "; ".join(dict.fromkeys(r.said for r in found))
        reading.notes.append(f"num_gpus: the CI recipes that list the test launch it {len(found)} ways that do not "
                             f"agree on one GPU count ({said}), so none is read")
        return
    count = counts.pop()
    reading.left_to_request = [u for u in reading.left_to_request if u.fields != ["num_gpus"]]
    reading.unresolved = [u for u in reading.unresolved if not u.startswith("num_gpus:")]
    reading.state("num_gpus", count, found[0].where + f" ({found[0].said})")
    shapes = {(r.nodes, r.per_node) for r in found}
    if len(shapes) == 1 and "gpus_per_node" not in reading.request:
        reading.state("gpus_per_node", found[0].per_node, found[0].where)
    reading.assumed.append(
        f"num_gpus: {count}, the CI recipe's workload that runs this test ({found[0].where}"
        + (f", and {len(found) - 1} more agreeing" if len(found) > 1 else "")
        + "), not a setting of the file; pass --num-gpus for the count it runs on")


__all__ = ["MARK", "read_megatron_test_yaml"]
