"""Stragglers at every micro-batch (meshplan/rl/stragglers.py micro_batch_max, slowest_rank_share's micro_batch):
where the trainer's engine joins data-parallel ranks at every micro-batch (FSDP's per-layer all-gathers and
reduce-scatters, Megatron-Core's MoE all-to-all over an expert-parallel group: cards/frameworks/*.yaml
rl.micro_batch_sync), each micro-batch waits for the largest of its group's, an expected maximum of sums of a few
lengths counted exactly on a grid; verl's token-budget micro-batches are tests/test_rl_stragglers_packed.py's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl import step_time
from meshplan.rl.lengths import length_variance, rate, survival
from meshplan.rl.memory import rank_mini_batch
from meshplan.rl.stragglers import EXACT_SEQUENCES, expected_max_normal, micro_batch_max, slowest_rank_share

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import rl_stragglers  # bench/: SkyRL's chunks and micro-batches, verl's token-budget micro-batches, simulated
from test_rl_stragglers_skyrl import SKYRL, job_plan


@pytest.mark.parametrize("ranks", [1, 2, 8, 32])
def test_the_largest_of_single_sequences_is_the_integral_of_the_shapes_survival(ranks):
    # one response a micro-batch, every prompt at its longest: E[max] = P + R * integral of 1 - (1 - S(x))^ranks
    u, steps = rate(300 / 1024), 20000
    integral = sum(1 - (1 - survival(u, (i + 0.5) / steps)) ** ranks for i in range(steps)) / steps
    top, _ = micro_batch_max(ranks, 1, 1, 1024, 1024, 1024, 300)
    assert top == pytest.approx(1024 + 1024 * integral, rel=2e-3)


def test_one_rank_has_the_micro_batchs_mean_and_variance():
    # prompts in runs of two (a prompt's samples share its length): var = 4 R + 2 * 2^2 P
    top, var = micro_batch_max(1, 4, 2, 1024, 1024, 400, 300)
    assert top == pytest.approx(4 * 700, rel=1e-3)
    assert var == pytest.approx(4 * length_variance(300, 1024) + 2 * 4 * length_variance(400, 1024), rel=2e-2)


def test_ranks_met_only_at_the_mini_batchs_end_keep_the_normal_approximation():
    for kwargs in ({}, {"in_order": True, "samples_per_prompt": 5}):
        plain = slowest_rank_share(8, 64, 4, 1024, 1024, 400, 300, **kwargs)
        assert slowest_rank_share(8, 64, 4, 1024, 1024, 400, 300, micro_batch=2, sync_ranks=1, **kwargs) == plain


def test_every_micro_batch_at_its_slowest_rank_waits_longer_the_smaller_it_is():
    mini = slowest_rank_share(8, 64, 1, 1024, 1024, 400, 300, in_order=True, samples_per_prompt=5)
    one, two, eight = (slowest_rank_share(8, 64, 1, 1024, 1024, 400, 300, in_order=True, samples_per_prompt=5,
                                          micro_batch=m, sync_ranks=8) for m in (1, 2, 8))
    assert one > two > eight > mini
    # every rank met at each micro-batch: the mini-batch is its micro-batches' maxima, E[max of 8] / E[one] exactly
    assert two == pytest.approx(micro_batch_max(8, 2, 2, 1024, 1024, 400, 300)[0] / 1400)
    # a balanced share (verl) straggles at every micro-batch too, one mini-batch a step included
    assert slowest_rank_share(8, 64, 1, 1024, 1024, 400, 300, micro_batch=1, sync_ranks=8) > 1.0


def test_groups_of_ranks_add_the_slowest_group_at_the_mini_batchs_end():
    # Megatron-Core's EP all-to-all: 4 groups of 8 ranks; the groups meet at the gradient reduction
    n, m = 64, 2
    top, var = micro_batch_max(8, m, m, 1024, 1024, 400, 300)
    prompts, responses = length_variance(400, 1024), length_variance(300, 1024)
    scale = (responses + 5 * prompts) / (responses + m * prompts)  # a chunk's prompts shared five times, not two
    expected = (n / m * top + expected_max_normal(4) * math.sqrt(n / m * var * scale)) / (n * 700)
    assert slowest_rank_share(32, n, 1, 1024, 1024, 400, 300, in_order=True, samples_per_prompt=5, micro_batch=m,
                              sync_ranks=8) == pytest.approx(expected)
    assert expected > slowest_rank_share(8, n, 1, 1024, 1024, 400, 300, in_order=True, samples_per_prompt=5,
                                         micro_batch=m, sync_ranks=8)


def test_a_long_micro_batch_is_the_normal_approximation_and_no_spread_no_straggler():
    m = EXACT_SEQUENCES + 1
    var = m * (length_variance(300, 1024) + length_variance(400, 1024))
    top = m * 700 + expected_max_normal(8) * math.sqrt(var)
    assert slowest_rank_share(8, m, 1, 1024, 1024, 400, 300, in_order=True, micro_batch=m,
                              sync_ranks=8) == pytest.approx(top / (m * 700))
    assert slowest_rank_share(8, 64, 1, 1024, 1024, 1024, 1024, in_order=True, micro_batch=1, sync_ranks=8) == 1.0


@pytest.mark.parametrize(("dp", "group", "micro", "mean_prompt"),
                         [(8, 8, 1, 300), (32, 32, 1, 2048), (16, 8, 2, 300), (32, 8, 8, 2048)])
def test_the_grid_is_skyrls_micro_batches_simulated(dp, group, micro, mean_prompt):
    # bench/rl_stragglers.py: SkyRL's mini-batches and dp chunks in rollout order, each chunk cut into micro-batches
    # of `micro` consecutive sequences (SampleBasedBatchIterator), every micro-batch at its group's largest
    formula = rl_stragglers.micro_formula(dp, group, micro, mean_prompt, 2000)
    simulated = rl_stragglers.skyrl_micro_simulated(dp, group, micro, mean_prompt, 2000, steps=2)
    assert formula == pytest.approx(simulated, rel=0.02)


def test_skyrls_fsdp_and_megatron_moe_join_ranks_at_every_micro_batch():
    fsdp, plan = job_plan(zero_stage=3)
    assert step_time.micro_batch_sync(fsdp, plan) == (2, plan.dp)
    assert step_time.slowest_rank(fsdp, plan) == pytest.approx(slowest_rank_share(
        plan.dp, rank_mini_batch(fsdp, plan), 1, 1024, 1024, 400, 300, in_order=True, samples_per_prompt=5,
        micro_batch=2, sync_ranks=plan.dp))
    dense, plan_dense = job_plan()  # Megatron, a dense model: only the gradient reduction joins them
    assert step_time.micro_batch_sync(dense, plan_dense) == (0, 1)
    moe, plan_moe = job_plan(model="qwen3-30b-a3b", num_gpus=16, ep=8, micro_batch_size=1)
    assert step_time.micro_batch_sync(moe, plan_moe) == (1, 8 // (plan_moe.tp * plan_moe.cp))
    # verl packs its micro-batches to a token budget: their sequences are the packing's (tests/test_rl_stragglers_
    # packed.py times them)
    verl, plan_verl = resolve(parse_request({**SKYRL, "framework": "verl", "zero_stage": 3,
                                             "framework_version": "0.5.0"}))
    assert verl.rl_card.packed_micro_batches and step_time.micro_batch_sync(verl, plan_verl) == (0, plan_verl.dp)


def test_the_micro_batch_stragglers_lengthen_skyrls_fsdp_update_and_its_note_says_so(monkeypatch):
    job, plan = job_plan(zero_stage=3)
    timing = step_time.rl_step_time(job, plan)[0]
    note = api.estimate_throughput(parse_request({**SKYRL, "zero_stage": 3})).assumptions[0]
    assert f"joins {plan.dp} of them at every micro-batch of 2 sequences" in note and "rl.micro_batch_sync" in note
    monkeypatch.setattr(step_time, "micro_batch_sync", lambda job, plan: (0, 1))  # met only at the mini-batch's end
    mini = step_time.rl_step_time(job, plan)[0]
    assert timing.update_s > mini.update_s and timing.log_prob_s > mini.log_prob_s
    assert timing.generation_s == mini.generation_s
