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
    assert set(pw.SPECS) == set(comparisons)
    for cid, spec in pw.SPECS.items():
        c = comparisons[cid]
        assert spec.pairs or spec.not_measured, cid
        for key, side in spec.sides.items():
            assert side.line < len(c["configs"]), (cid, key)
            assert (side.entry or c["entry_ids"][0]) in c["entry_ids"], (cid, key)
            assert (side.entry or c["entry_ids"][0]) in rows, (cid, key)
        for a, b in spec.pairs:
            assert a in spec.sides and b in spec.sides, (cid, a, b)


def test_every_pair_maps_or_names_why(result):
    spec_pairs = sum(len(s.pairs) for s in pw.SPECS.values())
    assert len(result.pairs) == spec_pairs
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
    # the not-measured comparisons are checked as fit verdicts of their linked rows, none silently dropped
    for cid, spec in pw.SPECS.items():
        if spec.not_measured:
            assert cid in result.not_measured
            assert [f[1] for f in result.feasibility if f[0] == cid]


def test_ep_overlap_sides_differ_by_the_knob(result, rows):
    (p,) = [p for p in result.pairs if p.comparison == "CMP-QWEN30B-EP-OVERLAP"]
    assert p.status != "not expressible" and "moe_a2a_overlap" not in (p.why_apart or "")
    assert p.measured == pytest.approx(287.3 / 244.0)
    assert p.winner == "overlap on"
    row = rows["mbridge_card_qwen3_30b_16_h100_hybridep"]
    with tempfile.TemporaryDirectory() as tmp:
        sides = [pw.build_side(s, f"overlap {k}", row, Path(tmp)) for k, s in
                 pw.SPECS["CMP-QWEN30B-EP-OVERLAP"].sides.items()]
    assert [b.request.moe_a2a_overlap for b in sides] == [False, True]
    assert sides[0].request.model_copy(update={"moe_a2a_overlap": True}) == sides[1].request


def test_values_are_read_as_written():
    assert pw.line_values("32K/32 GPUs: CP2 610 vs no-CP 595") == ["610", "595"]
    assert pw.line_values("TP1 PP1 EP16: 206 (26.04.01), 203 (26.06)")[:2] == ["206", "203"]
    assert pw.line_values("none: OOM") == ["OOM"]
    configs = ["none: 457 ms, 36.62 GB", "moe_act: +1.99%, -1.85% mem", "core_attn: +3.85%, ~0 mem",
               "4K CP1 DP32: ~300"]
    ref, ref_mem = pw.Side(0), pw.Side(0, 1)
    assert pw.measured_value(configs, ref, ref) == 457
    assert pw.measured_value(configs, pw.Side(1), ref) == pytest.approx(457 * 1.0199)
    assert pw.measured_value(configs, pw.Side(1, 1), ref_mem) == pytest.approx(36.62 * (1 - 0.0185))
    assert pw.measured_value(configs, pw.Side(2, 1), ref_mem) == pytest.approx(36.62)
    assert pw.measured_value(configs, pw.Side(3), None) == 300


def test_label_edits_change_the_fields_they_name(rows):
    with tempfile.TemporaryDirectory() as tmp:
        row = rows["mbridge_card_dsv3_h100_256_longctx_128k"]
        b = pw.build_side(pw.Side(5, edit="layout"), "256K CP64 (512 GPUs)", row, Path(tmp))
        r = b.request
        assert (r.seq_length, r.cp, r.num_gpus, r.dp, r.pp, r.ep) == (262144, 64, 512, 1, 8, 32)
        assert r.seq_length * r.global_batch_size == 131072 * 480  # tokens per step kept
        moon = rows[pw.MOON]
        assert pw.build_side(pw.Side(4, edit="recompute"), "mla_up_proj+mlp", moon, Path(tmp)).request \
            .recompute_modules == ["mla_up_proj", "mlp"]
        core = pw.build_side(pw.Side(2, edit="recompute"), "core_attn", moon, Path(tmp)).request
        assert core.recompute == "selective" and core.recompute_modules is None  # Megatron's default module
        assert pw.build_side(pw.Side(0, edit="recompute"), "none", moon, Path(tmp)).request.recompute == "none"
        gb300 = pw.build_side(pw.Side(3, edit="layout", hardware=pw.GB300), "GB300 MXFP8 TP1 PP4 VP5",
                              rows["mbridge_gb200_llama3_70b_64_mxfp8_tp2pp4"], Path(tmp))
        assert (gb300.request.tp, gb300.request.pp, gb300.request.vpp, gb300.request.dp) == (1, 4, 5, 16)
        assert "gpu" in gb300.knobs  # GB300 is outside the catalog: named, scored on the nearest GPU


def test_the_unspecified_side_is_meshplans_best_without_that_degree(rows):
    with tempfile.TemporaryDirectory() as tmp:
        b = pw.build_side(pw.Side(0, 1, best_without="cp"), "32K/32 GPUs",
                          rows["nemo_longseq_llama2_7b_h100_32k"], Path(tmp))
    assert b.request.cp == 1 and b.request.tp is not None and b.request.num_gpus == 32
    assert any("best layout" in n for n in b.notes)


def test_pair_orientation_and_order():
    p = pw.PairScore("X", "a", "b", "throughput", measured=1.2, predicted=0.9)
    assert p.apart and p.right is False and p.ratio_error == pytest.approx(0.9 / 1.2 - 1)
    tie = pw.PairScore("X", "a", "b", "throughput", measured=1.03, predicted=0.9)
    assert not tie.apart and tie.right is None  # within 5%: not ordered, still a ratio error
    assert pw._ratio("time", 2.0, 1.0) == 0.5 and pw._ratio("throughput", 2.0, 1.0) == 2.0
