"""Megatron's overlap_p2p_comm (on with virtual stages): the steady state's sends and receives run beside compute, the
warm-up forwards' and cool-down backwards' block their rank (issue 28); and the unnamed moe_a2a_overlap plan refused
with Megatron-FSDP over virtual stages like the named combined 1F1B (PP015)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.pipeline_counts import fused_share, steady_share
from meshplan.arithmetic.pipeline_timeline import Shape
from meshplan.arithmetic.schedule import plan_shape
from meshplan.estimate.layer_records import FORWARD_AND_BACKWARD
from meshplan.estimate.perf import step_terms
from meshplan.knowledge.cards import framework_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

L70 = dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, global_batch_size=64)


def test_steady_share_is_the_ops_after_the_warmup():
    """Rank r of interleaved 1F1B warms up 2(p - r - 1) + (v - 1)G forwards of its m*v; combined 1F1B one more, its
    steady ops being exactly its fused ones; the plain orders have no overlapped steady state."""
    p, v, m = 4, 2, 8
    inter = Shape("interleaved_1f1b", p, v, m, p)
    assert [steady_share(inter, r) for r in range(p)] == [(m * v - (2 * (p - r - 1) + (v - 1) * p)) / (m * v)
                                                        for r in range(p)]
    combined = Shape("combined_1f1b", p, v, m, p)
    assert all(steady_share(combined, r) == fused_share(combined, r) == steady_share(inter, r) - 1 / (m * v)
               for r in range(p))
    assert steady_share(Shape("1f1b", p, 1, m), 0) == 0.0
    assert steady_share(Shape("interleaved_1f1b", 2, 2, 1, 1), 0) == 0.0  # all warm-up: every transfer blocks


def test_the_cards_say_who_overlaps_the_steady_state():
    assert framework_card("megatron-core").pipeline.steady_p2p_overlap
    assert framework_card("megatron-bridge").pipeline.steady_p2p_overlap
    assert not framework_card("torchtitan").pipeline.steady_p2p_overlap


def _pp(fields: dict) -> tuple[list[float], float, object]:
    terms = step_terms(*resolve(parse_request(fields)))
    full = (1.0 - terms.ctx.cal.pp_overlap) * FORWARD_AND_BACKWARD * terms.plan.vpp * terms.inputs.pp_hop
    return [r.pp for r in terms.rows], full, terms


def test_megatron_with_virtual_stages_blocks_only_in_warmup_and_cooldown():
    pps, full, terms = _pp({**L70, "framework": "megatron-core", "vpp": 2})
    assert full > 0
    shape = plan_shape(framework_card("megatron-core"), 4, 2, terms.m, None)
    assert pps == pytest.approx([full * (1.0 - steady_share(shape, r)) for r in range(4)])
    assert pps[0] > pps[3]  # the first rank warms up longest


@pytest.mark.parametrize("fields", [
    {**L70, "framework": "megatron-core"},  # no virtual stages: batch_p2p_comm, every transfer blocks
    {**L70, "framework": "torchtitan", "vpp": 2, "zero_stage": 3},  # torch's schedules wait on every transfer
])
def test_every_transfer_blocks_without_the_overlap(fields):
    pps, full, _ = _pp(fields)
    assert full > 0 and pps == pytest.approx([full] * 4)


def test_the_report_counts_the_exposed_transfers_of_the_slowest_stage():
    on = api.estimate_throughput(parse_request({**L70, "framework": "megatron-core", "vpp": 2}))
    pps, full, terms = _pp({**L70, "framework": "megatron-core", "vpp": 2})
    assert on.breakdown.pp_comm_s == pytest.approx(terms.m * pps[terms.worst]) and pps[terms.worst] < full


def test_unnamed_overlap_with_fsdp_over_virtual_stages_is_refused():
    """combined_1f1b.py refuses EP overlap 1F1B with Megatron-FSDP for interleaved pipelines: moe_a2a_overlap runs it,
    named or not."""
    fields = dict(model="qwen3-30b-a3b", framework="megatron-core", num_gpus=64, pp=2, vpp=2, ep=8,
                  global_batch_size=64, zero_stage=3, moe_a2a_overlap=True)
    found = api.check_config(parse_request(fields)).findings
    assert any(f.id == "PP015" and f.severity == "error" for f in found)
