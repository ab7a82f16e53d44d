"""Group-limited routing (HF n_group / topk_group, Megatron-Core moe_router_num_groups / moe_router_group_topk):
the model reads it, and the flex dispatcher's cross-node traffic follows it."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations
from math import comb

import pytest

from meshplan.arithmetic.comm import _missed, dispatch_time, learned_routing, links
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import estimate_throughput, step_terms
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import model_card
from meshplan.knowledge.catalog import catalog_architecture
from meshplan.knowledge.hardware import get_gpu
from meshplan.knowledge.model_config import architecture_from_config
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def test_catalog_carries_the_published_groups():
    v3, v2, k2 = (catalog_architecture(k).moe for k in ("deepseek-v3", "deepseek-v2", "kimi-k2"))
    assert (v3.num_groups, v3.group_topk) == (8, 4)
    assert (v2.num_groups, v2.group_topk) == (8, 3)
    assert (k2.num_groups, k2.group_topk) == (1, 1)
    assert catalog_architecture("qwen3-30b-a3b").moe.num_groups == 1


def _v3(**over):
    cfg = {**model_card("deepseek-v3").config, **over}
    return architecture_from_config(cfg)


def test_config_groups_are_checked_like_megatron_core():
    assert _v3().moe.num_groups == 8
    with pytest.raises(MeshplanError, match="does not divide the 256 routed experts"):
        _v3(n_group=6)
    with pytest.raises(MeshplanError, match="topk_group = 9 is out of range"):
        _v3(topk_group=9)
    with pytest.raises(MeshplanError, match="exceeds the 4 experts"):
        _v3(n_group=64, topk_group=1)
    assert _v3(topk_method="greedy").moe.num_groups == 1  # transformers' DeepSeek-V2 greedy ignores groups


def _gone(held: int, pool: int, k: int = 8) -> float:
    """Chance none of k distinct experts drawn from `pool` is among `held` of them."""
    return comb(pool - held, k) / comb(pool, k)


def test_group_limited_routing_reaches_fewer_nodes_exact_cases():
    # ungrouped, 8 nodes of 32 of 256 experts: each node is missed by all 8 distinct picks with C(224,8)/C(256,8)
    assert learned_routing(256, 8, 64, 8)[1] == pytest.approx(8 * (1 - _gone(32, 256)))
    # DeepSeek-V3 EP64 over 8 nodes: a node holds one group of 32, picked with chance 4/8; then the 8 copies
    # fall among 4 groups' 128 experts.
    assert learned_routing(256, 8, 64, 8, 8, 4)[1] == pytest.approx(8 * 0.5 * (1 - _gone(32, 128)))
    # 4 nodes of 2 groups: hypergeometric h of the node's groups picked (C(2,h) C(6,4-h) / C(8,4)).
    assert learned_routing(256, 8, 32, 8, 8, 4)[1] == pytest.approx(
        4 * (40 / 70 * (1 - _gone(32, 128)) + 15 / 70 * (1 - _gone(64, 128))))
    # A node inside a group (EP256: 8 experts per node, groups of 32); its one-expert ranks alike.
    assert learned_routing(256, 8, 256, 8, 8, 4) == pytest.approx(
        (256 * 0.5 * (1 - _gone(1, 128)), 32 * 0.5 * (1 - _gone(8, 128))))
    # every group allowed, or unequal groups: the ungrouped expectation
    assert learned_routing(256, 8, 64, 8, 8, 8) == pytest.approx(learned_routing(256, 8, 64, 8))
    assert learned_routing(260, 8, 65, 5, 8, 4) == pytest.approx(learned_routing(260, 8, 65, 5))


def _missed_by_enumeration(lo: int, hi: int, experts: int, top_k: int, groups: int, group_topk: int) -> Fraction:
    """Every choice of group_topk groups, then of top_k of their experts, counted one by one."""
    size = experts // groups
    misses = total = 0
    for picked in combinations(range(groups), group_topk):
        pool = [e for g in picked for e in range(g * size, (g + 1) * size)]
        for chosen in combinations(pool, top_k):
            total += 1
            misses += not any(lo <= e < hi for e in chosen)
    return Fraction(misses, total)


@pytest.mark.parametrize("lo, hi", [(2, 7), (0, 3), (4, 5), (1, 11), (0, 12), (6, 9)])
def test_group_limited_miss_is_the_enumerated_chance(lo, hi):
    # 12 experts in 4 groups of 3, 2 groups picked, 2 experts of their 6: blocks inside a group, across two with
    # unequal shares, over whole groups, every expert; the count over the groups the block touches, the others alike
    assert _missed(lo, hi, 12, 2, 4, 2) == float(_missed_by_enumeration(lo, hi, 12, 2, 4, 2))


def test_groups_cut_only_the_flex_dispatchers_bytes():
    cal = calibration("megatron-core")
    lk = links(get_gpu("h100"), 8, cal)
    copy = 1e6
    plain = dispatch_time(copy, 8, 64, 1, lk, dedup=False, experts=256)
    assert dispatch_time(copy, 8, 64, 1, lk, dedup=False, experts=256, num_groups=8, group_topk=4) == plain
    grouped = dispatch_time(copy, 8, 64, 1, lk, dedup=True, experts=256, num_groups=8, group_topk=4)
    ranks, nodes = learned_routing(256, 8, 64, 8, 8, 4)
    assert grouped == pytest.approx(max(copy * ranks * 63 / 64 / lk.intra_bw, copy * nodes * 7 / 8 / lk.inter_bw)
                                    + lk.inter_lat)
    assert grouped < dispatch_time(copy, 8, 64, 1, lk, dedup=True, experts=256)


def test_deepseek_v3_flex_step_follows_the_groups():
    job, plan = resolve(Request(model="deepseek-v3", num_gpus=1024, tp=2, pp=8, ep=64,
                                first_stage_layers=7, last_stage_layers=6, global_batch_size=8192, seq_length=4096,
                                moe_token_dispatcher="flex"))
    moe = job.model.moe
    ungrouped = job.model_copy(update={"model": job.model.model_copy(
        update={"moe": moe.model_copy(update={"num_groups": 1, "group_topk": 1})})})
    grouped_est, plain_est = estimate_throughput(job, plan), estimate_throughput(ungrouped, plan)
    assert grouped_est.breakdown.ep_comm_s < plain_est.breakdown.ep_comm_s
    # The groups cut every stage's dispatch and no stage's compute. The breakdown's compute is its slowest stage's,
    # which the cut may change: grouped, the last stage (6 MoE layers, the MTP block, and the output layer and loss
    # twice, for the main loss and the MTP depth's) over a middle one (8 MoE layers, whose all-to-all the groups cut
    # more: 8 against 7 MoE layers' worth).
    grouped, plain = step_terms(job, plan), step_terms(ungrouped, plan)
    assert [row.compute for row in grouped.rows] == [row.compute for row in plain.rows]
    assert all(g.ep < p.ep for g, p in zip(grouped.rows, plain.rows, strict=True))
    for est, terms in ((grouped_est, grouped), (plain_est, plain)):
        assert est.breakdown.compute_s == terms.m * terms.rows[terms.worst].compute
    assert any("topk_group = 4 of n_group = 8" in a for a in grouped_est.assumptions)
    alltoall = plan.model_copy(update={"moe_token_dispatcher": "alltoall"})
    assert (estimate_throughput(job, alltoall).breakdown.ep_comm_s
            == estimate_throughput(ungrouped, alltoall).breakdown.ep_comm_s)


def test_both_megatron_faces_render_the_models_groups():
    from meshplan.adapters.render import render

    fields = dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, global_batch_size=4096, recompute="full",
                  recompute_layers=1, first_stage_layers=4, last_stage_layers=1)
    core = render("megatron-core", *resolve(Request(framework="megatron-core", **fields))).text
    assert "--moe-router-num-groups 8" in core and "--moe-router-group-topk 4" in core
    bridge = render("megatron-bridge", *resolve(Request(framework="megatron-bridge", **fields))).text
    assert "cfg.model.moe_router_num_groups = 8" in bridge and "cfg.model.moe_router_group_topk = 4" in bridge
    qwen = dict(model="qwen3-30b-a3b", num_gpus=16, ep=8, global_batch_size=256)
    assert "router-num-groups" not in render("megatron-core", *resolve(Request(framework="megatron-core", **qwen))).text
