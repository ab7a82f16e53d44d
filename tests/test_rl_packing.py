"""verl's use_dynamic_bsz packs micro-batches to a token budget by a balanced partition with no cap (utils/
seqlen_balancing.py rearrange_micro_batches): meshplan/rl/packing.py's expected largest micro-batch against a
partitioner written here from verl's description, the RL memory sized at it, and a budget below one sequence refused."""

from __future__ import annotations

import random
import statistics

import pytest

from meshplan import api
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.lengths import quantile, rate
from meshplan.rl.memory import packed_tokens
from meshplan.rl.packing import largest_micro_batch_tokens


def differencing(lengths: list[int], k: int) -> list[list[int]]:
    """Largest differencing into k bins over 24576 s + s^2: every sequence its own partial partition (k bins, one
    holding it); repeatedly the two partials of widest spread are joined, the heaviest bin of one with the lightest of
    the other. Returns the bins' lengths."""
    partials = [[[s]] + [[] for _ in range(k - 1)] for s in sorted(lengths)]

    def weight(b):
        return sum(24576 * s + s * s for s in b)

    def spread(p):
        w = [weight(b) for b in p]
        return max(w) - min(w)

    while len(partials) > 1:
        partials.sort(key=spread)
        a, b = partials.pop(), partials.pop()
        a.sort(key=weight, reverse=True)
        b.sort(key=weight)
        partials.append([x + y for x, y in zip(a, b, strict=True)])
    return partials[0]


def verl_largest(rng, n, budget, prompt, response, mean_prompt, mean_response) -> int:
    up, ur = rate(mean_prompt / prompt), rate(mean_response / response)
    lengths = [max(1, round(prompt * quantile(up, rng.random()))) + max(1, round(response * quantile(ur, rng.random())))
               for _ in range(n)]
    k = min(n, -(-sum(lengths) // budget))
    bins = differencing(lengths, k)
    assert sorted(s for b in bins for s in b) == sorted(lengths) and all(bins)
    return max(sum(b) for b in bins)


@pytest.mark.parametrize("mean_prompt, mean_response, n", [(1000, 2000, 64), (1000, 4000, 64), (600, 1200, 96)])
def test_the_expected_largest_micro_batch_is_the_simulated_one(mean_prompt, mean_response, n):
    budget, prompt, response = 10240, 2048, 8192
    rng = random.Random(7)
    draws = [verl_largest(rng, n, budget, prompt, response, mean_prompt, mean_response) for _ in range(24)]
    ours = largest_micro_batch_tokens(budget, n, prompt, response, mean_prompt, mean_response)
    assert max(draws) > budget and ours > budget  # balanced, not capped
    assert ours == pytest.approx(statistics.mean(draws), rel=0.03)
    assert ours < budget + prompt + response  # below the mean-plus-one-sequence bound of a token partition


def test_every_sequence_at_the_maximum_fits_the_budget():
    assert largest_micro_batch_tokens(3 * 10240, 50, 2048, 8192, 2048, 8192) == 3 * 10240
    # a budget not a multiple of the sequence: ceil(50 x 10240 / 25000) = 21 micro-batches of 50 equal sequences
    # hold three in some, past the budget, as verl packs them
    assert largest_micro_batch_tokens(25000, 50, 2048, 8192, 2048, 8192) == 3 * 10240
    # the round-up to a multiple of 4 (vpp's microbatch_group_size_per_vp_stage): 17 -> 20 bins, three at most
    assert largest_micro_batch_tokens(3 * 10240, 50, 2048, 8192, 2048, 8192, divisor=4) == 3 * 10240
    # ceil(10 / 3) = 4 -> 8 bins of 10: two at most
    assert largest_micro_batch_tokens(3 * 10240, 10, 2048, 8192, 2048, 8192, divisor=8) == 2 * 10240


def test_a_budget_below_the_longest_sequence_is_refused():
    with pytest.raises(ValueError, match="asserts max_token_len >= the sequence length"):
        largest_micro_batch_tokens(8000, 50, 2048, 8192, 1000, 2000)


VERL = {"model": "qwen2.5-7b", "gpu": "h20", "framework": "verl", "num_gpus": 16, "tp": 2, "pp": 2, "job": "rl",
        "algorithm": "grpo", "prompts_per_step": 64, "samples_per_prompt": 8, "prompt_length": 2048,
        "response_length": 8192, "rollout_tp": 2, "micro_batch_size": 1}


def test_the_rl_memory_sizes_the_update_at_the_largest_micro_batch():
    full = api.estimate_memory(parse_request(VERL))
    short = api.estimate_memory(parse_request({**VERL, "mean_response_length": 3000, "mean_prompt_length": 1000}))
    job, plan = resolve(parse_request({**VERL, "mean_response_length": 3000, "mean_prompt_length": 1000}))
    tokens = packed_tokens(job, plan)
    assert tokens > 10240
    update = {p.phase: p for p in short.phases}["actor_update"]
    assert update.detail["micro_batch_tokens"] == tokens
    assert {p.phase: p for p in full.phases}["actor_update"].detail["micro_batch_tokens"] == 10240
    # the colocated rollout's engine may decide the step's peak; the update's phase grows with its micro-batch
    assert update.peak_bytes > {p.phase: p for p in full.phases}["actor_update"].peak_bytes
    assert any(f"the largest holds {tokens}" in a for a in short.assumptions)


def test_the_partition_is_the_differencing_one_and_within_one_sequence_of_the_mean():
    """meshplan's partitioner against the one written here, and the proven bound: the heaviest bin's workload is at
    most the mean bin's plus the heaviest sequence's (each merge adds a decreasing and an increasing sequence)."""
    from meshplan.rl.packing import karmarkar_karp_largest, workload

    rng = random.Random(3)
    for _ in range(20):
        lengths = [rng.randint(50, 10240) for _ in range(rng.randint(8, 60))]
        k = rng.randint(2, len(lengths) // 2)
        bins = differencing(lengths, k)
        assert karmarkar_karp_largest(lengths, k) == max(sum(b) for b in bins)
        weights = [sum(workload(s) for s in b) for b in bins]
        assert max(weights) <= sum(weights) / k + max(workload(s) for s in lengths)


def fast_differencing_largest(lengths: list[int], k: int) -> int:
    """The same differencing with a heap of partials keyed by spread (for a rank's full mini-batch): the heaviest-
    token bin."""
    import heapq

    heap = [(-(24576 * s + s * s), n, [(24576 * s + s * s, s)] + [(0, 0)] * (k - 1)) for n, s in enumerate(lengths)]
    heapq.heapify(heap)
    count = len(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        a, b = sorted(a, reverse=True), sorted(b)
        joined = sorted((wa + wb, ta + tb) for (wa, ta), (wb, tb) in zip(a, b, strict=True))
        count += 1
        heapq.heappush(heap, (joined[0][0] - joined[-1][0], count, joined))
    return max(t for _, t in heap[0][2])


def test_a_rank_of_more_sequences_than_simulated_is_scaled_to_them():
    """Over MOST_SEQUENCES the function simulates that many at the rank's micro-batches per sequence: close to the
    whole rank's partition."""
    budget, prompt, response, n = 10240, 2048, 8192, 768
    up, ur = rate(1000 / prompt), rate(2000 / response)
    rng = random.Random(11)
    draws = []
    for _ in range(6):
        lengths = [max(1, round(prompt * quantile(up, rng.random())))
                   + max(1, round(response * quantile(ur, rng.random()))) for _ in range(n)]
        draws.append(fast_differencing_largest(lengths, min(n, -(-sum(lengths) // budget))))
    assert largest_micro_batch_tokens(budget, n, prompt, response, 1000, 2000) == pytest.approx(
        statistics.mean(draws), rel=0.04)


def verl_synced_largest(rng, n, dp, divisor, budget, prompt, response, mean_prompt, mean_response) -> int:
    """verl's rearrange_micro_batches over dp ranks: each rank's count min(n, ceil(tokens / budget)), all_reduce MAX
    (same_micro_num_in_dp), roundup_divisible by num_batches_divided_by, then rank 0 partitioned into that count."""
    up, ur = rate(mean_prompt / prompt), rate(mean_response / response)
    ranks = [[max(1, round(prompt * quantile(up, rng.random()))) + max(1, round(response * quantile(ur, rng.random())))
              for _ in range(n)] for _ in range(dp)]
    k = max(min(n, -(-sum(r) // budget)) for r in ranks)
    if k % divisor:
        k += divisor - k % divisor
    assert k <= n
    return max(sum(b) for b in differencing(ranks[0], k))


@pytest.mark.parametrize("dp, divisor", [(4, 1), (1, 4), (4, 4)])
def test_the_count_is_the_max_over_dp_rounded_up_to_the_divisor(dp, divisor):
    budget, prompt, response, n, mean_prompt, mean_response = 10240, 2048, 8192, 64, 1000, 2000
    rng = random.Random(11)
    draws = [verl_synced_largest(rng, n, dp, divisor, budget, prompt, response, mean_prompt, mean_response)
             for _ in range(24)]
    ours = largest_micro_batch_tokens(budget, n, prompt, response, mean_prompt, mean_response, dp, divisor)
    alone = largest_micro_batch_tokens(budget, n, prompt, response, mean_prompt, mean_response)
    # the largest's spread over draws is ~5%: 16 draws against 24 agree within three standard errors at 5%
    assert ours == pytest.approx(statistics.mean(draws), rel=0.05)
    assert ours < alone  # more, smaller micro-batches than one rank alone draws


def test_synced_count_is_the_max_rounded_up_and_capped_at_the_sequences():
    from meshplan.rl.packing import synced_count
    assert synced_count([5, 7, 6], 64) == 7
    assert synced_count([5, 7, 6], 64, divisor=4) == 8
    assert synced_count([5, 7, 6], 64, divisor=8) == 8
    assert synced_count([61, 62], 64, divisor=8) == 64
