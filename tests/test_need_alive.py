"""engine.need_alive: the rules' level reads the first rank's floors at the ZeRO stages the rules pass. The floor
level's least recompute (need_floor) is the least at any ZeRO stage; where the rules reject the stages whose floors fit
with less recompute, those left need more: Kimi-K2's interleaved layouts whose ZeRO 3 breaks PP015 and whose ZeRO 0
is over leave ZeRO 1 alone, which needs full recompute, or nothing fits. Such a node is settled (nothing fits) or keyed
at the heavier recompute's pipeline bound before the NEED level's memory estimates."""

from __future__ import annotations

from meshplan.arithmetic.schedule import VirtualSplit
from meshplan.estimate.memory import estimate_memory
from meshplan.search.engine import Level
from meshplan.search.space import Layout
from tests.test_ranks_floor import kimi_search

GIB = 2**30
# TP8 PP2 VPP31, one layer per virtual stage and a loss-only last one
PP2_VPP31 = Layout(tp=8, pp=2, cp=1, ep=128, etp=1, dp=16, vpp=31,
                   split=VirtualSplit(counts=(1,) * 61 + (0,), loss=True))
# TP1 PP8 VPP4 CP8 EP32 DP4, "Et|(tt|)*30L"
PP8_VPP4 = Layout(tp=1, pp=8, cp=8, ep=32, etp=1, dp=4, vpp=4,
                  split=VirtualSplit(counts=(1,) + (2,) * 30 + (0,), layout="Et|(tt|)*30L"))


def alive_zeros(search, lay, mbs):
    return [zero for zero in search.zeros if not search.check_error(lay, zero, search.recomputes[0], mbs)
            and search.states_bound(lay, zero) <= search.budget and search.ranks_bytes(lay, zero) <= search.budget]


def memory_rejections(search) -> int:
    return sum(count for rule, count in search.rejected.items() if rule in {"MEM001", "MEM002"})


def test_a_node_whose_alive_stages_floors_leave_no_recompute_is_settled_at_the_rules_level():
    """Under a 71.7 GiB budget (10% headroom) ZeRO 3 fits with full recompute by its floors, so the floor level keeps
    the node; the rules reject ZeRO 3 (PP015), and ZeRO 1's floor is over with every recompute: every plan of the
    alive stage is rejected under the memory rule, with no memory estimate and no NEED node."""
    search = kimi_search(budget_bytes=int(0.9 * 79.6 * GIB))
    needs = search.zero_needs(PP2_VPP31, 2)
    n_r = len(search.recomputes)
    assert search.need_floor(PP2_VPP31, 2) < n_r
    alive = alive_zeros(search, PP2_VPP31, 2)
    assert alive and all(needs[search.zeros.index(zero)] == n_r for zero in alive)
    calls = search.memory_calls
    search.apply_rules(0.0, PP2_VPP31, 2, search.need_floor(PP2_VPP31, 2))
    assert not search.heap
    assert search.memory_calls == calls
    assert sum(search.rejected.values()) == n_r * len(search.zeros)  # the rejected stages' by the rules' level
    assert memory_rejections(search) >= n_r * len(alive)


def test_a_node_whose_alive_stages_need_more_recompute_is_keyed_at_that_recomputes_bound():
    """At the full 79.6 GiB the alive stage's floors fit with full recompute only: the NEED node carries that
    recompute as its low with its pipeline bound as its key, the lighter ones counted under the memory rule (each
    really over: the estimate's own fit figure), and what it stands for plus those counted is every plan of it."""
    search = kimi_search()
    n_r = len(search.recomputes)
    low = search.need_floor(PP8_VPP4, 1)
    alive = alive_zeros(search, PP8_VPP4, 1)
    needs = search.zero_needs(PP8_VPP4, 1)
    floor = min(needs[search.zeros.index(zero)] for zero in alive)
    assert low < floor < n_r and len(alive) < len(search.zeros)
    search.apply_rules(0.0, PP8_VPP4, 1, low)
    (key, level, _, payload), = search.heap
    assert level == Level.NEED and payload == (PP8_VPP4, 1, tuple(alive), floor)
    assert key == search.pipeline_bound(PP8_VPP4, 1, search.recomputes[floor], interleave=True)
    counted = sum(search.rejected.values())
    assert counted == n_r * (len(search.zeros) - len(alive)) + floor * len(alive)
    assert counted + search.covered(level, payload) == n_r * len(search.zeros)
    search.heap.clear()
    search.confirm_need(key, *payload)  # counts from its low up, what it leaves queued stands for the rest
    assert sum(search.rejected.values()) + sum(search.covered(entry[1], entry[3]) for entry in search.heap) \
        == n_r * len(search.zeros)
    for zero in alive:
        for recompute in search.recomputes[:floor]:
            plan = search.plan(PP8_VPP4, zero, recompute, 1)
            assert estimate_memory(search.job, plan).fit_bytes > search.budget, (zero, recompute)
