"""bench/production_configs.py --hybrids: the dev set's Nemotron 3 Nano and Super rows (no dimensions recorded) scored
as the catalog model of their name, each with the layout and settings it states; without the switch they stay
unmapped, as the accuracy card (cards/accuracy.yaml) is built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_rows as prow

pytestmark = pytest.mark.shared_data(prow.DEFAULT_VALIDATION / prow.DATA_NAME)
NANO = ("mbridge_h100_nemotron3_nano_16_fp8", "mbridge_gb200_nemotron3_nano_8_mxfp8",
        "mbridge_card_nemotron3_nano_16_moe_recompute")


def test_nano_rows_are_scored_as_the_catalog_hybrid_only_when_asked(tmp_path, monkeypatch):
    production_rows = {r["id"]: r for r in prow.load_rows(prow.DEFAULT_VALIDATION / prow.DATA_NAME)}
    for rid in NANO:
        mapping = pmap.map_row(production_rows[rid], tmp_path)
        assert mapping.request is None and "nemotron_h" in mapping.unmapped
    monkeypatch.setattr(prow, "SCORE_HYBRIDS", True)
    for rid in NANO:
        req = pmap.map_row(production_rows[rid], tmp_path).request
        assert req.model == "nemotron-3-nano-30b-a3b" and req.ep == 8
        assert api.estimate_throughput(req).tokens_per_s_per_gpu > 0
    # 'nvidia/NVIDIA-Nemotron-3-Super (~120B-A12B)': the size in parentheses read as the name's suffix
    req = pmap.map_row(production_rows["mbridge_gb200_nemotron3_super_64_mxfp8"], tmp_path).request
    assert req.model == "nemotron-3-super-120b-a12b" and (req.tp, req.ep, req.sequence_parallel) == (2, 64, True)
    assert api.estimate_throughput(req).tokens_per_s_per_gpu > 0
    # the perf recipe starts from Bridge's Super recipe: its one MTP block trained at two depths (RECIPE_MTP)
    assert (req.mtp_num_layers, req.mtp_use_repeated_layer) == (2, True)
