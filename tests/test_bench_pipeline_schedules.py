"""bench/pipeline_schedules.py: measured schedule gains against meshplan's. Every pair of its data file carries its
provenance and two sides meshplan can parse; the gain is the ratio of the api's own throughputs; rows of the dev
schema that differ only in vpp are found by their fields, whatever their ids. A test of the bench: it imports it."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import pipeline_schedules as ps
import production_rows as prow

from meshplan import api


def test_every_pair_names_its_source_and_has_two_parseable_sides():
    doc = yaml.safe_load(ps.DATA.read_text(encoding="utf-8"))
    for raw in doc["pairs"]:
        assert {"url", "table", "date", "read"} <= set(raw["source"]), raw["id"]
        assert raw["source"]["url"].startswith("https://"), raw["id"]
        assert raw["strength"] and raw["metric"], raw["id"]
    pairs = ps.data_pairs()
    assert len(pairs) == len(doc["pairs"]) >= 3
    for p in pairs:
        assert len(p.sides) == 2 and all(s.request is not None and s.refused is None for s in p.sides), p.id
        a, b = (s.request for s in p.sides)
        differs = {k for k in type(a).model_fields if getattr(a, k) != getattr(b, k)}
        assert differs and differs <= {"vpp", "pipeline_schedule", *ps.SPLIT_FIELDS}, (p.id, differs)


def _pair(tmp_path: Path, measured: tuple[float, float]) -> ps.Pair:
    doc = {"pairs": [{
        "id": "unseen-pair", "title": "an unseen schedule A/B", "strength": "test", "metric": "tokens/s per GPU",
        "source": {"url": "https://example.org/table", "table": "T1", "date": "2030", "read": "2030"},
        "request": {"model": "llama-3.1-8b", "gpu": "h100", "num_gpus": 16, "tp": 2, "pp": 4, "dp": 2,
                    "global_batch_size": 32, "micro_batch_size": 1, "framework": "megatron-core"},
        "sides": [{"label": "1F1B", "request": {"vpp": 1}, "measured": measured[0]},
                  {"label": "interleaved", "request": {"vpp": 2}, "measured": measured[1]}]}]}
    path = tmp_path / "pairs.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    (pair,) = ps.data_pairs(path)
    for side in pair.sides:
        ps.estimate(side)
    return pair


def test_the_gain_is_the_ratio_of_the_api_throughputs(tmp_path):
    pair = _pair(tmp_path, (100.0, 110.0))
    a, b = (api.estimate_throughput(s.request) for s in pair.sides)
    assert pair.measured_gain == pytest.approx(0.10)
    assert pair.predicted_gain == pytest.approx(b.tokens_per_s_per_gpu / a.tokens_per_s_per_gpu - 1)
    assert pair.gain_error_pp == pytest.approx(100 * (pair.predicted_gain - 0.10))
    first, second = pair.sides
    assert first.microbatches == second.microbatches == 16  # 32 sequences over dp 2 at micro-batch 1
    assert first.timeline.startswith("Pipeline schedule") and "interleaved" in second.timeline
    assert second.bubble_s < first.bubble_s  # two chunks per rank: the same micro-batches leave less idle
    assert "unseen-pair" in ps.table([pair])


def test_a_side_meshplan_refuses_is_reported_not_raised(tmp_path):
    pair = _pair(tmp_path, (100.0, 110.0))
    pair.sides[1].request = pair.sides[1].request.model_copy(update={"tp": 3})
    pair.sides[1].predicted = None
    ps.estimate(pair.sides[1])
    assert pair.sides[1].refused and pair.predicted_gain is None and pair.gain_error_pp is None
    assert "refused" in ps.table([pair])


@pytest.mark.shared_data(prow.DEFAULT_VALIDATION / prow.DATA_NAME)
def test_dev_rows_differing_only_in_vpp_are_paired_by_their_fields(production_rows, tmp_path):
    template = next(r for r in production_rows.values() if (r["parallelism"]["pp"] or 1) > 1
                    and r["outcome"]["tokens_per_sec_per_gpu"])
    rows = []
    for i, (vpp, tps) in enumerate(((None, 100.0), ("2 (interleaved)", 120.0))):
        row = copy.deepcopy(template)
        row |= {"id": f"unseen_{i}", "name": f"unseen run {i}"}
        row["parallelism"] = dict(row["parallelism"], vpp=vpp)
        row["outcome"] = dict(row["outcome"], tokens_per_sec_per_gpu=tps)
        row["source"] = dict(row["source"], citation=f"example-org/repo run {i}")
        rows.append(row)
    other = copy.deepcopy(rows[1]) | {"id": "unseen_other"}
    other["workload"] = dict(other["workload"], seq_length=(other["workload"]["seq_length"] or 4096) * 2)
    found = ps.row_pairs([*rows, other])
    assert [(a["id"], b["id"], m) for a, b, m in found] == [("unseen_0", "unseen_1",
                                                             ("tokens_per_sec_per_gpu", 100.0, 120.0))]
    (tmp_path / prow.DATA_NAME).write_text(yaml.safe_dump([*rows, other]), encoding="utf-8")
    (pair,) = ps.shared_pairs(tmp_path)
    assert pair.measured_gain == pytest.approx(0.2)
    assert all(s.request is not None or s.refused for s in pair.sides)
