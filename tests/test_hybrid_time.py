"""A hybrid Mamba-2 model's step time (model_type nemotron_h on Megatron-Core / Megatron-Bridge): each layer timed by
its kind in the pattern (estimate/hybrid_time.py), each pipeline stage the sum over the layers it holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tree_under_test import tree_env

from meshplan import api
from meshplan.arithmetic.comm import alltoall_time
from meshplan.arithmetic.gemm import gemm_seconds
from meshplan.arithmetic.mamba import mamba_gemms, ssd_scan_flops
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.core.errors import MeshplanError
from meshplan.estimate.hybrid_time import hybrid_layer_time
from meshplan.estimate.layer_time import layer_time
from meshplan.estimate.perf import step_terms
from meshplan.knowledge.calibration import calibration_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

H8 = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"  # Nemotron-H-8B's pattern (its card)


def _terms(model: str = "nemotron-h-8b", **fields):
    job, plan = resolve(parse_request({"model": model, "gpu": "h100", "num_gpus": 8, **fields}))
    return step_terms(job, plan)


def test_throughput_answers_for_a_hybrid_on_every_face():
    """Before: throughput refused every hybrid ('not yet their step time'). The CLI's --json and the api agree."""
    req = parse_request({"model": "nemotron-h-8b", "gpu": "h100", "num_gpus": 8})
    report = api.estimate_throughput(req)
    assert report.step_time_s > 0 and 0 < report.mfu < 1
    assert any(a.startswith("Hybrid layers (24 Mamba-2, 4 attention, 24 MLP)") for a in report.assumptions)
    out = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "throughput", "nemotron-h-8b", "--gpu", "h100",
                          "--num-gpus", "8", "--json"], capture_output=True, text=True, env=tree_env(), check=True)
    assert json.loads(out.stdout)["step_time_s"] == report.step_time_s


@pytest.mark.parametrize("pp", [1, 2])
def test_a_stage_is_the_sum_over_the_pattern_it_holds(pp):
    """Each stage's compute is count x one layer per letter of the layers it holds (24 M, 24 -, 4 * in all), the
    output head's on the last stage; no transformer layer (attention and an MLP) is timed."""
    t = _terms(pp=pp)
    one = t.inputs.hybrid
    assert set(one) == {"M", "*", "-"} and t.inputs.dense is None and t.inputs.moe is None
    for s, row in enumerate(t.rows):
        held = "".join(H8[i] for i in t.inputs.pipeline.layers(s))
        expected = sum(held.count(k) * lt.compute for k, lt in one.items())
        head = t.inputs.head if s == t.inputs.pipeline.head_rank else 0.0
        assert row.compute == pytest.approx(expected + head, rel=1e-12)
        assert row.host == pytest.approx(len(held) * t.ctx.cal.host_time_per_layer_s)
    assert sum(len(t.inputs.pipeline.layers(s)) for s in range(pp)) == 52


def test_a_mamba_layer_is_its_gemms_its_passes_and_its_scan():
    """The Mamba-2 layer: in_proj and out_proj through the GEMM model; beside them the card's bf16 passes over the
    inner and conv widths and fp32 passes over the chunk states at HBM speed, the SSD scan's matmuls at the GEMMs'
    asymptote, and one hybrid layer's share of the hidden-sized passes (one norm and residual, not two)."""
    for tp in (1, 4):
        t = _terms(tp=tp)
        ctx, cal, m = t.ctx, t.ctx.cal, t.ctx.arch.mamba
        lt = t.inputs.hybrid["M"]
        assert lt.gemm == pytest.approx(gemm_seconds(mamba_gemms(ctx.arch, ctx.shard), cal, ctx.bf16_peak, None))
        tokens = ctx.shard.tokens
        mixer = tokens * ((27 * 8192 + 7 * (8192 + 2 * 8 * 128) + 19 * 8 * 128) * 2
                          + 12 * 4 * 128 * 64 * 128 / 128) / tp / ctx.hbm
        mixer += 3 * ssd_scan_flops(ctx.arch, ctx.shard) / (ctx.bf16_peak * cal.gemm_peak_fraction)
        hidden = cal.elementwise_passes * 2 * tokens * 4096 * 0.5 / (tp if ctx.plan.sequence_parallel else 1) / ctx.hbm
        assert lt.elementwise == pytest.approx(mixer + hidden, rel=1e-12)
        assert lt.attention == 0 and lt.cp == 0 and lt.ep == 0
        assert (m.d_inner, m.conv_dim, m.chunk_size) == (8192, 8192 + 2 * 8 * 128, 128)


def test_the_cards_mamba_constants_have_sources():
    constants = calibration_card().constants
    for name in ("hybrid_layer_hidden_share", "mamba_inner_passes", "mamba_conv_passes", "mamba_state_passes",
                 "mamba_scan_passes", "mamba_group_passes"):
        assert "Megatron" in constants[name].source or "mamba_ssm" in constants[name].source


def test_each_hybrid_layer_runs_one_tp_pair():
    """Megatron-Core's hybrid layers hold one mixer each, so one TP pair (in_proj / out_proj, qkv / attn_out, fc1 /
    fc2): a hybrid attention or MLP layer's TP traffic is less than a transformer layer's two pairs of the same
    shapes, and without overlap (tp_overlap_mode none) exactly half of it."""
    t = _terms(tp=4)
    whole = layer_time(t.ctx, False)
    for kind in ("M", "*", "-"):
        assert 0 < t.inputs.hybrid[kind].tp < whole.tp
    from dataclasses import replace
    plain = replace(t.ctx, tp_overlap_mode="none")
    assert hybrid_layer_time(plain, "*").tp == pytest.approx(layer_time(plain, False).tp / 2, rel=1e-12)
    assert hybrid_layer_time(plain, "M").tp == pytest.approx(hybrid_layer_time(plain, "-").tp, rel=1e-12)


def test_context_parallel_times_mamba_all_to_alls_and_attention_only_where_it_is():
    """cp 2: the Mamba-2 layer's MambaContextParallel all-to-alls (z, x, B, C, dt in, y out; the backward the same),
    the attention layer's CP traffic as a transformer layer's, none in an MLP layer."""
    t = _terms(cp=2)
    ctx = t.ctx
    group = mesh_groups(ctx.plan, law=ctx.law).cp
    widths = (8192, 8192, 1024, 1024, 128, 8192)
    fwd = sum(alltoall_time(ctx.shard.tokens * w * 2, group.size, group.stride, ctx.lk) for w in widths)
    one = t.inputs.hybrid
    assert one["M"].cp == pytest.approx(2 * fwd) and one["M"].cp_fwd == pytest.approx(fwd)
    assert one["-"].cp == 0 and one["*"].cp == pytest.approx(layer_time(ctx, False).cp)


def test_an_moe_hybrid_times_its_experts_and_dispatch():
    """Nemotron 3 Nano: its E layers carry the routed and shared experts' GEMMs and the EP all-to-all; its M and *
    layers none of either."""
    t = _terms("nemotron-3-nano-30b-a3b", ep=8)
    one = t.inputs.hybrid
    assert set(one) == {"M", "*", "E"}
    assert one["E"].ep > 0 and one["M"].ep == 0 and one["*"].ep == 0
    tp = _terms("nemotron-3-nano-30b-a3b", ep=4, tp=2).inputs.hybrid
    assert tp["E"].tp > 0  # its shared expert's pair


def test_recompute_repeats_the_hybrid_layers_forward():
    base, full = _terms(), _terms(recompute="full")
    assert base.rows[0].recompute == 0
    expected = sum(H8.count(k) * (lt.fwd_compute + lt.overhead * lt_cal + lt.tp_fwd + lt.cp_fwd)
                   for k, lt in full.inputs.hybrid.items()
                   for lt_cal in (full.ctx.cal.forward_share_of_layer_overhead,))
    assert full.rows[0].recompute == pytest.approx(expected, rel=1e-12)


def test_muon_on_a_hybrid_is_refused_naming_it():
    with pytest.raises(MeshplanError, match="Muon"):
        _terms(optimizer="muon")
