"""verl's own FLOP count (meshplan/arithmetic/flops.verl_flops), what its logged actor MFU divides by its update's
seconds (volcengine/verl f6f910069 verl/utils/flops_counter.py, workers/megatron_workers.py update_actor), and the
step's tokens and squared lengths it reads (rl/step_time.step_token_moments); bench/rl_jobs.py scores verl's rows
with it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from meshplan.arithmetic.flops import model_flops_per_token, verl_flops
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.lengths import length_variance
from meshplan.rl.step_time import actor_update_seconds, logged_update_mfu, rl_step_time, step_token_moments

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from test_rl_stragglers import QWEN


def test_qwen3_moe_is_verls_moe_formula():
    # _estimate_qwen2_moe_flops: (h top_k moe_inter 3 + h E + h (q + k + v + o)) L + 2 V h, times 6 tokens, plus
    # 12 x sum s^2 x head_dim x heads x L (every key: non-causal)
    arch = resolve_model("qwen3-30b-a3b")
    h, layers, vocab = 2048, 48, 151936
    n = (h * 8 * 768 * 3 + h * 128 + h * (4096 + 512 + 512 + 4096)) * layers + 2 * vocab * h
    assert verl_flops(arch, 10240, 10240**2) == pytest.approx(6 * n * 10240 + 12 * 10240**2 * 128 * 32 * layers)
    # two sequences of 5,120 tokens count the same weights' FLOPs and half the attention of one of 10,240
    one, two = verl_flops(arch, 10240, 10240**2), verl_flops(arch, 10240, 2 * 5120**2)
    assert one - two == pytest.approx(12 * (10240**2 - 2 * 5120**2) * 128 * 32 * layers)
    # more than Megatron-LM's count (causal attention, no embedding matmul) at the recipe's longest sequence
    assert one / 10240 > 1.4 * model_flops_per_token(arch, 10240)


def test_deepseek_v3_is_verls_mla_formula():
    # _estimate_deepseek_v3_flops: MLA's projections, the router, top-8 + 1 shared expert, 3 dense layers, attention
    # at the query head's width (128 + 64) for both products
    arch = resolve_model("deepseek-v3")
    h, heads, layers = 7168, 128, 61
    attn = h * 1536 + heads * 192 * 1536 + h * (512 + 64) + heads * (192 - 64 + 128) * 512 + heads * 128 * h
    n = (h * 256 + h * 2048 * 9 * 3 + attn) * 58 + (h * 18432 * 3 + attn) * 3 + 2 * 129280 * h
    assert verl_flops(arch, 4000, 4000**2) == pytest.approx(6 * n * 4000 + 12 * 4000**2 * 192 * heads * layers)


def test_a_dense_model_and_an_uncounted_one():
    arch = resolve_model("qwen3-8b")
    h, layers = arch.hidden_size, arch.num_layers
    attn = h * (2 * arch.num_attention_heads + 2 * arch.num_kv_heads) * arch.head_dim
    n = (h * arch.ffn_hidden_size * 3 + attn) * layers + 2 * arch.vocab_size * h
    assert verl_flops(arch, 100, 100**2) == pytest.approx(
        6 * n * 100 + 12 * 100**2 * arch.head_dim * arch.num_attention_heads * layers)
    # a model_type verl's table lacks: it logs an MFU of 0, counted here as none
    assert verl_flops(arch.model_copy(update={"model_type": "nemotron_h"}), 100, 100**2) is None


def test_the_steps_tokens_and_squares_are_its_sequences_at_their_means_and_spread():
    job, _ = resolve(parse_request({**QWEN, "num_gpus": 8}))
    sequences = 512 * 16
    assert step_token_moments(job) == (sequences * 10240, sequences * 10240**2)  # every length at its longest
    job, _ = resolve(parse_request({**QWEN, "num_gpus": 8, "mean_response_length": 3000}))
    tokens, squares = step_token_moments(job)
    assert tokens == sequences * (2048 + 3000)
    assert squares == pytest.approx(sequences * (5048**2 + length_variance(3000, 8192)))


def test_the_bench_scores_verls_rows_by_verls_count_over_the_predicted_update():
    import rl_jobs

    rows = yaml.safe_load((rl_jobs.DEFAULT_VALIDATION / "production_configs_dev.yaml").read_text(encoding="utf-8"))
    row = next(r for r in rows if r.get("id") == "verl_qwen3_30b_h20_8")
    work = rl_jobs.workload_of(row, rl_jobs.workloads()["scripts"])
    res = rl_jobs.score_row(row, work)
    job, plan = resolve(parse_request({**work["request"], "num_gpus": 8, "gpu": "h20"}))
    seconds = actor_update_seconds(job, rl_step_time(job, plan)[0])
    expected = verl_flops(job.model, *step_token_moments(job)) / (seconds * 8 * 148e12)
    assert res["update_mfu_verl"] == pytest.approx(expected, abs=6e-4)
    assert res["update_mfu_verl"] > res["update_mfu"]


def test_compare_sets_a_verl_logs_mfu_beside_the_prediction_as_verl_counts_it():
    # tests/logs/verl_gh200_sglang.log: Qwen2.5-7B GRPO (model_type qwen2: verl's dense formula), its lengths stated
    from meshplan import api

    text = (Path(__file__).resolve().parent / "logs" / "verl_gh200_sglang.log").read_text(encoding="utf-8")
    req = {"model": "qwen2.5-7b", "num_gpus": 8, "gpu": "h100", "framework": "verl", "job": "rl",
           "prompt_length": 256, "response_length": 1024, "mean_response_length": 325, "mean_prompt_length": 103}
    got = next(f for f in api.compare_run(parse_request(req), text).figures if f.figure == "logged_mfu")
    job, plan = resolve(parse_request(req))
    timing = rl_step_time(job, plan)[0]
    expected = verl_flops(job.model, *step_token_moments(job)) / (actor_update_seconds(job, timing) * 8 * 989e12)
    assert got.predicted == pytest.approx(expected, rel=1e-3) and got.predicted > timing.update_mfu
    assert "verl's own FLOP count" in got.basis
    # SkyRL's card names no count of its own: its logged figure stays meshplan's
    skyrl, skyrl_plan = resolve(parse_request({**req, "framework": "skyrl"}))
    assert skyrl.rl_card.logged_mfu_flops == "model"
    assert logged_update_mfu(skyrl, rl_step_time(skyrl, skyrl_plan)[0]) == rl_step_time(skyrl, skyrl_plan)[0].update_mfu


def test_the_bench_scores_a_cpu_optimizer_study_as_the_cards_rate_times_the_shard_against_the_step_it_adds(tmp_path):
    """bench/rl_jobs.offload_study: a row whose notes give the step's multiplier at each optimizer share is scored as
    step_offload_time (the card's rate x the rank's optimizer shard x the share) against step x (multiplier - 1)."""
    import rl_jobs

    from meshplan.arithmetic.offload import offload_card
    from meshplan.knowledge.model_counts import total_params

    row = {"id": "synthetic_offload_study", "category": "pretrain", "framework": "Megatron-Core",
           "model": {"id": "Qwen/Qwen3-30B-A3B", "family": "qwen3_moe", "arch_type": "moe",
                     "num_layers": 48, "hidden_size": 2048, "num_attention_heads": 32, "num_kv_heads": 4,
                     "num_experts": 128, "top_k": 8, "moe_ffn_hidden_size": 768, "vocab_size": 151936},
           "hardware": {"num_gpus": 16, "gpu_type": "H100-SXM5-80GB", "gpu_memory_gb": 80, "gpus_per_node": 8},
           "parallelism": {"tp": 1, "pp": 1, "ep": 8, "etp": 1},
           "outcome": {"step_time_s": 2.0, "other": "optimizer CPU offload 50/100%: 1.5x/3.0x step time, saves ..."}}
    other = {"id": "no_study", "outcome": {"step_time_s": 1.0, "other": "nothing"}}
    (tmp_path / "production_configs_dev.yaml").write_text(yaml.safe_dump([row, other]), encoding="utf-8")
    res = rl_jobs.offload_study(tmp_path)
    assert list(res) == ["synthetic_offload_study"]
    shard = total_params(resolve_model("qwen3-30b-a3b")) / 16  # dense over dp 16, experts over edp 2: total / 16
    for got, share, factor in zip(res["synthetic_offload_study"]["shares"], (0.5, 1.0), (1.5, 3.0), strict=True):
        assert got["share"] == share
        assert got["cpu_step_s"] == pytest.approx(offload_card().cpu_adam_s_per_param * shard * share, abs=0.006)
        assert got["measured_s"] == pytest.approx(2.0 * (factor - 1))
