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

from meshplan.adapters.read.shell import MAX_CONFIG_CHARS, Word
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
    file: str | None = None  # the file that sets it where not the one read (the recipe an AutoModel script passes)

    def where(self, path: str) -> str:
        """Where the file sets it, in the file's own key: what an import cites and a fix edits."""
        return f"{self.file or path}:{self.line} {self.written or self.key}" + (f" (${self.via})" if self.via else "")


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


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (its name)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


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
    """Every leaf of a JSON object as a dotted key, with its line; a syntax error names its line, and a key given twice
    in one object is refused as DeepSpeed refuses it (runtime/config.py loads its config with object_pairs_hook
    dict_raise_error_on_duplicate_keys), where json.loads would keep the last silently."""
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise MeshplanError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg}, column {exc.colno}).",
                            fix="Fix that line (a DeepSpeed config is one JSON object).") from None
    except _DuplicateKey as exc:
        raise MeshplanError(f"{path}: the key {exc.args[0]!r} is given twice in one JSON object; DeepSpeed refuses "
                            "such a config (\"Duplicate keys in DeepSpeed config\").",
                            fix="Keep the one value the run should use.") from None
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
    # the line at offset `counted`: each key's line counted on from the last key's, not from the start of the text
    # (Megatron-LM's 900 kB golden_values JSONs took 13 s so, past the bench's 60 s time-out on a loaded machine)
    line, counted = 1, 0
    for m in re.finditer(r'"((?:\\.|[^"\\])*)"\s*(:)?|[{}\[\]]', text):
        token = m.group(0)
        if m.group(2):
            pending = m.group(1)
            key = ".".join([k for k in stack if k] + [pending])
            line, counted = line + text.count("\n", counted, m.start()), m.start()
            out.setdefault(key, line)
        elif token in "{[":
            stack.append(pending if token == "{" else None)
            pending = None
        elif token in "}]" and stack:
            stack.pop()
    return out


def yaml_settings(text: str, path: str, kind: str, fix: str, *, switches: tuple[str, ...] = (),
                  none_words: frozenset[str] = frozenset(), refuses_duplicates: str | None = None) -> list[Setting]:
    """Every scalar of a YAML mapping as a dotted key with its line, for each reader of a YAML config (AutoModel's
    recipe, verl's SFT trainer config), so their checks cannot drift: composed with the safe loader (no tag
    constructed, no `_target_` imported), a syntax error names its line where YAML gives one, and a file that is not a
    mapping says what `kind` of file was expected (`fix`: how to start one). `switches`: key suffixes whose mapping
    value is one switch (True); `none_words`: strings the framework's loader reads as null; `refuses_duplicates`: the
    loader that refuses a key written twice in one mapping (OmegaConf's), None where the last one wins (safe_load)."""
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
    return _YamlWalk(path, switches, none_words, refuses_duplicates).leaves(root, "")


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


MERGE_TAG = "tag:yaml.org,2002:merge"  # the resolver's tag of a plain `<<` key


class _YamlWalk:
    """Every scalar of a composed YAML mapping as a dotted key with its line, as the frameworks' loaders read it
    (yaml.safe_load: AutoModel's load_yaml_config; OmegaConf's SafeLoader: verl's Hydra config), so a merge key `<<`
    gives the mapping it names, and refused once what aliases expand to passes MAX_CONFIG_CHARS: composing shares an
    aliased node, but every walk of it would repeat it, and aliases of aliases (the "billion laughs") grow
    exponentially. A sequence is one value (a list); a null (or one of `none_words`) reads as "null", as a launch
    line writes it."""

    def __init__(self, path: str, switches: tuple[str, ...], none_words: frozenset[str],
                 refuses_duplicates: str | None = None):
        self.path, self.switches, self.none_words = path, switches, none_words
        self.refuses_duplicates = refuses_duplicates  # the loader refusing a key written twice (None: the last wins)
        self.left = MAX_CONFIG_CHARS  # characters of keys and values still to read
        self.sizes: dict[int, int] = {}  # id(node) -> the characters it expands to
        self.merged: dict[int, list[tuple[yaml.Node, yaml.Node]]] = {}  # id(mapping) -> its pairs, merges resolved
        self.values: dict[int, Any] = {}  # id(node) -> its Python value: an aliased node built once, then shared
        self.scalars = yaml.constructor.SafeConstructor()  # a scalar's value from its resolved tag, as safe_load's

    def leaves(self, node: yaml.MappingNode, prefix: str) -> list[Setting]:
        out: list[Setting] = []
        for key_node, value_node in self.pairs(node):
            key = f"{prefix}{key_node.value}"
            line = key_node.start_mark.line + 1
            if isinstance(value_node, yaml.MappingNode):  # its leaves spend, after its whole size (a cycle's: over)
                self.spend(len(str(key_node.value)) if self.size(value_node) <= MAX_CONFIG_CHARS
                           else MAX_CONFIG_CHARS + 1, key + ".", line)
                if key.endswith(self.switches):
                    out.append(Setting(key, True, line))
                else:
                    out += self.leaves(value_node, key + ".")
                continue
            self.spend(len(str(key_node.value)) + self.size(value_node), key, line)
            try:
                value = self.value(value_node)
            except yaml.YAMLError:  # a tag the safe loader refuses (!!python/...): its text, never constructed
                value = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
            none = value is None or (isinstance(value, str) and value in self.none_words)
            out.append(Setting(key, "null" if none else value, line))
        return out

    def value(self, node: yaml.Node) -> Any:
        """A value as yaml.safe_load builds it (a tag it does not know: ConstructorError, a YAMLError), merges
        resolved by `pairs`."""
        if id(node) not in self.values:
            if isinstance(node, yaml.ScalarNode):
                self.values[id(node)] = self.scalars.construct_object(node)
            elif isinstance(node, yaml.SequenceNode):
                self.values[id(node)] = [self.value(n) for n in node.value]
            else:
                self.values[id(node)] = {_hashable(self.value(k)): self.value(v) for k, v in self.pairs(node)}
        return self.values[id(node)]

    def spend(self, chars: int, key: str, line: int) -> None:
        self.left -= chars
        if self.left < 0:
            raise MeshplanError(f"{self.path}:{line} {key}: the YAML's aliases expand to more than "
                                f"{MAX_CONFIG_CHARS:,} characters; a configuration and what it expands to are at "
                                "most that (aliases of aliases?).",
                                fix="Write the values out, or pass the file the run reads.")

    def size(self, node: yaml.Node) -> int:
        """The characters a value expands to, each aliased node counted where it is used (worked out once each)."""
        if id(node) not in self.sizes:
            self.sizes[id(node)] = MAX_CONFIG_CHARS + 1  # while it is worked out: a node inside itself is too big
            if isinstance(node, yaml.ScalarNode):
                size = len(str(node.value)) + 1
            elif isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self.size(n) for n in node.value)
            else:
                size = 1 + sum(self.size(k) + self.size(v) for k, v in self.pairs(node))
            self.sizes[id(node)] = min(size, MAX_CONFIG_CHARS + 1)
        return self.sizes[id(node)]

    def pairs(self, node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
        """A mapping's keys and values with its merge keys resolved as SafeConstructor.flatten_mapping does: the
        merged mappings' keys (an earlier one in a `<<: [*a, *b]` list winning) under the keys written beside them,
        each key once."""
        if id(node) in self.merged:
            return self.merged[id(node)]
        self.merged[id(node)] = []  # while it is worked out: a mapping merged into itself adds nothing more
        merged: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        own: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                if self.refuses_duplicates and str(key_node.value) in own:
                    raise MeshplanError(f"{self.path}:{key_node.start_mark.line + 1}: the key {key_node.value!r} is "
                                        f"written twice in one mapping; {self.refuses_duplicates} refuses it "
                                        "(found duplicate key).", fix="Keep the one value the run should use.")
                own[str(key_node.value)] = (key_node, value_node)
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            if not all(isinstance(m, yaml.MappingNode) for m in sources):
                raise MeshplanError(f"{self.path}:{key_node.start_mark.line + 1}: `<<` merges a mapping or a list of "
                                    f"mappings (an alias such as *base), not {value_node.value!r:.60}; the "
                                    "framework's YAML loader refuses it too.", fix="Merge a mapping, or write the "
                                                                                   "keys out.")
            for source in reversed(sources):
                merged.update({str(k.value): (k, v) for k, v in self.pairs(source)})
        self.merged[id(node)] = pairs = list({**merged, **own}.values())
        return pairs


def _hashable(key: Any) -> Any:
    """A mapping's key as safe_load keeps it, or its text where it is a list or mapping (safe_load refuses those)."""
    return key if isinstance(key, (str, int, float, bool, type(None))) else str(key)
