"""The tree under test, for every process a test starts: a test that runs `meshplan`, its MCP server or any code
importing meshplan in a subprocess must test this checkout, not wherever the package is installed (an editable install
of another clone, a wheel). Each such process gets its environment through `tree_env`, which puts this tree first on
PYTHONPATH (a host's near-empty environment stays near-empty: PYTHONPATH alone is added)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TREE = str(Path(__file__).resolve().parents[1])  # the checkout whose tests/ this is


def tree_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's own environment when None) with TREE first on PYTHONPATH, the rest of it kept after."""
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH")
    out["PYTHONPATH"] = TREE + (os.pathsep + rest if rest else "")
    return out
