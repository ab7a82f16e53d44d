"""The pipeline_schedule knob (issue 28 item 2): the zero-bubble, ZBV, DualPipeV and combined 1F1B orders as torch and
Megatron-Core build them, their replay against hand-worked steps and an independent slot-by-slot reference, the
activations they hold, and the knob on every face (resolve, rules, render and read back, import, search)."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
from tree_under_test import tree_env

from meshplan import api
from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.arithmetic import pipeline_timeline as tl
from meshplan.arithmetic.flops import model_flops_per_token, weight_gradient_share
from meshplan.arithmetic.pipeline_counts import fused_share, in_flight
from meshplan.arithmetic.pipeline_timeline import Shape, rank_actions, schedule_order, shape_for, simulate
from meshplan.arithmetic.schedule import plan_stages
from meshplan.core.errors import MeshplanError
from meshplan.estimate.moe_time import a2a_steady_share
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

L70 = dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=4, global_batch_size=64, framework="torchtitan", zero_stage=3)
Q30 = dict(model="qwen3-30b-a3b", num_gpus=64, tp=1, pp=4, vpp=2, ep=8, global_batch_size=256,
           framework="megatron-core")


def reference_step(shape: Shape, fwd: list[int], inp: list[int], wgt: list[int]) -> int:
    """An independent reference: whole time slots, no hop. Each slot every idle rank starts its next op if the op's
    inputs finished at or before the slot: a forward the previous stage's forward, an input (or whole) backward the
    next stage's, the last stage's its own forward, a weight gradient its own input gradient; a fused op and the one
    after it start together once both inputs are in. Stage of chunk c on rank r: c*p + r, or the V (r, 2p-1-r)."""
    p, s = shape.pp, shape.stages
    vee = shape.order in ("zbv_zero_bubble", "dualpipev")
    stage_of = (lambda c, r: r if c == 0 else 2 * p - 1 - r) if vee else (lambda c, r: c * p + r)
    orders = [list(rank_actions(shape, r)) for r in range(p)]
    done: dict[tuple[str, int, int], int] = {}
    busy_until, pos, now = [0] * p, [0] * p, 0

    def need(kind: str, stage: int, mb: int) -> tuple[str, int, int] | None:
        if kind == "F":
            return ("F", stage - 1, mb) if stage else None
        if kind == "W":
            return ("B", stage, mb)
        return ("F", stage, mb) if stage == s - 1 else ("B", stage + 1, mb)

    while any(pos[r] < len(orders[r]) for r in range(p)):
        for r in range(p):
            while busy_until[r] <= now and pos[r] < len(orders[r]):  # a weight gradient of 0 slots: the next op too
                run = orders[r][pos[r]:pos[r] + (2 if orders[r][pos[r]].fused else 1)]
                ops = [(a.kind, stage_of(a.chunk, r), a.mb) for a in run]
                if not all(done.get(need(*op), now + 1) <= now if need(*op) else True for op in ops):
                    break
                busy_until[r] = now + sum({"F": fwd[r], "B": inp[r] + wgt[r], "I": inp[r], "W": wgt[r]}[k]
                                          for k, _, _ in ops)
                for kind, stage, mb in ops:
                    if kind != "W":
                        done[("F" if kind == "F" else "B", stage, mb)] = busy_until[r]
                pos[r] += len(run)
        now += 1
    return max(busy_until)


def test_zbv_two_ranks_two_microbatches_by_hand():
    # f = i = w = 1. r0 runs stages 0 and 3, r1 stages 1 and 2 (the V). r0: F0.0 F0.1 F3.0 I3.0 W3.0 F3.1 I3.1 W3.1
    # I0.0 W0.0 I0.1 W0.1; r1: F1.0 F2.0 F1.1 F2.1 I2.0 W2.0 I1.0 W1.0 I2.1 W2.1 I1.1 W1.1. Stage 1 -> 2 stays on
    # r1 (no hop). r0's F3.0 waits for F2.0 (ends 3), its I0.0 for I1.0 (ends 8) and I0.1 for I1.1 (ends 12): 14.
    shape = shape_for("zbv_zero_bubble", "rounds", 2, 2, 2)
    assert [(a.kind, shape.stage(a.chunk, 0), a.mb) for a in rank_actions(shape, 0)][:5] == [
        ("F", 0, 0), ("F", 0, 1), ("F", 3, 0), ("I", 3, 0), ("W", 3, 0)]
    timeline = simulate(shape, [1, 1], [2, 2], 0.0, [1, 1])
    assert timeline.seconds == 14 and timeline.idle_share == pytest.approx(1 - 24 / 28)
    assert in_flight(shape, 0) == (2, 1)  # F0.0 F0.1 F3.0 before the first W frees one


def test_zero_bubble_is_what_the_schedule_name_and_vpp_say():
    assert schedule_order("zero_bubble", 2) == "zbv_zero_bubble"
    assert schedule_order("zero_bubble", 3) == "interleaved_zero_bubble"
    assert schedule_order("interleaved_1f1b", 1) == "1f1b"
    assert shape_for("dualpipev", "rounds", 4, 2, 8).stage(1, 0) == 7  # rank 0 holds the last stage
    assert shape_for("interleaved_zero_bubble", "pp", 4, 2, 10).group == 5  # torch's rounds, whatever the card


@pytest.mark.parametrize(("order", "p", "v", "m"), [
    ("interleaved_zero_bubble", 2, 2, 2), ("interleaved_zero_bubble", 4, 2, 8), ("interleaved_zero_bubble", 4, 3, 6),
    ("interleaved_zero_bubble", 3, 2, 5), ("interleaved_zero_bubble", 4, 4, 16),
    ("zbv_zero_bubble", 2, 2, 1), ("zbv_zero_bubble", 4, 2, 3), ("zbv_zero_bubble", 4, 2, 8),
    ("zbv_zero_bubble", 3, 2, 10), ("zbv_zero_bubble", 8, 2, 16),
    ("dualpipev", 2, 2, 4), ("dualpipev", 4, 2, 8), ("dualpipev", 3, 2, 7), ("dualpipev", 4, 2, 13),
    ("combined_1f1b", 2, 2, 2), ("combined_1f1b", 4, 2, 8), ("combined_1f1b", 4, 3, 12), ("combined_1f1b", 2, 4, 6),
])
def test_new_orders_match_the_slot_reference(order, p, v, m):
    rng = random.Random(hash((order, p, v, m)) % 1000)
    fwd = [rng.randint(1, 3) for _ in range(p)]
    wgt = [rng.randint(0, 2) for _ in range(p)]
    inp = [f + rng.randint(0, 1) for f in fwd]
    shape = shape_for(order, "pp", p, v, m)
    bwd = [i + w for i, w in zip(inp, wgt, strict=True)]
    assert simulate(shape, fwd, bwd, 0.0, wgt).seconds == reference_step(shape, fwd, inp, wgt)


def test_weight_gradients_fill_the_bubble():
    # balanced ranks, f = i = w: the zero-bubble orders idle less than interleaved 1F1B at the same p, v, m
    p, v, m = 4, 2, 8
    plain = simulate(shape_for("1f1b", "rounds", p, v, m), [1.0] * p, [2.0] * p).idle_share
    for order in ("interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev"):
        assert simulate(shape_for(order, "rounds", p, v, m), [1.0] * p, [2.0] * p, 0.0, [1.0] * p).idle_share < plain
    # without a weight gradient to move, nothing fills the bubble: ZBV's order is no better than 1F1B's
    zbv = simulate(shape_for("zbv_zero_bubble", "rounds", p, v, m), [1.0] * p, [2.0] * p).idle_share
    assert zbv >= plain - 1e-9


def test_dualpipev_refuses_fewer_microbatches_than_stages():
    with pytest.raises(ValueError, match="8 micro-batches"):
        rank_actions(shape_for("dualpipev", "rounds", 4, 2, 7), 0)


def test_combined_1f1b_warms_up_one_more_and_fuses_the_steady_state():
    p, v, m = 4, 2, 8
    combined, plain = shape_for("combined_1f1b", "pp", p, v, m), shape_for("1f1b", "pp", p, v, m)
    for rank in range(p):
        first_b = [a.kind for a in rank_actions(combined, rank)].index("B")
        assert first_b == [a.kind for a in rank_actions(plain, rank)].index("B") + 1  # one more warm-up forward
        assert fused_share(combined, rank) == (m * v - (2 * (p - rank - 1) + (v - 1) * p + 1)) / (m * v)
    assert fused_share(combined, 0) == pytest.approx(a2a_steady_share(m, p, v) - 1 / (m * v))
    assert sum(in_flight(combined, 0)) == sum(in_flight(plain, 0)) + 1  # one more micro-batch held
    # all in warm-up: nothing fused (Megatron's steady state is empty), and the step still ends
    tiny = shape_for("combined_1f1b", "pp", 2, 2, 2)
    assert not any(a.fused for a in rank_actions(tiny, 0))
    assert simulate(tiny, [1, 1], [2, 2]).seconds > 0


def test_long_steps_extend_the_new_orders_steady_state():
    rng = random.Random(3)
    worst = 0.0
    for order in ("interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev", "combined_1f1b"):
        for _ in range(4):
            p = rng.choice([2, 4])
            v = 2 if order in ("zbv_zero_bubble", "dualpipev") else rng.choice([2, 4])
            m = rng.choice([160, 200, 256]) // p * p
            fwd = [rng.uniform(0.9, 1.1) / v for _ in range(p)]
            bwd, wgt = [2 * f for f in fwd], [f for f in fwd]
            shape = shape_for(order, "pp", p, v, m)
            full = tl._replay(shape, fwd, bwd, 0.01 / v, wgt)
            worst = max(worst, abs(simulate(shape, fwd, bwd, 0.01 / v, wgt).seconds - full) / full)
    assert worst < 0.01


def test_weight_gradient_share_is_the_linear_share_of_the_backward():
    arch = resolve_model("llama-3.1-8b")
    core = 6 * 4096 * arch.head_dim * arch.num_attention_heads * arch.num_layers  # Megatron's causal attention term
    total = model_flops_per_token(arch, 4096, mtp_layers=0)
    assert weight_gradient_share(arch, 4096) == pytest.approx((total - core) / (2 * total))
    assert 0 < weight_gradient_share(arch, 131072) < weight_gradient_share(arch, 4096) < 0.5


# --------------------------------------------------------------------------- the knob on every face


def test_resolve_fills_two_chunks_and_turns_the_overlap_on():
    job, plan = resolve(Request(**L70, pipeline_schedule="dualpipev"))
    assert plan.vpp == 2 and plan.pipeline_schedule == "dualpipev"
    assert any("vpp not given: 2" in n for n in job.notes)
    _, plan = resolve(Request(**{**Q30, "pipeline_schedule": "combined_1f1b"}))
    assert plan.moe_a2a_overlap
    with pytest.raises(MeshplanError, match="moe_a2a_overlap"):
        resolve(Request(**{**Q30, "pipeline_schedule": "combined_1f1b", "moe_a2a_overlap": False}))
    _, plan = resolve(Request(**L70))
    assert plan.pipeline_schedule is None and plan.vpp == 1  # left out: the framework's default, as before


def test_v_schedules_put_the_output_layer_on_rank_zero():
    job, plan = resolve(Request(**L70, pipeline_schedule="dualpipev"))
    stages = plan_stages(job, plan)
    assert stages.head_rank == 0
    assert stages.chunks[0][1] == tuple(range(70, 80))  # rank 0's second chunk is the last of 8 stages
    _, plan = resolve(Request(**L70, vpp=2))
    assert plan_stages(job, plan).head_rank == 3


def test_zero_bubble_prices_a_shorter_step_than_interleaved():
    steps = {s: api.estimate_throughput(parse_request({**L70, "pipeline_schedule": s})).step_time_s
             for s in ("interleaved_1f1b", "zero_bubble", "dualpipev")}
    assert steps["zero_bubble"] < steps["interleaved_1f1b"] and steps["dualpipev"] < steps["interleaved_1f1b"]
    report = api.estimate_throughput(parse_request({**L70, "pipeline_schedule": "zero_bubble"}))
    assert any("ZBVZeroBubble" in a for a in report.assumptions)
    default = api.estimate_throughput(parse_request({**L70, "vpp": 2}))
    assert default.step_time_s == steps["interleaved_1f1b"]  # naming the default changes nothing


def test_combined_1f1b_holds_the_extra_warmup_microbatch_named_or_not():
    """moe_a2a_overlap is Megatron-Core's combined 1F1B whether or not pipeline_schedule names it (Plan.runs_schedule):
    the same step, the same extra warm-up forward held on rank 0."""
    plain = parse_request({**Q30, "moe_a2a_overlap": False})
    overlap = parse_request({**Q30, "moe_a2a_overlap": True})
    combined = parse_request({**Q30, "pipeline_schedule": "combined_1f1b"})
    assert resolve(overlap)[1].runs_schedule == "combined_1f1b" and resolve(plain)[1].runs_schedule is None
    held = [api.estimate_memory(r).stages[0].total_bytes for r in (plain, overlap, combined)]
    assert held[1] == held[2] > held[0]
    steps = [api.estimate_throughput(r) for r in (overlap, combined)]
    assert steps[0].step_time_s == steps[1].step_time_s
    assert any("combined 1F1B" in a for a in steps[0].assumptions)


@pytest.mark.parametrize(("framework", "fields", "written"), [
    ("torchtitan", dict(pipeline_schedule="dualpipev"), "pipeline_parallel_schedule DualPipeV"),
    ("torchtitan", dict(pipeline_schedule="zero_bubble"), "pipeline_parallel_schedule ZBVZeroBubble"),
    ("torchtitan", dict(pipeline_schedule="zero_bubble", vpp=4), "pipeline_parallel_schedule InterleavedZeroBubble"),
    ("kempnerforge", dict(model="llama-3.1-8b", pipeline_schedule="gpipe", global_batch_size=256),
     'pp_schedule = "gpipe"'),
])
def test_render_writes_the_schedule_and_parse_reads_it_back(framework, fields, written):
    job, plan = resolve(Request(**{**L70, "framework": framework, **fields}))
    result = render(framework, job, plan)
    assert written in result.text
    parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
    assert parsed["pipeline_schedule"] == plan.pipeline_schedule and parsed.get("vpp", 1) == plan.vpp


def test_megatron_writes_combined_1f1b_as_its_overlap_flag_and_verl_refuses_it():
    job, plan = resolve(Request(**{**Q30, "pipeline_schedule": "combined_1f1b"}))
    assert "--overlap-moe-expert-parallel-comm" in render("megatron-core", job, plan).text
    job, plan = resolve(Request(**{**Q30, "framework": "verl", "pipeline_schedule": "combined_1f1b"}))
    with pytest.raises(MeshplanError, match=r"verl 0\.9\.1 \(sft-megatron\) cannot express"):  # a training job
        render("verl", job, plan)  # verl runs Megatron's schedules, but meshplan does not write its overlap


def test_import_reads_a_torchtitan_schedule():
    toml = ('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\npipeline_parallel_degree = 2\n'
            'pipeline_parallel_schedule = "{}"\n[training]\nlocal_batch_size = 8\n')
    assert api.import_config(toml.format("ZBVZeroBubble"), path="x.toml",
                             framework="torchtitan").request["pipeline_schedule"] == "zero_bubble"
    assert "pipeline_schedule" not in api.import_config(toml.format("1F1B"), path="x.toml",
                                                        framework="torchtitan").request
    looped = api.import_config(toml.format("LoopedBFS"), path="x.toml", framework="torchtitan")
    assert any("LoopedBFS: no meshplan pipeline_schedule" in u for u in looped.unsupported)


def test_parse_names_the_field_and_the_value_a_framework_name_means():
    with pytest.raises(MeshplanError, match="Did you mean 'pipeline_schedule'"):
        parse_request({"model": "llama-3.1-8b", "pipeline_parallel_schedule": "1F1B"})
    with pytest.raises(MeshplanError, match="torchtitan's name for pipeline_schedule='zero_bubble'"):
        parse_request({"model": "llama-3.1-8b", "pipeline_schedule": "ZBVZeroBubble"})


def test_cli_json_gives_the_api_answer():
    args = ["--model", "llama-3.1-70b", "--num-gpus", "64", "--tp", "8", "--pp", "4", "--global-batch-size", "64",
            "--framework", "torchtitan", "--zero-stage", "3", "--pipeline-schedule", "dualpipev", "--json"]
    out = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "throughput", *args], capture_output=True,
                         text=True, timeout=300, check=True, env=tree_env()).stdout
    cli = json.loads(out)
    assert cli["step_time_s"] == api.estimate_throughput(parse_request({**L70, "pipeline_schedule": "dualpipev"})
                                                         ).step_time_s
    assert cli["plan"]["pipeline_schedule"] == "dualpipev"


def test_recommend_searches_the_schedules_the_framework_runs():
    answer = api.recommend(parse_request({**L70, "global_batch_size": 256, "num_gpus": 64, "tp": None}))
    schedules = {c.plan.pipeline_schedule for c in answer.candidates}
    assert schedules & {"zero_bubble", "dualpipev"}, schedules
    fixed = api.recommend(parse_request({**L70, "global_batch_size": 256, "tp": None,
                                         "pipeline_schedule": "zero_bubble"}))
    assert fixed.candidates and {c.plan.pipeline_schedule for c in fixed.candidates} == {"zero_bubble"}
    megatron = api.recommend(parse_request({**L70, "framework": "megatron-core", "zero_stage": 1, "tp": None,
                                            "global_batch_size": 256}))
    assert {c.plan.pipeline_schedule for c in megatron.candidates} == {None}  # it has no zero-bubble schedule


# --------------------------------------------------------------------------- torch's own orders

TORCH_ORDERS = """
import json, sys, types
from torch.distributed.pipelining import schedules as S
out = {}
for name, p, v, m in json.loads(sys.stdin.read()):
    cls = {"interleaved_zero_bubble": S.ScheduleInterleavedZeroBubble, "zbv_zero_bubble": S.ScheduleZBVZeroBubble,
           "dualpipev": S.ScheduleDualPipeV}[name]
    self = types.SimpleNamespace(pp_group_size=p, n_local_stages=v, num_stages=p * v, _n_microbatches=m,
                                 number_of_rounds=max(1, m // p))
    self.microbatches_per_round = m // self.number_of_rounds
    ranks = []
    for r in range(p):
        ops = []
        for a in cls._calculate_single_rank_operations(self, r):
            if a is None:
                continue
            for b in (a.sub_actions or (a,)):
                ops.append([str(b.computation_type).split(".")[-1], b.stage_index, b.microbatch_index])
        ranks.append(ops)
    out[f"{name},{p},{v},{m}"] = ranks
print("RESULT " + json.dumps(out))
"""
KIND = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


@pytest.mark.slow
def test_orders_are_torchs_own():
    """Every rank's order of ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble and ScheduleDualPipeV, as torch
    2.13's _calculate_single_rank_operations writes it (run on a stand-in for the schedule object), op for op."""
    from framework_packages import TORCHTITAN_VENV, venv_python

    cases = []
    for p in (2, 3, 4, 8):
        for m in (1, 2, 3, 4, 5, 6, 8, 12, 16, 17, 24):
            cases.append(["zbv_zero_bubble", p, 2, m])
            if m >= 2 * p:
                cases.append(["dualpipev", p, 2, m])
            cases += [["interleaved_zero_bubble", p, v, m] for v in (2, 3, 4) if m % max(1, m // p) == 0]
    python = venv_python("torchtitan", TORCHTITAN_VENV, python_version="3.11")
    proc = subprocess.run([str(python), "-c", TORCH_ORDERS], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    torch_orders = json.loads(line[len("RESULT "):])
    for name, p, v, m in cases:
        shape = shape_for(name, "rounds", p, v, m)
        for r in range(p):
            ours = [[a.kind, shape.stage(a.chunk, r), a.mb] for a in rank_actions(shape, r)]
            theirs = [[KIND[k], s, mb] for k, s, mb in torch_orders[f"{name},{p},{v},{m}"][r]]
            assert ours == theirs, (name, p, v, m, r)


def test_a_multi_chunk_schedule_needs_a_pipeline():
    report = api.check_config(parse_request({**L70, "pp": 1, "tp": 8, "pipeline_schedule": "zero_bubble"}))
    finding = next(f for f in report.findings if f.id == "PP013")
    # the pipelines named tile the 64 GPUs at tp=8 and split 80 layers into pp*2 chunks
    assert "pp=1 has none" in finding.message and finding.fix.startswith("Use pp in {2, 4, 8} with vpp=2")
    report = api.check_config(parse_request({**L70, "pp": 1, "tp": 8, "pipeline_schedule": "1f1b"}))
    assert "PP013" not in {f.id for f in report.findings}


def test_torchs_round_rule_follows_the_schedule_that_has_rounds():
    fields = dict(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, pp=4, global_batch_size=18)
    zb = api.check_config(parse_request({**fields, "vpp": 4, "pipeline_schedule": "zero_bubble"}))
    assert any(f.id == "PP011" and "InterleavedZeroBubble" in f.message for f in zb.findings)
    zbv = api.check_config(parse_request({**fields, "pipeline_schedule": "zero_bubble"}))  # ZBV at vpp 2: no rounds
    assert "PP011" not in {f.id for f in zbv.findings}
    gpipe = api.check_config(parse_request({**fields, "global_batch_size": 4, "pipeline_schedule": "gpipe"}))
    assert "PP010" not in {f.id for f in gpipe.findings}  # Schedule1F1B's minimum, not ScheduleGPipe's


@pytest.mark.parametrize("framework", ["torchtitan", "nemo-automodel"])
def test_one_stage_with_virtual_chunks_is_refused_as_the_framework_runs_no_pipeline(framework):
    """torch.distributed.pipelining frameworks build their pipeline (schedule, layers per stage) only at pp > 1: at
    pp=1 the model runs whole, so vpp chunks of an embedding/loss split are not the layout named and PP003 refuses
    them on every face (the estimates, before that rule, gave vpp=1's figures under the VPP5 name; before that,
    recommend, which searches these splits, raised a bare ValueError from zip: gpt-oss-20b on 2 H100 below)."""
    fields = dict(model="gpt-oss-20b", num_gpus=2, gpu="h100", framework=framework, seq_length=4096,
                  global_batch_size=4, pp=1, ep=2, zero_stage=3, micro_batch_size=1, recompute="selective")
    split = Request(**fields, vpp=5, account_for_loss=True)
    for estimate in (api.estimate_memory, api.estimate_throughput):
        with pytest.raises(MeshplanError, match="PP003: vpp=5 with pp=1") as refused:
            estimate(split)
        assert refused.value.fix == "Set vpp=1."
    searched = {k: v for k, v in fields.items() if k not in ("pp", "ep", "zero_stage", "micro_batch_size", "recompute")}
    api.recommend(Request(**searched, account_for_loss=True, headroom=0.6))  # no pp=1 split raises
