"""Whole answers of `recommend` on a fixed set of requests, written to a folder or compared byte for byte with one:
the check a constant-factor speed change (same arithmetic, same order) must pass before its instruction count is read
(bench/instruction_counts.py). The requests: recommend_speed.py's CASES, 12 of the oracle test's sampled requests and
8 of its requests that fix knobs (tests/test_search_oracle.py's samplers, one home), 31 in all; each answer is its
model_dump_json, or the error's text where the request is refused.

    python bench/answer_snapshot.py write DIR      # on the unmodified tree
    python bench/answer_snapshot.py compare DIR    # after the change: names every answer that moved; exit 1 if any
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from recommend_speed import CASES  # noqa: E402
from test_search_oracle import sampled_fixed_request, sampled_request  # noqa: E402

from meshplan import api  # noqa: E402
from meshplan.core.errors import MeshplanError  # noqa: E402
from meshplan.schema.request import Request  # noqa: E402


def requests() -> list[tuple[str, Callable[[], object]]]:
    """(file name, the call) of each request, in a fixed order."""
    calls: list[tuple[str, Callable[[], object]]] = [(f"case{i}", call) for i, (_, call, _) in enumerate(CASES)]
    sampled = [sampled_request(seed)[0] for seed in range(12)]
    fixed = [sampled_fixed_request(seed)[0] for seed in range(8)]
    calls += [(f"sampled{seed}", partial(api.recommend, req)) for seed, req in enumerate(sampled)]
    calls += [(f"fixed{seed}", partial(recommend_fields, fields)) for seed, fields in enumerate(fixed)]
    return calls


def recommend_fields(fields: dict) -> object:
    """recommend for a request given as its fields (the fixed-knob sampler's), built when asked."""
    return api.recommend(Request(**fields))


def answer(call: Callable[[], object]) -> str:
    """The answer's JSON, or the refusal's text."""
    try:
        return call().model_dump_json()  # type: ignore[attr-defined]
    except MeshplanError as error:
        return f"refused: {error}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("write", "compare"))
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    moved = []
    if args.mode == "write":
        args.folder.mkdir(parents=True, exist_ok=True)
    for name, call in requests():
        path = args.folder / f"{name}.json"
        text = answer(call)
        if args.mode == "write":
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            moved.append(name)
    if args.mode == "compare":
        print("identical" if not moved else f"moved: {', '.join(moved)}")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
