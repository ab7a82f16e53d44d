"""Whole answers of `recommend` on a fixed set of requests, written to a folder or compared byte for byte with one:
the check a constant-factor speed change (same arithmetic, same order) must pass before its instruction count is read
(bench/instruction_counts.py). The requests: recommend_speed.py's CASES, 12 of the oracle test's sampled requests and
8 of its requests that fix knobs (tests/test_search_oracle.py's samplers, one home), 31 in all; each answer is its
model_dump_json, or the error's text where the request is refused.

    python bench/answer_snapshot.py write DIR      # on the unmodified tree
    python bench/answer_snapshot.py compare DIR    # after the change: names every answer that moved; exit 1 if any
    python bench/answer_snapshot.py compare DIR --answers   # the same, less what the search's own work tallies

`--answers` is the check for a change that makes the search do less work with the same answers: it compares each
answer with the search's tallies of its own work left out (`evaluated`, and the rationale's "evaluated N memory and
M throughput estimates"), and the rejected counts with MEM001 and the SEARCH-* buckets summed into one figure, since
a layout a cheaper bound drops unopened moves from the memory error to SEARCH-SLOWER (or back) without the space, the
ranked rows or any other rule's count changing. Everything else (candidates, plans, numbers, `considered`, every
other rule's count, every other word) must match byte for byte.
"""

from __future__ import annotations

import argparse
import json
import re
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


SEARCH_WORK_WORDS = re.compile(r"evaluated [0-9,]+ memory and [0-9,]+ throughput estimates")
SEARCH_BUCKETS = "search buckets and MEM001"


def without_search_work(node: object) -> object:
    """An answer's JSON with what counts the search's own work taken out (`--answers`; the module's docstring)."""
    if isinstance(node, dict):
        kept = {key: without_search_work(value) for key, value in node.items() if key != "evaluated"}
        if isinstance(node.get("rejected"), dict):
            rejected = node["rejected"]
            moving = [rule for rule in rejected if rule == "MEM001" or rule.startswith("SEARCH-")]
            kept["rejected"] = {rule: count for rule, count in rejected.items() if rule not in moving}
            kept["rejected"][SEARCH_BUCKETS] = sum(rejected[rule] for rule in moving)
        return kept
    if isinstance(node, list):
        return [without_search_work(item) for item in node]
    if isinstance(node, str):
        return SEARCH_WORK_WORDS.sub("evaluated (the search's work)", node)
    return node


def same_answer(before: str, after: str, answers_only: bool) -> bool:
    """Byte for byte, or with `answers_only` the same once what counts the search's work is taken out."""
    if before == after:
        return True
    if not answers_only or before.startswith("refused: ") or after.startswith("refused: "):
        return False
    return without_search_work(json.loads(before)) == without_search_work(json.loads(after))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("write", "compare"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--answers", action="store_true",
                        help="compare the answers less the search's tallies of its own work (module docstring)")
    args = parser.parse_args()
    moved = []
    if args.mode == "write":
        args.folder.mkdir(parents=True, exist_ok=True)
    for name, call in requests():
        path = args.folder / f"{name}.json"
        text = answer(call)
        if args.mode == "write":
            path.write_text(text)
        elif not path.exists() or not same_answer(path.read_text(), text, args.answers):
            moved.append(name)
    if args.mode == "compare":
        print("identical" if not moved else f"moved: {', '.join(moved)}")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
