"""floors._first_rank_gathered: the FSDP/ZeRO-3 gathered units in the first rank's memory floor, as the estimate works
them out (memory_stage.gathered_units: the worst unit's own parameters plus the prefetched one before it) over the
embedding and the first rank's layers. It was the worst unit's own parameters alone, under half the estimate's figure
on Megatron-Core's ZeRO 3: Kimi-K2 TP1 PP2 EP32 DP32, 3.8 GiB against 9.3 GiB."""

from __future__ import annotations

import pytest

from meshplan.estimate.memory import estimate_memory
from meshplan.schema.request import Request
from meshplan.search import search_job
from meshplan.search.floors import _part, first_stage_floor
from meshplan.search.space import Layout, state_preset

GIB = 2**30


def floor_and_report(model: str, gpus: int, lay: Layout, recompute: str):
    job, _ = search_job(Request(model=model, num_gpus=gpus, gpu="h100"))
    preset = state_preset(job, 3, {})
    plan = lay.plan(zero_stage=3, recompute=recompute, micro_batch_size=1, sequence_parallel=lay.tp > 1,
                    cp_comm_type="p2p")
    part = _part(job, lay, 3, *preset, {})
    floor = first_stage_floor(job, lay, 3, recompute, 1, lay.tp > 1, preset)
    return part.gathered, floor, estimate_memory(job, plan).stages[0]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_first_ranks_gathered_units_are_the_estimates(recompute):
    """With pipeline stages after it the first rank's units are the embedding and its layers, the estimate's own: the
    same bytes (a raise of any share would be over them), and the floor stays under the stage's total."""
    lay = Layout(tp=1, pp=2, cp=4, ep=32, etp=1, dp=32, first=30, last=31)
    gathered, floor, stage = floor_and_report("kimi-k2", 256, lay, recompute)
    assert gathered == stage.detail["gathered_layers"]
    assert gathered > 9 * GIB
    assert floor <= stage.total_bytes


def test_a_single_stage_leaves_the_output_layer_out():
    """One stage also gathers the output layer after its last layer, which the floor leaves out: at most the
    estimate's figure."""
    lay = Layout(tp=1, pp=1, cp=2, ep=32, etp=1, dp=1024)
    gathered, floor, stage = floor_and_report("deepseek-v3", 2048, lay, "none")
    assert 0 < gathered <= stage.detail["gathered_layers"]
    assert floor <= stage.total_bytes
