"""bench/production_*: a measured peak is compared with meshplan's figure at the moment it was read. A row states that
moment in its own words ("after iteration 2"), or its source is its framework's own benchmark harness, whose memory
report's moment and basis the framework card gives (cards/frameworks/megatron-bridge.yaml memory_report: Bridge's
scripts/performance reads the first memory report, after iteration 1, of allocated bytes). Read from the row's
fields by one rule for every row, never by id. bench/data/megatron_bridge_memory holds Bridge's published measured
peaks with their settings and sources.

A test of the bench itself: it imports the bench's modules (production_rows, production_scoring)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from meshplan import api
from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.memory import stage_allocated
from meshplan.knowledge.cards import framework_card

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_rows as prow
import production_scoring as pscore

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "megatron_bridge_memory"


def _row(citation: str, other: str | None = None, note: str | None = None) -> dict:
    """The fields the rules read, nothing else: a synthetic row with an unseen id."""
    return {"id": "unseen_row_x", "framework": "SomeFramework", "source": {"citation": citation, "location": "table 3"},
            "outcome": {"other": other}, "flags": {"memory_note": note}}


def test_the_bridge_card_says_which_report_its_harness_reads():
    report = framework_card("megatron-bridge").memory_report
    assert (report.harness, report.moment, report.basis) == ("scripts/performance", "first_iteration", "allocated")
    assert "evaluate.py" in report.source and "first occurrence" in report.source
    # a framework whose card names no harness has none
    assert framework_card("torchtitan").memory_report is None


def test_a_row_from_the_harness_is_read_at_the_harness_moment():
    harness = _row("NVIDIA-NeMo/Megatron-Bridge skill card; run by scripts/performance (evaluate.py golden check)")
    assert prow.harness_report(harness, "megatron-bridge") is framework_card("megatron-bridge").memory_report
    assert prow.peak_moment(harness, "megatron-bridge") == "first_iteration"
    assert prow.peak_convention(harness, "megatron-bridge") == "allocated"
    # the same words under a framework whose card names no harness, or without the framework: no harness reading
    assert prow.harness_report(harness, "megatron-core") is None
    assert prow.peak_moment(harness, "megatron-core") == "steady"
    assert prow.peak_convention(harness) == prow.peak_convention(harness, "megatron-core") == "not stated"
    # a Bridge row whose source is not the harness keeps the steady peak
    other = _row("NVIDIA-NeMo/Megatron-Bridge docs/some-blog.md")
    assert prow.peak_moment(other, "megatron-bridge") == "steady"
    assert prow.peak_convention(other, "megatron-bridge") == "not stated"


def test_a_row_quoting_its_framework_s_log_reads_the_log_s_peak():
    """torchtitan's training log reports the reserved peak (its card's memory_log); a row of a framework scored with
    torchtitan as its nearest card quotes another log and stays unstated, and the row's own words decide first."""
    assert framework_card("torchtitan").memory_log.basis == "reserved"
    assert framework_card("megatron-core").memory_log is None
    titan = {**_row("someone's benchmark table"), "framework": "torchtitan"}
    assert prow.peak_convention(titan) == prow.peak_convention(titan, "torchtitan") == "reserved"
    assert prow.peak_convention({**titan, "outcome": {"other": "max allocated 61 GB"}}) == "allocated"
    stand_in = {**titan, "framework": "LLM Foundry"}
    assert prow.framework_for("LLM Foundry")[0] == "torchtitan" and prow.own_framework(stand_in) is None
    assert prow.peak_convention(stand_in, "torchtitan") == "not stated"


def test_the_row_s_own_words_decide_before_the_harness():
    harness = "run by scripts/performance"
    assert prow.peak_moment(_row(harness, other="peak allocated after iteration 2"), "megatron-bridge") == "steady"
    assert prow.peak_moment(_row("a study", other="peak allocated after iteration 1"), "torchtitan") \
        == "first_iteration"
    assert prow.peak_moment(_row("a study", note="memory of the first iteration"), "torchtitan") == "first_iteration"
    assert prow.peak_moment(_row("a study", note="max reserved after step 10"), "torchtitan") == "steady"
    assert prow.peak_convention(_row(harness, note="reserved, not allocated"), "megatron-bridge") == "allocated"


def test_a_row_that_states_bf16_gradient_reduction_gets_it_on_megatron_engines():
    row = {"precision": "fp8 current-scaling (bf16 grad reduce: grad_reduce_in_fp32=False)",
           "parallelism": {"zero_or_distributed_optimizer": None}, "outcome": {"other": None}}
    _, fields, knobs = prow.precision_for(row, "megatron-bridge")
    assert fields == {"grad_reduce_in_fp32": False, "fp8_recipe": "tensorwise"} and not knobs
    assert "grad_reduce_in_fp32" not in prow.precision_for(row, "torchtitan")[1]
    plain = {**row, "precision": "fp8 current-scaling"}
    assert "grad_reduce_in_fp32" not in prow.precision_for(plain, "megatron-bridge")[1]


def test_compared_peak_at_the_first_iteration_is_the_first_iteration_allocated_peak(tmp_path):
    """Bridge's lazily allocated Adam state: the first iteration's allocated peak is below the steady one; the
    bench compares the harness's figure with it, a row read later with the steady one."""
    rows = {r["id"]: r for r in yaml.safe_load((DATA / "production_configs_dev.yaml").read_text())}
    row = rows["mbridge_tuning_llama3_70b_sft_fp8_tp4pp4"]
    mapping = pmap.map_row(row, tmp_path)
    assert mapping.request.grad_reduce_in_fp32 is False
    memory = api.estimate_memory(mapping.request)
    context = memory_card().cuda_context_bytes
    first = max(s.detail["first_iteration_allocated_peak"] for s in memory.stages) - context
    steady = max(stage_allocated(s) for s in memory.stages) - context
    assert first < steady
    assert pscore.compared_peak(memory, "allocated", "first_iteration") == first
    assert pscore.compared_peak(memory, "allocated", "steady") == steady
    assert pscore.compared_peak(memory, "reserved", "first_iteration") == memory.peak_bytes - context
    assert pscore.compared_peak(memory, "not stated", "steady") == memory.peak_bytes


def test_bridge_published_peaks_map_with_their_sources_and_moments():
    """Every row of bench/data/megatron_bridge_memory maps, names the file and commit it was read from, and is
    compared at its moment: the harness's Llama-3-70B runs after iteration 1, the Moonlight study's (its card:
    "peak allocated after iteration 2") steady."""
    rows, scores, summary = pscore.run(DATA)
    assert summary.mapped == len(rows) == len(scores) >= 10
    for row, score in zip(rows, scores, strict=True):
        source = row["source"]
        assert source["commit"] and source["file"] and source["file"] in source["url"], row["id"]
        assert score.refused is None and not score.rule_errors and score.peak_error is not None, row["id"]
        harness = "scripts/performance" in source["citation"]
        assert score.moment == ("first_iteration" if harness else "steady"), row["id"]
        assert score.convention == "allocated", row["id"]
