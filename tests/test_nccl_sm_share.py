"""Compute beside an overlapped NCCL collective runs on the SMs the collective's CTAs leave (comm.ring_sm_share, the
GPU cards' nccl_ring_ctas from NCCL's topology search; comm.beside_compute, contended): FSDP's unit windows
(sharding_traffic.exposed_sharding), the DP sync's hidden seconds (perf.chunked_reduce_exposed /
chunked_gather_exposed) and TP's NCCL modes (tp_overlap.tp_hidden wgrad, local_shard)."""

from __future__ import annotations

import pytest

from meshplan.api import estimate_throughput
from meshplan.arithmetic.comm import beside_compute, contended, hidden_beside, links, ring_sm_share
from meshplan.estimate import sharding_traffic
from meshplan.estimate.perf import SyncChunks, chunked_gather_exposed, chunked_reduce_exposed
from meshplan.estimate.sharding_traffic import ShardUnit, exposed_sharding
from meshplan.estimate.tp_overlap import tp_hidden
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.hardware import get_gpu
from meshplan.schema.request import Request


def _links(gpu: str):
    part = get_gpu(gpu)
    return links(part, part.gpus_per_node, calibration("megatron-core"))


def test_the_cards_give_the_ctas_nccls_search_gives():
    h100, a100, gb300 = _links("h100"), _links("a100"), _links("gb300")
    assert ring_sm_share(8, 1, h100) == pytest.approx(24 / 132)  # inside one NVSwitch node
    assert ring_sm_share(4, 2, h100) == pytest.approx(24 / 132)  # a DP group beside TP2, still one node
    assert ring_sm_share(16, 1, h100) == pytest.approx(16 / 132)  # two full nodes: 8 NICs, 16 CTAs
    assert ring_sm_share(8, 4, h100) == pytest.approx(8 / 132)  # 2 GPUs of each node: 4 per GPU
    assert ring_sm_share(4, 8, h100) == pytest.approx(4 / 132)  # one GPU a node (TP8): its one NIC's 4
    assert ring_sm_share(4, 8, a100) == pytest.approx(2 / 108)  # 200 Gb/s HDR: not doubled, 2 (NCCL issue 689)
    assert ring_sm_share(4, 72, gb300) == pytest.approx(8 / 152)  # 800 Gb/s ConnectX-8 across NVL72 racks
    assert ring_sm_share(1, 1, h100) == 0.0  # no collective
    assert ring_sm_share(8, 1, _links("mi300x")) == 0.0  # RCCL: not counted
    assert get_gpu("h800").nccl_ring_ctas.nvlink == 16  # 8 NVLinks: 4 rings at 40 -> 8 -> 16 (NCCL issue 892)


def test_beside_compute_is_the_later_of_the_collective_and_the_slowed_compute():
    assert beside_compute(1.0, 3.0, 0.0) == 0.0 and beside_compute(5.0, 3.0, 0.0) == 2.0  # the old max(0, c - w)
    assert beside_compute(1.0, 3.0, 0.2) == pytest.approx(0.2)  # hidden whole, the compute 0.2 s late
    assert beside_compute(5.0, 3.0, 0.2) == pytest.approx(2.0)  # the collective still the longer
    assert beside_compute(3.2, 3.0, 0.2) == pytest.approx(0.6)  # the compute's 0.6 s beyond the collective's 0.2
    assert hidden_beside(1.0, 3.0, 0.2) == pytest.approx(0.8)
    assert contended(0.5, 1.0, 0.2) == 0.5 and contended(0.1, 1.0, 0.2) == pytest.approx(0.2)
    shares = [beside_compute(2.0, 3.0, s) for s in (0.0, 0.1, 0.2, 0.3)]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_fsdp_windows_pay_the_share_of_what_they_hide():
    # four layers, each gathered (1 s) behind the previous one's 3 s forward; the first waits whole
    run = (ShardUnit(count=4, gather=1.0, reduce=2.0, fwd=3.0, bwd=6.0),)
    assert exposed_sharding(run, True, False, False) == pytest.approx(1.0)
    assert exposed_sharding(run, True, False, False, 0.2) == pytest.approx(1.0 + 3 * 0.2)
    # backward: each window hides a gather and a reduce-scatter (1 + 2 s) in 6 s; the first gather and the last
    # reduce-scatter wait whole
    assert exposed_sharding(run, False, True, True) == pytest.approx(1.0 + 2.0)
    assert exposed_sharding(run, False, True, True, 0.2) == pytest.approx(
        3.0 + 0.2 * (2.0 + 3.0 + 3.0 + 1.0))


def test_the_dp_sync_hidden_seconds_slow_the_compute_beside_them():
    one = SyncChunks()
    # 1 s of reduction, 80% of a 10 s backward hides it: 0.2 of it is the backward's delay
    assert chunked_reduce_exposed(1.0, 0.8, 10.0, one) == 0.0
    assert chunked_reduce_exposed(1.0, 0.8, 10.0, one, sm_share=0.2) == pytest.approx(0.2)
    assert chunked_reduce_exposed(1.0, 0.8, 10.0, one, slack=0.05, sm_share=0.2) == pytest.approx(0.15)
    assert chunked_reduce_exposed(10.0, 0.8, 10.0, one, sm_share=0.2) == pytest.approx(2.0)  # the tail is longer
    chunked = SyncChunks(4, 2)
    base = chunked_reduce_exposed(2.0, 0.8, 8.0, chunked)
    assert chunked_reduce_exposed(2.0, 0.8, 8.0, chunked, sm_share=0.2) == pytest.approx(max(base, 0.2 * (2.0 - base)))
    assert chunked_gather_exposed(1.0, 0.8, 10.0, one, sm_share=0.2) == pytest.approx(0.2)
    assert chunked_gather_exposed(1.0, 0.0, 10.0, one, sm_share=0.2) == 1.0  # not overlapped: waits whole


def test_tp_nccl_modes_hide_less_beside_their_gemms():
    pairs = [(4.0, 4.0)]
    assert tp_hidden("wgrad", 1.0, pairs, 4) == 1.0
    assert tp_hidden("wgrad", 1.0, pairs, 4, nccl_share=0.2) == pytest.approx(0.8)
    # nanotron's local shard: gathers beside 1/tp of each GEMM (1 s), the re-gather and the dgrad reduce-scatter
    # beside whole GEMMs: four collectives of 1 s, each hiding 0.8 of it
    assert tp_hidden("local_shard", 1.0, pairs, 4, input_regather=True) == 4.0
    assert tp_hidden("local_shard", 1.0, pairs, 4, input_regather=True, nccl_share=0.2) == pytest.approx(3.2)
    # userbuffers and async TP hold no NCCL SMs (their own kernels or copy engines)
    assert tp_hidden("async_tp", 1.0, pairs, 4, nccl_share=0.2) == tp_hidden("async_tp", 1.0, pairs, 4)
    assert tp_hidden("userbuffers", 1.0, pairs, 4, nccl_share=0.2) == tp_hidden("userbuffers", 1.0, pairs, 4)


def test_an_fsdp_step_is_longer_for_the_sms_its_gathers_hold(monkeypatch):
    req = Request(framework="torchtitan", model="llama-3.1-8b", gpu="h100", num_gpus=8, seq_length=8192,
                  micro_batch_size=1, global_batch_size=8, zero_stage=3)
    held = estimate_throughput(req)
    monkeypatch.setattr(sharding_traffic, "ring_sm_share", lambda size, stride, lk: 0.0)
    free = estimate_throughput(req)
    assert held.breakdown.compute_s == free.breakdown.compute_s
    assert held.step_time_s > free.step_time_s
