"""The playbook sweep's polled pipeline p2p (bench/data/playbook_sweep_p2p.yaml, bench/throughput_accuracy.py
`polled`): the floor is one poll interval per metadata message of every tensor the busiest stage moves per
micro-batch, and a run is counted as polled by its excess over the estimate in floors. A test of the bench itself."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import throughput_accuracy as ta

from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards
from meshplan.schema.plan import Job, Plan


def test_floor_is_one_sleep_per_metadata_message_of_the_busiest_stage():
    polling = ta.p2p_polling()
    per_tensor = polling.poll_interval_s * polling.metadata_messages_per_tensor
    assert polling.floor_s(1) == 0.0
    assert polling.floor_s(2) == pytest.approx(per_tensor * polling.end_stage_tensors)  # both stages are ends
    for pp in (3, 4, 8, 32):
        assert polling.floor_s(pp) == pytest.approx(per_tensor * polling.middle_stage_tensors)


def test_the_data_file_states_nanotron_bench2s_code():
    """0.1 s sleeps, two metadata messages a tensor (first metadata, then shape + stride), the cited commit."""
    polling = ta.p2p_polling()
    assert (polling.poll_interval_s, polling.metadata_messages_per_tensor) == (0.1, 2)
    assert (polling.end_stage_tensors, polling.middle_stage_tensors) == (2, 4)
    assert "67c5ebb6a925cb47026b22013af8bd1bb6c46d93" in ta.P2P_POLLING.read_text(encoding="utf-8")


def _case(pp: int, grad_acc: int, measured_step_s: float) -> ta.Case:
    arch = ta.llama_like("toy", 16, 2048, 32, 32, 8192, 131072, True)
    dp, mbs = 2, 1
    job = carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=dp * pp, gpus_per_node=8, seq_length=4096,
                          global_batch_size=dp * mbs * grad_acc, framework="nanotron"))
    plan = Plan(tp=1, pp=pp, dp=dp, micro_batch_size=mbs)
    tokens = job.seq_length * job.global_batch_size
    return ta.Case("test", "toy", job, plan, tokens / measured_step_s / job.num_gpus)


@pytest.mark.parametrize("pp", [2, 4])
def test_a_run_is_polled_from_half_a_floor_per_micro_batch_beyond_the_estimate(pp):
    polling = ta.p2p_polling()
    grad_acc, predicted_step_s = 16, 2.0
    for floors, expected in ((0.0, False), (0.3, False), (0.6, True), (1.4, True)):
        case = _case(pp, grad_acc, predicted_step_s + floors * polling.floor_s(pp) * grad_acc)
        tokens = case.job.seq_length * case.job.global_batch_size
        predicted_tps = tokens / predicted_step_s / case.job.num_gpus
        assert ta.excess_floors(case, predicted_tps, polling) == pytest.approx(floors)
        assert ta.polled(case, predicted_tps, polling) is expected


def test_no_pipeline_no_polling_and_a_refused_estimate_is_not_counted():
    polling = ta.p2p_polling()
    slow = _case(1, 16, 100.0)
    assert not ta.polled(slow, slow.measured_tps / 50, polling)  # pp = 1 moves no tensor between stages
    piped = _case(4, 16, 100.0)
    assert not ta.polled(piped, float("nan"), polling)


@pytest.mark.shared_data(ta.DEFAULT_VALIDATION / "ultrascale_playbook_nanotron_sweep.csv")
def test_the_sweeps_polled_runs_pay_at_least_the_floor():
    """The mechanism's check on the data: a polled run cannot lose less than its floor per micro-batch, so at every
    pipeline depth the median of the flagged runs' excess is at least one floor (it is 1.3-1.7)."""
    polling = ta.p2p_polling()
    sweep = ta.sweep_cases(ta.DEFAULT_VALIDATION)
    preds = ta.predict(sweep, None)
    by_pp: dict[int, list[float]] = {}
    for c, p in zip(sweep, preds, strict=True):
        if ta.polled(c, p, polling):
            by_pp.setdefault(c.plan.pp, []).append(ta.excess_floors(c, p, polling))
    assert set(by_pp) >= {2, 4, 8}
    for pp, floors in by_pp.items():
        assert statistics.median(floors) >= 1.0, (pp, statistics.median(floors))


def test_the_polling_check_adds_the_floor_to_every_slot_of_the_1f1b_step():
    """grad_acc + pp - 1 slots, each one floor longer: the step seconds, not a fitted share."""
    polling = ta.p2p_polling()
    case = _case(4, 16, 10.0)
    tokens = case.job.seq_length * case.job.global_batch_size
    predicted_tps = tokens / 2.0 / case.job.num_gpus  # a 2 s step
    step_s = tokens / ta.with_polling_tps(case, predicted_tps, polling) / case.job.num_gpus
    assert step_s == pytest.approx(2.0 + polling.floor_s(4) * (16 + 4 - 1))
    flat = _case(1, 16, 10.0)
    assert ta.with_polling_tps(flat, predicted_tps, polling) == pytest.approx(predicted_tps)
