"""The pipeline ranks' loads and the chains of the replayed timeline they bound the step by, for the search's
step-time bounds (search/bounds.py) on an uneven split.

The bounds stretch a layout's work per micro-batch W (single-stage references) over its stages: W/pp x (m + (pp-1)/v).
The replayed pipeline (arithmetic/pipeline_timeline.py: GPipe, 1F1B, interleaved and combined 1F1B, the orders with
a bubble; each rank's chunk t/v) starts rank r's first op, the forward of chunk 0, only after the forward of chunk 0
on every earlier rank, runs its m micro-batches (m x t_r), and ends on its backward of chunk 0, which every earlier
rank then runs: so the step is at least m t_r + (the earlier ranks' times)/v for every rank r; for the last one,
(m - 1/v) t_last + (every rank's time)/v, with that sum at least W. Where t_last >= W/pp that is the bounds'
stretch. An uneven split (Megatron's first/last stage sizes, a virtual layout, an even split's remainder, the
output layer elsewhere) may leave the last rank less: the bounds then take the largest of these chains, with each
rank's least time from its layers of each kind and its head (a reference's parts: perf.StageWork), and m x W/pp (the
slowest rank is at least the average), where that is under their stretch. Where the stretch holds but the ranks
differ, the same chains raise the exact bounds (heavy_chains): a rank heavier than W/pp makes m t_r the longer.
DeepSeek-V3's 61 layers fall unevenly on every pp: on 2,048 H100 its pipeline bounds rise about 3%."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from meshplan.arithmetic.schedule import Stages
from meshplan.estimate.hybrid_time import HYBRID_KINDS
from meshplan.estimate.stage_time import layer_kinds
from meshplan.schema.model import MIXER_KINDS, Architecture
from meshplan.schema.plan import Job
from meshplan.search.floors import estimate_stages
from meshplan.search.space import Layout


@dataclass(frozen=True)
class RankLoad:
    """What one pipeline rank holds of the model, as the estimate weighs its stages (or several ranks', summed)."""

    dense: int  # dense layers, its MTP blocks of that kind included
    moe: int  # MoE layers, its MTP blocks of that kind included (each pays the MoE host sync: bounds.moe_sync_s)
    dense_decoder: int  # dense decoder layers (what recomputes: the MTP blocks do not)
    moe_decoder: int  # MoE decoder layers
    head: int  # the output layer and the loss (1 where it holds them)
    layers: float  # its share of the model's layers and MTP blocks (the CP traffic, the same per layer)
    moe_layers: float  # its share of the MoE layers and MoE MTP blocks (the exposed all-to-all, per MoE layer)
    kinds: tuple[int, ...] = ()  # a hybrid's layers of each kind of its pattern (HYBRID_KINDS' order); () otherwise

    def plus(self, other: RankLoad) -> RankLoad:
        return RankLoad(self.dense + other.dense, self.moe + other.moe, self.dense_decoder + other.dense_decoder,
                        self.moe_decoder + other.moe_decoder, self.head + other.head, self.layers + other.layers,
                        self.moe_layers + other.moe_layers,
                        tuple(a + b for a, b in zip(self.kinds, other.kinds, strict=True)) if self.kinds else ())


NOTHING = RankLoad(0, 0, 0, 0, 0, 0.0, 0.0)


@dataclass(frozen=True, eq=False)
class Ranks:
    """Per distinct stages a layout's plans take at the search's ZeRO stages: the last rank's load and, per distinct
    load, the latest rank holding it (a rank alike before it has as much of its own and less before it) with the
    earlier ranks' loads summed, the chains the bounds weigh (stages_bound). One object per layout shape: the bounds
    key their memos by it."""

    stages: tuple[tuple[RankLoad, tuple[tuple[RankLoad, RankLoad], ...]], ...]
    flat: tuple = ()  # the stages as light_stages reads them (flat_stages), once per layout shape
    light: dict[tuple, tuple | None] = field(default_factory=dict)  # bounds.light_ranks per rate's references


def pipeline_ranks(job: Job, lay: Layout, zeros: tuple[int, ...]) -> Ranks | None:
    """The ranks' loads of the layout's stages at each ZeRO stage (the convention may read it), None where the bounds'
    stretch already holds: no bubble (a zero-bubble schedule's bound is m x W/pp), or at every ZeRO stage the last
    rank holds at least 1/pp of each kind of layer, of all layers and the output layer (then t_last >= W/pp). ZeRO
    stages whose stages no estimate takes have no plan to bound."""
    if lay.pp == 1 or not lay.bubble_stages():
        return None
    found: dict[tuple[RankLoad, ...], None] = {}
    for zero in zeros:
        stages = estimate_stages(job, lay, zero)
        if stages is not None:
            found[tuple(rank_load(job.model, stages, s) for s in range(lay.pp))] = None
    if all(holds_its_share(loads[-1], job.model, lay.pp) for loads in found):
        return None
    stages = tuple((loads[-1], latest_chains(loads)) for loads in found)
    return Ranks(stages, flat_stages(stages, lay.pp, lay.vpp, len(job.model.moe.moe_layers) if job.model.moe else 0))


def heavy_chains(memo: dict, job: Job, lay: Layout, zeros: tuple[int, ...], refs: tuple,
                 parts: Callable[[tuple], tuple[float, ...]]) -> tuple | None:
    """light_stages of every stages of a layout whose stretch holds (bounds.stretch's exact bounds: pipeline_ranks is
    None), whatever their last rank holds, at a rate's references `refs` (`parts`: bounds.token_parts); None where
    no chain can be over the stretch: no bubble, every rank alike at each ZeRO stage, or a reference without parts.
    The ranks are kept in `memo` per what the stages read of the layout; their chains in the Ranks per references."""
    key = ("heavy", lay.pp, lay.vpp, lay.first, lay.last, lay.split, lay.schedule)
    ranks = memo.get(key, False)
    if ranks is False:
        ranks = memo[key] = None
        if lay.pp > 1 and lay.bubble_stages():
            found = {tuple(rank_load(job.model, stages, s) for s in range(lay.pp)): None for stages in
                     (estimate_stages(job, lay, zero) for zero in zeros) if stages is not None}
            if any(len(set(loads)) > 1 for loads in found):
                stages = tuple((loads[-1], latest_chains(loads)) for loads in found)
                ranks = memo[key] = Ranks(stages, flat_stages(stages, lay.pp, lay.vpp, model_layers(job.model)[1]))
    if ranks is None:
        return None
    hit = ranks.light.get(refs, False)
    if hit is False:
        weights = parts(refs)
        hit = ranks.light[refs] = light_stages(ranks.flat, weights, 0.0, 0.0, 0.0, lay.pp, lay.vpp, every=True) \
            if any(weights) else None
    return hit


def latest_chains(loads: tuple[RankLoad, ...]) -> tuple[tuple[RankLoad, RankLoad], ...]:
    """Per distinct load of `loads` (in rank order), its latest rank's (load, the earlier ranks' loads summed)."""
    latest: dict[RankLoad, tuple[RankLoad, RankLoad]] = {}
    before = NOTHING
    for load in loads:
        latest.pop(load, None)
        latest[load] = (load, before)
        before = before.plus(load)
    return tuple(latest.values())


def coefficients(load: RankLoad) -> tuple[int, int, int, int, int, float]:
    """What a load's least time per token weighs each of a reference's parts by (bounds.token_parts' order)."""
    return load.dense, load.moe, load.dense_decoder, load.moe_decoder, load.head, load.layers


def flat_stages(stages: tuple[tuple[RankLoad, tuple[tuple[RankLoad, RankLoad], ...]], ...], pp: int, vpp: int,
                n_moe: int) -> tuple:
    """Per stages, what light_stages reads of their loads, as flat tuples: the last rank's coefficients, whether it
    holds less than 1/pp of the MoE layers (their exposed all-to-all) and of the model's `n_moe` MoE layers (their
    host syncs), its share of the MoE layers and its MoE layers; per chain, the rank's with the most layers first
    (stages_bound's first to reach its cap, which any may), the rank's coefficients (None for the last rank's load:
    its least time is the last rank's), share and MoE layers, then the earlier ranks' coefficients (None where there
    are none: no time), share over vpp and MoE layers over vpp (what does not read the reference, divided once)."""
    return tuple((coefficients(last), pp * last.moe_layers < 1.0, pp * float(last.moe) < n_moe, last.moe_layers,
                  float(last.moe),
                  tuple((None if load == last else coefficients(load), load.moe_layers, float(load.moe),
                         None if before == NOTHING else coefficients(before), before.moe_layers / vpp,
                         float(before.moe) / vpp)
                        for load, before in sorted(chains, key=lambda chain: -chain[0].layers)))
                 for last, chains in stages)


def light_stages(flat: tuple, parts: tuple[float, ...], per_token: float, exposed: float, sync: float, pp: int,
                 vpp: int, every: bool = False) -> tuple | None:
    """bounds.light_ranks of flat_stages `flat` at a reference's `parts` (bounds.token_parts), `per_token` seconds,
    `exposed` all-to-all and `sync` host syncs: per stages whose last rank may hold less than 1/pp of the work, (its
    last rank's least time per token, its share of the MoE layers, its MoE layers) and per chain (the rank's three,
    the earlier ranks' three over vpp); None where none may. `every`: each stages, light or not (heavy_chains)."""
    dense, moe, dense_rec, moe_rec, head, cp = parts
    light = []
    for (c0, c1, c2, c3, c4, c5), short_a2a, short_sync, share, moes, chains in flat:
        least = c0 * dense + c1 * moe + c2 * dense_rec + c3 * moe_rec + c4 * head + c5 * cp
        if every or pp * least < per_token or (exposed and short_a2a) or (sync and short_sync):
            rows = []  # (asked once per stages and reference: unpacked and written out, no comprehension)
            for a, ms, mo, b, ms_b, mo_b in chains:
                if a is None:
                    t = least
                else:
                    a0, a1, a2, a3, a4, a5 = a
                    t = a0 * dense + a1 * moe + a2 * dense_rec + a3 * moe_rec + a4 * head + a5 * cp
                if b is None:
                    t_b = 0.0
                else:
                    b0, b1, b2, b3, b4, b5 = b
                    t_b = (b0 * dense + b1 * moe + b2 * dense_rec + b3 * moe_rec + b4 * head + b5 * cp) / vpp
                rows.append((t, ms, mo, t_b, ms_b, mo_b))
            light.append(((least, share, moes), rows))
    return tuple(light) or None


def rank_load(arch: Architecture, stages: Stages, s: int) -> RankLoad:
    """Rank s of `stages`: its layers' kinds as the estimate counts them (stage_time.layer_kinds, its MTP blocks
    appended where it trains them)."""
    layers = stages.layers(s)
    kinds = layer_kinds(s, layers, arch, stages)
    if arch.layer_pattern is not None:
        return hybrid_rank_load(arch, arch.layer_pattern, kinds, int(stages.head_rank == s))
    moe, moe_decoder = sum(kinds), sum(kinds[:len(layers)])
    total, moe_total = model_layers(arch)
    return RankLoad(dense=len(kinds) - moe, moe=moe, dense_decoder=len(layers) - moe_decoder, moe_decoder=moe_decoder,
                    head=int(stages.head_rank == s), layers=len(kinds) / total,
                    moe_layers=moe / moe_total if moe_total else 1.0)


def hybrid_rank_load(arch: Architecture, pattern: str, kinds: list, head: int) -> RankLoad:
    """rank_load of a hybrid model's rank holding the layers of `kinds` (their letters, its MTP blocks' included):
    its MoE layers (E) and the others as 'dense' (whose least layer the references' parts give:
    stage_time.hybrid_one_layer_work), its count of each letter (holds_its_share), and as its share of the CP traffic
    the least of its shares of the Mamba-2, Gated DeltaNet and attention layers, the kinds CP reaches (their traffic
    per layer differs, so the rank's share of it is a mean of those shares, at least the least)."""
    counts = tuple(kinds.count(k) for k in HYBRID_KINDS)
    moe = counts[HYBRID_KINDS.index("E")]
    trained = trained_pattern(arch)
    cp_share = min((c / trained.count(k) for k, c in zip(HYBRID_KINDS, counts, strict=True)
                    if k in MIXER_KINDS and k in trained), default=0.0)
    moe_total = model_layers(arch)[1]
    return RankLoad(dense=len(kinds) - moe, moe=moe, dense_decoder=len(kinds) - moe, moe_decoder=moe, head=head,
                    layers=cp_share, moe_layers=moe / moe_total if moe_total else 1.0, kinds=counts)


def trained_pattern(arch: Architecture) -> str:
    """A hybrid's layers a reference may train, one letter each: its pattern, then its MTP blocks' layers
    (mtp_layer_pattern once per block), as stage_time.layer_kinds appends them."""
    assert arch.layer_pattern is not None
    return arch.layer_pattern + (arch.mtp_layer_pattern or "") * arch.num_mtp_layers


def model_layers(arch: Architecture) -> tuple[int, int]:
    """(layers, MoE layers), both with the MTP blocks (every one a reference may train)."""
    if arch.layer_pattern is not None:
        trained = trained_pattern(arch)
        return len(trained), trained.count("E")
    mtp = arch.num_mtp_layers
    moe = len(arch.moe.moe_layers) if arch.moe else 0
    mtp_moe = mtp if mtp and arch.is_moe_layer(arch.num_layers - 1) else 0
    return arch.num_layers + mtp, moe + mtp_moe


def holds_its_share(rank: RankLoad, arch: Architecture, pp: int) -> bool:
    """Whether the rank holds at least 1/pp of each part of the work a reference counts (so its time is at least
    W/pp): of the dense and of the MoE layers (MTP blocks included: the host syncs too), of all layers (CP), of each
    kind's decoder layers (their recompute), and the output layer."""
    total, moe_total = model_layers(arch)
    moe_decoder = len(arch.moe.moe_layers) if arch.moe else 0
    if rank.kinds and arch.layer_pattern is not None:  # a hybrid's kinds differ in time: 1/pp of each (MTP's too)
        trained = trained_pattern(arch)
        return bool(rank.head) and all(pp * c >= trained.count(k)
                                       for k, c in zip(HYBRID_KINDS, rank.kinds, strict=True))
    return (bool(rank.head) and pp * rank.dense >= total - moe_total and pp * rank.moe >= moe_total
            and pp * (rank.dense + rank.moe) >= total and pp * rank.moe_decoder >= moe_decoder
            and pp * rank.dense_decoder >= arch.num_layers - moe_decoder)


def heavy_bound(m: int, pp: int, vpp: int, whole: float, heavy: tuple, weights: tuple[float, float, float],
                stretch: float) -> float:
    """The least over heavy_chains' stages of the largest of their `stretch` (it holds for each), m x whole/pp, each
    chain and the last rank's (stages_bound's terms, with the same `weights`): every one is under the replay."""
    w0, w1, w2 = weights
    least = math.inf
    for (last0, last1, last2), chains in heavy:
        bound = max(stretch, m * whole / pp, (m - 1.0 / vpp) * (w0 * last0 + w1 * last1 + w2 * last2) + whole / vpp)
        for a, ms, mo, a_before, ms_before, mo_before in chains:
            chain = m * (w0 * a + w1 * ms + w2 * mo) + w0 * a_before + w1 * ms_before + w2 * mo_before
            if chain > bound:
                bound = chain
        if bound < least:
            least = bound
    return least


def stages_bound(m: int, pp: int, vpp: int, whole: float, light: tuple, weights: tuple[float, float, float],
                 cap: float) -> float:
    """Seconds the step takes at least (the module's chains) at the least of `light`'s stages (bounds.light_ranks:
    each one's last rank's parts and chains), at most `cap`. Per stages, the largest of m x whole/pp (the slowest
    rank), the last rank's chain (m - 1/v) last + whole/v, and m t_r + (earlier ranks)/v of each chain (each t_r's
    parts then the earlier ranks' over v: per token, per exposed all-to-all of the whole model, per MoE host sync),
    weighed by `weights` (tokens per rank, the exposed all-to-all's seconds per micro-batch, the host sync's); `cap`
    once a chain reaches it (the bounds' stretch: what they take where it holds)."""
    w0, w1, w2 = weights
    slowest, before_last, spread = m * whole / pp, m - 1.0 / vpp, whole / vpp
    for (last0, last1, last2), chains in light:
        bound = slowest
        for a, ms, mo, a_before, ms_before, mo_before in chains:
            chain = m * (w0 * a + w1 * ms + w2 * mo) + w0 * a_before + w1 * ms_before + w2 * mo_before
            if chain > bound:
                if chain >= cap:
                    break  # this stages' bound is the cap
                bound = chain
        else:
            tail = before_last * (w0 * last0 + w1 * last1 + w2 * last2) + spread
            if tail > bound:
                bound = tail
            if bound < cap:
                cap = bound
    return cap
