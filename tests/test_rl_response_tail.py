"""The responses' mean length below their maximum (mean_response_length): the log-prob passes and the update cost
the mean tokens, memory plans for the maximum, generation drains to the longest (meshplan/rl/step_time.py
decode_seconds, meshplan/rl/lengths.py), and a mean over the maximum is refused on every face."""

from __future__ import annotations

import math

import pytest
from mcp_calls import call_tools

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import head_loss
from meshplan.faces import cli
from meshplan.knowledge.calibration import calibration_card
from meshplan.knowledge.cards import rl_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.lengths import age_in_flight, drain_need, quantile, rate, survival, survival_mean
from meshplan.rl.memory import rl_memory
from meshplan.rl.step_time import (
    at_tokens,
    decode_step_seconds,
    flops_share,
    log_prob_loss_seconds,
    log_prob_seconds,
    rl_step_time,
    sequences_per_rank,
)

# a 7B DAPO job of verl's one-step-off doc: 16 H20, several waves of decode per engine rank
DAPO = {"model": "qwen2.5-7b", "gpu": "h20", "framework": "verl", "num_gpus": 16, "tp": 2, "pp": 2, "job": "rl",
        "algorithm": "dapo", "prompts_per_step": 512, "samples_per_prompt": 16, "prompt_length": 2048,
        "response_length": 8192, "rollout_tp": 2, "rollout_memory_fraction": 0.8, "micro_batch_size": 1}
# GRPO (a reference pass) of an MoE model: one wave
GRPO = {"model": "qwen3-30b-a3b", "framework": "verl", "num_gpus": 16, "ep": 8, "job": "rl", "samples_per_prompt": 8,
        "prompts_per_step": 64, "response_length": 4096}


def step(fields: dict, **more):
    return api.estimate_throughput(parse_request({**fields, **more}))


@pytest.mark.parametrize("fields", [DAPO, GRPO])
def test_a_mean_at_the_maximum_is_every_response_at_the_maximum(fields):
    left_out, at_max = step(fields), step(fields, mean_response_length=fields["response_length"])
    assert left_out.rl == at_max.rl and left_out.step_time_s == at_max.step_time_s
    assert left_out.tokens_per_s == at_max.tokens_per_s and left_out.mfu == at_max.mfu


@pytest.mark.parametrize("fields", [DAPO, GRPO])
def test_the_passes_cost_the_mean_tokens_and_memory_the_longest(fields):
    mean = fields["response_length"] // 4
    at_max, short = step(fields).rl, step(fields, mean_response_length=mean).rl
    prompt = fields.get("prompt_length", 512)
    share = (prompt + mean) / (prompt + fields["response_length"])
    job, plan = resolve(parse_request({**fields, "mean_response_length": mean}))
    flops = flops_share(job)
    assert flops < share  # attention's reach shrinks with the sequence too
    _, update, _, _ = rl_step_time(job, plan)  # the update as estimated, at prompt + the longest response
    b = update.breakdown
    card = job.rl_card
    ref, critic = card.reference_model[job.rl.algorithm], card.critic[job.rl.algorithm]
    traffic = b.tp_comm_s + b.cp_comm_s + b.ep_comm_s + b.pp_comm_s
    forward = ((b.compute_s - b.recompute_s) * flops + traffic * share + b.bubble_s) / 3
    assert forward == pytest.approx(log_prob_seconds(update, share, flops))
    # each pass's loss path at its own forward bytes, at the mean tokens too (log_prob_loss_seconds)
    old_loss, ref_loss, critic_loss = log_prob_loss_seconds(job, plan, head_loss(job, plan), share)
    assert short.log_prob_s == pytest.approx((1 + ref + critic) * forward + old_loss + ref * ref_loss
                                             + critic * critic_loss)
    fixed = b.dp_comm_s + b.other_s + b.offload_s
    scaled = update.step_time_s - fixed - b.bubble_s
    compute = min(scaled, b.compute_s)
    once = fixed + b.bubble_s  # one optimizer step, one pipeline fill and drain of budget-packed micro-batches
    assert short.update_s == pytest.approx((once + compute * flops + (scaled - compute) * share)
                                           * at_max.update_s / update.step_time_s)
    assert short.update_s < at_max.update_s
    # the trainer's sequence (what memory plans for) stays prompt + the longest response
    assert job.seq_length == prompt + fields["response_length"] and job.rl.mean_response == mean
    assert (api.estimate_memory(parse_request({**fields, "mean_response_length": mean})).peak_bytes
            == api.estimate_memory(parse_request(fields)).peak_bytes)


def test_at_tokens_scales_all_but_the_steps_once_terms():
    job, plan = resolve(parse_request(DAPO))
    _, update, _, _ = rl_step_time(job, plan)
    assert at_tokens(update, 1.0) == update.step_time_s
    b = update.breakdown
    fixed = b.dp_comm_s + b.other_s + b.offload_s
    assert b.bubble_s > 0  # pp 2: a pipeline fill and drain, once per optimizer step
    once = fixed + b.bubble_s
    rest = update.step_time_s - once
    assert at_tokens(update, 0.5) == pytest.approx(once + rest / 2)
    assert at_tokens(update, 0.5, 0.25) == pytest.approx(once + b.compute_s / 4 + (rest - b.compute_s) / 2)
    assert at_tokens(update, 1.0, 1.0, 4.0) == pytest.approx(4 * update.step_time_s)
    # a last, smaller mini-batch: its share of the tokens, a whole optimizer step
    assert at_tokens(update, 1.0, 1.0, 2.5) == pytest.approx(3 * once + 2.5 * rest)


@pytest.mark.parametrize("fields", [DAPO, GRPO])
def test_generation_drains_to_the_longest_and_never_exceeds_every_response_at_it(fields):
    longest = fields["response_length"]
    job, plan = resolve(parse_request(fields))
    one_sequence, _ = decode_step_seconds(job, plan, 1, fields.get("prompt_length", 512))
    at_max = step(fields).rl.decode_s
    decodes = [step(fields, mean_response_length=m).rl.decode_s for m in (1, longest // 8, longest // 2, longest - 1)]
    assert all(longest * one_sequence <= d <= at_max for d in decodes)
    assert decodes == sorted(decodes) and decodes[0] < at_max / 4
    assert decodes[-1] == pytest.approx(at_max, rel=1e-3)  # continuous at the maximum


def test_a_mean_shortens_the_rl_step_and_counts_the_trained_tokens():
    at_max, short = step(DAPO), step(DAPO, mean_response_length=2048)
    assert short.step_time_s < at_max.step_time_s
    tokens = short.tokens_per_s * short.step_time_s
    assert tokens == pytest.approx(512 * 16 * (2048 + 2048))
    assert at_max.tokens_per_s * at_max.step_time_s == pytest.approx(512 * 16 * (2048 + 8192))


@pytest.mark.parametrize("share", [0.01, 0.05, 0.3, 0.5 - 1e-7, 0.5, 0.5 + 1e-3, 0.8, 0.999])
def test_the_length_shape_has_the_stated_mean(share):
    u = rate(share)
    segments = 4000
    area = sum(survival_mean(u, k / segments, (k + 1) / segments) for k in range(segments)) / segments
    assert area == pytest.approx(share, rel=1e-6, abs=1e-9)  # E[L] = the integral of P(L > x)
    second = sum(2 * (k + 0.5) / segments * survival_mean(u, k / segments, (k + 1) / segments)
                 for k in range(segments)) / segments  # E[L^2] = the integral of 2 x P(L > x)
    assert age_in_flight(u, share) == pytest.approx(second / (2 * share), rel=1e-4, abs=1e-9)
    assert share / 2 <= age_in_flight(u, share) <= 0.5  # at least half the mean (Jensen), at most half the maximum


@pytest.mark.parametrize("share", [0.01, 0.3, 0.5, 0.8, 0.999])
def test_quantiles_and_the_drains_peak(share):
    u = rate(share)
    for r in (0.0, 0.1, 0.5, 0.9):
        assert 1 - survival(u, quantile(u, r)) == pytest.approx(r, abs=1e-9)
    grid = max(survival(u, k / 10000) * (0.25 + k / 10000) for k in range(10001))
    assert drain_need(u, 0.25) == pytest.approx(grid, rel=1e-6) and 0.25 <= drain_need(u, 0.25) <= 1.25


def test_kv_blocks_on_demand_hold_more_sequences_when_responses_are_shorter():
    """vLLM allocates KV blocks as tokens come: with a mean below the longest the cache holds more sequences than at
    the longest (the engine's memory figure), never more than max_num_seqs, and as many at the maximum."""
    cap = rl_card("verl").defaults.max_num_seqs
    held = []
    for mean in (None, 4096, 2048, 512):
        job, plan = resolve(parse_request({**GRPO, **({"mean_response_length": mean} if mean else {})}))
        rollout = next(p for p in rl_memory(job, plan).phases if p.phase == "rollout").detail
        planned, live = sequences_per_rank(job, plan, rollout)
        assert planned == rollout["sequences_at_once"] // plan.rollout_dp and planned <= live <= max(planned, cap)
        held.append(live)
    assert held[0] == held[1] and held == sorted(held) and held[-1] > held[0]


def test_the_drain_is_integrated_in_the_cards_segments():
    segments = calibration_card().rl.response_drain_segments.value
    assert segments >= 1 and math.isfinite(segments)


ERROR = "mean_response_length 5000 is over response_length 4096"


def test_a_mean_over_the_maximum_is_refused_by_the_api():
    with pytest.raises(MeshplanError, match=ERROR) as exc:
        api.estimate_throughput(parse_request({**GRPO, "mean_response_length": 5000}))
    assert "from 1 to 4096" in str(exc.value)
    with pytest.raises(MeshplanError, match="mean_response_length is an RL field, not for job=sft"):
        resolve(parse_request({"model": "qwen3-8b", "num_gpus": 8, "framework": "verl", "job": "sft",
                               "mean_response_length": 100}))


def test_a_mean_over_the_maximum_is_refused_by_the_cli(capsys):
    code = cli.main(["throughput", "--model", "qwen3-30b-a3b", "--framework", "verl", "--num-gpus", "16", "--ep", "8",
                     "--job", "rl", "--response-length", "4096", "--mean-response-length", "5000"])
    err = capsys.readouterr().err
    assert code != 0 and ERROR in err and "from 1 to 4096" in err and "Traceback" not in err
    code = cli.main(["throughput", "--model", "qwen3-30b-a3b", "--framework", "verl", "--num-gpus", "16", "--ep", "8",
                     "--job", "rl", "--mean-response-length", "0"])
    err = capsys.readouterr().err
    assert code != 0 and "mean_response_length" in err and "greater than or equal to 1" in err


def test_a_mean_over_the_maximum_is_refused_by_the_mcp_tools():
    over, ok = call_tools(("estimate_throughput", {**GRPO, "mean_response_length": 5000}),
                          ("estimate_throughput", {**GRPO, "mean_response_length": 1000}))
    assert over.is_error and ERROR in over.content[0].text and "from 1 to 4096" in over.content[0].text
    assert not ok.is_error
    assert ok.structured_content["rl"] == step(GRPO, mean_response_length=1000).rl.model_dump(mode="json")
