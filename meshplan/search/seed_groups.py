"""The search's seeds grouped by degrees: the layouts of one (tp, pp, cp, ep, etp, dp) enter the queue as one node
keyed by a lower bound of all their seed keys (`group_floor`), and only a group that reaches the top of the queue has
its layouts' keys worked out and its (layout, micro-batch) nodes pushed (meshplan/search/engine.py, Level.GROUP).
On a large job most groups never do: DeepSeek-V3 on 2,048 H100 pops FLOOR nodes from about a fifth of its groups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from meshplan.arithmetic.activations import least_rank_tokens
from meshplan.search.space import Layout

# Relative: what a group floor gives up for rounding. The floor and the keys it bounds are products and sums of a
# few non-negative terms in another order, so they differ by a few ulps at most; this is many orders more.
GROUP_MARGIN = 1e-12
INF = float("inf")  # a seed entry's least key until its keys are worked out (one float shared, not one per entry)


@dataclass
class SeedBlock:
    """Runs of a tier's seeding in a row alike in all a seed group reads of a layout but its (ep, etp) (seeding.sized:
    their tp, pp, cp and dp, and their (ep, etp) list, space.LayoutRun): each (ep, etp)'s layouts, one per run and
    schedule, are one seed group's, with the same shapes in the same order. Per member of such a group (its place in
    the group's order), where its layout and its first node are: the index of the first (ep, etp)'s and what the next
    (ep, etp) adds to it (a run's layouts go (ep, etp) by (ep, etp), its schedules within each), and its seed_shape."""

    layouts: list[Layout]  # the tier's
    places: list[tuple[int, int, int, int]]  # per member: layout index, its step per (ep, etp), node index, its step
    shapes: list[tuple]  # per member: its seed_shape
    # per shape with last ranks, and per vpp, where its first layout is (the same member in every group of the block:
    # the first (ep, etp)'s layout index and its step per (ep, etp)), once the block's first group is made (follow)
    chained: list[tuple[int, int]] = field(default_factory=list)
    by_vpp: dict[int, tuple[int, int]] = field(default_factory=dict)

    def layout(self, expert: int, member: int) -> Layout:
        """The member's layout in the group of the `expert`-th (ep, etp)."""
        at, per_expert, _, _ = self.places[member]
        return self.layouts[at + expert * per_expert]


# what a following group (SeedGroup.follow) makes when one of them is first read (SeedGroup.__getattr__)
_MADE_WHEN_READ = frozenset(("members", "shapes", "chained", "by_vpp"))


@dataclass
class SeedGroup:
    """The layouts of one degrees tuple in a tier's seeding (engine.BestFirstSearch.sized), in seeding order, each
    with its shape's entry (Seeds: the shape is the degrees, vpp and bubble_stages) and the index of its first
    node among the tier's (layout, micro-batch) nodes (which orders its nodes' ties in the queue as if every node had
    been pushed at seeding). They share the micro-batches (space.micro_batches reads dp) and the model-state bound
    (states_bound reads the degrees). A group that follows the first of its block (`follow`: the seeding by runs of a
    MoE model, whose runs hold several (ep, etp)) has no members, shapes, chained or by_vpp of its own until one is
    first read (__getattr__: at its opening, for most never); every other group's are its attributes."""

    sizes: tuple[int, ...]
    first: int  # the index of the group's first node
    states: float  # the model-state bound at the lightest ZeRO stage
    # its first layout (members[0][0]: what reads only the degrees reads it of any of them, a following group's
    # members not made)
    example: Layout
    members: list[tuple[Layout, list, int]] = field(default_factory=list)  # (layout, shape entry, first node index)
    nodes: int = 0  # (layout, micro-batch) nodes, one per layout without a micro-batch (the batch rule's)
    bubble: float = float("inf")  # the least bubble_stages of its layouts without last ranks (add)
    # per shape with last ranks: a layout of it (chained) and the shape (chained_shapes), two lists rather than a tuple
    # per layout (most of DeepSeek-V3's ~19,000 seeded layouts have a shape of their own)
    chained: list[Layout] = field(default_factory=list)
    chained_shapes: list[tuple] = field(default_factory=list)
    by_vpp: dict[int, Layout] = field(default_factory=dict)  # one layout per vpp: the seed rates' keys read (pp, vpp)
    # per (vpp, bubble_stages), with bounds.last_ranks where not None: its entry
    shapes: dict[tuple, list] = field(default_factory=dict)
    floor: dict[float, float] = field(default_factory=dict)  # group_floor per ideal time (one per job)
    # the first layout of the least bubble_stages over its shapes (engine.group_under asks it first whether it fits)
    pick: int = 0
    pick_bubble: float = float("inf")
    syncs: tuple | None = None  # bounds.group_syncs of its layouts (StageSync each), once opened (at any budget)
    # the least seed key of its layouts once every shape's keys are worked out (raised to the DP bound where they are):
    # budget-free, under each of its nodes' keys; 0 until then (note_keys)
    least: float = 0.0
    step: int = field(init=False)  # (layout, micro-batch) nodes per layout: len(sizes), or 1 without a micro-batch
    block: SeedBlock | None = field(default=None, repr=False)  # a following group's: where its members are made from
    expert: int = 0  # a following group's (ep, etp)'s position in its block's runs

    def __post_init__(self) -> None:
        self.step = len(self.sizes) or 1  # nodes per layout (add, and the seeding's running index)

    def add(self, lay: Layout, index: int, shape: tuple) -> list:
        """Add a layout whose first node has this index and its seed_shape; the shape's entry (new: [states bound, its
        seed keys (None until opened), their least (inf), whether they are raised to the DP bound
        (engine.raise_to_sync), its last ranks or None: bounds.seed_keys reads them]). A shape with last ranks (its
        third element) has its keys read them, and they may take the bubble out of them (least_bubble). (The
        seeding's hot loop, once per layout: no calls but the shapes' look-up.)"""
        entry = self.shapes.get(shape)
        if entry is None:
            entry = self.shapes[shape] = [self.states, None, INF, False, shape[2] if len(shape) == 3 else None]
            if shape[1] < self.pick_bubble:
                self.pick, self.pick_bubble = len(self.members), shape[1]
            if lay.vpp not in self.by_vpp:
                self.by_vpp[lay.vpp] = lay
            if len(shape) == 3:
                self.chained.append(lay)
                self.chained_shapes.append(shape)
            elif shape[1] < self.bubble:
                self.bubble = shape[1]
        self.members.append((lay, entry, index))
        self.nodes += self.step
        return entry

    def follow(self, lead: SeedGroup, block: SeedBlock, expert: int) -> None:
        """Take the shapes' bookkeeping `add` did for the block's first group, `lead` (the same shapes in the same
        order: all it reads of a layout but its degrees), with this group's own layouts in the same places (what it
        keeps per shape with last ranks and per vpp: SeedBlock.chained, by_vpp), and leave its members, shapes,
        chained and by_vpp to be made when first read (__getattr__)."""
        if not block.by_vpp:
            places = {id(lay): block.places[k][:2] for k, (lay, _, _) in enumerate(lead.members)}
            block.chained = [places[id(lay)] for lay in lead.chained]
            block.by_vpp = {vpp: places[id(lay)] for vpp, lay in lead.by_vpp.items()}
        self.nodes, self.bubble, self.pick, self.pick_bubble = lead.nodes, lead.bubble, lead.pick, lead.pick_bubble
        self.chained_shapes = list(lead.chained_shapes)
        del self.members, self.shapes, self.chained, self.by_vpp
        self.block, self.expert = block, expert

    def __getattr__(self, name: str) -> object:
        """A following group's members, shapes, chained or by_vpp (follow), made at their first read: its layouts of
        its (ep, etp) in the block's places, so as `add` would have made them layout by layout; its members with their
        shapes' entries in the block's order (both at once), its chained and by_vpp alone (what its key reads:
        bounds.group_key; most keyed groups never open). Called only for an attribute the group lacks: a group made
        by `add` reads its own at no call."""
        block = self.__dict__.get("block")
        if block is None or name not in _MADE_WHEN_READ:
            raise AttributeError(name)
        expert, layouts = self.expert, block.layouts
        if name == "chained":
            made: object = [layouts[at + expert * step] for at, step in block.chained]
        elif name == "by_vpp":
            made = {vpp: layouts[at + expert * step] for vpp, (at, step) in block.by_vpp.items()}
        else:
            states = self.states
            shapes: dict[tuple, list] = {}
            members = []
            for (lay_at, per_expert, node_at, per_node), shape in zip(block.places, block.shapes, strict=True):
                entry = shapes.get(shape)
                if entry is None:
                    entry = shapes[shape] = [states, None, INF, False, shape[2] if len(shape) == 3 else None]
                members.append((layouts[lay_at + expert * per_expert], entry, node_at + expert * per_node))
            self.shapes = shapes
            made = self.members = members
            if name == "shapes":
                made = shapes
        setattr(self, name, made)
        return made

    def note_keys(self) -> None:
        """Keep the least seed key of the group's shapes (`least`) where each has its keys worked out: a search of the
        job at another budget (the thinner-headroom probe) keys the group by it (engine.push_seeds)."""
        least = INF
        for entry in self.shapes.values():
            if entry[1] is None:
                return
            if entry[2] < least:
                least = entry[2]
        self.least = least

    def least_bubble(self, light: Callable[[Layout, object], bool]) -> float:
        """The least bubble any seed key of the group counts (group_floor's `bubble`): a shape's bubble_stages, none
        where any shape's last rank may hold less than 1/pp of the work at its seed rate (`light` of the layout and
        its last ranks: bounds.ranks_light not None). Such a shape's keys count at most the last rank's chain, at
        least m x W/pp (bounds.chained), whatever its own bubble: its chains may come out under the stretch of a
        shape with fewer bubble stages (DeepSeek-V3 on 256 H100 with its MTP depth's output layer timed, tp 128 pp 2:
        vpp 16's chains at 253.22 s under vpp 31's stretch at 253.24 s), so a light shape of any bubble takes the
        group's to 0."""
        least = self.bubble
        for lay, (_, bubble, ranks) in zip(self.chained, self.chained_shapes, strict=True):
            if light(lay, ranks):
                return 0.0
            if bubble < least:
                least = bubble
        return least


def seed_shape(lay: Layout, last: tuple | None) -> tuple:
    """What a layout's seed keys read of it besides its degrees (SeedGroup.shapes' key): its vpp and bubble_stages,
    and `last`, its last ranks where it may hold less than 1/pp of the work (bounds.last_ranks), where not None. It
    reads the layout's pp, vpp, first, last, split and schedule: the seeding works it out once per those."""
    bubble = lay.bubble_stages()
    return (lay.vpp, bubble) if last is None else (lay.vpp, bubble, last)


def group_floor(seq_length: int, global_batch: int, lay: Layout, sizes: tuple[int, ...],
                rates: tuple[tuple[int, float, float], ...], bubble: float, ideal: float, sync: float = 0.0,
                outsides: list[float] | None = None) -> float:
    """A lower bound of every seed key (bounds.seed_keys) of a group's layouts: `lay` any of them, `rates` the distinct
    seed rates of their layouts (b_tok, seconds per token, the exposed all-to-all's per token), `bubble` their least
    bubble_stages, `sync` the MoE layers' host sync per micro-batch (bounds.moe_sync_s), `outsides` per micro-batch
    size the least share of a layout's micro-batches outside the EP overlap's steady state (None: no rate exposes
    any all-to-all). A layout's key for a micro-batch of b sequences is the larger of its ideal time, ideal x (1 +
    bubble/m), and its per-token bound (bounds.stretch), W / pp x (m + bubble) with W = tokens x (seconds per token +
    its outside share x the exposed all-to-all) + the host sync's share its reference leaves, sync x max(0, 1 - tokens
    / (b_tok x seq)); its pipeline's chains, where they lower it, keep m x W / pp (rank_chains.stages_bound's slowest
    rank) and take out the bubble (least_bubble: 0). Every term is non-negative, so each key is at least the least W
    over the group's rates at the least outside share, at its least bubble; nothing else read (tokens per CP rank,
    pp, m from dp) differs in a group. The outside share, 1 - moe_time.a2a_steady_share, is least at the group's most
    virtual stages: the warm-up per chunk, (pp - 2) / (m vpp) + pp / m (1 / (m vpp) at pp 1), only falls with vpp.
    The least over the micro-batches, less GROUP_MARGIN for rounding (tests/test_search_passes.py holds it under
    every key)."""
    cp = lay.cp
    pp, dp = lay.pp, lay.dp
    least = INF
    for index, mbs in enumerate(sizes):  # (the hot loop of seeding)
        m = global_batch // (mbs * dp)
        if m < 1:
            m = 1
        tokens = least_rank_tokens(seq_length, mbs, cp)  # padding an engine may add not counted
        outside = 0.0 if outsides is None else outsides[index]
        work = INF
        for b_tok, per_token, exposed in rates:
            rate_work = tokens * (per_token + outside * exposed)
            rest = 1.0 - tokens / (b_tok * seq_length)
            if sync and rest > 0.0:
                rate_work += sync * rest
            if rate_work < work:
                work = rate_work
        low = ideal * (1.0 + bubble / m)
        token = work / pp * (m + bubble)
        if token > low:
            low = token
        if low < least:
            least = low
    return least * (1.0 - GROUP_MARGIN)


@dataclass
class SuperGroup:
    """The seed groups of one (tp, cp, ep, etp) whose keys are not worked out yet: one queue node (engine.push_seeds,
    level GROUP, at the seq of its first group) keyed by `super_floor`, under every one of their group floors; popped,
    each group enters the queue with its own key (engine.open_group). Most groups of a large job never pop: on
    DeepSeek-V3 over 2,048 H100, 3,689 groups make 802 of these (and 98 groups alone), 184 of which pop (998 groups)."""

    groups: list[SeedGroup]
    nodes: int  # (layout, micro-batch) nodes of its groups: what drain counts for a node never popped


def super_floor(seq_length: int, global_batch: int, cp: int, most_dp_pp: int, per_token: float,
                ideal: float) -> float:
    """A lower bound of group_floor over seed groups of one cp, `per_token` the least seconds per token of their
    seed rates and `most_dp_pp` the largest dp x pp among them. Each micro-batch size of a group divides its share of
    the batch (space.micro_batches), so m = global_batch / (mbs x dp) exactly, and a CP rank's tokens are at least
    seq x mbs / cp (least_rank_tokens, rounded up): tokens x m >= seq x global_batch / (cp x dp); group_floor's work
    over pp, W / pp x (m + bubble), is then at least that x per_token / pp (its outside share, the host sync and the
    bubble are non-negative), and its ideal term at least `ideal`. Twice GROUP_MARGIN off for the rounding of both
    (tests/test_search_passes.py holds it under every group floor)."""
    token = seq_length * global_batch / (cp * most_dp_pp) * per_token
    return (token if token > ideal else ideal) * (1.0 - 2 * GROUP_MARGIN)


@dataclass
class Seeds:
    """One tier's seeding (engine.BestFirstSearch.seed), the same at any memory budget: its layouts per degrees tuple
    in order (`groups`, what the queue is seeded with; each layout with its shape's entry, [model-state bound at the
    lightest ZeRO stage, seed keys, least seed key], the keys None until a group of the shape is opened under a budget
    the bound keeps), how many (layout, micro-batch) nodes they make (`nodes`), and the largest micro-batches per
    (tp, cp) and (tp, ep, etp) once the tier is seeded (the bounds' references read them)."""

    cp_mbs: dict[tuple[int, int], int]
    work_mbs: dict[tuple[int, int, int], float]
    groups: list[SeedGroup]
    nodes: int
    # super_floor per (tp, cp, ep, etp, ideal time) of the groups then without keys: a search at another budget reads
    # it for those still without keys (some of them: a bound of theirs too), its rates not asked again
    supers: dict[tuple[int, int, int, int, float], float] = field(default_factory=dict)
