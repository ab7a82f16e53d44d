"""torchtitan's Python job configs (the config_registry.py generation: `def llama3_70b() -> Trainer.Config:`), read
with `ast`, never imported or run.

A config function returns `Trainer.Config(parallelism=ParallelismConfig(tensor_parallel_degree=8), ...)`, or
derives from another one (`config = llama3_8b()`, then `config.compile = CompileConfig(enable=True)`,
`config.parallelism.x = 2`). Each keyword becomes a dotted setting with its line (`parallelism.tensor_parallel_degree`)
and goes through the same torchtitan key mapping as the TOML and the flags (files.torchtitan_common). The keys this
generation renamed are carried over from its TrainingConfig (pytorch/torchtitan torchtitan/config/configs.py):
`training.max_context_length` is the sequence length, `num_tokens_per_microbatch_per_dp_rank` / it the local batch;
`activation_checkpoint=SelectiveAC.Config()` / `FullAC.Config()` the AC mode; the model is the registry entry the
function (or the one it derives from) is (the card's `registry`), its converters Float8 / MXFP8.

Which function: the one named after the file (`config_registry.py:llama3_70b`), else the first one that builds a
`Trainer.Config`; the others are listed in the notes.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from meshplan.adapters.read.files import torchtitan_common
from meshplan.adapters.read.keys import Reading
from meshplan.adapters.read.launch import world
from meshplan.adapters.read.settings import Setting
from meshplan.core.errors import MeshplanError

DETECT = re.compile(r"->\s*Trainer\.Config\s*:|=\s*Trainer\.Config\(|return Trainer\.Config\(")
AC_MODES = {"SelectiveAC": "selective", "FullAC": "full", "NoAC": "none"}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
MAX_DEPTH = 8  # a config derives from another at most this deep (registries chain two or three)


def _value(node: ast.AST) -> Any:
    """A literal, a list of them, or arithmetic of integers (8 * 8192); anything else raises ValueError."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    return ast.literal_eval(node)


def _call_name(node: ast.AST) -> str:
    """'ParallelismConfig', 'SelectiveAC.Config' -> 'SelectiveAC', 'model_registry'."""
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return _call_name(func.value) if func.attr == "Config" else func.attr
    return func.id if isinstance(func, ast.Name) else ""


class _Function:
    """One config function: its settings as (dotted key, value, line)."""

    def __init__(self, node: ast.FunctionDef, functions: dict[str, ast.FunctionDef], depth: int = 0):
        self.node, self.functions, self.depth = node, functions, depth
        self.locals: dict[str, ast.AST] = {}
        self.settings: list[tuple[str, Any, int]] = []
        self.base: str | None = None  # the registry function this one derives from, if any
        self.skipped: list[str] = []

    def read(self) -> _Function:
        for stmt in self.node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self._assign(stmt.targets[0], stmt.value)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                self._expression("", stmt.value)
        return self

    def _assign(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            called = _call_name(value) if isinstance(value, ast.Call) else ""
            if called in self.functions and self.depth < MAX_DEPTH and not value.args:  # config = llama3_8b()
                inner = _Function(self.functions[called], self.functions, self.depth + 1).read()
                self.settings += inner.settings
                self.base = inner.base or called
            self.locals[target.id] = value
        elif isinstance(target, ast.Attribute):  # config.parallelism.tensor_parallel_degree = 2
            parts: list[str] = []
            node: ast.AST = target
            while isinstance(node, ast.Attribute):
                parts.insert(0, node.attr)
                node = node.value
            self._expression(".".join(parts), value)

    def _expression(self, key: str, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and node.id in self.locals:
            node = self.locals[node.id]
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in AC_MODES:
                self.settings.append((f"{key}.mode" if key else "mode", AC_MODES[name], node.lineno))
            elif name == "model_registry":
                self._model(key, node)
            elif name in self.functions:
                return
            for kw in node.keywords:
                if kw.arg is not None:
                    self._expression(f"{key}.{kw.arg}" if key else kw.arg, kw.value)
            return
        try:
            self.settings.append((key, _value(node), getattr(node, "lineno", self.node.lineno)))
        except (ValueError, TypeError, SyntaxError, ZeroDivisionError):
            self.skipped.append(key)

    def _model(self, key: str, node: ast.Call) -> None:
        if node.args:
            try:
                self.settings.append(("model.flavor", _value(node.args[0]), node.lineno))
            except (ValueError, SyntaxError):
                pass
        for kw in node.keywords:
            if kw.arg == "converters" and isinstance(kw.value, ast.List):
                names = [_call_name(c).lower() for c in kw.value.elts if isinstance(c, ast.Call)]
                kinds = ["float8" if "float8" in n else "mx" if "mxfp8" in n else n for n in names]
                self.settings.append(("model.converters", kinds, kw.value.lineno))


def _carried(settings: list[tuple[str, Any, int]]) -> list[tuple[str, Any, int]]:
    """This generation's TrainingConfig names in the names the torchtitan key mapping reads."""
    found = {key: (value, line) for key, value, line in settings}
    out = [(k, v, n) for k, v, n in settings if k not in ("training.max_context_length",
                                                          "training.num_tokens_per_microbatch_per_dp_rank")]
    context = found.get("training.max_context_length")
    if context is not None:
        out.append(("training.seq_len", *context))
        tokens = found.get("training.num_tokens_per_microbatch_per_dp_rank")
        if tokens is not None and isinstance(tokens[0], int) and tokens[0] % context[0] == 0:
            out.append(("training.local_batch_size", tokens[0] // context[0], tokens[1]))
    return out


def _choose(tree: ast.Module, path: str) -> tuple[ast.FunctionDef, dict[str, ast.FunctionDef], str, str]:
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    file, _, wanted = path.rpartition(":") if re.search(r"\.py:\w+$", path) else (path, "", "")
    if wanted:
        if wanted not in functions:
            raise MeshplanError(f"{file}: no config function {wanted!r}.",
                                fix=f"Use one of: {', '.join(functions) or '(none)'}.")
        return functions[wanted], functions, file, wanted
    builders = [f for f in functions.values() if DETECT.search(ast.unparse(f))]
    if not builders:
        raise MeshplanError(f"{file}: no function returning a torchtitan Trainer.Config.",
                            fix="Pass a config_registry.py (FILE.py:FUNCTION to pick one function).")
    return builders[0], functions, file, builders[0].name


def read_torchtitan_python(text: str, path: str) -> Reading:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise MeshplanError(f"{path}:{exc.lineno}: not Python ({exc.msg}).",
                            fix="Pass the config_registry.py as it is (it is parsed, never run).") from None
    node, functions, file, name = _choose(tree, path)
    function = _Function(node, functions).read()
    reading = Reading("torchtitan", file, variant="python")  # the card's keys: its cli variant (keys.key_table)
    settings = [Setting(key, value, line) for key, value, line in _carried(function.settings)]
    registry = function.base or name
    settings.append(Setting("--config", registry, node.lineno))
    others = [f for f in functions if f != name and DETECT.search(ast.unparse(functions[f]))]
    reading.notes.append(f"read config function {name}()" + (f" (derived from {function.base}())" if function.base
                                                             else "") + (f"; the file also defines {', '.join(others)}"
                                                                         f" (FILE.py:NAME reads another)" if others
                                                                         else ""))
    torchtitan_common(reading, settings)
    world(reading)
    return reading
