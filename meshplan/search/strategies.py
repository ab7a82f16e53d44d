"""What the decision tables of cards/strategies.yaml suggest for a job, as a concrete layout.

The search (meshplan/search/decision.py) calls `suggest(job, fixed)` to say whether its ranked answer agrees with the
published rules of thumb. The tables give ranges and starting points; this module turns the row that
applies into a `Plan` the job can actually build (TP inside the NVLink domain and dividing the heads,
degrees that divide the GPU count, CP from the sequence length) and lists every adjustment it made,
so a reader can see where the job departs from the row. A degree the request fixed replaces the row's and no
fitting step moves it: a suggestion the user could not take (another EP than the one they gave) helps no one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import gcd

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic import mesh
from meshplan.arithmetic.schedule import uneven_split
from meshplan.knowledge.cards import FrameworkCard
from meshplan.knowledge.compute_card import cp_comm_type_default
from meshplan.knowledge.model_counts import count_components
from meshplan.knowledge.tables import Layout, SeqRow, strategies_card
from meshplan.rules.context import pads_every_cp_split
from meshplan.schema.plan import Job, Plan


class TableSuggestion(BaseModel):
    """The decision-table row that applies to a job and the layout it suggests for it."""

    model_config = ConfigDict(extra="forbid")

    table: str = Field(description="dense_by_size | moe_by_model | moe_by_size")
    row_id: str
    row: str = Field(description="The row in words")
    plan: Plan = Field(description="The row's layout adapted to this job's GPUs, heads and sequence length")
    sequence_row: str = Field(description="The sequence_length row that set CP")
    adjustments: list[str] = Field(default_factory=list, description="Where the plan departs from the row, and why")
    source: str


FIXABLE = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp")
"""The request's degrees a suggestion keeps as given."""


def _total_params_b(job: Job) -> float:
    return sum(c.params for c in count_components(job.model)) / 1e9


def _seq_row(seq_length: int) -> SeqRow:
    for row in strategies_card().sequence_length:
        if seq_length >= row.min_seq and (row.max_seq is None or seq_length < row.max_seq):
            return row
    raise AssertionError("sequence_length rows tile [0, inf) (checked when the card loads)")


def _row_for(job: Job) -> tuple[str, str, str, Layout, str]:
    """(table, row id, row text, layout, source) of the row that applies to the job's model."""
    card = strategies_card()
    arch = job.model
    size = _total_params_b(job)
    if arch.is_moe:
        for row in card.moe_by_model:
            if arch.key is not None and row.recipe.model == arch.key:
                text = f"{arch.name}: {row.recipe.layout.short()} on {row.recipe.num_gpus} GPUs ({row.notes})"
                return "moe_by_model", row.id, text, row.recipe.layout, row.source
        rows = card.moe_by_size
        table = "moe_by_size"
    else:
        rows = card.dense_by_size
        table = "dense_by_size"
    for row in rows:
        if row.min_params_b <= size < row.max_params_b:
            text = f"{row.min_params_b:g}-{row.max_params_b:g}B ({size:.1f}B): {row.start}"
            return table, row.id, text, row.layout, row.source
    last = max(rows, key=lambda r: r.max_params_b)
    return table, last.id, f"{size:.1f}B: {last.start}", last.layout, last.source


def _tp_ok(tp: int, heads: int, kv_heads: int) -> bool:
    """Megatron's rule: heads % tp == 0 and KV groups a multiple or a divisor of tp."""
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


def _largest_power_of_two_divisor(n: int, cap: int) -> int:
    value = 1
    while value * 2 <= cap and n % (value * 2) == 0:
        value *= 2
    return value


@dataclass
class _Degrees:
    """The row's degrees as `suggest` fits them to the job, one step at a time (first/last: an uneven pipeline
    split's first and last stage layers)."""

    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    first: int | None
    last: int | None
    fixed: frozenset[str] = frozenset()  # the degrees the request set: no fitting step moves them

    def free(self, name: str) -> bool:
        return name not in self.fixed

    def dense_size(self, law: str) -> int:
        return mesh.replica_size(law, self.tp, self.pp, self.cp, self.ep)


def _fit_cp(job: Job, deg: _Degrees, seq: SeqRow, notes: list[str]) -> None:
    """CP at least the sequence-length row's, halved until 2*CP divides the sequence where an engine of the
    framework asks it (CP001; verl's and SkyRL's pad to the cp split themselves: rules.context.pads_every_cp_split);
    none where the framework runs no CP (KempnerForge: the table's CP4 at 32K was then refused by AD001)."""
    if not deg.free("cp"):
        return
    if seq.cp > deg.cp and not job.card.search.cp:  # the table's CP cannot run here: its row is said, not applied
        notes.append(f"CP stays {deg.cp}: the sequence-length row ({seq.id}) asks CP {seq.cp}, but {job.framework} "
                     f"runs no context parallelism (cards/frameworks/{job.framework}.yaml search.cp).")
        return
    if seq.cp > deg.cp:
        notes.append(f"CP {deg.cp} -> {seq.cp}: sequence length {job.seq_length} ({seq.id}).")
        deg.cp = seq.cp
    while deg.cp > 1 and job.seq_length % (2 * deg.cp) and not pads_every_cp_split(job.card):
        notes.append(f"CP {deg.cp} -> {deg.cp // 2}: seq_length must be divisible by 2*CP.")
        deg.cp //= 2


def _fit_tp(job: Job, deg: _Degrees, notes: list[str]) -> None:
    """TP inside the NVLink domain, halved until it divides the heads (and the KV groups divide or are divided)."""
    if not deg.free("tp"):
        return
    arch = job.model
    tp_cap = mesh.job_domain(job)
    if deg.tp > tp_cap:
        notes.append(f"TP {deg.tp} -> {tp_cap}: TP stays inside the NVLink domain (topology row tp-in-nvlink).")
        deg.tp = tp_cap
    while deg.tp > 1 and not _tp_ok(deg.tp, arch.num_attention_heads, arch.num_kv_heads):
        notes.append(f"TP {deg.tp} -> {deg.tp // 2}: {arch.num_attention_heads} heads / {arch.num_kv_heads} KV heads.")
        deg.tp //= 2


def _fit_experts(job: Job, deg: _Degrees, notes: list[str]) -> None:
    """EP dividing the experts; no expert parallelism for a dense model."""
    arch = job.model
    if arch.is_moe:
        experts = arch.moe.num_experts
        if experts % deg.ep and deg.free("ep"):
            new_ep = gcd(deg.ep, experts)
            notes.append(f"EP {deg.ep} -> {new_ep}: EP must divide {experts} experts.")
            deg.ep = new_ep
    else:
        deg.ep = deg.ep if not deg.free("ep") else 1
        deg.etp = deg.etp if not deg.free("etp") else 1


def _fit_framework(job: Job, card: FrameworkCard, deg: _Degrees, notes: list[str]) -> None:
    """What the framework cannot run: MoE with pipelines, expert tensor parallelism its search does not open."""
    if job.model.is_moe and deg.pp > 1 and not card.limits.moe_with_pipeline and deg.free("pp"):
        notes.append(f"PP {deg.pp} -> 1: {card.display_name} forbids MoE with pp > 1.")
        deg.pp, deg.first, deg.last = 1, None, None
    if deg.etp > 1 and not card.search.etp and deg.free("etp"):
        notes.append(f"ETP -> 1: {card.display_name} {card.version} layouts keep experts whole (its card's search "
                     "opens no expert tensor parallelism).")
        deg.etp = 1


def _fit_world(law: str, world: int, deg: _Degrees, notes: list[str], dp: int | None) -> None:
    """Shrink the row's degrees until both grids divide the GPU count (into `dp` replicas where the request fixed
    it): PP first (it only adds a bubble), then CP, then EP, then TP, matching the order in which the tables add
    them; a fixed degree stays (where only fixed ones are left the job cannot hold them, and the search says so).
    One note for all the steps (each degree's first and last value), not one per halving."""
    was = {"PP": deg.pp, "CP": deg.cp, "EP": deg.ep, "ETP": deg.etp, "TP": deg.tp}
    while True:
        dense = deg.dense_size(law)
        if world % dense == 0 and dp in (None, world // dense) and mesh.expert_grid_fits(
                law, world, deg.tp, deg.pp, deg.cp, world // dense, deg.ep, deg.etp):
            break
        if dp is not None and world // dense > dp:
            break  # already too many replicas: shrinking makes more
        if deg.pp > 1 and deg.free("pp"):
            deg.pp, deg.first, deg.last = deg.pp // 2, None, None
        elif deg.cp > 1 and deg.free("cp"):
            deg.cp //= 2
        elif deg.ep > 1 and deg.free("ep"):
            deg.ep = gcd(deg.ep, world) if gcd(deg.ep, world) < deg.ep else deg.ep // 2
        elif deg.etp > 1 and deg.free("etp"):
            deg.etp //= 2
        elif deg.tp > 1 and deg.free("tp"):
            deg.tp = _largest_power_of_two_divisor(world, deg.tp) if world % deg.tp else deg.tp // 2
        else:
            break
    now = {"PP": deg.pp, "CP": deg.cp, "EP": deg.ep, "ETP": deg.etp, "TP": deg.tp}
    moved = [f"{name} {was[name]} -> {now[name]}" for name in was if was[name] != now[name]]
    if moved:
        gpus = "1 GPU does" if world == 1 else f"{world} GPUs do"  # the count as the row text writes it: no separators
        notes.append(f"{', '.join(moved)}: {gpus} not hold the row's layout.")


def _fit_layers(job: Job, deg: _Degrees, vpp: int, notes: list[str]) -> None:
    """Layers the pipeline does not divide: the uneven split the split check's fix and the search use, else fewer
    stages; on a framework that partitions the layers itself, no split (the row's first/last dropped)."""
    layers = job.model.num_layers
    if job.card.pipeline.partition != "told":  # it can be told no split: its own (schedule.own_stages)
        deg.first = deg.last = None
        if deg.pp > 1 and layers % deg.pp and deg.pp <= layers:
            base, extra = divmod(layers, deg.pp)
            notes.append(f"{layers} layers over PP {deg.pp}: {job.card.display_name} partitions them itself, "
                         f"{base + 1} on the first {extra} stages and {base} on the other {deg.pp - extra}.")
        return
    if not (deg.pp > 1 and deg.first is None and layers % deg.pp):
        return
    split = uneven_split(layers, deg.pp, vpp)
    if split is None and not deg.free("pp"):
        return  # the request's PP: the rules say why the layers do not split over it
    if split is None:
        new_pp = deg.pp
        while new_pp > 1 and layers % new_pp:
            new_pp //= 2
        notes.append(f"PP {deg.pp} -> {new_pp}: {layers} layers cannot be split over {deg.pp} stages.")
        deg.pp = new_pp
    else:
        deg.first, middle, deg.last = split
        notes.append(f"{layers} layers over PP {deg.pp}: first stage {deg.first}, last {deg.last}"
                     + (f", {middle} on each middle stage." if deg.pp > 2 else "."))


def suggest(job: Job, fixed: Mapping[str, object] | None = None) -> TableSuggestion:
    """The decision-table layout for this job, made buildable on its GPUs (see the module docstring); `fixed`: the
    request's fixed fields (search.space.Fixed.values), whose degrees replace the row's."""
    table, row_id, row_text, layout, source = _row_for(job)
    notes: list[str] = []
    given = {d: int(v) for d, v in (fixed or {}).items() if d in FIXABLE and isinstance(v, int)}
    deg = _Degrees(tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep, etp=layout.etp,
                   first=layout.first_stage_layers, last=layout.last_stage_layers, fixed=frozenset(given))
    vpp = given.get("vpp", layout.vpp)
    for name, value in given.items():
        if name in ("tp", "pp", "cp", "ep", "etp") and getattr(deg, name) != value:
            notes.append(f"{name.upper()} {getattr(deg, name)} -> {value}: the request fixes it.")
            setattr(deg, name, value)
            if name == "pp":
                deg.first = deg.last = None
    seq = _seq_row(job.seq_length)
    _fit_cp(job, deg, seq, notes)
    _fit_tp(job, deg, notes)
    _fit_experts(job, deg, notes)
    card = job.card
    law = card.world_size_law
    _fit_framework(job, card, deg, notes)
    _fit_world(law, job.num_gpus, deg, notes, given.get("dp"))
    _fit_layers(job, deg, vpp, notes)
    dp = max(1, job.num_gpus // deg.dense_size(law))
    defaults = card.defaults
    zero = layout.zero_stage if layout.zero_stage is not None else defaults.zero_stage
    plan = Plan(
        tp=deg.tp, pp=deg.pp, vpp=vpp if deg.pp > 1 else 1, cp=deg.cp, ep=deg.ep, etp=deg.etp, dp=dp,
        sequence_parallel=deg.tp > 1 and defaults.sequence_parallel_with_tp(job.model, deg.pp), zero_stage=zero,
        micro_batch_size=layout.micro_batch_size, recompute=layout.recompute,
        cp_comm_type=(seq.cp_comm_type or cp_comm_type_default(job.model, card.attention)) if deg.cp > 1 else "p2p",
        first_stage_layers=deg.first, last_stage_layers=deg.last,
    )
    return TableSuggestion(
        table=table, row_id=row_id, row=row_text, plan=plan, sequence_row=seq.id, adjustments=notes, source=source,
    )
