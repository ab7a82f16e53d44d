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
        proc = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", command, "--batch", str(path)],
                              capture_output=True, text=True)
        elapsed = time.perf_counter() - start
    # Exit 1: a check found an error; 2: a line failed. Both still answer every line, in order.
    if proc.returncode not in (0, 1, 2):
        raise RuntimeError(f"meshplan {command} --batch exited {proc.returncode}: {proc.stderr[-2000:]}")
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["line"] for r in results] == list(range(1, len(lines) + 1)), "one output line per input line"
    return results, elapsed
