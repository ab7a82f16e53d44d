"""The search's memoised arithmetic gives the numbers it would compute afresh (issue 23's speed work): the first stage's
memory floor with its parts kept in a memo across layouts, and a Layout's hash and base kept per object."""

from __future__ import annotations

import pickle

from meshplan.arithmetic.schedule import VirtualSplit
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, impossible, search_job
from meshplan.search.floors import first_stage_floor, first_stage_floors
from meshplan.search.job_memo import forget_jobs
from meshplan.search.space import Fixed, Layout, enumerate_layouts, micro_batches


def apart(job, fixed, engine) -> BestFirstSearch:
    """A search of the job with a job memo of its own (job_memo.py: none an earlier search of the job kept)."""
    forget_jobs()
    return BestFirstSearch.for_job(job, fixed, engine, 1)


def afresh(search: BestFirstSearch) -> None:
    """Forget the bounds a search worked out: the next are worked out again (its kept and its own memos)."""
    for memo in (search.bounds_memo, search.search_memo, search.token_bounds, search.pipe_bounds):
        memo.clear()


def test_first_stage_floor_with_a_shared_memo_equals_the_floor_computed_afresh():
    req = Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    memo: dict = {}
    checked = 0
    for lay in layouts[::3]:
        for zero in search.zeros:
            for recompute in search.recomputes:
                for mbs in micro_batches(job, lay, fixed)[:3]:
                    sp = search.sequence_parallel(lay)
                    fresh = first_stage_floor(job, lay, zero, recompute, mbs, sp, search.presets[zero])
                    kept = first_stage_floor(job, lay, zero, recompute, mbs, sp, search.presets[zero], memo=memo)
                    assert kept == fresh, (lay, zero, recompute, mbs)  # the same float, not just close
                    checked += 1
    assert checked > 100
    assert any(key[0] == "acts" for key in memo) and any(key[0] == "states" for key in memo)


def test_the_floors_of_every_recompute_in_one_pass_are_each_recomputes_floor():
    """floors.first_stage_floors (SearchPlans.floor_row fills Caches.floors a layout at a time) gives each recompute's
    first_stage_floor to the last bit, on a MoE job with pp 1 (the logits counted) and deeper pipelines."""
    req = Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    pps = set()
    for lay in layouts[::5]:
        for zero in search.zeros:
            for mbs in micro_batches(job, lay, fixed)[:3]:
                sp = search.sequence_parallel(lay)
                row = first_stage_floors(job, lay, zero, search.recomputes, mbs, sp, search.presets[zero])
                assert row == tuple(first_stage_floor(job, lay, zero, r, mbs, sp, search.presets[zero], memo={})
                                    for r in search.recomputes), (lay, zero, mbs)
                assert search.floor_bytes(lay.own_memory(), zero, search.recomputes[0], mbs) == first_stage_floor(
                    job, lay.own_memory(), zero, search.recomputes[0], mbs, sp, search.presets[zero])
                pps.add(lay.pp)
    assert 1 in pps and len(pps) > 1


def test_a_layout_hashes_as_its_fields_and_drops_what_it_caches_when_pickled():
    split = VirtualSplit((3, 4, 4, 2), layout="Et|tttt|tttt|ttL")
    lay = Layout(tp=2, pp=2, cp=1, ep=4, etp=1, dp=2, vpp=2, split=split, schedule="zero_bubble")
    fields = (2, 2, 1, 4, 1, 2, 2, None, None, split, "zero_bubble")
    assert hash(lay) == hash(fields)  # the dataclass's own hash: sets and dicts order as before
    assert lay.base() is lay.base() and lay.base() == Layout(2, 2, 1, 4, 1, 2, 1, 7, 6)
    copy = pickle.loads(pickle.dumps(lay))
    assert copy == lay and hash(copy) == hash(lay) and "_hash" not in pickle.loads(pickle.dumps(lay)).__dict__
    assert lay.shape() == (2, 2, 1, 4, 1, 2, 2, 0.0)  # zero-bubble: no bubble for the seed keys to count


def test_a_virtual_split_hashes_as_its_fields_once_and_drops_the_hash_when_pickled():
    """VirtualSplit keeps its hash (the seeding hashes every layout's split with its pipeline): the dataclass's own
    value (sets and dicts order as before), equal splits equal, and a pickled copy without the cached value."""
    split = VirtualSplit((3, 4, 4, 2), layout="Et|tttt|tttt|ttL")
    assert hash(split) == hash(((3, 4, 4, 2), "Et|tttt|tttt|ttL", False, False)) == hash(split)
    assert split.__dict__["_hash"] == hash(split) and split == VirtualSplit((3, 4, 4, 2), layout="Et|tttt|tttt|ttL")
    copy = pickle.loads(pickle.dumps(split))
    assert "_hash" not in copy.__dict__ and copy == split and hash(copy) == hash(split)


def test_the_pipeline_bound_reads_the_step_terms_pp_comm_without_building_the_step():
    """perf.exposed_pipeline_p2p (the search's pp_unit) is the breakdown's pp_comm_s per micro-batch of a plan without
    interleaving, to the last bit; None where nanotron's per-layer host sync makes it depend on the stage's layers;
    refused by the same rule as the step."""
    import pytest

    from meshplan.estimate.perf import exposed_pipeline_p2p, pipeline_unit, step_terms
    from meshplan.rules.engine import EstimateBlocked

    cases = [("llama-3.1-70b", "megatron-core", 64, Layout(tp=2, pp=8, cp=1, ep=1, etp=1, dp=4)),
             ("llama-3.1-70b", "megatron-core", 64, Layout(tp=8, pp=4, cp=2, ep=1, etp=1, dp=1)),
             ("deepseek-v2-lite", "megatron-core", 16, Layout(tp=1, pp=2, cp=1, ep=4, etp=1, dp=8, first=14, last=13)),
             ("llama-3.1-8b", "torchtitan", 16, Layout(tp=2, pp=4, cp=1, ep=1, etp=1, dp=2))]
    for model, framework, gpus, lay in cases:
        job, _ = search_job(Request(model=model, num_gpus=gpus, framework=framework, gpu="h100"))
        for mbs in (1, 2):
            plan = lay.plan(zero_stage=3 if framework == "torchtitan" else 1, recompute="none", micro_batch_size=mbs,
                            sequence_parallel=lay.tp > 1,
                            cp_comm_type="p2p")
            terms = step_terms(job, plan)
            assert exposed_pipeline_p2p(job, plan) == terms.rows[terms.worst].pp, (model, lay, mbs)
    job, _ = search_job(Request(model="llama-3.1-8b", num_gpus=32, framework="nanotron", gpu="h100"))
    across = Layout(tp=1, pp=4, cp=1, ep=1, etp=1, dp=8).plan(zero_stage=0, recompute="none", micro_batch_size=1,
                                                                 sequence_parallel=False, cp_comm_type="p2p")
    assert step_terms(job, across).inputs.pp_cross_layer > 0 and exposed_pipeline_p2p(job, across) is None
    # what the interleaved bound multiplies by vpp: the transfers only, the per-layer sync left out (paid per layer)
    assert pipeline_unit(job, across) == max(step_terms(job, across).inputs.pp_comm) > 0
    job, _ = search_job(Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100"))
    refused = Layout(tp=1, pp=3, cp=1, ep=1, etp=1, dp=4).plan(zero_stage=1, recompute="none", micro_batch_size=1,
                                                                  sequence_parallel=False, cp_comm_type="p2p")
    with pytest.raises(EstimateBlocked) as step:
        step_terms(job, refused)
    with pytest.raises(EstimateBlocked) as unit:
        exposed_pipeline_p2p(job, refused)
    assert step.value.rule_id == unit.value.rule_id


def test_the_thinner_headroom_probe_pushes_the_ranked_searchs_seeds_without_working_them_out_again(monkeypatch):
    """recommend's probe at full capacity shares the ranked search's seeding (Caches.seeds): each tier of the space is
    seeded once per request, whichever search seeds it first."""
    from meshplan import api

    tiers: list[object] = []
    worked: list[int] = []
    real_seed, real_sized = BestFirstSearch.seed, BestFirstSearch.sized

    def seed(self, layouts, ideal, tier=None, runs=None):
        tiers.append(tier)
        real_seed(self, layouts, ideal, tier, runs)

    def sized(self, layouts, runs=None):
        worked.append(len(layouts))
        return real_sized(self, layouts, runs)

    monkeypatch.setattr(BestFirstSearch, "seed", seed)
    monkeypatch.setattr(BestFirstSearch, "sized", sized)
    # the probe run even where the ranked search's record proves it empty (impossible.below_settled): its mechanics
    monkeypatch.setattr(impossible, "below_settled", lambda *args: False)
    rec = api.recommend(Request(model="llama-3.1-8b", num_gpus=8, gpu="h100"))
    assert rec.candidates and len(tiers) > len(set(tiers))  # the probe ran and seeded a tier the ranked search had
    assert len(worked) == len(set(tiers))


def test_a_layer_key_is_built_once_per_context_and_equals_one_built_afresh():
    import dataclasses

    from meshplan.estimate.layer_records import layer_key
    from meshplan.estimate.perf import step_terms

    job, _ = search_job(Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100"))
    plan = Layout(tp=2, pp=1, cp=1, ep=4, etp=1, dp=8).plan(zero_stage=1, recompute="none", micro_batch_size=1,
                                                               sequence_parallel=True, cp_comm_type="p2p")
    ctx = step_terms(job, plan).ctx
    dense, moe = layer_key(ctx, False), layer_key(ctx, True)
    again = layer_key(ctx, False), layer_key(ctx, True)
    assert again[0].context is dense.context and again[0].plan is dense.plan  # once per context and kind
    assert again[1].context is moe.context and again[1].plan is moe.plan and dense.moe != moe.moe
    assert layer_key(dataclasses.replace(ctx), True) == moe


def _plain_seed_keys(search: BestFirstSearch, lay: Layout, sizes: tuple[int, ...], ideal: float,
                     rate: tuple[int, float, float, tuple]) -> list[float]:
    """The seed keys as bounds.py wrote them before their factors were kept: max(ideal_time, token bound) per size
    (a layout whose last rank holds at least 1/pp of the work: search/rank_chains.py)."""
    from meshplan.estimate.moe_time import a2a_steady_share

    b_tok, per_token, exposed, _ = rate
    s, pp, vpp, job = search.job.seq_length, lay.pp, lay.vpp, search.job
    moe = job.model.moe
    sync = len(moe.moe_layers) * search.engine.moe_layer_fixed_s if moe is not None else 0.0
    keys = []
    for mbs in sizes:
        m = max(1, job.global_batch_size // (mbs * lay.dp))
        low = ideal * (1.0 + ((pp - 1) / (m * vpp) if lay.bubble_stages() else 0.0))
        tokens = -(-s // lay.cp) * mbs
        value = per_token
        if exposed:
            value += (1.0 - a2a_steady_share(m, pp, vpp)) * exposed
        per_stage = tokens * value / pp
        if sync:
            per_stage += sync * max(0.0, 1.0 - tokens / (b_tok * s)) / pp
        keys.append(max(low, per_stage * (m + lay.bubble_stages())))
    return keys


def test_seed_keys_and_pipeline_bounds_from_their_memos_equal_the_plain_arithmetic():
    """The seed keys read each layout's pipeline factors from a memo per (dp, pp, vpp, bubble, sizes), and the
    pipeline bound is kept per arguments: the same floats as the plain arithmetic, and as a fresh search's, on an MoE
    job whose EP overlap makes the keys charge the micro-batches outside the steady state."""
    from meshplan.search.estimators import ideal_time

    req = Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    searches = [apart(job, fixed, engine) for _ in range(2)]
    layouts, _ = enumerate_layouts(job, fixed)
    ideal = ideal_time(job, engine)
    for search in searches:
        search.sized(layouts)
    used, fresh = searches
    exposed = checked = 0
    for lay in layouts[::7]:
        sizes = used.sizes(lay)
        if not sizes:
            continue
        rate = used.token_rate(lay, sizes[0], used.recomputes[0])
        exposed += rate[2] > 0
        if not any(used.chained(lay, mbs, rate) for mbs in sizes):
            assert used.seed_keys(lay, sizes, ideal, rate) == _plain_seed_keys(used, lay, sizes, ideal, rate), lay
        for recompute in used.recomputes:
            for interleave in (False, True):
                kept = [used.pipeline_bound(lay, mbs, recompute, interleave) for mbs in sizes[:2]]
                assert kept == [used.pipeline_bound(lay, mbs, recompute, interleave) for mbs in sizes[:2]]
                assert kept == [fresh.pipeline_bound(lay, mbs, recompute, interleave) for mbs in sizes[:2]], lay
                afresh(fresh)
            kept = [used.token_bound(lay, mbs, recompute) for mbs in sizes[:2]]
            assert kept == [fresh.token_bound(lay, mbs, recompute) for mbs in sizes[:2]], lay
            afresh(fresh)
        checked += 1
    assert checked > 50 and exposed > 10 and used.factors and used.pipe_bounds and used.token_bounds
    # the shard's largest micro-batch is part of what the non-exact token bound reads (a tier seeded later raises it)
    lay = next(lay for lay in layouts if used.sizes(lay) and lay.tp * lay.ep > 1)
    mbs = used.sizes(lay)[0]
    before = used.token_bound(lay, mbs, "none")
    for search in searches:
        search.work_mbs[lay.tp, lay.ep, lay.etp] *= 64
    assert used.token_bound(lay, mbs, "none") == fresh.token_bound(lay, mbs, "none") != before


def test_token_rates_are_kept_per_what_they_read_and_equal_the_rates_worked_out_afresh(monkeypatch):
    """bounds.shard_rate keeps a layout's references per (tp, ep, etp, cp, EP overlap, recompute, the shard's largest
    micro-batches, the micro-batch where those are unset): layouts that differ in their pipeline share one rate, and
    every token and pipeline bound read from it is the float a search without the memo computes."""
    from meshplan.search.bounds import StepTimeBounds

    req = Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    used, fresh = (apart(job, fixed, engine) for _ in range(2))
    layouts, _ = enumerate_layouts(job, fixed)
    for search in (used, fresh):
        search.sized(layouts)
    worked: list[tuple] = []
    plain = StepTimeBounds._shard_rate

    def counted(self, lay, mbs, recompute, work, most, overlap):
        if self is used:
            worked.append((lay.tp, lay.ep, lay.etp, lay.cp, overlap, recompute, work, most, mbs))
        return plain(self, lay, mbs, recompute, work, most, overlap)

    monkeypatch.setattr(StepTimeBounds, "_shard_rate", counted)
    calls = 0
    for lay in layouts[::3]:
        for mbs in used.sizes(lay)[:2]:
            for recompute in used.recomputes:
                for exact in (False, True):
                    calls += 1
                    kept = used.token_bound(lay, mbs, recompute, exact)
                    afresh(fresh)
                    assert kept == fresh.token_bound(lay, mbs, recompute, exact), (lay, mbs, recompute, exact)
                kept = used.pipeline_bound(lay, mbs, recompute, interleave=True)
                afresh(fresh)
                assert kept == fresh.pipeline_bound(lay, mbs, recompute, interleave=True), (lay, mbs, recompute)
    assert len(worked) == len(set(worked)) and calls > 4 * len(worked)  # once per what a rate reads, shared
    lay = next(lay for lay in layouts if lay.vpp == 1 and lay.pp > 1)
    mbs = used.sizes(lay)[0]
    assert used.pipeline_bound(lay, mbs, "none", interleave=True) == used.pipeline_bound(lay, mbs, "none")
    assert (lay, mbs, "none", False, False) in used.pipe_bounds  # no interleaving to add: one entry for both
    assert (lay, mbs, "none", True, False) not in used.pipe_bounds


def test_the_pipeline_unit_is_the_bases_traffic_even_where_the_rules_refuse_the_base():
    """bounds.pp_unit reads perf.pipeline_unit once per (tp, cp, dp, pp, micro-batch, sequence parallelism): the
    traffic the interleaved plan's own estimate charges per hop, whether or not a rule refuses the non-interleaved
    base (torchtitan's TP003 here); an Engine without pipeline_unit keeps the per-base refusal (0)."""
    from dataclasses import replace

    from meshplan.arithmetic.comm import links
    from meshplan.core.errors import MeshplanError
    from meshplan.estimate.perf import pipeline_p2p, pipeline_unit
    from meshplan.knowledge.calibration import calibration
    from meshplan.rules.engine import require_estimable

    req = Request(model="llama-3.1-70b", num_gpus=64, framework="torchtitan", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    search = BestFirstSearch.for_job(job, fixed, engine, 1)
    refused = 0
    for lay in enumerate_layouts(job, fixed)[0]:
        if lay.vpp == 1 or refused > 3:
            continue
        for mbs in search.sizes(lay)[:2]:
            base = search.plan(lay.base(), search.zeros[0], search.recomputes[0], mbs)
            try:
                require_estimable(job, base)
                continue
            except MeshplanError:
                refused += 1
            m = search.microbatches(lay, mbs)
            unit = pipeline_unit(job, base)
            assert unit and search.pp_unit(lay, mbs) == m * unit / m
            cal = calibration(job.framework)
            lk = links(job.gpu, job.gpus_per_node, cal)
            own = search.plan(lay, search.zeros[0], search.recomputes[0], mbs)
            assert pipeline_p2p(job, own, cal, lk) == pipeline_p2p(job, base, cal, lk)  # the same hop
            old = BestFirstSearch.for_job(job, fixed, replace(engine, pipeline_unit=None), 1)
            assert old.pp_unit(lay, mbs) == 0.0
    assert refused


def test_states_bound_with_bytes_per_param_kept_per_shard_equals_the_plain_bound():
    """SearchPlans.states_bound reads the preset's bytes per parameter once per (ZeRO stage, shard size)
    (Caches.per_param): each bound is the float states_lower_bound computes without the memo, on a MoE job whose
    dense and expert shards differ, and the memo holds a few shard sizes for many degrees tuples."""
    from meshplan.search.space import states_lower_bound

    req = Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    degrees = {(lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp): lay for lay in layouts}
    for lay in degrees.values():
        for zero in search.zeros:
            plain = states_lower_bound(job, lay, zero, search.split, search.presets[zero][1])
            assert search.states_bound(lay, zero) == plain, (lay, zero)  # the same float, not just close
    assert len(degrees) > 20 and len(search.caches.per_param) < len(degrees) * len(search.zeros)
    assert search.caches.shared().per_param is search.caches.per_param


def test_seed_shapes_worked_out_once_per_pipeline_are_each_layouts_own():
    """BestFirstSearch.sized works out a layout's seed shape (seed_groups.seed_shape: vpp, bubble_stages, the last
    ranks where they may hold less) once per (pp, vpp, first, last, split, schedule), all it reads: each member's
    entry is its group's entry of the shape worked out for that layout alone, and layouts of one pipeline in
    different groups share one shape."""
    from meshplan.search.seed_groups import seed_shape

    req = Request(model="deepseek-v3", num_gpus=256, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    seeds = search.sized(layouts)
    by_pipe: dict[tuple, tuple] = {}
    chained = 0
    for group in seeds.groups:
        entries = {id(entry): shape for shape, entry in group.shapes.items()}
        for lay, entry, _ in group.members:
            shape = entries[id(entry)]
            assert shape == seed_shape(lay, search.last_ranks(lay)), lay
            assert shape[:2] == (lay.vpp, lay.bubble_stages()), lay
            chained += len(shape) == 3
            kept = by_pipe.setdefault((lay.pp, lay.vpp, lay.first, lay.last, lay.split, lay.schedule), shape)
            assert kept is shape, lay
    assert chained and len(by_pipe) < len(seeds.groups)


def test_seed_entries_keep_their_last_ranks_and_the_keys_read_them():
    """A seed group's shape entry keeps its layouts' last_ranks (seed_groups.SeedGroup.add: the shape's third element),
    which engine.group_under hands to seed_keys rather than having stretch look them up: the same object, and the same
    keys as the look-up gives, on layouts whose stretch takes the pipeline's chains; stretch_factors' m per size is
    the layout's micro-batches."""
    from meshplan.search.estimators import ideal_time

    req = Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    search = BestFirstSearch.for_job(job, fixed, engine, 1)
    layouts, _ = enumerate_layouts(job, fixed)
    ideal, rates = ideal_time(job, engine), {}
    seeds = search.sized(layouts)
    with_ranks = chained = 0
    for group in seeds.groups:
        for lay, entry, _ in group.members:
            assert entry[4] is search.last_ranks(lay)
            if not group.sizes:
                continue
            factors = search.stretch_factors(lay, group.sizes, ideal)
            assert [f[3] for f in factors] == [search.microbatches(lay, mbs) for mbs in group.sizes]
            rate = search.seed_rate(lay, group.sizes[0], rates)
            keys = search.seed_keys(lay, group.sizes, ideal, rate, entry[4])
            assert keys == search.seed_keys(lay, group.sizes, ideal, rate), lay
            with_ranks += entry[4] is not None
            chained += any(search.chained(lay, mbs, rate) for mbs in group.sizes)
    assert with_ranks > 10 and chained > 10


def test_synced_is_its_docstring_formula_to_the_last_bit():
    """bounds.synced (written out, no calls) gives, per pipeline bound B and micro-batches m, the least over the ZeRO
    stages of max(B, m per_micro) + max(0, seconds - hidden x that / m), taken at the break u = seconds / hidden where
    it is under it, and never under B: the same floats as the formula written with max and min, on bounds at, under
    and over each stage's breaks, stages without DP traffic or without hidden share included."""
    import math

    from meshplan.search.bounds import StageSync, StepTimeBounds

    def plain(pipes: list[float], ms: list[int], syncs: tuple[StageSync, ...]) -> list[float]:
        raised = []
        for pipe, m in zip(pipes, ms, strict=True):
            least = math.inf
            for per_micro, seconds, hidden in syncs:
                bound = max(pipe, m * per_micro)
                if seconds > 0.0:
                    at_pipe = bound + max(0.0, seconds - hidden * bound / m)
                    if hidden > 0.0:
                        at_pipe = min(at_pipe, max(bound, m * seconds / hidden))
                    bound = at_pipe
                least = min(least, bound)
            raised.append(max(least, pipe))
        return raised

    stages = (StageSync(0.0, 0.0, 0.0), StageSync(0.01, 0.0, 0.0), StageSync(0.0, 0.3, 0.0), StageSync(0.002, 0.3, 0.5),
              StageSync(0.004, 1.2, 0.25), StageSync(0.0, 0.7, 1.0))
    ms = [1, 2, 3, 8, 16, 64]
    pipes = [0.0, 0.05, 0.3, 0.6, 1.0, 1.2, 2.4, 4.8, 7.0]
    for i in range(len(stages)):
        for syncs in (stages[i:i + 1], stages[i:], stages[:i + 1]):
            for m in ms:
                assert StepTimeBounds.synced(pipes, [m] * len(pipes), syncs) == plain(pipes, [m] * len(pipes), syncs)
                for pipe in [*pipes, math.inf, math.nan]:  # `each`: one call for a node's keys at each ZeRO stage
                    each = StepTimeBounds.synced([pipe], [m], syncs, True)
                    alone = [StepTimeBounds.synced([pipe], [m], (stage,))[0] for stage in syncs]
                    assert len(each) == len(syncs) and str(each) == str(alone)  # (str: nan is nan)


def test_grid_plans_at_each_zero_stage_are_the_full_copy_of_the_first_plan():
    """bounds.grid_plan copies a grid's plan at another ZeRO stage from the grid's first (only zero_stage changed):
    the same plan, fields set included, as the copy of the search's first plan with every grid field changed."""
    req = Request(model="deepseek-v2-lite", num_gpus=32, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layouts, _ = enumerate_layouts(job, fixed)
    assert len(search.zeros) > 1
    for lay in layouts[::11]:
        for zero in (*search.zeros[::-1], *search.zeros):
            plan = search.grid_plan(lay, zero)
            full = search.bounds_memo["grid plan"].model_copy(update={  # type: ignore[union-attr]
                "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "etp": lay.etp, "dp": lay.dp,
                "zero_stage": zero, "sequence_parallel": search.sequence_parallel(lay),
                "tp_comm_overlap": search.tp_overlap and lay.tp > 1})
            assert plan == full and plan.model_fields_set == full.model_fields_set and plan.zero_stage == zero


def test_light_stages_is_the_dot_products_of_each_chain():
    """rank_chains.light_stages (written out) gives per light stages the last rank's least time and per chain the
    rank's and the earlier ranks' over vpp: each a dot product of its coefficients with the reference's parts, in
    token_parts' order, as stages_bound reads them."""
    from meshplan.search.rank_chains import light_stages

    def dot(c: tuple, parts: tuple) -> float:
        total = c[0] * parts[0]
        for x, y in zip(c[1:], parts[1:], strict=True):
            total = total + x * y
        return total

    last = (0, 3, 0, 3, 1, 0.05)
    chains = ((None, 0.4, 3.0, (2, 10, 2, 10, 0, 0.2), 0.3, 2.5), ((1, 4, 1, 4, 0, 0.08), 0.5, 4.0, None, 0.0, 0.0))
    flat = ((last, True, True, 0.4, 3.0, chains),)
    for parts, per_token, vpp in (((1e-9, 3e-9, 2e-10, 5e-10, 7e-9, 0.0), 1e-6, 2),
                                  ((2e-9, 1e-9, 0.0, 0.0, 3e-9, 4e-10), 3e-7, 4)):
        least = dot(last, parts)
        want = (((least, 0.4, 3.0), [(least, 0.4, 3.0, dot(chains[0][3], parts) / vpp, 0.3, 2.5),
                                     (dot(chains[1][0], parts), 0.5, 4.0, 0.0, 0.0, 0.0)]),)
        assert light_stages(flat, parts, per_token, 0.0, 1.0, 4, vpp) == want
    assert light_stages(flat, (1.0,) * 6, 1e-9, 0.0, 0.0, 4, 2) is None  # the last rank holds its share: not light
