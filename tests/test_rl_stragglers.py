"""The slowest data-parallel rank of an RL update's mini-batch (meshplan/rl/stragglers.py): verl's trainer balances
the step over the ranks and, before 62221fa13 (v0.6.1), each rank split its share into mini-batches in rollout order,
every optimizer step waiting for the rank that drew the most tokens (rl/step_time.slowest_rank)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.estimate.perf import estimate_throughput
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl import step_time
from meshplan.rl.lengths import length_variance, rate
from meshplan.rl.stragglers import expected_max_normal, packed_slowest_share, slowest_rank_share

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import rl_stragglers  # bench/: verl's partition and in-order split, simulated

# verl's run_qwen3moe-30b_megatron_96gb.sh (bench/data/rl_workloads.yaml) on the verl 0.5 image, with a stated mean
QWEN = {"model": "qwen3-30b-a3b", "gpu": "h20", "framework": "verl", "tp": 1, "pp": 1, "ep": 8, "etp": 1,
        "job": "rl", "algorithm": "dapo", "prompts_per_step": 512, "prompts_per_mini_batch": 128,
        "samples_per_prompt": 16, "prompt_length": 2048, "response_length": 8192, "rollout_tp": 4,
        "rollout_memory_fraction": 0.7, "param_offload": True, "optimizer_offload": True,
        "optimizer_offload_fraction": 1.0, "moe_token_dispatcher": "flex", "micro_batch_size": 1,
        "rollout_enforce_eager": True, "expandable_segments": False, "framework_version": "0.5.0"}


def job_plan(**more):
    return resolve(parse_request({**QWEN, **more}))


def test_the_expected_largest_normal_is_the_closed_form_for_two_and_three():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-9)
    assert expected_max_normal(8) < expected_max_normal(32) < math.sqrt(2 * math.log(32))


def test_the_length_variance_is_the_shapes():
    assert length_variance(4096, 8192) == pytest.approx(8192 ** 2 / 12, rel=1e-6)  # the uniform shape
    assert length_variance(8192, 8192) == 0.0
    u, steps = rate(0.2), 20000  # the truncated exponential of mean 0.2, integrated
    xs = [(i + 0.5) / steps for i in range(steps)]
    weights = [math.exp(-u * x) for x in xs]
    mean = sum(w * x for w, x in zip(weights, xs, strict=True)) / sum(weights)
    second = sum(w * x * x for w, x in zip(weights, xs, strict=True)) / sum(weights)
    assert mean == pytest.approx(0.2, rel=1e-4)
    assert length_variance(200, 1000) == pytest.approx((second - mean * mean) * 1000 ** 2, rel=1e-3)


def test_the_slowest_rank_is_the_mean_plus_the_largest_of_dp_draws_of_a_mini_batch():
    n, batches, mean = 64, 4, 2048 + 2000
    spread = math.sqrt(length_variance(2000, 8192) * n * (batches * n - n) / (batches * n - 1))
    assert slowest_rank_share(32, n, batches, 2048, 8192, 2048, 2000) == pytest.approx(
        1 + expected_max_normal(32) * spread / (n * mean))
    # the prompts' spread (drawn from their own shape where their mean is stated) adds to the responses'
    both = length_variance(1024, 2048) + length_variance(2000, 8192)
    assert slowest_rank_share(32, n, batches, 2048, 8192, 1024, 2000) == pytest.approx(
        1 + expected_max_normal(32) * math.sqrt(both * n * (batches * n - n) / (batches * n - 1)) / (n * 3024))


@pytest.mark.parametrize("dp, n, batches, mean_response", [(1, 64, 4, 2000), (32, 64, 1, 2000), (32, 64, 4, 8192)])
def test_no_straggler_with_one_rank_one_mini_batch_or_every_length_at_its_longest(dp, n, batches, mean_response):
    assert slowest_rank_share(dp, n, batches, 2048, 8192, 2048, mean_response) == 1.0


def test_the_straggler_grows_with_the_ranks_and_shrinks_with_the_sequences():
    at = [slowest_rank_share(dp, 2048 // dp, 4, 2048, 8192, 2048, 2000) for dp in (8, 16, 32)]
    assert 1 < at[0] < at[1] < at[2]
    assert slowest_rank_share(8, 1024, 4, 2048, 8192, 2048, 2000) < at[0]


def test_the_update_runs_each_mini_batch_at_its_slowest_ranks_tokens():
    job, plan = job_plan(num_gpus=32, mean_response_length=2000)
    slowest = step_time.slowest_rank(job, plan)
    # its EP8 all-to-all meets 8 ranks at every micro-batch, which verl packs to 1 x 10,240 tokens
    assert slowest == pytest.approx(packed_slowest_share(32, 8, 64, 4, 10240, 2048, 8192, 2048, 2000))
    assert slowest > slowest_rank_share(32, 64, 4, 2048, 8192, 2048, 2000)
    update = estimate_throughput(job, plan)
    mini, batches = step_time.mini_batch_update(job, plan, update)
    share, flops = job.rl.token_share, step_time.flops_share(job)
    timing = step_time.rl_step_time(job, plan)[0]
    assert timing.update_s == pytest.approx(step_time.at_tokens(mini, share * slowest, flops * slowest, batches))
    # verl counts the real tokens' FLOPs over the longer update: the MFU falls by what the straggler adds
    assert timing.update_mfu == pytest.approx(
        update.mfu * flops * update.step_time_s / step_time.at_tokens(mini, share * slowest, flops * slowest, batches))


def test_the_log_prob_passes_run_the_balanced_share_whole(monkeypatch):
    job, plan = job_plan(num_gpus=32, mean_response_length=2000)
    with_straggler = step_time.rl_step_time(job, plan)[0]
    monkeypatch.setattr(step_time, "slowest_rank", lambda job, plan: 1.0)
    without = step_time.rl_step_time(job, plan)[0]
    assert with_straggler.update_s > without.update_s
    assert with_straggler.log_prob_s == without.log_prob_s
    assert with_straggler.generation_s == without.generation_s


def test_one_report_works_the_slowest_rank_out_once_and_says_the_figure_it_timed(monkeypatch):
    job, plan = job_plan(num_gpus=32, mean_response_length=2000)
    slowest = step_time.slowest_rank(job, plan)
    calls = []

    def counted(job, plan):
        calls.append(plan)
        return slowest

    monkeypatch.setattr(step_time, "slowest_rank", counted)
    report = step_time.rl_throughput(job, plan)
    assert len(calls) == 1
    assert f"{slowest:.3f}x the mean rank's" in report.assumptions[0]
    assert step_time.straggler_words(job, plan, 1.0) == ""


def test_the_update_mfu_falls_with_the_ranks_at_a_stated_mean_and_stays_flat_without_one():
    def mfu(n, **more):
        return api.estimate_throughput(parse_request({**QWEN, "num_gpus": n, **more})).rl.update_mfu

    spread = [mfu(n, mean_response_length=2000) for n in (8, 16, 32)]
    assert spread[0] > spread[1] > spread[2]
    flat = [mfu(n) for n in (8, 16, 32)]  # every response at the maximum: no spread to straggle on
    assert max(flat) - min(flat) < 0.01


def test_a_release_that_sorts_each_share_by_workload_has_no_straggler():
    old, _ = job_plan(num_gpus=32, mean_response_length=2000)
    new, plan = job_plan(num_gpus=32, mean_response_length=2000, framework_version="0.9.1")
    change = new.card.release_change("rank_share_sorted")
    assert change is not None and change.release == "0.6.1"
    assert step_time.slowest_rank(old, plan) > 1.0
    assert step_time.slowest_rank(new, plan) == 1.0
    no_mean, _ = job_plan(num_gpus=32)
    assert step_time.slowest_rank(no_mean, plan) == 1.0


def test_a_framework_that_chunks_in_order_times_its_own_straggler_not_verls():
    # SkyRL balances nothing (cards/frameworks/skyrl.yaml rl.in_order_rank_chunks): its straggler is the in-order
    # chunk's (tests/test_rl_stragglers_skyrl.py), not verl's balanced share's
    job, plan = resolve(parse_request({"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 8, "job": "rl",
                                       "prompts_per_step": 64, "prompts_per_mini_batch": 16, "samples_per_prompt": 5,
                                       "response_length": 1024, "mean_response_length": 300,
                                       "micro_batch_size": 2}))
    assert not job.rl_card.balanced_step_batch and job.rl_card.in_order_rank_chunks
    assert step_time.slowest_rank(job, plan) == pytest.approx(slowest_rank_share(
        8, 10, 1, 512, 1024, 512, 300, in_order=True, samples_per_prompt=5))


def test_the_step_note_says_what_the_straggler_adds_only_where_it_adds():
    note = api.estimate_throughput(parse_request({**QWEN, "num_gpus": 32, "mean_response_length": 2000})).assumptions[0]
    assert "slowest of 32 data-parallel ranks' tokens" in note and "rl.balanced_step_batch" in note
    plain = api.estimate_throughput(parse_request({**QWEN, "num_gpus": 32})).assumptions[0]
    assert "slowest of" not in plain


def test_the_normal_approximation_is_verls_partition_and_split_simulated():
    # bench/rl_stragglers.py: the step's sequences partitioned as verl's karmarkar_karp(equal_size=True) does, each
    # rank's share cut into mini-batches in order; the formula within 2% of what that simulation's slowest rank draws
    for dp in (8, 32):
        formula = slowest_rank_share(dp, 2048 // dp, 4, 2048, 8192, 300, 2000)
        assert formula == pytest.approx(rl_stragglers.simulated(dp, 300, 2000, grouped=False), rel=0.02)


def test_the_simulated_partition_is_balanced_in_equal_counts():
    lengths = [5, 1, 9, 3, 7, 2, 8, 4]
    shares = rl_stragglers.equal_size_karmarkar_karp(lengths, 2)
    assert sorted(i for share in shares for i in share) == list(range(8))
    assert [len(share) for share in shares] == [4, 4]
    assert abs(sum(lengths[i] for i in shares[0]) - sum(lengths[i] for i in shares[1])) <= 1
