"""Stragglers at every packed micro-batch (meshplan/rl/stragglers.py packed_slowest_share): verl's use_dynamic_bsz
(f6f910069 rearrange_micro_batches) packs each rank's mini-batch into the same count of micro-batches by
Karmarkar-Karp and runs them in the order of their squares' sum; where the engine joins ranks at every micro-batch
(Megatron-Core's MoE all-to-all over an expert-parallel group, FSDP every data-parallel rank), each micro-batch waits
for its group's largest, and a micro-batch of one or two whole sequences differs from its rank's mean by a
sequence's tokens."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl import step_time
from meshplan.rl.lengths import quantile, rate
from meshplan.rl.packing import karmarkar_karp_bins, karmarkar_karp_largest, workload
from meshplan.rl.stragglers import (
    _positions_excess,
    expected_max_normal,
    packed_slowest_share,
    sequence_quantiles,
    slowest_rank_share,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import rl_stragglers  # bench/: verl's token-budget micro-batches, simulated
from test_rl_stragglers import QWEN

BUDGET, PROMPT, RESPONSE = 10240, 2048, 8192  # the Qwen3-30B-A3B recipe's ppo_max_token_len_per_gpu and lengths


def test_a_typical_set_is_the_lengths_at_their_quantiles():
    # every prompt at its longest: the i-th of n is the prompt plus the response quantile (i + 0.5) / n, within the
    # grid's cell ((prompt + response) / 256 tokens)
    u, n = rate(3000 / RESPONSE), 40
    got = sequence_quantiles(n, PROMPT, RESPONSE, PROMPT, 3000)
    for i, length in enumerate(got):
        assert abs(length - (PROMPT + RESPONSE * quantile(u, (i + 0.5) / n))) <= (PROMPT + RESPONSE) / 256
    assert got == sorted(got)


def test_the_bins_are_verls_karmarkar_karp_over_tokens_before_62221fa13_and_workloads_after():
    lengths = [9000, 8500, 7000, 3000, 2500, 1200, 800, 400, 300]
    by_tokens = karmarkar_karp_bins(lengths, 4, by_workload=False)
    simulated = rl_stragglers.balanced_karmarkar_karp(lengths, 4)  # the bench's port of verl's karmarkar_karp
    assert sorted(t for _, t, _ in by_tokens) == sorted(sum(lengths[i] for i in p) for p in simulated)
    assert sum(t for _, t, _ in by_tokens) == sum(lengths)
    assert sum(q for _, _, q in by_tokens) == sum(x * x for x in lengths)
    by_work = karmarkar_karp_bins(lengths, 4)
    assert sum(w for w, _, _ in by_work) == sum(workload(x) for x in lengths)
    assert karmarkar_karp_largest(lengths, 4) == max(t for _, t, _ in by_work)


def test_alike_micro_batches_wait_only_for_their_ranks_own_spread():
    # every micro-batch the same tokens: no excess, whatever the ranks; each rank's own spread alone: every
    # micro-batch at the expected largest of `ranks` normals (the grid's half-deviation cells within 2%)
    same = [(5000, 1)] * 20
    assert _positions_excess(8, same, 0.0) == pytest.approx(0.0, abs=1e-6)
    assert _positions_excess(1, [(4000 + 300 * i, i) for i in range(20)], 50.0) == pytest.approx(0.0, abs=1e-6)
    assert _positions_excess(8, same, 100.0) == pytest.approx(20 * 100 * expected_max_normal(8), rel=0.02)


def test_micro_batches_of_one_or_two_sequences_wait_for_the_largest_of_the_group():
    # alternating bins (one sequence, then two): where their keys interleave, the group's m-th micro-batches mix them
    mixed = [(9000 if i % 2 else 12000, 81_000_000 - i) for i in range(40)]
    excess = _positions_excess(8, mixed, 0.0)
    assert 0.5 * 40 * 1500 < excess < 40 * 1500  # each micro-batch near 12,000 against a mean of 10,500
    assert _positions_excess(2, mixed, 0.0) < excess  # fewer ranks draw the larger less often


@pytest.mark.parametrize("mean_response", [8192, 2000])
def test_no_straggler_with_one_rank_a_group_or_every_length_at_its_longest(mean_response):
    assert packed_slowest_share(32, 1, 64, 4, BUDGET, PROMPT, RESPONSE, PROMPT, mean_response) == 1.0
    assert packed_slowest_share(32, 8, 64, 4, BUDGET, PROMPT, RESPONSE, PROMPT, 8192) == 1.0


def test_the_packed_straggler_is_the_mini_batchs_slowest_rank_where_micro_batches_hold_many_sequences():
    # 2,300 tokens a sequence on average: about four a micro-batch, which Karmarkar-Karp balances to within 1%
    mini = slowest_rank_share(8, 256, 4, PROMPT, RESPONSE, 300, 2000)
    packed = packed_slowest_share(8, 8, 256, 4, BUDGET, PROMPT, RESPONSE, 300, 2000)
    assert mini <= packed < mini * 1.01
    # 6,300: about 1.5 a micro-batch: each waits for the group's micro-batch of two
    mini = slowest_rank_share(8, 256, 4, PROMPT, RESPONSE, 300, 6000)
    assert packed_slowest_share(8, 8, 256, 4, BUDGET, PROMPT, RESPONSE, 300, 6000) > mini * 1.08


def test_groups_meet_at_the_mini_batchs_end():
    # 4 groups of 8 ranks wait longer than one group of 8, less than every rank meeting at each micro-batch
    one = packed_slowest_share(8, 8, 64, 4, BUDGET, PROMPT, RESPONSE, 300, 6000)
    four = packed_slowest_share(32, 8, 64, 4, BUDGET, PROMPT, RESPONSE, 300, 6000)
    every = packed_slowest_share(32, 32, 64, 4, BUDGET, PROMPT, RESPONSE, 300, 6000)
    assert one < four < every


@pytest.mark.parametrize(("dp", "group", "mean_prompt", "mean_response"),
                         [(8, 8, 300, 6000), (32, 8, 300, 6000), (32, 8, 2048, 2000), (16, 8, 2048, 4000)])
def test_the_formula_is_verls_packing_simulated(dp, group, mean_prompt, mean_response):
    # bench/rl_stragglers.py: the step partitioned and split as verl f6f910069 does, every rank's mini-batch packed by
    # rearrange_micro_batches, each micro-batch at its group's largest, the groups at the mini-batch's end
    _, simulated = rl_stragglers.verl_dynamic_simulated(dp, mean_prompt, mean_response, steps=1, group=group)
    assert rl_stragglers.packed_formula(dp, group, mean_prompt, mean_response) == pytest.approx(simulated, rel=0.025)


def test_verls_sorted_shares_from_62221fa13_straggle_little_at_their_micro_batches():
    # each rank's mini-batch one quantile band of like shares, its micro-batches sorted by workload alike: the
    # simulated residual is about 1%, and meshplan times none there
    total, synced = rl_stragglers.verl_dynamic_simulated(8, 300, 6000, steps=1, group=8, sorted_share=True)
    assert total < 1.01 and synced < 1.02


def test_verls_megatron_moe_and_fsdp_updates_wait_at_every_packed_micro_batch():
    job, plan = resolve(parse_request({**QWEN, "num_gpus": 16, "mean_response_length": 6000}))
    assert step_time.micro_batch_sync(job, plan) == (0, 8)  # EP8 over TP1 CP1
    assert step_time.slowest_rank(job, plan) == pytest.approx(
        packed_slowest_share(16, 8, 128, 4, BUDGET, PROMPT, RESPONSE, PROMPT, 6000))
    fsdp, plan_fsdp = resolve(parse_request({**QWEN, "num_gpus": 16, "mean_response_length": 6000, "ep": 1,
                                             "zero_stage": 3, "moe_token_dispatcher": None}))
    assert step_time.micro_batch_sync(fsdp, plan_fsdp) == (0, plan_fsdp.dp)
    assert step_time.slowest_rank(fsdp, plan_fsdp) == pytest.approx(packed_slowest_share(
        plan_fsdp.dp, plan_fsdp.dp, 2048 // plan_fsdp.dp, 4, plan_fsdp.micro_batch_size * fsdp.seq_length, PROMPT,
        RESPONSE, PROMPT, 6000))


def test_the_note_says_the_packed_micro_batches_and_the_update_lengthens():
    asked = {**QWEN, "num_gpus": 16, "mean_response_length": 6000}
    note = api.estimate_throughput(parse_request(asked)).assumptions[0]
    assert "joins 8 of them at every micro-batch, which it packs to 10,240 tokens by Karmarkar-Karp" in note
    assert "rl.packed_micro_batches" in note
    job, plan = resolve(parse_request(asked))
    mini = slowest_rank_share(16, 128, 4, PROMPT, RESPONSE, PROMPT, 6000)
    assert step_time.slowest_rank(job, plan) > mini * 1.05
    assert math.isfinite(step_time.rl_step_time(job, plan)[0].update_s)
