"""The scan for the smallest GPU count at which recommend ranks a layout (`scan_minimum`, run by `minimum_gpus` in
meshplan/search/min_gpus.py and by recommend's nothing-fits answer). Counts are checked in increasing order, never
doubled or bisected: fit is not monotone in the count, since a layout's degrees must divide it. Each count is first
tested by a necessary condition (`fits_somewhere`: some layout's lightest variant passes the structural rules and
fits the headroom, the same tests the search prunes with), and a count that passes it is settled by recommend's own
search there, so `min-gpus` and `recommend --num-gpus` never disagree. The scan is bounded by counts of work
(cards/search.yaml), never by a clock: the same request gets the same answer on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from meshplan.arithmetic import mesh
from meshplan.core.cancel import checkpoint
from meshplan.core.errors import MeshplanError
from meshplan.core.units import plural
from meshplan.rules.fix_values import lcm
from meshplan.schema.plan import Job
from meshplan.search.answer import fixed_text, keeps
from meshplan.search.count_free import FloorProof, floor_proof
from meshplan.search.engine import BestFirstSearch, run_search
from meshplan.search.estimators import Engine
from meshplan.search.job import job_at
from meshplan.search.policy import memory_budget, search_limits
from meshplan.search.refusal import reads_no_micro_batch, rule_blocking_every_count
from meshplan.search.space import Fixed, Layout, divisors, enumerate_layouts, micro_batches
from meshplan.search.zero_stages import least_state_bytes

Ranks = Callable[[int, Job], bool]
"""Whether recommend ranks a layout at a GPU count (the count, and the job there)."""


def fits_somewhere(job: Job, fixed: Fixed, engine: Engine, budget: int) -> bool:
    """A necessary condition for recommend to rank a layout of this job: some layout's lightest variant (the most
    ZeRO sharding that passes the structural rules, the heaviest recompute, the smallest micro-batch) peaks within
    `budget`. The rules are asked as the search asks them (at every recompute), and the search's own
    assumptions (more sharding, more recompute and a smaller micro-batch never add memory) make a False here a proof
    that the search ranks nothing. Layouts with the smallest model-state bound first (ties in enumeration order: the
    answer is the same in any order); stops at the first over it."""
    search = BestFirstSearch.for_job(job, fixed, engine, 1, budget_bytes=budget)
    layouts, _ = enumerate_layouts(job, fixed)
    recompute = search.recomputes[-1]
    lightest = search.zeros[-1]
    bounds = [search.states_bound(lay, lightest) for lay in layouts]
    dead = _Dead(search, layouts)
    for index in sorted(range(len(layouts)), key=bounds.__getitem__):
        checkpoint()
        lay = layouts[index]
        if bounds[index] > budget:
            return False
        if dead.of(index):
            continue
        sizes = micro_batches(job, lay, fixed)
        if not sizes or not any(search.floor_fits(lay, z, recompute, sizes[0]) for z in search.lightest(lay)):
            continue
        # A rule may forbid the most sharded stage (e.g. FSDP with pipelines) but allow a lighter one, and no stage is
        # lighter than every other (plans.lightest), so each is tried.
        if any(lightest_passes(search, lay, zero, recompute, sizes) for zero in reversed(search.zeros)):
            return True
    return False


class _Dead:
    """Whether no plan of a layout can fit (the search's is_dead), asked a degrees tuple at a time when one of its
    layouts is first asked (group_dead: their layout floors together). A layout floor is under every micro-batch's
    and recompute's first-stage floor, so a dead layout's lightest variant is over too: skipping it changes nothing
    but the floors worked out one layout at a time."""

    def __init__(self, search: BestFirstSearch, layouts: list[Layout]) -> None:
        self.search, self.layouts = search, layouts
        self.groups: dict[tuple, list[int]] = {}
        for index, lay in enumerate(layouts):
            self.groups.setdefault(self.degrees(lay), []).append(index)
        self.dead: dict[int, bool] = {}

    @staticmethod
    def degrees(lay: Layout) -> tuple:
        return (lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)

    def of(self, index: int) -> bool:
        if index not in self.dead:
            members = self.groups[self.degrees(self.layouts[index])]
            verdicts = self.search.group_dead([self.layouts[i] for i in members])
            self.dead.update(zip(members, verdicts, strict=True))
        return self.dead[index]


def lightest_passes(search: BestFirstSearch, lay: Layout, zero: int, recompute: str, sizes: tuple[int, ...]) -> bool:
    """Whether the layout's lightest variant at this ZeRO stage (`recompute`, the heaviest, and the smallest
    micro-batch) fits and the structural rules pass some plan of the stage (asked as the search asks them, at every
    recompute: some read it, engine.apply_rules): the first stage's memory floor (a cached sum), then the estimate,
    then the rules (three checks per micro-batch, where most stages that fit fail on every micro-batch of an
    interleaved or combined-1F1B split). An estimate the rules block proves nothing of the stage's other plans (EP009
    refuses the EP overlap with full recompute only): it counts as a fit, and recommend settles the count. The rules
    at the smallest micro-batch come before the estimate: where each recompute's first error is a rule no micro-batch
    moves (refusal.reads_no_micro_batch: FS001 on SkyRL's FSDP engine with tp, pp or ep), every plan of the stage is
    refused, with no estimate and no other micro-batch asked (Kimi-K2 SFT on SkyRL asked 557,000 such checks)."""
    if not search.floor_fits(lay, zero, recompute, sizes[0]):
        return False
    first = search.check_errors(lay, zero, sizes[0])
    if None not in first and all(reads_no_micro_batch(error) for error in first):  # type: ignore[arg-type]
        return False
    try:
        fits = search.fits(lay, zero, recompute, sizes[0])
    except MeshplanError:
        fits = True
    return fits and (None in first or any(None in search.check_errors(lay, zero, mbs) for mbs in sizes[1:]))


def count_unit(job: Job, fixed: Fixed) -> int:
    """The smallest world size the fixed degrees allow: pp*lcm(tp*cp*dp, ep*etp) (cards/rules.yaml WS002; the open
    degrees at 1), or the plain product where expert parallelism takes ranks of its own (KempnerForge)."""
    def v(name: str) -> int:
        return int(fixed.values.get(name, 1))  # type: ignore[call-overload]

    return mesh.smallest_world(job.card.world_size_law,
                               v("tp"), v("pp"), v("cp"), v("dp"), v("ep"), v("etp"))


def gpu_counts(job: Job, fixed: Fixed, start: int, limit: int) -> tuple[Iterator[int], str]:
    """GPU counts from `start` to `limit` in increasing order: the divisors of one node below it, then the multiples
    of the node (of lcm(node, the fixed degrees' minimum world size) when some are fixed). Every count is checked:
    fit is not monotone in the count, since a layout's degrees must divide it."""
    node = job.gpus_per_node
    unit = count_unit(job, fixed)
    if all(name in fixed for name in ("tp", "pp", "cp", "dp")):  # the degrees fix the world size itself
        only = [unit] if start <= unit <= limit else []
        return iter(only), f"only {unit:,} (tp, pp, cp and dp are all fixed)"
    step = lcm(node, unit)
    small = [d for d in divisors(node) if start <= d < node and d % unit == 0]
    text = ", ".join(f"{c:,}" for c in small) + (", then " if small else "")
    text += f"every multiple of {step:,}"
    text += (f" (lcm of the {node}-GPU node and the fixed degrees' smallest world size {unit:,})" if step != node
             else f" (the {node}-GPU node)")

    def counts() -> Iterator[int]:
        yield from (c for c in small if c <= limit)
        c = max(step, -(-start // step) * step)
        while c <= limit:
            yield c
            c += step

    return counts(), text


def states_floor(job: Job, zeros: tuple[int, ...], budget: int, carried: dict[str, object] | None = None) -> int:
    """No count below this can hold the model states within `budget`: the most loaded GPU holds at least 1/N of
    least_state_bytes (a lower bound, never an over-count: tests/test_min_gpus.py holds estimates of sampled layouts
    to it)."""
    return max(1, math.ceil(least_state_bytes(job, zeros, carried) / max(1, budget)))


@dataclass
class Scan:
    """What the smallest-GPU-count scan found, and where and why it stopped."""

    num_gpus: int | None
    first: int
    last: int
    checked: int
    stepping: str
    stopped_by: str  # found | max_gpus | counts | rules | memory
    floor: int = 1  # no smaller count can hold the model states
    limit: int = 0
    rule: str = ""  # stopped_by == rules: the rule that rejects the fixed fields at every count, in words
    searched: int = 0  # counts where the necessary condition held and recommend's search ran
    proof: FloorProof | None = None  # stopped_by == memory: the count-free floor over the budget

    def scanned(self) -> str:
        """Which counts were checked, in words (MinimumGpus.stepping on every face): the counts allowed, or, where a
        rule refuses every count, that the scan stopped at its first."""
        if self.stopped_by == "memory":
            return (f"none: the count-free memory floor is over the budget at every count, so none was scanned (the "
                    f"counts allowed: {self.stepping})")
        if self.stopped_by != "rules":
            return self.stepping
        return (f"only the first count, {self.first:,}: a rule refuses the fixed fields at every count, so none past "
                f"it was scanned (the counts allowed: {self.stepping})")

    def sentence(self, headroom: float, fixed: Fixed) -> str:
        keep = keeps(headroom)
        if self.num_gpus is not None:
            return (f"The smallest GPU count where a layout {keep} is {self.num_gpus:,} (counts scanned in increasing "
                    f"order from {self.first:,}: {self.stepping}); run `meshplan recommend` with "
                    f"--num-gpus {self.num_gpus}.")
        if self.stopped_by == "rules":
            return f"No GPU count can help: {self.rule}"
        if self.proof is not None:
            return self.proof.sentence()
        if self.stopped_by == "counts":
            return (f"The scan for the smallest GPU count where a layout {keep} stopped at its bound of "
                    f"{count_bound_text()} after {self.checked:,} counts from {self.first:,} to {self.last:,} "
                    f"({self.stepping}) without finding one; this is not proof that none fits above {self.last:,}.")
        if self.checked:
            text = (f"No GPU count from {self.first:,} to {self.last:,} ({self.stepping}) has a layout that {keep}")
        else:
            text = (f"No GPU count up to {self.limit:,} can hold the model: its states alone need at least "
                    f"{plural(self.floor, 'GPU')} for a layout that {keep}, and the counts allowed are {self.stepping}")
        return text + (f" with these fixed fields ({fixed_text(fixed)}); leave them open." if fixed.values else ".")


def count_bound_text() -> str:
    """The scan's work bounds in words, as the answer states them."""
    limits = search_limits()
    return (f"{limits.min_gpus_max_counts:,} GPU counts or {limits.min_gpus_max_searches:,} full searches "
            "(cards/search.yaml)")


PREFILTERED_BY = {"tp-heads": ("tp",), "cp-seq": ("cp",),
                  "pp-layers": ("pp", "vpp", "first_stage_layers", "last_stage_layers")}
"""The fields behind each shape law enumerate_layouts prefilters whatever the GPU count (space.Prefiltered.reason)."""


def rules_forbid(job: Job, fixed: Fixed, engine: Engine) -> str:
    """Why the fixed fields have no layout at any GPU count, in words ("" when some count could have one): a fixed
    degree that breaks a shape law (heads, layers, sequence length; enumerate_layouts prefilters these whatever the
    count) or a fixed ep that does not divide the experts."""
    search = BestFirstSearch.for_job(job, fixed, engine, 1)
    examples = []
    moe = job.model.moe
    ep = int(fixed.values.get("ep", 1))  # type: ignore[call-overload]
    if ep > 1 and (moe is None or moe.num_experts % ep):
        degrees = {d: int(fixed.values.get(d, 1)) for d in ("tp", "pp", "cp")}  # type: ignore[call-overload]
        examples.append(Layout(**degrees, ep=ep, etp=1, dp=max(1, job.num_gpus // math.prod(degrees.values()))))
    layouts, dropped = enumerate_layouts(job, fixed)
    if not layouts:
        examples += [g.example for g in dropped if any(n in fixed for n in PREFILTERED_BY.get(g.reason, ()))]
    for example in examples:
        error = search.check_error(example, search.zeros[0], search.recomputes[0], 1)
        if error:
            finding = search.caches.first_finding[error]
            return f"every layout with the fixed fields breaks {error}: {finding.message} Fix: {finding.fix}"
    return ""


def count_free_refusal(job: Job, fixed: Fixed, limit: int, at: Callable[[int], Job]) -> str:
    """A rule that refuses every plan whatever the GPU count (LoRA on a framework without it, fp8 on a GPU without
    it), in words ("" when none): probed at the first, second and last multiple of the scan's step (`at`: the job
    there, as the scan has it), for rules that do not read the count."""
    step = lcm(job.gpus_per_node, count_unit(job, fixed))
    if step > limit:
        return ""
    last = limit - limit % step
    found = rule_blocking_every_count(fixed, sorted({step, min(2 * step, last), last}), at)
    return (f"every layout breaks {found.id} at any GPU count: {found.message} Fix: {found.fix}" if found else "")


def scan_minimum(job: Job, fixed: Fixed, engine: Engine, headroom: float, user_gbs: bool, limit: int, *,
                 at: Callable[[int], Job] | None = None, ranks: Ranks | None = None) -> Scan:
    """The smallest GPU count at which recommend ranks a layout of `job` keeping `headroom`, scanning counts in
    increasing order from the first that could hold the model states, within the card's work bounds; none scanned
    where a rule refuses every count or the count-free memory floor (meshplan/search/count_free.py) is over the
    budget: the answer is then a proof. `at`: the job
    at a count (default: `job` there, a default batch re-derived); `ranks`: whether recommend ranks a layout there
    (default: the ranked search itself, top 1)."""
    limits = search_limits()
    budget = memory_budget(job, headroom)
    at = at or (lambda world: job_at(job, world, user_gbs))
    ranks = ranks or (lambda _, there: bool(
        run_search(there, fixed, engine, 1, [], budget, counted=False, tallied=False)[0].found))
    zeros = BestFirstSearch.for_job(job, fixed, engine, 1, budget_bytes=budget).zeros
    floor = states_floor(job, zeros, budget, fixed.carried)
    counts, stepping = gpu_counts(job, fixed, floor, limit)
    first = last = checked = searched = 0
    for world in counts:
        checkpoint()
        if checked >= limits.min_gpus_max_counts or searched >= limits.min_gpus_max_searches:
            return Scan(None, first, last, checked, stepping, "counts", floor, limit, searched=searched)
        there = at(world)
        if not checked and (reason := rules_forbid(there, fixed, engine) or
                            count_free_refusal(job, fixed, limit, at)):
            return Scan(None, world, world, 1, stepping, "rules", floor, limit, reason)
        if not checked and (proof := floor_proof(job, fixed, headroom, limit)):  # no count can fit: none scanned
            return Scan(None, 0, 0, 0, stepping, "memory", floor, limit, proof=proof)
        first = first or world
        last = world
        checked += 1
        if fits_somewhere(there, fixed, engine, budget):
            searched += 1
            if ranks(world, there):
                return Scan(world, first, last, checked, stepping, "found", floor, limit, searched=searched)
    return Scan(None, first, last, checked, stepping, "max_gpus", floor, limit, searched=searched)
