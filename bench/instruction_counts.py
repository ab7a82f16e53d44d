"""Instructions one `recommend` or `min-gpus` executes, counted by valgrind's callgrind: a figure that does not move
with the machine's load, so two trees compare on a busy 2-core machine where wall time varies by 10-50% run to run
(issue 23's speed targets are seconds; README.md converts with the seconds per instruction of an idle run).

Each case runs twice under callgrind with PYTHONHASHSEED=0: the imports, a warm-up recommend (Llama-3.1-8B on 8 H100)
and the case asked `asks` times, and the same with the case asked `asks - 1` times; the difference is one ask. With
--first the case is asked once after the warm-up (its first ask, what a CLI call pays); without, twice (warm: its
job's kept verdicts and replays already there). Needs valgrind on PATH; prints a markdown table.

    python bench/instruction_counts.py [--first] [case ...]     cases: llama dsv3 kimi grpo mkimi bridge
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

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "llama": "Request(model='llama-3.1-70b', num_gpus=64, gpu='h100')",
    "dsv3": "Request(model='deepseek-v3', num_gpus=2048, gpu='h100')",
    "kimi": "Request(model='kimi-k2', num_gpus=256, gpu='h100')",
    "grpo": "Request(model='qwen3-30b-a3b', num_gpus=16, framework='verl', job='rl', algorithm='grpo', gpu='h100')",
    "bridge": "Request(model='deepseek-v3', num_gpus=1024, framework='megatron-bridge', seq_length=4096, "
              "global_batch_size=4096, gpu='h100')",
    "mkimi": "Request(model='kimi-k2', gpu='h100')",
}
PROGRAM = """
from meshplan import api
from meshplan.schema.request import Request
api.recommend(Request(model='llama-3.1-8b', num_gpus=8, gpu='h100'))
req = {request}
for _ in range({asks}):
    api.{call}(req)
"""


def instructions(case: str, asks: int) -> int:
    """Instructions of the whole program asking the case `asks` times (callgrind's total)."""
    call = "minimum_gpus" if case == "mkimi" else "recommend"
    code = PROGRAM.format(request=CASES[case], asks=asks, call=call)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", code],
                       cwd=tmp, env=env, check=True, capture_output=True)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise SystemExit(f"callgrind wrote no total for {case}")
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["llama", "dsv3", "kimi"], choices=list(CASES))
    parser.add_argument("--first", action="store_true", help="count the case's first ask instead of a warm one")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: install it (apt-get install valgrind) to count instructions.")
    asks = 1 if args.first else 2
    print(f"| case | instructions, one {'first' if args.first else 'warm'} ask |")
    print("|---|---|")
    for case in args.cases:
        one = instructions(case, asks) - instructions(case, asks - 1)
        print(f"| {case} | {one / 1e9:.3f} G |")


if __name__ == "__main__":
    main()
