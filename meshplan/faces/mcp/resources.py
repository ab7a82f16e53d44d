"""Read-only MCP resources: every card, every skill file, and the model and hardware catalogs.

URIs mirror the files, so a name is the path a reader would guess:
- `card://hardware`, `card://models/llama-3.1-8b`, `card://frameworks/verl` (cards/<name>.yaml);
- `skill://parallelism-strategies/SKILL.md`, `skill://parallelism-strategies/references/memory.md`;
- `card://index`, `skill://index`, `catalog://models`, `catalog://hardware` (JSON).
Every file is also listed as a static resource (hosts show `resources/list`, few browse templates);
the templates exist so a client can build a URI by pattern and get a "not found" that names the
known files. Files are found at start-up through importlib.resources, so this works from a
checkout, an editable install and a wheel alike; contents are read only when a resource is read.
"""

from __future__ import annotations

import json
from functools import partial
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.server.mcpserver.resources import FunctionResource

from meshplan.core.card_files import card_names
from meshplan.core.errors import closest

SKILLS_PACKAGE = "meshplan.skills"
_MIME = {".md": "text/markdown", ".yaml": "application/yaml", ".yml": "application/yaml", ".json": "application/json"}
_CARD_FOLDERS = {
    "models": "Model card: Hugging Face config fields, published parameter counts and their sources",
    "frameworks": "Framework card: supported knobs, defaults, memory convention and sources",
}


def _mime(name: str) -> str:
    return next((mime for suffix, mime in _MIME.items() if name.endswith(suffix)), "text/plain")


def skill_files() -> dict[str, Traversable]:
    """Every text file of the skill pack by its path under skills/ (e.g. parallelism-strategies/SKILL.md)."""
    found: dict[str, Traversable] = {}

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name.startswith((".", "__")):
                continue
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(tuple(_MIME)):
                found[prefix + child.name] = child

    try:
        walk(resources.files(SKILLS_PACKAGE), "")
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    return found


def _card_description(name: str) -> str:
    folder = name.split("/", 1)[0] if "/" in name else ""
    return _CARD_FOLDERS.get(folder, f"The {name} card (cards/{name}.yaml)")


def _missing(kind: str, name: str, known: list[str]) -> ResourceNotFoundError:
    hints = closest(name, known)
    hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
    return ResourceNotFoundError(f"No {kind} named {name!r}.{hint} The index resource lists all of them.")


def card_text(name: str) -> str:
    """One card's YAML; the card loader (yaml, the card schemas) is imported on the first read, not at start-up."""
    from meshplan.knowledge.cards import card_text as text

    return text(name)


def read_card(name: str) -> str:
    names = card_names()
    if name not in names:
        raise _missing("card", name, names)
    return card_text(name)


def read_skill(path: str) -> str:
    files = skill_files()
    if path not in files:
        raise _missing("skill file", path, list(files))
    return files[path].read_text(encoding="utf-8")


def card_index() -> str:
    return json.dumps({"cards": [{"name": n, "uri": f"card://{n}"} for n in card_names()]}, indent=1)


def skill_index() -> str:
    return json.dumps({"files": [{"path": p, "uri": f"skill://{p}"} for p in skill_files()]}, indent=1)


def model_catalog() -> str:
    from meshplan import api  # the catalog loads on the first read

    return json.dumps([m.model_dump(mode="json") for m in api.list_models()], indent=1)


def hardware_catalog() -> str:
    from meshplan.knowledge.hardware import gpu_catalog  # the hardware card loads on the first read

    return json.dumps([g.model_dump(mode="json") for g in gpu_catalog().values()], indent=1)


def _static(server: Any, uri: str, name: str, description: str, mime: str, fn: Any) -> None:
    # Built directly: FunctionResource.from_function wraps each reader in validate_call, which costs start-up time.
    server.add_resource(FunctionResource(uri=uri, name=name, description=description, mime_type=mime, fn=fn))


def register_resources(server: Any) -> None:
    json_mime = "application/json"
    _static(server, "card://index", "card-index", "Every card with its URI", json_mime, card_index)
    _static(server, "skill://index", "skill-index", "Every skill file with its URI", json_mime, skill_index)
    _static(server, "catalog://models", "model-catalog",
            "The model catalog: keys, Hugging Face ids, exact total and active parameters", json_mime, model_catalog)
    _static(server, "catalog://hardware", "hardware-catalog",
            "GPUs: memory bytes, peak FLOP/s, HBM, NVLink and network bandwidth, NVLink domain", json_mime,
            hardware_catalog)
    for name in card_names():
        _static(server, f"card://{name}", f"card:{name}", _card_description(name), "application/yaml",
                partial(card_text, name))
    for path, node in skill_files().items():
        _static(server, f"skill://{path}", f"skill:{path}", f"Skill file skills/{path}", _mime(path),
                partial(node.read_text, encoding="utf-8"))

    @server.resource("card://{name}", name="card", mime_type="application/yaml",
                     description="A top-level card by name (hardware, strategies, rules, pitfalls)")
    def card(name: str) -> str:
        return read_card(name)

    @server.resource("card://models/{key}", name="model-card", mime_type="application/yaml",
                     description=_CARD_FOLDERS["models"] + "; key as in list_models")
    def model_card(key: str) -> str:
        return read_card(f"models/{key}")

    @server.resource("card://frameworks/{name}", name="framework-card", mime_type="application/yaml",
                     description=_CARD_FOLDERS["frameworks"])
    def framework_card(name: str) -> str:
        return read_card(f"frameworks/{name}")

    @server.resource("skill://{skill}/SKILL.md", name="skill", mime_type="text/markdown",
                     description="The main document of a skill")
    def skill(skill: str) -> str:
        return read_skill(f"{skill}/SKILL.md")

    @server.resource("skill://{skill}/references/{file}", name="skill-reference", mime_type="text/markdown",
                     description="A reference file of a skill, loaded on demand")
    def skill_reference(skill: str, file: str) -> str:
        return read_skill(f"{skill}/references/{file}")
