"""KempnerForge's Muon (KempnerForge 0c4eba1 kempnerforge/training/optimizer.py, register_optimizer("muon")), as
its card's muon section says it runs: every 2-D weight at most 10 times longer than wide, one matrix per nn.Linear,
each rank iterating in fp32 on its own FSDP2 shard's rows; the rest on AdamW. Before, PR005 refused Muon on
KempnerForge as a framework without one."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.read import import_config
from meshplan.adapters.render import render
from meshplan.arithmetic.flops import Shard
from meshplan.arithmetic.gemm import gemm_efficiency
from meshplan.arithmetic.muon import newton_schulz_seconds, ns_gemms, takes_muon, vocab_matrices
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search.oracle import exhaustive_top_k

L8B = dict(model="llama-3.1-8b", framework="kempnerforge", gpu="h100", num_gpus=16, global_batch_size=64)
MUON = framework_card("kempnerforge").muon


def test_muon_on_kempnerforge_passes_check():
    report = api.check_config(Request(**L8B, optimizer="muon"))
    assert "PR005" not in {f.id for f in report.findings}, report.findings


def test_the_matrices_keep_one_bf16_momentum_the_vocabulary_stays_on_adamw():
    """Llama-3.1-8B over 16 FSDP2 ranks: KempnerForge's bf16 AdamW keeps two 2-byte moments; Muon one 2-byte
    momentum (zeros_like(p.grad)) on the 32 layers' q, k, v, o, gate, up, down; the 128,256 x 4,096 embedding and
    output layer (31 times longer than wide) stay on AdamW."""
    adam = api.estimate_memory(Request(**L8B)).stages[0].optimizer_bytes
    muon = api.estimate_memory(Request(**L8B, optimizer="muon")).stages[0].optimizer_bytes
    h, f, kv = 4096, 14336, 8 * 128
    matrices = 32 * (2 * h * h + 2 * kv * h + 3 * f * h)
    assert adam - muon == pytest.approx(2 * matrices / 16, abs=64)


def test_which_weights_take_muon_is_its_aspect_ratio():
    """_is_muon_eligible: max / min <= 10 on the global shape. Mixtral's 32,000 x 4,096 vocabulary (7.8) takes
    Muon, Llama-3's 128,256 x 4,096 (31.3) does not; Mixtral's 8-expert router (512) does not."""
    mixtral, llama = resolve_model("mixtral-8x7b"), resolve_model("llama-3.1-8b")
    assert vocab_matrices(mixtral, 32000 * 4096, 32000 * 4096, MUON) != []
    assert vocab_matrices(llama, 128256 * 4096, 128256 * 4096, MUON) == []
    assert not takes_muon(8, 4096, MUON) and takes_muon(1024, 4096, MUON)


def test_each_rank_iterates_in_fp32_on_its_shards_rows():
    """One Llama-3.1-8B layer at dp 16, tp 1: q and o (4096 x 4096), k and v (1024 x 4096), gate and up
    (14336 x 4096), down (4096 x 14336), each shard's rows / 16 iterated as stored (X X^T over the rows), at the
    H100's FP32 67 TFLOP/s: no matrix is dealt out whole, none transposed to its smaller side."""
    arch, cal, peak = resolve_model("llama-3.1-8b"), calibration("kempnerforge"), 67e12
    shard = Shard(4096, 1, 1, 1, False)

    def one(rows: float, cols: float) -> float:
        return sum(g.flops / (peak * gemm_efficiency(g, cal)) for g in ns_gemms(rows / 16, cols, 5, "rows"))

    want = 2 * one(4096, 4096) + 2 * one(1024, 4096) + 2 * one(14336, 4096) + one(4096, 14336)
    assert newton_schulz_seconds(arch, shard, [False], MUON, cal, peak, 16, 16) == pytest.approx(want, rel=1e-12)
    step = api.estimate_throughput(Request(**L8B, optimizer="muon"))
    assert step.step_time_s > api.estimate_throughput(Request(**L8B)).step_time_s
    assert any("FP32" in a and "FSDP2 shard" in a for a in step.assumptions)


def test_render_writes_the_optimizer_name_and_import_reads_it_back():
    job, plan = resolve(Request(**L8B, optimizer="muon"))
    text = render("kempnerforge", job, plan).text
    assert '[optimizer]\nname = "muon"' in text
    assert import_config(text, "muon.toml").request["optimizer"] == "muon"
    lion = import_config(text.replace('name = "muon"', 'name = "lion"'), "lion.toml")
    assert "optimizer" not in lion.request and any("lion" in u for u in lion.unsupported)


def test_another_newton_schulz_count_is_said_the_momentum_is_not_a_cost():
    """optimizer.muon_ns_steps was dropped silently (an irrelevant-looking '_steps' key) though meshplan times the
    card's 5 iterations; muon_momentum was 'no meshplan field' though it changes no memory or time."""
    toml = ('[distributed]\ndp_shard = 16\n[train]\nbatch_size = 1\n[optimizer]\nname = "muon"\n{}\n'
            'muon_momentum = 0.9\n')
    same = import_config(toml.format("muon_ns_steps = 5"), "five.toml")
    assert same.unsupported == [] and any("muon_momentum" in n for n in same.notes)
    other = import_config(toml.format("muon_ns_steps = 3"), "three.toml")
    assert any("muon_ns_steps = 3" in u for u in other.unsupported)


@pytest.mark.parametrize("fields", [dict(L8B), dict(L8B, model="qwen3-30b-a3b", gpu="h200")])
def test_the_search_finds_the_oracles_top_k_under_kempnerforges_muon(fields):
    """The search's floors count Muon's one momentum on every parameter (fewer bytes than the estimate's, which
    keeps AdamW's two on the weights too rectangular for it): still floors, so the search stays exact."""
    request = Request(**fields, optimizer="muon")
    got = [c.throughput.step_time_s for c in api.recommend(request, top_k=3).candidates]
    assert got and got == pytest.approx([r.step_time_s for r in exhaustive_top_k(request, 3)], rel=1e-12)
