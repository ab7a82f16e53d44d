"""The seeding of a best-first search (meshplan/search/engine.py): a tier's layouts grouped per degrees tuple
(seed_groups.SeedGroup, sized once per job), queued one node per group keyed by its group floor, or, where that is not
worked out yet, per (tp, cp, ep, etp) as one SuperGroup keyed by a bound of all their floors (seed_groups.super_floor):
on DeepSeek-V3 over 2,048 H100 the 3,689 groups make 802 SuperGroups (and 98 groups alone), 184 of which pop, so
1,096 group floors are worked out instead of 3,689."""

from __future__ import annotations

import heapq
from operator import itemgetter

from meshplan.core.cancel import checkpoint
from meshplan.search.levels import GROUP, RULES
from meshplan.search.seed_groups import SeedBlock, SeedGroup, Seeds, SuperGroup, seed_shape, super_floor
from meshplan.search.space import Layout, LayoutRun

# what the seeding reads of each layout (its fields' own dict, at C speed): its degrees (of a run's first layout: its
# degrees but ep and etp, a block's: SeedBlock), and its pipeline's fields, all that seed_shape and bounds.last_ranks
# read of it
_DEGREES = itemgetter("tp", "pp", "cp", "ep", "etp", "dp")
_BLOCK = itemgetter("tp", "pp", "cp", "dp")
_PIPE = itemgetter("pp", "vpp", "first", "last", "split", "schedule")


class Seeding:
    """BestFirstSearch's seeding (its queue, counts, cutoff and memos; the bounds are StepTimeBounds')."""

    def seed(self, layouts: list[Layout], ideal: float, tier: int | None = None,
             runs: tuple[LayoutRun, ...] | None = None) -> None:
        """Seed the queue with the layouts' micro-batches, a group per degrees tuple (push_seeds). What a seed key
        reads of a layout is its degrees and bubble (space.Layout.shape), so the keys and the model-state bound are
        worked out once per shape, the keys only when a group of the shape is opened. A `tier` of run_search is sized
        once per job (Caches.seeds): a search at another budget (the thinner-headroom probe) reads the same keys.
        `runs`: the runs the layouts come in (sized)."""
        seeds = self.caches.seeds.get(tier) if tier is not None else None
        if seeds is None:
            seeds = self.sized(layouts, runs)
            if tier is not None:
                self.caches.seeds[tier] = seeds
        else:
            self.cp_mbs.update(seeds.cp_mbs)
            self.work_mbs.update(seeds.work_mbs)
        self.push_seeds(seeds, ideal)

    def sized(self, layouts: list[Layout], runs: tuple[LayoutRun, ...] | None = None) -> Seeds:
        """What seeding these layouts reads before any budget: their micro-batches, the largest per shard
        (cp_mbs, work_mbs: the non-exact token bounds' references), each shape's model-state bound, the groups per
        degrees tuple and each layout's index among the tier's (layout, micro-batch) nodes. `runs`: the runs the
        layouts come in (space.LayoutRun), where the space has them (a MoE model's, whose runs hold several (ep,
        etp)): read a block at a time (by_runs); without, a layout at a time."""
        if runs is not None:
            return self.by_runs(layouts, runs)
        groups: dict[tuple, SeedGroup] = {}  # per degrees, all that the sizes and the states bound read
        shapes: dict[tuple, tuple] = {}  # seed_shape per what it reads of a layout
        nodes = 0
        for lay in layouts:
            fields = lay.__dict__
            degrees = _DEGREES(fields)
            group = groups.get(degrees)
            if group is None:
                group = groups[degrees] = self.new_group(lay, self.sizes(lay), nodes)
            pipe = _PIPE(fields)
            shape = shapes.get(pipe)
            if shape is None:
                shape = shapes[pipe] = seed_shape(lay, self.last_ranks(lay))
            group.add(lay, nodes, shape)
            nodes += group.step
        return Seeds(dict(self.cp_mbs), dict(self.work_mbs), list(groups.values()), nodes)

    def by_runs(self, layouts: list[Layout], runs: tuple[LayoutRun, ...]) -> Seeds:
        """sized a block of runs at a time: runs in a row alike but in their (ep, etp) (seed_groups.SeedBlock) give
        each (ep, etp) a group of as many layouts, with the same shapes in the same order: the first (ep, etp)'s group
        is made layout by layout (SeedGroup.add) and the others follow it (SeedGroup.follow), their members made when
        read (at their opening: most never open; DeepSeek-V3 on 2,048 H100 seeds 19,314 layouts in 3,688 groups of 288
        blocks). The same groups, in the same order, with the same members, as a layout at a time
        (tests/test_search_passes.py)."""
        groups: dict[tuple, SeedGroup] = {}  # per degrees, all that the sizes and the states bound read
        shapes: dict[tuple, tuple] = {}  # seed_shape per what it reads of a layout
        nodes, at, count = 0, 0, len(runs)
        while at < count:
            start, experts, _ = runs[at]
            lay = layouts[start]
            alike = _BLOCK(lay.__dict__)
            end = at + 1
            while end < count and runs[end][1] == experts and _BLOCK(layouts[runs[end][0]].__dict__) == alike:
                end += 1
            sizes = self.sizes(lay)
            step = len(sizes) or 1
            places, block_shapes = [], []
            for one, _, schedules in runs[at:end]:
                per_expert = len(schedules)
                for schedule in range(per_expert):
                    first = layouts[one + schedule]  # (the first (ep, etp)'s: its pipeline is the run's)
                    pipe = _PIPE(first.__dict__)
                    shape = shapes.get(pipe)
                    if shape is None:
                        shape = shapes[pipe] = seed_shape(first, self.last_ranks(first))
                    places.append((one + schedule, per_expert, nodes + schedule * step, per_expert * step))
                    block_shapes.append(shape)
                nodes += len(experts) * per_expert * step
            block = SeedBlock(layouts, places, block_shapes)
            lead = None
            for expert, (ep, etp) in enumerate(experts):
                degrees = (*alike[:3], ep, etp, alike[3])
                group = groups.get(degrees)
                if group is None:
                    group = groups[degrees] = self.new_group(block.layout(expert, 0), sizes,
                                                             places[0][2] + expert * places[0][3])
                    if lead is not None:
                        group.follow(lead, block, expert)
                        continue
                    lead = group
                add = group.add  # (a degrees tuple of an earlier block: added to; block.layout inlined)
                for (lay_at, per_expert, node_at, per_node), shape in zip(places, block_shapes, strict=True):
                    add(layouts[lay_at + expert * per_expert], node_at + expert * per_node, shape)
            at = end
        return Seeds(dict(self.cp_mbs), dict(self.work_mbs), list(groups.values()), nodes)

    def new_group(self, lay: Layout, sizes: tuple[int, ...], first: int) -> SeedGroup:
        """The seed group of the layout's degrees, its first node at `first`, with its shard's largest micro-batch
        noted (cp_mbs, work_mbs)."""
        if sizes:
            key = (lay.tp, lay.cp)
            self.cp_mbs[key] = max(self.cp_mbs.get(key, 1), sizes[-1])
            work = (lay.tp, lay.ep, lay.etp)
            self.work_mbs[work] = max(self.work_mbs.get(work, 1.0), sizes[-1] / lay.cp)
        return SeedGroup(sizes, first, self.states_bound(lay, self.zeros[-1]), lay)

    def push_seeds(self, seeds: Seeds, ideal: float) -> None:
        """Seed the queue, a group of layouts per degrees tuple (seed_groups.py): one whose model states are over
        budget is rejected, one whose share of the batch no micro-batch divides goes to the batch rule, the others
        enter as one node keyed by their group floor (over the cutoff: left out), or, where that is not worked out
        yet, with the others of their (tp, cp, ep, etp) as one SuperGroup (push_supers). Each (layout, micro-batch)
        node keeps the place in the queue's ties its index in the tier gives it (seeds' seq, reserved here, before any
        refinement's), so the queue pops the same nodes in the same order as if every node were pushed here."""
        base, variants = self.seq, self.variants()
        self.seq += seeds.nodes
        self.seed_rates = {}
        supers: dict[tuple[int, int, int, int], list[SeedGroup]] = {}  # the groups without a key, per (tp, cp, ep, etp)
        for group in seeds.groups:
            checkpoint()
            lay = group.example
            bound = group.states
            if bound > self.budget:
                # even the most sharded model states do not fit: no variant of these layouts can
                self.rejected[self.memory_rule_for(bound)] += variants * group.nodes
                if self.below is not None:
                    self.below.groups.append(group)
                continue
            if not group.sizes:
                # No micro-batch divides these layouts' share of the batch: let the batch rule say so.
                mbs = int(self.fixed.values.get("micro_batch_size", 1))  # type: ignore[call-overload]
                if self.below is not None:
                    self.below.unsized = True
                for lay, _, index in group.members:
                    heapq.heappush(self.heap, (0.0, RULES, base + index + 1, (lay, mbs, 0)))
                continue
            key = group.floor.get(ideal)  # the same at any budget: a search at another budget reads it
            if key is None:
                supers.setdefault((lay.tp, lay.cp, lay.ep, lay.etp), []).append(group)
            else:
                self.push_group(group, key, base, ideal)
        self.push_supers(supers, seeds.supers, base, ideal)

    def push_supers(self, supers: dict[tuple[int, int, int, int], list[SeedGroup]],
                    kept: dict[tuple[int, int, int, int, float], float], base: int, ideal: float) -> None:
        """Each list of groups of one (tp, cp, ep, etp) without keys as one GROUP node keyed by super_floor (`kept`
        per job: Seeds.supers), at its first group's seq: each group's own key is at least that (the least seed rate
        of their layouts, the largest dp x pp), and its node's place in the queue after it (its seq not less), so the
        node pops before any of theirs would and pushes them then (open_group: a queue holding them from the start
        pops the same nodes in the same order); over the cutoff, left out. A group alone is keyed at once."""
        s, gbs, rates = self.job.seq_length, self.job.global_batch_size, self.seed_rates
        for degrees, groups in supers.items():
            if len(groups) == 1:
                self.push_group(groups[0], self.keyed(groups[0], ideal), base, ideal)
                continue
            rated: dict[bool, float] = {}  # group_key's rates' seconds per token: one per pipeline_overlaps of a vpp
            most, nodes, key = 0, 0, kept.get((*degrees, ideal))
            for group in groups:
                if key is None and len(rated) < 2:  # (both asked: no other rate to read)
                    for one in group.by_vpp.values():
                        overlap = self.pipeline_overlaps(one)
                        if overlap not in rated:
                            rated[overlap] = self.seed_rate(one, group.sizes[0], rates, overlap)[1]
                lay = group.example
                most, nodes = max(most, lay.dp * lay.pp), nodes + group.nodes
            if key is None:
                key = kept[(*degrees, ideal)] = super_floor(s, gbs, degrees[1], most, min(rated.values()), ideal)
            if key > self.cutoff:
                self.beyond_cutoff += self.variants() * nodes  # no key of its groups is under the cutoff
                continue
            heapq.heappush(self.heap, (key, GROUP, base + groups[0].first + 1,
                                       (SuperGroup(groups, nodes), base, ideal)))

    def keyed(self, group: SeedGroup, ideal: float) -> float:
        """The group's key (group_key, at its first layout), worked out once per job: a search at another budget reads
        it (its rates are cached)."""
        key = group.floor.get(ideal)
        if key is None:
            key = group.floor[ideal] = self.group_key(group, group.example, ideal, self.seed_rates)
        return key

    def push_group(self, group: SeedGroup, key: float, base: int, ideal: float) -> None:
        """Queue a seed group at its key, over the cutoff left out (every node of it counted as never queued)."""
        if group.least > key and not self.tallied:
            # every key worked out by a search of the job at another budget (the ranked one, for the probe): the
            # group would wait at the least, or drop every node over the cutoff, once popped (open_group), so it
            # enters there; only where no count is read (a group never opened counts its dead layouts as slower)
            key = group.least
        if key > self.cutoff:
            self.beyond_cutoff += self.variants() * group.nodes  # no key of the group is under the cutoff
            return
        heapq.heappush(self.heap, (key, GROUP, base + group.first + 1, (group, base, ideal)))
