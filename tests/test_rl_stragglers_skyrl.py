"""SkyRL's slowest data-parallel rank (meshplan/rl/stragglers.py in_order): its trainer cuts each mini-batch into dp
equal chunks of consecutive sequences in rollout order and balances nothing (NovaSky-AI/SkyRL a9564572e
MeshDispatch.stage_chunks), so every mini-batch of the update and of the log-prob passes waits for the rank whose
chunk drew the most tokens (rl/step_time.slowest_rank, log_prob_slowest)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl import step_time
from meshplan.rl.lengths import length_variance
from meshplan.rl.memory import rank_mini_batch
from meshplan.rl.stragglers import expected_max_normal, slowest_rank_share

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import rl_stragglers  # bench/: SkyRL's mini-batch boundaries and DP chunks, simulated

SKYRL = {"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 8, "job": "rl", "prompts_per_step": 64,
         "prompts_per_mini_batch": 16, "samples_per_prompt": 5, "prompt_length": 1024, "response_length": 1024,
         "mean_response_length": 300, "mean_prompt_length": 400, "micro_batch_size": 2}


def job_plan(**more):
    return resolve(parse_request({**SKYRL, **more}))


def test_an_in_order_chunk_spreads_by_its_draws_and_its_prompts_repeated_samples():
    c, n, mean = 64, 16, 300 + 2000
    prompts, responses = length_variance(300, 2048), length_variance(2000, 8192)
    spread = math.sqrt(c * (responses + n * prompts))  # four whole prompts, each length sixteen times
    assert slowest_rank_share(32, c, 4, 2048, 8192, 300, 2000, in_order=True, samples_per_prompt=n) == pytest.approx(
        1 + expected_max_normal(32) * spread / (c * mean))
    within = math.sqrt(8 * (responses + 8 * prompts))  # eight samples of one prompt: one length eight times
    assert slowest_rank_share(32, 8, 4, 2048, 8192, 300, 2000, in_order=True, samples_per_prompt=n) == pytest.approx(
        1 + expected_max_normal(32) * within / (8 * mean))


def test_unbalanced_chunks_straggle_with_one_mini_batch_and_more_than_a_balanced_share():
    one = slowest_rank_share(16, 64, 1, 2048, 8192, 2048, 2000, in_order=True)
    assert one > 1.0
    assert one == slowest_rank_share(16, 64, 4, 2048, 8192, 2048, 2000, in_order=True)  # no share: any mini-batches
    assert one > slowest_rank_share(16, 64, 4, 2048, 8192, 2048, 2000)  # a draw from the balanced share spreads less
    assert slowest_rank_share(16, 64, 1, 2048, 8192, 2048, 2000) == 1.0  # one balanced mini-batch: none
    assert slowest_rank_share(1, 64, 1, 2048, 8192, 300, 2000, in_order=True) == 1.0
    assert slowest_rank_share(16, 64, 1, 2048, 8192, 2048, 8192, in_order=True) == 1.0  # every length the longest


def test_skyrls_update_and_log_prob_passes_run_at_their_slowest_chunks():
    job, plan = job_plan()
    rl = job.rl
    assert job.rl_card.in_order_rank_chunks and not job.rl_card.balanced_step_batch
    mini = step_time.slowest_rank(job, plan)
    assert mini == pytest.approx(slowest_rank_share(plan.dp, rank_mini_batch(job, plan), 1, 1024, 1024, 400, 300,
                                                    in_order=True, samples_per_prompt=5))
    whole = step_time.slowest_rank(job, plan, whole_step=True)  # the reference's one pass over the step's chunks
    assert whole == pytest.approx(slowest_rank_share(plan.dp, rl.step_sequences // plan.dp, 1, 1024, 1024, 400, 300,
                                                     in_order=True, samples_per_prompt=5))
    assert 1.0 < whole < mini
    # grpo: the old policy's pass and the reference's
    assert step_time.log_prob_slowest(job, plan, mini) == pytest.approx((mini + whole) / 2)
    ppo, plan_ppo = job_plan(algorithm="ppo")  # SkyRL's critic trains on FSDP only: its own plan's stragglers
    mini_ppo, whole_ppo = step_time.slowest_rank(ppo, plan_ppo), step_time.slowest_rank(ppo, plan_ppo, whole_step=True)
    # ppo: the critic's pass too
    assert step_time.log_prob_slowest(ppo, plan_ppo, mini_ppo) == pytest.approx((2 * mini_ppo + whole_ppo) / 3)
    no_mean, plan_flat = resolve(parse_request({k: v for k, v in SKYRL.items() if not k.startswith("mean_")}))
    assert step_time.slowest_rank(no_mean, plan_flat) == 1.0
    flat = step_time.slowest_rank(no_mean, plan_flat)
    assert flat == 1.0 and step_time.log_prob_slowest(no_mean, plan_flat, flat) == 1.0


def test_the_stragglers_lengthen_skyrls_update_and_log_prob_passes_only(monkeypatch):
    job, plan = job_plan()
    with_straggler = step_time.rl_step_time(job, plan)[0]
    monkeypatch.setattr(step_time, "slowest_rank", lambda job, plan, whole_step=False: 1.0)
    without = step_time.rl_step_time(job, plan)[0]
    assert with_straggler.update_s > without.update_s
    assert with_straggler.log_prob_s > without.log_prob_s
    assert with_straggler.generation_s == without.generation_s


def test_a_balanced_trainer_runs_its_log_prob_passes_without_a_straggler():
    job, plan = resolve(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "job": "rl",
                                       "prompts_per_step": 64, "prompts_per_mini_batch": 16, "samples_per_prompt": 5,
                                       "response_length": 1024, "mean_response_length": 300,
                                       "framework_version": "0.5.0"}))
    assert step_time.slowest_rank(job, plan) > 1.0
    assert step_time.slowest_rank(job, plan, whole_step=True) == 1.0
    assert step_time.log_prob_slowest(job, plan, step_time.slowest_rank(job, plan)) == 1.0


def test_skyrls_note_names_its_in_order_chunks():
    note = api.estimate_throughput(parse_request(SKYRL)).assumptions[0]
    assert "slowest of 8 data-parallel ranks' tokens" in note
    assert "SkyRL 0.4.0 cuts each mini-batch into data-parallel chunks" in note and "rl.in_order_rank_chunks" in note


def test_the_simulated_chunks_are_skyrls_boundaries_and_stage_chunks():
    # preprocess.py compute_prompt_mini_batch_boundaries' example A (2 samples, 4 prompts, mini-batches of 2 prompts)
    # then MeshDispatch.stage_chunks over dp 2: DP rank r takes the r-th half of each mini-batch
    lengths = [10, 11, 20, 21, 30, 31, 40, 41]
    assert rl_stragglers.skyrl_chunks(lengths, 2, 4) == [[[10, 11], [20, 21]], [[30, 31], [40, 41]]]


@pytest.mark.parametrize(("dp", "mini_prompts", "mean_prompt", "tolerance"),
                         [(8, 128, 300, 0.02), (32, 128, 300, 0.02), (32, 128, 2048, 0.02), (16, 8, 2048, 0.03)])
def test_the_normal_approximation_is_skyrls_partition_simulated(dp, mini_prompts, mean_prompt, tolerance):
    # bench/rl_stragglers.py: the step in rollout order (a prompt's 16 samples together at one prompt length), cut as
    # SkyRL cuts it; the formula within 2% where a rank's chunk holds 32 sequences or more, 3% at eight (one prompt's
    # half: the shape's skew, which the normal approximation leaves out, grows as the chunk shrinks)
    formula = rl_stragglers.skyrl_formula(dp, mean_prompt, 2000, mini_prompts)
    assert formula == pytest.approx(rl_stragglers.skyrl_simulated(dp, mean_prompt, 2000, mini_prompts), rel=tolerance)
