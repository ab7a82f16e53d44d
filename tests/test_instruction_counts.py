"""bench/instruction_counts.py: one ask is the difference of two callgrind runs; with --first the run that asks no case
(imports and warm-up alone) is one program for every case, so it is counted once per call (valgrind not run here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import instruction_counts as ic


def _run(monkeypatch, capsys, argv: list[str]) -> tuple[list[tuple[int, int]], str]:
    asked: list[tuple[int, int]] = []

    def fake(index: int, asks: int) -> int:
        asked.append((index, asks))
        return 1_000_000_000 * (10 + asks * (index + 1))  # a case's ask costs (index + 1) G over a 10 G base

    monkeypatch.setattr(ic, "instructions", fake)
    monkeypatch.setattr(ic.shutil, "which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(sys, "argv", ["instruction_counts.py", *argv])
    ic.main()
    return asked, capsys.readouterr().out


def test_first_counts_the_no_ask_run_once(monkeypatch, capsys):
    asked, out = _run(monkeypatch, capsys, ["--first", "--only", "Kimi"])
    kimi = [i for i, (name, _, _) in enumerate(ic.CASES) if "Kimi" in name]
    assert len(kimi) >= 2
    assert asked.count((0, 0)) == 1 and [a for a in asked if a[1] == 0] == [(0, 0)]
    assert sorted(i for i, a in asked if a == 1) == kimi
    for i in kimi:
        assert f"| {ic.CASES[i][0]} | {i + 1:.3f} G |" in out


def test_warm_counts_each_case_against_its_own_first_ask(monkeypatch, capsys):
    asked, out = _run(monkeypatch, capsys, ["--only", "Kimi"])
    kimi = [i for i, (name, _, _) in enumerate(ic.CASES) if "Kimi" in name]
    assert sorted(asked) == sorted([(i, 2) for i in kimi] + [(i, 1) for i in kimi])
    for i in kimi:
        assert f"| {ic.CASES[i][0]} | {i + 1:.3f} G |" in out


def test_no_valgrind_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(ic.shutil, "which", lambda name: None)
    monkeypatch.setattr(sys, "argv", ["instruction_counts.py", "--first"])
    with pytest.raises(SystemExit, match="valgrind is not on PATH"):
        ic.main()
