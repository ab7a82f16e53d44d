"""Which card files exist, without parsing any of them.

The framework list is the set of framework cards (cards/frameworks/<name>.yaml): listing the files is all
schema.py needs for its `Framework` type, and it must import before cards.py (which validates cards against
schema models), so the listing lives here, below both. Which framework cards have a given top-level section is
read here too, from the text: the MCP server names the frameworks `render_config` takes (those with an `adapter`
section) in its tool list, before anything loads the YAML parser and the card schemas.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

SUFFIX = ".yaml"


def card_root() -> Traversable:
    """The cards folder, installed as the package `meshplan.cards_data`."""
    return resources.files("meshplan.cards_data")


def card_names() -> list[str]:
    """Every card, as a path relative to the cards folder without the .yaml suffix."""
    names: list[str] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir() and not child.name.startswith("__"):
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(SUFFIX):
                names.append(prefix + child.name[: -len(SUFFIX)])

    walk(card_root(), "")
    return sorted(names)


@cache
def framework_names() -> tuple[str, ...]:
    """The frameworks meshplan knows, sorted: one per file in cards/frameworks/ (its name without .yaml)."""
    folder = card_root().joinpath("frameworks")
    return tuple(sorted(child.name[: -len(SUFFIX)] for child in folder.iterdir() if child.name.endswith(SUFFIX)))


def has_section(text: str, key: str) -> bool:
    """Whether a card's YAML text has the top-level block `key:` with a body, read without the YAML parser.

    A top-level key of a block mapping starts at column 0 (no other line can: block scalars and continued
    values under a top-level key are indented), and its body is the indented lines below it; `key:` followed
    by nothing is null, as the parser reads it. tests/test_cards.py holds this to the parsed cards.
    """
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for i, line in enumerate(lines):
        if line.split(" #", 1)[0].rstrip() == f"{key}:":
            return i + 1 < len(lines) and lines[i + 1].startswith(" ")
    return False


@cache
def frameworks_with_section(key: str) -> tuple[str, ...]:
    """The frameworks whose card has the top-level section `key` (e.g. `adapter`: the ones `render` writes)."""
    folder = card_root().joinpath("frameworks")
    return tuple(name for name in framework_names()
                 if has_section(folder.joinpath(name + SUFFIX).read_text(encoding="utf-8"), key))
