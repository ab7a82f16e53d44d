"""The transcribed Megatron-Bridge throughput table: every row resolves, and its published TFLOP/s agree with
meshplan's FLOP count, which checks the transcription (tokens/s, layout, sequence, MTP) row by row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.arithmetic.flops import model_flops_per_token

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bridge_published import cases

ROWS = cases()


def test_every_published_row_resolves_to_a_catalog_model_and_gpu():
    assert len(ROWS) >= 35
    for row, job, plan in ROWS:
        assert job.framework == "megatron-bridge"
        assert plan.tp * plan.pp * plan.cp * plan.dp == job.num_gpus, row
        assert job.gpu.key == row["system"]


@pytest.mark.parametrize("row,job", [(r, j) for r, j, _ in ROWS], ids=lambda x: "" if not isinstance(x, dict)
                         else f"{x['release']}-{x['system']}-{x['model']}-{x['precision']}")
def test_published_tflops_match_meshplan_flops_per_token(row, job):
    implied = float(row["model_tflops_per_gpu"]) * 1e12 / float(row["tokens_per_s_per_gpu"])
    ours = model_flops_per_token(job.model, job.seq_length)
    if row["model"].startswith("gpt-oss"):
        # The releases' flop_utils (Bridge v0.2.0 / v0.3.0) count GPT-OSS's windowed layers full and its experts
        # ungated (gated_linear_multiplier 3/2 only where activation_func is F.silu; gpt-oss runs quick_gelu);
        # meshplan counts the window (Bridge's calculate_swa_context, v0.5.0 on) and the gate (Bridge v0.6.2's
        # ffn_expansion_factor 3 for any GLU).
        arch = job.model
        full = model_flops_per_token(arch.model_copy(update={"sliding_window": None}), job.seq_length)
        ungate = 12 * arch.hidden_size * arch.moe.expert_ffn_hidden_size * arch.moe.top_k * 0.5 * arch.num_layers
        assert implied == pytest.approx(full - ungate, rel=5e-3)
        assert ours < full
    else:
        assert implied == pytest.approx(ours, rel=5e-3)


def test_same_run_pairs_pair_only_rows_that_differ_in_system_alone():
    """bridge_published.same_run_pairs: two systems' rows of one release, model, precision and layout pair once; a
    row differing in any other column (here the micro-batch) pairs with none."""
    from bridge_published import SAME_RUN_COLUMNS, same_run_pairs

    base = {c: "1" for c in SAME_RUN_COLUMNS}
    a, b = base | {"system": "gb200"}, base | {"system": "gb300"}
    c = base | {"system": "b300", "mbs": "2"}
    d = base | {"system": "gb200"}
    pairs = same_run_pairs([a, b, c, d])
    assert [(x["system"], y["system"]) for x, y in pairs] == [("gb200", "gb300"), ("gb300", "gb200")]
    assert all(c not in pair for pair in pairs)


def test_same_run_pairs_of_the_table_include_the_blackwell_ultra_siblings():
    """The table's GB300 / GB200 and B300 / B200 rows of one layout are found as pairs (what --pairs prints)."""
    from bridge_published import same_run_pairs

    found = {(a["release"], a["model"], frozenset((a["system"], b["system"]))) for a, b in same_run_pairs(
        [r for r, _, _ in ROWS])}
    assert ("25.11", "llama-3.1-8b", frozenset({"gb200", "gb300"})) in found
    assert ("26.02", "deepseek-v3", frozenset({"b200", "b300"})) in found
    assert ("26.02", "gpt-oss-120b", frozenset({"b200", "b300"})) in found
