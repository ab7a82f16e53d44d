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
Where the ranks meet at every layer rather than at the mini-batch's end (FSDP's all-gathers and reduce-scatters,
Megatron's EP all-to-all), each micro-batch waits for its slowest rank, a straggler of micro-batch size that is not
counted here: on the low side there.
"""

from __future__ import annotations

import math
from functools import cache

from meshplan.rl.lengths import length_variance

_NORMAL_SPAN = 9.0  # the integral of expected_max_normal over [-span, span] standard deviations
_NORMAL_STEPS = 3600  # its midpoint steps (0.005 wide)


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


def slowest_rank_share(dp: int, sequences: int, mini_batches: int, prompt: int, response: int,
                       mean_prompt: int, mean_response: int, *, in_order: bool = False,
                       samples_per_prompt: int = 1) -> float:
    """The expected tokens of the slowest of `dp` ranks' mini-batch over the mean rank's, where each rank runs
    `sequences` of the step's prompt + response sequences per mini-batch, `mini_batches` of them a step, its step's
    share balanced by tokens, or with `in_order` its mini-batch `sequences` consecutive ones of the rollout, a prompt's
    `samples_per_prompt` next to each other, with no balancing (see the module's docstring); prompt and response
    lengths drawn from their shapes on [0, prompt] and [0, response] with the means given. 1.0 with one rank, one
    balanced mini-batch or every length at its longest."""
    if dp <= 1 or (mini_batches <= 1 and not in_order) or sequences < 1:
        return 1.0
    prompts, responses = length_variance(mean_prompt, prompt), length_variance(mean_response, response)
    if prompts + responses <= 0:
        return 1.0
    if in_order:  # independent draws, each prompt's length min(n, samples) times over
        spread = math.sqrt(sequences * (responses + min(sequences, samples_per_prompt) * prompts))
    else:
        share = mini_batches * sequences  # the rank's step: one mini-batch is `sequences` of these
        spread = math.sqrt((prompts + responses) * sequences * (share - sequences) / max(1, share - 1))
    return 1.0 + expected_max_normal(dp) * spread / (sequences * (mean_prompt + mean_response))
