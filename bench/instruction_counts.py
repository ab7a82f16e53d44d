"""Instructions one `recommend` or `min-gpus` executes, counted by valgrind's callgrind: a figure that does not move
with the machine's load, so two trees compare on a busy 2-core machine where wall time varies by 10-50% run to run
(issue 23's speed targets are seconds; README.md converts with the seconds per instruction of an idle run).

The cases and the warm-up are recommend_speed.py's (CASES, WARM_UP). Each case runs twice under callgrind with
PYTHONHASHSEED=0: the imports, the warm-up and the case asked `asks` times, and the same with it asked `asks - 1`
times; the difference is one ask. With --first the case is asked once after the warm-up (its first ask, what a CLI
call pays); without, twice (warm: its job's kept verdicts and replays already there). The run that asks no case (the
imports and the warm-up alone, --first's second run) is the same program for every case, so it runs once per call of
this script (on the loaded 2-core machine one callgrind run takes most of an hour). Needs valgrind on PATH.

    python bench/instruction_counts.py [--first] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from recommend_speed import CASES

BENCH = Path(__file__).resolve().parent
CHILD = """
import sys
sys.path.insert(0, {bench!r})
from recommend_speed import CASES, WARM_UP
from meshplan import api
api.recommend(WARM_UP)
for _ in range({asks}):
    CASES[{index}][1]()
"""


def instructions(index: int, asks: int) -> int:
    """Instructions of the whole program asking case `index` `asks` times (callgrind's total)."""
    code = CHILD.format(bench=str(BENCH), asks=asks, index=index)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(BENCH.parent)}
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", code],
                       cwd=tmp, env=env, check=True, capture_output=True)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise SystemExit(f"callgrind wrote no total for {CASES[index][0]}")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", action="store_true", help="count each case's first ask instead of a warm one")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: install it (apt-get install valgrind) to count instructions.")
    asks = 1 if args.first else 2
    print(f"| case | instructions, one {'first' if args.first else 'warm'} ask |")
    print("|---|---|")
    no_ask: list[int] = []  # the imports and the warm-up alone (the same program whatever the index): counted once
    for index, (name, _, _) in enumerate(CASES):
        if args.only in name:
            if asks - 1 == 0 and not no_ask:
                no_ask.append(instructions(0, 0))
            before = no_ask[0] if asks - 1 == 0 else instructions(index, asks - 1)
            one = instructions(index, asks) - before
            print(f"| {name} | {one / 1e9:.3f} G |")


if __name__ == "__main__":
    main()
