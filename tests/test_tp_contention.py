"""A GEMM beside an SM-using TP communication kernel runs on the SMs left (tp_overlap.slowed_gemm,
tp_overlap.tp_hidden): the Transformer Engine userbuffers reduce-scatters' num_sm from the framework cards, the
GPU's SM count from the hardware card; the copy-engine all-gathers and async TP's copies hold none."""

from __future__ import annotations

import pytest

from meshplan.api import estimate_throughput
from meshplan.estimate import perf
from meshplan.estimate.layer_records import TpSms
from meshplan.estimate.tp_overlap import slowed_gemm, tp_hidden, tp_sms
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.hardware import get_gpu
from meshplan.schema.request import Request


def test_slowed_gemm_exact_cases():
    # set_sm_margin: launched on 132 - 16 SMs for its whole time
    assert slowed_gemm(1.0, 0.5, 16, 132, margin=True) == pytest.approx(132 / 116)
    # no margin: only the 0.5 s the kernel runs is at 108/132 of the rate
    assert slowed_gemm(1.0, 0.5, 24, 132, margin=False) == pytest.approx(1.0 + 0.5 * 24 / 132)
    # the kernel outlasts the GEMM: all of it at 108/132 of the rate
    assert slowed_gemm(1.0, 5.0, 24, 132, margin=False) == pytest.approx(132 / 108)
    assert slowed_gemm(1.0, 0.5, 0, 132, margin=True) == 1.0  # a copy-engine transfer holds no SMs
    with pytest.raises(ValueError, match="holds 132 of the GPU's 132 SMs"):
        slowed_gemm(1.0, 0.5, 132, 132, margin=True)


def test_userbuffers_hidden_counts_the_slowed_gemms():
    big = [(10.0, 10.0)]
    sms = TpSms(132, (16, 16), (16, 16), True)
    slow = 10.0 * 132 / 116
    # ring-exchange all-gathers 1 + 1, the forward reduce-scatter 3/4 of 1 less the output GEMM's loss, the bulk
    # dgrad reduce-scatter 1 less the wgrad GEMM's loss
    want = 1 + 1 + 0.75 - (slow - 10.0) + 1 - (slow - 10.0)
    assert tp_hidden("userbuffers", 1.0, big, 8, rs_splits=4, sms=sms) == pytest.approx(want)
    assert want < tp_hidden("userbuffers", 1.0, big, 8, rs_splits=4) == pytest.approx(3.75)
    # Bridge's bulk without margin: only the 1 s beside the kernel is slowed; the second pair uses its own num_sm
    sms = TpSms(132, (24, 16), (24, 4), False)
    two = [(2.0, 3.0), (2.0, 3.0)]
    got = tp_hidden("userbuffers", 1.0, two, 4, rs_splits=4, sms=sms)
    want = 0.0
    for f, w in ((24, 24), (16, 4)):
        out = 3.0 * 132 / (132 - f)
        wgrad = 2.0 + 1.0 * w / 132
        want += 1 + 1 + 0.75 * 1 - (out - 3.0) + 1 - (wgrad - 2.0)
    assert got == pytest.approx(want)
    # the other modes hold no SMs in the model
    assert tp_hidden("async_tp", 1.0, two, 4, sms=sms) == tp_hidden("async_tp", 1.0, two, 4)
    assert tp_hidden("wgrad", 1.0, two, 4, sms=sms) == tp_hidden("wgrad", 1.0, two, 4)


def test_sm_counts_and_card_shares():
    assert [get_gpu(g).sm_count for g in ("a100", "h100", "h100-pcie", "h200", "h20", "b200", "gb200")] == [
        108, 132, 114, 132, 78, 148, 148]
    assert tp_sms(get_gpu("h100"), framework_card("megatron-core").tp_overlap) == TpSms(132, (16, 16), (16, 16), True)
    assert tp_sms(get_gpu("b200"), framework_card("megatron-bridge").tp_overlap) == TpSms(148, (24, 16), (24, 4),
                                                                                           False)
    # Bridge's FP8 configs ring-exchange the forward reduce-scatter: the GEMM launched on all SMs but one
    assert tp_sms(get_gpu("h100"), framework_card("megatron-bridge").tp_overlap, fp8=True).fprop_rs == (1, 1)
    assert tp_sms(get_gpu("h100"), framework_card("megatron-core").tp_overlap, fp8=True).fprop_rs == (16, 16)
    assert tp_sms(get_gpu("h100"), framework_card("torchtitan").tp_overlap) is None  # copy engines only


def test_contention_lengthens_the_exposed_tp_time(monkeypatch):
    req = Request(framework="megatron-core", model="llama-3.1-70b", num_gpus=64, tp=8, pp=2, global_batch_size=256,
                  tp_comm_overlap=True)
    with_sms = estimate_throughput(req)
    monkeypatch.setattr(perf, "tp_sms", lambda gpu, facts, fp8=False: None)
    without = estimate_throughput(req)
    assert with_sms.breakdown.tp_comm_s > without.breakdown.tp_comm_s
    assert with_sms.breakdown.compute_s == without.breakdown.compute_s
