"""floors.ranks_floor: the heaviest pipeline rank after the first, its layers' model states and the fixed overheads, a
floor of its stage's fit figure that settles layouts the first rank's floors leave alive (Kimi-K2's 3 | 4 x 14 | 2
split: the first rank holds three MoE layers and the embedding, a middle rank four MoE layers)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.memory import estimate_memory
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.floors import layout_floor, ranks_floor
from meshplan.search.space import Fixed, Layout

GIB = 2**30
KIMI_PP16 = Layout(tp=8, pp=16, cp=2, ep=4, etp=4, dp=1, first=3, last=2)


def kimi_search(budget_bytes: int = 0) -> BestFirstSearch:
    req = Request(model="kimi-k2", num_gpus=256, gpu="h100")
    job, _ = search_job(req)
    return BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 5,
                                   budget_bytes=budget_bytes)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_a_later_ranks_floor_is_the_heaviest_later_stages_model_states_and_the_fixed_overheads(recompute):
    """The estimate shards a middle rank's states as the floor does: the figure is the heaviest later stage's
    weights, gradients and optimizer states, plus the memory card's fixed overhead and CUDA context, at every ZeRO
    stage (not a bound loose by a share: a 1% raise would be over the estimate's own states)."""
    search = kimi_search()
    card = memory_card()
    fixed = card.fixed_overhead_bytes + card.cuda_context_bytes
    for zero in search.zeros:
        plan = KIMI_PP16.plan(zero_stage=zero, recompute=recompute, micro_batch_size=1, sequence_parallel=True,
                              cp_comm_type="p2p")
        report = estimate_memory(search.job, plan)
        states = max(s.weights_bytes + s.gradients_bytes + s.optimizer_bytes for s in report.stages[1:])
        floor = ranks_floor(search.job, KIMI_PP16, zero, search.presets[zero])
        assert floor == pytest.approx(states + fixed, rel=1e-12), zero
        assert floor <= report.fit_bytes


def test_a_layout_whose_middle_rank_is_over_is_dead_though_its_first_rank_fits():
    """Under a 72 GiB budget the first rank's floors of Kimi-K2 TP8 PP16 CP2 EP4 ETP4 (3 | 4 x 14 | 2) are far under
    it at every ZeRO stage (about 39-45 GiB), a middle rank's states over it (about 72.3-73.0 GiB): the layout is
    dead (its nodes never enter the queue), and the rules' level rejects each ZeRO stage under the memory rule."""
    search = kimi_search(budget_bytes=72 * GIB)
    own = KIMI_PP16.own_memory()
    assert not any(search.stages_over(own))
    for zero in search.zeros:
        assert layout_floor(search.job, own, zero, search.presets[zero]) < search.budget
        assert search.ranks_bytes(KIMI_PP16, zero) > search.budget
    assert search.is_dead(KIMI_PP16)
    assert search.group_dead([KIMI_PP16]) == [True]
    search.apply_rules(0.0, KIMI_PP16, 1, 0)
    assert not search.heap
    assert sum(search.rejected.values()) == len(search.zeros) * len(search.recomputes)
    assert set(search.rejected) <= {"MEM001", "MEM002"}


def test_one_stage_has_no_later_rank():
    search = kimi_search()
    single = Layout(tp=8, pp=1, cp=1, ep=32, etp=1, dp=32)
    assert all(ranks_floor(search.job, single, zero) == 0.0 for zero in search.zeros)
