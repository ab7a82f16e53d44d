"""bench/data/kempnerforge_mfu_scaling holds KempnerForge's MFU scaling runs (benchmarks/mfu_scaling/mfu_scaling.md):
14 measured runs on 8 nodes of 4 H200, one to 32 GPUs, FSDP alone, TP alone and TP + FSDP, held out of every fit.
Each row must map with every stated setting and cite the report, and its own figures must agree with each other
(the job's tokens per step over its step time and GPUs is the tokens/s the row states)."""

from __future__ import annotations

import pytest
from kempnerforge_sets import pmap, runs_map_with_their_source, tokens_step_time_and_gpus_agree
from kempnerforge_sets import rows as set_rows

SET = "kempnerforge_mfu_scaling"


def rows() -> list[dict]:
    return set_rows(SET)


def test_every_run_maps_with_its_source():
    runs_map_with_their_source(SET, 14, "mfu_scaling")


@pytest.mark.parametrize("row", rows(), ids=lambda r: r["id"])
def test_a_rows_tokens_step_time_and_gpus_agree(row):
    """tokens_per_step / (step_time_s x GPUs) is the stated tokens/s per GPU, within the report's rounding of the step
    time (two decimals)."""
    tokens_step_time_and_gpus_agree(row)


def test_the_run_without_compile_is_scored_without(tmp_path):
    compiled = {r["id"]: pmap.map_row(r, tmp_path).request.torch_compile for r in rows()}
    assert [k for k, v in compiled.items() if not v] == ["kempnerforge_mfu_08_13b_8gpu_fsdp8"]


def test_every_run_states_its_4_gpu_node():
    """The report's nodes hold 4 H200 each; rows 1-3 ran on one node with 1 or 2 of them (mfu_bench.sh torchrun
    --nproc_per_node), so their node is 4 GPUs too: a TP2 or FSDP2 pair there is two GPUs of a 4-GPU board, joined by
    their own NVLinks only (cards/hardware.yaml point_to_point_node), not a 2-GPU node of its own."""
    assert {r["hardware"]["gpus_per_node"] for r in rows()} == {4}
