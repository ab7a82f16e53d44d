"""The tiers of a search's space (meshplan/search/engine.py run_search): its layouts split by whether TP stays inside
the NVLink domain, every plan counted (`split_space`), and the floor of the tier across it, once per job
(`across_floor`, over tier_floor.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from meshplan.estimate.perf import step_terms
from meshplan.search.bounds import StepTimeBounds
from meshplan.search.space import Layout, LayoutRun, Tiers, enumerate_space, within_nvlink
from meshplan.search.tier_floor import tier_floor
from meshplan.search.zero_stages import left_out_counts


def across_floor(search: StepTimeBounds, tiers: Tiers) -> float:
    """tier_floor of the layouts across the NVLink domain, once per job (kept with the search's bounds, which a
    search of the job at another budget shares); 0 (no bound) for an engine other than the cost model's own, which
    the bound reads. Where the tier comes in runs (Tiers.across_runs), their first layouts stand for it: a run's
    layouts share the (tp, pp, cp, dp) tier_floor reads, and the first layout of each of those is a run's first."""
    if search.engine.terms is not step_terms:
        return 0.0
    key = ("tier_floor", 1)
    hit = search.bounds_memo.get(key)
    if hit is None:
        across, runs = tiers.across, tiers.across_runs
        layouts = across if runs is None else [across[run.start] for run in runs]
        hit = search.bounds_memo[key] = tier_floor(search.job, layouts, search.sizes, search.tp_overlap)
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
        search.caches.space = search.job_memo["space"] = enumerate_space(search.job, search.fixed)
    layouts, dropped, runs = search.caches.space
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
    # plans_of and refused_plans read of a layout only its dp (its micro-batches): counted once per dp, in the same
    # pass over the layouts (one read of each layout's fields, or of each run's first: ~40,000 layouts, ~7,000 runs on
    # DeepSeek-V3 over 2,048 GPUs)
    by_dp: dict[int, list] = {}  # per dp: [a layout, how many in all, how many across the domain]
    if runs:
        tier1, tier2, runs1, runs2 = _split_runs(search, layouts, runs, by_dp)
    else:  # no run holds more than one (ep, etp) (enumerate_space): a layout at a time
        tier1, tier2, runs1, runs2 = [], [], None, None
        inside: dict[tuple[int, int], bool] = {}  # within_nvlink per (tp, etp), all it reads
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
    tiers = Tiers(tier1, tier2, considered, rejected, across_plans, runs1, runs2)
    search.job_memo["tiers"] = (tiers, [(key, search.caches.checks[key]) for key in checked])
    return tiers


def _split_runs(search: StepTimeBounds, layouts: list[Layout], runs: tuple[LayoutRun, ...], by_dp: dict[int, list]
                ) -> tuple[list[Layout], list[Layout], tuple[LayoutRun, ...], tuple[LayoutRun, ...]]:
    """split_space's split a run at a time (space.LayoutRun: its layouts share tp and dp, all within_nvlink and the
    plan counts read of a layout besides its etp): its (ep, etp) inside the domain and across it, each tier's layouts
    sliced from the list, with the runs they come in (a run's (ep, etp) that fall in the tier); `by_dp` counted."""
    inside: dict[tuple[int, int], bool] = {}  # within_nvlink per (tp, etp), all it reads
    sides: dict[tuple, tuple[tuple, tuple]] = {}  # per (tp, experts): the experts inside the domain and across it
    tier1: list[Layout] = []
    tier2: list[Layout] = []
    runs1: list[LayoutRun] = []
    runs2: list[LayoutRun] = []
    for start, experts, schedules in runs:
        lay = layouts[start]
        side = sides.get((lay.tp, experts))
        if side is None:
            split: tuple[list, list] = ([], [])
            for expert in experts:
                ok = inside.get((lay.tp, expert[1]))
                if ok is None:
                    ok = inside[lay.tp, expert[1]] = within_nvlink(search.job, replace(lay, etp=expert[1]))
                split[0 if ok else 1].append(expert)
            side = sides[lay.tp, experts] = (tuple(split[0]), tuple(split[1]))
        entry = by_dp.get(lay.dp)
        if entry is None:
            entry = by_dp[lay.dp] = [lay, 0, 0]
        n = len(schedules)
        entry[1] += len(experts) * n
        entry[2] += len(side[1]) * n
        for held, tier, tier_runs in ((side[0], tier1, runs1), (side[1], tier2, runs2)):
            if not held:
                continue
            tier_runs.append(LayoutRun(len(tier), held, schedules))
            if len(held) == len(experts):
                tier += layouts[start:start + len(experts) * n]
            else:
                for expert in held:
                    at = start + experts.index(expert) * n
                    tier += layouts[at:at + n]
    return tier1, tier2, tuple(runs1), tuple(runs2)
