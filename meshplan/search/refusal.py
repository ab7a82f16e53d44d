"""Requests no layout can serve, refused before the search: a framework rule that every plan of the space breaks
(LoRA on a framework without it, a fixed degree no GPU count holds), and a host too small for the offloaded
optimizer on any layout (rule MEM003's floor); and, for a space the rules empty between them, which rule removed
how many plans and the nearest change to the request that opens it.

A rule is a blocker only when it is proven to fire on every plan (every layout, ZeRO stage, recompute and
micro-batch the search would try): the plainest plan at each ZeRO stage names the candidates, then each candidate's
verdict is asked over the whole space and stops at the first plan that passes it, from the job's kept verdicts
(rules/engine.Verdicts.fires: per its screen or the fields it reads, so a space of 170,288 plans asks AD001 on a few
dozen screens). Requests the search can serve pay for a few structural checks only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache

from meshplan.arithmetic.mesh import ranks_per_node
from meshplan.arithmetic.offload import offload_card, offload_plan
from meshplan.check.config import check_structure
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, either_or, plural
from meshplan.knowledge.compute_card import cp_comm_type_default
from meshplan.rules.engine import Context, finding, load_rules, reads_of, rule_specs, verdicts
from meshplan.schema.plan import Job, Plan
from meshplan.schema.reports import Finding
from meshplan.search.job_memo import note_passed, passed_before
from meshplan.search.space import (
    RECOMPUTE_ORDER,
    Fixed,
    Layout,
    Prefiltered,
    enumerate_layouts,
    layout_sequence_parallel,
    micro_batches,
    params_split,
    request_zeros,
)

WORLD_SIZE = "WS001"  # what a layout no GPU count holds breaks (cards/rules.yaml), when no check names another rule


@dataclass(frozen=True)
class Space:
    """The plans the search would try for a job: its layouts (and the groups a cheap law dropped), the ZeRO stages,
    recompute modes and sequence parallelism it builds each plan with (search/engine.py BestFirstSearch.for_job)."""

    job: Job
    fixed: Fixed
    layouts: tuple[Layout, ...]
    dropped: tuple[Prefiltered, ...]
    zeros: tuple[int, ...]
    recomputes: tuple[str, ...]
    sp: bool
    cp_comm: str

    @classmethod
    def of(cls, job: Job, fixed: Fixed) -> Space:
        kn = job.card.search
        zeros = request_zeros(job.card, fixed)
        recomputes = tuple(r for r in RECOMPUTE_ORDER if r in kn.recompute)
        if "recompute" in fixed:
            recomputes = (str(fixed.values["recompute"]),)
        default_sp = job.card.defaults.sequence_parallel_with_tp(job.model)
        sp = bool(fixed.values.get("sequence_parallel", default_sp))
        layouts, dropped = enumerate_layouts(job, fixed)
        return cls(job, fixed, tuple(layouts), tuple(dropped), zeros, recomputes, sp,
                   str(fixed.values.get("cp_comm_type", cp_comm_type_default(job.model, job.card.attention))))

    def plan(self, lay: Layout, zero: int, recompute: str, mbs: int) -> Plan:
        """The plan as the search builds it (the per-plan dispatcher and overlaps at the request's values, else off:
        no structural rule turns on them; but the EP overlap on with the combined 1F1B schedule, its own, as
        plans.a2a_overlap sets it)."""
        sp = layout_sequence_parallel(self.job, self.fixed, self.sp, lay)
        extra = {k: self.fixed.values[k] for k in ("moe_token_dispatcher", "moe_a2a_overlap") if k in self.fixed}
        if lay.schedule == "combined_1f1b":
            extra.setdefault("moe_a2a_overlap", True)
        return lay.plan(zero_stage=zero, recompute=recompute, micro_batch_size=mbs,  # type: ignore[arg-type]
                        sequence_parallel=sp, cp_comm_type=self.cp_comm, **extra,
                        tp_comm_overlap=bool(self.fixed.values.get("tp_comm_overlap")) and lay.tp > 1,
                        **self.fixed.carried)

    def sizes(self, lay: Layout) -> tuple[int, ...]:
        """The micro-batches the search tries for a layout (one when none divides its share: the batch rule)."""
        return micro_batches(self.job, lay, self.fixed) or (int(self.fixed.values.get("micro_batch_size", 1)),)  # type: ignore[call-overload]

    def plans(self, lay: Layout) -> Iterator[Plan]:
        for zero in self.zeros:
            for recompute in self.recomputes:
                for mbs in self.sizes(lay):
                    yield self.plan(lay, zero, recompute, mbs)

    def count(self, lay: Layout) -> int:
        return len(self.zeros) * len(self.recomputes) * len(self.sizes(lay))

    def dropped_by(self) -> Counter:
        """Plans of the groups a cheap law dropped, per the rule their example breaks."""
        counts: Counter = Counter()
        for group in self.dropped:
            error = first_error(self.job, self.plan(group.example, self.zeros[0], self.recomputes[0], 1))
            counts[error.id if error else group.reason] += group.layouts * self.count(group.example)
        return counts


def first_error(job: Job, plan: Plan) -> Finding | None:
    return next((f for f in check_structure(job, plan) if f.severity == "error"), None)


def told_apart_plans(space: Space, rule_id: str, lay: Layout) -> Iterator[Plan]:
    """The layout's plans that can differ in the rule's verdict: every ZeRO stage, and the recomputes and
    micro-batches only where the rule reads them (a plan's other fields are the layout's at every knob)."""
    reads = reads_of(load_rules()[rule_id])
    recomputes = space.recomputes if reads is None or "recompute" in reads else space.recomputes[:1]
    sizes = space.sizes(lay)[:1] if reads_no_micro_batch(rule_id) else space.sizes(lay)
    for zero in space.zeros:
        for recompute in recomputes:
            for mbs in sizes:
                yield space.plan(lay, zero, recompute, mbs)


def blocking_rule(space: Space) -> tuple[Finding, int] | None:
    """A structural rule every plan of the space breaks, with the finding on the plainest plan and how many plans
    there are (those a cheap law dropped included); None when each rule lets some plan through."""
    job = space.job
    if space.layouts:
        plainest = space.layouts[0]
        probes = [first_errors(job, space.plan(plainest, z, space.recomputes[0], space.sizes(plainest)[0]))
                  for z in space.zeros]
        candidates = set.intersection(*({f.id for f in p} for p in probes))
        kept = verdicts(job)  # each rule's verdict kept per what decides it (Verdicts.fires)
        for rule_id in sorted(candidates, key=list(rule_specs()).index):
            if all(kept.fires(job, plan, rule_id) for lay in layouts_told_apart(space, rule_id)
                   for plan in told_apart_plans(space, rule_id, lay)) and all(
                    kept.fires(job, space.plan(fixed_experts(space, group.example), z, r, 1), rule_id)
                    for group in space.dropped for z in space.zeros for r in space.recomputes):
                total = sum(space.count(lay) for lay in space.layouts) + sum(space.dropped_by().values())
                return worded_over_stages(space, rule_id, next(f for f in probes[0] if f.id == rule_id)), total
        return None
    dropped = space.dropped_by()
    if len(dropped) != 1 or not space.dropped:
        return None
    rule_id = next(iter(dropped))
    example = space.plan(space.dropped[0].example, space.zeros[0], space.recomputes[0], 1)
    found = next((f for f in first_errors(job, example) if f.id == rule_id), None)
    return (found, dropped[rule_id]) if found else None


def worded_over_stages(space: Space, rule_id: str, first: Finding) -> Finding:
    """The blocker's finding as a refusal of the whole space states it. Where the request fixes no ZeRO stage and the
    rule's message names one (its values' `zero`: OF001, PR001, PR005, ...), the plainest plan's stage alone would
    claim a stage the user never chose: the rule is worded again at every stage the search tries, stages it words
    alike said once ('at zero_stage 0 or 3'). `first`: its finding on the plainest plan at the first stage."""
    if len(space.zeros) == 1:
        return first
    plainest = space.layouts[0]
    condition = load_rules()[rule_id]
    spec = rule_specs()[rule_id]
    said: dict[str, list[tuple[int, dict]]] = {}  # the message with its stage left blank -> each stage's values
    for zero in space.zeros:
        values = condition(Context(space.job, space.plan(plainest, zero, space.recomputes[0],
                                                        space.sizes(plainest)[0])))
        if not values or "zero" not in values:
            return first
        said.setdefault(finding(spec, {**values, "zero": ""}).message, []).append((zero, values))
    found = [finding(spec, {**stages[0][1], "zero": either_or([z for z, _ in stages])}) for stages in said.values()]
    fixes: dict[str, list[int]] = {}  # each fix -> the stages it is the fix at
    for stages in said.values():
        for zero, values in stages:
            fixes.setdefault(finding(spec, values).fix, []).append(zero)
    fix = next(iter(fixes)) if len(fixes) == 1 else " ".join(
        f"At zero_stage {either_or(stages)}: {text}" for text, stages in fixes.items())
    return first.model_copy(update={"message": " ".join(f.message for f in found), "fix": fix})


def fixed_experts(space: Space, example: Layout) -> Layout:
    """A dropped group's example with the request's fixed ep and etp: a cheap law (tp over the heads, pp over the
    layers) drops a layout before its experts are chosen, so under the Megatron law the example has ep = etp = 1
    where every plan of the group has the fixed ones (a rule that reads them, NT001, must fire there too)."""
    return replace(example, **{k: int(space.fixed.values[k]) for k in ("ep", "etp") if k in space.fixed})  # type: ignore[call-overload]


def first_errors(job: Job, plan: Plan) -> list[Finding]:
    return [f for f in check_structure(job, plan) if f.severity == "error"]


class HostRefused(MeshplanError):
    """MEM003 before the search: the node's host cannot hold what every layout offloads at this GPU count. More GPUs
    spread it over more nodes, so the min-gpus scan takes it as "none at this count" and goes on."""


def host_floor(job: Job, zero: int, plan: Plan) -> float:
    """Host bytes per node the CPU optimizer needs at least on any layout at this ZeRO stage: its bytes per
    parameter (cards/offload.yaml) for its share of every decoder-layer, embedding and output parameter, spread
    over all the GPUs (no shard is smaller than an even split), times the job's ranks on a node (ranks_per_node, as
    the estimate's host_bytes_per_node). Other offloads only add to it. 0 for a LoRA job (the frozen base steps no
    optimizer)."""
    off = offload_plan(job.card, plan.model_copy(update={"zero_stage": zero}))
    if job.lora is not None or not off.cpu_optimizer:
        return 0.0
    per_gpu = offload_card().cpu_optimizer_bytes_per_param * off.cpu_optimizer * sum(params_split(job)) / job.num_gpus
    return per_gpu * ranks_per_node(job)


def nodes_to_hold(job: Job, per_node: float, capacity: int) -> int:
    """Nodes whose hosts, `capacity` bytes each, hold the whole job's host bytes (`per_node` on each of the job's
    nodes, ranks_per_node GPUs apiece): the GPU count a MEM003 refusal names as a fix."""
    return -(-int(per_node * job.num_gpus / ranks_per_node(job)) // int(capacity))


def host_refusal(space: Space) -> HostRefused | None:
    """MEM003 before the search: the host cannot hold the offloaded optimizer on any layout of the space."""
    job = space.job
    capacity = job.cpu_memory_per_node
    if capacity is None or not space.layouts:
        return None
    lay = space.layouts[0]
    plan = space.plan(lay, space.zeros[0], space.recomputes[0], 1)
    floor = min(host_floor(job, z, plan) for z in space.zeros)
    if floor <= capacity:
        return None
    share = offload_plan(job.card, plan.model_copy(update={"zero_stage": space.zeros[-1]})).cpu_optimizer
    per_share = floor / share if share else floor
    fraction = int(capacity / per_share * 100) / 100
    nodes = nodes_to_hold(job, floor, capacity)
    options = [f"use optimizer_offload_fraction={fraction:g} (the CPU optimizer's share that fits)" if fraction > 0
               else "drop the optimizer offload",
               f"use at least {nodes * job.gpus_per_node:,} GPUs ({nodes:,} nodes, a smaller shard per GPU)",
               f"use nodes with at least {floor / GIB:,.1f} GiB of host memory"]
    return HostRefused(
        f"MEM003: the offloaded optimizer needs at least {floor / GIB:,.1f} GiB of host memory per node on any layout "
        f"({offload_card().cpu_optimizer_bytes_per_param:g} B per parameter for {share:.0%} of "
        f"{sum(params_split(job)) / 1e9:,.2f}B parameters over {plural(job.num_gpus, 'GPU')}, "
        f"{ranks_per_node(job)} per node), "
        f"but cpu_memory_per_node is {capacity / GIB:,.1f} GiB: no layout passes rule MEM003.",
        (text := "; or ".join(options))[:1].upper() + text[1:] + ".")


def refuse_impossible(job: Job, fixed: Fixed) -> None:
    """Raise MeshplanError when a framework rule refuses every plan of the space (its id, its message on the plainest
    plan, its fix) or the host cannot hold the offloaded optimizer on any layout (MEM003). A job and fixed fields it
    passed once are passed again without a look (job_memo.passed_before: a pure verdict of them)."""
    if passed_before(job, fixed):
        return
    space = Space.of(job, fixed)
    blocked = blocking_rule(space)
    if blocked is not None:
        found, total = blocked
        raise MeshplanError(f"{found.id}: {found.message} No layout can pass rule {found.id}: it refuses every one "
                            f"of the {total:,} plans recommend would search.", found.fix)
    host = host_refusal(space)
    if host is not None:
        raise host
    note_passed(job, fixed)


COUNT_DEPENDENT = ("WS", "BS", "RL")
"""Rule families whose verdict reads the GPU count (Context.world: the world-size laws; the batch's divisibility by
the data-parallel size; the rollout's GPUs against the trainer's): a refusal at the probed counts says nothing of the
others, so min-gpus leaves them to its scan (tests/test_search_refusal.py: no other rule reads the count)."""


LAYOUT_READS: dict[str, tuple[str, ...]] = {
    # a plan field -> the Layout attributes that set it in Space.plan (Layout.plan: its degrees, pipeline split and
    # schedule; sequence parallelism and the TP overlap with tp, the EP overlap with the schedule), or "sizes": the
    # micro-batches Space tries for the layout
    "tp": ("tp",), "pp": ("pp",), "vpp": ("vpp",), "cp": ("cp",), "ep": ("ep",), "etp": ("etp",), "dp": ("dp",),
    "first_stage_layers": ("first",), "last_stage_layers": ("last",), "pipeline_layout": ("split",),
    "account_for_embedding": ("split",), "account_for_loss": ("split",), "pipeline_schedule": ("schedule",),
    "moe_a2a_overlap": ("schedule",), "sequence_parallel": ("tp",), "tp_comm_overlap": ("tp",),
    "micro_batch_size": ("sizes",)}
COUNT_READ_FIELDS = frozenset(LAYOUT_READS) | {"global_batch_size"}  # with the job's batch, re-derived per count
"""The plan and job fields whose values a GPU count changes among the plans of its space; every other field a plan
of the search holds takes the same values at any count (the ZeRO stages and recomputes the request and the card
allow, the fields it fixes: Space.of). tests/test_search_refusal.py holds it against the spaces of two counts."""


def layouts_told_apart(space: Space, rule_id: str) -> list[Layout]:
    """One layout per distinct value of what the rule reads of a layout (LAYOUT_READS of its declared reads; the rest
    of a plan is the same knobs at every layout): layouts alike in those give the same verdicts on their plans, so
    whether the rule fires on every plan is read on these alone (every layout where it declares no reads)."""
    reads = reads_of(load_rules()[rule_id])
    if reads is None:
        return list(space.layouts)
    attrs = sorted({attr for name in reads for attr in LAYOUT_READS.get(name, ())})
    first: dict[tuple, Layout] = {}
    for lay in space.layouts:
        first.setdefault(tuple(space.sizes(lay) if a == "sizes" else getattr(lay, a) for a in attrs), lay)
    return list(first.values())


@cache
def reads_no_micro_batch(rule_id: str) -> bool:
    """Whether the rule declares what it reads and none of it takes the micro-batch sizes Space tries for a layout
    (LAYOUT_READS): its verdict on a layout's plan at one micro-batch is its verdict at every micro-batch (FS001 on
    the tp, pp and ep of verl's and SkyRL's FSDP engine)."""
    reads = reads_of(load_rules()[rule_id])
    return reads is not None and not any("sizes" in LAYOUT_READS.get(name, ()) for name in reads)


def reads_no_count(rule_id: str) -> bool:
    """Whether the rule's condition declares what it reads (`@rule(reads=...)`) and none of it is a field the GPU count
    changes: a rule every plan of one count's space breaks then breaks every plan at any count."""
    reads = reads_of(load_rules()[rule_id])
    return reads is not None and not COUNT_READ_FIELDS.intersection(reads) and not rule_id.startswith(COUNT_DEPENDENT)


def rule_blocking_every_count(fixed: Fixed, counts: list[int], at: Callable[[int], Job]) -> Finding | None:
    """A framework rule that refuses every plan at each of `counts` GPUs (the min-gpus scan probes the first, second
    and last count it would visit) and does not read the count (LoRA on a framework without it): the scan stops on
    it at once instead of running to its work bound. A rule reading no field a count changes (reads_no_count) that
    blocks every plan of a count whose space holds layouts blocks them at every count: the other counts are not
    probed (the last count's space can hold millions of plans). `at`: the job at a count (search/job.job_at, with the
    batch as the scan re-derives it: an RL job's is the request's at every count)."""
    first: Finding | None = None
    for world in counts:
        space = Space.of(at(world), fixed)
        blocked = blocking_rule(space)
        if blocked is None or blocked[0].id.startswith(COUNT_DEPENDENT) or (first and blocked[0].id != first.id):
            return None
        first = first or blocked[0]
        if space.layouts and reads_no_count(first.id):
            return first
    return first


OPENING_SCAN = 4096
"""Plans checked per relaxed request when looking for the change that opens an empty space: a count of work, the same
on every machine (the first plan that passes the rules ends the scan; most relaxed spaces pass on their first plans)."""


def passing_plan(space: Space) -> Plan | None:
    """The first plan of the space that passes every structural rule (None within OPENING_SCAN plans)."""
    checked = 0
    for lay in space.layouts:
        for plan in space.plans(lay):
            if not first_errors(space.job, plan):
                return plan
            checked += 1
            if checked >= OPENING_SCAN:
                return None
    return None


def opening_changes(job: Job, fixed: Fixed) -> list[str]:
    """The nearest changes that open an empty space: each field the request fixes, left open, whose space then holds
    a plan that passes the rules (named), in the request's order."""
    out = []
    for name, value in fixed.values.items():
        relaxed = Fixed({k: v for k, v in fixed.values.items() if k != name}, fixed.carried, fixed.given)
        plan = passing_plan(Space.of(job, relaxed))
        if plan is not None:
            out.append(f"leave {name} open (the request fixes {name}={value}; then e.g. {plan.short()}, micro-batch "
                       f"{plan.micro_batch_size}, ZeRO {plan.zero_stage}, recompute {plan.recompute} passes them)")
    return out


def empty_space_words(job: Job, fixed: Fixed, rejected: dict[str, int], considered: int,
                      examples: dict[str, Finding]) -> str:
    """What emptied the space: each rule with the plans it removed (most first) and its finding on one of them, then
    the nearest change that opens it."""
    specs = rule_specs()
    parts = []
    for rule_id, count in sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])):
        title = f" ({specs[rule_id].title})" if rule_id in specs else ""
        example = examples.get(rule_id)
        said = f": e.g. {example.message.rstrip('.')}" if example else ""
        parts.append(f"{rule_id}{title} removed {count:,}{said}")
    opening = opening_changes(job, fixed)
    nearest = (" Nearest change that opens it: " + "; or ".join(opening) + "." if opening else
               " No single fixed field left open opens it: change the GPU count or several fields (each rule's fix "
               "names values that pass it), or run `meshplan check` on a layout for every finding.")
    return (f"No layout passes the framework's rules for this request: the rules removed all {considered:,} plans "
            f"between them. " + "; ".join(parts) + "." + nearest)
