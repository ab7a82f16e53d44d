"""What the decision tables of cards/strategies.yaml suggest for a job, as a concrete layout.

The search (meshplan/search/decision.py) calls `suggest(job)` to say whether its ranked answer agrees with the
published rules of thumb. The tables give ranges and starting points; this module turns the row that
applies into a `Plan` the job can actually build (TP inside the NVLink domain and dividing the heads,
degrees that divide the GPU count, CP from the sequence length) and lists every adjustment it made,
so a reader can see where the job departs from the row.
"""

from __future__ import annotations

from math import gcd

from pydantic import BaseModel, ConfigDict, Field

from meshplan.arithmetic import mesh
from meshplan.arithmetic.schedule import uneven_split
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.models import count_components
from meshplan.knowledge.tables import Layout, SeqRow, strategies_card
from meshplan.schema.contract import Job, Plan


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


def suggest(job: Job) -> TableSuggestion:
    """The decision-table layout for this job, made buildable on its GPUs (see the module docstring)."""
    table, row_id, row_text, layout, source = _row_for(job)
    arch, notes = job.model, []
    tp, pp, cp, ep, etp = layout.tp, layout.pp, layout.cp, layout.ep, layout.etp
    first, last = layout.first_stage_layers, layout.last_stage_layers

    seq = _seq_row(job.seq_length)
    if seq.cp > cp:
        notes.append(f"CP {cp} -> {seq.cp}: sequence length {job.seq_length} ({seq.id}).")
        cp = seq.cp
    while cp > 1 and job.seq_length % (2 * cp):
        notes.append(f"CP {cp} -> {cp // 2}: seq_length must be divisible by 2*CP.")
        cp //= 2

    tp_cap = mesh.fast_domain(job.gpu, job.gpus_per_node)
    if tp > tp_cap:
        notes.append(f"TP {tp} -> {tp_cap}: TP stays inside the NVLink domain (topology row tp-in-nvlink).")
        tp = tp_cap
    while tp > 1 and not _tp_ok(tp, arch.num_attention_heads, arch.num_kv_heads):
        notes.append(f"TP {tp} -> {tp // 2}: {arch.num_attention_heads} heads / {arch.num_kv_heads} KV heads.")
        tp //= 2

    if arch.is_moe:
        experts = arch.moe.num_experts
        if experts % ep:
            new_ep = gcd(ep, experts)
            notes.append(f"EP {ep} -> {new_ep}: EP must divide {experts} experts.")
            ep = new_ep
    else:
        ep, etp = 1, 1

    card = framework_card(job.framework)
    law = card.world_size_law
    if arch.is_moe and pp > 1 and not card.limits.moe_with_pipeline:
        notes.append(f"PP {pp} -> 1: {card.display_name} forbids MoE with pp > 1.")
        pp, first, last = 1, None, None
    if etp > 1 and not card.search.etp:
        notes.append(f"ETP -> 1: {card.display_name} {card.version} layouts keep experts whole (its card's search "
                     "opens no expert tensor parallelism).")
        etp = 1

    world = job.num_gpus

    def dense_size() -> int:
        return mesh.replica_size(law, tp, pp, cp, ep)

    # Shrink the row's degrees until both grids divide the GPU count: PP first (it only adds a
    # bubble), then CP, then EP, then TP, matching the order in which the tables add them.
    while True:
        if world % dense_size() == 0 and mesh.expert_grid_fits(law, world, tp, pp, cp, world // dense_size(), ep,
                                                               etp):
            break
        if pp > 1:
            notes.append(f"PP {pp} -> {pp // 2}: {world} GPUs do not hold the row's layout.")
            pp, first, last = pp // 2, None, None
        elif cp > 1:
            notes.append(f"CP {cp} -> {cp // 2}: {world} GPUs do not hold the row's layout.")
            cp //= 2
        elif ep > 1:
            new_ep = gcd(ep, world) if gcd(ep, world) < ep else ep // 2
            notes.append(f"EP {ep} -> {new_ep}: {world} GPUs do not hold the row's layout.")
            ep = new_ep
        elif etp > 1:
            etp //= 2
        else:
            new_tp = _largest_power_of_two_divisor(world, tp) if world % tp else tp // 2
            notes.append(f"TP {tp} -> {new_tp}: {world} GPUs do not hold the row's layout.")
            tp = new_tp

    if pp > 1 and first is None and arch.num_layers % pp:
        split = uneven_split(arch.num_layers, pp, layout.vpp)  # the split check's fix and the search use
        if split is None:
            new_pp = pp
            while new_pp > 1 and arch.num_layers % new_pp:
                new_pp //= 2
            notes.append(f"PP {pp} -> {new_pp}: {arch.num_layers} layers cannot be split over {pp} stages.")
            pp = new_pp
        else:
            first, middle, last = split
            notes.append(f"{arch.num_layers} layers over PP {pp}: first stage {first}, last {last}"
                         + (f", {middle} on each middle stage." if pp > 2 else "."))

    dp = max(1, world // dense_size())
    defaults = framework_card(job.framework).defaults
    zero = layout.zero_stage if layout.zero_stage is not None else defaults.zero_stage
    plan = Plan(
        tp=tp, pp=pp, vpp=layout.vpp if pp > 1 else 1, cp=cp, ep=ep, etp=etp, dp=dp,
        sequence_parallel=tp > 1 and defaults.sequence_parallel_when_tp, zero_stage=zero,
        micro_batch_size=layout.micro_batch_size, recompute=layout.recompute,
        cp_comm_type=(seq.cp_comm_type or "p2p") if cp > 1 else "p2p",
        first_stage_layers=first, last_stage_layers=last,
    )
    return TableSuggestion(
        table=table, row_id=row_id, row=row_text, plan=plan, sequence_row=seq.id, adjustments=notes, source=source,
    )
