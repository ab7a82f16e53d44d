"""One pipeline stage's time per micro-batch: its layers by kind (count x one layer's time), the recompute it
runs, the output head, its pipeline traffic and host floor, and its sharding traffic; with the parameters it
holds and Muon's share, which the once-per-step terms read (perf.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from meshplan.arithmetic.gemm import TRAINING_PASSES_PER_FORWARD
from meshplan.arithmetic.lora import adapter_params
from meshplan.arithmetic.memory_states import fsdp_copy_bytes, with_precision
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.arithmetic.muon import matrix_params, newton_schulz_seconds
from meshplan.arithmetic.schedule import Stages
from meshplan.core.errors import MeshplanError
from meshplan.estimate.layer_records import LayerContext, LayerTime, scope_memo
from meshplan.estimate.memory_terms import RankParts
from meshplan.estimate.recompute import recompute_time, recomputed_layers
from meshplan.estimate.sharding_traffic import (
    DpTraffic,
    ShardingExposed,
    ShardingSchedule,
    ShardUnit,
    StageShards,
    UnitCopies,
    exposed_by_schedule,
    grad_reduce_bytes,
    param_gather_bytes,
    shard_units,
)
from meshplan.knowledge.model_counts import layer_params, per_architecture
from meshplan.knowledge.muon_card import MuonFacts
from meshplan.schema.model import Architecture
from meshplan.schema.plan import Job, Plan


@per_architecture
def layer_param_split(arch: Architecture) -> tuple[list[float], list[float]]:
    """Per layer: parameters sharded by TP or replicated, and routed-expert parameters (two columns, so a
    stage's total is one C-level sum). Cached per object."""
    dense, experts = [], []
    for i in range(arch.num_layers):
        p = layer_params(arch, i)
        dense.append(float(sum(p.values()) - p["routed_experts"]))
        experts.append(float(p["routed_experts"]))
    return dense, experts


@per_architecture
def uniform_layers(arch: Architecture) -> bool:
    """Whether every decoder layer has the same parameters (both columns of layer_param_split) and the same kind (MoE
    or not, as stage_kinds reads it): then a stage's time reads of its layers only their count (stage_rows)."""
    dense, experts = layer_param_split(arch)
    moe_set = set(arch.moe.moe_layers) if arch.moe else set()
    return len(set(dense)) <= 1 and len(set(experts)) <= 1 and len({i in moe_set for i in range(arch.num_layers)}) <= 1


class Recompute(NamedTuple):
    """What the plan's recompute repeats beyond its mode: what its framework's "selective" means (the card),
    torchtitan's every-N-th block (0: none), Megatron's recompute modules."""

    selective: str
    every_nth: int
    modules: tuple[str, ...]
    attention: bool = False  # op-level SAC recomputes the attention (attention_time.op_sac_recomputes_attention)


@dataclass(frozen=True, kw_only=True)
class StageInputs:
    """What timing each pipeline stage needs, computed once per estimate (perf.stage_inputs)."""

    job: Job
    plan: Plan
    ctx: LayerContext
    dense: LayerTime | None  # one dense layer (None: the model has none)
    moe: LayerTime | None  # one MoE layer (None: the model has none)
    hybrid: dict[str, LayerTime] | None = None  # a hybrid model's one layer per kind of its pattern (else None)
    pipeline: Stages
    recompute: Recompute
    head: float  # logits and cross-entropy, forward + backward, on the stage with the output layer
    pp_comm: tuple[float, ...]  # exposed p2p traffic per micro-batch, per pipeline rank (perf._exposed_p2p)
    pp_hop: float = 0.0  # one p2p transfer of a micro-batch's activation (or its gradient) between stages
    pp_cross_layer: float  # per layer, where stages cross NVLink domains with host-synchronous p2p (nanotron)
    host_sync: float  # share of the shorter of host and GPU time serialised behind the other (blocking p2p)
    sharding: ShardingSchedule | None  # these three None in stage_work's inputs (perf.stage_inputs' once_per_step)
    traffic: DpTraffic | None
    muon: MuonFacts | None  # None: Adam
    parts: RankParts | None  # which parameters a rank holds (the memory's too)
    seen: dict[tuple[ShardUnit, ...], ShardingExposed] = field(default_factory=dict)  # stages repeat layers


class MuonStage(NamedTuple):
    """Muon on one stage: the seconds of its Newton-Schulz iterations on this rank, and the matrix parameters
    (dense, routed) it updates in place of Adam."""

    seconds: float = 0.0
    dense: float = 0.0
    expert: float = 0.0


class LayerSums(NamedTuple):
    """A stage's layers summed by kind, per micro-batch, and each kind's (forward, backward with recompute)
    window of one layer (what hides its FSDP neighbours' traffic)."""

    compute: float
    fwd: float
    tp: float
    cp: float
    ep: float
    recompute: float
    windows: dict  # per kind (MoE or not; a hybrid's layer letter): one layer's (forward, backward) window


@dataclass(frozen=True, kw_only=True)
class StageTime:
    """Seconds of one pipeline stage per micro-batch, by part, and what the once-per-step terms need."""

    compute: float
    fwd: float  # forward share of compute
    tp: float
    cp: float
    ep: float
    recompute: float
    pp: float
    host: float  # what the host needs to issue the micro-batch
    sharding: ShardingExposed
    dense_params: float  # parameters this rank holds (LoRA: its adapters), dense and routed
    expert_params: float
    muon: MuonStage
    launch_bound: float  # time the GPU waits for the host
    total: float
    fp8_weights: float = 0.0  # linear weights whose FP8 copies the step makes (fp8_cast_weights)


def stage_time(s: int, layers: Sequence[int], inp: StageInputs) -> StageTime:
    """Stage `s` holding decoder `layers`: every layer of a kind costs the same, so (count x layer) per kind, plus
    the head, the pipeline traffic, the sharding traffic, and the host floor."""
    kinds = stage_kinds(s, layers, inp)
    sums = layer_sums(len(layers), kinds, inp, chunk_sizes(s, inp))
    head_stage = s == inp.pipeline.head_rank
    compute, fwd = stage_compute(sums, head_stage, inp)
    dense_p, expert_p = stage_params(s, layers, inp)
    # Cross-node pipeline stages with host-synchronous p2p (nanotron) lose time on every layer
    # of every micro-batch, growing with the TP ranks that must meet in each collective.
    pp = inp.pp_comm[s] + inp.pp_cross_layer * len(kinds)
    # The host issues every kernel and collective of the micro-batch; when the GPU work is
    # shorter than that, the stage is launch-bound and waits for the CPU.
    host = inp.ctx.cal.host_time_per_layer_s * len(kinds)
    muon = muon_stage(kinds, inp, s == 0, head_stage)
    sharding = stage_sharding(StageShards(layers, kinds, sums.windows, s == 0, head_stage), inp)
    return finished_stage(compute, fwd, (sums.tp, sums.cp, sums.ep, sums.recompute), pp, host, sharding,
                          (dense_p, expert_p), muon, inp, fp8_cast_weights(layers, inp))


def finished_stage(compute: float, fwd: float, comm: tuple[float, float, float, float], pp: float, host: float,
                   sharding: ShardingExposed, params: tuple[float, float], muon: MuonStage,
                   inp: StageInputs, fp8_weights: float = 0.0) -> StageTime:
    """The stage's row from its parts (`comm`: TP, CP, EP, recompute): its GPU seconds, the host floor's wait."""
    tp, cp, ep, recompute = comm
    gpu = sum((compute, tp, cp, ep, recompute, pp, sharding.micro, sharding.copies))
    launch_bound = max(0.0, host - gpu) + inp.host_sync * min(host, gpu)
    return StageTime(compute=compute, fwd=fwd, tp=tp, cp=cp, ep=ep, recompute=recompute, pp=pp, host=host,
                     sharding=sharding, dense_params=params[0], expert_params=params[1], muon=muon,
                     launch_bound=launch_bound, total=gpu + launch_bound, fp8_weights=fp8_weights)


def with_p2p(row: StageTime, pp: float, inp: StageInputs) -> StageTime:
    """A stage alike `row` in all but its pipeline p2p seconds `pp` (stage_rows)."""
    return finished_stage(row.compute, row.fwd, (row.tp, row.cp, row.ep, row.recompute), pp, row.host, row.sharding,
                          (row.dense_params, row.expert_params), row.muon, inp, row.fp8_weights)


def stage_rows(inp: StageInputs) -> list[StageTime]:
    """stage_time of every pipeline stage, computed once per distinct stage. A stage's time reads of its rank `s`
    only whether it is the first (the embedding), the head's and the MTP blocks' stage (stage_kinds), and its p2p
    seconds (pp_comm[s]); of its layers, their kinds and their parameters by index (stage_params, shard_units: the
    same float sums where the values are the same). Without LoRA adapters (whose parameters read the layers'
    indices), where every layer is alike (uniform_layers), stages alike in those and in their count of layers are the
    same StageTime (frozen: shared), or one with another p2p (with_p2p: its pp, GPU seconds and host wait redone);
    where only every layer of a kind is alike (kinds_alike: DeepSeek-V3's dense first layers, then MoE), so are
    stages alike in those and in their layers' kinds in order."""
    pipeline, pp, arch = inp.pipeline, inp.plan.pp, inp.ctx.arch
    plain = pp == 1 or inp.job.lora is not None
    uniform = not plain and uniform_layers(arch)
    if plain or not (uniform or kinds_alike(inp.parts, arch)):
        return [stage_once(s, pipeline.layers(s), inp) for s in range(pp)]
    rows: list[StageTime] = []
    alike: dict[tuple, tuple[float, StageTime]] = {}  # per key, the first such stage's pp_comm and row
    head, mtp, pp_comm = pipeline.head_rank, pipeline.mtp_at, inp.pp_comm
    for s in range(pp):
        layers = pipeline.layers(s)
        key = (len(layers) if uniform else tuple(stage_kinds(s, layers, inp)), chunk_sizes(s, inp), s == 0, s == head,
               s == mtp)
        hit = alike.get(key)
        if hit is None:
            row = stage_once(s, layers, inp)
            alike[key] = (pp_comm[s], row)
        elif pp_comm[s] == hit[0]:
            row = hit[1]
        else:  # stage_time's pp: its own p2p, the same per-layer term (as many layers and MTP blocks)
            row = with_p2p(hit[1], pp_comm[s] + inp.pp_cross_layer * len(stage_kinds(s, layers, inp)), inp)
        rows.append(row)
    return rows


def kinds_alike(parts: RankParts, arch: Architecture) -> bool:
    """Whether every decoder layer of a kind (MoE or not) has the same row of the rank's parameter table (each column
    that stage_params and shard_units read by index): then a stage's time reads of its layers only their kinds in
    order (stage_rows). Kept per table (its object: one per architecture and card fact, kept alive)."""
    table = parts.table
    hit = _KINDS_ALIKE.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    moe_set = set(arch.moe.moe_layers) if arch.moe else set()
    first: dict[bool, tuple[int, int, int]] = {}
    alike = all(first.setdefault(i in moe_set, row) == row for i, row in
                enumerate(zip(table.tp_sharded, table.replicated, table.experts, strict=True)))
    if len(_KINDS_ALIKE) > 64:
        _KINDS_ALIKE.clear()
    _KINDS_ALIKE[id(table)] = (table, alike)
    return alike


_KINDS_ALIKE: dict[int, tuple[object, bool]] = {}


def stage_once(s: int, layers: Sequence[int], inp: StageInputs) -> StageTime:
    """stage_time(s, layers, inp); inside a shared_layers scope once per what it reads but its p2p (stage_key), so a
    search's plans alike in a stage but for its pipeline p2p share it, that redone with their own (with_p2p: the
    sums stage_time finishes its row with). The entry keeps the layer times, architecture and calibration alive, so
    their ids stay their own. Layers not alike (uniform_layers: their parameters read by index, rarely the same
    tuple twice in a search), LoRA (adapters, per engine) and Muon: computed."""
    memo = scope_memo("stages") if inp.job.lora is None and inp.muon is None and uniform_layers(inp.ctx.arch) \
        else None
    if memo is None:
        return stage_time(s, layers, inp)
    kinds = stage_kinds(s, layers, inp)
    key = stage_key(s, layers, kinds, inp)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (inp.dense, inp.moe, inp.ctx.arch, inp.ctx.cal, stage_time(s, layers, inp))
    row, pp = hit[-1], inp.pp_comm[s] + inp.pp_cross_layer * len(kinds)  # stage_time's pp
    return row if row.pp == pp else with_p2p(row, pp, inp)


def stage_key(s: int, layers: Sequence[int], kinds: list[bool], inp: StageInputs) -> tuple:
    """Everything stage_time reads of a stage without LoRA or Muon but its p2p: its layers (their parameters by index:
    where every layer is alike, uniform_layers, only their count) and kinds (MTP blocks appended), whether it holds
    the embedding and the head, the head's seconds; the layer times (layer_sums) and the recompute they run (the
    plan's mode, layers and method, Recompute); the plan's grid and the DP groups, links and schedule its sharding
    and side collectives read (sharding_key, other_link_collectives); the host's blocking share (finished_stage);
    the architecture, calibration and layer times by identity."""
    plan, traffic, ctx = inp.plan, inp.traffic, inp.ctx
    return (len(layers) if uniform_layers(ctx.arch) else tuple(layers), tuple(kinds), chunk_sizes(s, inp), s == 0,
            s == inp.pipeline.head_rank, inp.head, id(inp.dense), id(inp.moe), id(ctx.arch), id(ctx.cal),
            inp.recompute, plan.recompute, plan.recompute_layers, plan.recompute_method, plan.tp, plan.cp, plan.ep,
            plan.etp, plan.pp == 1, plan.sequence_parallel, plan.grad_reduce_in_fp32, plan.fp8_param_gather,
            plan.fp8_recipe, inp.sharding, traffic.dense, traffic.expert, traffic.lk, ctx.lk.domain, traffic.replicas,
            traffic.replicas_with_each_reduce, inp.host_sync, inp.job.framework, inp.job.precision)


def stage_compute(sums: LayerSums, head_stage: bool, inp: StageInputs) -> tuple[float, float]:
    """(compute, its forward share) of a stage per micro-batch: its layers', and the head's on the head stage."""
    compute, fwd = sums.compute, sums.fwd
    if head_stage:
        compute += inp.head
        fwd += inp.head / TRAINING_PASSES_PER_FORWARD
    return compute, fwd


def stage_kinds(s: int, layers: Sequence[int], inp: StageInputs) -> list[bool]:
    """Each layer of the stage, True for an MoE layer (a hybrid's letter); the model's MTP blocks appended on the
    stage that trains them (each costs like the last layer, a hybrid's as its mtp_layer_pattern's layers)."""
    return layer_kinds(s, layers, inp.ctx.arch, inp.pipeline)


def layer_kinds(s: int, layers: Sequence[int], arch: Architecture, pipeline: Stages) -> list[bool]:
    """stage_kinds of the model `arch` split as `pipeline`: inside a shared_layers scope once per model (by identity,
    kept alive by the entry), layers and whether the stage trains the MTP blocks (a copy: the caller's own list)."""
    mtp = s == pipeline.mtp_at and bool(arch.num_mtp_layers) and pipeline.mtp_trained
    if not (mtp or arch.moe or arch.layer_pattern):  # every layer dense (_layer_kinds' own), no key to build
        return [False] * len(layers)
    memo = scope_memo("layer_kinds")
    if memo is None:
        return _layer_kinds(layers, arch, mtp)
    key = (id(arch), tuple(layers), mtp)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (arch, _layer_kinds(layers, arch, mtp))
    return list(hit[1])


def _layer_kinds(layers: Sequence[int], arch: Architecture, mtp: bool) -> list:
    if arch.layer_pattern is not None:  # a hybrid's: its layers' letters (M, *, -, E), its MTP blocks' after them
        return [arch.layer_pattern[i] for i in layers] + (list(arch.mtp_layer_pattern or "") * arch.num_mtp_layers
                                                          if mtp else [])
    moe_set = set(arch.moe.moe_layers) if arch.moe else set()
    kinds = [(i in moe_set) for i in layers] if moe_set else [False] * len(layers)
    if mtp:
        kinds += [arch.is_moe_layer(arch.num_layers - 1)] * arch.num_mtp_layers
    return kinds


def kinds_cp(kinds: list[bool], one: float) -> float:
    """layer_sums' CP seconds of a stage whose layers of both kinds have `one` CP seconds each (a layer's CP traffic
    reads its attention, not its MLP: perf.stage_cp): count x one per kind present, dense first."""
    n_moe = sum(kinds)
    cp = 0.0
    for count in (len(kinds) - n_moe, n_moe):
        if count:
            cp += count * one
    return cp


def chunk_sizes(s: int, inp: StageInputs) -> tuple[int, ...] | None:
    """The decoder layers of each virtual chunk pipeline rank `s` holds, in the order its layers run (Stages.layers),
    where the plan's recompute reads them: the block method's first recompute_layers of each chunk
    (recomputing_kinds). None elsewhere, so stages alike in their layers share one row whatever their chunks."""
    plan = inp.plan
    if plan.recompute != "full" or plan.recompute_layers is None or plan.recompute_method == "uniform":
        return None
    return tuple(len(chunk) for chunk in inp.pipeline.chunks[s])


def recomputing_kinds(n_layers: int, kinds: list, plan, chunks: tuple[int, ...] | None = None) -> list:
    """The kinds of the stage's layers that full recompute reruns: the first recompute_layers of each virtual chunk
    (`chunks`, the sizes in order; None: one chunk of n_layers), every layer under the uniform method or with
    recompute_layers left out, as Megatron-Core's checkpointed_forward runs in each chunk's TransformerBlock
    (recompute.py: over num_layers_per_pipeline_rank, a chunk's layers); memory_stage.held_activations counts the
    same layers. The MTP blocks appended to `kinds` never recompute."""
    picked: list = []
    start = 0
    for size in chunks or (n_layers,):
        picked += kinds[start:start + recomputed_layers(plan, size)]
        start += size
    return picked


def recomputed_counts(n_layers: int, kinds: list[bool], inp: StageInputs,
                      chunks: tuple[int, ...] | None = None) -> tuple[str, int, int]:
    """(mode, layers, MoE layers) of the stage that recompute: the first recompute_layers of each of its chunks
    (recomputing_kinds; uniform: every layer, in groups), or torchtitan 0.2.x's every N-th block built on the rank,
    fully checkpointed."""
    plan = inp.plan
    recomputing = recomputing_kinds(n_layers, kinds, plan, chunks)
    n_recompute, n_moe_recompute = len(recomputing), sum(recomputing)
    every_nth = inp.recompute.every_nth
    if every_nth:
        picked = [kind for k, kind in enumerate(kinds, 1) if k % every_nth == 0]
        return "full", len(picked), sum(picked)
    return plan.recompute, n_recompute, n_moe_recompute


def layer_sums(n_layers: int, kinds: list[bool], inp: StageInputs, chunks: tuple[int, ...] | None = None) -> LayerSums:
    """The stage's layers, (count x one layer) per kind, with the recompute of those that recompute (`chunks`: its
    virtual chunks' sizes, recomputing_kinds)."""
    if inp.hybrid is not None:
        return hybrid_sums(n_layers, kinds, inp, chunks)
    mode, n_recompute, n_moe_recompute = recomputed_counts(n_layers, kinds, inp, chunks)
    n_moe = sum(kinds)
    return kind_sums(((False, inp.dense, len(kinds) - n_moe, n_recompute - n_moe_recompute, False),
                      (True, inp.moe, n_moe, n_moe_recompute, True)), mode, inp)


def hybrid_sums(n_layers: int, kinds: list, inp: StageInputs, chunks: tuple[int, ...] | None = None) -> LayerSums:
    """layer_sums of a hybrid model's stage: (count x one layer) per letter of the pattern it holds (inp.hybrid),
    the recompute of those among the first recompute_layers of each chunk (every layer where uniform or left out)."""
    plan = inp.plan
    assert inp.hybrid is not None
    recomputing = recomputing_kinds(n_layers, kinds, plan, chunks)
    return kind_sums(((kind, lt, kinds.count(kind), recomputing.count(kind), kind == "E")
                      for kind, lt in inp.hybrid.items()), plan.recompute, inp)


def kind_sums(parts: Iterable[tuple[Any, LayerTime | None, int, int, bool]], mode: str,
              inp: StageInputs) -> LayerSums:
    """(count x one layer) summed over a stage's kinds of layer, each part (its key in `windows`, one layer's times,
    the layers of that kind, how many of them recompute in `mode`, whether it is an MoE layer), with each kind's
    forward and backward window: the sums layer_sums and hybrid_sums share."""
    cal, rc = inp.ctx.cal, inp.recompute
    compute = fwd = tp = cp = ep = recompute = 0.0
    windows: dict[Any, tuple[float, float]] = {}  # per kind: one layer's forward and backward
    for key, lt, count, recomputed, is_moe in parts:
        if not count:
            continue
        assert lt is not None
        compute += count * lt.compute
        fwd += count * lt.fwd_compute
        tp += count * lt.tp
        cp += count * lt.cp
        ep += count * lt.ep
        rec = recomputed * recompute_time(lt, mode, cal, rc.selective, rc.modules, rc.attention) if recomputed else 0.0
        recompute += rec
        if inp.sharding is not None:  # (none in stage_work's inputs: only the stage's sharding reads the windows)
            side_fwd, side_bwd = other_link_collectives(lt, inp, is_moe) if inp.sharding.per_step else (0.0, 0.0)
            windows[key] = (lt.fwd_compute + side_fwd, lt.compute - lt.fwd_compute + rec / count + side_bwd)
    return LayerSums(compute, fwd, tp, cp, ep, recompute, windows)


def one_layer_work(n_layers: int, kinds: list[bool], inp: StageInputs) -> tuple[float, float, float, float]:
    """(dense, MoE, dense recompute, MoE recompute): one layer of each kind of the stage, its seconds per micro-batch
    as layer_sums adds them up (compute, TP, EP), and the recompute of one of its decoder layers where the stage
    recomputes every one of that kind (else none: a lower bound of any one layer's; the MTP blocks appended to
    `kinds` never recompute); 0 for a kind the stage holds none of."""
    if inp.hybrid is not None:
        return hybrid_one_layer_work(n_layers, kinds, inp)
    cal, rc = inp.ctx.cal, inp.recompute
    mode, n_recompute, n_moe_recompute = recomputed_counts(n_layers, kinds, inp)
    n_moe, moe_decoder = sum(kinds), sum(kinds[:n_layers])
    work, rec = [], []
    for lt, count, decoder, recomputed in ((inp.dense, len(kinds) - n_moe, n_layers - moe_decoder,
                                            n_recompute - n_moe_recompute),
                                           (inp.moe, n_moe, moe_decoder, n_moe_recompute)):
        if not count or lt is None:
            work.append(0.0)
            rec.append(0.0)
            continue
        work.append(lt.compute + lt.tp + lt.ep)
        rec.append(recompute_time(lt, mode, cal, rc.selective, rc.modules, rc.attention)
                   if recomputed == decoder else 0.0)
    return work[0], work[1], rec[0], rec[1]


def hybrid_one_layer_work(n_layers: int, kinds: list, inp: StageInputs) -> tuple[float, float, float, float]:
    """one_layer_work of a hybrid model's stage, as lower bounds of any one layer of its kind: 'dense' the least of its
    Mamba-2, attention and MLP layers' work (compute, TP, EP) and recompute (a kind's recompute where the stage
    recomputes every layer of it, else none), 'MoE' its MoE layers'; so count x one of each, what the search's rank
    chains take (search/rank_chains.py), never exceeds the stage's own layers."""
    plan, cal, rc = inp.plan, inp.ctx.cal, inp.recompute
    assert inp.hybrid is not None
    n_recompute = recomputed_layers(plan, n_layers)
    dense: list[tuple[float, float]] = []
    moe = (0.0, 0.0)
    for kind, lt in inp.hybrid.items():
        count = kinds.count(kind)
        if not count:
            continue
        every = kinds[:n_recompute].count(kind) == count
        one = (lt.compute + lt.tp + lt.ep,
               recompute_time(lt, plan.recompute, cal, rc.selective, rc.modules, rc.attention) if every else 0.0)
        if kind == "E":
            moe = one
        else:
            dense.append(one)
    least = (min(w for w, _ in dense), min(r for _, r in dense)) if dense else (0.0, 0.0)
    return least[0], moe[0], least[1], moe[1]


def other_link_collectives(lt: LayerTime, inp: StageInputs, moe: bool) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's exposed TP, CP and EP collectives that run on other links than its
    data-parallel sharding traffic (one inside the fast domain, the other across the network). The all-gathers and
    reduce-scatters of FSDP2, Megatron-FSDP and ZeRO-3 run on their own streams and communicators (Megatron-FSDP's
    side_stream_for_param_gather and its reduce-scatter stream, FSDP2's all-gather and reduce-scatter streams), so
    while the compute stream waits on such a collective the sharding traffic keeps moving: the collective widens the
    window that hides it like compute does. A collective over the same kind of link shares its bandwidth instead
    and is left out. The forward holds TP's forward share (LayerTime.tp_fwd), half of the EP collectives (the same
    dispatch / combine run again backward) and CP's forward share. An MoE layer's (`moe`) sharding traffic is its
    dense ring and its routed experts' expert-DP ring."""
    domain, traffic = inp.ctx.lk.domain, inp.traffic
    sharding_crosses = traffic.dense.crosses(domain) or (moe and traffic.expert.crosses(domain))
    groups = mesh_groups(inp.plan, law=inp.ctx.law)
    fwd = bwd = 0.0
    for seconds, forward, group in ((lt.tp, lt.tp_fwd, groups.tp), (lt.cp, lt.cp_fwd, groups.cp),
                                    (lt.ep, lt.ep / 2, groups.ep)):
        if seconds > 0 and group.crosses(domain) != sharding_crosses:
            fwd += forward
            bwd += seconds - forward
    return fwd, bwd


def fp8_cast_weights(layers: Sequence[int], inp: StageInputs) -> float:
    """The linear weights of the stage's decoder `layers` on this rank whose FP8 copies Transformer Engine makes once
    per step (RankParts.linear, frozen LoRA bases too; ctx.fp8_casts: 0 where the job runs none); the output layer
    stays bf16 (memory_stage.fp8_weight_params) and MTP blocks are not counted."""
    return inp.parts.linear(layers) if inp.ctx.fp8_casts is not None else 0.0


def stage_params(s: int, layers: Sequence[int], inp: StageInputs) -> tuple[float, float]:
    """(dense, routed) parameters this rank of stage `s` holds (RankParts, the memory's too): its layers' TP / EP
    shards with what the framework's TP keeps whole, the embedding on the first stage, the output layer and final norm
    on the head stage, the MTP blocks where the layout puts them; under LoRA only the adapters (the only parameters
    with gradients to reduce and states to step)."""
    job, plan, arch, pipeline = inp.job, inp.plan, inp.ctx.arch, inp.pipeline
    mtp = s == pipeline.mtp_at and bool(arch.num_mtp_layers) and pipeline.mtp_trained
    if job.lora is not None:
        return adapter_params(arch, layers, job.lora, inp.ctx.lora_engine, tp=plan.tp, ep=plan.ep, etp=plan.etp,
                              mtp=mtp)
    return inp.parts.held(layers, first=s == 0, last=s == pipeline.head_rank, mtp=mtp)


def muon_stage(kinds: list[bool], inp: StageInputs, first: bool, last: bool) -> MuonStage:
    """Muon: the matrices this rank updates in place of Adam, and its share of their Newton-Schulz iterations, at
    the card's ns_dtype's peak (fp32: the GPU's fp32_flops); the embedding (`first` stage) and output layer (`last`)
    among them where the card's max_aspect_ratio lets them take it."""
    if inp.muon is None:
        return MuonStage()
    ctx, plan, traffic, muon = inp.ctx, inp.plan, inp.traffic, inp.muon
    vocab = (inp.parts.embedding if first else 0.0, inp.parts.head if last else 0.0)
    dense, expert = matrix_params(ctx.arch, ctx.shard, kinds, muon, vocab)
    peak = ctx.bf16_peak
    if muon.ns_dtype == "fp32":
        peak = inp.job.gpu.fp32_flops
        if peak is None:
            raise MeshplanError(f"{inp.job.framework}'s Muon iterates in fp32, and {inp.job.gpu.name} has no "
                                "fp32_flops to time it at.",
                                fix="Give the GPU's fp32_flops (dense FP32 without TF32), or leave optimizer out.")
    sharded = plan.zero_stage > 0
    seconds = newton_schulz_seconds(ctx.arch, ctx.shard, kinds, muon, ctx.cal, peak,
                                    traffic.dense_group if sharded else 1,
                                    traffic.expert_group if sharded or muon.assignment == "layer_wise" else 1,
                                    vocab)
    return MuonStage(seconds, dense, expert)


def stage_sharding(stage: StageShards, inp: StageInputs) -> ShardingExposed:
    """ZeRO-2/3 / FSDP: unit-by-unit gathers and reduce-scatters, each hidden behind its neighbours' compute;
    per micro-batch (inside the pipeline), or once per step (the step's DP term). Inside a shared_layers scope once
    per what it reads (sharding_key): a search's plans that differ in what it does not read (virtual stages and
    schedules of one grid, micro-batch counts, recompute modes leaving the layers' windows alike) share the figure;
    the entry keeps the architecture and calibration alive, so their ids stay their own."""
    if not inp.sharding.per_step:
        return ShardingExposed()
    memo = scope_memo("stage_sharding")
    if memo is None:
        return _stage_sharding(stage, inp)
    key = sharding_key(stage, inp)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = (inp.ctx.arch, inp.ctx.cal, _stage_sharding(stage, inp))
    return hit[-1]


def sharding_key(stage: StageShards, inp: StageInputs) -> tuple:
    """Everything _stage_sharding reads: the stage's layers (shard_units reads their parameters by index: where
    every layer is alike, uniform_layers, only their count), their kinds and windows, whether it holds the embedding
    and the head (shard_units); of the plan its TP / EP grid, sequence parallelism (layer_weights), whether it is one
    stage (tied embeddings), and the fields the bytes per element read (grad_reduce_bytes, param_gather_bytes); the
    head's seconds, the DP groups, links and replicas (DpTraffic), the schedule (exposed_by_schedule); of the job its
    framework (its card's zero3_prefetch) and precision (param_gather_bytes); the architecture and calibration by
    identity; the rank's parameter table (by identity: one per architecture and card fact) and edge parameters
    (RankParts)."""
    plan, traffic = inp.plan, inp.traffic
    layers = len(stage.layers) if uniform_layers(inp.ctx.arch) else tuple(stage.layers)
    return (layers, tuple(stage.kinds), tuple(stage.windows.items()), stage.first, stage.head_stage,
            plan.tp, plan.ep, plan.etp, plan.pp == 1, plan.sequence_parallel, plan.grad_reduce_in_fp32,
            plan.fp8_param_gather, plan.fp8_recipe, plan.zero_stage, inp.head, traffic.dense, traffic.expert,
            traffic.lk, traffic.replicas, traffic.replicas_with_each_reduce, inp.sharding, inp.job.framework,
            inp.job.framework_version, inp.job.precision, inp.ctx.hbm, id(inp.ctx.arch), id(inp.ctx.cal),
            id(inp.parts.table), inp.parts.embedding, inp.parts.head)


def _stage_sharding(stage: StageShards, inp: StageInputs) -> ShardingExposed:
    """stage_sharding's figure, computed (per StageInputs once per distinct units: stages repeat layers)."""
    arch, plan = inp.ctx.arch, inp.plan
    prefetch = inp.job.card.zero3_prefetch  # DeepSpeed's live-parameter limit
    _, conv, tensors = with_precision(inp.job, plan)
    copied = fsdp_copy_bytes(conv, tensors)  # torch's fully_shard copies on the compute stream
    units = tuple(shard_units(stage, parts=inp.parts, plan=plan, arch=arch, head=inp.head, traffic=inp.traffic,
                              grad_bytes=grad_reduce_bytes(plan, inp.ctx.cal), weight_bytes=param_gather_bytes(
                                  inp.job, plan), max_live=prefetch.max_live_parameters if prefetch else None,
                              copies=UnitCopies(copied, inp.ctx.hbm) if copied is not None else None,
                              head_resharded=conv.output_resharded_at_loss,
                              embedding_in_root=conv.embedding_in_root))
    if units not in inp.seen:  # pipeline stages often hold the same layers
        inp.seen[units] = exposed_by_schedule(units, inp.sharding, inp.traffic.sm_share)
    return inp.seen[units]

