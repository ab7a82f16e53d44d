"""bench/data/held_out_probe: the published runs kept out of the dev set (bench/README.md, "held out") are scored
only if every row becomes a request the rules accept, and their transcription is checked against itself: where a
source gives both model TFLOP/s and tokens/s, the FLOPs per token they imply is meshplan's count, within what the
source's own formula adds (NeMo 2.0 counts attention without the causal halving: +12.5% for an 8B model at 8K).

A test of the bench itself: it imports the bench's modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.arithmetic.flops import model_flops_per_token
from meshplan.request.resolve import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_rows as prow
import production_scoring as pscore

FOLDER = Path(__file__).resolve().parent.parent / "bench" / "data" / "held_out_probe"


@pytest.fixture(scope="module")
def run():
    return pscore.run(FOLDER)


def test_every_held_out_row_maps_without_rule_errors(run):
    rows, scores, summary = run
    assert len(rows) >= 20 and summary.mapped == summary.total == len(rows)
    assert not [s.mapping.row_id for s in scores if s.rule_errors or s.refused]


def test_published_tflops_and_tokens_agree_with_the_model(run):
    rows, scores, _ = run
    both = [(r, s) for r, s in zip(rows, scores, strict=True)
            if r["outcome"]["tflops_per_gpu"] and r["outcome"]["tokens_per_sec_per_gpu"]]
    assert len(both) >= 10
    for row, score in both:
        job, _ = resolve(score.mapping.request)
        implied = row["outcome"]["tflops_per_gpu"] * 1e12 / row["outcome"]["tokens_per_sec_per_gpu"]
        assert 0.97 < implied / model_flops_per_token(job.model, job.seq_length) < 1.13, row["id"]
    assert prow.DATA_NAME == "production_configs_dev.yaml"
