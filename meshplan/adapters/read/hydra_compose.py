"""A Hydra config's `defaults:` list composed as Hydra composes it, from the config files beside it, never run.

verl's packaged trainer configs (verl/trainer/config/ppo_trainer.yaml, ppo_megatron_trainer.yaml,
sft_trainer_engine.yaml) hold few of their keys themselves: their defaults list places config-group files under a
package, `- actor@actor_rollout_ref.actor: megatron_actor` (actor/megatron_actor.yaml at actor_rollout_ref.actor),
`- model@actor_rollout_ref.model: hf_model`, and those files chain further (`- ../engine@megatron: megatron`,
`- actor`).
The examples' configs compose the packaged one by name over a `hydra.searchpath` (`- ppo_megatron_trainer` with
`file://verl/trainer/config`). Read alone, such a file was read at meshplan's defaults for every key it pulls, and
ppo_megatron_trainer.yaml as verl's FSDP engine.

The rules followed (Hydra 1.3's defaults list, hydra/_internal/defaults_list.py, as verl's generated
_generated_ppo_trainer.yaml records its result): an entry is a config (`name`, `name@pkg`) or a group with its option
(`group@pkg: option`, `group: option`, `optional group: option`; null: nothing), a path relative to the group of the
file that lists it (`../engine` climbs out of it); its package is the `@pkg` given, else the group's path, under the
package of the file that lists it (a plain config takes that package itself); `_self_` places the file's own keys,
at the end where it is not listed; `override group: option` in the primary config replaces that group's option
wherever the chain lists it. Later values win key by key (OmegaConf's merge: a mapping merged into a mapping, any
other value replacing). A file the list names and the folders do not hold is said, and its keys left to meshplan's
defaults, as before.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from pathlib import Path

from meshplan.adapters.read.keys import Reading
from meshplan.adapters.read.settings import Setting, yaml_settings
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError

MAX_FILES = 64
"""Config files one composition reads at most (verl's ppo_megatron_trainer.yaml reads 24): a list that names more,
or names itself, is refused rather than followed."""


@dataclass
class Composed:
    """The settings a config composes to (each cited in the file that sets it), the files read, and what could not be
    followed (said by the reader)."""

    settings: list[Setting]
    files: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Entry:
    group: str | None  # the group's path from the config root (None: a plain config)
    name: str  # the config's path from the config root, without .yaml
    package: str  # where its keys go, dotted ("" the root)
    optional: bool
    said: str  # as the list writes it


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _entries(item: object, group: str, package: str) -> tuple[_Entry | None, tuple[str, str] | None]:
    """One item of a defaults list read: the entry it names (a config or a group's option), or an override of a
    group's option (its group path, its option); neither for _self_ or a null option."""
    if isinstance(item, str):
        if item == "_self_":
            return None, None
        name, _, pkg = item.partition("@")
        path = posixpath.normpath(posixpath.join(group, name)).lstrip("/")
        return _Entry(None, path, _join(package, pkg) if pkg else package, False, item), None
    if isinstance(item, dict) and len(item) == 1:
        ((key, option),) = item.items()
        key = str(key).strip()
        words = key.split()
        if len(words) == 2 and words[0] == "override":
            return None, (posixpath.normpath(posixpath.join(group, words[1].partition("@")[0])).lstrip("/"),
                          str(option))
        optional = len(words) == 2 and words[0] == "optional"
        name, _, pkg = words[-1].partition("@")
        path = posixpath.normpath(posixpath.join(group, name)).lstrip("/")
        if option is None:
            return None, None
        return _Entry(path, f"{path}/{option}", _join(package, pkg if pkg else path.replace("/", ".")), optional,
                      f"{key}: {option}"), None
    return None, None


class _Composer:
    def __init__(self, path: str, roots: list[Path], kind: str, fix: str, refuses_duplicates: str | None):
        self.path, self.roots, self.kind, self.fix = path, roots, kind, fix
        self.refuses_duplicates = refuses_duplicates
        self.out = Composed([])
        self.overrides: dict[str, str] = {}
        self.merged: dict[str, Setting] = {}

    def find(self, name: str) -> Path | None:
        for root in self.roots:
            candidate = root / f"{name}.yaml"
            if server_files.is_file(candidate):  # a remote caller's: inside the folders it may read
                return candidate
        return None

    def merge(self, settings: list[Setting], package: str) -> None:
        """Settings placed at `package`, over those merged so far key by key (a value set where a mapping was, or
        a mapping where a value was, replacing it whole)."""
        for s in settings:
            key = _join(package, s.key)
            for old in [k for k in self.merged if k.startswith(key + ".") or key.startswith(k + ".")]:
                del self.merged[old]
            self.merged.pop(key, None)
            self.merged[key] = replace(s, key=key)

    def compose(self, text: str, file: str, group: str, package: str, primary: bool) -> None:
        if len(self.out.files) >= MAX_FILES:
            raise MeshplanError(f"{self.path}: its Hydra defaults list reads more than {MAX_FILES} config files "
                                f"(at {file}); a list naming itself never ends.", fix="Pass the composed config "
                                                                                       "(the run's --cfg job output).")
        self.out.files.append(file)
        every = yaml_settings(text, file, self.kind, self.fix, refuses_duplicates=self.refuses_duplicates)
        own = [s for s in every if s.key.split(".")[0] not in ("defaults", "hydra")
               and not (s.key == "defaults" or s.key.startswith("defaults."))]
        if file != self.path:
            own = [replace(s, file=file) for s in own]
        defaults = next((s.value for s in every if s.key == "defaults"), None)
        items = defaults if isinstance(defaults, list) else []
        if primary:
            for item in items:
                _, override = _entries(item, group, package)
                if override is not None:
                    self.overrides[override[0]] = override[1]
        placed = False
        for item in items:
            if item == "_self_":
                self.merge(own, package)
                placed = True
                continue
            entry, _ = _entries(item, group, package)
            if entry is None:
                continue
            name = entry.name
            if entry.group is not None and entry.group in self.overrides:
                name = f"{entry.group}/{self.overrides[entry.group]}"
            found = self.find(name)
            if found is None:
                if not entry.optional:
                    self.out.missing.append(f"{file}: `{entry.said}` ({name}.yaml)")
                continue
            try:
                child = found.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                self.out.missing.append(f"{file}: `{entry.said}` ({found} cannot be read)")
                continue
            parent = posixpath.dirname(name)
            self.compose(child, str(found), parent, entry.package, False)
        if not placed:  # Hydra 1.1+: _self_ not listed is last, the file's own keys over its defaults
            self.merge(own, package)


def search_roots(path: str, searchpath: list[str]) -> list[Path]:
    """The folders a config's defaults are looked up in: its own folder, then its `hydra.searchpath` entries
    (file://DIR relative to the folder the run starts in, which the file does not say: the nearest folder above it
    that holds DIR, as the examples run from the repository root; pkg://a.b as the folder a/b found so)."""
    here = Path(path).resolve().parent
    roots = [here]
    for entry in searchpath:
        scheme, _, rest = str(entry).partition("://")
        rel = rest if scheme == "file" else rest.replace(".", "/") if scheme == "pkg" else None
        if not rel:
            continue
        given = Path(rel)
        if given.is_absolute():
            found = given if given.is_dir() else None
        else:
            found = next((f / given for f in [here, *here.parents] if (f / given).is_dir()), None)
        if found is not None and found.resolve() not in roots:
            roots.append(found.resolve())
    return roots


def compose_defaults(text: str, path: str, every: list[Setting], kind: str, fix: str,
                     refuses_duplicates: str | None) -> Composed | None:
    """The config composed over its defaults list from the files beside it (None: it has no list naming another
    file, or it is pasted text with no folder to find them in)."""
    defaults = next((s.value for s in every if s.key == "defaults"), None)
    if not isinstance(defaults, list) or path.startswith("<") or not Path(path).is_file():
        return None
    if not any(_entries(item, "", "")[0] is not None for item in defaults):
        return None
    searchpath = next((s.value for s in every if s.key == "hydra.searchpath"), [])
    composer = _Composer(path, search_roots(path, searchpath if isinstance(searchpath, list) else []), kind, fix,
                         refuses_duplicates)
    composer.compose(text, path, "", "", True)
    composer.out.settings = list(composer.merged.values())
    return composer.out


def said_composed(reading: Reading, composed: Composed, name: str, framework: str) -> None:
    """What a composed defaults list read, and what it names that the folders do not hold (those keys at meshplan's
    defaults, as a file read alone is)."""
    files = composed.files[1:]
    if files:
        reading.notes.append(f"{reading.path}: its Hydra defaults list composed as Hydra composes it, from "
                             f"{len(files)} config file(s) beside it ({', '.join(files[:6])}"
                             + (f" and {len(files) - 6} more" if len(files) > 6 else "") + "); each key cited in the "
                             "file that sets it")
    for missing in composed.missing:
        reading.assumed.append(f"{missing}: not given (found neither beside the file nor on its hydra.searchpath): "
                               f"the keys it sets are read at meshplan's default for {name} "
                               f"(cards/frameworks/{framework}.yaml), not at its. Pass the file's folder as it is, or "
                               "those keys as flags")
