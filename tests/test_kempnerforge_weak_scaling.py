"""bench/data/kempnerforge_weak_scaling holds KempnerForge's weak-scaling runs to 160 H200
(benchmarks/weak_scaling_160gpu/README.md at git 3ad9d9a): 11 measured runs of a 13B and a 70B at TP=4 inside a node
and FSDP across 2 to 40 nodes, held out of every fit. Each row must map with every stated setting and cite the report,
and its own figures must agree with each other (the job's tokens per step over its step time and GPUs is the tokens/s
the row states)."""

from __future__ import annotations

import pytest
from kempnerforge_sets import pmap, runs_map_with_their_source, tokens_step_time_and_gpus_agree
from kempnerforge_sets import rows as set_rows

SET = "kempnerforge_weak_scaling"


def rows() -> list[dict]:
    return set_rows(SET)


def test_every_run_maps_with_its_source():
    runs_map_with_their_source(SET, 11, "weak_scaling_160gpu")


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["id"])
def test_a_rows_tokens_step_time_and_gpus_agree(row):
    """tokens_per_step / (step_time_s x GPUs) is the stated tokens/s per GPU, within the report's rounding of the step
    time (two decimals), and the data-parallel size is the GPUs over TP=4."""
    par = row["parallelism"]
    assert (par["tp"], par["dp"] * 4) == (4, row["hardware"]["num_gpus"])
    tokens_step_time_and_gpus_agree(row)


def test_every_run_is_compiled_on_4_gpu_nodes(tmp_path):
    """weak_scaling_160gpu_bench.sh sets train.compile_model=true on every run; the nodes hold 4 H200 each."""
    assert all(pmap.map_row(r, tmp_path).request.torch_compile for r in rows())
    assert {r["hardware"]["gpus_per_node"] for r in rows()} == {4}
