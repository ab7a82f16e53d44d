"""The seed groups' DP bounds (search/grid_syncs.py): kept per what the cost model's estimators read of a grid, so grids
that differ only in how their data ranks split between DP and CP share one, and each shared one is the very
StageSync its own grid gives (the per-grid bounds, bounds.first_rank_sync and sharding_per_micro); its chunk-free
parts (StageParts) worked out once for every chunk count asked."""

from __future__ import annotations

import pytest

import meshplan.search.bounds as search_bounds
import meshplan.search.grid_syncs as grid_syncs
from meshplan.estimate.sync_floor import StageSync, SyncFloor
from meshplan.schema.request import Request
from meshplan.search import recommend

JOBS = [Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100"),
        Request(model="llama-3.1-8b", num_gpus=16, framework="torchtitan", gpu="h100", global_batch_size=64),
        Request(model="qwen3-30b-a3b", num_gpus=16, framework="megatron-core", gpu="h100", seq_length=32768)]


def direct(bounds, lay, zero, least, vpp=1) -> StageSync:
    """The StageSync of this very grid from the search's per-grid bounds (first_rank_sync at the chunk count, and
    sharding_per_micro), no floor where its seconds are not positive: what grid_stage_sync must equal."""
    floor = None if least is None else bounds.first_rank_sync(lay, zero, least, vpp)
    if floor is None or floor.seconds <= 0.0:
        floor = SyncFloor()
    return StageSync(bounds.sharding_per_micro(lay, zero), floor.seconds, floor.hidden)


@pytest.mark.parametrize("req", JOBS, ids=lambda r: f"{r.model}-{r.framework}")
def test_a_grid_stage_sync_is_its_own_grids_and_shared_by_grids_alike(req, monkeypatch):
    """Every StageSync group_syncs reads equals the one worked out for its own grid at its own chunk count, and some
    are shared (fewer chunk-free parts worked out than stage syncs asked at distinct chunk counts: before
    grid_syncs.py each grid worked out its own, and before StageParts each chunk count its own)."""
    asked: set = set()
    worked = 0
    kept = grid_syncs.grid_stage_sync
    parts = grid_syncs.stage_parts

    def counted(*args):
        nonlocal worked
        worked += 1
        return parts(*args)

    def checked(bounds, lay, zero, least, vpp=1):
        asked.add((lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero, least, vpp))
        stage = kept(bounds, lay, zero, least, vpp)
        assert stage == direct(bounds, lay, zero, least, vpp), (lay, zero, vpp)
        return stage

    monkeypatch.setattr(grid_syncs, "stage_parts", counted)
    monkeypatch.setattr(search_bounds, "grid_stage_sync", checked)
    recommend(req)
    assert asked
    assert worked < len(asked), f"{worked} parts worked out for {len(asked)} distinct stage syncs: none shared"


def test_what_a_grid_stage_sync_reads_is_worked_out_once_per_grid_stage_and_first_rank(monkeypatch):
    """A seed group's layouts of fewer virtual chunks than its most ask their grid's StageSync again at their own chunk
    count (bounds.grid_stage_keys): what it reads of the grid (its DP groups, replicas and sharding schedule) is kept
    per grid, ZeRO stage and first rank, not asked again at each chunk count (before, some 4,000 of DeepSeek-V3/2,048's
    6,400 asks asked them again)."""
    req = JOBS[0]
    asked: list = []
    kept = grid_syncs._schedule

    def counted(bounds, lay, zero):
        asked.append((lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero))
        return kept(bounds, lay, zero)

    grids: dict = {}  # per bounds memo (the request's job's, and any other job its answer searches) and its keys
    stage_sync = grid_syncs.grid_stage_sync

    def noted(bounds, lay, zero, least, vpp=1):
        grid = (id(bounds.bounds_memo), lay.tp, lay.cp, lay.dp, lay.pp, lay.ep, lay.etp, zero, least)
        grids.setdefault(grid, set()).add(vpp)
        return stage_sync(bounds, lay, zero, least, vpp)

    monkeypatch.setattr(grid_syncs, "_schedule", counted)
    monkeypatch.setattr(search_bounds, "grid_stage_sync", noted)
    recommend(req)
    assert any(len(vpps) > 1 for vpps in grids.values()), "no grid asked at two chunk counts: nothing to hold"
    assert len(asked) <= len(grids), f"{len(asked)} schedules asked for {len(grids)} (grid, ZeRO stage, first rank)"
