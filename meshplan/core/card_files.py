"""Which card files exist, without parsing any of them.

The framework list is the set of framework cards (cards/frameworks/<name>.yaml): listing the files is all
schema.py needs for its `Framework` type, and it must import before cards.py (which validates cards against
schema models), so the listing lives here, below both.
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
