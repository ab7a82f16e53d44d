"""The search's memory floors read the plan's attention backend and dropout as every estimate does
(estimate/memory.attention_switches), through the preset the floors take (search/space.state_preset), not the
framework's memory convention. Every convention in cards/memory.yaml has flash on and dropout off, the least-memory
switches, so no card or request can make a floor that read the convention exceed the estimate: the old reads were
loose (an unfused or dropout request floored as flash without masks), never wrong. These tests hold the floors to the
estimate's reads, and to the estimate."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.memory_states import with_precision
from meshplan.estimate.memory import attention_switches, estimate_memory
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.floors import first_stage_floor
from meshplan.search.space import Fixed, enumerate_layouts, micro_batches, state_preset


def _search(**fields):
    req = Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", seq_length=8192, **fields)
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    return job, fixed, BestFirstSearch.for_job(job, fixed, default_engine("megatron-core"), 1)


@pytest.mark.parametrize("dropout", [None, False, True])
@pytest.mark.parametrize("backend", ["auto", "flash", "fused", "unfused"])
def test_the_floors_preset_reads_the_plans_attention_switches(backend, dropout):
    """The preset's flash and dropout are attention_switches' of a plan with the request's carried fields, at every
    ZeRO stage: what the estimate of each plan the search builds reads."""
    job, fixed, _ = _search(attention_backend=backend, dropout=dropout)
    for zero in (0, 1, 2, 3):
        conv = state_preset(job, zero, fixed.carried)[0]
        plan = Plan(zero_stage=zero, **fixed.carried)
        own = with_precision(job, plan)[1]
        assert (conv.flash_attention, conv.dropout) == attention_switches(job, own, plan)
        assert conv.flash_attention is (backend != "unfused") and conv.dropout is bool(dropout)


def test_an_unfused_floor_counts_the_scores_and_stays_under_the_estimate():
    """Unfused attention with dropout keeps the scores, the softmax and the masks (s^2 per head): the floor of the same
    layout rises over the flash floor, which it was before the floors read the plan, and stays under every estimate of
    the plans the search builds."""
    flash_job, _, flash_search = _search()
    job, fixed, search = _search(attention_backend="unfused", dropout=True)
    layouts, _ = enumerate_layouts(job, fixed)
    checked = raised = 0
    for lay in layouts[:40]:
        for mbs in micro_batches(job, lay, fixed)[:2]:
            for zero in search.zeros:
                for recompute in search.recomputes:
                    plan = search.plan(lay, zero, recompute, mbs)
                    sp = search.sequence_parallel(lay)
                    floor = first_stage_floor(job, lay, zero, recompute, mbs, sp, search.presets[zero])
                    assert floor <= estimate_memory(job, plan).peak_bytes, plan
                    flash = first_stage_floor(flash_job, lay, zero, recompute, mbs, sp, flash_search.presets[zero])
                    raised += floor > flash
                    checked += 1
    assert checked > 20 and raised > checked // 2
