"""bench/pairwise_comparisons.py: every measured comparison of the dev set has its sides built, every pair is
scored or says why not (the knob meshplan lacks, the row that does not map), values are read from the file as
written, and the label edits change the fields they name. No estimate timing is asserted. A test of the bench itself: it
imports bench/pairwise_comparisons.py and bench/production_rows.py."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import pairwise_comparisons as pw
import pairwise_sides as ps
import production_rows as prow

DATA = prow.DEFAULT_VALIDATION / pw.DATA_NAME
pytestmark = pytest.mark.shared_data(DATA)  # ../shared beside the checkout (conftest.py: fails without it)


@pytest.fixture(scope="module")
def comparisons():
    return {c["id"]: c for c in yaml.safe_load(DATA.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def rows(production_rows):
    return production_rows


@pytest.fixture(scope="module")
def result():
    return pw.run(prow.DEFAULT_VALIDATION)


def test_every_comparison_has_sides_on_its_own_lines_and_rows(comparisons, rows):
    for cid, c in comparisons.items():
        sides = ps.sides_of(c, rows)
        assert sides, cid
        for side in sides:
            assert side.line < len(c["configs"]), cid
            assert side.entry in c["entry_ids"] and side.entry in rows, (cid, side)


def test_every_pair_maps_or_names_why(result, comparisons):
    assert result.pairs
    for p in result.pairs:
        assert p.status in ("scored", "nearest", "not expressible"), p
        if p.status == "not expressible":
            assert p.why_apart.strip() and p.predicted is None, p
        else:
            assert (p.predicted is not None) or (p.fits_right is not None), p
        if p.status == "nearest":
            assert set(p.why_apart.split(", ")) <= set(prow.KNOBS), p
        if p.about != "fits":
            assert p.measured is not None and p.measured >= 1, p  # oriented winner / loser
        if p.right is False:
            assert p.driver, p  # a wrong pair says which term
    # every comparison is scored as pairs or, where its metric is no measured value, as its rows' fit verdicts
    for cid in comparisons:
        assert any(p.comparison == cid for p in result.pairs) or [f for f in result.feasibility if f[0] == cid], cid


def test_ep_overlap_sides_differ_by_the_knob(result, rows, comparisons):
    (p,) = [p for p in result.pairs if p.comparison == "CMP-QWEN30B-EP-OVERLAP"]
    assert p.status != "not expressible" and "moe_a2a_overlap" not in (p.why_apart or "")
    assert p.measured == pytest.approx(287.3 / 244.0)
    assert p.winner == "overlap on"
    c = comparisons["CMP-QWEN30B-EP-OVERLAP"]
    with tempfile.TemporaryDirectory() as tmp:
        sides = [pw.build_side(s, rows[s.entry], Path(tmp), rows, c["title"]) for s in ps.sides_of(c, rows)]
    assert [b.request.moe_a2a_overlap for b in sides] == [False, True]
    assert sides[0].request.model_copy(update={"moe_a2a_overlap": True}) == sides[1].request


def test_labels_are_read_the_same_way_for_any_comparison():
    assert ps.label_settings("256K CP64 (512 GPUs)") == {"cp": 64, "seq_length": 262144, "num_gpus": 512}
    assert ps.label_settings("GB300 MXFP8 TP1 PP4 VP5") == {"tp": 1, "pp": 4, "vpp": 5, "gpu": "GB300",
                                                            "precision": "mxfp8"}
    assert ps.label_settings("32K/32 GPUs no-CP") == {"cp": 1, "open": "cp", "seq_length": 32768, "num_gpus": 32}
    assert ps.label_settings("16") == {"num_gpus": 16}
    assert ps.label_settings("mla_up_proj+mlp")["recompute"] == "selective: mla_up_proj, mlp"
    assert ps.label_settings("overlap on", "EP communication overlap")["switch"] == ("moe_a2a_overlap", True)
    assert ps.label_settings("overlap off", "a fresh comparison")["switch"] == (None, False)  # no knob named
    assert ps.measures({"metric": "step-time overhead; peak memory", "configs": ["none: 457 ms, 36.62 GB"]}) == (
        "time", "memory")
    assert ps.measures({"metric": "recommended layout (memory feasibility)", "configs": ["8: TP8"]}) == ()


def test_values_are_read_as_written():
    assert ps.line_values("32K/32 GPUs: CP2 610 vs no-CP 595") == ["610", "595"]
    assert ps.line_values("TP1 PP1 EP16: 206 (26.04.01), 203 (26.06)")[:2] == ["206", "203"]
    assert ps.line_values("none: OOM") == ["OOM"]
    configs = ["none: 457 ms, 36.62 GB", "moe_act: +1.99%, -1.85% mem", "core_attn: +3.85%, ~0 mem",
               "4K CP1 DP32: ~300"]
    ref, ref_mem = ps.Side(0), ps.Side(0, 1)
    assert ps.measured_value(configs, ref, ref) == 457
    assert ps.measured_value(configs, ps.Side(1), ref) == pytest.approx(457 * 1.0199)
    assert ps.measured_value(configs, ps.Side(1, 1), ref_mem) == pytest.approx(36.62 * (1 - 0.0185))
    assert ps.measured_value(configs, ps.Side(2, 1), ref_mem) == pytest.approx(36.62)
    assert ps.measured_value(configs, ps.Side(3), None) == 300


def test_label_edits_change_the_fields_they_name(rows):
    with tempfile.TemporaryDirectory() as tmp:
        row = rows["mbridge_card_dsv3_h100_256_longctx_128k"]
        b = pw.build_side(ps.Side(5, label="256K CP64 (512 GPUs)"), row, Path(tmp), rows)
        r = b.request
        assert (r.seq_length, r.cp, r.num_gpus, r.dp, r.pp, r.ep) == (262144, 64, 512, 1, 8, 32)
        assert r.seq_length * r.global_batch_size == 131072 * 480  # tokens per step kept
        moon = rows["mbridge_card_moonlight_8_norecompute"]
        assert pw.build_side(ps.Side(4, label="mla_up_proj+mlp"), moon, Path(tmp), rows).request \
            .recompute_modules == ["mla_up_proj", "mlp"]
        core = pw.build_side(ps.Side(2, label="core_attn"), moon, Path(tmp), rows).request
        assert core.recompute == "selective" and core.recompute_modules is None  # Megatron's default module
        assert pw.build_side(ps.Side(0, label="none"), moon, Path(tmp), rows).request.recompute == "none"
        gb300 = pw.build_side(ps.Side(3, label="GB300 MXFP8 TP1 PP4 VP5"),
                              rows["mbridge_gb200_llama3_70b_64_mxfp8_tp2pp4"], Path(tmp), rows)
        assert (gb300.request.tp, gb300.request.pp, gb300.request.vpp, gb300.request.dp) == (1, 4, 5, 16)
        assert "gpu" not in gb300.knobs  # GB300 is a catalog part (cards/hardware.yaml gb300): scored on it
        # its memory is the catalog's (nvidia-smi's 284208 MiB), the fit judged against it
        assert gb300.request.gpu == "gb300" and gb300.capacity_bytes == 284208 * 2**20


def test_the_unspecified_side_is_meshplans_best_without_that_degree(rows, comparisons):
    sides = ps.sides_of(comparisons["CMP-NEMO-CP"], rows)
    assert [s.best_without for s in sides[:2]] == [None, "cp"]
    assert sides[3].best_without == "cp"  # "64K/64: CP2 574 vs 534": the column's words from the line above
    with tempfile.TemporaryDirectory() as tmp:
        b = pw.build_side(sides[1], rows[sides[1].entry], Path(tmp), rows)
    assert b.request.cp == 1 and b.request.tp is not None and b.request.num_gpus == 32
    assert any("best layout" in n for n in b.notes)


def test_pair_orientation_and_order():
    p = pw.PairScore("X", "a", "b", "throughput", measured=1.2, predicted=0.9)
    assert p.apart and p.right is False and p.ratio_error == pytest.approx(0.9 / 1.2 - 1)
    tie = pw.PairScore("X", "a", "b", "throughput", measured=1.03, predicted=0.9)
    assert not tie.apart and tie.right is None  # within 5%: not ordered, still a ratio error
    assert pw._ratio("time", 2.0, 1.0) == 0.5 and pw._ratio("throughput", 2.0, 1.0) == 2.0
