"""The tiers of a search's space (meshplan/search/engine.py run_search): its layouts split by whether TP stays inside
the NVLink domain, every plan counted (`split_space`), and the floor of the tier across it, once per job
(`across_floor`, over tier_floor.py)."""

from __future__ import annotations

from collections import Counter

from meshplan.estimate.perf import step_terms
from meshplan.search.bounds import StepTimeBounds
from meshplan.search.space import Layout, Tiers, enumerate_layouts, within_nvlink
from meshplan.search.tier_floor import tier_floor
from meshplan.search.zero_stages import left_out_counts


def across_floor(search: StepTimeBounds, tiers: Tiers) -> float:
    """tier_floor of the layouts across the NVLink domain, once per job (kept with the search's bounds, which a
    search of the job at another budget shares); 0 (no bound) for an engine other than the cost model's own, which
    the bound reads."""
    if search.engine.terms is not step_terms:
        return 0.0
    key = ("tier_floor", 1)
    hit = search.bounds_memo.get(key)
    if hit is None:
        hit = search.bounds_memo[key] = tier_floor(search.job, tiers.across, search.sizes, search.tp_overlap)
    return hit  # type: ignore[return-value]


def split_space(search: StepTimeBounds) -> Tiers:
    """The job's space (enumerate_layouts) split by whether TP stays inside the NVLink domain, with every plan
    counted: the layouts a cheap law dropped, one check naming the rule for each group, and the ZeRO stages the
    search leaves out under the rules that refuse them (zero_stages.search_ladder: AD001's, a blocking rule's).
    Once per job memo (job_memo.py: the same at any budget), a later search taking its checks' findings as the first
    one did (SearchPlans.kept_check)."""
    kept = search.job_memo.get("tiers")
    if kept is not None:
        tiers, checks = kept
        for key, finding in checks:
            search.kept_check(key, finding)
        return tiers
    if search.caches.space is None:  # (kept with the job's memo)
        search.caches.space = search.job_memo["space"] = enumerate_layouts(search.job, search.fixed)
    layouts, dropped = search.caches.space
    considered = 0
    rejected: Counter = Counter()
    checked = []  # the checks' keys, in the order asked
    # Groups dropped by a cheap law: one check names the rule, every layout in the group counts under it.
    for group in dropped:
        key = (group.example, search.zeros[0], search.recomputes[0], 1)
        error = search.check_error(*key)
        checked.append(key)
        count = group.layouts * (search.plans_of(group.example) + search.refused_plans(group.example))
        considered += count
        rejected[error or group.reason] += count
    inside: dict[tuple[int, int], bool] = {}  # within_nvlink per (tp, etp), all it reads
    tier1: list[Layout] = []
    tier2: list[Layout] = []
    # plans_of and refused_plans read of a layout only its dp (its micro-batches): counted once per dp, in the same
    # pass over the layouts (one read of each layout's fields: ~40,000 on DeepSeek-V3 over 2,048 GPUs)
    by_dp: dict[int, list] = {}  # per dp: [a layout, how many in all, how many across the domain]
    for lay in layouts:
        ok = inside.get((lay.tp, lay.etp))
        if ok is None:
            ok = inside[lay.tp, lay.etp] = within_nvlink(search.job, lay)
        entry = by_dp.get(lay.dp)
        if entry is None:
            entry = by_dp[lay.dp] = [lay, 0, 0]
        entry[1] += 1
        if ok:
            tier1.append(lay)
        else:
            tier2.append(lay)
            entry[2] += 1
    across_plans = 0
    left_out = left_out_counts(search.refused)  # per rule, the left-out stages' (stage, recompute) pairs
    for example, count, across in by_dp.values():
        plans, refused = search.plans_of(example), search.refused_plans(example)
        considered += count * (plans + refused)
        micro = max(1, len(search.sizes(example)))
        for rule, pairs in left_out.items():
            rejected[rule] += count * pairs * micro
        across_plans += across * plans
    tiers = Tiers(tier1, tier2, considered, rejected, across_plans)
    search.job_memo["tiers"] = (tiers, [(key, search.caches.checks[key]) for key in checked])
    return tiers
