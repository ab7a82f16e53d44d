"""DeepSpeed ZeRO-3's parameter fetch (issue 24 item 4, ZeRO-3 at scale): one all-gather per submodule, and no
prefetch past a weight of at least stage3_max_live_parameters elements (the DeepSpeed card's zero3_prefetch, read from
runtime/zero/partitioned_param_coordinator.py fetch_sub_module)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.estimate.sharding_traffic import ShardUnit, exposed_sharding, unprefetched_shares
from meshplan.knowledge.cards import framework_card
from meshplan.request import resolve as resolver
from meshplan.schema.request import Request


def test_a_weight_after_one_over_the_live_limit_waits_whole():
    weights = [5.0, 1.0, 20.0, 20.0]  # forward order; the unit repeats
    fwd, bwd = unprefetched_shares(weights, 10.0)
    assert fwd == pytest.approx((5 + 20) / 46)  # after the previous unit's last (20) and after the third (20)
    assert bwd == pytest.approx((1 + 20) / 46)  # backward runs in reverse: after the third, after the fourth
    assert unprefetched_shares(weights, 100.0) == (0.0, 0.0)


def test_waiting_gathers_are_exposed_whole_the_rest_behind_the_unit_before():
    hidden = [ShardUnit(3, gather=1.0, reduce=0.0, fwd=2.0, bwd=4.0)]
    waiting = [hidden[0]._replace(waits_fwd=0.5, waits_bwd=0.25)]
    assert exposed_sharding(hidden, True, False, False) == pytest.approx(1.0)  # the first gather only
    assert exposed_sharding(waiting, True, False, False) == pytest.approx(1.0 + 2 * 0.5)
    assert exposed_sharding(hidden, False, True, False) == pytest.approx(1.0)
    assert exposed_sharding(waiting, False, True, False) == pytest.approx(1.0 + 2 * 0.25)


def test_deepspeed_zero3_pays_a_collective_per_weight_and_waits_past_the_live_limit(monkeypatch):
    """GPT-3 175B at tp 1 (fc1 and fc2 hold 6.0e8 elements each): under the card's limit (1e9) every weight is
    prefetched but gathered in its own collective; under a limit of 1e8 the weights after fc1 and fc2 wait whole;
    without the coordinator's facts a layer is one collective, prefetched behind the layer before."""
    req = Request(model="gpt3-175b", gpu="a100-80gb", num_gpus=512, framework="deepspeed", tp=1, pp=1, zero_stage=3,
                  seq_length=2048, micro_batch_size=1, global_batch_size=512, recompute="full")
    card = framework_card("deepspeed")

    def dp_comm(prefetch) -> float:
        monkeypatch.setattr(resolver, "framework_card", lambda name: card.model_copy(  # the card the job carries
            update={"zero3_prefetch": prefetch}))
        return api.estimate_throughput(req).breakdown.dp_comm_s

    tight = card.zero3_prefetch.model_copy(update={"max_live_parameters": 1e8})
    assert dp_comm(None) < dp_comm(card.zero3_prefetch) < dp_comm(tight)
