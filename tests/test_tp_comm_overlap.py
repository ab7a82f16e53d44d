"""tp_comm_overlap (issue 15 item 4): the TP time each framework mode hides beside its GEMMs (tp_overlap.tp_hidden), the
mode a plan runs (the framework card's tp_overlap), its preconditions (TP005) and its rendered keys."""

from __future__ import annotations

import pytest

from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.api import check_config, estimate_throughput
from meshplan.estimate.tp_overlap import tp_hidden, tp_overlap_mode, tp_ring_passes
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

L70 = dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=2, global_batch_size=256)


def test_hidden_per_mode_exact_cases():
    # one collective 1 s; GEMMs longer than it: each mode hides its collectives whole, at most (tp-1)/tp chunked
    big = [(2.0, 3.0)]
    assert tp_hidden("none", 1.0, big, 8) == 0.0
    assert tp_hidden("wgrad", 1.0, big, 8) == 1.0  # the dgrad reduce-scatter beside wgrad
    assert tp_hidden("wgrad", 1.0, big, 8, sp=False) == 2.0  # the dgrad all-reduce: two collectives' time
    assert tp_hidden("userbuffers", 1.0, big, 8, rs_splits=4) == pytest.approx(1 + 1 + 0.75 + 1)
    assert tp_hidden("async_tp", 1.0, big, 8) == pytest.approx(1 + 1 + 0.875 + 0.875)
    # GEMMs shorter than the collective: at most the GEMM's time (chunked: (tp-1)/tp of it)
    small = [(0.4, 0.8)]
    assert tp_hidden("wgrad", 1.0, small, 4) == pytest.approx(0.4)
    assert tp_hidden("userbuffers", 1.0, small, 4, rs_splits=4) == pytest.approx(0.3 + 0.6 + 0.6 + 0.4)
    assert tp_hidden("async_tp", 1.0, small, 4) == pytest.approx(0.3 + 0.6 + 0.6 + 0.3)
    assert tp_hidden("userbuffers", 1.0, small, 1) == 0.0  # no TP


def test_local_shard_hides_each_collective_behind_its_own_gemm():
    # nanotron's asynchronous TP linears, one collective 1 s, input GEMM 2 s, output GEMM 3 s (forward), tp 4:
    # forward gather beside the input GEMM's local shard (2/4), forward reduce-scatter exposed, backward gradient
    # gather beside the output GEMM's local-shard dgrad (3/4), the input's re-gather beside its dgrad (2 >= 1) and
    # its reduce-scatter beside its wgrad (2 >= 1)
    big = [(2.0, 3.0)]
    assert tp_hidden("local_shard", 1.0, big, 4, input_regather=True) == pytest.approx(0.5 + 0.75 + 1 + 1)
    assert tp_hidden("local_shard", 1.0, big, 4) == pytest.approx(0.5 + 0.75 + 1)  # the input's gradient kept
    # GEMMs shorter than the collective: each hides at most its GEMM's (or its local shard's) time
    small = [(0.4, 0.8)]
    assert tp_hidden("local_shard", 1.0, small, 4, input_regather=True) == pytest.approx(0.1 + 0.2 + 0.4 + 0.4)
    # without sequence parallelism: the dgrad all-reduce beside wgrad, the forward all-reduce exposed
    assert tp_hidden("local_shard", 1.0, big, 4, sp=False, input_regather=True) == 2.0
    assert tp_hidden("local_shard", 1.0, big, 1) == 0.0  # no TP


def test_nanotron_counts_its_backward_input_gather_and_times_its_schedule():
    # the card's tp_overlap (functional.py's async linears): 5 collectives per TP pair under SP, 2 forward, 3 backward
    job, plan = resolve(Request(framework="nanotron", model="llama-3.1-8b", num_gpus=8, tp=4, dp=2,
                                global_batch_size=64, micro_batch_size=16))
    assert tp_overlap_mode(job.card, plan) == "local_shard" and job.card.tp_overlap.backward_input_gather
    assert tp_ring_passes(((1, 1), (1, 1)), True, 2, input_regather=True) == (4.0, 6.0)
    assert tp_ring_passes(((1, 1), (1, 1)), False, 2, input_regather=True) == (4.0, 4.0)  # no gather without SP
    report = estimate_throughput(Request(framework="nanotron", model="llama-3.1-8b", num_gpus=8, tp=4, dp=2,
                                         global_batch_size=64, micro_batch_size=16))
    assert report.breakdown.tp_comm_s > 0
    assert any("4 all-gathers/reduce-scatters per layer forward and 6 backward" in a for a in report.assumptions)
    assert any("local shard" in a for a in report.assumptions)


def test_mode_follows_the_framework_card_and_the_switch():
    def mode(framework, **fields):
        job, plan = resolve(Request(framework=framework, **{**L70, **fields}))
        return tp_overlap_mode(job.card, plan)

    assert mode("megatron-core") == "wgrad"
    assert mode("megatron-core", tp_comm_overlap=True) == "userbuffers"
    assert mode("megatron-bridge", tp_comm_overlap=True) == "userbuffers"
    assert mode("torchtitan", pp=1) == "none"
    assert mode("torchtitan", pp=1, torch_compile=True, tp_comm_overlap=True) == "async_tp"
    assert mode("verl") == "wgrad" and mode("skyrl") == "wgrad"  # Megatron engines on TE; no switch rendered
    assert mode("deepspeed", pp=1) == "fraction"  # the calibration's tp_overlap where the TP path is unread
    assert mode("nanotron", pp=1) == "local_shard"  # its asynchronous TP linears (functional.py)


def test_left_out_is_the_framework_default_off():
    _, plan = resolve(Request(framework="megatron-core", **L70))
    assert plan.tp_comm_overlap is False


def test_overlap_shortens_the_exposed_tp_time_and_the_step():
    off = estimate_throughput(Request(framework="megatron-core", **L70))
    on = estimate_throughput(Request(framework="megatron-core", tp_comm_overlap=True, **L70))
    assert on.breakdown.tp_comm_s < off.breakdown.tp_comm_s
    assert on.step_time_s < off.step_time_s
    assert on.breakdown.compute_s == off.breakdown.compute_s
    assert any("userbuffers" in a for a in on.assumptions)


@pytest.mark.parametrize("framework,fields,reason", [
    ("megatron-core", {"sequence_parallel": False}, "sequence_parallel=false"),
    ("megatron-bridge", {"tp": 1, "pp": 8}, "tp=1"),
    ("torchtitan", {"pp": 1}, "torch_compile=false"),
    ("kempnerforge", {"pp": 1}, "no TP communication overlap switch"),
])
def test_preconditions_name_the_fix(framework, fields, reason):
    report = check_config(Request(framework=framework, tp_comm_overlap=True, **{**L70, **fields}))
    found = [f for f in report.findings if f.id == "TP005"]
    assert found and reason in found[0].message and "tp_comm_overlap=false" in found[0].fix


@pytest.mark.parametrize("framework,variant,fields,key", [
    ("megatron-core", None, {}, "--tp-comm-overlap"),
    ("megatron-bridge", None, {}, "cfg.comm_overlap.tp_comm_overlap = True"),
    ("megatron-bridge", "run_recipe", {}, "comm_overlap.tp_comm_overlap=true"),
    ("torchtitan", None, {"pp": 1, "torch_compile": True}, "--compile.enable_async_tensor_parallel"),
    ("torchtitan", None, {"pp": 1, "torch_compile": True, "framework_version": "0.2.2"},
     "enable_async_tensor_parallel = true"),
])
def test_renders_the_framework_key_and_parses_back(framework, variant, fields, key):
    job, plan = resolve(Request(framework=framework, tp_comm_overlap=True, **{**L70, **fields}))
    out = render(framework, job, plan, variant=variant)
    assert key in out.text
    assert parse_plan(framework, out.variant, out.text, job.model.num_layers)["tp_comm_overlap"] is True
    job, plan = resolve(Request(framework=framework, **{**L70, **fields}))
    out = render(framework, job, plan, variant=variant)
    assert "tp_comm_overlap" not in out.text.replace("CommOverlapConfig(tp_comm_overlap=False)", "")
    assert "async_tensor" not in out.text
    assert parse_plan(framework, out.variant, out.text, job.model.num_layers)["tp_comm_overlap"] is False
