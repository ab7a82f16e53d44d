"""Time `meshplan <command> --batch` over JSON lines, the way a sweep script calls it (process start included)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def time_batch(command: str, lines: list[str]) -> tuple[list[dict], float]:
    """The parsed output lines and the wall time of one `meshplan COMMAND --batch FILE` run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.jsonl"
        path.write_text("\n".join(lines) + "\n")
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "meshplan.cli", command, "--batch", str(path)],
                             capture_output=True, text=True, check=True).stdout
        elapsed = time.perf_counter() - start
    return [json.loads(line) for line in out.splitlines()], elapsed
