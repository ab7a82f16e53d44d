"""The slowest data-parallel rank of an RL update's mini-batch: each optimizer step waits for every DP rank (the
gradient reduction joins them all), so a mini-batch lasts as long as the rank that drew the most tokens.

verl (volcengine/verl f6f910069, the trainer every engine runs under): RayPPOTrainer._balance_batch
(trainer.balance_batch, on by default) partitions the step's sequences over the ranks in equal counts balanced by
tokens (Karmarkar-Karp, get_seqlen_balanced_partitions(equal_size=True), each partition's indices sorted), so every
rank's step holds about the same tokens; the actor then splits its share into mini-batches in that order
(make_minibatch_iterator, DataProto.make_iterator with actor.shuffle false), the order of the rollout, not of the
lengths. One mini-batch of a rank is thus n of its B x n sequences taken without regard to length: its tokens vary
by the lengths' standard deviation x sqrt(n (B n - n) / (B n - 1)) (a sample without replacement from the rank's
balanced share), and the slowest of dp ranks draws the expected maximum of dp such draws: the mean plus that
deviation times the expected largest of dp standard normals (`expected_max_normal`, the normal approximation of a
sum of n lengths). One mini-batch (B = 1) is the balanced share itself: no straggler. Nothing fitted: the lengths'
spread is their shape's (rl/lengths.py) at the request's means. The rollout groups a prompt's samples next to each
other, so the ranks of one mini-batch draw from the same prompts: the prompts' common part of the spread is shared
and this is on the high side. Every layer's work is counted at the slowest rank's tokens, the routed experts' too
(an expert-parallel rank's experts take the tokens of its whole EP group, which spread less): on the high side as
well.

SkyRL (NovaSky-AI/SkyRL a9564572e) balances nothing: its trainer cuts each mini-batch (policy_mini_batch_size
prompts' consecutive sequences, compute_prompt_mini_batch_boundaries) into dp equal chunks of consecutive sequences
(MeshDispatch.stage_chunks, both the FSDP and the Megatron workers), so one rank's mini-batch is n sequences in
rollout order drawn from the whole rollout, not from a balanced share: its tokens vary by the lengths' standard
deviation x sqrt(n) whatever the mini-batches (`in_order`), one mini-batch a step included. The rollout keeps a
prompt's samples next to each other and a chunk takes them whole, so the chunk holds each of its prompts' lengths
min(n, samples) times: the prompts' part of the variance counts n x min(n, samples), the responses' n (independent
draws: a prompt whose samples run long together spreads more, so this is on the low side there). Simulated as
SkyRL cuts the step (bench/rl_stragglers.py) it is within 2% at 32 sequences a chunk or more and 3% at eight; a
chunk of a few sequences has the shape's skew, which the normal approximation leaves out (-12% to +20% at one).
Where the ranks meet at every micro-batch too (`sync_ranks` of them at each: FSDP's per-layer all-gathers and
reduce-scatters join every data-parallel rank, Megatron-Core's MoE all-to-all the data-parallel ranks of one expert-
parallel group; cards/frameworks/*.yaml rl.micro_batch_sync), each micro-batch of `micro_batch` sequences lasts as long
as the largest of that group's: the expected maximum of sync_ranks independent sums of micro_batch lengths, counted
exactly on a grid (`micro_batch_max`: the lengths' shapes cut into cells, the sum's distribution by convolution, the
maximum's by its CDF to the power sync_ranks), not by a normal approximation, which misses the shape's skew where a
micro-batch holds one or two sequences. The groups then meet at the mini-batch's end (the gradient reduction): the
slowest of dp / sync_ranks groups, each summing its micro-batches' maxima, by the normal approximation as above (a
sum of many), its spread the chunk's (the prompts shared, the balanced share) scaled to the micro-batches' maxima. A
micro-batch of more than EXACT_SEQUENCES sequences is near normal: its maximum is the normal approximation's.
Simulated as SkyRL cuts its chunks into micro-batches (bench/rl_stragglers.py: 1, 2 and 8 sequences, dp 8-32,
every rank or groups of 8 meeting) it is within 2%.
Where the micro-batches are packed to a token budget by a balanced partition (verl's use_dynamic_bsz, f6f910069:
rearrange_micro_batches splits each rank's mini-batch into the same count of micro-batches, the MAX over the ranks of
ceil(tokens / budget), by Karmarkar-Karp over their tokens and runs them in the order of their squares' sum, largest
first), a micro-batch holds whole sequences, so the bins are even only where each holds many: with one or two a bin,
a rank's micro-batches differ by a sequence's tokens, and where the ranks meet at every micro-batch each lasts as
long as its group's largest (`packed_slowest_share`). The bins are those of a typical set of the rank's sequences (the
lengths at their quantiles, `sequence_quantiles`, split as verl splits them, packing.karmarkar_karp_bins); every
rank sorts its own, so its m-th micro-batch is the m-th largest of its k keys, whose quantile spreads by
sqrt(p (1 - p) / k): the ranks' m-th micro-batches are drawn from the typical set's bins about position m
(`_positions_excess`), each plus its rank's share of the mini-batch's spread. Simulated as verl packs the Qwen3-30B-A3B
recipe's batch (bench/rl_stragglers.py: dp 8-32, 8 or every rank meeting) it is within 2% but where every prompt is
at its longest and the mean response near three quarters of the maximum (about 1.2 sequences a micro-batch: -2% to
-8%, on the low side); the residual over the mini-batch's slowest rank is 0-2% at 4 sequences a micro-batch and
10-20% at 1.5. From 62221fa13 the ranks' mini-batches are one quantile band of like shares and their micro-batches are
sorted by workload alike: simulated 0-1.2% over the mini-batch's slowest rank, which is none (no straggler timed).
"""

from __future__ import annotations

import math
from functools import cache
from itertools import pairwise

from meshplan.rl.lengths import length_variance, rate, survival
from meshplan.rl.packing import karmarkar_karp_bins, micro_batch_count, synced_count

_NORMAL_SPAN = 9.0  # the integral of expected_max_normal over [-span, span] standard deviations
_NORMAL_STEPS = 3600  # its midpoint steps (0.005 wide)
GRID_CELLS = 256  # cells of a micro-batch's longest tokens in micro_batch_max's grid (at least 16 a sequence)
EXACT_SEQUENCES = GRID_CELLS // 16  # micro-batches of more sequences: the normal approximation
RANK_NODES = 19  # cells of half a deviation (to 4.5) of a rank's own spread in _positions_excess
PACKED_SEQUENCES = 128  # a typical set's sequences at most in packed_slowest_share (its count scaled with them)


@cache
def max_normal_moments(k: int) -> tuple[float, float]:
    """(E, SD) of the largest of k independent standard normals: the integrals of x and x^2 against
    k phi(x) Phi(x)^(k-1), by the midpoint rule ((0, 1) for one)."""
    if k <= 1:
        return 0.0, 1.0
    width = 2 * _NORMAL_SPAN / _NORMAL_STEPS
    total = second = 0.0
    for i in range(_NORMAL_STEPS):
        x = -_NORMAL_SPAN + (i + 0.5) * width
        below = 0.5 * math.erfc(-x / math.sqrt(2))
        if below <= 0:
            continue
        density = k * math.exp(-x * x / 2 + (k - 1) * math.log(below)) / math.sqrt(2 * math.pi) * width
        total += x * density
        second += x * x * density
    return total, math.sqrt(max(0.0, second - total * total))


def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals] (max_normal_moments; 0 for one, 1 / sqrt(pi) for two)."""
    return max_normal_moments(k)[0]


def _cells(mean: int, longest: int, width: float) -> list[float] | None:
    """The shape's mass in each cell [i width, (i + 1) width) of [0, longest] (rl/lengths.py), a cell's mass at its
    middle; None where every length is the longest."""
    if mean >= longest:
        return None
    u = rate(mean / longest)
    edges = [min(1.0, i * width / longest) for i in range(math.ceil(longest / width) + 1)]
    return [survival(u, a) - survival(u, b) for a, b in pairwise(edges)]


def _convolve(a: list[float], b: list[float]) -> list[float]:
    """The distribution of the sum of two independent cell counts."""
    out = [0.0] * (len(a) + len(b) - 1)
    right = [(j, y) for j, y in enumerate(b) if y > 0]  # a prompt counted k times fills one cell in k
    for i, x in enumerate(a):
        if x > 0:
            for j, y in right:
                out[i + j] += x * y
    return out


def _power(a: list[float], times: int) -> list[float]:
    """The distribution of the sum of `times` independent draws of `a` (by squaring)."""
    out, base = [1.0], a
    while times:
        if times & 1:
            out = _convolve(out, base)
        times >>= 1
        if times:
            base = _convolve(base, base)
    return out


def _scaled(a: list[float], weight: int) -> list[float]:
    """The distribution of `weight` times one draw of `a`: a length counted weight times."""
    out = [0.0] * (weight * (len(a) - 1) + 1)
    for i, x in enumerate(a):
        out[weight * i] = x
    return out


@cache
def _micro_batch_cells(sequences: int, shared: int, prompt: int, response: int, mean_prompt: int,
                       mean_response: int) -> tuple[tuple[float, ...], float, float]:
    """The distribution of one micro-batch's tokens on a grid: its cells' masses, the tokens at cell 0 and the cell's
    width. `sequences` prompt + response lengths, the responses independent, the prompts in runs of `shared` (a
    prompt's samples next to each other at its one length; a last shorter run; a micro-batch that straddles two
    prompts' samples, where they are not a multiple of it, counted as within one: on the high side)."""
    width = sequences * (prompt + response) / GRID_CELLS
    prompts, responses = _cells(mean_prompt, prompt, width), _cells(mean_response, response, width)
    runs = [shared] * (sequences // shared) + ([sequences % shared] if sequences % shared else [])
    dist, start = [1.0], 0.0
    if responses is None:
        start += sequences * response
    else:
        dist, start = _power(responses, sequences), start + sequences * width / 2
    if prompts is None:
        start += sequences * prompt
    else:
        for run in set(runs):
            dist = _convolve(dist, _power(_scaled(prompts, run), runs.count(run)))
        start += sequences * width / 2
    return tuple(dist), start, width


def _largest_of(dist: list[float] | tuple[float, ...], start: float, width: float,
                ranks: int) -> tuple[float, float]:
    """The mean and variance of the largest of `ranks` independent draws of a distribution on a grid (cell k at
    start + k width): E[max] = sum of x (F(x)^ranks - F(x-)^ranks) over the cells, exact for the cells'
    distribution."""
    first = second = below = cumulative = 0.0
    for k, mass in enumerate(dist):
        cumulative = min(1.0, cumulative + mass)
        top = cumulative ** ranks
        x = start + k * width
        first += x * (top - below)
        second += x * x * (top - below)
        below = top
    return first, max(0.0, second - first * first)


@cache
def micro_batch_max(ranks: int, sequences: int, shared: int, prompt: int, response: int, mean_prompt: int,
                    mean_response: int) -> tuple[float, float]:
    """The mean and variance, tokens, of the largest of `ranks` independent micro-batches' tokens, each `sequences`
    prompt + response lengths from their shapes (prompts in runs of `shared`, `_micro_batch_cells`), `_largest_of`
    over the grid."""
    return _largest_of(*_micro_batch_cells(sequences, shared, prompt, response, mean_prompt, mean_response), ranks)


def sequence_quantiles(count: int, prompt: int, response: int, mean_prompt: int, mean_response: int) -> list[int]:
    """`count` prompt + response lengths at the quantiles (i + 0.5) / count of one sequence's tokens (their shapes
    summed on `_micro_batch_cells`' grid, each at its cell's middle): a typical set of `count` sequences, ascending."""
    dist, start, width = _micro_batch_cells(1, 1, prompt, response, mean_prompt, mean_response)
    out, cumulative, cell = [], dist[0], 0
    for i in range(count):
        while cumulative < (i + 0.5) / count and cell < len(dist) - 1:
            cell += 1
            cumulative += dist[cell]
        out.append(max(1, round(start + cell * width)))
    return out


def _positions_excess(ranks: int, bins: list[tuple[int, int]], rank_sd: float) -> float:
    """The sum over a mini-batch's micro-batches of the expected largest across `ranks` ranks of each one's tokens
    over the mean rank's (0 for one rank). `bins` are one rank's micro-batches (tokens, sort key), which every rank
    runs in the order of their keys, largest first: a rank's m-th is its m-th largest key of k, an order statistic
    whose quantile spreads by sqrt(p (1 - p) / k) (p = (m + 0.5) / k), so the ranks' m-th micro-batches are the
    typical set's bins about position m, weighted as a normal of sqrt(p (1 - p) k) positions (to 4 of them), each
    plus its rank's own share of the mini-batch's spread (a normal of `rank_sd` tokens, in RANK_NODES cells of half a
    deviation); the largest of `ranks` such draws taken exactly, as `_largest_of` takes it."""
    tokens = [t for t, _ in sorted(bins, key=lambda b: b[1], reverse=True)]
    k = len(tokens)
    half = RANK_NODES // 2
    cells = [0.5 * math.erfc(-(j - 0.5) * 0.5 / math.sqrt(2)) for j in range(-half, half + 2)]
    nodes = [(0.0, 1.0)]
    if rank_sd > 0:  # the cells' masses over their whole (the tails past 4.75 deviations left out)
        nodes = [(j * 0.5 * rank_sd, (b - a) / (cells[-1] - cells[0]))
                 for j, (a, b) in zip(range(-half, half + 1), pairwise(cells), strict=True)]
    excess = 0.0
    for m in range(k):
        p = (m + 0.5) / k
        sd = math.sqrt(p * (1 - p) * k)
        near = range(max(0, math.floor(m - 4 * sd)), min(k, math.ceil(m + 4 * sd) + 1))
        weights = [math.exp(-((j - m) ** 2) / (2 * sd * sd)) for j in near]
        whole = sum(weights)
        draws = sorted((tokens[j] + a, w * mass / whole) for j, w in zip(near, weights, strict=True)
                       for a, mass in nodes)
        below = cumulative = 0.0
        for x, mass in draws:
            cumulative = min(1.0, cumulative + mass)
            top = cumulative ** ranks
            excess += x * (top - below)
            below = top
        excess -= sum(tokens[j] * w for j, w in zip(near, weights, strict=True)) / whole  # one rank's: its mean
    return excess


@cache
def packed_slowest_share(dp: int, sync_ranks: int, sequences: int, mini_batches: int, budget: int, prompt: int,
                         response: int, mean_prompt: int, mean_response: int, divisor: int = 1) -> float:
    """The slowest rank's time over the mean rank's tokens of a mini-batch that every rank packs to `budget` tokens a
    micro-batch while `sync_ranks` ranks meet at every micro-batch, each lasting as long as its group's largest, and
    the groups meet at the mini-batch's end (verl f6f910069 rearrange_micro_batches: the count ceil(tokens / budget),
    the MAX over the ranks, rounded up to a multiple of `divisor`, rl/packing.py; the rank's `sequences` split into
    that many bins by Karmarkar-Karp over their tokens, run in the order of their squares' sum, largest first). A
    rank's mini-batch is `sequences` of its balanced share in rollout order, spread as `slowest_rank_share` spreads it;
    its bins are those of a typical set (`sequence_quantiles`) and each micro-batch waits for its group's largest
    (`_positions_excess`); the slowest of dp / sync_ranks groups adds the normal approximation of the largest of
    their sums, each group's the largest of its ranks' spread (max_normal_moments' deviation). At least the
    mini-batch's slowest rank. 1.0 with one rank in a group or every length at its longest."""
    group = min(sync_ranks, dp)
    prompts, responses = length_variance(mean_prompt, prompt), length_variance(mean_response, response)
    if group <= 1 or sequences < 1 or prompts + responses <= 0:
        return 1.0
    n = min(sequences, PACKED_SEQUENCES)  # the bins drawn at this many sequences, the count scaled with them
    lengths = sequence_quantiles(n, prompt, response, mean_prompt, mean_response)
    whole = mini_batches * sequences
    spread = math.sqrt((prompts + responses) * sequences * (whole - sequences) / max(1, whole - 1))
    mean = sum(lengths) * sequences / n
    most = mean + expected_max_normal(dp) * spread  # the mini-batch's slowest rank, whose count every rank runs
    count = synced_count([micro_batch_count(math.ceil(most), sequences, budget)], sequences, divisor)
    bins = karmarkar_karp_bins(lengths, max(1, min(n, round(count * n / sequences))), by_workload=False)
    excess = _positions_excess(group, [(t, q) for _, t, q in bins], spread / count) * count / len(bins)
    groups = expected_max_normal(dp // group) * spread * max_normal_moments(group)[1] if dp > group else 0.0
    return max(most, mean + excess + groups) / mean


def slowest_rank_share(dp: int, sequences: int, mini_batches: int, prompt: int, response: int,
                       mean_prompt: int, mean_response: int, *, in_order: bool = False,
                       samples_per_prompt: int = 1, micro_batch: int = 0, sync_ranks: int = 1) -> float:
    """The expected tokens of the slowest of `dp` ranks' mini-batch over the mean rank's, where each rank runs
    `sequences` of the step's prompt + response sequences per mini-batch, `mini_batches` of them a step, its step's
    share balanced by tokens, or with `in_order` its mini-batch `sequences` consecutive ones of the rollout, a prompt's
    `samples_per_prompt` next to each other, with no balancing; with `sync_ranks` > 1, groups of that many ranks
    meeting at every micro-batch of `micro_batch` sequences, each lasting as long as the group's largest (see the
    module's docstring); prompt and response lengths drawn from their shapes on [0, prompt] and [0, response] with the
    means given. 1.0 with one rank, one balanced mini-batch met only at its end, or every length at its longest."""
    micro = min(micro_batch, sequences) if sync_ranks > 1 else 0
    if dp <= 1 or (mini_batches <= 1 and not in_order and not micro) or sequences < 1:
        return 1.0
    prompts, responses = length_variance(mean_prompt, prompt), length_variance(mean_response, response)
    if prompts + responses <= 0:
        return 1.0
    if in_order:  # independent draws, each prompt's length min(n, samples) times over
        spread = math.sqrt(sequences * (responses + min(sequences, samples_per_prompt) * prompts))
    else:
        share = mini_batches * sequences  # the rank's step: one mini-batch is `sequences` of these
        spread = math.sqrt((prompts + responses) * sequences * (share - sequences) / max(1, share - 1))
    mean = sequences * (mean_prompt + mean_response)
    if not micro:
        return 1.0 + expected_max_normal(dp) * spread / mean
    group = min(sync_ranks, dp)
    shared = min(micro, samples_per_prompt) if in_order else 1
    if micro <= EXACT_SEQUENCES:
        top, var = micro_batch_max(group, micro, shared, prompt, response, mean_prompt, mean_response)
    else:  # a sum of many: the normal approximation (its variance that of the sum, a lower bound of the maximum's)
        var = micro * (responses + shared * prompts)
        top = micro * (mean_prompt + mean_response) + expected_max_normal(group) * math.sqrt(var)
    count = sequences / micro  # the rank's micro-batches (a last, smaller one counted as its share)
    # the groups' sums of micro-batch maxima spread as the chunk does (its prompts shared, its balanced share) over
    # independent micro-batches
    scale = spread * spread / (sequences * (responses + shared * prompts))
    slowest = count * top + expected_max_normal(dp // group) * math.sqrt(count * var * scale)
    return slowest / mean
