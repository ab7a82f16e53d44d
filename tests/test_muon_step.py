"""Muon's optimizer step: Newton-Schulz FLOPs per matrix, the matrices a rank orthogonalizes, how the layer-wise
distributed optimizer shares them out, and the time it adds to the step (meshplan/arithmetic/muon.py)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.flops import Shard
from meshplan.arithmetic.gemm import gemm_efficiency
from meshplan.arithmetic.muon import Matrix, layer_matrices, matrix_params, newton_schulz_seconds, ns_gemms
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.muon_card import MuonFacts
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def facts(tp_mode: str = "duplicated", split_qkv: bool = True) -> MuonFacts:
    return MuonFacts(tp_mode=tp_mode, ns_steps=5, split_qkv=split_qkv, zero_stages=[0, 1], zero_why="test",
                     source="test")


def test_newton_schulz_flops_run_on_the_smaller_side():
    # Kimi-K2's expert down-projection, 7168 x 2048: per step X X^T 2*2048^2*7168, A A 2*2048^3, B X 2*2048^2*7168
    m, n = 2048, 7168
    per_step = 4 * m * m * n + 2 * m**3
    assert sum(g.flops for g in ns_gemms(n, m, 5)) == 5 * per_step
    assert sum(g.flops for g in ns_gemms(m, n, 5)) == 5 * per_step == pytest.approx(6.87e11, rel=1e-3)


def test_qkv_is_split_per_query_group():
    # Llama-3.1-8B: 32 heads, 8 KV heads, head 128, hidden 4096. Duplicated (whole matrices): 8 groups of a
    # 512-row Q block and two 128-row K/V blocks; blockwise at TP2 the rank's own 4 groups.
    arch = resolve_model("llama-3.1-8b")
    whole = layer_matrices(arch, Shard(8192, 2, 1, 1, True), False, facts("duplicated"))
    assert whole[:2] == [Matrix(512, 4096, 8), Matrix(128, 4096, 16)]
    assert whole[2:] == [Matrix(4096, 4096), Matrix(2 * 14336, 4096), Matrix(4096, 14336)]
    local = layer_matrices(arch, Shard(8192, 2, 1, 1, True), False, facts("blockwise"))
    assert local[:2] == [Matrix(512, 4096, 4), Matrix(128, 4096, 8)]
    assert local[2:] == [Matrix(4096, 2048), Matrix(14336, 4096), Matrix(4096, 7168)]
    fused = layer_matrices(arch, Shard(8192, 1, 1, 1, False), False, facts(split_qkv=False))
    assert fused[0] == Matrix(4096 + 2 * 1024, 4096)


def test_experts_are_the_local_ones_and_shared_over_expert_dp():
    arch = resolve_model("qwen3-30b-a3b")  # 128 experts of 768, hidden 2048
    mats = layer_matrices(arch, Shard(4096, 1, 8, 1, False), True, facts())
    experts = [m for m in mats if m.expert]
    assert experts == [Matrix(2 * 768, 2048, 16, True), Matrix(2048, 768, 16, True)]
    cal, peak, sh = calibration("megatron-core"), 989e12, Shard(4096, 1, 8, 1, False)

    def seconds(rows: int, cols: int) -> float:
        return sum(g.flops / (peak * gemm_efficiency(g, cal)) for g in ns_gemms(rows, cols, 5))

    fc1, fc2 = seconds(2 * 768, 2048), seconds(2048, 768)
    experts = 4 * 16 * (fc1 + fc2)  # 4 MoE layers of 16 local experts, every one on this rank at expert-dp 1
    at = {g: newton_schulz_seconds(arch, sh, [True] * 4, facts(), cal, peak, 1, g) for g in (1, 2, 10**9)}
    assert at[1] - at[2] == pytest.approx(experts / 2)  # two expert-dp ranks share the experts' matrices
    assert at[1] - at[10**9] == pytest.approx(experts - max(fc1, fc2))  # but each does at least the costliest


def test_a_rank_never_does_less_than_its_costliest_matrix():
    arch = resolve_model("llama-3.1-8b")
    cal, peak, sh = calibration("megatron-core"), 989e12, Shard(8192, 1, 1, 1, False)
    alone = newton_schulz_seconds(arch, sh, [False], facts(), cal, peak, 10**9, 1)
    costliest = max(sum(g.flops / (peak * gemm_efficiency(g, cal)) for g in ns_gemms(m.rows, m.cols, 5))
                    for m in layer_matrices(arch, sh, False, facts()))
    assert alone == pytest.approx(costliest)


def test_matrix_params_exclude_embeddings_and_count_the_ranks_shards():
    arch = resolve_model("llama-3.1-8b")
    dense, expert = matrix_params(arch, Shard(8192, 2, 1, 1, True), [False] * 32, facts())
    per_layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    assert (dense, expert) == (32 * per_layer / 2, 0.0)


def test_muon_step_adds_its_newton_schulz_time_to_adams():
    # Llama-3.1-8B on 8 H100, Megatron-Core, TP1 DP8 with the distributed optimizer: Muon's step replaces Adam's
    # 30 B per matrix parameter of state traffic by 22 B and adds the rank's share of the Newton-Schulz GEMMs.
    base = dict(model="llama-3.1-8b", framework="megatron-core", num_gpus=8, tp=1, seq_length=4096,
                global_batch_size=64)
    adam_job, adam_plan = resolve(Request(**base))
    muon_job, muon_plan = resolve(Request(**base, optimizer="muon"))
    adam, muon = estimate_throughput(adam_job, adam_plan), estimate_throughput(muon_job, muon_plan)
    card, cal = framework_card("megatron-core"), calibration("megatron-core")
    arch, sh = muon_job.model, Shard(4096, 1, 1, 1, False)
    ns = newton_schulz_seconds(arch, sh, [False] * 32, card.muon, cal, muon_job.gpu.bf16_flops, 8, 1)
    matrices = matrix_params(arch, sh, [False] * 32, card.muon)[0] / 8
    hbm = muon_job.gpu.hbm_bandwidth * cal.hbm_efficiency
    assert muon.breakdown.other_s - adam.breakdown.other_s == pytest.approx(
        ns - matrices * (cal.optimizer_bytes_per_param - cal.muon_bytes_per_param) / hbm, rel=1e-9)
    assert ns > 0.05  # about 0.1 s: 32 layers of 4096-wide matrices, 1/8 of them per rank
    assert any(a.startswith("Muon: each weight matrix") and "duplicated" in a for a in muon.assumptions)
