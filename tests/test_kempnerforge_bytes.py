"""bench/data/kempnerforge_memory holds the measured runs of KempnerForge's own config validation report.

Part of it tests the bench: it imports the bench's modules (production_mapping, production_scoring)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_scoring as pscore

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "kempnerforge_memory"


def test_validation_runs_map_with_their_sources():
    """Every row of bench/data/kempnerforge_memory maps with every stated setting, cites the report's file and commit,
    and is compared as KempnerForge logs it: max_memory_allocated over the run (steady)."""
    rows, scores, summary = pscore.run(DATA)
    assert summary.mapped == len(rows) == len(scores) == 5
    for row, score in zip(rows, scores, strict=True):
        source = row["source"]
        assert source["commit"] and source["file"] and source["file"] in source["url"], row["id"]
        assert score.refused is None and not score.rule_errors and score.peak_error is not None, row["id"]
        assert (score.convention, score.moment) == ("allocated", "steady"), row["id"]


def test_a_row_that_ran_without_compile_is_scored_without(tmp_path):
    """KempnerForge compiles by default (train.compile_model); the report's PP run set it false, and says so."""
    rows, _, _ = pscore.run(DATA)
    compiled: dict[bool, set] = {True: set(), False: set()}
    for r in rows:
        stated = "without torch.compile" not in r["outcome"]["other"]
        compiled[stated].add(pmap.map_row(r, tmp_path).request.torch_compile)
    assert compiled == {True: {True}, False: {False}}
