"""search/rl._fraction_fit: one call gives the largest rollout memory fraction under the headroom and, where none
is, whether one fits the GPU's capacity, from the two rollout estimates the line needs (the headroom miss used to
estimate both again at capacity)."""

from types import SimpleNamespace

import pytest

from meshplan.search import rl

GIB = 2**30


def _job(capacity_gib: float):
    return SimpleNamespace(gpu=SimpleNamespace(memory_bytes=capacity_gib * GIB))


def _stub(monkeypatch, others_gib: float, base_gib: float, per_fraction_gib: float) -> list[float]:
    """rl_memory as a line: the rollout phase base + per_fraction x fraction, the other phases flat; the fractions
    it was asked at."""
    asked: list[float] = []

    def rl_memory(job, plan, reports):
        asked.append(plan.rollout_memory_fraction)
        rollout = (base_gib + per_fraction_gib * plan.rollout_memory_fraction) * GIB
        return SimpleNamespace(phases=[SimpleNamespace(phase="rollout", fit_bytes=rollout),
                                       SimpleNamespace(phase="update", fit_bytes=others_gib * GIB)])

    monkeypatch.setattr(rl, "rl_memory", rl_memory)
    return asked


class _Plan:
    def model_copy(self, update):
        return SimpleNamespace(**update)


@pytest.mark.parametrize(("others", "base", "per", "limit", "fraction", "within", "estimates"), [
    (40, 0, 80, 72, 0.9, True, 1),     # the largest fraction clears the headroom: one estimate
    (40, 10, 80, 50, 0.5, True, 2),    # the line crosses the headroom at 0.5
    (40, 70, 80, 72, None, True, 2),   # none under 72 GiB (the least step 74 GiB), 0.1 under 80 GiB: MEM002
    (40, 79, 80, 72, None, False, 2),  # none under the capacity either: RL005
    (75, 0, 80, 72, None, True, 1),    # the update past the headroom, within capacity: the rollout line unasked
    (90, 0, 80, 72, None, False, 1),   # the update past the capacity
])
def test_one_call_answers_headroom_and_capacity(monkeypatch, others, base, per, limit, fraction, within, estimates):
    asked = _stub(monkeypatch, others, base, per)
    fit = rl._fraction_fit(_job(80), _Plan(), (), limit * GIB)
    assert (fit.fraction, fit.within_capacity) == (fraction, within)
    # the estimate at the chosen fraction is handed on where the line made one there (MAX_FRACTION), else none
    assert (fit.memory is not None) == (fraction == rl.MAX_FRACTION)
    assert len(asked) == estimates == len(set(asked))  # no fraction estimated twice
