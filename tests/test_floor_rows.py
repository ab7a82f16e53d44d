"""The first-stage floors a search reads a layout's row at a time (issue 23's speed work): floors.first_stage_floor_rows
gives each micro-batch's and recompute's first_stage_floor to the last bit, zero_needs (worked out for every
micro-batch of a layout at once, SearchPlans.needs_row) answers exactly as the plain walk over each ZeRO stage's
floors, and the layout floor that settles a stage without them is under every one of them to the last bit; on
sampled layouts of dense, MoE, MLA, long-context, offloaded, expandable-segment and FSDP2 jobs at budgets from tight to
full."""

from __future__ import annotations

import random

import pytest
from test_memory_fit import REQUESTS

from meshplan.arithmetic.memory_states import state_bytes, state_classes, state_sums
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.floors import (
    first_stage_floor,
    first_stage_floor_rows,
    first_stage_needs,
    layout_floor,
    layout_floors,
)
from meshplan.search.space import Fixed, enumerate_layouts

CASES = [*REQUESTS, Request(model="deepseek-v3", num_gpus=256, framework="megatron-bridge", gpu="h100"),
         Request(model="kimi-k2", num_gpus=256, gpu="h100"),
         Request(model="llama-3.1-8b", num_gpus=8, framework="megatron-core", gpu="h100", activation_offload=True)]


def searches(req: Request):
    """The request's job, its layouts, and searches of it at budgets from a quarter of the GPU to all of it."""
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    layouts, _ = enumerate_layouts(job, fixed)
    engine = default_engine(job.framework)
    for part in (0.25, 0.5, 0.75, 1.0):
        yield job, layouts, BestFirstSearch.for_job(job, fixed, engine, 1,
                                                    budget_bytes=int(part * job.gpu.memory_bytes))


def plain_needs(search, lay, mbs) -> tuple[int, ...]:
    """zero_needs without the layout floor or the row: each ZeRO stage's floors walked one by one, each computed
    alone with a fresh memo, of the layout whose floors the search reads (SearchPlans.own: a V order's is its own,
    its first rank holding the estimate's micro-batches per chunk, not its base's min(m, pp))."""
    n_r = len(search.recomputes)
    own = search.own(lay)
    carried = search.fixed.carried

    def fits(zero, recompute):
        return first_stage_floor(search.job, own, zero, recompute, mbs, search.sequence_parallel(own),
                                 search.presets[zero], reserved=not carried.get("expandable_segments"),
                                 activation_offload=bool(carried.get("activation_offload"))) <= search.budget

    return tuple(next((i for i, r in enumerate(search.recomputes) if fits(zero, r)), n_r)
                 if search.states_bound(own, zero) <= search.budget and fits(zero, search.recomputes[-1]) else n_r
                 for zero in search.zeros)


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_zero_needs_from_the_rows_equal_the_plain_walk(req):
    settled = 0
    for _job, layouts, search in searches(req):
        rng = random.Random(len(req.model) + search.budget)
        for lay in rng.sample(layouts, min(40, len(layouts))):
            sizes = list(search.sizes(lay))
            rng.shuffle(sizes)  # any order the queue pops them in
            for mbs in sizes:
                assert search.zero_needs(lay, mbs) == plain_needs(search, lay, mbs), (req, lay, mbs, search.budget)
            settled += sum(search.stages_over(search.own(lay)))
    assert settled  # some stages settled by their model states' bound or layout floor, without a row


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_a_row_of_floors_is_each_micro_batch_and_recompute_floor_to_the_last_bit(req):
    """first_stage_floor_rows (one call per layout and ZeRO stage, a memo shared by every layout) gives the floor
    first_stage_floor computes alone with a fresh memo, bit for bit, at every micro-batch (one per step, fewer than
    pp in flight, pp == 1 with its logits) and recompute."""
    job, layouts, search = next(searches(req))
    carried = search.fixed.carried
    options = dict(reserved=not carried.get("expandable_segments"),
                   activation_offload=bool(carried.get("activation_offload")))
    rng = random.Random(5)
    memo: dict = {}
    plain: dict = {}
    ones = 0
    for lay in rng.sample(layouts, min(30, len(layouts))):
        own, sizes = lay.own_memory(), search.sizes(lay)
        sp = search.sequence_parallel(own)
        for zero in search.zeros:
            rows = first_stage_floor_rows(job, own, zero, search.recomputes, sizes, sp, search.presets[zero],
                                          memo=memo, **options)
            assert rows == [tuple(first_stage_floor(job, own, zero, r, mbs, sp, search.presets[zero], **options)
                                  for r in search.recomputes) for mbs in sizes], (req, own, zero)
            assert dict(zip(sizes, rows, strict=True)) == {b: search.floor_row(own, zero, sizes)[b] for b in sizes}
            # the framework's own preset, gradients kept (FSDP2 drops them before a one-micro-batch backward)
            rows = first_stage_floor_rows(job, own, zero, search.recomputes, sizes, sp, memo=plain, **options)
            assert rows == [tuple(first_stage_floor(job, own, zero, r, mbs, sp, **options)
                                  for r in search.recomputes) for mbs in sizes], (req, own, zero)
        ones += sum(job.global_batch_size // (mbs * own.dp) <= 1 for mbs in sizes)
    assert ones  # the one-micro-batch states are in the rows


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_the_layout_floor_is_under_every_micro_batch_and_recompute_floor_to_the_last_bit(req):
    """floors.layout_floor (SearchPlans.stage_over) settles a layout's ZeRO stage at every micro-batch and recompute
    with no margin: it must be at most each first-stage floor exactly, not within a rounding; and where every stage is
    over (is_dead: the layout's nodes are left out of the queue), each by its first rank's floors or a later rank's
    states (floors.ranks_floor), and where the first rank's settle them all, zero_needs leaves no recompute at any
    micro-batch."""
    whole = 0
    for _job, layouts, search in searches(req):
        rng = random.Random(11 + search.budget)
        for lay in rng.sample(layouts, min(40, len(layouts))):
            own = lay.own_memory()
            for zero in search.zeros:
                low = layout_floor(search.job, own, zero, search.presets[zero], memo=search.floor_parts,
                                   reserved=not search.fixed.carried.get("expandable_segments"))
                assert all(low <= search.floor_bytes(own, zero, recompute, mbs)
                           for recompute in search.recomputes for mbs in search.sizes(own)), (req, own, zero)
            if search.is_dead(lay):
                over = search.stages_over(own)
                assert all(first or search.ranks_bytes(lay, zero) > search.budget
                           for first, zero in zip(over, search.zeros, strict=True)), (req, lay)
                if all(over):  # settled by the first rank's floors: they leave no recompute either
                    n_r = len(search.recomputes)
                    assert all(search.zero_needs(lay, mbs) == (n_r,) * len(search.zeros)
                               for mbs in search.sizes(own))
                whole += 1
    assert whole or req.num_gpus < 256  # on the largest jobs, some layouts settled whole by the layout floor


def degree_groups(layouts) -> list[list]:
    """The own_memory layouts grouped by degrees (a seed group's), each group in enumeration order, duplicates kept."""
    groups: dict[tuple, list] = {}
    for lay in layouts:
        groups.setdefault((lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp), []).append(lay.own_memory())
    return list(groups.values())


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_a_groups_layout_floors_are_each_layout_floor_to_the_last_bit(req):
    """floors.layout_floors (a seed group's layouts at once, the degrees' parts read once) gives each layout's
    layout_floor computed alone with a fresh memo, bit for bit (so each is under every first-stage floor of its
    layout, as the test above holds layout_floor), with the search's preset and memo and with the framework's plain
    preset; and the parts it keeps, and the activation figures the group's layouts share (floors._row_figures, per
    degrees and first-rank layer counts), give first_stage_floor_rows the floats of a fresh memo."""
    job, layouts, search = next(searches(req))
    reserved = not search.fixed.carried.get("expandable_segments")
    rng = random.Random(7)
    groups = degree_groups(layouts)
    compared = 0
    for group in rng.sample(groups, min(12, len(groups))):
        group = group[:40] + group[:2]  # a layout asked twice gets its kept floor
        for zero in search.zeros:
            preset = search.presets[zero]
            assert layout_floors(job, group, zero, preset, memo=search.floor_parts, reserved=reserved) == [
                layout_floor(job, own, zero, preset, memo={}, reserved=reserved) for own in group], (req, zero)
            assert layout_floors(job, group, zero, reserved=reserved) == [
                layout_floor(job, own, zero, reserved=reserved) for own in group], (req, zero)
            for own in group[:12]:
                sizes, sp = search.sizes(own), search.sequence_parallel(own)
                assert first_stage_floor_rows(job, own, zero, search.recomputes, sizes, sp, preset,
                                              memo=search.floor_parts, reserved=reserved) == first_stage_floor_rows(
                    job, own, zero, search.recomputes, sizes, sp, preset, memo={}, reserved=reserved), (req, own)
            compared += len(group)
    shared = [key for key in search.floor_parts if key[0] == "figures"]
    assert compared and len(shared) < compared  # layouts of a group shared their activation figures


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_a_groups_verdicts_are_each_layouts_stages_over(req):
    """SearchPlans.group_over (open_group's is_dead for a whole seed group) answers whether each layout's every
    stage is over (stage_over) and keeps the same bounds and layout floors (Caches.stage_floors) as a search
    asking them layout by layout, at budgets from tight to full; and some layouts are found over at every stage,
    some not."""
    verdicts = set()
    for job, layouts, search in searches(req):
        plain = BestFirstSearch.for_job(job, search.fixed, search.engine, 1, budget_bytes=search.budget)
        for group in degree_groups(layouts):
            over = search.group_over(group)
            # layout by layout, from the most sharded stage down, stopping at one that may fit (the floors kept alike)
            assert over == [all(plain.stage_over(own, index) for index in reversed(range(len(plain.zeros))))
                            for own in group], (req, search.budget)
            verdicts.update(over)
        assert search.caches.stage_floors == plain.caches.stage_floors
    assert verdicts == {True, False} or req.num_gpus < 256


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_floors_from_one_memo_kept_for_every_layout_are_a_fresh_memos(req):
    """The floors' memo (SearchPlans.floor_parts: one per job and preset, every layout's parts, the model states per
    degrees and first-rank parameter counts, the activation figures per degrees and first-rank layer counts) gives
    each layout's layout_floor and row of first_stage_floor_rows the floats of a fresh memo, on layouts of every
    degrees asked in a shuffled order."""
    job, layouts, search = next(searches(req))
    reserved = not search.fixed.carried.get("expandable_segments")
    rng = random.Random(3)
    memo: dict = {}
    for lay in rng.sample(layouts, min(160, len(layouts))):
        own = lay.own_memory()
        sizes, sp = search.sizes(own), search.sequence_parallel(own)
        for zero in search.zeros:
            preset = search.presets[zero]
            assert layout_floor(job, own, zero, preset, memo=memo, reserved=reserved) == layout_floor(
                job, own, zero, preset, memo={}, reserved=reserved), (req, own, zero)
            assert first_stage_floor_rows(job, own, zero, search.recomputes, sizes, sp, preset, memo=memo,
                                          reserved=reserved) == first_stage_floor_rows(
                job, own, zero, search.recomputes, sizes, sp, preset, memo={}, reserved=reserved), (req, own, zero)


def test_layouts_alike_but_in_dp_and_cp_share_their_floor_part_not_their_states():
    """floors._floor_part's fields but the model states read of a layout only its TP, ep x etp, pipeline shape and
    schedule: layouts that differ in dp and cp alone keep one entry of them, each its own states (they read dp and
    cp), and each one's floors are a fresh memo's floats."""
    job, layouts, search = next(searches(Request(model="deepseek-v3", num_gpus=256, framework="megatron-core",
                                                 gpu="h100")))
    alike: dict = {}
    for lay in layouts:
        alike.setdefault((lay.tp, lay.ep * lay.etp, lay.pp, lay.vpp, lay.first, lay.last, lay.split, lay.schedule),
                         {})[(lay.dp, lay.cp)] = lay
    group = next(list(group.values()) for group in alike.values() if len(group) > 2)
    zero, memo = search.zeros[-1], {}
    for lay in group:
        sizes, sp = search.sizes(lay), search.sequence_parallel(lay)
        assert first_stage_floor_rows(job, lay, zero, search.recomputes, sizes, sp, search.presets[zero],
                                      memo=memo) == first_stage_floor_rows(
            job, lay, zero, search.recomputes, sizes, sp, search.presets[zero], memo={}), lay
    assert len([key for key in memo if key[0] == "part"]) == 1
    assert len({id(memo[(lay, zero)].states) for lay in group}) == len(group)  # each its own states


def test_zero_stages_with_the_same_activation_switches_share_their_figures():
    """floors._row_figures reads of a ZeRO stage only its convention's activation switches (and, with one pipeline
    stage, its logits): DeepSeek-V3 under Megatron-Core has the same switches at ZeRO-0, 1 and 3 (ZeRO-3's
    convention differs in its gathered layers only), so a layout's rows at the three stages keep one entry of
    figures and one of activation sums per tokens, not one per stage, and each row is still a fresh memo's floats."""
    job, layouts, search = next(searches(Request(model="deepseek-v3", num_gpus=256, framework="megatron-core",
                                                 gpu="h100")))
    lay = next(lay for lay in layouts if lay.pp > 1)
    own, memo = lay.own_memory(), {}
    sizes, sp = search.sizes(own), search.sequence_parallel(own)
    convs = {search.presets[zero][0].model_dump(exclude={"zero"}).__repr__() for zero in search.zeros}
    assert len(search.zeros) == 3 and len(convs) > 1  # the conventions differ, the switches do not
    for zero in search.zeros:
        assert first_stage_floor_rows(job, own, zero, search.recomputes, sizes, sp, search.presets[zero],
                                      memo=memo) == first_stage_floor_rows(
            job, own, zero, search.recomputes, sizes, sp, search.presets[zero], memo={}), zero
    assert len([key for key in memo if key[0] == "figures"]) == 1
    assert len([key for key in memo if key[0] == "acts" and len(key) == 6]) == 1


@pytest.mark.parametrize("req", CASES[-3:], ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_needs_row_reads_a_stage_from_its_row_without_its_layout_floor(req):
    """SearchPlans.needs_row settles a ZeRO stage from its row of floors without working out its layout floor first
    (the layout floor is under every floor of the row, so it cannot settle a stage the row does not): where a stage's
    model states' bound is within the budget and its layout floor was not asked before, it stays unasked
    (Caches.stage_floors), and the needs are the plain walk's."""
    unasked = 0
    for _job, layouts, search in searches(req):
        rng = random.Random(13 + search.budget)
        for lay in rng.sample(layouts, min(30, len(layouts))):
            own = search.own(lay)
            fresh = own not in search.caches.stage_floors
            for mbs in search.sizes(lay):
                assert search.zero_needs(lay, mbs) == plain_needs(search, lay, mbs), (req, lay, mbs)
            states, lows = search.caches.stage_floors[own]
            if fresh:
                assert all(low is None for low in lows)
                unasked += sum(bound <= search.budget for bound in states)
    assert unasked


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_a_column_of_needs_kept_per_what_its_floors_read_is_each_layouts_own(req):
    """floors.first_stage_needs (SearchPlans.needs_row's column: kept in the job's memo per the activation figures, the
    model states, the gathered layers and the budget, so layouts whose first ranks' floors are the same floats share
    it) is, for each layout asked in a shuffled order at budgets from tight to full with one memo, the least recompute
    whose floor in the layout's own row (first_stage_floor_rows, a fresh memo) is within the budget, none where the
    heaviest's is over; and some columns are shared."""
    memo: dict = {}
    asked = 0
    for job, layouts, search in searches(req):
        carried = search.fixed.carried
        options = dict(reserved=not carried.get("expandable_segments"),
                       activation_offload=bool(carried.get("activation_offload")))
        rng = random.Random(13 + search.budget)
        n_r, budget = len(search.recomputes), search.budget
        for lay in rng.sample(layouts, min(60, len(layouts))):
            own, sizes = search.own(lay), search.sizes(lay)
            sp = search.sequence_parallel(own)
            for zero in search.zeros:
                column = first_stage_needs(job, own, zero, search.recomputes, sizes, sp, search.presets[zero], budget,
                                           memo=memo, **options)
                rows = first_stage_floor_rows(job, own, zero, search.recomputes, sizes, sp, search.presets[zero],
                                              memo={}, **options)
                assert column == tuple(n_r if floors[-1] > budget else
                                       next(i for i, floor in enumerate(floors) if floor <= budget)
                                       for floors in rows), (req, own, zero, budget)
                asked += 1
    assert len([key for key in memo if key[0] == "needs"]) < asked


@pytest.mark.parametrize("req", CASES, ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_state_sums_are_state_bytes_sums_to_the_last_bit(req):
    """memory_states.state_sums (the first rank's model states without state_bytes' dict) gives
    sum(state_bytes(...).values()) and its gradients' entry, bit for bit, for every ZeRO stage's preset at the shard
    sizes and parameter counts a search's layouts give."""
    _job, layouts, search = next(searches(req))
    for zero in search.zeros:
        tensors = search.presets[zero][1]
        classes = state_classes(tensors, {})
        for lay in random.Random(zero).sample(layouts, min(40, len(layouts))):
            for params, shard in ((1.3e9 / lay.tp + 7 * lay.pp, lay.dp * lay.cp), (4.1e10 / lay.ep, lay.dp / 3)):
                plain = state_bytes(tensors, params, shard)
                assert state_sums(classes, params, shard) == (sum(plain.values()), plain["gradients"]), (req, zero)


@pytest.mark.parametrize("req", CASES[-3:], ids=lambda r: f"{r.model}-{r.framework}-{r.num_gpus}")
def test_a_layouts_row_of_states_bounds_is_each_stages_and_its_degrees_own(req):
    """SearchPlans.states_row (what stage_floors and group_over enter for a layout) is states_bound at each ZeRO stage
    of the search, in its order, for every sampled layout, and one row per degrees tuple (the layouts of a seed group
    share it: the bound reads only the degrees)."""
    shared = 0
    for _job, layouts, search in searches(req):
        rng = random.Random(7 + search.budget)
        rows: dict = {}
        for lay in rng.sample(layouts, min(60, len(layouts))):
            row = search.states_row(lay)
            assert row == tuple(search.states_bound(lay, zero) for zero in search.zeros), (req, lay)
            degrees = (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)
            shared += degrees in rows
            assert rows.setdefault(degrees, row) is row
    assert shared
