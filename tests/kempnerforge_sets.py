"""KempnerForge's held-out benchmark sets under bench/data (kempnerforge_mfu_scaling, kempnerforge_weak_scaling):
their rows, and the two checks each set's tests hold every row to (tests/test_kempnerforge_mfu_scaling.py,
tests/test_kempnerforge_weak_scaling.py): each run maps with every stated setting and cites its report, and its own
figures agree with each other."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import production_mapping as pmap  # noqa: E402
import production_scoring as pscore  # noqa: E402

__all__ = ["pmap", "rows", "runs_map_with_their_source", "tokens_step_time_and_gpus_agree"]


def data(name: str) -> Path:
    return BENCH / "data" / name


def rows(name: str) -> list[dict]:
    """The set's rows, as bench/data/<name>/production_configs_dev.yaml holds them."""
    return yaml.safe_load((data(name) / "production_configs_dev.yaml").read_text())


def runs_map_with_their_source(name: str, count: int, report: str) -> None:
    """Every one of the set's `count` rows maps and is scored (no refusal, no rule error; a peak and tokens/s on both
    sides, allocated at steady state) and cites a commit and a file of its url whose path names `report`."""
    scored, scores, summary = pscore.run(data(name))
    assert summary.mapped == len(scored) == len(scores) == count
    for row, score in zip(scored, scores, strict=True):
        source = row["source"]
        assert source["commit"] and source["file"] in source["url"], row["id"]
        assert report in source["file"], row["id"]
        assert score.refused is None and not score.rule_errors and score.peak_error is not None, row["id"]
        assert score.predicted_tps and score.measured_tps, row["id"]
        assert (score.convention, score.moment) == ("allocated", "steady"), row["id"]


def tokens_step_time_and_gpus_agree(row: dict) -> None:
    """tokens_per_step / (step_time_s x GPUs) is the row's stated tokens/s per GPU, within the report's rounding of
    the step time (two decimals), and tokens_per_step is micro-batch x accumulation x DP x the 4,096-token sequence."""
    w, out = row["workload"], row["outcome"]
    assert w["tokens_per_step"] == w["micro_batch_size"] * w["grad_accum_steps"] * row["parallelism"]["dp"] * 4096
    implied = w["tokens_per_step"] / (out["step_time_s"] * row["hardware"]["num_gpus"])
    assert implied == pytest.approx(out["tokens_per_sec_per_gpu"], rel=0.01)
