"""bench/data/kempnerforge_weak_scaling holds KempnerForge's weak-scaling runs to 160 H200
(benchmarks/weak_scaling_160gpu/README.md at git 3ad9d9a): 11 measured runs of a 13B and a 70B at TP=4 inside a node
and FSDP across 2 to 40 nodes, held out of every fit. Each row must map with every stated setting and cite the report,
and its own figures must agree with each other (the job's tokens per step over its step time and GPUs is the tokens/s
the row states)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_scoring as pscore

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "kempnerforge_weak_scaling"


def rows() -> list[dict]:
    return yaml.safe_load((DATA / "production_configs_dev.yaml").read_text())


def test_every_run_maps_with_its_source():
    scored, scores, summary = pscore.run(DATA)
    assert summary.mapped == len(scored) == len(scores) == 11
    for row, score in zip(scored, scores, strict=True):
        source = row["source"]
        assert source["commit"] and source["file"] in source["url"], row["id"]
        assert "weak_scaling_160gpu" in source["file"], row["id"]
        assert score.refused is None and not score.rule_errors and score.peak_error is not None, row["id"]
        assert score.predicted_tps and score.measured_tps, row["id"]
        assert (score.convention, score.moment) == ("allocated", "steady"), row["id"]


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["id"])
def test_a_rows_tokens_step_time_and_gpus_agree(row):
    """tokens_per_step / (step_time_s x GPUs) is the stated tokens/s per GPU, within the report's rounding of the step
    time (two decimals), and the data-parallel size is the GPUs over TP=4."""
    w, out, par = row["workload"], row["outcome"], row["parallelism"]
    assert (par["tp"], par["dp"] * 4) == (4, row["hardware"]["num_gpus"])
    assert w["tokens_per_step"] == w["micro_batch_size"] * w["grad_accum_steps"] * par["dp"] * 4096
    implied = w["tokens_per_step"] / (out["step_time_s"] * row["hardware"]["num_gpus"])
    assert implied == pytest.approx(out["tokens_per_sec_per_gpu"], rel=0.01)


def test_every_run_is_compiled_on_4_gpu_nodes(tmp_path):
    """weak_scaling_160gpu_bench.sh sets train.compile_model=true on every run; the nodes hold 4 H200 each."""
    assert all(pmap.map_row(r, tmp_path).request.torch_compile for r in rows())
    assert {r["hardware"]["gpus_per_node"] for r in rows()} == {4}
