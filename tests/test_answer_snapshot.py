"""bench/answer_snapshot.py's `--answers` compare: what a search's own work tallies may move, nothing else may."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from answer_snapshot import same_answer

BEFORE = {
    "considered": 18,
    "rejected": {"MEM001": 5, "SEARCH-SLOWER": 10, "PP001": 3},
    "evaluated": 7,
    "rationale": "Searched 18 layouts, evaluated 72 memory and 652 throughput estimates, and ranked #1: TP2",
}


def _moved(**fields: object) -> str:
    return json.dumps({**BEFORE, **fields})


def test_the_search_work_may_move():
    """Fewer estimates, and layouts moved between MEM001 and SEARCH-SLOWER: the same answer less its tallies."""
    after = _moved(rejected={"MEM001": 2, "SEARCH-SLOWER": 13, "PP001": 3}, evaluated=9,
                   rationale="Searched 18 layouts, evaluated 1 memory and 2 throughput estimates, and ranked #1: TP2")
    assert same_answer(json.dumps(BEFORE), after, answers_only=True)
    assert not same_answer(json.dumps(BEFORE), after, answers_only=False)


def test_anything_else_may_not():
    """Another rule's count, the space, the buckets' sum or a word of the answer: moved, with or without --answers."""
    for after in (_moved(rejected={"MEM001": 5, "SEARCH-SLOWER": 10, "PP001": 4}),
                  _moved(rejected={"MEM001": 5, "SEARCH-SLOWER": 11, "PP001": 3}),
                  _moved(considered=19),
                  _moved(rationale=BEFORE["rationale"].replace("TP2", "TP4"))):
        assert not same_answer(json.dumps(BEFORE), after, answers_only=True)
    assert not same_answer("refused: TP001 ...", json.dumps(BEFORE), answers_only=True)
