"""Megatron-FSDP / FSDP2 / ZeRO-3 traffic runs on its own streams and communicators (Megatron-FSDP's
side_stream_for_param_gather and reduce-scatter stream, FSDP2's all-gather and reduce-scatter streams): while the
compute stream waits on a layer's own TP / CP / EP collective over other links, the sharding traffic keeps moving.
And Megatron-FSDP shards routed experts over expert-DP only: their all-gather is a ring over world/(pp*ep*etp) ranks
spaced ep*etp apart, moving the rank's local experts."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.comm import ring_time
from meshplan.estimate.layer_records import BF16, LayerTime
from meshplan.estimate.perf import step_terms
from meshplan.estimate.stage_time import layer_param_split, layer_sums, other_link_collectives, stage_kinds
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

QWEN = dict(model="qwen3-30b-a3b", gpu="h100", framework="megatron-core", seq_length=4096, micro_batch_size=1,
            zero_stage=3, tp=1, pp=1)


def _terms(**fields):
    return step_terms(*resolve(Request(**(QWEN | fields))))


def test_expert_gather_is_a_ring_over_expert_dp_of_the_local_experts():
    t = _terms(num_gpus=32, ep=8, global_batch_size=64)
    inp = t.inputs
    assert (inp.traffic.expert.size, inp.traffic.expert.stride) == (4, 8)  # 32 / (1*8*1), one rank per node
    assert (inp.traffic.dense.size, inp.traffic.dense.stride) == (32, 1)
    dense, experts = layer_param_split(inp.job.model)
    local_experts = experts[1] / 8
    hand = ring_time(dense[1] * BF16, 32, 1, inp.ctx.lk) + ring_time(local_experts * BF16, 4, 8, inp.ctx.lk)
    assert inp.traffic(dense[1], local_experts, BF16) == pytest.approx(hand)


def test_collectives_on_other_links_widen_the_window_that_hides_sharding_traffic():
    """EP inside the node while the FSDP rings cross nodes: the layer's exposed all-to-alls (half forward) widen
    both windows; TP and CP in the node the same (each by its forward share)."""
    inp = _terms(num_gpus=32, ep=8, global_batch_size=64).inputs
    lt = LayerTime(gemm=1.0, tp=0.4, tp_fwd=0.2, cp=0.3, cp_fwd=0.1, ep=0.6, fwd_compute=0.3)
    assert other_link_collectives(lt, inp, True) == pytest.approx((0.2 + 0.1 + 0.3, 0.2 + 0.2 + 0.3))


def test_collectives_on_the_same_links_share_their_bandwidth_instead():
    """EP 16 across two nodes and FSDP across them too: the all-to-alls use the NICs the rings need, left out; an
    8-GPU job keeps every ring in the node, so in-node collectives share NVLink with it."""
    lt = LayerTime(gemm=1.0, tp=0.4, tp_fwd=0.2, ep=0.6, fwd_compute=0.3)
    cross = _terms(num_gpus=32, ep=16, global_batch_size=64).inputs
    assert other_link_collectives(lt, cross, True) == pytest.approx((0.2, 0.2))  # TP (in the node) only
    in_node = _terms(num_gpus=8, ep=8, global_batch_size=16).inputs
    assert other_link_collectives(lt, in_node, True) == (0.0, 0.0)


def test_the_fsdp_units_windows_hold_the_layer_s_in_node_all_to_alls():
    """A Megatron-FSDP MoE layer's (forward, backward) window is its compute plus half its exposed all-to-alls each
    way; under the distributed optimizer (no per-unit traffic) the windows stay the compute alone."""
    t = _terms(num_gpus=32, ep=8, global_batch_size=64, recompute="none")
    moe = t.inputs.moe
    layers = t.inputs.pipeline.layers(0)
    sums = layer_sums(len(layers), stage_kinds(0, layers, t.inputs), t.inputs)
    assert moe.ep > 0
    assert sums.windows[True] == pytest.approx((moe.fwd_compute + moe.ep / 2,
                                                moe.compute - moe.fwd_compute + moe.ep / 2))
    t1 = _terms(num_gpus=32, ep=8, global_batch_size=64, recompute="none", zero_stage=1)
    sums1 = layer_sums(len(layers), stage_kinds(0, layers, t1.inputs), t1.inputs)
    assert sums1.windows[True] == pytest.approx((moe.fwd_compute, moe.compute - moe.fwd_compute))
