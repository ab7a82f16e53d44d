"""meshplan's slowest data-parallel rank of an RL update's mini-batch (meshplan/rl/stragglers.py slowest_rank_share,
a normal approximation) against verl's own procedure simulated: the step's sequences partitioned over the ranks by
Karmarkar-Karp in equal counts (verl f6f910069 verl/utils/seqlen_balancing.py karmarkar_karp(equal_size=True), as
RayPPOTrainer._balance_batch calls it, each partition's indices sorted), then each rank's share cut into mini-batches
in that order (make_minibatch_iterator, shuffle false); the figure is the slowest rank's tokens over the mean rank's,
averaged over every mini-batch of a few seeded steps. Lengths from meshplan's shapes (rl/lengths.py quantile) at the
means given; `grouped` gives a prompt's samples one prompt length (the rollout keeps them next to each other), the
case the formula leaves on the high side. Nothing fitted.

SkyRL's (NovaSky-AI/SkyRL a9564572e) simulated too: the step in rollout order, a prompt's samples next to each other
at one prompt length, cut into mini-batches of consecutive prompts (skyrl/train/dataset/preprocess.py
compute_prompt_mini_batch_boundaries) and each into dp equal chunks of consecutive sequences
(skyrl/backends/skyrl_train/distributed/dispatch.py MeshDispatch.stage_chunks: mini_batch.chunk(size // dp_size)),
against the formula's in_order case.

Where the engine joins ranks at every micro-batch (cards/frameworks/*.yaml rl.micro_batch_sync: FSDP every rank,
Megatron-Core's MoE all-to-all an expert-parallel group), each rank's chunk is cut into micro-batches as SkyRL cuts it
(skyrl/backends/skyrl_train/workers/worker_utils.py SampleBasedBatchIterator:
data.chunk(micro_train_batch_size_per_gpu), consecutive sequences), every micro-batch lasts as long as its group's
largest and the groups meet at the mini-batch's end: the formula's micro_batch case against it. verl's token-budget
micro-batches (verl f6f910069 verl/utils/seqlen_balancing.py rearrange_micro_batches: the count ceil(tokens / budget)
MAX over the ranks, Karmarkar-Karp equal_size False over the lengths, the micro-batches sorted by their squares' sum,
longest first) are simulated likewise, 8 or every rank meeting at each micro-batch, against meshplan's
packed_slowest_share; and as verl packs them from 62221fa13 (b178a3cd5: shares and micro-batches balanced by
calculate_workload, each share sorted by it and laid out share[::2] + share[1::2][::-1], the micro-batches sorted by
it and laid out bins[::2][::-1] + bins[1::2]), where meshplan times no straggler.

Run: python bench/rl_stragglers.py   (the Qwen3-30B-A3B recipe's batch: 512 prompts x 16 in mini-batches of 128;
about five minutes)
"""

from __future__ import annotations

import heapq
import random
import statistics

from meshplan.rl.lengths import quantile, rate
from meshplan.rl.stragglers import packed_slowest_share, slowest_rank_share

PROMPT, RESPONSE = 2048, 8192  # bench/data/rl_workloads.yaml run_qwen3moe-30b_megatron_96gb.sh
PROMPTS, SAMPLES, MINI_PROMPTS = 512, 16, 128
STEPS = 3  # seeded steps drawn per case


def equal_size_karmarkar_karp(lengths: list[int], k: int) -> list[list[int]]:
    """verl's karmarkar_karp(equal_size=True): the lengths sorted, every k consecutive ones a state of k one-item
    sets; the two states of widest spread merged (the largest sets of one with the smallest of the other) until one
    is left; its sets' indices, each sorted (_check_and_sort_partitions)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    states = [sorted(([lengths[i], [i]] for i in order[offset:offset + k]), key=lambda s: s[0], reverse=True)
              for offset in range(0, len(order), k)]
    return [sorted(items) for _, items in _merged_states(states)]


def _merged_states(states: list[list[list]]) -> list[list]:
    """verl's karmarkar_karp loop over its initial states (each k [sum, indices] sets, largest first): the two states
    of widest spread merged, the largest sets of one with the smallest of the other, until one is left."""
    heap = [(-(sets[0][0] - sets[-1][0]), serial, sets) for serial, sets in enumerate(states)]
    heapq.heapify(heap)
    serial = len(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap)[2], heapq.heappop(heap)[2]
        merged = sorted(([sa + sb, ia + ib] for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)),
                        key=lambda s: s[0], reverse=True)
        serial += 1
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), serial, merged))
    return heap[0][2]


def _step_lengths(rng: random.Random, up: float | None, ur: float, grouped: bool) -> list[int]:
    """One step's sequence lengths in rollout order, PROMPTS x SAMPLES, a prompt's samples next to each other; `up`
    None: every prompt at PROMPT; `grouped`: a prompt's samples share its length."""
    lengths = []
    for _ in range(PROMPTS):
        prompt = PROMPT if up is None else max(1, round(PROMPT * quantile(up, rng.random())))
        for _ in range(SAMPLES):
            if up is not None and not grouped:
                prompt = max(1, round(PROMPT * quantile(up, rng.random())))
            lengths.append(prompt + max(1, round(RESPONSE * quantile(ur, rng.random()))))
    return lengths


def _seeded_steps(key: str, mean_prompt: int, mean_response: int, steps: int = STEPS, grouped: bool = True,
                  suffix: str = ""):
    """Each of `steps` seeded steps' lengths in rollout order (_step_lengths), step `step`'s generator seeded by
    f"{key}/{step}{suffix}": the one draw every simulation below makes, each under its own key."""
    up = None if mean_prompt >= PROMPT else rate(mean_prompt / PROMPT)
    ur = rate(mean_response / RESPONSE)
    for step in range(steps):
        yield _step_lengths(random.Random(f"{key}/{step}{suffix}"), up, ur, grouped)


def simulated(dp: int, mean_prompt: int, mean_response: int, grouped: bool) -> float:
    """The slowest rank's tokens over the mean rank's, averaged over every mini-batch of STEPS seeded steps."""
    ratios = []
    for lengths in _seeded_steps(f"{dp}/{mean_prompt}/{mean_response}/{grouped}", mean_prompt, mean_response,
                                 grouped=grouped):
        shares = equal_size_karmarkar_karp(lengths, dp)
        per_mini = MINI_PROMPTS * SAMPLES // dp
        for k in range(PROMPTS // MINI_PROMPTS):
            tokens = [sum(lengths[i] for i in share[k * per_mini:(k + 1) * per_mini]) for share in shares]
            ratios.append(max(tokens) / statistics.mean(tokens))
    return statistics.mean(ratios)


def skyrl_chunks(lengths: list[int], dp: int, mini_sequences: int) -> list[list[list[int]]]:
    """SkyRL's partition of one step's lengths (in rollout order): the mini-batches, contiguous slices of
    mini_sequences (compute_prompt_mini_batch_boundaries: mini_batch_size prompts x n_samples_per_prompt), each
    chunked into dp equal slices of consecutive sequences, DP rank r's the r-th (MeshDispatch.stage_chunks)."""
    minis = [lengths[start:start + mini_sequences] for start in range(0, len(lengths), mini_sequences)]
    return [[mini[r * (len(mini) // dp):(r + 1) * (len(mini) // dp)] for r in range(dp)] for mini in minis]


def skyrl_simulated(dp: int, mean_prompt: int, mean_response: int, mini_prompts: int = MINI_PROMPTS) -> float:
    """The slowest rank's tokens over the mean rank's under SkyRL's partition, averaged over every mini-batch of
    STEPS seeded steps (a prompt's samples at one prompt length, as SkyRL's rollout makes them)."""
    ratios = []
    for lengths in _seeded_steps(f"skyrl/{dp}/{mean_prompt}/{mean_response}/{mini_prompts}", mean_prompt,
                                 mean_response):
        for chunks in skyrl_chunks(lengths, dp, mini_prompts * SAMPLES):
            tokens = [sum(chunk) for chunk in chunks]
            ratios.append(max(tokens) / statistics.mean(tokens))
    return statistics.mean(ratios)


def skyrl_formula(dp: int, mean_prompt: int, mean_response: int, mini_prompts: int = MINI_PROMPTS) -> float:
    """meshplan's slowest rank under SkyRL's partition at the bench's batch (slowest_rank_share in_order)."""
    return slowest_rank_share(dp, mini_prompts * SAMPLES // dp, 1, PROMPT, RESPONSE, mean_prompt, mean_response,
                              in_order=True, samples_per_prompt=SAMPLES)


def skyrl_micro_simulated(dp: int, group: int, micro: int, mean_prompt: int, mean_response: int,
                          mini_prompts: int = MINI_PROMPTS, steps: int = STEPS) -> float:
    """The slowest group's sum of its micro-batches' largest tokens over the mean rank's mini-batch, SkyRL's chunks
    cut into micro-batches of `micro` consecutive sequences (SampleBasedBatchIterator), ranks r // group a group,
    averaged over every mini-batch of `steps` seeded steps."""
    ratios = []
    for lengths in _seeded_steps(f"skyrl-micro/{dp}/{mean_prompt}/{mean_response}/{mini_prompts}", mean_prompt,
                                 mean_response, steps):
        for chunks in skyrl_chunks(lengths, dp, mini_prompts * SAMPLES):
            micros = [[sum(chunk[i:i + micro]) for i in range(0, len(chunk), micro)] for chunk in chunks]
            groups = [micros[g:g + group] for g in range(0, dp, group)]
            slowest = max(sum(max(ranks) for ranks in zip(*members, strict=True)) for members in groups)
            ratios.append(slowest / statistics.mean(sum(chunk) for chunk in chunks))
    return statistics.mean(ratios)


def balanced_karmarkar_karp(lengths: list[int], k: int) -> list[list[int]]:
    """verl's karmarkar_karp(equal_size=False) (f6f910069): every length a state of one set and k - 1 empty ones;
    the two states of widest spread merged until one is left; its sets' indices."""
    states = [[[lengths[i], [i]]] + [[0, []] for _ in range(k - 1)]
              for i in sorted(range(len(lengths)), key=lambda i: (lengths[i], i))]
    return [items for _, items in _merged_states(states)]


def _workload(tokens: int) -> int:
    """verl's calculate_workload (62221fa13): 24576 s + s^2."""
    return 24576 * tokens + tokens * tokens


def verl_dynamic_simulated(dp: int, mean_prompt: int, mean_response: int, budget: int = PROMPT + RESPONSE,
                           steps: int = STEPS, group: int | None = None,
                           sorted_share: bool = False) -> tuple[float, float]:
    """(the mini-batch's slowest rank, the slowest group's sum of its micro-batches' slowest ranks) over the mean
    rank's tokens under verl's balanced shares and token-budget micro-batches (rearrange_micro_batches), `group`
    ranks meeting at each micro-batch (every rank where None) and the groups at the mini-batch's end, averaged over
    every mini-batch of `steps` seeded steps. Before 62221fa13 (f6f910069): the shares balanced by tokens, each in
    rollout order; the micro-batches Karmarkar-Karp's over tokens, sorted by their squares' sum, longest first. With
    `sorted_share` (62221fa13 on, b178a3cd5): both balanced by workload (calculate_workload), each share sorted by it
    and laid out share[::2] + share[1::2][::-1] (RayPPOTrainer._balance_batch), the micro-batches sorted by workload,
    largest first, and laid out bins[::2][::-1] + bins[1::2]."""
    group = group or dp
    totals, synced = [], []
    for lengths in _seeded_steps(f"verl-dynamic/{dp}/{mean_prompt}/{mean_response}", mean_prompt, mean_response,
                                 steps, suffix="/sorted" if sorted_share else ""):
        weight = [_workload(t) for t in lengths] if sorted_share else lengths
        shares = equal_size_karmarkar_karp(weight, dp)
        if sorted_share:
            shares = [(lambda s: s[::2] + s[1::2][::-1])(sorted(share, key=lambda i: (weight[i], i)))
                      for share in shares]
        per_mini = MINI_PROMPTS * SAMPLES // dp
        for k in range(PROMPTS // MINI_PROMPTS):
            minis = [share[k * per_mini:(k + 1) * per_mini] for share in shares]
            mean = statistics.mean(sum(lengths[i] for i in m) for m in minis)
            count = max(min(len(m), -(-sum(lengths[i] for i in m) // budget)) for m in minis)  # the MAX
            bins = []
            for m in minis:
                parts = [[m[i] for i in p] for p in balanced_karmarkar_karp([weight[i] for i in m], count)]
                if sorted_share:
                    parts.sort(key=lambda p: (sum(weight[i] for i in p), p[0] if p else 0), reverse=True)
                    parts = parts[::2][::-1] + parts[1::2]
                else:
                    parts.sort(key=lambda p: (sum(lengths[i] ** 2 for i in p), min(p)), reverse=True)
                bins.append([sum(lengths[i] for i in p) for p in parts])
            totals.append(max(sum(lengths[i] for i in m) for m in minis) / mean)
            groups = [bins[g:g + group] for g in range(0, dp, group)]
            synced.append(max(sum(max(b[j] for b in members) for j in range(count)) for members in groups) / mean)
    return statistics.mean(totals), statistics.mean(synced)


def packed_formula(dp: int, group: int, mean_prompt: int, mean_response: int) -> float:
    """meshplan's slowest rank under verl's (f6f910069) token-budget micro-batches at the bench's batch, `group` ranks
    meeting at every micro-batch (stragglers.packed_slowest_share)."""
    return packed_slowest_share(dp, group, MINI_PROMPTS * SAMPLES // dp, PROMPTS // MINI_PROMPTS, PROMPT + RESPONSE,
                                PROMPT, RESPONSE, mean_prompt, mean_response)


def micro_formula(dp: int, group: int, micro: int, mean_prompt: int, mean_response: int,
                  mini_prompts: int = MINI_PROMPTS) -> float:
    """meshplan's slowest rank with `group` ranks meeting at every micro-batch of `micro` sequences (SkyRL's chunks)."""
    return slowest_rank_share(dp, mini_prompts * SAMPLES // dp, 1, PROMPT, RESPONSE, mean_prompt, mean_response,
                              in_order=True, samples_per_prompt=SAMPLES, micro_batch=micro, sync_ranks=group)


def main() -> int:
    print("mean prompt / response, dp: meshplan's slowest rank vs verl's partition and in-order split simulated "
          "(independent lengths; a prompt's samples at one prompt length)")
    for mean_prompt, mean_response in ((2048, 2000), (300, 2000), (300, 4000)):
        for dp in (8, 16, 32):
            formula = slowest_rank_share(dp, MINI_PROMPTS * SAMPLES // dp, PROMPTS // MINI_PROMPTS, PROMPT, RESPONSE,
                                         mean_prompt, mean_response)
            alone = simulated(dp, mean_prompt, mean_response, grouped=False)
            grouped = simulated(dp, mean_prompt, mean_response, grouped=True) if mean_prompt < PROMPT else alone
            print(f"  {mean_prompt:>5} / {mean_response:>5}, dp {dp:>2}: {formula:.3f} vs {alone:.3f} "
                  f"({formula / alone - 1:+.1%}); grouped {grouped:.3f}", flush=True)
    print("mean prompt / response, dp: meshplan's slowest rank vs SkyRL's in-order chunks simulated (a prompt's "
          "samples at one prompt length)")
    for mean_prompt, mean_response in ((2048, 2000), (300, 2000), (300, 4000)):
        for dp in (8, 16, 32):
            formula = skyrl_formula(dp, mean_prompt, mean_response)
            sim = skyrl_simulated(dp, mean_prompt, mean_response)
            print(f"  {mean_prompt:>5} / {mean_response:>5}, dp {dp:>2}: {formula:.3f} vs {sim:.3f} "
                  f"({formula / sim - 1:+.1%})", flush=True)
    print("mean prompt / response, dp, ranks met at every micro-batch, micro-batch: meshplan's slowest rank vs SkyRL's "
          "chunks cut into micro-batches simulated")
    for mean_prompt, mean_response in ((2048, 2000), (300, 2000)):
        for dp, group in ((8, 8), (32, 32), (16, 8), (32, 8)):
            for micro in (1, 2, 8):
                formula = micro_formula(dp, group, micro, mean_prompt, mean_response)
                sim = skyrl_micro_simulated(dp, group, micro, mean_prompt, mean_response)
                print(f"  {mean_prompt:>5} / {mean_response:>5}, dp {dp:>2}, {group:>2} met, micro {micro}: "
                      f"{formula:.3f} vs {sim:.3f} ({formula / sim - 1:+.1%})", flush=True)
    print("mean prompt / response, dp, ranks met at every micro-batch: verl's token-budget micro-batches "
          "(rearrange_micro_batches) simulated, the mini-batch's slowest rank and the slowest group's sum of its "
          "micro-batches' slowest ranks, against meshplan's packed_slowest_share; f6f910069's rollout-order shares, "
          "then 62221fa13's sorted ones, where meshplan times none (1.0)")
    for sorted_share in (False, True):
        for mean_prompt, mean_response in ((300, 2000), (300, 6000), (2048, 2000), (2048, 4000), (2048, 6000)):
            for dp, group in ((8, 8), (16, 8), (32, 8), (32, 32)):
                formula = 1.0 if sorted_share else packed_formula(dp, group, mean_prompt, mean_response)
                total, synced = verl_dynamic_simulated(dp, mean_prompt, mean_response, group=group,
                                                       sorted_share=sorted_share)
                print(f"  {'sorted ' if sorted_share else ''}{mean_prompt:>5} / {mean_response:>5}, dp {dp:>2}, "
                      f"{group:>2} met: simulated {total:.3f}, every micro-batch at its slowest {synced:.3f}; "
                      f"formula {formula:.3f} ({formula / synced - 1:+.1%})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
