"""The Megatron-LM peer harness (bench/megatron_peer.py) runs Megatron-Core 0.19.2's own
megatron/training/theoretical_memory_usage.py from the pinned wheel and feeds it the arguments of a meshplan
Job/Plan: its answers on small models equal the function's formulas worked out by hand (bf16 weights, fp32
grads, master and Adam moments: 18 bytes per parameter, or 6 + 12/dp with the distributed optimizer;
Korthikanti et al. Table 2 activations). Slow: downloads the megatron-core wheel once (cached)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.knowledge.hardware import get_gpu
from meshplan.schema.model import Architecture, MoESpec
from meshplan.schema.plan import Job, Plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import megatron_peer

from meshplan.request.resolve import carry_cards

pytestmark = pytest.mark.slow

H, LAYERS, HEADS, HEAD_DIM, FFN, VOCAB, SEQ = 1024, 4, 16, 64, 4096, 50257, 1024
MB = 1 << 20


def dense_job(**arch) -> Job:
    model = Architecture(name="peer test", model_type="gpt", num_layers=LAYERS, hidden_size=H, ffn_hidden_size=FFN,
                         num_attention_heads=HEADS, num_kv_heads=HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB,
                         tie_word_embeddings=True, gated_mlp=False, activation="gelu", norm_type="layernorm",
                         origin="test", **arch)
    return carry_cards(Job(model=model, gpu=get_gpu("h100"), num_gpus=8, gpus_per_node=8, seq_length=SEQ,
                           global_batch_size=8,
                           framework="megatron-core"))


def test_runs_the_wheels_own_source():
    module = megatron_peer.peer_module()
    assert module.__file__.endswith("megatron/training/theoretical_memory_usage.py")
    assert "site-packages" not in module.__file__ and "wheels/megatron-core-0.19.2" in module.__file__


def test_dense_distributed_optimizer_without_sp():
    """tp=1, dp=8, distributed optimizer, no SP: weights at 6 + 12/8 bytes, the without-SP activations."""
    answer = megatron_peer.peer_estimate(dense_job(), Plan(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1))
    vocab = 50304  # 50257 padded to a multiple of 128 x tp
    per_layer = 4 * H * H + 2 * H * FFN + 2 * 2 * H  # QKV + out (no GQA) + MLP + two LayerNorms (weight, bias)
    params = LAYERS * per_layer + 2 * H + H * vocab  # + final LayerNorm + tied embedding
    assert params == 101_861_376
    assert answer.weight_and_optimizer_bytes == pytest.approx(params * (6 + 12 / 8), rel=1e-12)
    tokens = SEQ * 1
    activations = (tokens * H * (10 + 24 / 1) * LAYERS  # per layer sbh(10 + 24/t), every layer
                   + 8 * tokens + tokens * H  # embedding input and dropout, pp=1 microbatch in flight
                   + 2 * (tokens * vocab + tokens * H))  # pp=1: bf16 logits and final-norm output
    assert answer.activation_bytes == pytest.approx(activations * 1.05, rel=1e-12)  # its 5% allowance
    assert answer.total_bytes == pytest.approx(763_960_320 + 261_221_990.4, rel=1e-12)
    assert answer.branch == "without_sp"


def test_sequence_parallel_selective_branch():
    """tp=2 with SP and selective recompute: Table 2's sbh(18 + 4 ffn/h)/t per layer, weights at 6 + 12/4."""
    plan = Plan(tp=2, pp=1, dp=4, sequence_parallel=True, recompute="selective", zero_stage=1, micro_batch_size=1)
    answer = megatron_peer.peer_estimate(dense_job(), plan)
    vocab = 50432  # padded to a multiple of 128 x 2
    sharded = LAYERS * (4 * H * H + 2 * H * FFN) + H * vocab
    replicated = LAYERS * 2 * 2 * H + 2 * H
    assert answer.weight_and_optimizer_bytes == pytest.approx((sharded / 2 + replicated) * (6 + 12 / 4), rel=1e-12)
    tokens = SEQ
    activations = (tokens * H * (18 + 4 * FFN / H) * LAYERS + 8 * tokens + tokens * H
                   + tokens * H * 4 * (1 + vocab / H)) / 2
    assert answer.activation_bytes == pytest.approx(activations, rel=1e-12)
    assert answer.activation_bytes == pytest.approx(177_213_440, rel=1e-12)
    assert answer.branch == "with SP"


def test_moe_weights_split_by_expert_parallelism():
    """One dense and one MoE layer (8 experts of 512, SwiGLU, GQA 16/4, RMSNorm, untied), ep=4 on 8 GPUs:
    expert weights over ep at 6 + 12/(8/4) bytes, the rest at 6 + 12/8."""
    job = dense_job()
    moe = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=512, moe_layers=[1])
    model = job.model.model_copy(update={"num_layers": 2, "num_kv_heads": 4, "gated_mlp": True, "activation": "silu",
                                         "norm_type": "rmsnorm", "tie_word_embeddings": False, "moe": moe})
    job = job.model_copy(update={"model": model})
    args = megatron_peer.peer_args(job, Plan(tp=1, pp=1, ep=4, etp=1, dp=8, zero_stage=1))
    assert args.moe_layer_freq == [0, 1] and args.num_query_groups == 4 and args.normalization == "RMSNorm"
    attention = 2 * H * H * (1 + 4 / 16)
    embedding = H * 50304
    sharded = attention + 2 * H * FFN * 1.5 + attention + 2 * embedding  # untied at pp=1: input and output
    replicated = 2 * H + (2 * H + H * 8) + H  # norms, the router (no bias), final norm
    experts = 2 * H * 512 * 8 * 1.5 / 4
    expected = (sharded + replicated) * (6 + 12 / 8) + experts * (6 + 12 / 2)
    assert expected == 944_211_456
    assert megatron_peer.peer_module().compute_weight_and_optimizer_memory(args) == pytest.approx(expected, rel=1e-12)


def test_hybrid_model_is_refused_as_megatron_does():
    args = megatron_peer.peer_args(dense_job(), Plan(dp=8))
    args.hybrid_layer_pattern = "M*M*"
    assert megatron_peer.peer_module().report_theoretical_memory(args) is None
