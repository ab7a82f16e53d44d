"""The passes a recommend or min-gpus runs give the answers of the separate, full passes (issue 23's speed work): the
queue is seeded with a node per group of layouts (one degrees tuple) keyed by a lower bound of their seed keys
(seed_groups.group_floor), and only a group reaching the top has its keys computed and its nodes pushed, instead of
every node pushed at seeding; the thinner-headroom probe leaves out the groups whose floor is over its cutoff; and
min-gpus settles a count with recommend's ranked rows only (no probe, decision table or nothing-fits scan: it reads
none of them)."""

from __future__ import annotations

import gc
import heapq
import math
from dataclasses import replace

import pytest
from test_search_oracle import sampled_request

import meshplan.search.bounds as search_bounds
import meshplan.search.engine as search_engine
import meshplan.search.gpu_count as gpu_count
import meshplan.search.impossible as impossible
import meshplan.search.ranking as ranking
import meshplan.search.seeding as search_seeding
from meshplan.core.errors import MeshplanError
from meshplan.estimate.moe_time import a2a_steady_share
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, Level, default_engine, minimum_gpus, recommend, search_job
from meshplan.search.engine import split_space
from meshplan.search.estimators import ideal_time
from meshplan.search.policy import SLOWER, headroom_for, memory_budget, memory_rule_id
from meshplan.search.seed_groups import GROUP_MARGIN, SeedGroup, SuperGroup, group_floor, seed_shape
from meshplan.search.space import Fixed, Layout
from meshplan.search.zero_stages import left_out_counts

JOBS = [Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100"),
        Request(model="qwen3-30b-a3b", num_gpus=12, framework="megatron-bridge", gpu="a100-80gb", seq_length=32768),
        Request(model="llama-3.1-8b", num_gpus=16, framework="torchtitan", gpu="h100", global_batch_size=64),
        Request(model="deepseek-v3", num_gpus=256, gpu="h100")]


@pytest.mark.parametrize("req", JOBS, ids=lambda r: r.model)
def test_the_group_floor_bounds_every_seed_key_of_its_layouts(req):
    """group_floor, from the group's seed rates (with the MoE host sync and the exposed all-to-all they count), vpps
    and least bubble, is at most every seed key (bounds.seed_keys) of every layout of its group, and above the ideal
    time for most groups (it is a real bound, not zero); for a MoE model, above the floor of the least seconds per
    token alone for most groups (the host sync and exposed all-to-all count: without them, DeepSeek-V3 on 2,048 H100
    opened 91 more groups). The seeding's SuperGroups (groups of one tp, cp, ep, etp as one node) are keyed at most
    every floor of their groups (seed_groups.super_floor), most above the ideal time too, and pop before them."""
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    engine = default_engine(job.framework)
    search = BestFirstSearch.for_job(job, fixed, engine, 1)
    tiers = split_space(search)
    ideal = ideal_time(job, engine)
    checked = above = pushed = tighter = supers = super_above = 0
    floors: dict[int, float] = {}
    for layouts in (tiers.inside, tiers.across):
        seeds = search.sized(layouts)
        assert sum(group.nodes for group in seeds.groups) == seeds.nodes
        assert sum(len(group.members) for group in seeds.groups) == len(layouts)
        for group in seeds.groups:
            if not group.sizes:
                continue
            rates = {}
            first = group.members[0][0]
            floor = search.group_key(group, first, ideal, rates)
            group_rates = {search.seed_rate(lay, group.sizes[0], rates)[:3] for lay in group.by_vpp.values()}
            per_token = min(rate[1] for rate in group_rates)
            bubble = group.least_bubble(lambda one, ranks, mbs=group.sizes[0], rates=rates:
                                        search.light_ranks(one, search.seed_rate(one, mbs, rates)) is not None)
            assert all(shape[2] is search.last_ranks(one) and shape == seed_shape(one, shape[2])
                       for one, shape in zip(group.chained, group.chained_shapes, strict=True))
            outsides = [min(1.0 - a2a_steady_share(search.microbatches(first, mbs), first.pp, vpp)
                            for vpp in group.by_vpp) for mbs in group.sizes]  # (each vpp's: the least at the most)
            assert floor == group_floor(job.seq_length, job.global_batch_size, first, group.sizes,
                                        tuple(sorted(group_rates)), bubble, ideal, search.moe_sync_s(),
                                        outsides if any(rate[2] for rate in group_rates) else None)
            assert floor == _plain_group_floor(job, first, group.sizes, group_rates, bubble, ideal,
                                               search.moe_sync_s(), outsides)  # to the last bit
            for lay, _, _ in group.members:
                assert lay.shape()[:6] == first.shape()[:6] and search.sizes(lay) == group.sizes
                keys = search.seed_keys(lay, group.sizes, ideal, search.seed_rate(lay, group.sizes[0], rates))
                assert ideal * (1.0 - 1e-9) <= floor <= min(keys), (lay, group.sizes)
            checked += 1
            above += floor > ideal * 1.01
            tighter += floor > _plain_group_floor(job, first, group.sizes, {(1, per_token, 0.0)}, bubble, ideal)
            floors[id(group)] = floor
        base = search.seq
        search.heap.clear()  # (the other tier's)
        search.push_seeds(seeds, ideal)  # its own floors, from the same rates and least bubbles: the same floats
        for key, level, seq, payload in [entry for entry in search.heap if type(entry[3][0]) is SuperGroup]:
            # a SuperGroup's key is under every floor of its groups, its seq its first group's, so it pops first
            groups = payload[0].groups
            assert level == Level.GROUP and len(groups) > 1 and seq == base + groups[0].first + 1
            assert all(key <= floors[id(group)] and group.first >= groups[0].first for group in groups)
            assert payload[0].nodes == sum(group.nodes for group in groups)
            supers += 1
            super_above += key > ideal * 1.01
            search.open_group(key, *payload)  # its groups keyed and queued
        pushed += sum(group.floor[ideal] == floors[id(group)] for group in seeds.groups if group.floor)
        assert all(group.floor[ideal] == floors[id(group)] for group in seeds.groups if group.floor)
    assert checked > 20 and above > checked // 2 and pushed > 20
    assert supers > 2 and super_above > supers // 2
    assert (tighter > checked // 2) if job.model.moe is not None else not tighter


def test_a_light_shape_of_any_bubble_takes_the_groups_least_bubble_to_none():
    """SeedGroup.least_bubble: a shape whose last rank may hold less than 1/pp of the work (`light`) has keys down to
    its chains, m x W/pp at the least, under the stretch of a shape with fewer bubble stages; so any light shape takes
    the group's least bubble to 0, its own bubble more than another's or not (DeepSeek-V3 on 256 H100 with its MTP
    depth's output layer in the step time: tp 128 pp 2 vpp 16's chains at 253.22 s under vpp 31's stretch, 253.24
    s). Without a light shape, the least bubble of all shapes. Fails before the fix: a light shape was asked only
    where its bubble was under the least so far (1/31 here)."""
    def group(light_vpp):
        lays = [Layout(tp=128, pp=2, cp=1, ep=1, etp=128, dp=1, vpp=vpp) for vpp in (31, 16, 8)]
        one = SeedGroup(sizes=(1,), first=0, states=0.0, example=lays[0])
        for index, (vpp, lay) in enumerate(zip((31, 16, 8), lays, strict=True)):
            one.add(lay, index, (vpp, 1.0 / vpp) if vpp == 31 else (vpp, 1.0 / vpp, f"ranks {vpp}"))
        return one.least_bubble(lambda lay, ranks: ranks == f"ranks {light_vpp}")

    assert group(light_vpp=16) == 0.0 and group(light_vpp=8) == 0.0
    assert group(light_vpp=None) == 1.0 / 31


def _plain_group_floor(job, lay, sizes, rates, bubble, ideal, sync=0.0, outsides=None):
    """group_floor's arithmetic as its docstring says it, in its order of operations (it loops without calls)."""
    per_rank = -(-job.seq_length // lay.cp)

    def work(at, mbs):
        outside = 0.0 if outsides is None else outsides[at]
        return min(per_rank * mbs * (per_token + outside * exposed)
                   + sync * max(0.0, 1.0 - per_rank * mbs / (b_tok * job.seq_length))
                   for b_tok, per_token, exposed in rates)

    least = min(max(ideal * (1.0 + bubble / (m := max(1, job.global_batch_size // (mbs * lay.dp)))),
                    work(at, mbs) / lay.pp * (m + bubble))
                for at, mbs in enumerate(sizes))
    return least * (1.0 - GROUP_MARGIN)


@pytest.mark.parametrize("req", JOBS, ids=lambda r: r.model)
def test_a_groups_dead_layouts_are_each_layouts_own_verdict(req):
    """group_dead (the first ranks' floors of a seed group at once, then layout_over given each layout's own_memory
    layout) gives each layout of every group the verdict layout_over gives it alone in a fresh search, at budgets
    that leave some dead and some alive."""
    job, _ = search_job(req)
    fixed, engine = Fixed.from_request(req, job), default_engine(job.framework)
    seen = set()
    for share in (0.1, 0.4, 1.0):
        budget = int(job.gpu.memory_bytes * share)
        together = BestFirstSearch.for_job(job, fixed, engine, 1, budget_bytes=budget)
        alone = BestFirstSearch.for_job(job, fixed, engine, 1, budget_bytes=budget)
        groups = [group for group in together.sized(split_space(together).inside).groups if group.sizes]
        verdicts = [dead for group in groups for dead in together.group_dead([lay for lay, _, _ in group.members])]
        lays = [lay for group in groups for lay, _, _ in group.members]
        assert verdicts == [alone.layout_over(lay) for lay in lays], share
        assert verdicts == [alone.layout_over(lay, alone.own(lay)) for lay in lays], share
        seen.update(verdicts)
    assert seen == {True, False}


@pytest.mark.parametrize("req", [*JOBS, Request(model="qwen3-8b", num_gpus=16, framework="skyrl", gpu="h100"),
                                 Request(model="qwen3-8b", num_gpus=8, framework="verl", gpu="h100", recompute="full",
                                         recompute_method="uniform")],
                         ids=lambda r: f"{r.model}-{r.framework}")
def test_the_space_split_counts_per_dp_what_each_layout_counts(req):
    # split_space counts the plans of each dp once (plans_of and refused_plans read only a layout's micro-batches):
    # the same totals as adding them layout by layout, the ZeRO stages left out included under the rules that refuse
    # them (zero_stages.search_ladder: AD001, torchtitan's ZeRO-1, SkyRL's ZeRO-0, verl's ZeRO-2; RC003, verl's FSDP
    # ZeRO-3 with a recompute_method)
    job, _ = search_job(req)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)
    tiers = split_space(search)
    layouts = [*tiers.inside, *tiers.across]
    assert tiers.across_plans == sum(search.plans_of(lay) for lay in tiers.across)
    refused = sum(search.refused_plans(lay) for lay in layouts)
    rules = left_out_counts(search.refused)
    assert sum(rules.values()) == len(search.refused) * len(search.recomputes)
    for rule, pairs in rules.items():
        assert tiers.rejected[rule] == pairs * sum(max(1, len(search.sizes(lay))) for lay in layouts), rule
    assert tiers.considered - sum(n for k, n in tiers.rejected.items() if k not in rules) == (
        sum(search.plans_of(lay) for lay in layouts) + refused)
    assert refused > 0 or job.framework not in ("torchtitan", "skyrl", "verl")


@pytest.mark.parametrize("req", [JOBS[0], JOBS[3], Request(model="llama-3.1-70b", num_gpus=64, gpu="h100")],
                         ids=lambda r: r.model)
def test_the_seeding_by_runs_is_the_seeding_layout_by_layout(req):
    # split_space gives each tier the runs its layouts come in (space.LayoutRun: alike but in their (ep, etp) and
    # schedule), and sized reads them a block at a time (seed_groups.SeedBlock: each (ep, etp) after the first follows
    # the first's group, its members made only when read): the same groups in the same order, with the same members,
    # node indices, shapes' entries, pick, bubbles and layouts kept per vpp and chained shape, as sizing the tier one
    # layout at a time; on a MoE model most groups' members are not made by the seeding. A dense model's space has no
    # runs (each would hold one (ep, etp)): its tiers are seeded a layout at a time, as before the runs
    job, _ = search_job(req)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)
    tiers = split_space(search)
    if job.model.moe is None:
        assert tiers.inside_runs is None and tiers.across_runs is None and search.caches.space[2] == ()
        return
    followed = 0
    for layouts, runs in ((tiers.inside, tiers.inside_runs), (tiers.across, tiers.across_runs)):
        at = 0
        for run in runs:  # the runs tile the tier, in order
            assert run.start == at
            plain = replace(layouts[run.start], ep=1, etp=1, schedule="")
            for e, (ep, etp) in enumerate(run.experts):
                for s, schedule in enumerate(run.schedules):
                    lay = layouts[run.at(e, s)]
                    assert (lay.ep, lay.etp, lay.schedule) == (ep, etp, schedule)
                    assert replace(lay, ep=1, etp=1, schedule="") == plain
            at = run.stop
        assert at == len(layouts)
        by_runs = search.sized(layouts, runs)
        lazy = ["members" not in group.__dict__ for group in by_runs.groups]
        one_by_one = search.sized(layouts)
        assert by_runs.nodes == one_by_one.nodes
        assert not any("members" not in group.__dict__ for group in one_by_one.groups)
        for a, b in zip(by_runs.groups, one_by_one.groups, strict=True):
            assert (a.sizes, a.first, a.states, a.nodes, a.pick, a.pick_bubble, a.bubble, a.chained_shapes) == (
                b.sizes, b.first, b.states, b.nodes, b.pick, b.pick_bubble, b.bubble, b.chained_shapes)
            assert a.example is b.members[0][0] is b.example
            assert [id(lay) for lay in a.chained] == [id(lay) for lay in b.chained]
            assert {vpp: id(lay) for vpp, lay in a.by_vpp.items()} == {vpp: id(lay) for vpp, lay in b.by_vpp.items()}
            made = [(id(lay), index) for lay, _, index in a.members]
            assert made == [(id(lay), index) for lay, _, index in b.members]
            assert a.shapes == b.shapes and list(a.shapes) == list(b.shapes)
            assert all(entry is a.shapes[shape] for (_, entry, _), shape in zip(
                a.members, [next(k for k, v in b.shapes.items() if v is entry) for _, entry, _ in b.members],
                strict=True))
        followed += sum(lazy)
        assert sum(lazy) == 0 or sum(lazy) > len(lazy) / 2
    assert followed > 0
    with pytest.raises(AttributeError):  # (only what a following group makes when read is made: no other name)
        by_runs.groups[0].made  # noqa: B018


@pytest.mark.parametrize("part", range(2))
def test_seeding_by_groups_answers_as_seeding_every_node(monkeypatch, part):
    """On sampled requests (the oracle test's sampler), with headrooms that leave layouts below them (the probe and its
    cutoff), the whole answer (ranked rows, every rejected count, the estimates counted) is the same with the group
    floors as with every group opened before any node pops (group and SuperGroup floors of -inf: every node pushed
    with its seed key, in seeding order, as before groups); and groups were left unopened or out. Only the split
    between the memory rule and SEARCH-SLOWER may differ (their sum may not): an opened group whose least-bubble
    layout cannot fit counts each of its layouts that cannot fit under the memory rule (engine.group_under), so
    opening more groups counts more there. In two parts (each a test of its own, which pytest-xdist's workers share):
    every other seed of the 40, from the part-th."""
    opened, seeded = [0], [0]
    real_open, real_seeds = BestFirstSearch.open_group, BestFirstSearch.push_seeds

    def counting_open(self, *args):
        # a group's first pop (the later ones: the same group, part-way open; a SuperGroup's: its groups queued)
        opened[0] += len(args) == 4 and type(args[1]) is not SuperGroup
        real_open(self, *args)

    def counting_seeds(self, seeds, ideal):
        seeded[0] += len(seeds.groups)
        real_seeds(self, seeds, ideal)

    compared = 0
    seeds = range(40)[part::2]
    for seed in seeds:
        req, top_k = sampled_request(seed)
        req = req.model_copy(update={"headroom": (0.1, 0.25, 0.4)[seed % 3]})
        monkeypatch.setattr(BestFirstSearch, "open_group", counting_open)
        monkeypatch.setattr(BestFirstSearch, "push_seeds", counting_seeds)
        try:
            fast = recommend(req, top_k=top_k).model_dump(mode="json")
        except MeshplanError:
            continue
        monkeypatch.setattr(BestFirstSearch, "open_group", real_open)
        monkeypatch.setattr(BestFirstSearch, "push_seeds", real_seeds)
        monkeypatch.setattr(search_bounds, "group_floor", lambda *_: -math.inf)
        monkeypatch.setattr(search_seeding, "super_floor", lambda *_: -math.inf)
        assert memory_or_slower(recommend(req, top_k=top_k).model_dump(mode="json")) == memory_or_slower(fast), (
            seed, req)
        compared += 1
    # at least 20 of the 40 compared in all, each part holding its share (so the parts together hold it too)
    assert compared >= 20 * len(seeds) / 40 and opened[0] < seeded[0], (compared, opened, seeded)


def memory_or_slower(answer: dict) -> dict:
    """An answer with its memory-rule and SEARCH-SLOWER counts summed: the split between them follows which groups
    open (engine.group_under), the sum does not."""
    rejected = dict(answer["rejected"])
    both = rejected.pop(memory_rule_id(), 0) + rejected.pop(SLOWER, 0)
    return {**answer, "rejected": {**rejected, "memory or slower": both}}


REAL_OPEN = BestFirstSearch.open_group


def plain_open_group(self, key, group, base, ideal):
    """open_group as a queue holding every seed (a SuperGroup's groups queued as the search queues them): each
    (layout, micro-batch) node pushed at FLOOR with its seed key (raised to the once-per-step DP bound where a layout
    of the group under the cutoff may fit, as open_group raises them) and seeding seq, none left out as dead or held
    by its layout's first node; except, as group_under does, where the group's least-bubble layout (SeedGroup.pick)
    cannot fit: then every layout of it that cannot fit is counted under the memory rule at once, whatever its keys,
    and only the others are queued."""
    if type(group) is SuperGroup:  # its groups queued at their own keys, as the search queues them
        REAL_OPEN(self, key, group, base, ideal)
        return
    variants, sizes, members = self.variants(), group.sizes, group.members
    if self.layout_over(members[group.pick][0]):
        live = [member for member in members if not self.layout_over(member[0])]
        self.rejected[self.engine.memory_rule] += variants * len(sizes) * (len(members) - len(live))
        members = live
    for lay, entry, _ in members:
        if entry[1] is None:
            entry[1] = self.seed_keys(lay, sizes, ideal, self.seed_rate(lay, sizes[0], self.seed_rates))
            entry[2] = min(entry[1])
    under = [member for member in members if member[1][2] <= self.cutoff]
    if not all(self.group_dead([lay for lay, _, _ in under])):
        self.raise_to_sync(group, under)
    for lay, entry, index in members:
        for offset, (mbs, seed_key) in enumerate(zip(sizes, entry[1], strict=True)):
            if seed_key > self.cutoff:
                self.beyond_cutoff += variants
            else:
                heapq.heappush(self.heap, (seed_key, Level.FLOOR, base + index + offset + 1, (lay, mbs)))


def test_seeds_left_out_as_dead_or_held_are_counted_as_a_queue_holding_them_would(monkeypatch):
    """The seeds open_group leaves out because every ZeRO stage is over the budget at any micro-batch and recompute
    (is_dead, asked a group at a time: group_dead), and those a layout's first node holds until it pops (release:
    queued then, or left out where the memory floor leaves no recompute at that micro-batch), are counted by
    settle_dead as their FLOOR pops would have counted them: on sampled requests with headrooms (the probe's cutoff),
    on a job most of whose layouts do not fit (Kimi-K2 on 256 H100: its rejected counts split between the memory rule
    and SEARCH-SLOWER), and with the estimate budget spent part-way, the whole answer is the one of a queue holding
    every seed (plain_open_group); and seeds were left out both ways."""
    left_out = [0, 0]
    real_dead, real_release = BestFirstSearch.group_dead, BestFirstSearch.release

    def counting(self, lays):
        dead = real_dead(self, lays)
        left_out[0] += sum(len(self.sizes(lay)) for lay, one in zip(lays, dead, strict=True) if one)
        return dead

    def releasing(self, lay, held):
        before = len(self.dead)
        real_release(self, lay, held)
        left_out[1] += len(self.dead) - before

    requests = [(req.model_copy(update={"headroom": (0.1, 0.25, 0.4)[seed % 3]}), top_k)
                for seed in range(24) for req, top_k in [sampled_request(seed)]]
    requests.append((Request(model="kimi-k2", num_gpus=256, gpu="h100"), 5))
    compared = 0
    for req, top_k in requests:
        for budget in (None, 60):
            if budget is not None:
                limits = search_engine.search_limits()
                monkeypatch.setattr(search_engine, "search_limits",
                                    lambda limits=limits, b=budget: limits.model_copy(update={"max_evaluations": b}))
            monkeypatch.setattr(BestFirstSearch, "group_dead", counting)
            monkeypatch.setattr(BestFirstSearch, "release", releasing)
            try:
                fast = recommend(req, top_k=top_k).model_dump(mode="json")
            except MeshplanError:
                monkeypatch.undo()
                continue
            monkeypatch.setattr(BestFirstSearch, "open_group", plain_open_group)
            assert recommend(req, top_k=top_k).model_dump(mode="json") == fast, (req, budget)
            monkeypatch.undo()
            compared += 1
    assert compared >= 20 and left_out[0] > 1000 and left_out[1] > 1000


def test_an_opened_group_pushes_and_checks_only_the_layouts_the_queue_reaches(monkeypatch):
    """open_group pushes a group's layouts as the queue reaches their least keys, each checked for death (is_dead,
    group_dead) then: on Llama-3.1-70B on 256 H100 some layouts under the cutoff of the groups it opened (their keys
    worked out) are never checked, and a group waits part-way open at a greater key than the one it popped at. The
    answer stays that of a queue holding every seed (plain_open_group, as the test above). (On 64 H100, since
    Megatron-Core's DP sync is launched per model chunk, the search stops before it reaches the tp=4 pp=2 cp=4 group
    it used to leave part-way open: every layout it keys there is checked.)"""
    waits: list[bool] = []
    real_push = heapq.heappush

    def push(heap, entry):
        if entry[1] == Level.GROUP and len(entry[3]) > 3:  # a group part-way open: above the key popping now
            waits.append(entry[0] > popped[0])
        real_push(heap, entry)

    popped = [-math.inf]
    real_open = BestFirstSearch.open_group

    def opening(self, key, *payload):
        popped[0] = key
        real_open(self, key, *payload)

    monkeypatch.setattr(heapq, "heappush", push)
    monkeypatch.setattr(BestFirstSearch, "open_group", opening)
    req = Request(model="llama-3.1-70b", num_gpus=256, gpu="h100")
    job, _ = search_job(req)
    search, _ = search_engine.run_search(job, Fixed.from_request(req, job), default_engine(job.framework), 5, [],
                                         memory_budget(job, headroom_for(req)))
    opened = [lay for group in search.caches.seeds[0].groups for lay, entry, _ in group.members
              if entry[1] is not None and entry[2] <= search.cutoff]
    assert opened and any(lay not in search.dead_layouts for lay in opened)
    assert waits and all(waits)
    monkeypatch.undo()
    fast = recommend(req, top_k=5).model_dump(mode="json")
    monkeypatch.setattr(BestFirstSearch, "open_group", plain_open_group)
    assert recommend(req, top_k=5).model_dump(mode="json") == fast


def test_a_group_whose_least_bubble_layout_cannot_fit_works_out_no_dead_layouts_keys():
    """Kimi-K2 on 256 H100 barely fits: most groups its ranked search opens have no layout that fits. Where a group's
    least-bubble layout (SeedGroup.pick) cannot fit, group_under asks every layout of it before any key, so the seed
    keys of a shape whose layouts all cannot fit are never worked out, and those layouts are counted under the memory
    rule as the group opens: more than a queue holding them would have popped (the settle_dead count)."""
    req = Request(model="kimi-k2", num_gpus=256, gpu="h100")
    job, _ = search_job(req)
    search, _ = search_engine.run_search(job, Fixed.from_request(req, job), default_engine(job.framework), 5, [],
                                         memory_budget(job, headroom_for(req)))
    dead_picked, unkeyed = 0, 0
    for group in search.caches.seeds[0].groups:
        pick = group.members[group.pick][0]
        if search.dead_layouts.get(pick) is not True:
            continue
        dead_picked += 1
        by_entry: dict[int, list[bool]] = {}
        for lay, entry, _ in group.members:
            by_entry.setdefault(id(entry), []).append(search.dead_layouts[lay])  # every layout asked
        for lay, entry, _ in group.members:
            if all(by_entry[id(entry)]):
                assert entry[1] is None, lay  # a shape of dead layouts only: no keys
                unkeyed += 1
    assert dead_picked > 1000 and unkeyed > 5000
    assert search.rejected[memory_rule_id()] >= unkeyed * search.variants() * 2


@pytest.mark.parametrize("spent", [False, True], ids=["run", "budget spent"])
def test_groups_pop_before_their_nodes_and_estimate_nothing(spent):
    """Every node an opened group pushes has a key at least its group's floor (so the group pops first); opening a
    group estimates nothing, so a search whose estimate budget is spent at seeding opens the groups on top and stops
    at its first node, as it did when every node was pushed at seeding."""
    req = Request(model="deepseek-v2-lite", num_gpus=16, framework="megatron-core", gpu="h100")
    job, _ = search_job(req)
    engine = default_engine(job.framework)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), engine, 2)
    ideal = ideal_time(job, engine)
    search.seed(split_space(search).inside, ideal, tier=0)
    assert {entry[1] for entry in search.heap} <= {Level.GROUP, Level.RULES}
    group_of = {id(lay): id(group) for group in search.caches.seeds[0].groups for lay, _, _ in group.members}
    spent_at = search.evaluations
    if spent:
        search.max_evaluations = spent_at
    search.run()
    assert bool(search.found) is not spent and search.stopped_by_budget is spent
    assert search.evaluations == spent_at or not spent
    nodes = [(key, payload) for key, level, _, payload in search.heap if level == Level.FLOOR]
    assert nodes
    floors = {id(group): group.floor[ideal] for group in search.caches.seeds[0].groups if group.floor}
    assert all(key >= floors[group_of[id(payload[0])]] for key, payload in nodes)


def test_recommends_rows_only_are_its_full_answers_rows():
    """rows_only (what min-gpus asks for at each count) ranks the same rows with the same counts."""
    compared = 0
    for seed in range(24):
        req, top_k = sampled_request(seed)
        try:
            full = recommend(req, top_k=top_k)
        except MeshplanError:
            continue
        rows = recommend(req, top_k=top_k, rows_only=True)
        assert rows.candidates == full.candidates, (seed, req)
        assert (rows.considered, rows.rejected, rows.global_batch_size) == (
            full.considered, full.rejected, full.global_batch_size), (seed, req)
        if full.candidates:  # the nothing-fits answer estimates the closest misses, and counts them
            assert rows.evaluated == full.evaluated, (seed, req)
        assert rows.best_below_headroom is None and rows.decision_table == ""
        compared += 1
    assert compared >= 12


def test_min_gpus_settles_a_count_without_recommends_probe_or_table(monkeypatch):
    """min-gpus reads only the ranked rows of recommend at a count: the thinner-headroom probe, the decision table and
    the nothing-fits answer do not run, and its candidate is recommend's full answer's #1 there."""
    req = Request(model="mixtral-8x22b", gpu="h100", seq_length=4096)
    for name in ("fastest_below_headroom", "decision_table", "explain_impossible"):
        monkeypatch.setattr(ranking, name, lambda *_, _name=name, **__: pytest.fail(f"{_name} ran"))
    result = minimum_gpus(req)
    monkeypatch.undo()
    assert result.num_gpus is not None and result.candidate is not None
    there = recommend(req.model_copy(update={"num_gpus": result.num_gpus}), top_k=1)
    assert there.candidates[0] == result.candidate


def test_min_gpus_scans_with_the_cyclic_collector_paused_and_restores_it(monkeypatch):
    """The scan's floors (fits_somewhere) run with the collector paused, as recommend's search does; it is on after."""
    seen = []
    real = gpu_count.fits_somewhere
    monkeypatch.setattr(gpu_count, "fits_somewhere", lambda *a: seen.append(gc.isenabled()) or real(*a))
    assert gc.isenabled()
    result = minimum_gpus(Request(model="llama-3.1-8b", gpu="h100", seq_length=4096), max_gpus=64)
    assert result.num_gpus is not None and seen and not any(seen) and gc.isenabled()


def test_the_probe_enters_a_group_the_ranked_search_worked_out_at_its_least_seed_key(monkeypatch):
    """The thinner-headroom probe (the ranked search's estimates and seed keys, another budget, no count read) seeds a
    group whose every shape's keys the ranked search worked out (raised to the DP bound where it raised them) at the
    least of them, a budget-free bound of each of its nodes, not at its floor: on Qwen3-30B-A3B on 16 H100 no
    such group pops first under that key, and some have it above their floor (the probe opens fewer groups).
    DeepSeek-V2-Lite on 16 H100, the request until the joint refit of 2026-12-07 (host sync 3.25 -> 1.50 ms), now
    enters 3 such groups in its probe, too few to show it."""
    least: dict[int, float] = {}
    below, above, entered = [0], [0], [0]
    real_seeds, real_open = BestFirstSearch.push_seeds, BestFirstSearch.open_group

    def seeding(self, seeds, ideal):
        if not self.tallied:
            for group in seeds.groups:
                entries = list(group.shapes.values())
                if entries and all(entry[1] is not None for entry in entries):
                    least[id(group)] = min(entry[2] for entry in entries)
        real_seeds(self, seeds, ideal)

    def opening(self, key, group, *rest):
        if not self.tallied and len(rest) == 2 and id(group) in least:  # a group's first pop in the probe
            entered[0] += 1
            below[0] += key < least[id(group)]
            above[0] += least[id(group)] > group.floor[rest[1]]
        real_open(self, key, group, *rest)

    monkeypatch.setattr(BestFirstSearch, "push_seeds", seeding)
    monkeypatch.setattr(BestFirstSearch, "open_group", opening)
    # the probe run even where the ranked search's record proves it empty (impossible.below_settled): its mechanics
    monkeypatch.setattr(impossible, "below_settled", lambda *args: False)
    recommend(Request(model="qwen3-30b-a3b", num_gpus=16, framework="megatron-core", gpu="h100"), top_k=5)
    assert entered[0] > 10 and above[0] > 10 and not below[0]


def test_a_floor_node_enters_shard_with_the_dp_term_after_its_per_token_bound(monkeypatch):
    """refine_bound keys the SHARD node of a layout whose memory floor leaves only heavier recomputes at the per-token
    bound there with the once-per-step DP term after it (grid_stage_keys' least: its seed group's, as raise_to_sync
    raises the seed keys), a bound of every key its stages get at SHARD: on Llama-3.1-70B on 64 H100 some such nodes
    enter above both their seed key and the per-token bound alone, none under that."""
    raised, under = [0], [0]
    real_refine, real_push = BestFirstSearch.refine_bound, BestFirstSearch.push
    popping: list = [None]

    def refining(self, key, lay, mbs, *rest):
        popping[0] = key
        real_refine(self, key, lay, mbs, *rest)

    def pushing(self, key, level, payload):
        if level == Level.SHARD and payload[2] > 0:
            lay, mbs, floor = payload
            per_token = self.token_bound(lay, mbs, self.recomputes[floor])
            synced = min(self.grid_stage_keys(lay, mbs, per_token))
            raised[0] += key > max(popping[0], per_token)
            under[0] += key < synced
        real_push(self, key, level, payload)

    monkeypatch.setattr(BestFirstSearch, "refine_bound", refining)
    monkeypatch.setattr(BestFirstSearch, "push", pushing)
    recommend(Request(model="llama-3.1-70b", num_gpus=64, gpu="h100"), top_k=5)
    assert raised[0] > 10 and not under[0]


def test_a_paused_search_leaves_what_it_built_in_the_oldest_generation_and_still_collectable():
    """What a search leaves alive (its job memo, the answer) goes straight to the oldest generation, with no young
    collection due over it; a reference cycle made inside the pause is still freed by a full collection."""
    import weakref

    class Node:
        pass

    gc.unfreeze()  # what an earlier test in this worker froze (an in-process MCP server's start-up) goes back first
    with ranking.collector_paused():
        kept = [[] for _ in range(2000)]
        first, second = Node(), Node()
        first.other, second.other = second, first
        cycle = weakref.ref(first)
        del first, second
    assert gc.get_count()[0] < 100  # the young generation's count starts again: no collection due over `kept`
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(item) in oldest for item in kept) and gc.get_freeze_count() == 0
    assert cycle() is not None
    gc.collect()
    assert cycle() is None


def test_a_process_that_keeps_objects_frozen_keeps_them_frozen_across_a_search():
    """A server that froze what its start-up built (faces/mcp start_up) keeps it frozen: the promotion is skipped."""
    built = [[] for _ in range(100)]
    gc.freeze()
    try:
        assert gc.get_freeze_count() >= len(built)
        recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8), top_k=1)
        collected = {id(o) for o in gc.get_objects()}  # the generations the collector walks, not the frozen ones
        assert gc.get_freeze_count() >= len(built) and not any(id(item) in collected for item in built)
    finally:
        gc.unfreeze()  # this test process is not a server: give its objects back to the collector


def test_pipeline_overlaps_is_each_layouts_own_kept_per_pipeline_and_schedule(monkeypatch):
    """bounds.pipeline_overlaps keeps its verdict per (pp, vpp, schedule) of a layout with EP, all it reads of one (the
    request's fields and the job's card are its memo's): each layout's is the one worked out for it alone
    (_pipeline_overlaps), worked out once per key (the seeding asks it of some 27,000 layouts on DeepSeek-V3/2,048)."""
    req = JOBS[0]
    job, _ = search_job(req)
    search = BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 1)
    search.pipeline_overlap = {}  # (this search's own: none kept by another test's search of the job)
    tiers = split_space(search)
    layouts = [*tiers.inside, *tiers.across]
    own, worked = search._pipeline_overlaps, []
    monkeypatch.setattr(search, "_pipeline_overlaps", lambda lay: worked.append(lay) or own(lay))
    verdicts = [search.pipeline_overlaps(lay) for lay in layouts]
    assert len(worked) == len({(lay.pp, lay.vpp, lay.schedule) for lay in layouts if lay.ep > 1}) > 0
    assert verdicts == [lay.ep > 1 and own(lay) for lay in layouts]
    assert any(verdicts) and not all(verdicts)
