"""torch's micro-pipelined (async) TP pays for what runs outside its pipelines (tp_overlap.async_tp_cost,
tp_overlap.chunked_gemm_extra): the local shard's copy, the reduce-scatter's sum of partials, the compute-stream
barriers and the chunked GEMMs' lower efficiency."""

from __future__ import annotations

import pytest

from meshplan.api import estimate_throughput
from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.gemm import gemm_efficiency
from meshplan.estimate import tp_overlap
from meshplan.estimate.tp_overlap import ASYNC_TP_AG_BARRIERS, ASYNC_TP_RS_BARRIERS, async_tp_cost
from meshplan.knowledge.calibration import calibration
from meshplan.schema.request import Request


def test_async_tp_cost_exact_cases():
    assert ASYNC_TP_AG_BARRIERS == 3.0 and ASYNC_TP_RS_BARRIERS == 2.0
    # 8 GB of activations over 8 ranks on 2 TB/s, 1 us barriers, two pairs, no GEMM loss:
    # gather: copy 1 GB in and out (1 ms) + 3 us; scatter: read 8 GB + write 1 GB (4.5 ms) + 2 us
    got = async_tp_cost(8e9, 8, 2, 2e12, 1e-6, 0.0)
    assert got == pytest.approx(2 * 2 * (1e-3 + 3e-6 + 4.5e-3 + 2e-6))
    # one pair (an MoE layer without a shared expert keeps attention's), plus the chunked GEMMs' extra seconds
    assert async_tp_cost(8e9, 8, 1, 2e12, 0.0, 0.25) == pytest.approx(2 * (1e-3 + 4.5e-3) + 0.25)
    assert async_tp_cost(8e9, 1, 2, 2e12, 1e-6, 0.25) == 0.0
    # two backward reduce-scatters left unfused (async_tp_unfused) run none of the scatter's work
    assert async_tp_cost(8e9, 8, 2, 2e12, 1e-6, 0.0, unfused=2) == pytest.approx(
        2 * 2 * (1e-3 + 3e-6) + 2 * (4.5e-3 + 2e-6))


def _tt(**kw):
    return Request(framework="torchtitan", model="llama-3.1-70b", gpu="h100", num_gpus=64, tp=8, pp=1,
                   global_batch_size=64, seq_length=8192, torch_compile=True, **kw)


def test_async_tp_exposes_its_costs(monkeypatch):
    on = estimate_throughput(_tt(tp_comm_overlap=True))
    monkeypatch.setattr(tp_overlap, "async_tp_cost", lambda *a: 0.0)
    free = estimate_throughput(_tt(tp_comm_overlap=True))
    monkeypatch.undo()
    off = estimate_throughput(_tt())
    # the costs lengthen the exposed TP time, leave the compute alone, and async TP still beats vanilla TP here
    assert off.breakdown.tp_comm_s > on.breakdown.tp_comm_s > free.breakdown.tp_comm_s
    assert on.breakdown.compute_s == free.breakdown.compute_s


def test_chunked_gemm_extra_counts_forward_and_gradient_passes():
    cal = calibration()
    gemms = [Gemm("qkv", 1024, 1280, 4096), Gemm("attn_out", 1024, 4096, 512), Gemm("mlp_fc1", 1024, 3584, 4096),
             Gemm("mlp_fc2", 1024, 4096, 1792), Gemm("logits", 1024, 32000, 4096)]

    class C:  # the fields chunked_gemm_extra reads
        bf16_peak, fp8_peak, ridge_rows = 1e15, None, 0.0
        async_tp_unfused = (False, False)

    def fwd(g: Gemm) -> float:
        return g.flops / (1e15 * gemm_efficiency(g, cal))
    tp = 8
    pair = gemms[:4]
    want = sum(2 * (tp * fwd(Gemm(g.name, g.m / tp, g.n, g.k)) - fwd(g)) for g in pair)
    assert tp_overlap.chunked_gemm_extra(gemms, cal, C, False, tp) == pytest.approx(want)  # the logits are not chunked
    want_moe = sum(2 * (tp * fwd(Gemm(g.name, g.m / tp, g.n, g.k)) - fwd(g)) for g in pair[:2])
    assert tp_overlap.chunked_gemm_extra(gemms, cal, C, True, tp) == pytest.approx(want_moe)

    class Unfused(C):  # both pairs' input gradients reduce-scattered unfused: their input GEMMs' dgrad is whole
        async_tp_unfused = (True, True)
    passes = {"qkv": 1, "attn_out": 2, "mlp_fc1": 1, "mlp_fc2": 2}
    want = sum(passes[g.name] * (tp * fwd(Gemm(g.name, g.m / tp, g.n, g.k)) - fwd(g)) for g in pair)
    assert tp_overlap.chunked_gemm_extra(gemms, cal, Unfused, False, tp) == pytest.approx(want)
