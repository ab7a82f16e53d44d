"""The pipeline stages' memory floors: the bytes the first rank needs at least for a layout, ZeRO stage, recompute
and micro-batch, and the model states the heaviest later rank holds at any of them (ranks_floor), from the memory
model's own terms, before any estimate (the search's memory floors, meshplan/search/plans.py;
tests/test_search_space.py checks them against estimate_memory)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.arithmetic import activations, mesh
from meshplan.arithmetic.activations import Layout as ActLayout
from meshplan.arithmetic.activations import (
    activation_mode,
    attention_saves,
    layer_activations,
    least_moe_bytes,
    shape_of,
)
from meshplan.arithmetic.lora import lora_engines
from meshplan.arithmetic.mamba import hybrid_layer_activations, least_kind_activations
from meshplan.arithmetic.memory_states import (
    Convention,
    StateTensor,
    accumulated_grad_bytes,
    activation_saves,
    built_vocab,
    experts_in_units,
    fp8_attention_saves,
    frozen_gathered_transient,
    gathered_transient,
    memory_card,
    mixer_rows,
    output_activations,
    replicas_at,
    state_bytes,
    state_classes,
    state_sums,
    swiglu_input_bytes,
    unfused_glu_bytes,
    unsharded_grad_bytes,
)
from meshplan.arithmetic.pipeline_timeline import V_ORDERS, schedule_order
from meshplan.arithmetic.schedule import Stages, in_flight, plan_stages, stages_for, v_placed
from meshplan.core.errors import MeshplanError
from meshplan.estimate.attention_time import op_sac_may_recompute_attention
from meshplan.estimate.memory import selective_modules
from meshplan.knowledge.adapter_knobs import shared_overlap_in_every_plan
from meshplan.knowledge.gdn_config import pipeline_unit
from meshplan.knowledge.model_counts import layer_params, per_architecture
from meshplan.schema.plan import Job, step_microbatches
from meshplan.search.space import DEFAULT_PLAN, Layout, state_preset


class _Prefix:
    """Prefix sums over the decoder layers of one architecture (cached per object), for stage-0 floors."""

    def __init__(self, arch) -> None:
        self.arch = arch
        self.sharded, self.replicated, self.experts, self.moe = [0], [0], [0], [0]
        # a hybrid's layers of each kind but MoE, in shape_of's kind order (_kind_counts)
        self.kinds = tuple(k for k in shape_of(arch).kinds if k != "E")
        self.kind = {k: [0] for k in self.kinds}
        for k, counts in self.kind.items():
            for i in range(arch.num_layers):
                counts.append(counts[-1] + (arch.layer_pattern[i] == k))
        for i in range(arch.num_layers):
            p = layer_params(arch, i)
            self.sharded.append(self.sharded[-1] + p["attention"] + p["dense_mlp"] + p["shared_experts"])
            self.replicated.append(self.replicated[-1] + p["norms"] + p["router"])
            self.experts.append(self.experts[-1] + p["routed_experts"])
            self.moe.append(self.moe[-1] + (1 if arch.is_moe_layer(i) else 0))


_prefix = per_architecture(_Prefix, limit=64)


def first_stage_spans(job: Job, lay: Layout, zero_stage: int) -> list[tuple[int, int]]:
    """The decoder layers the first pipeline rank holds, as non-empty [start, end) runs: its virtual chunks in the
    stages the estimate weighs (schedule.plan_stages: the framework's convention or the layout's virtual split, its
    interleaved order, a V placement), so an interleaved rank 0 holds chunks 0, pp, 2 pp, ..., not the first layers
    (Llama-4-Maverick's alternate dense and MoE: on PP4 VPP12 rank 0 holds dense layers only). Where no estimate
    takes the stages (the rules say why): the split's virtual stages 0, pp, 2 pp, ..., else none, which keeps a floor
    a floor."""
    return _first_rank_layers(job, lay, zero_stage, {})[0]


def _first_rank_layers(job: Job, lay: Layout, zero_stage: int,
                       memo: dict) -> tuple[list[tuple[int, int]], tuple | None]:
    """first_stage_spans, with the first rank's layers per virtual chunk in the estimate's order, each (layers, MoE
    layers), empty chunks kept (what the estimate's in-flight counts multiply: memory_stage.held_activations); None
    where no estimate takes the stages or the rank holds one chunk."""
    stages = _kept_stages(job, lay, zero_stage, memo)
    if stages is not None:
        moe = _prefix(job.model).moe
        chunks = tuple((len(c), moe[c[-1] + 1] - moe[c[0]]) if c else (0, 0) for c in stages.chunks[0])
        return [(chunk[0], chunk[-1] + 1) for chunk in stages.chunks[0] if chunk], chunks if len(chunks) > 1 else None
    if lay.split is not None:
        counts = lay.split.counts
        runs = [(sum(counts[:k]), sum(counts[:k + 1])) for k in range(0, len(counts), lay.pp)]
        return [(a, b) for a, b in runs if b > a], None
    try:
        n0 = stages_for(job.model, job.card, zero_stage, lay.tp, lay.pp, lay.vpp, lay.first, lay.last).counts[0]
    except MeshplanError:
        return [], None
    return ([(0, n0)] if n0 else []), None


def _kept_stages(job: Job, lay: Layout, zero_stage: int, memo: dict) -> Stages | None:
    """estimate_stages, kept in `memo` per (layout, ZeRO stage): a layout's first rank (_first_rank_layers), its
    ranks' kinds at every ZeRO stage (own_memory) and its later ranks (_rank_params) read the same stages
    (Llama-3.1-70B on 64 H100: 451 asks, 239 distinct)."""
    key = ("stages", lay, zero_stage)
    if key in memo:
        return memo[key]
    hit = memo[key] = estimate_stages(job, lay, zero_stage)
    return hit


def estimate_stages(job: Job, lay: Layout, zero_stage: int) -> Stages | None:
    """schedule.plan_stages of the layout's plans at this ZeRO stage (the decoder layers of each rank's virtual
    chunks, the output layer's rank), None where no estimate takes them (a pydantic error is a ValueError). Without
    a split, plan_stages' own steps (the convention's stages, placed in a V for a V order) with no plan built. A V
    order holds two chunks per rank: at another vpp (a request's fixed dualpipev) the rules refuse it (PP012, PP013)."""
    v_order = bool(lay.schedule) and lay.pp > 1 and schedule_order(lay.schedule, lay.vpp) in V_ORDERS
    if v_order and lay.vpp != 2:
        return None
    if lay.split is None:
        try:
            stages = stages_for(job.model, job.card, zero_stage, lay.tp, lay.pp, lay.vpp, lay.first, lay.last)
        except MeshplanError:
            return None
        return v_placed(stages, lay.pp) if v_order else stages
    plain = Layout(tp=lay.tp, pp=lay.pp, cp=1, ep=1, etp=1, dp=1, vpp=lay.vpp, first=lay.first, last=lay.last,
                   split=lay.split, schedule=lay.schedule)
    knobs = {"zero_stage": zero_stage, "recompute": "none", "micro_batch_size": 1}
    try:  # copied from the default plan where it can be (Layout.copied_plan: the same values), else validated
        return plan_stages(job, plain.copied_plan(DEFAULT_PLAN, knobs, False, False)
                           or plain.plan(**knobs, sequence_parallel=False, cp_comm_type="p2p"))  # type: ignore[arg-type]
    except (MeshplanError, ValueError):
        return None


def own_memory(job: Job, lay: Layout, zeros: tuple[int, ...], memo: dict) -> Layout:
    """The layout whose floors the search reads for `lay` (Layout.own_memory): its non-interleaved base only where,
    at every ZeRO stage of `zeros`, each rank holds layers of the same kinds (dense or MoE: all the floors and the
    estimate read of a layer) in the same order under both, and the same output layer and MTP ranks, so the base's
    first-rank floors are the layout's own to the last bit and its estimates under every rank's; else the layout
    itself. Llama-4-Maverick's alternating layers on PP4 VPP12: rank 0 holds dense layers only, where the base's
    rank 0 holds six of each. Kept in `memo` per layout and per what the stages read of it."""
    hit = memo.get(("own", lay))
    if hit is not None:
        return hit
    own = lay.own_memory()
    if own is not lay:
        key = ("own", lay.tp, lay.pp, lay.vpp, lay.first, lay.last, lay.schedule, zeros)
        same = memo.get(key)
        if same is None:
            same = memo[key] = all(_rank_kinds(job, lay, zero, memo) == _rank_kinds(job, own, zero, memo)
                                   for zero in zeros)
        own = own if same else lay
    memo[("own", lay)] = own
    return own


def _rank_kinds(job: Job, lay: Layout, zero_stage: int, memo: dict) -> tuple | None:
    """Per pipeline rank the kinds of its decoder layers in order (MoE or dense), with the output layer's and the MTP
    blocks' ranks, in the stages the estimate weighs; None where no estimate takes them."""
    stages = _kept_stages(job, lay, zero_stage, memo)
    if stages is None:
        return None
    arch = job.model
    if _prefix(arch).moe[-1] in (0, arch.num_layers):  # every layer of one kind: each rank's count says it
        return stages.head_rank, stages.mtp_at, stages.counts
    return (stages.head_rank, stages.mtp_at,
            tuple(tuple(arch.is_moe_layer(i) for i in stages.layers(rank)) for rank in range(lay.pp)))


def first_stage_floor(job: Job, lay: Layout, zero_stage: int, recompute: str, mbs: int, sp: bool,
                      preset: tuple[Convention, list[StateTensor]] | None = None, *, reserved: bool = True,
                      activation_offload: bool = False, memo: dict | None = None) -> float:
    """Bytes the first pipeline stage needs at least, after the memory model's own terms (cards/memory.yaml
    presets, activations.py per layer, 1F1B in-flight micro-batches): its layers' model states plus the
    embedding, min(m, pp) micro-batches of activations (interleaving only holds more; a named schedule's chunks each
    hold the estimate's count, fewer on a V order's last: _chunks_held), the last stage's
    logits when pp == 1, the FSDP gathered layers, the allocator reserve and the fixed overhead. The peak is at
    least this; terms that are hard to bound (fp8 copies, embedding activations) are left out so it stays a
    floor (tests/test_search_space.py checks it against estimate_memory). `preset`: state_preset's for the request's
    carried fields, else the framework's plain one. `reserved=False`: the floor of the figure that decides the fit with
    expandable segments (no allocator reserve). `activation_offload`: the plan offloads its saved activations, so
    none of them are counted (the estimate keeps a few layers on the GPU). `memo`: a dict the caller keeps for one job
    and preset per ZeRO stage (the search's), where the parts shared by many layouts are kept (the same arithmetic)."""
    return first_stage_floors(job, lay, zero_stage, (recompute,), mbs, sp, preset, reserved=reserved,
                              activation_offload=activation_offload, memo=memo)[0]


def first_stage_floors(job: Job, lay: Layout, zero_stage: int, recomputes: tuple[str, ...], mbs: int, sp: bool,
                       preset: tuple[Convention, list[StateTensor]] | None = None, *, reserved: bool = True,
                       activation_offload: bool = False, memo: dict | None = None) -> tuple[float, ...]:
    """first_stage_floor under each of `recomputes`, in one pass: what does not depend on the recompute (the model
    states, the in-flight count, the last stage's logits) is read once, and each figure is the same operations in the
    same order as first_stage_floor's, so the same float to the last bit."""
    return first_stage_floor_rows(job, lay, zero_stage, recomputes, (mbs,), sp, preset, reserved=reserved,
                                  activation_offload=activation_offload, memo=memo)[0]


def first_stage_floor_rows(job: Job, lay: Layout, zero_stage: int, recomputes: tuple[str, ...],
                           sizes: tuple[int, ...], sp: bool, preset: tuple[Convention, list[StateTensor]] | None = None,
                           *, reserved: bool = True, activation_offload: bool = False,
                           memo: dict | None = None) -> list[tuple[float, ...]]:
    """first_stage_floors at each micro-batch of `sizes`, in one pass (the search asks a layout's whole row at once,
    SearchPlans.floor_row): the layout's part, its spans and the activation memo's entries are read once per row, and
    each figure is the same operations in the same order as first_stage_floor's, so the same float to the last bit."""
    conv, tensors = preset or state_preset(job, zero_stage, {})  # a LoRA job's adapters left out: a floor
    memo = {} if memo is None else memo
    part = _part(job, lay, zero_stage, conv, tensors, memo)
    dp, gbs = lay.dp, job.global_batch_size
    rows = []
    for mbs, figures in zip(sizes, _row_figures(job, lay, conv, part, recomputes, sizes, sp,
                                                activation_offload, memo), strict=True):
        m = step_microbatches(gbs, mbs, dp)
        states = part.states[m == 1]
        if states is None:
            states = _part_states(job, lay, zero_stage, part, conv, tensors, m == 1, memo)
        sums = _floor_sums(part, states, figures, reserved)
        walk = _walk_floor(job, lay, zero_stage, part, conv, tensors, m, activation_offload, memo) if part.walk \
            else 0.0
        rows.append(tuple(max(figure, walk) for figure in sums) if walk else sums)
    return rows


def first_stage_needs(job: Job, lay: Layout, zero_stage: int, recomputes: tuple[str, ...], sizes: tuple[int, ...],
                      sp: bool, preset: tuple[Convention, list[StateTensor]], budget: float, *, reserved: bool = True,
                      activation_offload: bool = False, memo: dict) -> tuple[int, ...]:
    """Per micro-batch of `sizes`, the least index of `recomputes` whose first_stage_floor is within `budget`, or
    len(recomputes) where the last (heaviest) one's is over it (SearchPlans.needs_row's column): compared floor by
    floor from first_stage_floor_rows' own figures (the same floats). A row's floors read only the activations'
    figures (_row_figures, kept in `memo` per all they read, so one list object per distinct row: its id names it,
    as _activation_reads' names a convention), the two model-state figures and the part's gathered layers, reserve and
    fixed terms: layouts alike in those (a seed group's splits whose first ranks hold the same layers) have the same
    column, kept in `memo` per those and the budget (the memo is shared by a search at another budget)."""
    conv, tensors = preset
    part = memo.get((lay, zero_stage))  # (_part's entry)
    if part is None:
        part = _part(job, lay, zero_stage, conv, tensors, memo)
    figures = _row_figures(job, lay, conv, part, recomputes, sizes, sp, activation_offload, memo)
    dp, gbs = lay.dp, job.global_batch_size
    ones = memo.get(("one microbatch", gbs, dp, sizes))  # (_single_microbatch's entry)
    if ones is None:
        ones = _single_microbatch(gbs, dp, sizes, memo)
    states = [part.states[False], part.states[True]]
    if not (part.walk and conv.grads_set_to_none):  # one micro-batch's states are more's (_part_states)
        if states[False] is None:
            states[False] = _part_states(job, lay, zero_stage, part, conv, tensors, False, memo)
        states[True] = states[False]
    else:
        for one in (False, True):
            if states[one] is None and one in ones:
                states[one] = _part_states(job, lay, zero_stage, part, conv, tensors, one, memo)
    walks = tuple(_walk_floor(job, lay, zero_stage, part, conv, preset[1], step_microbatches(gbs, mbs, dp),
                              activation_offload, memo) for mbs in sizes) if part.walk else None
    key = ("needs", id(figures), states[0], states[1], part.gathered, part.reserve_fraction, part.fixed, reserved,
           budget, walks)
    hit = memo.get(key)
    if hit is None:
        # each floor only where compared, _floor_sum's operations in its order, inline
        gathered, fraction, (overhead, context) = part.gathered, part.reserve_fraction, part.fixed
        n_r, column, last = len(recomputes), [], len(recomputes) - 1
        for j, (one, row) in enumerate(zip(ones, figures, strict=True)):
            held = states[one]
            if walks is not None and walks[j] > budget:  # the FSDP walk's floor alone is over: every recompute is
                column.append(n_r)
                continue
            transient = row[last] if gathered is None else row[last] + gathered  # the heaviest first
            if held + transient + (fraction * transient if reserved else 0.0) + overhead + context > budget:
                column.append(n_r)
                continue
            i = 0
            while i < last:  # it stops at the heaviest
                transient = row[i] if gathered is None else row[i] + gathered
                if held + transient + (fraction * transient if reserved else 0.0) + overhead + context <= budget:
                    break
                i += 1
            column.append(i)
        hit = memo[key] = tuple(column)
    return hit


def _single_microbatch(gbs: int, dp: int, sizes: tuple[int, ...], memo: dict) -> tuple[bool, ...]:
    """Per micro-batch of `sizes`, whether a data-parallel rank of `dp` runs one micro-batch a step (step_microbatches
    1: the model states a single micro-batch holds, _FloorPart.states[True]); kept in `memo` per (global batch, dp,
    sizes), all it reads: first_stage_needs asks it of every layout, a few dp and size tuples in all."""
    key = ("one microbatch", gbs, dp, sizes)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = tuple([step_microbatches(gbs, mbs, dp) == 1 for mbs in sizes])
    return hit


def _row_figures(job: Job, lay: Layout, conv: Convention, part: _FloorPart,
                 recomputes: tuple[str, ...], sizes: tuple[int, ...], sp: bool, activation_offload: bool,
                 memo: dict) -> list[list[float]]:
    """first_stage_floor's activations at each micro-batch of `sizes`, a figure per recompute of `recomputes`: what a
    layout's own layers add (saved activations of min(m, pp) micro-batches, or each chunk's count where a named
    schedule's are not that (_chunks_held), the layer full recompute rebuilds, the last stage's logits when pp == 1).
    They read of the layout only its degrees and its first rank's layer counts (n0, MoE n_moe; per chunk with those
    counts) and of the part only those and walk and the padded vocabulary, so they are kept in `memo` per those: the
    layouts of a seed group whose first ranks hold as many layers of each kind share them (the same floats). Of the
    ZeRO stage they read only its convention's activation switches (_activation_reads: the stages of one switches
    share them) and, with one pipeline stage, the convention's logits (output_activations)."""
    pp, tp, dp, gbs = lay.pp, lay.tp, lay.dp, job.global_batch_size
    n0, n_moe = part.n0, part.n_moe
    fewer = None if part.chunks is None or activation_offload else _layers_held(job, lay, part.chunks, sizes, memo)
    reads, switches, own = _activation_reads(job, conv, memo)
    key = ("figures", switches, own if pp == 1 else 0, tp, pp, lay.cp, lay.etp, dp, sp, part.vocab, part.walk, n0,
           n_moe, part.kinds, activation_offload, recomputes, sizes, fewer)
    hit = memo.get(key)
    if hit is not None:
        return hit
    n_dense = n0 - n_moe
    full_adds = bool(n0) and not part.walk
    by_tokens = _activation_sums(switches, tp, sp, lay.etp, recomputes, memo)
    out = []
    for at, mbs in enumerate(sizes):
        m = step_microbatches(gbs, mbs, dp)
        tokens = activations.least_rank_tokens(job.seq_length, mbs, lay.cp)  # padding not counted
        layers_held = None if fewer is None else fewer[at]
        held = 1 if pp == 1 else min(m, pp)
        logits = output_activations(conv, tokens, part.vocab, tp, job.model.hidden_size, tp if sp else 1, mbs) \
            if pp == 1 else 0.0
        all_sums = by_tokens.get(tokens)
        if all_sums is None:
            all_sums = by_tokens[tokens] = [_recompute_sums(job, reads, switches, tokens, tp, sp, lay.etp, recompute,
                                                            memo) for recompute in recomputes]
        figures = []
        for recompute, sums in zip(recomputes, all_sums, strict=True):
            per_mb = n_moe * sums[0]
            if part.kinds:  # a hybrid's layers of each kind at their own bytes, where the dense least took them all
                per_mb += sum(count * each for count, each in zip(part.kinds, _kind_sums(
                    job, reads, switches, tokens, tp, sp, lay.etp, recompute, memo), strict=True))
            else:
                per_mb += n_dense * sums[1]
            acts = 0.0 if activation_offload else held * per_mb if layers_held is None else \
                layers_held[0] * sums[0] + layers_held[1] * sums[1]
            if full_adds and recompute == "full":  # the one layer full recompute rebuilds, the larger kind held
                acts += (max(sums[2], sums[3]) if n_dense else sums[2]) if n_moe else sums[3]
            if pp == 1:
                acts += logits
            figures.append(acts)
        out.append(figures)
    memo[key] = out
    return out


def least_layer_bytes(job: Job, conv: Convention, tokens: int, tp: int, sp: bool, etp: int, recompute: str, *,
                      activation_offload: bool = False, memo: dict, every_layer: bool = False) -> float:
    """The least one decoder layer adds to any rank that holds it, for one micro-batch of `tokens` per rank: its saved
    activations under `recompute` (none where the plan offloads them) and, under full recompute where the peak is not
    the FSDP walk's, the layer rebuilt in the backward: _row_figures' own terms with one layer and one micro-batch
    held, the lesser over the model's layer kinds (a rank may hold layers of one kind only); `every_layer`: on a rank
    that holds every decoder layer (one pipeline stage), each layer's saved rows and the least rebuilt one. The
    count-free floor (meshplan/search/count_free.py) reads it: every rank that holds a layer holds at least this."""
    reads, switches, _ = _activation_reads(job, conv, memo)
    sums = _recompute_sums(job, reads, switches, tokens, tp, sp, etp, recompute, memo)
    pre = _prefix(job.model)
    n_moe = pre.moe[-1]
    rebuilt = recompute == "full" and conv.step_peak != "backward_walk"
    kinds = [(0, 2, n_moe)] if n_moe else []
    kinds += [(1, 3, job.model.num_layers - n_moe)] if n_moe < job.model.num_layers else []
    if every_layer:  # one stage holds them all (`every_layer`): each kind's saved rows, and the least rebuilt layer
        return sum(0.0 if activation_offload else count * sums[saved] for saved, _, count in kinds) \
            + (min(sums[whole] for _, whole, _ in kinds) if rebuilt else 0.0)
    return min((0.0 if activation_offload else sums[saved]) + (sums[whole] if rebuilt else 0.0)
               for saved, whole, _ in kinds)


def _chunks_held(job: Job, lay: Layout, sizes: tuple[int, ...], memo: dict) -> tuple | None:
    """Per micro-batch of `sizes`, the micro-batches the first rank holds per virtual chunk at its peak where they
    are not min(m, pp) on each (a V order's last chunk holds fewer: ZBV one, DualPipeV), else None for that size;
    None where they are at every size. A named schedule's counts are the estimate's (schedule.in_flight, as
    memory_stage.stage_held reads them: the plan's schedule, the framework's group, the step's micro-batches, the
    search's plans running one schedule per step); the framework's default is capped at min(m, pp) (the estimate
    may run combined 1F1B there, never holding fewer; pipeline_counts' orders all hold at least that much but the V
    ones). Where the order cannot run them (DualPipeV under 2 pp micro-batches) no estimate does either. Kept in
    `memo` per the degrees and the schedule it reads."""
    key = ("held", lay.pp, lay.vpp, lay.dp, lay.schedule, sizes)
    if key in memo:
        return memo[key]
    group, out = job.card.pipeline.group, []
    for mbs in sizes:
        m = step_microbatches(job.global_batch_size, mbs, lay.dp)
        cap = min(m, lay.pp)
        try:
            held = in_flight(0, lay.pp, lay.vpp, m, group, lay.schedule or None)
        except (MeshplanError, ValueError):
            held = (cap,)
        if not lay.schedule:
            held = tuple(min(cap, count) for count in held)
        out.append(None if all(count == cap for count in held) else held)
    hit = memo[key] = tuple(out) if any(out) else None
    return hit


def _layers_held(job: Job, lay: Layout, chunks: tuple, sizes: tuple[int, ...], memo: dict) -> tuple | None:
    """Per micro-batch of `sizes`, _held_layers of the first rank's `chunks` where _chunks_held has counts, else None;
    None where it has none. Kept in `memo` per the chunks and what _chunks_held reads."""
    counts = _chunks_held(job, lay, sizes, memo)
    if counts is None:
        return None
    key = ("layers held", lay.pp, lay.vpp, lay.dp, lay.schedule, sizes, chunks)
    if key in memo:
        return memo[key]
    hit = memo[key] = tuple(None if held is None else _held_layers(chunks, held) for held in counts)
    return hit


def _held_layers(chunks: tuple, held: tuple[int, ...]) -> tuple[int, int]:
    """Where the first rank's chunks hold unlike counts (_chunks_held): its MoE and its dense layers each times the
    micro-batches its chunk holds (`chunks`: _first_rank_layers'), summed; times one micro-batch's bytes of each kind
    they are the saved activations the estimate sums chunk by chunk (memory_stage.held_activations)."""
    moe = dense = 0
    for (layers, moe_layers), count in zip(chunks, held, strict=True):
        moe += count * moe_layers
        dense += count * (layers - moe_layers)
    return moe, dense


def _activation_reads(job: Job, conv: Convention, memo: dict) -> tuple[tuple, int, int]:
    """What the activations read of a ZeRO stage's convention (_layer_activation_sums' switches: ActLayout's), a
    number naming those switches in `memo` (the same for the stages whose conventions have the same switches: their
    figures are the same floats, so they are kept once) and a number naming the convention itself (what the logits
    read of it, output_activations); kept per convention object (itself kept, so its id names no other)."""
    key = ("acts conv", id(conv))
    hit = memo.get(key)
    if hit is None or hit[0] is not conv:
        reads = (conv.flash_attention, conv.qkv_projections == "fused", conv.dropout, conv.swiglu_unfused,
                 least_moe_bytes(conv, job.model, job.moe_fake_balanced_gate), attention_saves(conv),
                 activation_saves(conv, job.model.activation))
        numbers, convs = memo.setdefault("acts numbers", {}), memo.setdefault("acts conventions", [])
        convs.append(conv)
        hit = memo[key] = (conv, reads, numbers.setdefault(reads, len(numbers)), len(convs))
    return hit[1], hit[2], hit[3]


def _activation_sums(switches: int, tp: int, sp: bool, etp: int, recomputes: tuple[str, ...],
                     memo: dict) -> dict[int, list[tuple[float, float, float, float]]]:
    """Per tokens per rank, _layer_activation_sums under each of `recomputes` (filled as asked), kept in `memo` per
    the convention's activation switches (`switches`: their number, _activation_reads)."""
    key = ("acts", switches, tp, sp, etp, recomputes)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = {}
    return hit


def _recompute_sums(job: Job, reads: tuple, switches: int, tokens: int, tp: int, sp: bool, etp: int,
                    recompute: str, memo: dict) -> tuple[float, float, float, float]:
    """_layer_activation_sums under one recompute, kept in `memo` per the switches' number."""
    key = ("acts", switches, tokens, tp, sp, etp, recompute)
    sums = memo.get(key)
    if sums is None:
        sums = memo[key] = _layer_activation_sums(job, reads, tokens, tp, sp, etp, recompute)
    return sums


def _kind_sums(job: Job, reads: tuple, switches: int, tokens: int, tp: int, sp: bool, etp: int, recompute: str,
               memo: dict) -> tuple[float, ...]:
    """A hybrid's one layer of each kind but MoE (_Prefix.kinds' order) under `recompute`, one micro-batch of `tokens`
    per rank, as _layer_activation_sums takes its dense least over them: a first rank's floor counts each of its
    layers at its own kind's bytes (Qwen3-Next's 36 Gated DeltaNet mixers saved 474 MiB each without recompute at
    TP2, its 12 attention ones 196 MiB; the floor took 196 MiB for all 48), kept in `memo`."""
    key = ("kinds", switches, tokens, tp, sp, etp, recompute)
    hit = memo.get(key)
    if hit is None:
        flash, qkv_fused, dropout, swiglu_unfused, moe, attn, act_saves = reads
        act = ActLayout(tokens=tokens, seq_kv=job.seq_length, tp=tp, sp=sp, etp=etp, flash=flash,
                        qkv_fused=qkv_fused, dropout=dropout, swiglu_unfused=swiglu_unfused,
                        fp8=job.precision == "fp8", moe=moe, attn=attn, act=act_saves,
                        attention_recomputed=flash and op_sac_may_recompute_attention(job),
                        act_input_bytes=swiglu_input_bytes(job), unfused_glu=unfused_glu_bytes(job),
                        fp8_attention=fp8_attention_saves(job, None),
                        shared_expert_overlap=shared_overlap_in_every_plan(job))._replace(**mixer_rows(job))
        shape, modules = shape_of(job.model), selective_modules(DEFAULT_PLAN)
        inside = recompute == "full" and pipeline_unit(job.model) > 1  # memory.checkpoint_group: the mixer's input
        hit = memo[key] = tuple(0.0 if inside and kind == "-" else sum(hybrid_layer_activations(
            shape, act, kind, recompute, modules).values()) for kind in _prefix(job.model).kinds)
    return hit


def _floor_sums(part: _FloorPart, states: float, figures: list[float], reserved: bool) -> tuple[float, ...]:
    """First-stage floors from their model states and each of their activations' `figures`: the FSDP gathered layers
    with the activations (the transient part), the allocator reserve on that, the fixed overheads; one sum for
    first_stage_floors and layout_floor, so the latter (no activations, the lesser states) stays under the former to
    the last bit."""
    return tuple(_floor_sum(part, states, acts, reserved) for acts in figures)


def _floor_sum(part: _FloorPart, states: float, acts: float, reserved: bool) -> float:
    """One floor of _floor_sums (first_stage_needs has its operations inline)."""
    transient = acts if part.gathered is None else acts + part.gathered  # FSDP / ZeRO-3 gathers whole layers
    # the allocator reserve decides the fit only without expandable segments (memory.fit_figure)
    reserve = part.reserve_fraction * transient if reserved else 0.0
    overhead, context = part.fixed
    return states + transient + reserve + overhead + context


def layout_floor(job: Job, lay: Layout, zero_stage: int, preset: tuple[Convention, list[StateTensor]] | None = None,
                 *, reserved: bool = True, memo: dict | None = None) -> float:
    """Bytes the first pipeline stage needs at least at EVERY micro-batch size and recompute: first_stage_floor's
    sum with no activations (its activation terms are sums and products of non-negative bytes and counts: the
    layers' saved activations, the recomputed layer, the logits) and the lesser of its two model-state figures (one
    micro-batch per step or more); the gathered layers, the reserve on them and the fixed overheads are the same
    terms. Each of first_stage_floor's figures is then at least this one, to the last bit: the same operations in the
    same order on arguments at least as large, and rounding to nearest never reverses an order. So a layout and ZeRO
    stage whose layout_floor is over a budget have every micro-batch and recompute over it, with no floor of each
    (SearchPlans.stage_over). Arguments as first_stage_floor's; kept in `memo` per (layout, ZeRO stage)."""
    conv, tensors = preset or state_preset(job, zero_stage, {})
    return _kept_layout_floor(job, lay, zero_stage, conv, tensors, reserved, {} if memo is None else memo)


def layout_floors(job: Job, lays: list[Layout], zero_stage: int,
                  preset: tuple[Convention, list[StateTensor]] | None = None, *, reserved: bool = True,
                  memo: dict | None = None) -> list[float]:
    """layout_floor of each of `lays`, layouts of one degrees tuple (tp, pp, cp, ep, etp, dp: a seed group's, which
    differ only in their split, first/last sizes, vpp and schedule), in one pass: what reads only the degrees (the
    memory card, the padded vocabulary, the expert data-parallel size: _Degrees) is read once, and each figure is
    layout_floor's own sum of the same terms, so the same float to the last bit, kept in `memo` as layout_floor keeps
    it (so each is a floor for the same reason: see layout_floor)."""
    conv, tensors = preset or state_preset(job, zero_stage, {})
    memo = {} if memo is None else memo
    degrees = _degrees(job, lays[0], conv, memo) if lays else None
    return [_kept_layout_floor(job, lay, zero_stage, conv, tensors, reserved, memo, degrees) for lay in lays]


def _kept_layout_floor(job: Job, lay: Layout, zero_stage: int, conv: Convention, tensors: list[StateTensor],
                       reserved: bool, memo: dict, degrees: _Degrees | None = None) -> float:
    """layout_floor's figure, kept in `memo` per (layout, ZeRO stage); `degrees`: its _Degrees where the caller has
    them (layout_floors)."""
    key = ("layout", lay, zero_stage)
    hit = memo.get(key)
    if hit is None:
        part = memo.get((lay, zero_stage))  # (_part's entry)
        if part is None:
            part = _part(job, lay, zero_stage, conv, tensors, memo, degrees)
        hit = memo[key] = _layout_sum(job, lay, zero_stage, part, conv, tensors, reserved, memo, degrees)
    return hit


def _layout_sum(job: Job, lay: Layout, zero_stage: int, part: _FloorPart, conv: Convention,
                tensors: list[StateTensor], reserved: bool, memo: dict, degrees: _Degrees | None = None) -> float:
    """layout_floor's figure from the layout's part: the lesser model states, no activations."""
    states = _part_states(job, lay, zero_stage, part, conv, tensors, False, memo, degrees)
    if part.walk and conv.grads_set_to_none:  # else one micro-batch's states are the same figure
        states = min(states, _part_states(job, lay, zero_stage, part, conv, tensors, True, memo, degrees))
    # the FSDP walk's floor at one micro-batch per step, the least of its figures (no accumulated gradients)
    plain = _floor_sum(part, states, 0.0, reserved)  # (_floor_sums' of [0.0])
    return max(plain, _walk_floor(job, lay, zero_stage, part, conv, tensors, 1, False, memo, degrees)) if part.walk \
        else plain


def _walk_floor(job: Job, lay: Layout, zero_stage: int, part: _FloorPart, conv: Convention,
                tensors: list[StateTensor], m: int, activation_offload: bool, memo: dict,
                degrees: _Degrees | None = None) -> float:
    """A floor of the FSDP2 backward walk's peak (estimate/fsdp_walk.fsdp_backward_moments, where the estimate walks:
    memory_stage.walks) on a single stage, 0 elsewhere. The walk has a moment at the end of each decoder layer's
    backward ("gradients") holding that unit gathered (conv.unsharded_param_bytes) beside its unsharded gradients
    (memory_states.unsharded_grad_bytes), with the model states less the gradients not allocated yet (the lesser
    states figure, _part_states' one micro-batch), the activations (none counted) and the fixed overheads; the
    largest unit's moment is taken. With m micro-batches where the units hold their unsharded gradients between them
    (memory_states.accumulated_grad_bytes, the least over the plan's defer_fsdp_grad_sync and grad_reduce_in_fp32),
    a middle micro-batch (m >= 3) holds every unit's at every moment, and of two (fsdp_walk.accumulated_moments) the
    first holds those backward has passed and the last those it has not reduced, at least half of them at either
    copy of a moment: the decoder layers' sum, whole or halved, is added. The units are the floor's _layer_units
    (the estimate's stage_units split alike), the embedding's and output layer's left out, and no allocator reserve:
    every term is one the walk counts at that moment, so its peak, and the estimate's fit figure, are at least this.
    Kept in `memo` per layout, ZeRO stage and m's class (1, 2, more)."""
    if (not part.walk or lay.pp != 1 or activation_offload or job.lora is not None or not part.n0
            or not conv.gathered_layers or not any(t.shard == "dp" and t.tensor_class == "weights" for t in tensors)):
        return 0.0
    cls = min(m, 3)
    key = ("walk floor", lay, zero_stage, cls)
    hit = memo.get(key)
    if hit is None:
        layers = _layer_units(job, lay.tp, _unit_experts_split(job, lay, memo), memo)
        units = [p for a, b in part.spans for p in layers[a:b]]
        unit = (conv.unsharded_param_bytes + unsharded_grad_bytes(conv)) * max(units)
        held = 0.0
        if cls > 1:
            held = min(accumulated_grad_bytes(job.card, m, True, 1, defer, False, fp32)
                       for defer in (None, True, False) for fp32 in (None, True, False)) * sum(units)
            held = held if cls > 2 else held / 2
        states = _part_states(job, lay, zero_stage, part, conv, tensors, True, memo, degrees)
        overhead, context = part.fixed
        hit = memo[key] = states + unit + held + overhead + context
    return hit


def ranks_floor(job: Job, lay: Layout, zero_stage: int, preset: tuple[Convention, list[StateTensor]] | None = None,
                *, memo: dict | None = None) -> float:
    """Bytes the most loaded pipeline rank after the first needs at least at EVERY micro-batch size and recompute:
    the model states of the decoder layers it holds (schedule.plan_stages, the stages the estimate weighs: its virtual
    chunks, a V placement) sharded as first_stage_floor shards the first rank's, and the fixed overheads; the output
    layer, the MTP blocks, activations, gathered layers and the reserve are left out, so it stays a floor of that
    rank's fit figure (tests/test_search_space.py checks it against estimate_memory). layout_floor weighs the first
    rank only, which holds fewer layers where the first stage is shortened for the embedding: Kimi-K2 on PP16 splits
    3 + 14 x 4 + 2, and a middle rank's four MoE layers hold a third more expert states than the first rank's three.
    0 (no floor) with one stage, or where no estimate takes the layout's stages (the rules say why). Kept in `memo`
    per (layout, ZeRO stage)."""
    if lay.pp == 1:
        return 0.0
    conv, tensors = preset or state_preset(job, zero_stage, {})
    memo = {} if memo is None else memo
    key = ("ranks", lay, zero_stage)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _ranks_sum(job, lay, zero_stage, conv, tensors, memo)
    return hit


def _ranks_sum(job: Job, lay: Layout, zero_stage: int, conv: Convention, tensors: list[StateTensor],
               memo: dict) -> float:
    """ranks_floor's figure: the heaviest later rank's states (per its parameters of each kind, _rank_params, at the
    degrees' bytes per parameter, _rank_rates) and the memory card's fixed overhead and CUDA context."""
    params = _rank_params(job, lay, zero_stage, conv.pipeline_partition, memo)
    if not params:
        return 0.0
    dense_rate, expert_rate, fixed = _rank_rates(job, lay, zero_stage, conv, tensors, memo)
    tp, experts_split = lay.tp, lay.ep * lay.etp
    return max([dense_rate * (sharded / tp + replicated) + expert_rate * (routed / experts_split)
                for sharded, replicated, routed in params]) + fixed


def _rank_rates(job: Job, lay: Layout, zero_stage: int, conv: Convention, tensors: list[StateTensor],
                memo: dict) -> tuple[float, float, float]:
    """Per degrees and ZeRO stage (kept in `memo`): the state bytes per dense parameter of a rank (split tp ways:
    sharded over dp x cp as first_stage_floor shards them) and per expert parameter (split ep x etp ways: over the
    expert data-parallel group), without the gradients where the FSDP walk's peak may come before them (layout_floor's
    lesser states), and the fixed overheads (the memory card's overhead and CUDA context)."""
    key = ("rank_rates", zero_stage, lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)
    hit = memo.get(key)
    if hit is None:
        no_grads = conv.step_peak == "backward_walk" and conv.grads_set_to_none
        kept = [t for t in tensors if not (no_grads and t.tensor_class == "gradients")]
        card = _card(memo)
        replicas = replicas_at(job, zero_stage, lay.dp)  # each replica shards the states over its own ranks
        hit = memo[key] = (sum(state_bytes(kept, 1.0, lay.dp * lay.cp // replicas).values()),
                           sum(state_bytes(kept, 1.0, _expert_dp(job, lay, memo) / replicas).values()),
                           card.fixed_overhead_bytes + card.cuda_context_bytes)
    return hit


def _rank_params(job: Job, lay: Layout, zero_stage: int, partition: str,
                 memo: dict) -> frozenset[tuple[int, int, int]]:
    """The parameters of each kind (_span_params' split) of the decoder layers each pipeline rank after the first
    holds, as a set (ranks holding alike layers count once); kept in `memo` per what the stages read of the layout
    and the ZeRO stage's convention (its pipeline `partition`, the same for most stages). Empty where no estimate
    takes the stages."""
    key = ("rank_params", partition, lay.tp, lay.pp, lay.vpp, lay.first, lay.last, lay.split, lay.schedule)
    hit = memo.get(key)
    if hit is None:
        stages = _kept_stages(job, lay, zero_stage, memo)
        # each virtual chunk is a run of consecutive layers (schedule.stages_from_counts): a span of _span_params
        hit = memo[key] = frozenset() if stages is None else frozenset(
            _span_params(job.model, [(chunk[0], chunk[-1] + 1) for chunk in stages.chunks[rank] if chunk])
            for rank in range(1, lay.pp))
    return hit


@dataclass
class _Degrees:
    """What the floors read of a layout's degrees alone (the same for a seed group's layouts)."""

    card: object  # the memory card
    pre: _Prefix
    vocab: int  # padded
    expert_dp: float


def _degrees(job: Job, lay: Layout, conv: Convention, memo: dict) -> _Degrees:
    """The _Degrees of a layout: the same calls as _floor_part's and _first_stage_states' own."""
    return _Degrees(_card(memo), _prefix(job.model),
                    built_vocab(job.model.vocab_size, conv, lay.tp), _expert_dp(job, lay, memo))


def _padded(job: Job, conv: Convention, tp: int, memo: dict) -> int:
    """memory_states.built_vocab of the job's vocabulary under the convention, in `memo` per (multiple, tp)."""
    key = ("vocab", conv.vocab_pad_multiple, tp)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = built_vocab(job.model.vocab_size, conv, tp)
    return hit


def _card(memo: dict):
    """The memory card, kept in `memo`."""
    return memo["card"] if "card" in memo else memo.setdefault("card", memory_card())


def _expert_dp(job: Job, lay: Layout, memo: dict | None = None) -> float:
    """The layout's expert data-parallel size (mesh.expert_dp of its world under the framework's law), kept in `memo`
    (where given) per the degrees it reads."""
    key = ("expert dp", lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp)
    hit = None if memo is None else memo.get(key)
    if hit is None:
        law = job.card.world_size_law
        hit = mesh.expert_dp(mesh.replica_size(law, lay.tp, lay.pp, lay.cp, lay.ep) * lay.dp, lay, law)
        if memo is not None:
            memo[key] = hit
    return hit


def _part(job: Job, lay: Layout, zero_stage: int, conv: Convention, tensors: list[StateTensor],
          memo: dict, degrees: _Degrees | None = None) -> _FloorPart:
    """The layout's _FloorPart at this ZeRO stage, kept in `memo`."""
    part = memo.get((lay, zero_stage))
    if part is None:
        part = memo[(lay, zero_stage)] = _floor_part(job, lay, zero_stage, conv, tensors, memo, degrees)
    return part


def _part_states(job: Job, lay: Layout, zero_stage: int, part: _FloorPart, conv: Convention,
                 tensors: list[StateTensor], one: bool, memo: dict, degrees: _Degrees | None = None) -> float:
    """first_stage_floor's model states with one micro-batch per step (`one`) or more, kept in `part` and shared in
    `memo` by the layouts with these degrees whose first ranks hold as many parameters of each kind (_span_params:
    the figure reads nothing else of the spans)."""
    if part.states[one] is not None:
        return part.states[one]  # type: ignore[return-value]
    if one and not (part.walk and conv.grads_set_to_none):  # the same arguments as more micro-batches': one figure
        states = part.states[True] = _part_states(job, lay, zero_stage, part, conv, tensors, False, memo, degrees)
        return states
    params = part.params
    key = ("states", zero_stage, params, lay.tp, lay.pp, lay.cp, lay.ep, lay.etp, lay.dp, one)
    states = part.states[one] = memo[key] if key in memo else memo.setdefault(key, _first_stage_states(
        job, lay, params, tensors, part.vocab, part.walk and conv.grads_set_to_none and one,
        _expert_dp(job, lay, memo) if degrees is None else degrees.expert_dp, memo,
        replicas_at(job, zero_stage, lay.dp)))  # each replica shards the states over its own ranks
    return states


@dataclass
class _FloorPart:
    """What first_stage_floor reads of one layout at one ZeRO stage whatever the micro-batch."""

    spans: tuple[tuple[int, int], ...]  # the first rank's layers, with their count n0 and MoE layers n_moe
    n0: int
    n_moe: int
    params: tuple[int, int, int]  # its parameters of each kind (_span_params)
    chunks: tuple | None  # its layers and MoE layers per virtual chunk (_first_rank_layers; None: one chunk)
    kinds: tuple[int, ...]  # a hybrid's: its layers of each kind but MoE (_Prefix.kinds' order); () otherwise
    vocab: int  # padded
    walk: bool  # the peak is the FSDP backward walk's
    states: list[float | None]  # the model states with more than one micro-batch and with one (None until asked)
    gathered: float | None  # the FSDP gathered layers' bytes (None: none)
    reserve_fraction: float
    fixed: tuple[float, float]  # the memory card's fixed overhead and CUDA context, each its own term


def _floor_part(job: Job, lay: Layout, zero_stage: int, conv: Convention, tensors: list[StateTensor],
                memo: dict, degrees: _Degrees | None = None) -> _FloorPart:
    """first_stage_floor's part of a layout at a ZeRO stage; `degrees`: its _Degrees where the caller has them
    (layout_floors). All but its states read of the layout only its TP, ep x etp, pipeline shape and schedule: kept in
    `memo` per those, so layouts alike in them (half those DeepSeek-V3 on 2,048 H100 asks) share them."""
    key = ("part", zero_stage, lay.tp, lay.ep * lay.etp, lay.pp, lay.vpp, lay.first, lay.last,
           lay.split and lay.split.counts, lay.schedule)
    shared = memo.get(key)
    if shared is None:
        card, pre, vocab = (_card(memo), _prefix(job.model), _padded(job, conv, lay.tp, memo)) if degrees is None \
            else (degrees.card, degrees.pre, degrees.vocab)
        spans_key = ("spans", *key[1:3], *key[4:])  # (what _first_rank_layers reads: not the expert split)
        hit = memo.get(spans_key)
        if hit is None:
            spans, chunks = _first_rank_layers(job, lay, zero_stage, memo)
            hit = memo[spans_key] = (tuple(spans), chunks)
        spans, chunks = hit
        n0 = sum(b - a for a, b in spans)
        walk = conv.step_peak == "backward_walk"  # memory.fsdp_step_peak: at least the loss moment, grads maybe absent
        gathered = None
        if conv.gathered_layers and n0 and not walk and any(t.shard == "dp" and t.tensor_class == "weights"
                                                            for t in tensors):
            gathered = _first_rank_gathered(job, lay, zero_stage, conv, spans, vocab, memo)
        shared = memo[key] = (spans, n0, sum(pre.moe[b] - pre.moe[a] for a, b in spans),
                              _span_params(job.model, spans), chunks,
                              tuple(sum(pre.kind[k][b] - pre.kind[k][a] for a, b in spans) for k in pre.kinds),
                              vocab, walk, gathered,
                              getattr(card, "allocator_reserve_fraction", 0.0),
                              (card.fixed_overhead_bytes, card.cuda_context_bytes))
    spans, n0, n_moe, params, chunks, kinds, vocab, walk, gathered, reserve, fixed = shared
    return _FloorPart(spans, n0, n_moe, params, chunks, kinds, vocab, walk, [None, None], gathered, reserve, fixed)


def _first_rank_gathered(job: Job, lay: Layout, zero_stage: int, conv: Convention, spans: tuple[tuple[int, int], ...],
                         vocab: int, memo: dict) -> float:
    """The FSDP/ZeRO-3 gathered units of the first rank at its worst unit's backward, as the estimate works them out
    (memory_stage.gathered_units: memory_states.gathered_transient, LoRA's frozen_gathered_transient, over the units
    in forward order, each unit's own parameters plus the prefetched one before it) over a prefix of the estimate's
    units: the embedding and the first rank's layers of `spans` in order (the rank's chunks, chained), less the
    output layer of a single stage; the embedding's learned positions and the byte the estimate's int() drops left
    out, so it stays under the estimate's figure. Kept in `memo` per what it reads (the spans, TP, EP x ETP, the
    padded vocabulary and the ZeRO stage's convention)."""
    split = _unit_experts_split(job, lay, memo)
    key = ("gathered", zero_stage, lay.tp, split, vocab, spans)
    hit = memo.get(key)
    if hit is None:
        units = [float(int(vocab * job.model.hidden_size / lay.tp))]
        layers = _layer_units(job, lay.tp, split, memo)
        for a, b in spans:
            units += layers[a:b]
        transient = frozen_gathered_transient if job.lora is not None else gathered_transient
        hit = memo[key] = float(int(transient(conv, units)))
    return hit


def _unit_experts_split(job: Job, lay: Layout, memo: dict) -> float:
    """What a layer's routed experts are split over in its FSDP unit: ep x etp, or infinity where the unit holds
    none of them (memory_states.experts_in_units: the framework's fully_shard ignores them at full EP), as the
    estimate's units (fsdp_walk.layer_units, memory_stage.unit_experts) leave them out."""
    if experts_in_units(job.card, lay.ep, _expert_dp(job, lay, memo)):
        return lay.ep * lay.etp
    return math.inf


def _layer_units(job: Job, tp: int, experts_split: float, memo: dict) -> list[float]:
    """Each decoder layer's FSDP unit per GPU (_first_rank_gathered's: split tp ways, replicated, routed experts split
    `experts_split` ways: _unit_experts_split), kept in `memo` per (tp, that split): the layouts' spans slice it."""
    key = ("layer units", tp, experts_split)
    hit = memo.get(key)
    if hit is None:
        pre = _prefix(job.model)
        hit = memo[key] = [(pre.sharded[i + 1] - pre.sharded[i]) / tp + (pre.replicated[i + 1] - pre.replicated[i])
                           + (pre.experts[i + 1] - pre.experts[i]) / experts_split
                           for i in range(job.model.num_layers)]
    return hit


def _span_params(arch, spans: list[tuple[int, int]]) -> tuple[int, int, int]:
    """The parameter counts of the decoder layers of `spans`: split tp ways, replicated, routed experts (integers,
    exact in any order)."""
    pre = _prefix(arch)
    sharded = replicated = routed = 0
    for a, b in spans:
        sharded += pre.sharded[b] - pre.sharded[a]
        replicated += pre.replicated[b] - pre.replicated[a]
        routed += pre.experts[b] - pre.experts[a]
    return sharded, replicated, routed


def _first_stage_states(job: Job, lay: Layout, params: tuple[int, int, int], tensors: list[StateTensor],
                        vocab: int, no_grads: bool, expert_dp: float | None = None, memo: dict | None = None,
                        replicas: int = 1) -> float:
    """first_stage_floor's model states: the first stage's layers and the embedding, dense split tp ways and sharded
    over dp x cp, experts split ep x etp ways and sharded over the expert data-parallel group, each over one of
    `replicas` replicas (memory_states.replicas_at: dp where ZeRO-0 is fully_shard over a shard of one, as memory.
    state_shards); `no_grads`: less the gradients (FSDP2 sets them to None before a one-micro-batch backward).
    `expert_dp`: that group's size where the caller has it (_Degrees: the same call). Each sum is state_bytes'
    (memory_states.state_sums: its operations in its order)."""
    arch = job.model
    tp = lay.tp
    sharded, replicated, routed = params  # the first rank's layers' (_span_params)
    dense = sharded / tp + replicated + vocab * arch.hidden_size / tp
    experts = routed / (lay.ep * lay.etp)
    if expert_dp is None:
        expert_dp = _expert_dp(job, lay)
    classes = state_classes(tensors, {} if memo is None else memo)
    states, dense_grads = state_sums(classes, dense, lay.dp * lay.cp // replicas)
    expert_states, expert_grads = state_sums(classes, experts, expert_dp / replicas)
    states += expert_states
    if no_grads:
        states -= dense_grads
        states -= expert_grads
    return states


def _layer_activation_sums(job: Job, reads: tuple, tokens: int, tp: int, sp: bool, etp: int,
                           recompute: str) -> tuple[float, float, float, float]:
    """Bytes one micro-batch of `tokens` per rank saves in a MoE and a dense layer (a hybrid's least of each) under
    `recompute`, then without (what full recompute rebuilds for one layer); `reads`: _activation_reads' switches."""
    flash, qkv_fused, dropout, swiglu_unfused, moe, attn, act_saves = reads
    act = ActLayout(tokens=tokens, seq_kv=job.seq_length, tp=tp, sp=sp, etp=etp, flash=flash, qkv_fused=qkv_fused,
                    dropout=dropout, swiglu_unfused=swiglu_unfused, fp8=job.precision == "fp8", moe=moe, attn=attn,
                    act=act_saves, attention_recomputed=flash and op_sac_may_recompute_attention(job),
                    act_input_bytes=swiglu_input_bytes(job), fp8_attention=fp8_attention_saves(job, None),
                    shared_expert_overlap=shared_overlap_in_every_plan(job),
                    unfused_glu=unfused_glu_bytes(job))
    shape = shape_of(job.model)
    if shape.kinds:  # a hybrid (M, G, *, -, E layers): arithmetic/mamba.least_kind_activations
        # the modules every searched plan recomputes (search/job.py refuses recompute_modules)
        sums = least_kind_activations(shape, act._replace(**mixer_rows(job)), recompute,
                                      selective_modules(DEFAULT_PLAN))
        if recompute == "full" and pipeline_unit(job.model) > 1:
            # a Gated DeltaNet hybrid's MLP or MoE layer is inside its decoder layer's checkpoint, which keeps the
            # mixer's input alone (memory.checkpoint_group): none saved, so the dense least is none where it has one
            return 0.0, 0.0 if "-" in shape.kinds else sums[1], sums[2], sums[3]
        return sums
    mode = activation_mode(recompute, job.card.recompute.selective)  # what this framework's "selective" saves
    if job.lora is None:
        return tuple(sum(layer_activations(shape, act, moe, m).values())
                     for m in (mode, "none") for moe in (True, False))
    # a LoRA job: less what the frozen norms and the linears without an adapter do not keep, as the estimate takes
    # them off (memory_terms.adapter_kind_bytes); the routed experts counted adapted only where every LoRA engine of
    # the card adapts them (the floor takes off at least what the estimate does)
    norms, targets = activations.frozen_norm_bytes(shape, act), frozenset(job.lora.targets)
    experts = all(e.experts != "none" for e in lora_engines(job.card).values())
    return tuple(sum(layer_activations(shape, act, moe, m).values())
                 - (0.0 if m == "full" else norms + activations.frozen_linear_bytes(shape, act, targets, moe, m,
                                                                                   experts_adapted=experts))
                 for m in (mode, "none") for moe in (True, False))
