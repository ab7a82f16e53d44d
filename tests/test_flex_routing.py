"""Learned routing's destinations under the flex (DeepEP) dispatcher: the expected EP ranks and NVLink domains one
token's top_k distinct experts reach (comm.learned_routing), checked against enumeration and sampling."""

from __future__ import annotations

import itertools
import random

import pytest

from meshplan.arithmetic.comm import Links, dispatch_time, flex_dispatch_time, learned_routing

LK = Links(domain=8, intra_bw=360e9, inter_bw=40e9, intra_lat=5e-6, inter_lat=10e-6, nic_scaling=1.0, node=8)


def _pools(experts: int, num_groups: int, group_topk: int) -> list[list[int]]:
    """The experts a token may pick, one list per equally likely choice of groups (one list when ungrouped)."""
    if num_groups <= 1 or group_topk >= num_groups:
        return [list(range(experts))]
    per = experts // num_groups
    return [[e for g in picked for e in range(g * per, (g + 1) * per)]
            for picked in itertools.combinations(range(num_groups), group_topk)]


def _spread(picked, local: int, span: int) -> tuple[int, int]:
    return len({e // local for e in picked}), len({e // span for e in picked})


def enumerated(experts, top_k, ep, domain_ranks, num_groups=1, group_topk=1) -> tuple[float, float]:
    """Every choice of groups and every top_k subset of their experts, equally likely, counted."""
    local = experts // ep
    span = local * min(domain_ranks, ep)
    ranks = domains = n = 0
    for pool in _pools(experts, num_groups, group_topk):
        for picked in itertools.combinations(pool, top_k):
            r, d = _spread(picked, local, span)
            ranks, domains, n = ranks + r, domains + d, n + 1
    return ranks / n, domains / n


@pytest.mark.parametrize("case", [
    (8, 2, 4, 2), (12, 3, 4, 2), (12, 3, 6, 4),  # the last: 6 ranks in domains of 4 and 2
    (16, 4, 8, 2, 4, 2),  # a rank inside a group of 4
    (12, 3, 6, 2, 4, 2),  # groups of 3 straddling ranks of 2
    (12, 2, 3, 1, 6, 3),  # a rank holding two whole groups
    (16, 5, 4, 2, 4, 3),
])
def test_expectation_matches_enumeration(case):
    assert learned_routing(*case) == pytest.approx(enumerated(*case), rel=1e-12)


def test_expectation_matches_sampling_at_a_real_size():
    # DeepSeek-V3's routing (256 experts, top-8 of 4 of 8 groups) at EP64 over 8-GPU nodes, sampled
    rng = random.Random(47)
    experts, top_k, ep, per = 256, 8, 64, 32
    ranks = domains = 0
    draws = 20000
    for _ in range(draws):
        groups = rng.sample(range(8), 4)
        picked = rng.sample([e for g in groups for e in range(g * per, (g + 1) * per)], top_k)
        r, d = _spread(picked, experts // ep, experts // ep * 8)
        ranks, domains = ranks + r, domains + d
    want = learned_routing(experts, top_k, ep, 8, 8, 4)
    assert ranks / draws == pytest.approx(want[0], abs=0.03)
    assert domains / draws == pytest.approx(want[1], abs=0.03)


def test_limits():
    assert learned_routing(128, 1, 8, 8) == pytest.approx((1.0, 1.0))  # top-1: one rank, one domain
    assert learned_routing(256, 1, 64, 8, 8, 4) == pytest.approx((1.0, 1.0))
    assert learned_routing(128, 8, 1, 1) == pytest.approx((1.0, 1.0))  # every expert on one rank
    # one expert per rank: top_k distinct experts are top_k distinct ranks
    assert learned_routing(64, 6, 64, 8)[0] == pytest.approx(6.0)
    # never more ranks than copies or than the group, never more domains than ranks
    for case in [(128, 8, 8, 8), (256, 8, 64, 8, 8, 4), (384, 8, 32, 8), (160, 6, 16, 4)]:
        ranks, domains = learned_routing(*case)
        assert 1.0 <= domains <= ranks <= min(case[1], case[2])


def test_flex_dispatch_charges_destination_ranks_not_copies():
    copy = 1e6
    ranks, domains = learned_routing(256, 8, 64, 8)
    assert dispatch_time(copy, 8, 64, 1, LK, dedup=True, experts=256) == flex_dispatch_time(
        copy, ranks, domains, 64, 1, LK)
    # NVLink: each off-rank destination once; the network: each off-node destination node once
    assert flex_dispatch_time(copy, ranks, domains, 64, 1, LK) == pytest.approx(
        max(copy * ranks * 63 / 64 / LK.intra_bw, copy * domains * 7 / 8 / LK.inter_bw) + LK.inter_lat)


def test_flex_dispatch_refuses_experts_it_cannot_place():
    with pytest.raises(ValueError, match="experts \\(100\\) split evenly over the 8 EP ranks"):
        dispatch_time(1e6, 8, 8, 1, LK, dedup=True, experts=100)
    with pytest.raises(ValueError, match="top_k 8 exceeds the 4 experts"):
        learned_routing(64, 8, 8, 8, 16, 1)


def test_flex_inside_a_domain_takes_the_slower_of_the_backend_copies_and_nvlink():
    """Inside one NVLink domain a rank receives every delivery (its own rank's too) at the backend's achieved
    bandwidth (Links.flex_bw, the SMs' copies), or its off-rank share at NVLink's, whichever is slower; without a
    figure (flex_bw ()) NVLink alone, the plain all-to-all of the delivered copies."""
    from dataclasses import replace

    from meshplan.arithmetic.comm import alltoall_time

    copy, ranks = 1e6, 5.3
    link = ranks * copy * 7 / 8 / LK.intra_bw
    assert flex_dispatch_time(copy, ranks, 1.0, 8, 1, LK) == alltoall_time(ranks * copy, 8, 1, LK)
    slow = replace(LK, flex_bw=((1, 200e9),))  # below 360 x 8/7: the SMs bound it
    assert flex_dispatch_time(copy, ranks, 1.0, 8, 1, slow) == pytest.approx(ranks * copy / 200e9 + LK.intra_lat)
    fast = replace(LK, flex_bw=((1, 1e12),))  # above the link: NVLink bounds it
    assert flex_dispatch_time(copy, ranks, 1.0, 8, 1, fast) == pytest.approx(link + LK.intra_lat)
    # across domains the network term is what it was, whatever the backend reaches inside one
    wide = flex_dispatch_time(copy, ranks, 2.0, 64, 1, LK)
    assert flex_dispatch_time(copy, ranks, 2.0, 64, 1, slow) == wide


def test_links_carry_the_backend_meshplan_renders_on_that_gpu():
    """links() times the flex dispatch as the backend mesh.flex_backend picks: DeepEP in an 8-GPU node (Hopper,
    B200), HybridEP where the NVLink domain spans nodes (GB200 NVL72), each at its generation's card figure; a
    generation the card lists no figure for (Ampere, CDNA3) runs at NVLink's."""
    from meshplan.arithmetic.comm import links
    from meshplan.arithmetic.mesh import flex_backend
    from meshplan.knowledge.calibration import calibration, flex_dispatch_bandwidth
    from meshplan.knowledge.hardware import get_gpu

    cal = calibration("megatron-core")
    picks = {}
    for key in ("h100", "b200", "gb200", "a100-80gb", "mi300x"):
        gpu = get_gpu(key)
        picks[key] = (flex_backend(gpu, gpu.gpus_per_node), links(gpu, gpu.gpus_per_node, cal).flex_at(8))
    assert picks["h100"] == ("deepep", flex_dispatch_bandwidth("deepep", "hopper"))
    assert picks["b200"] == ("deepep", flex_dispatch_bandwidth("deepep", "blackwell"))
    assert picks["gb200"] == ("hybridep", flex_dispatch_bandwidth("hybridep", "blackwell"))
    assert picks["a100-80gb"] == ("deepep", 0.0)
    assert picks["mi300x"] == ("deepep", 0.0)
    # DeepEP on Blackwell copies faster per SM than on Hopper, and HybridEP's TMA copies beat both
    assert picks["h100"][1] < picks["b200"][1] < picks["gb200"][1]


def test_an_unknown_flex_backend_is_refused():
    from meshplan.knowledge.calibration import flex_dispatch_bandwidth
    from meshplan.knowledge.cards import CardError

    with pytest.raises(CardError, match="ncclep"):
        flex_dispatch_bandwidth("ncclep", "hopper")


# deepseek-ai/DeepEP branch hybrid-ep docs/README_Hybrid-EP.md, GB200, 32 SMs, Torch API: (dispatch BF16, combine) GB/s
# by the ranks of one NVLink domain (cards/calibration.yaml flex_dispatch.hybridep)
HYBRIDEP_GB200_32_SMS = {8: (545.71, 568.94), 16: (523.48, 521.55), 24: (507.32, 483.76), 32: (484.22, 464.54),
                         36: (479.02, 447.89)}


def test_hybridep_on_gb200_slows_with_the_ranks_it_spans_as_its_table_measures():
    """HybridEP's achieved bandwidth on GB200 is the table's mean of dispatch and combine at the EP ranks the dispatch
    spans in the NVL72 domain, read linearly between the measured rank counts, the first's below 8 ranks and the last
    measured one's (36) past it. The card had the 8-rank figure at every count."""
    from meshplan.knowledge.calibration import flex_dispatch_bandwidth

    mean = {r: (d + c) / 2 * 1e9 for r, (d, c) in HYBRIDEP_GB200_32_SMS.items()}
    for ranks, bw in mean.items():
        assert flex_dispatch_bandwidth("hybridep", "blackwell", ranks) == pytest.approx(bw, rel=1e-3)
    assert flex_dispatch_bandwidth("hybridep", "blackwell", 20) == pytest.approx((mean[16] + mean[24]) / 2, rel=1e-3)
    assert flex_dispatch_bandwidth("hybridep", "blackwell", 4) == pytest.approx(mean[8], rel=1e-3)
    assert flex_dispatch_bandwidth("hybridep", "blackwell", 64) == pytest.approx(mean[36], rel=1e-3)
    # DeepEP's figure is one number whatever the ranks (its intranode kernels reach at most 8)
    assert flex_dispatch_bandwidth("deepep", "hopper", 2) == flex_dispatch_bandwidth("deepep", "hopper", 8)


def test_deepep_on_hopper_is_the_h100_measurement_at_megatrons_20_sms():
    """DeepEP on Hopper at Megatron-Core's moe_deepep_num_sms of 20: tile-ai/tilescale's DeepEP comparison on 8 H100
    ('10 channels', deep_ep.Buffer's default 20 SMs), dispatch BF16 328.97 GB/s and combine 287.14, their mean; the
    card had 281 GB/s, scaled from an H20 maximum at 24 SMs."""
    from meshplan.knowledge.calibration import flex_dispatch_bandwidth

    assert flex_dispatch_bandwidth("deepep", "hopper") == pytest.approx((328.97 + 287.14) / 2 * 1e9, rel=1e-3)


def test_a_gb200_dispatch_over_32_ranks_runs_at_the_32_rank_figure():
    """On GB200 NVL72 an EP32 flex dispatch inside one domain receives its copies at HybridEP's 32-rank bandwidth,
    (484.22 + 464.54) / 2 GB/s, where NVLink (900 GB/s x nvlink_efficiency) is faster, and an EP8 one at the 8-rank
    (545.71 + 568.94) / 2: the same bytes take 557.3 / 474.4 times as long over 32 ranks."""
    from meshplan.arithmetic.comm import links
    from meshplan.knowledge.calibration import calibration
    from meshplan.knowledge.hardware import get_gpu

    gpu = get_gpu("gb200")
    lk = links(gpu, gpu.gpus_per_node, calibration("megatron-core"), domain=64)
    copy, ranks = 8192 * 4096 * 2.0, 7.36
    for ep in (8, 32):
        d, c = HYBRIDEP_GB200_32_SMS[ep]
        expected = copy * ranks / ((d + c) / 2 * 1e9) + lk.intra_lat
        assert flex_dispatch_time(copy, ranks, 1.0, ep, 1, lk) == pytest.approx(expected, rel=1e-3)


def test_a_flex_bandwidth_table_with_a_non_positive_entry_is_refused():
    from pydantic import ValidationError

    from meshplan.knowledge.calibration import FlexBackend

    with pytest.raises(ValidationError, match="positive"):
        FlexBackend(by_arch={"blackwell": {8: 5e11, 16: 0.0}}, meaning="m", source="s")
    with pytest.raises(ValidationError, match="positive"):
        FlexBackend(by_arch={"blackwell": {}}, meaning="m", source="s")
