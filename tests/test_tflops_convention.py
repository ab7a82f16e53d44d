"""Which model-FLOP formula a published TFLOP/s divides by: the causal attention core counted full before each
framework family halved it (knowledge/published_runs.tflops_causal_full), and what counting it full adds
(flops.noncausal_flops_per_token)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.flops import model_flops_per_token, noncausal_flops_per_token
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.published_runs import (
    main_snapshot,
    read_run_day,
    release_ran,
    run_day,
    tflops_causal_full,
    torchtitan_pipeline_microbatches,
)


@pytest.mark.parametrize(
    ("framework", "when", "day"),
    [
        ("NeMo 24.03.01", "NeMo 24.03.01", "2024-03"),  # NeMo's container tag YY.MM
        ("NeMo 25.04 (NeMo 2.0, Megatron-Core)", None, "2025-04"),  # the tag in the framework's words
        ("Megatron-Core r0.8.0", "2024 (r0.8.0)", "2024"),
        ("Megatron-Bridge", "validated 2026-07-31", "2026-07-31"),
        ("Megatron-Core", "2025-2026", None),  # spans the halving: not a day
        ("Megatron-Core", None, None),
        ("Megatron-Bridge", "bridge 600d069", None),
    ],
)
def test_run_day(framework, when, day):
    assert run_day(framework, when) == day


@pytest.mark.parametrize(
    ("framework", "when", "full"),
    [
        ("NeMo 24.03.01", "NeMo 24.03.01", True),  # flops_formulas halved at 6251117f4c, 2025-08-09
        ("NeMo 25.07 (NeMo 2.0, Megatron-Core)", "NeMo 25.07", True),
        ("NeMo 25.09 (NeMo 2.0, Megatron-Core)", "NeMo 25.09", False),
        ("Megatron-Core r0.8.0", "2024 (r0.8.0)", True),  # num_floating_point_operations halved at 8873b55d
        ("Megatron-LM (Megatron-Core), Nemotron-4 340B pre-training", "2024-06", True),
        ("Megatron-Core", "2025-04", False),
        ("Megatron-Bridge / Megatron-Core", "2025-08", True),  # flop_utils halved at d42316e94, 2025-09-26
        ("Megatron-Bridge", "validated 2026-07-31", False),
        ("Megatron-Core", None, False),  # no day stated: today's formula
        # a framework that starts with no formula family: today's formula, whatever else its words name
        ("Meta Llama 3 training stack (PyTorch FSDP-style sharding + Megatron-style TP, CP, PP)", "2024-07", False),
        ("verl + Megatron-Core", "2024-12", False),
        ("NeMo AutoModel", "2025-05", False),
    ],
)
def test_tflops_causal_full(framework, when, full):
    assert tflops_causal_full(framework, when) is full


@pytest.mark.parametrize("seq", [4096, 262144, 1048576])
def test_the_full_count_adds_the_causal_half_of_the_core(seq):
    """Llama-2-7B (MHA, no MTP): Megatron's core term 12 h^2 L s/h halved is 6 s h L; counted full, it is that again."""
    arch = resolve_model("llama-2-7b")
    h, L = arch.hidden_size, arch.num_layers
    extra = noncausal_flops_per_token(arch, seq) - model_flops_per_token(arch, seq)
    assert extra == pytest.approx(6 * seq * h * L, rel=1e-12)
    # at 1M tokens the core is nearly all the work: the full count is nearly twice the halved one
    if seq == 1048576:
        assert noncausal_flops_per_token(arch, seq) / model_flops_per_token(arch, seq) > 1.9


@pytest.mark.parametrize(
    ("when", "day", "leads", "main"),
    [
        ("2025-10-02 (main branch)", "2025-10-02", True, True),
        ("2025-08 (torchtitan 6fc499f, torch 2.9.0.dev20250815)", "2025-08", True, False),
        ("PR #3107 (2026-04); card validated 2026-07-26", "2026-04", False, False),  # a date further in leads nothing
        ("NeMo 24.07", "2024-07", False, False),  # a container tag dates the run, not a release of theirs
        ("2025-2026", None, False, False),
        (None, None, False, False),
    ],
)
def test_every_date_reader_reads_one_run_day(when, day, leads, main):
    """One reading of a row's date (published_runs.read_run_day) serves every reader: the releases, the torchtitan
    micro-batch default and the main-branch snapshot take only a date that opens the row's words."""
    dated = read_run_day("", when)
    assert (dated.day, dated.leads, dated.main_branch) == (day, leads, main)
    assert main_snapshot(when) == (f"main@{day}" if leads and main and len(day) == 10 else None)
    assert release_ran("torchtitan", when) == ("0.1" if leads else None)  # every leading date here before 6a3a9da95
    assert torchtitan_pipeline_microbatches(when, 4, 2) is None  # every leading date here is after 5e2033c
    assert torchtitan_pipeline_microbatches("2024-12", 4, 2) == 4  # before 90567fc: the pipeline degree
    assert torchtitan_pipeline_microbatches("2025-02", 4, 2) == 8  # then the stages
