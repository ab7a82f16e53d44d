"""meshplan's one-GPU memory against the CUDA caching allocator's own counters (bench/gpu_steps.py).

The measured figures are bench/data/gpu_h200_raw.json: one H200, torch 2.11, transformers 5.17, verl's FSDP2 step on
one rank (bench/gpu_step_harness.py), 2026-11-30. No GPU is needed here: the test estimates each measured case again
and holds meshplan's allocated peak (and, with expandable segments, its reserved peak) to what the GPU counted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
RAW = ROOT / "bench" / "data" / "gpu_h200_raw.json"


@pytest.fixture(scope="module")
def rows():
    import gpu_steps

    by_name = {case["case"]: case for case in gpu_steps.cases()}
    measured = json.loads(RAW.read_text())["results"]
    return [gpu_steps.row(by_name[m["case"]], m) for m in measured]


def test_every_case_of_the_bench_was_measured(rows):
    import gpu_steps

    names = {(r["case"], r["expandable_segments"]) for r in rows if "error" not in r}
    assert names == {(c["case"], e) for c in gpu_steps.cases() for e in (False, True)}


def test_the_allocated_peak_is_within_2_percent_of_cuda(rows):
    for r in rows:
        assert abs(r["allocated_err_pct"]) <= 2.0, r


def test_the_reserved_peak_with_expandable_segments_is_within_5_percent(rows):
    for r in (r for r in rows if r["expandable_segments"]):
        assert abs(r["reserved_err_pct"]) <= 5.0, r


def test_the_estimate_is_compared_at_the_allocators_own_scope():
    """torch's counters leave out the CUDA context: the row takes it off meshplan's figure, and nothing else."""
    import gpu_steps

    from meshplan.arithmetic.memory_states import memory_card
    from meshplan.estimate.memory import estimate_memory, stage_allocated

    case = gpu_steps.cases()[0]
    fake = {"ok": True, "allocator": "", "params": 1, "model_class": "x", "peak_allocated": 1 << 30,
            "peak_reserved": 1 << 30, "phase_peaks": {}, "params_bytes": 0, "used_at_end": 1 << 31,
            "step_seconds_median": 1.0}
    r = gpu_steps.row(case, fake)
    job, plan = gpu_steps.job_and_plan(case, False)
    stage = estimate_memory(job, plan).stages[0]
    assert r["meshplan_allocated_gib"] * (1 << 30) == stage_allocated(stage) - memory_card().cuda_context_bytes
    assert r["measured_outside_pool_gib"] == 1.0


def test_the_fit_cases_vary_their_packed_lengths_as_token_budget_batches():
    """The GPU's --fit cases (bench/data/gpu_fit_cases.json, what `gpu_steps.py prepare-fit` writes): the cases
    without recompute, each once at `tokens` every step and with steps of different packed lengths, none over
    `tokens` (verl's token-budget micro-batches: about the budget, each a different size), these under FSDP2 and on
    one stream (no FSDP2: every allocation in the default stream's pool, as Megatron's actor update)."""
    import gpu_steps

    written = json.loads((ROOT / "bench" / "data" / "gpu_fit_cases.json").read_text())
    assert written == gpu_steps.fit_cases()
    plain = {c["case"] for c in gpu_steps.cases() if c["policy"] == "none"}
    kinds = ("fixed", "varying", "varying-one-stream")
    assert {c["case"] for c in written} == {f"{n}-{k}" for n in plain for k in kinds}
    for case in written:
        steps = case.get("step_tokens")
        assert (steps is None) == case["case"].endswith("-fixed")
        assert case.get("one_stream", False) == case["case"].endswith("-one-stream")
        if steps:
            assert max(steps) == case["tokens"] and len(set(steps)) == len(steps) > 1
