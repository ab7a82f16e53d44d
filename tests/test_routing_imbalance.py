"""moe_routing_imbalance (issue 15 item 1): the most loaded EP rank's routed tokens over the mean. The step waits for
that rank (its expert GEMMs, permutes and all-to-all) and it holds that many more routed activations; left out it is
1.0, today's balanced figures exactly; no framework key says it (Megatron's force-balance switch is for benchmarks)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.api import estimate_memory, estimate_throughput
from meshplan.arithmetic import activations
from meshplan.arithmetic.activations import Layout, layer_activations, shape_of
from meshplan.arithmetic.flops import moe_gemms
from meshplan.arithmetic.gemm import gemm_seconds
from meshplan.core.errors import MeshplanError
from meshplan.estimate import moe_time, perf
from meshplan.estimate.memory import ep_rank_load
from meshplan.faces.cli import main
from meshplan.knowledge.cards import framework_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

Q30 = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, seq_length=4096, global_batch_size=256, ep=8, etp=1)


def job_plan(**fields):
    return resolve(Request(**{**Q30, **fields}))


def test_left_out_is_balanced_and_gives_the_same_figures_as_one():
    job, _ = job_plan()
    assert job.moe_routing_imbalance == 1.0
    assert any("moe_routing_imbalance not given: 1.0" in n for n in job.notes)
    left_out, one = Request(**Q30), Request(**Q30, moe_routing_imbalance=1.0)
    t0, t1 = estimate_throughput(left_out), estimate_throughput(one)
    assert t0.step_time_s == t1.step_time_s and t0.breakdown == t1.breakdown and t0.mfu == t1.mfu
    assert estimate_memory(left_out).stages == estimate_memory(one).stages
    assert any(a.startswith("Routing balanced (moe_routing_imbalance 1.0)") for a in t0.assumptions)


def test_the_load_applies_across_ep_ranks_only():
    job, plan = job_plan(moe_routing_imbalance=1.4)
    assert ep_rank_load(job, plan) == 1.4
    job1, plan1 = job_plan(moe_routing_imbalance=1.4, ep=1)
    assert ep_rank_load(job1, plan1) == 1.0  # one EP rank holds every expert: its total is the mean
    report = estimate_throughput(Request(**{**Q30, "ep": 1, "moe_routing_imbalance": 1.4}))
    assert any("no effect at ep=1" in a for a in report.assumptions)


def test_layer_time_scales_the_busiest_ranks_experts_permutes_and_all_to_all():
    load = 1.5
    _, plan = job_plan()
    captured = {}
    original = perf.layer_time

    def spy(ctx, moe):
        captured[moe] = ctx
        return original(ctx, moe)

    perf.layer_time = spy
    try:
        estimate_throughput(Request(**Q30))
    finally:
        perf.layer_time = original
    # the GPU's seconds: without the host's per-expert launch floor (tests/test_grouped_gemm_launches.py), which
    # binds at this micro-batch and does not grow with the load
    ctx = replace(captured[True], expert_launches=(0.0, 0.0))
    assert ctx.routed_load == 1.0
    base, busy = perf.layer_time(ctx, True), perf.layer_time(replace(ctx, routed_load=load), True)
    arch, sh, cal = ctx.arch, ctx.shard, ctx.cal
    # GEMMs: each local expert's rows times the load, through the same rows curve
    gemms = moe_gemms(arch, sh)
    scaled = [replace(g, m=g.m * load) if g.name.startswith("expert_") else g for g in gemms]
    attn = base.gemm - gemm_seconds(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    assert busy.gemm == pytest.approx(attn + gemm_seconds(scaled, cal, ctx.bf16_peak, ctx.fp8_peak,
                                                               ctx.ridge_rows), rel=1e-12)
    assert busy.gemm > base.gemm
    # memory-bound passes: the dispatcher's permutes and the routed FFN activations, (load - 1) more of each
    routed = sh.tokens * arch.moe.top_k * arch.hidden_size / plan.etp
    routed_ffn = sh.tokens * arch.moe.top_k * arch.moe.expert_ffn_hidden_size / plan.etp
    extra = (load - 1) * (cal.moe_dispatch_passes * 2 * routed + cal.elementwise_passes * 2 * routed_ffn) / ctx.hbm
    assert busy.elementwise - base.elementwise == pytest.approx(extra, rel=1e-9)
    # all-to-all: the dispatch the step times carries the most loaded rank's bytes
    sent = []
    original_dispatch = moe_time.dispatch_time

    def record(copy_bytes, *args, **kwargs):
        sent.append(copy_bytes)
        return original_dispatch(copy_bytes, *args, **kwargs)

    moe_time.dispatch_time = record
    try:
        perf.layer_time(ctx, True)
        perf.layer_time(replace(ctx, routed_load=load), True)
    finally:
        moe_time.dispatch_time = original_dispatch
    assert sent == [sh.tokens * arch.hidden_size * 2, sh.tokens * arch.hidden_size * 2 * load]
    assert busy.ep > base.ep
    # the router and the attention side do not move
    assert busy.attention == base.attention and busy.tp == base.tp and busy.overhead == base.overhead


def test_step_slows_and_mfu_counts_the_mean_work():
    t1 = estimate_throughput(Request(**Q30))
    t2 = estimate_throughput(Request(**Q30, moe_routing_imbalance=1.3))
    assert t2.step_time_s > t1.step_time_s
    assert t2.model_flops_per_step == t1.model_flops_per_step
    assert t2.mfu == pytest.approx(t1.mfu * t1.step_time_s / t2.step_time_s, rel=1e-12)
    assert any(a.startswith("Routing imbalance 1.3: the most loaded") for a in t2.assumptions)


def test_routed_activations_scale_by_the_load():
    job, _ = job_plan()
    shape = shape_of(job.model)
    lay = Layout(tokens=4096, seq_kv=4096, tp=1, sp=False, etp=1, flash=True, dropout=False, swiglu_unfused=False,
                 fp8=False, ep=8)
    load = 1.25
    base = layer_activations(shape, lay, True, "none")["moe"]
    busy = layer_activations(shape, lay._replace(routed_load=load), True, "none")["moe"]
    rows = 4096 * shape.top_k  # t * top_k * etp on average
    per_row = lay.moe.per_copy + lay.moe.hidden_bytes * shape.h + 2 * shape.h  # kept per copy + bf16 fc1 input
    expert = activations._mlp(shape, shape.f_expert, rows, 1, 2, False)
    assert busy - base == pytest.approx((load - 1) * (rows * per_row + expert), rel=1e-12)
    # torchtitan's op-level SAC keeps the dispatch output (the received copies, scaled) and the combine output (not)
    sac0 = layer_activations(shape, lay, True, "op_sac")["moe"]
    sac1 = layer_activations(shape, lay._replace(routed_load=load), True, "op_sac")["moe"]
    assert sac1 - sac0 == pytest.approx((load - 1) * 2 * 4096 * shape.top_k * shape.h, rel=1e-12)


def test_peak_memory_grows_on_every_stage():
    m1 = estimate_memory(Request(**Q30, pp=2))
    m2 = estimate_memory(Request(**Q30, pp=2, moe_routing_imbalance=1.5))
    for a, b in zip(m1.stages, m2.stages, strict=True):
        assert b.activations_bytes > a.activations_bytes and b.total_bytes > a.total_bytes


@pytest.mark.parametrize("fields,words", [
    (dict(moe_routing_imbalance=0.9), "moe_routing_imbalance"),
    (dict(model="llama-3.1-8b", ep=1, moe_routing_imbalance=1.2), "dense model"),
])
def test_bad_values_are_clear_errors(fields, words):
    with pytest.raises(MeshplanError, match=words):
        estimate_throughput(parse_request({**Q30, **fields}))


def test_cli_flag_and_its_errors(capsys):
    base = ["throughput", "--model", "qwen3-30b-a3b", "--num-gpus", "16", "--ep", "8", "--etp", "1"]
    assert main([*base, "--moe-routing-imbalance", "1.3"]) == 0
    assert "Routing imbalance 1.3" in capsys.readouterr().out
    assert main([*base, "--moe-routing-imbalance", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "moe_routing_imbalance" in err and "Traceback" not in err


def test_mcp_schema_bounds_it():
    schema = Request.model_json_schema()["properties"]["moe_routing_imbalance"]
    numbers = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "number"]
    assert numbers and numbers[0]["minimum"] == 1.0


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_render_writes_no_key_but_the_cards_note_and_round_trips(framework):
    job, plan = job_plan(framework=framework, moe_routing_imbalance=1.3)
    job1, _ = job_plan(framework=framework)
    result, balanced = render(framework, job, plan), render(framework, job1, plan)
    facts = framework_card(framework).moe_routing
    key = facts.force_balance_key.split(".")[-1].lstrip("-")
    assert key not in result.text and result.text == balanced.text
    assert facts.note.format(imbalance=1.3) in result.notes
    assert "1.3x the mean" in " ".join(result.notes)
    parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
    assert parsed == parse_plan(framework, balanced.variant, balanced.text, job.model.num_layers)
    assert parsed["ep"] == plan.ep


def test_dense_render_says_nothing_about_routing():
    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2))
    assert not any("Routing imbalance" in n for n in render("megatron-core", job, plan).notes)
