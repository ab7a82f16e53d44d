"""engine.need_alive: the rules' level reads the first rank's floors at the ZeRO stages and recomputes the rules pass.
The floor level's least recompute (need_floor) is the least at any ZeRO stage; where the rules reject the stages or
recomputes whose floors fit with less, those left need more: Kimi-K2's interleaved layouts with moe_a2a_overlap asked
for, whose ZeRO 3 breaks PP015, whose full recompute breaks EP009 and whose ZeRO 0 is over, leave ZeRO 1 without full
recompute, where nothing fits; DeepSpeed's activation offload needs full recompute (OF002) on a layout whose floors
fit with none. Such a node is settled (nothing fits) or keyed at the heavier recompute's pipeline bound before the
NEED level's memory estimates."""

from __future__ import annotations

import math

from meshplan.arithmetic.schedule import VirtualSplit
from meshplan.estimate.memory import estimate_memory
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.engine import Level
from meshplan.search.impossible import reaches_need
from meshplan.search.policy import headroom_for, memory_budget
from meshplan.search.space import Fixed, Layout

GIB = 2**30
# TP8 PP2 VPP31, one layer per virtual stage and a loss-only last one
PP2_VPP31 = Layout(tp=8, pp=2, cp=1, ep=128, etp=1, dp=16, vpp=31,
                   split=VirtualSplit(counts=(1,) * 61 + (0,), loss=True))
TP2 = Layout(tp=2, pp=1, cp=1, ep=1, etp=1, dp=1)


def search_of(req: Request, budget_bytes: int = 0) -> BestFirstSearch:
    job, _ = search_job(req)
    return BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 5,
                                   budget_bytes=budget_bytes)


def masks_of(search, lay, mbs) -> dict[int, int]:
    """Per ZeRO stage the rules and the model-state bounds leave: the mask of the recomputes the rules pass."""
    out = {}
    for zero in search.zeros:
        mask = sum(1 << i for i, error in enumerate(search.check_errors(lay, zero, mbs)) if error is None)
        budget = search.budget
        if mask and search.states_bound(lay, zero) <= budget and search.ranks_bytes(lay, zero) <= budget:
            out[zero] = mask
    return out


def memory_rejections(search) -> int:
    return sum(count for rule, count in search.rejected.items() if rule in {"MEM001", "MEM002"})


def test_a_node_whose_alive_stages_floors_leave_no_recompute_is_settled_at_the_rules_level():
    """Kimi-K2 with moe_a2a_overlap asked for, under a 71.7 GiB budget (10% headroom): ZeRO 3 fits with full
    recompute by its floors, so the floor level keeps the node; the rules reject ZeRO 3 (PP015) and full recompute at
    every stage (EP009), and ZeRO 1's floor is over with the recomputes left: every plan the rules pass is rejected
    under the memory rule, each refused one under its rule, with no memory estimate and no NEED node."""
    search = search_of(Request(model="kimi-k2", num_gpus=256, gpu="h100", moe_a2a_overlap=True),
                       budget_bytes=int(0.9 * 79.6 * GIB))
    n_r = len(search.recomputes)
    needs = search.zero_needs(PP2_VPP31, 2)
    assert search.need_floor(PP2_VPP31, 2) < n_r
    masks = masks_of(search, PP2_VPP31, 2)
    assert masks == {1: 0b011} and needs[search.zeros.index(1)] == n_r
    calls = search.memory_calls
    search.apply_rules(0.0, PP2_VPP31, 2, search.need_floor(PP2_VPP31, 2))
    assert not search.heap
    assert search.memory_calls == calls
    assert sum(search.rejected.values()) == n_r * len(search.zeros)
    assert search.rejected["PP015"] == 2 and search.rejected["EP009"] == 3  # full at every ZeRO stage
    assert memory_rejections(search) == n_r * len(search.zeros) - 5


def test_a_node_whose_rules_pass_a_heavier_recompute_only_is_keyed_at_that_recomputes_bound():
    """DeepSpeed offloads only the inputs its activation checkpointing keeps (OF002): with activation_offload the
    rules pass full recompute only, though TP2's floors fit with none at every ZeRO stage. The NEED node carries full
    recompute as its low with its pipeline bound as its key, the lighter plans counted under OF002, none under the
    memory rule; what it stands for plus those counted is every plan of it, and its estimates are at full only.
    No headroom: ZeRO 0 is BF16_Optimizer, whose unsharded fp32 gradient buffer beside the bf16 gradients makes its
    model states 20 bytes a parameter at DP1 (74.8 GiB of TP2's 4B), over a 10%-headroom budget (71.7 GiB) and within
    the whole card (79.6 GiB), so every ZeRO stage reaches the rules."""
    req = Request(model="llama-3.1-8b", num_gpus=2, gpu="h100", framework="deepspeed", activation_offload=True,
                  seq_length=2048, global_batch_size=8, headroom=0.0)
    search = search_of(req)
    search.budget_bytes = memory_budget(search.job, headroom_for(req))
    n_r = len(search.recomputes)
    low = search.need_floor(TP2, 2)
    full = 1 << (n_r - 1)
    assert low == 0 and masks_of(search, TP2, 2) == {zero: full for zero in search.zeros}
    search.apply_rules(0.0, TP2, 2, low)
    (key, level, _, payload), = search.heap
    assert level == Level.NEED and payload == (TP2, 2, search.zeros, (full,) * len(search.zeros), n_r - 1)
    assert key == search.pipeline_bound(TP2, 2, "full", interleave=True)
    assert +search.rejected == {"OF002": (n_r - 1) * len(search.zeros)}
    assert sum(search.rejected.values()) + search.covered(level, payload) == n_r * len(search.zeros)
    search.heap.clear()
    search.confirm_need(key, *payload)
    (_, level, _, payload), = search.heap
    assert level == Level.STAIRCASE
    search.heap.clear()
    search.staircase(key, *payload)
    assert search.heap and {entry[3][3] for entry in search.heap} == {"full"}
    assert sum(search.rejected.values()) + sum(search.covered(entry[1], entry[3]) for entry in search.heap) \
        == n_r * len(search.zeros)
    assert all(recompute == "full" for (_, _, recompute, _) in search.caches.memory) and search.memory_calls > 0
    for _, _, _, (lay, mbs, zero, recompute) in search.heap:  # each stage's least recompute that fits: full
        assert estimate_memory(search.job, search.plan(lay, zero, recompute, mbs)).fit_bytes <= search.budget


def test_the_probe_proof_follows_a_node_to_the_need_level():
    """impossible.reaches_need (the thinner-headroom probe's proof, below_settled) asks a node through the rules' level
    as the search pops it: the Kimi-K2 node above reaches the rules but no NEED node, so it cannot make the probe
    rank anything at any cutoff (before, reaching the rules alone left the probe to run); the DeepSpeed node reaches
    NEED at its full recompute's pipeline bound, so it does at that cutoff and not under it. Nothing is counted in
    the search's own rejections."""
    kimi = search_of(Request(model="kimi-k2", num_gpus=256, gpu="h100", moe_a2a_overlap=True),
                     budget_bytes=int(0.9 * 79.6 * GIB))
    assert not kimi.is_dead(PP2_VPP31) and kimi.need_floor(PP2_VPP31, 2) < len(kimi.recomputes)
    assert masks_of(kimi, PP2_VPP31, 2)
    assert not reaches_need(kimi, 0.0, PP2_VPP31, 2, math.inf)
    assert not kimi.heap and not kimi.rejected
    req = Request(model="llama-3.1-8b", num_gpus=2, gpu="h100", framework="deepspeed", activation_offload=True,
                  seq_length=2048, global_batch_size=8, headroom=0.0)
    deepspeed = search_of(req)
    deepspeed.budget_bytes = memory_budget(deepspeed.job, headroom_for(req))
    need_key = deepspeed.pipeline_bound(TP2, 2, "full", interleave=True)
    assert reaches_need(deepspeed, 0.0, TP2, 2, need_key)
    assert not reaches_need(deepspeed, 0.0, TP2, 2, need_key * (1 - 1e-9))
    assert not deepspeed.heap and not deepspeed.rejected
