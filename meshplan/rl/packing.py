"""The largest micro-batch a token-budget packing makes: verl's use_dynamic_bsz (utils/seqlen_balancing.py
rearrange_micro_batches) splits one rank's mini-batch into k = min(n, ceil(tokens / budget)) micro-batches
balanced by Karmarkar-Karp over each sequence's workload (24576 s + s^2), not capped at the budget: one can exceed it.

The proven bound is loose: Karmarkar-Karp's merges never widen a state's spread beyond its widest input (a decreasing
and an increasing sequence added), so the heaviest bin's workload is at most the mean plus one sequence's, which in
tokens allows up to budget + s_max + s_max (s_max + budget) / 24576, near three budgets at s_max = budget ~ 10K.
What the update holds is the expected largest micro-batch at the request's lengths: sequences drawn from the
maximum-entropy length shapes (rl/lengths.py) for the prompts and responses, partitioned as verl does, the largest
micro-batch's tokens averaged over a few seeded draws (deterministic). Every length at its maximum packs at most the
budget where the budget is a multiple of the sequence (equal items split into k bins hold ceil(n / k) each).

The count is then synced as rearrange_micro_batches syncs it (verl b178a3cd5): same_micro_num_in_dp all_reduces it
with MAX (the legacy Megatron actor and FSDP's prepare_dynamic_batch over the world group, whose model-parallel peers
hold their data-parallel rank's batch; the Megatron engine over the DP group: both are the MAX over the DP ranks),
and where virtual pipeline stages interleave (vpp > 1) num_batches_divided_by = microbatch_group_size_per_vp_stage
(Megatron's default: the pipeline size) rounds it up to a multiple (workers/actor/megatron_actor.py update_policy /
compute_log_prob, workers/engine/megatron/transformer_impl.py). Every rank packs to the larger count, so its largest
micro-batch shrinks. The expected MAX is drawn: each draw packs min(dp, MOST_RANKS) ranks' lengths independently.
"""

from __future__ import annotations

import heapq
import math
import random
from functools import cache

from meshplan.rl.lengths import quantile, rate

WORKLOAD_PER_TOKEN = 24576  # verl calculate_workload: 24576 * seqlen + seqlen**2 (a 7B model's 12 h^2 / 2 h)
DRAWS = 16  # seeded draws averaged
MOST_SEQUENCES = 256  # sequences simulated per draw at most (the micro-batch count scaled with them)
MOST_RANKS = 8  # data-parallel ranks whose counts are drawn for the MAX at most (past it the max grows slowly)


def workload(tokens: int) -> int:
    """verl's calculate_workload of one sequence."""
    return WORKLOAD_PER_TOKEN * tokens + tokens * tokens


def micro_batch_count(tokens: int, sequences: int, budget: int) -> int:
    """rearrange_micro_batches' count: min(sequences, ceil(tokens / budget)), at least one."""
    return max(1, min(sequences, -(-tokens // budget)))


def synced_count(counts: list[int], sequences: int, divisor: int = 1) -> int:
    """The count every rank runs: the MAX of the DP ranks' counts (same_micro_num_in_dp), rounded up to a multiple of
    num_batches_divided_by (verl roundup_divisible), at most the rank's sequences (verl asserts it)."""
    return min(sequences, -(-max(counts) // divisor) * divisor)


def karmarkar_karp_bins(lengths: list[int], k: int, by_workload: bool = True) -> list[tuple[int, int, int]]:
    """The k bins (weight, tokens, squares: the sum of their sequences' tokens squared) that `lengths` are split into
    by the largest differencing method (verl karmarkar_karp, equal_size False) over each sequence's weight, its
    workload (verl since 62221fa13, calculate_workload) or with `by_workload` false its tokens (before it): each state
    k sums sorted by weight descending; the two states of widest spread merge, the largest sums of one with the
    smallest of the other."""
    heap = []
    for i, s in enumerate(sorted(lengths)):
        sets = [(workload(s) if by_workload else s, s, s * s)] + [(0, 0, 0)] * (k - 1)
        heapq.heappush(heap, (-(sets[0][0]), -sets[0][0], i, sets))
    serial = len(lengths)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[3], heapq.heappop(heap)[3]
        pairs = zip(a, reversed(b), strict=True)
        merged = sorted(((wa + wb, ta + tb, qa + qb) for (wa, ta, qa), (wb, tb, qb) in pairs), reverse=True)
        serial += 1
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), -merged[0][0], serial, merged))
    return heap[0][3]


def karmarkar_karp_largest(lengths: list[int], k: int) -> int:
    """The tokens of the heaviest-token bin when `lengths` are split into k bins over their workloads
    (karmarkar_karp_bins)."""
    return max(t for _, t, _ in karmarkar_karp_bins(lengths, k))


def _draw(rng: random.Random, u: float | None, top: int) -> int:
    """One length on [1, top] from the maximum-entropy shape of rate u (None: every length at top)."""
    return top if u is None else max(1, round(top * quantile(u, rng.random())))


def largest_micro_batch_tokens(budget: int, sequences: int, prompt: int, response: int,
                               mean_prompt: int, mean_response: int, dp: int = 1, divisor: int = 1) -> int:
    """The expected largest micro-batch's tokens when one rank's `sequences` (prompt + response, each at most
    prompt / response tokens, means mean_prompt / mean_response) are packed to `budget` tokens as verl's
    rearrange_micro_batches packs them, the count the MAX over `dp` ranks rounded up to a multiple of `divisor`.
    Raises ValueError where the budget is below the longest sequence (verl asserts max_token_len >= max_seq_len)."""
    return packed_micro_batches(budget, sequences, prompt, response, mean_prompt, mean_response, dp, divisor)[0]


def packed_micro_batch_count(budget: int, sequences: int, prompt: int, response: int,
                             mean_prompt: int, mean_response: int, dp: int = 1, divisor: int = 1) -> int:
    """How many micro-batches one rank's `sequences` are packed into (the synced count, expected over the same draws,
    rounded up): what verl hands Megatron-Core's forward_backward_func as num_microbatches for the mini-batch, so what
    bounds the micro-batches a pipeline stage holds (1F1B: min(m, pp - r))."""
    return packed_micro_batches(budget, sequences, prompt, response, mean_prompt, mean_response, dp, divisor)[1]


@cache
def packed_micro_batches(budget: int, sequences: int, prompt: int, response: int,
                         mean_prompt: int, mean_response: int, dp: int = 1, divisor: int = 1) -> tuple[int, int]:
    """(largest micro-batch tokens, micro-batch count) of one rank's mini-batch packed as rearrange_micro_batches
    packs it (largest_micro_batch_tokens, packed_micro_batch_count): both expected over the same seeded draws."""
    if budget < prompt + response:
        raise ValueError(f"a token budget of {budget} per micro-batch is below the longest sequence "
                         f"({prompt} + {response} tokens): verl's rearrange_micro_batches asserts max_token_len >= "
                         "the sequence length")
    up = None if mean_prompt >= prompt else rate(mean_prompt / prompt)
    ur = None if mean_response >= response else rate(mean_response / response)
    if up is None and ur is None:
        seq = prompt + response
        k = synced_count([micro_batch_count(sequences * seq, sequences, budget)], sequences, divisor)
        return -(-sequences // k) * seq, k
    n = min(sequences, MOST_SEQUENCES)
    rng = random.Random(f"{budget}/{sequences}/{prompt}/{response}/{mean_prompt}/{mean_response}"
                        + ("" if dp == 1 and divisor == 1 else f"/{dp}/{divisor}"))
    total = counts = 0
    for _ in range(DRAWS):
        ranks = [[_draw(rng, up, prompt) + _draw(rng, ur, response) for _ in range(n)]
                 for _ in range(min(dp, MOST_RANKS))]
        # each rank's whole count, synced, then scaled to the sequences simulated
        whole = synced_count([micro_batch_count(math.ceil(sum(r) * sequences / n), sequences, budget) for r in ranks],
                             sequences, divisor)
        counts += whole
        k = max(1, min(n, round(whole * n / sequences)))
        total += karmarkar_karp_largest(ranks[0], k)
    return math.ceil(total / DRAWS), math.ceil(counts / DRAWS)
