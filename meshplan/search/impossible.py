"""Answers when the headroom decides: the fastest layout that fits only with less headroom (the thinner-headroom
probe, named in the answer when nothing is ranked or when it is much faster than the best ranked one), and the
nothing-fits answer (the closest misses, or the rule that rejects everything, then the smallest GPU count)."""

from __future__ import annotations

import math
from collections import Counter

from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.schema.plan import Job
from meshplan.schema.reports import NearMiss, Recommendation
from meshplan.search.answer import candidate, headroom_text, knob_words, percent, plan_words
from meshplan.search.bounds import by_key
from meshplan.search.engine import BestFirstSearch, Found, run_search, shared_search
from meshplan.search.estimators import Engine, ideal_time
from meshplan.search.gpu_count import scan_minimum
from meshplan.search.policy import (
    HEADROOM_RULE,
    HOST_RULE,
    SEARCH_BUCKETS,
    headroom_that_ranks,
    search_comparison,
    search_limits,
    slower_by,
)
from meshplan.search.refusal import empty_space_words
from meshplan.search.space import Fixed, Layout, enumerate_layouts, micro_batches
from meshplan.search.tiers import across_floor


def fastest_below_headroom(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch) -> Found | None:
    """The fastest layout that fits the GPU at all, when it does not keep the headroom: a top-1 search at full
    capacity reusing the ranked search's estimates. When layouts are ranked, only one at least `below_headroom_gain`
    faster than the best matters, so the probe stops at that step time. None when there is no such layout."""
    if search.budget >= job.gpu.memory_bytes or search.stopped_by_budget:
        return None
    cutoff = math.inf
    if search.found:
        cutoff = min(f.time for f in search.found) * (1.0 - search_comparison().below_headroom_gain)
        if below_settled(job, fixed, engine, search, cutoff):
            return None
    probe, _ = run_search(job, fixed, engine, 1, [], job.gpu.memory_bytes, share=search, cutoff=cutoff,
                          counted=False, tallied=False)  # its found plan alone is read
    if not probe.found or probe.stopped_by_budget:
        return None
    fastest = min(probe.found, key=lambda f: f.time)
    return fastest if fastest.memory.fit_bytes > search.budget else None  # the figure the search's budget reads


def below_settled(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch, cutoff: float) -> bool:
    """Whether the ranked search's own record (BestFirstSearch.below) proves that the probe would find nothing at or
    under `cutoff`, so it need not run. The probe pops, at full capacity, only nodes whose keys are at most the cutoff,
    which is under the ranked search's fastest row and so under where it stopped: every seed of such a key was popped
    at Level.FLOOR by the ranked search, or found dead, or left out with its group's model states over the budget
    (Below). Each is asked here as the probe's FLOOR, SHARD and RULES levels would ask it at capacity (reaches_need),
    with keys never above the probe's: no least recompute learnt from other nodes (need_range), and the seed keys of
    a layout the ranked search found dead raised to its group's DP bound without the early stop that group_syncs'
    seeds allow (the same keys: a stage that raises none of the seeds raises none of theirs). Nothing it works out is
    kept but in the job's budget-free memos, which hold the same figures whoever asks first. False (the probe runs)
    where any node reaches the probe's Level.NEED (its first estimate) at or under the cutoff, a group of layouts over
    the budget's model states may hold one, a group has no micro-batch (the batch rule's nodes) or the tier across
    the NVLink domain may be searched. The lowest keys are asked first: where the probe has work, they most often
    show it. A bound that cannot be worked out here (an error the probe may never meet, on a node whose key there is
    over the cutoff) leaves it to the probe."""
    try:
        return _below_settled(job, fixed, engine, search, cutoff)
    except MeshplanError:
        return False


def _below_settled(job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch, cutoff: float) -> bool:
    below, tiers, seeds = search.below, search.caches.tiers, search.caches.seeds.get(0)
    if below is None or below.unsized or tiers is None or seeds is None:
        return False
    probe = shared_search(job, fixed, engine, 1, job.gpu.memory_bytes, search)
    probe.cp_mbs.update(seeds.cp_mbs)  # as its seeding of the tier inside the domain sets them (Seeding.seed)
    probe.work_mbs.update(seeds.work_mbs)
    nodes = sorted((node for node in below.nodes if node[0] <= cutoff), key=lambda node: node[0])
    if any(reaches_need(probe, key, lay, mbs, cutoff, ranked=search) for key, lay, mbs in nodes):
        return False
    ideal, capacity = ideal_time(job, engine), probe.budget
    if any(group.states <= capacity and probe.keyed(group, ideal) <= cutoff for group in below.groups):
        return False
    raised: dict[int, tuple | None] = {}  # per group of the dead layouts: its DP bound (group_syncs, not kept)
    for lay, entry, group in below.members:
        if id(group) not in raised:  # its group floor raised to its DP bound at its fewest micro-batches: under each
            syncs = probe.group_syncs([one for one, _, _ in group.members], keep=False)  # of its raised seed keys
            floor, ms = group.floor.get(ideal, 0.0), probe.microbatches(lay, group.sizes[-1])
            over = (probe.synced([floor], [ms], syncs)[0] if syncs else floor) > cutoff
            raised[id(group)] = None if over else syncs
        syncs = raised[id(group)]
        if syncs is None or probe.is_dead(lay):
            continue
        sizes, keys = group.sizes, entry[1]
        if keys is None:  # never worked out (group_under's dead members)
            keys = probe.seed_keys(lay, sizes, ideal, probe.seed_rate(lay, sizes[0], probe.seed_rates), entry[4])
        if syncs and not entry[3]:  # raised as the probe's opening of the group would (engine.raise_live)
            keys = probe.synced(keys, [probe.microbatches(lay, mbs) for mbs in sizes], syncs)
        if any(key <= cutoff and reaches_need(probe, key, lay, mbs, cutoff, syncs)
               for mbs, key in zip(sizes, keys, strict=True)):
            return False
    return not tiers.across or across_floor(probe, tiers) > cutoff


def reaches_need(probe: BestFirstSearch, key: float, lay: Layout, mbs: int, cutoff: float,
                 syncs: tuple | None = None, ranked: BestFirstSearch | None = None) -> bool:
    """Whether a seed node of this key reaches the probe's Level.NEED at or under the cutoff (what must pop before
    any estimate of its plans' fit or time): its FLOOR pop (engine.refine_bound) and SHARD pop (refine_shard) at the
    probe's budget, each RULES node that SHARD pop pushes at or under the cutoff (a key per ZeRO stage, dp_keys)
    popped as the probe pops it (engine.rules_pass at the probe's budget), and the NEED nodes of the stages those
    pass (engine.need_nodes), counted in a Counter of their own. Its DP keys come from the bound its grid keeps,
    else `syncs` (its group's, below_settled), else none (synced never lowers a key). `ranked`: the ranked search,
    under a smaller budget, whose verdicts the probe's cannot exceed: a layout that may fit there may here, and a
    need_floor of none there is none here (a floor under the smaller budget is under the larger). Its floor is the
    probe's without the least recompute learnt from other nodes (need_range), so each key is never above the
    probe's (a lighter recompute's pipeline bound is never above a heavier one's)."""
    if (ranked is None or ranked.dead_layouts.get(lay) is not False) and probe.is_dead(lay):
        return False
    known = None if ranked is None else ranked.floor_least.get(lay)
    floor = 0 if known is not None and known.get(mbs) == 0 else probe.need_floor(lay, mbs)
    if floor >= len(probe.recomputes):
        return False
    recompute = probe.recomputes[floor]
    if floor > 0:
        key = max(key, min(dp_keys(probe, lay, mbs, probe.token_bound(lay, mbs, recompute), syncs)))
        if key > cutoff:
            return False
    pipe = probe.pipeline_bound(lay, mbs, recompute, interleave=True)
    spare: Counter = Counter()  # (the probe's counts are not read)
    for rules_key, zeros in by_key([max(key, k) for k in dp_keys(probe, lay, mbs, pipe, syncs)], probe.zeros):
        if rules_key > cutoff:
            return False  # (by_key: in the keys' order)
        alive, masks = probe.rules_pass(lay, mbs, zeros, spare)
        if alive and any(node[0] <= cutoff for node in probe.need_nodes(rules_key, lay, mbs, alive, masks, floor,
                                                                      spare)):
            return True
    return False


def dp_keys(probe: BestFirstSearch, lay: Layout, mbs: int, pipe: float, syncs: tuple | None) -> list[float]:
    """Per ZeRO stage, grid_stage_keys from the DP bound the grid keeps, else `syncs`, else `pipe` for each."""
    kept = probe.search_memo.get(probe.syncs_key(lay, probe.sync_vpp(lay.vpp)), syncs)
    if not kept:
        return [pipe] * len(probe.zeros)
    return probe.synced([pipe], [probe.microbatches(lay, mbs)], kept, True)  # type: ignore[arg-type]


def report_below_headroom(rec: Recommendation, job: Job, engine: Engine, thin: Found, headroom: float) -> None:
    """Name a layout the headroom excludes when nothing is ranked, or when it is much faster than the best ranked
    one: its free memory, its speed, and the headroom value that would rank it."""
    cap = job.gpu.memory_bytes
    free = thin.memory.headroom_bytes  # what the fit's figure leaves (allocated with expandable segments), as ranked
    share = free / cap
    would_rank = headroom_that_ranks(thin.memory)
    tput = thin.throughput.tokens_per_s_per_gpu
    note = (f"Not ranked: it leaves {free / GIB:.1f} GiB ({share:.1%}) free, under the {headroom:g} headroom; "
            f"headroom={would_rank:g} (--headroom {would_rank:g}) would rank it.")
    row = candidate(job, engine, thin, 1, None, note=note)
    if not rec.candidates:
        rec.best_below_headroom = row
        return
    best = rec.candidates[0].throughput.tokens_per_s_per_gpu
    gap = slower_by(best, tput)
    if gap < search_comparison().below_headroom_gain:
        return
    rec.best_below_headroom = row
    rec.warnings.append(
        f"{thin.plan.short()} ({knob_words(thin.plan)}) is predicted at {tput:,.0f} tokens/s/GPU but leaves only "
        f"{free / GIB:.1f} GiB ({share:.1%}) free, under the {headroom:g} headroom, so it is not ranked: the best "
        f"ranked layout, {rec.candidates[0].plan.short()} at {best:,.0f} tokens/s/GPU, is {gap:.1%} slower. Pass "
        f"headroom={would_rank:g} (--headroom {would_rank:g}) to rank it if the job can run that close to capacity."
    )


def explain_impossible(rec: Recommendation, job: Job, fixed: Fixed, engine: Engine, search: BestFirstSearch,
                       headroom: float, default_headroom: bool, user_gbs: bool, node_gpus: int) -> None:
    """Nothing is ranked. Either a layout fits with less than the headroom (`rec.best_below_headroom`, named with the
    headroom that would rank it) or none fits at all (the closest misses); then the smallest GPU count where a layout
    keeps the headroom, from the same scan `minimum_gpus` runs, over `node_gpus`-GPU nodes."""
    limits = search_limits()
    thin = rec.best_below_headroom
    if search.stopped_by_budget and thin is None:
        rec.rationale = (
            f"The search stopped at its budget of {search.max_evaluations:,} estimates (cards/search.yaml "
            "max_evaluations) before any layout was proven to fit and timed; this is not proof that none fits. Fix "
            "more fields (tp, pp, micro_batch_size, ...) to shrink the space and ask again."
        )
        return
    cap = job.gpu.memory_bytes
    if thin is not None:
        head = (f"No layout keeps {percent(headroom)} of the {cap / GIB:.1f} GiB free on {job.num_gpus:,} "
                f"{job.gpu.name} ({headroom_text(headroom, default_headroom)}), so none is ranked. The fastest that "
                f"fits with less: {thin.rationale}")
    else:
        if not search.near:
            probe_closest(job, fixed, search, limits.closest_layouts)
        rec.closest = closest(search, engine, limits.closest_layouts)
        rec.evaluated = search.evaluations
        memory_rules = (engine.memory_rule, HEADROOM_RULE, HOST_RULE)  # memory, not a space the rules empty
        memory_rejects = sum(rec.rejected.get(rule, 0) for rule in memory_rules)
        rule_rejects = {k: v for k, v in rec.rejected.items() if k not in memory_rules and k not in SEARCH_BUCKETS}
        if not memory_rejects and rule_rejects:
            rec.rationale = empty_space_words(job, fixed, rule_rejects, rec.considered, search.caches.first_finding)
            return
        head = (f"Impossible on {job.num_gpus:,} {job.gpu.name}: no layout fits even with every memory-saving knob "
                f"{'left open' if not fixed.values else 'not fixed by the request'} (highest ZeRO/FSDP stage, full "
                "recompute, micro-batch 1, every TP/PP/CP/EP split).")
        if rec.closest:
            head += " Closest: " + " ".join(c.rationale for c in rec.closest)
    # counts of whole nodes, as min-gpus answers (a count that part-fills them runs with fewer per node)
    whole = job.model_copy(update={"gpus_per_node": node_gpus})
    scan = scan_minimum(whole, fixed, engine, headroom, user_gbs, limits.min_gpus_search_limit)
    rec.min_gpus = scan.num_gpus
    rec.rationale = head + " " + scan.sentence(headroom, fixed)


def closest(search: BestFirstSearch, engine: Engine, count: int) -> list[NearMiss]:
    """The distinct plans that missed by the least, with how far over capacity they are."""
    seen: set[str] = set()
    misses: list[NearMiss] = []
    for over, plan, mem in sorted(search.near, key=lambda t: t[0]):
        key = plan.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        misses.append(NearMiss(
            plan=plan, memory=engine.summary(mem), over_bytes=over,
            rationale=f"{plan_words(plan)}: stage {mem.peak_stage} needs {mem.peak_bytes / GIB:.1f} GiB of "
                      f"{mem.capacity_bytes / GIB:.1f} GiB ({over / GIB:.1f} GiB, "
                      f"{over / mem.capacity_bytes:.0%} over).",
        ))
        if len(misses) >= count:
            break
    return misses


def probe_closest(job: Job, fixed: Fixed, search: BestFirstSearch, count: int) -> None:
    """Nothing was estimated (every layout failed a cheap bound): estimate the lightest variant (virtual stages left
    out: they only add memory) of the 16 x `count` layouts with the smallest model-state bound and of those with the
    smallest first-stage floor (the states and the activations the first stage saves; a last stage's logits are in
    neither bound), so the answer names the closest of both. By the state bound alone and stopped at `count`, layouts
    that shard the states alike tied and the first enumerated were named: Llama-3.1-8B at 1M tokens on 8 GPUs named CP4
    DP2 (346.8 GiB) as the closest, not TP8 (181.1 GiB); by either bound alone and fewer layouts, DeepSeek-V3 on 64
    GPUs named PP16 (230.9 GiB) or EP64 with CP4 (192.6 GiB), not CP32 (184.5 GiB). A few hundred memory estimates at
    most (DeepSeek-V3 on 64 GPUs: about a second), on the path that found nothing to rank."""
    layouts, _ = enumerate_layouts(job, fixed)
    zero, recompute = search.zeros[-1], search.recomputes[-1]
    lightest: dict[tuple, tuple[Layout, int]] = {}
    for lay in sorted(layouts, key=lambda lay: lay.vpp):
        degrees = (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp, lay.first, lay.last, lay.split, lay.schedule)
        if degrees not in lightest and (sizes := micro_batches(job, lay, fixed)):
            lightest[degrees] = (lay, sizes[0])
    pairs = list(lightest.values())
    states = {id(p): search.states_bound(p[0], zero) for p in pairs}
    floor = {id(p): search.floor_bytes(search.own(p[0]), zero, recompute, p[1]) for p in pairs}
    by_states = sorted(pairs, key=lambda p: (states[id(p)], floor[id(p)]))
    by_floor = sorted(pairs, key=lambda p: (floor[id(p)], states[id(p)]))
    for lay, mbs in dict.fromkeys(by_states[: 16 * count] + by_floor[: 16 * count]):
        if not search.check_error(lay, zero, recompute, mbs):
            search.memory(lay, zero, recompute, mbs)
