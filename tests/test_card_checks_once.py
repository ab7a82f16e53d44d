"""The memory and calibration cards are checked against the cost model once per loaded card (memory_states.memory_card,
calibration.calibration_card): a card loaded again (a new object) is checked again, so a broken one is still refused
after a good one was accepted."""

from __future__ import annotations

import pytest

from meshplan.arithmetic import memory_states
from meshplan.knowledge import calibration
from meshplan.knowledge.cards import CardError


def test_a_reloaded_memory_card_missing_a_convention_is_refused(monkeypatch):
    good = memory_states.memory_card()
    assert memory_states.memory_card() is good
    conventions = dict(good.conventions)
    conventions.pop(next(iter(conventions)))
    broken = good.model_copy(update={"conventions": conventions})
    monkeypatch.setattr(memory_states, "load_card", lambda name, schema: broken)
    with pytest.raises(CardError, match="key conventions"):
        memory_states.memory_card()


def test_a_reloaded_calibration_card_missing_a_constant_is_refused(monkeypatch):
    good = calibration.calibration_card()
    assert calibration.calibration_card() is good
    constants = dict(good.constants)
    constants.pop(next(iter(constants)))
    broken = good.model_copy(update={"constants": constants})
    monkeypatch.setattr(calibration, "load_card", lambda name, schema: broken)
    with pytest.raises(CardError, match="does not match the cost model"):
        calibration.calibration_card()
