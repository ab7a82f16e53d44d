"""The error bands every report prints (cards/accuracy.yaml) are today's: the card is rebuilt here from the bench
scripts that score the measured runs (bench/accuracy_card.build, the function `python bench/accuracy_card.py` writes
with) and must equal the card shipped.

Before, a change to the arithmetic could move the measured errors without anyone re-running the bench: the
straddling-group change (78b17e8) took the Megatron-Bridge GB200 MoE rows from -8% / -16% to -45% / -56% tokens/s
and the production MoE median from 7.7% to 12.4%, while bench/README.md and the card kept the old figures for two
days. A change that moves a published figure now fails here until the card is regenerated, and so is seen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import accuracy_card
import production_rows as prow

pytestmark = pytest.mark.shared_data(prow.DEFAULT_VALIDATION / prow.DATA_NAME)


def _differences(old: dict, new: dict, where: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new), key=str)
                for line in _differences(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))]
    return [] if old == new else [f"{where}: card {old!r}, bench {new!r}"]


def test_the_error_bands_shipped_are_the_ones_the_bench_measures_today():
    shipped = yaml.safe_load(accuracy_card.CARD.read_text(encoding="utf-8"))
    today = accuracy_card.build(prow.DEFAULT_VALIDATION)
    differences = [line for kind in ("throughput", "memory")
                   for line in _differences(shipped[kind], today[kind], kind)]
    assert not differences, (
        "cards/accuracy.yaml is not what the bench measures today (run `python bench/accuracy_card.py`, then "
        "`meshplan docs`, and say in bench/README.md which figures moved and why):\n" + "\n".join(differences[:20]))
