"""The tree under test, for every process a test starts: a test that runs `meshplan`, its MCP server or any code
importing meshplan in a subprocess must run the code the test process itself imports (this checkout under
PYTHONPATH=$PWD, or its editable install), not whatever a bare environment finds installed (another clone's editable
install, a wheel): the faces compared must be one code. Each such process gets its environment through `tree_env`,
which puts that tree first on PYTHONPATH (a host's near-empty environment stays near-empty: PYTHONPATH alone is
added)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import meshplan

# The folder holding the meshplan package this process imports: the checkout (a wheel's site-packages, installed so)
TREE = str(Path(meshplan.__file__).resolve().parents[1])


def tree_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's own environment when None) with TREE first on PYTHONPATH, the rest of it kept after."""
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH")
    out["PYTHONPATH"] = TREE + (os.pathsep + rest if rest else "")
    return out
