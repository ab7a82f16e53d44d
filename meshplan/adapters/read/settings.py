"""A configuration file as a list of settings: each key the file sets, its value and the line that sets it.

Shell launch lines give `--flag value` and Hydra `key=value` words (read by shell.py, never run); TOML, JSON and YAML
files give their dotted keys. Every later step (which framework, which request field) works on these settings.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, replace
from typing import Any

import yaml

from meshplan.adapters.read.shell import Word
from meshplan.core.errors import MeshplanError


@dataclass(frozen=True)
class Setting:
    key: str
    value: Any  # True for a flag given alone
    line: int
    via: str | None = None  # "TP at line 12": the script variable the value came from
    alone: bool = False  # a flag with no value word after it (a switch, or a value flag whose variable is unset)
    written: str | None = None  # the key as the file writes it, where a reader reads it as another (SkyRL main_sft's)
    more: tuple[str, ...] = ()  # the bare words after a flag's value: an argparse list (--recompute-modules a b)

    def where(self, path: str) -> str:
        """Where the file sets it, in the file's own key: what an import cites and a fix edits."""
        return f"{path}:{self.line} {self.written or self.key}" + (f" (${self.via})" if self.via else "")


def flag_settings(words: list[Word]) -> list[Setting]:
    """`--flag value`, `--flag=value` and `--flag` alone (True) from a command's words; Hydra `key=value` words
    (their `+`, `++` and `~` prefixes kept in the key) too."""
    out: list[Setting] = []
    i = 0
    while i < len(words):
        w = words[i]
        text = w.text
        if text.startswith("--") and len(text) > 2:
            if "=" in text:
                key, value = text.split("=", 1)
                out.append(_setting(key, value, w, w))
            elif i + 1 < len(words) and not words[i + 1].text.startswith("--") and "=" not in words[i + 1].text:
                more = _bare_words(words, i + 2)
                out.append(replace(_setting(text, words[i + 1].text, w, words[i + 1]), more=more))
                i += 1 + len(more)
            else:
                out.append(Setting(text, True, w.line, alone=True))
        elif "=" in text and not text.startswith("-") and re.match(r"^[+~]{0,2}[A-Za-z_][\w.\-]*=", text):
            key, value = text.split("=", 1)
            out.append(_setting(key, value, w, w))
        elif re.fullmatch(r"~[A-Za-z_][\w.\-]*", text):
            out.append(Setting(text, None, w.line))  # Hydra: delete the key
        i += 1
    return out


def _bare_words(words: list[Word], start: int) -> tuple[str, ...]:
    """The words from `start` up to the next flag or Hydra key=value: the rest of a flag's values where argparse
    takes several (Megatron-LM's nargs='*' --recompute-modules core_attn mlp); a list field reads them with the first
    (keys.list_value), every other field the first alone. Read as nothing, all but the first module were dropped."""
    end = start
    while end < len(words) and not words[end].text.startswith("-") and "=" not in words[end].text:
        end += 1
    return tuple(w.text for w in words[start:end])


def _setting(key: str, value: str, key_word: Word, value_word: Word) -> Setting:
    via = f"{value_word.var} at line {value_word.var_line}" if value_word.var and value_word.var_line else None
    return Setting(key, value, key_word.line, via)


def toml_settings(text: str, path: str) -> list[Setting]:
    """Every leaf of a TOML file as a dotted key, with the line that sets it."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MeshplanError(f"{path}: not valid TOML ({exc}).", fix="Check the line it names.") from None
    lines = _toml_lines(text)
    return [Setting(key, value, lines.get(key, 0)) for key, value in _leaves(doc)]


def _toml_lines(text: str) -> dict[str, int]:
    section, out = "", {}
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?", stripped)
        if m:
            section = m.group(1).replace('"', "")
            continue
        m = re.match(r"([A-Za-z0-9_\-\".]+)\s*=", stripped)
        if m:
            out.setdefault(f"{section}.{m.group(1)}" if section else m.group(1), number)
    return out


def _leaves(doc: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(doc, dict):
        return [leaf for k, v in doc.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [(prefix[:-1], doc)]


def json_settings(text: str, path: str) -> list[Setting]:
    """Every leaf of a JSON object as a dotted key, with its line; a syntax error names its line."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno}).",
                            fix="Fix that line (a DeepSpeed config is one JSON object).") from None
    if not isinstance(doc, dict):
        raise MeshplanError(f"{path}: a DeepSpeed config is a JSON object, this is a {type(doc).__name__}.",
                            fix='Start from {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {...}}.')
    lines = _json_lines(text)
    return [Setting(key, value, lines.get(key, 0)) for key, value in _leaves(doc)]


def _json_lines(text: str) -> dict[str, int]:
    """The line of each dotted key: keys are tracked through the object nesting while the text is scanned."""
    out: dict[str, int] = {}
    stack: list[str | None] = []
    pending: str | None = None
    for m in re.finditer(r'"((?:\\.|[^"\\])*)"\s*(:)?|[{}\[\]]', text):
        token = m.group(0)
        if m.group(2):
            pending = m.group(1)
            key = ".".join([k for k in stack if k] + [pending])
            out.setdefault(key, text.count("\n", 0, m.start()) + 1)
        elif token in "{[":
            stack.append(pending if token == "{" else None)
            pending = None
        elif token in "}]" and stack:
            stack.pop()
    return out


def yaml_settings(text: str, path: str, kind: str, fix: str, *, switches: tuple[str, ...] = (),
                  none_words: frozenset[str] = frozenset()) -> list[Setting]:
    """Every scalar of a YAML mapping as a dotted key with its line, for each reader of a YAML config (AutoModel's
    recipe, verl's SFT trainer config), so their checks cannot drift: composed with the safe loader (no tag
    constructed, no `_target_` imported), a syntax error names its line where YAML gives one, and a file that is not a
    mapping says what `kind` of file was expected (`fix`: how to start one). `switches`: key suffixes whose mapping
    value is one switch (True); `none_words`: strings the framework's loader reads as null."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise MeshplanError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)}).",
                            fix=f"Fix {'that line' if mark is not None else 'the file'} ({kind} is one YAML "
                                "mapping).") from None
    if not isinstance(root, yaml.MappingNode):
        raise MeshplanError(f"{path}: {yaml_kind(root)}, not a mapping of keys; {kind} is a YAML mapping.", fix=fix)
    return _yaml_leaves(root, "", switches, none_words)


def yaml_kind(root: yaml.Node | None) -> str:
    """What a YAML document that is not a mapping is, as an error says it: a list of N items, a scalar value, or
    nothing but comments."""
    if root is None:
        return "the YAML holds no document (only comments)"
    if isinstance(root, yaml.SequenceNode):
        n = len(root.value)
        return f"the YAML is a list ({n} item{'' if n == 1 else 's'})"
    text = str(root.value)
    return f"the YAML is a single value ({text[:40] + '...' if len(text) > 40 else text!r})"


def _yaml_leaves(node: yaml.MappingNode, prefix: str, switches: tuple[str, ...],
                 none_words: frozenset[str]) -> list[Setting]:
    """A sequence is one value (a list); a null (or one of `none_words`) reads as "null", as a launch line writes it."""
    out: list[Setting] = []
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        line = key_node.start_mark.line + 1
        if isinstance(value_node, yaml.MappingNode):
            if key.endswith(switches):
                out.append(Setting(key, True, line))
            else:
                out += _yaml_leaves(value_node, key + ".", switches, none_words)
            continue
        try:
            value = yaml.safe_load(yaml.serialize(value_node))
        except yaml.YAMLError:  # a tag the safe loader refuses (!!python/...): its text, never constructed
            value = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
        none = value is None or (isinstance(value, str) and value in none_words)
        out.append(Setting(key, "null" if none else value, line))
    return out
