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
Where the micro-batches are packed to a token budget by a balanced partition (verl's use_dynamic_bsz:
rearrange_micro_batches splits each rank's mini-batch into the same count of micro-batches balanced by tokens and sorts
them by the squares' sum), the rank's micro-batches hold about equal shares of its mini-batch, so every micro-batch's
slowest rank is about the mini-batch's slowest rank: the caller counts that alone (bench/rl_stragglers.py simulates the
partition: the per-micro-batch maxima add 0-6% over it, the partition's residual, left out: on the low side).
"""

from __future__ import annotations

import math
from functools import cache
from itertools import pairwise

from meshplan.rl.lengths import length_variance, rate, survival

_NORMAL_SPAN = 9.0  # the integral of expected_max_normal over [-span, span] standard deviations
_NORMAL_STEPS = 3600  # its midpoint steps (0.005 wide)
GRID_CELLS = 256  # cells of a micro-batch's longest tokens in micro_batch_max's grid (at least 16 a sequence)
EXACT_SEQUENCES = GRID_CELLS // 16  # micro-batches of more sequences: the normal approximation


@cache
def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals]: the integral of x k phi(x) Phi(x)^(k-1), by the midpoint rule
    (0 for one; 1 / sqrt(pi) for two)."""
    if k <= 1:
        return 0.0
    width = 2 * _NORMAL_SPAN / _NORMAL_STEPS
    total = 0.0
    for i in range(_NORMAL_STEPS):
        x = -_NORMAL_SPAN + (i + 0.5) * width
        below = 0.5 * math.erfc(-x / math.sqrt(2))
        if below <= 0:
            continue
        total += x * k * math.exp(-x * x / 2 + (k - 1) * math.log(below)) / math.sqrt(2 * math.pi) * width
    return total


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


@cache
def micro_batch_max(ranks: int, sequences: int, shared: int, prompt: int, response: int, mean_prompt: int,
                    mean_response: int) -> tuple[float, float]:
    """The mean and variance, tokens, of the largest of `ranks` independent micro-batches' tokens, each `sequences`
    prompt + response lengths from their shapes (prompts in runs of `shared`, `_micro_batch_cells`): E[max] =
    sum of x (F(x)^ranks - F(x-)^ranks) over the grid's cells, exact for the cells' distribution."""
    dist, start, width = _micro_batch_cells(sequences, shared, prompt, response, mean_prompt, mean_response)
    first = second = below = cumulative = 0.0
    for k, mass in enumerate(dist):
        cumulative = min(1.0, cumulative + mass)
        top = cumulative ** ranks
        x = start + k * width
        first += x * (top - below)
        second += x * x * (top - below)
        below = top
    return first, max(0.0, second - first * first)


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
