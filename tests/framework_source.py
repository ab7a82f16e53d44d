"""Reads config dataclasses and argparse flags out of unpacked wheels with `ast`: no torch, no imports.

`SourceTree` maps module names to files across one or more wheel roots, resolves a class through
the imports of the module that names it, and collects the annotated fields of the class and its
bases, which is what a dataclass (and a Hydra/OmegaConf key) accepts.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


class SourceTree:
    def __init__(self, *roots: Path):
        self.files: dict[str, Path] = {}
        for root in roots:
            for path in root.rglob("*.py"):
                parts = path.relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                self.files[".".join(parts)] = path
        self._parse = cache(self._parse_uncached)

    def _parse_uncached(self, module: str) -> tuple[dict[str, ast.ClassDef], dict[str, tuple[str, str]]]:
        tree = ast.parse(self.files[module].read_text(encoding="utf-8"))
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        imports: dict[str, tuple[str, str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:  # `from . import x` is not needed here
                base = node.module
                if node.level:
                    # A package's __init__ is its own anchor; a plain module's anchor is its package.
                    parts = module.split(".")
                    keep = len(parts) - node.level + (1 if self.files[module].name == "__init__.py" else 0)
                    base = ".".join([*parts[:keep], node.module])
                for alias in node.names:
                    imports[alias.asname or alias.name] = (base, alias.name)
        return classes, imports

    def resolve(self, module: str, name: str) -> tuple[str, ast.ClassDef] | None:
        """The (module, ClassDef) that `name` means inside `module`, following imports and re-exports."""
        for _ in range(10):
            if module not in self.files:
                return None
            classes, imports = self._parse(module)
            if name in classes:
                return module, classes[name]
            if name not in imports:
                return None
            module, name = imports[name]
        return None

    def fields(self, module: str, name: str) -> dict[str, ast.expr]:
        """Annotated fields of a class and all its resolvable bases (name -> annotation)."""
        found = self.resolve(module, name)
        if found is None:
            raise KeyError(f"{name} not found from {module}")
        mod, cls = found
        out: dict[str, ast.expr] = {}
        for base in cls.bases:
            base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if isinstance(base, ast.Subscript):
                base_name = getattr(base.value, "id", None)
            if base_name and self.resolve(mod, base_name):
                out.update(self.fields(mod, base_name))
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = node.annotation
        return out


def _arg_names(value: ast.expr | None) -> list[str] | None:
    """`arg_names` from field(metadata={"argparse_meta": {"arg_names": [...]}}), if the field sets it."""
    if not isinstance(value, ast.Call):
        return None
    for kw in value.keywords:
        if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
            for k, v in zip(kw.value.keys, kw.value.values, strict=False):
                if isinstance(k, ast.Constant) and k.value == "argparse_meta" and isinstance(v, ast.Dict):
                    for k2, v2 in zip(v.keys, v.values, strict=False):
                        if isinstance(k2, ast.Constant) and k2.value == "arg_names" and isinstance(v2, ast.List):
                            return [e.value for e in v2.elts if isinstance(e, ast.Constant)]
    return None


def megatron_flags(tree: SourceTree, module: str = "megatron.training.arguments") -> set[str]:
    """Every flag Megatron-LM's parser defines: hand-written add_argument calls plus the flags
    ArgumentGroupFactory generates from dataclass fields (megatron/training/argument_utils.py:
    `--field-name`, and `--no-`/`--disable-` forms for booleans), minus each call's `exclude` list."""
    source = ast.parse(tree.files[module].read_text(encoding="utf-8"))
    flags: set[str] = set()
    for func in ast.walk(source):
        if not isinstance(func, ast.FunctionDef):
            continue
        lists = {t.id: n.value for n in ast.walk(func) if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name) and isinstance(n.value, ast.List)}
        for call in ast.walk(func):
            if not isinstance(call, ast.Call):
                continue
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if name == "add_argument":
                flags |= {a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
            if name == "ArgumentGroupFactory" and call.args:
                cls = call.args[0].id
                exclude: set[str] = set()
                for kw in call.keywords:
                    node = lists.get(kw.value.id) if isinstance(kw.value, ast.Name) else kw.value
                    if kw.arg == "exclude" and isinstance(node, ast.List):
                        exclude = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                found = tree.resolve(module, cls)
                assert found is not None, cls
                for field_name, value in _field_values(tree, *found).items():
                    if field_name in exclude:
                        continue
                    names = _arg_names(value)
                    if names:
                        flags |= set(names)
                    else:
                        dashed = field_name.replace("_", "-")
                        flags |= {f"--{dashed}", f"--no-{dashed}", f"--disable-{dashed}"}
    return flags


def _field_values(tree: SourceTree, module: str, cls: ast.ClassDef) -> dict[str, ast.expr | None]:
    out: dict[str, ast.expr | None] = {}
    for base in cls.bases:
        base_name = getattr(base, "id", None)
        found = tree.resolve(module, base_name) if base_name else None
        if found:
            out.update(_field_values(tree, *found))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node.value
    return out
