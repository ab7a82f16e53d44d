"""The figures each `differs_from_search` note of cards/strategies.yaml gives (its `gap`: the recipe's step with best
knobs, the search's pick and its step) still hold: the bench's own evaluation (bench/recipes_agreement.py evaluate) is
rerun on every explained row, and a changed pick or a step more than GAP_TOLERANCE away fails here, so the notes the
skill pages show cannot go stale. Before, they were written by hand on 2026-11-25 and went on naming DeepSeek-V3's
pick as TP8 PP1 EP256 ETP2 (~4.5 s) after the search had moved to TP2 PP4 VPP8 CP2 EP64 (4.20 s). A test of the
bench too: it imports the bench's module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.knowledge.tables import RecipeGap

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import recipes_agreement as ra

EXPLAINED = [(name, recipe, differs) for name, recipe, differs in ra.recipes() if differs is not None]


def test_every_explained_row_records_the_gap_it_was_written_from():
    assert EXPLAINED
    assert not [name for name, _, differs in EXPLAINED if differs.gap is None]


@pytest.mark.parametrize("name, recipe, differs", EXPLAINED, ids=[name for name, _, _ in EXPLAINED])
def test_each_recorded_gap_holds_today(name, recipe, differs):
    row = ra.evaluate(name, recipe)
    assert ra.verdict(row, True) == "explained", f"{name} now agrees: drop its differs_from_search"
    moved = ra.gap_moved(differs.gap, ra.gap_of(row, differs.gap.derived))
    assert moved is None, f"{name}: {moved}; rerun bench/recipes_agreement.py --gaps and rewrite its note"


def test_a_moved_pick_or_step_is_caught():
    was = RecipeGap(derived="2026-12-07", recipe_s=8.51, pick="TP2 PP4 VPP8 CP2 EP64 DP64", pick_s=4.20)
    assert ra.gap_moved(was, was) is None
    assert ra.gap_moved(was, was.model_copy(update={"pick_s": 4.30})) is None  # within 5%
    assert "pick is TP8" in ra.gap_moved(was, was.model_copy(update={"pick": "TP8 PP1 EP256 ETP2 DP128"}))
    assert "recipe takes 9.70 s" in ra.gap_moved(was, was.model_copy(update={"recipe_s": 9.70}))
    assert ra.gap_moved(was, None) is not None
