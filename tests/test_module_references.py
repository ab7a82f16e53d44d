"""Every module path the code, cards and documents name (meshplan/....py) exists: a source that points at a file
moved or split away sends a reader to nothing (bench/HISTORY.md is history and keeps the names of its day)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"meshplan/[a-z_/]+\.py")
READ = ("meshplan", "cards", "skills", "bench", "tests")


def named_paths() -> dict[str, list[str]]:
    """Each meshplan/....py path named anywhere but the history, with the files naming it."""
    found: dict[str, list[str]] = {}
    files = [ROOT / "ARCHITECTURE.md", ROOT / "README.md"]
    for folder in READ:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".yaml", ".md", ".json")]
    for path in files:
        if path.name == "HISTORY.md" or "cards_data" in path.parts:
            continue
        for name in set(NAMED.findall(path.read_text(encoding="utf-8"))):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_named_module_exists():
    named = named_paths()
    assert len(named) > 40  # the scan reads the tree
    missing = {name: where for name, where in named.items() if not (ROOT / name).is_file()}
    assert not missing, missing
