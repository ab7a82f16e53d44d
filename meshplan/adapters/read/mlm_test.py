"""Megatron-LM's functional-test configs (tests/functional_tests/test_cases/**/model_config.yaml): a training run's
pretrain_gpt.py flags written as a YAML mapping, MODEL_ARGS (`--num-layers: 12`, `--bf16: true`), beside ENV_VARS,
TEST_TYPE and MODE. The flags are read as the launch line they stand for, each at its own YAML line, by the Megatron-LM
reader itself (launch.read_megatron): one reader of Megatron-LM's flags.

The file does not name its entry point (Megatron-LM's CI recipe does: tests/test_utils/recipes/*.yaml
TRAINING_SCRIPT_PATH) nor its GPU count: pretrain_gpt.py is taken (pretrain_mamba.py where a hybrid layer pattern
is given) and said. A test of inference or RL (MODE), and BERT's and T5's tests, are refused: no training run of a
model meshplan plans.
"""

from __future__ import annotations

import shlex

import yaml

from meshplan.adapters.read.keys import Reading
from meshplan.adapters.read.launch import read_megatron
from meshplan.core.errors import MeshplanError

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
    return reading


__all__ = ["MARK", "read_megatron_test_yaml"]
