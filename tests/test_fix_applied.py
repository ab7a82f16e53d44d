"""A fix a user applies in one step: the change a finding's fix names, applied to the request as `check --config`
applies it (bench/random_requests.applied: adapters/read/fixes.fix_changes, `drop x` clearing x), leaves check with
no error of its own and the rule it fixed passing. The batch fixes of an RL job on verl (VL001) and SkyRL (SK001),
named in the field the request stated its step in; and a seeded sweep of every rule whose fix names a change over
random training and RL requests."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read.fixes import NO_FIX, fix_changes
from meshplan.core.errors import MeshplanError
from meshplan.core.units import gib
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from random_requests import alternatives, applied, draw, draw_rl, named_layouts


def _errors(req: dict) -> dict:
    return {f.id: f for f in api.check_config(Request(**req)).findings if f.severity == "error"}


def _each_fix_applied(req: dict, rule_id: str) -> list[dict]:
    found = _errors(req)[rule_id]
    in_effect = resolve(Request(**req))[1].model_dump()
    fixed = [applied(req, alternative, in_effect) for alternative in alternatives(found.fix, rule_id)]
    return [f for f in fixed if f]


@pytest.mark.parametrize("framework, rule_id, layout", [
    ("verl", "VL001", {"tp": 2, "param_offload": True}), ("verl", "VL001", {"zero_stage": 3, "samples_per_prompt": 5}),
    ("skyrl", "SK001", {"micro_batch_size": 2, "samples_per_prompt": 4})])
@pytest.mark.parametrize("stated", ["global_batch_size", "prompts_per_step", "both"])
def test_an_rl_batch_fix_applied_once_passes_check(framework, rule_id, layout, stated):
    """VL001's fix named prompts_per_step beside a request that stated global_batch_size=67: applied, the request
    was refused (global_batch_size 67 is not prompts_per_step x samples_per_prompt = 64 x 1), a second fix before
    check passed. It names the step in the field(s) the request stated it in, so one change passes."""
    n = layout.get("samples_per_prompt", 1)
    prompts = 13
    step = {"global_batch_size": {"global_batch_size": prompts * n}, "prompts_per_step": {"prompts_per_step": prompts},
            "both": {"global_batch_size": prompts * n, "prompts_per_step": prompts}}[stated]
    req = dict(model="qwen3-8b", framework=framework, gpu="h100", num_gpus=16, job="rl", **layout, **step)
    fixes = _each_fix_applied(req, rule_id)
    assert fixes, _errors(req)[rule_id].fix
    for fixed in fixes:
        assert set(step) <= set(fixed), fixed  # the fields the request stated, changed together
        assert not _errors(fixed), (fixed, _errors(fixed))


def test_a_mini_batch_fix_never_names_a_mini_batch_over_the_step():
    """SK001 on a stated mini-batch named prompts_per_mini_batch = 64 under prompts_per_step 32, which the request
    refuses (a mini-batch is a share of the step); it names the step with it."""
    req = dict(model="deepseek-v2-lite", framework="skyrl", gpu="a100-40gb", num_gpus=32, job="rl", micro_batch_size=2,
               prompts_per_step=32, prompts_per_mini_batch=8, rollout_tp=4)
    assert _errors(req)["SK001"].fix == "Use prompts_per_mini_batch = 64 with prompts_per_step = 64."
    for fixed in _each_fix_applied(req, "SK001"):
        assert "SK001" not in _errors(fixed)


@pytest.mark.parametrize("step, words", [
    ({"prompts_per_step": 32}, "Use prompts_per_step = 64 with prompts_per_mini_batch = 64 (x samples_per_prompt 1"),
    ({"global_batch_size": 32}, "Use global_batch_size = 64 with prompts_per_mini_batch = 64 (prompts_per_step 64"),
    ({"prompts_per_step": 8, "prompts_per_mini_batch": 8, "samples_per_prompt": 4},
     "Use prompts_per_step = 16 with prompts_per_mini_batch = 16 (x samples_per_prompt 4 = 64 sequences)")])
def test_a_step_fix_names_the_mini_batch_the_new_step_needs(step, words):
    """VL001 (bench/random_requests.py rlfixes 0) on verl's FSDP engine over 64 GPUs, 32 prompts a step in mini-batches
    of 32: 'prompts_per_step = 64' applied left the stated mini-batch's 32 sequences over 64 ranks, an empty share
    (VL004). Where no step it names passes the batch rules beside the stated mini-batch, it names the first with the
    mini-batch change they pass there (fix_values.batch_words), in the field the request stated."""
    req = dict(model="llama-3.1-70b", framework="verl", gpu="a100-40gb", num_gpus=64, job="rl", zero_stage=3,
               prompts_per_mini_batch=32, update_epochs=2) | step
    assert _errors(req)["VL001"].fix.startswith(words), _errors(req)["VL001"].fix
    for fixed in _each_fix_applied(req, "VL001"):  # a 70B model on 40 GB GPUs: the memory rules refuse it throughout
        assert not set(_errors(fixed)) - set(ESTIMATE_RULES), (fixed, list(_errors(fixed)))


MEM002_CASES = [
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, micro_batch_size=1, tp=1),
    dict(model="llama-3.1-8b", framework="deepspeed", gpu="h100", num_gpus=32, micro_batch_size=4, tp=2),
    # responses of 3,072 tokens: verl 0.9.1 runs Qwen2.5 with Megatron-Core's unfused glu() (its Megatron-Bridge
    # provider), whose update at 4,096 takes 87.4 GiB (77.3 fused): over the H100, MEM001 in place of MEM002
    dict(model="qwen2.5-7b", framework="verl", gpu="h100", num_gpus=16, job="rl", zero_stage=1, micro_batch_size=1,
         prompts_per_step=64, samples_per_prompt=8, response_length=3072, param_offload=True),
    dict(model="gpt-oss-20b", framework="skyrl", gpu="h200", num_gpus=32, job="rl", zero_stage=1,
         optimizer_offload=True),  # 32 GPUs: at 16 Megatron-Core's clamped GLU (8 B) puts it 0.6 GiB over
    # peaks in its rollout: 'param_offload=true and optimizer_offload=true' was named and kept the warning (the
    # engine's fraction of the free memory grows into what the offload frees)
    dict(model="qwen3-32b", framework="verl", gpu="h100", num_gpus=8, job="rl", tp=4, prompts_per_step=128,
         rollout_tp=4, optimizer_offload_fraction=0.5, algorithm="dapo", rollout_engine="sglang"),
    # 'rollout_tp=4 with rollout_memory_fraction=0.33' freed the shortfall on paper and kept the warning
    dict(model="llama-3.1-8b", framework="verl", gpu="a100-80gb", num_gpus=16, job="rl", prompts_per_step=64,
         param_offload=False, rollout_engine="sglang"),
]


@pytest.mark.parametrize("req", MEM002_CASES, ids=lambda r: f"{r['model']}-{r.get('framework', 'megatron-core')}")
def test_low_headroom_names_layouts_with_their_memory_that_each_keep_it(req):
    """MEM002's fix named directions ('a larger pp or tp', 'recompute=selective'), and on an RL job whose update peaks
    'recompute=selective' kept the warning. It names nearby layouts as MEM001 does (one search of neighbours,
    check/alternatives.fitting_alternatives), each with its estimated peak and free share; each applied keeps the
    headroom, passes check and estimates the peak the fix stated."""
    found = next(f for f in api.check_config(Request(**req)).findings if f.id == "MEM002")
    layouts = named_layouts(found.fix)
    assert layouts and ("free)" in found.fix or " free, " in found.fix), found.fix
    in_effect = resolve(Request(**req))[1].model_dump()
    for label, figure in layouts:
        fixed = applied(req, label, in_effect)
        assert gib(api.check_config(Request(**fixed)).memory.fit_bytes) == figure, (label, figure)
    for alternative in re.split(r",?\s+or\s+", found.fix.removeprefix("Keep at least 10% free: ")):
        fixed = applied(req, alternative, in_effect)
        assert fixed, alternative
        report = api.check_config(Request(**fixed))
        assert not {f.id for f in report.findings if f.severity == "error" or f.id == "MEM002"}, (alternative, report)


def test_a_fix_of_changes_together_reads_as_those_changes_not_the_near_misses():
    """MEM001's 'no single change fits (micro_batch_size=1: 309.6 GiB, zero_stage=2: 310.7 GiB, ...); together,
    zero_stage=3 + optimizer_offload=true (...) fits' was read by `check --config` (fix_changes) as every near miss
    at once, zero_stage=2 first: an edit that brought PR001 and WS001 in. It reads as the changes that fit."""
    req = dict(model="bloom-176b", gpu="a100-80gb", num_gpus=32, recompute="full", cp=4, tp=4, micro_batch_size=2)
    fix = _errors(req)["MEM001"].fix
    assert fix.startswith("no single change fits (") and "; together, zero_stage=3 + optimizer_offload=true" in fix
    in_effect = resolve(Request(**req))[1].model_dump()
    options = fix_changes(fix, req, in_effect)
    assert options[0] == {"zero_stage": 3, "optimizer_offload": True}, options
    assert not _errors({**req, **options[0]})


def test_a_fix_that_moves_the_job_to_another_framework_is_no_edit_of_this_one():
    """LORA001 on KempnerForge: 'use megatron-bridge, or verl/SkyRL with zero_stage=3 (FSDP + PEFT)'. check --config
    read the second as zero_stage=3 for the KempnerForge file, where LORA001 fires again: that setting is verl's or
    SkyRL's. An alternative that opens with another framework is no edit of this file."""
    req = dict(model="qwen3-30b-a3b", framework="kempnerforge", gpu="h20", num_gpus=8, lora_rank=8, zero_stage=2)
    fix = _errors(req)["LORA001"].fix
    assert "verl/SkyRL with zero_stage=3" in fix
    assert fix_changes(fix, req) == []
    # the framework's own name in an explanation is no move: EP004 on verl names Megatron-Core, verl and SkyRL
    assert fix_changes("Set etp=1 (Megatron-Core, verl and SkyRL default an unset etp to tp, so set it explicitly).",
                       {"framework": "verl"}) == [{"etp": 1}]


def test_a_gpu_count_fix_tiles_the_expert_grid_too():
    """WS001 (tp*pp*cp does not divide the GPUs) named 'num_gpus = 126' at tp=3, ep=16: a multiple of 3 whose expert
    grid (pp x ep x etp = 16) does not tile it, so WS002 came in. It names multiples of the fewest GPUs that hold
    both (mesh.smallest_world, WS002's)."""
    req = dict(model="qwen3-30b-a3b", framework="megatron-bridge", gpu="b200", num_gpus=128, tp=3, ep=16, etp=1,
               global_batch_size=1024)
    # 144 GPUs leave dp 48, which 1,024 sequences do not divide (BS001): 96 alone (fix_values.kept_counts)
    assert _errors(req)["WS001"].fix.startswith("Use num_gpus = 96 (multiples of 48), ")
    for fixed in _each_fix_applied(req, "WS001"):
        assert not {"WS001", "WS002"} & set(_errors(fixed)), fixed


def test_a_gpu_count_fix_names_the_batch_the_count_divides():
    """WS001 at tp=3 on 1 GPU with a 1-sequence global batch (bench/random_requests.py fixes 2 1000) named
    'num_gpus = 24': dp 8 there, which the batch does not divide (BS001). It names the counts at which the batch rules
    pass at the dp each derives, else the first with the batch change beside it (fix_values.kept_counts)."""
    req = dict(model="olmoe-1b-7b", framework="megatron-bridge", gpu="b200", num_gpus=1, global_batch_size=1, tp=3,
               ep=8, grad_reduce_in_fp32=False)
    assert _errors(req)["WS001"].fix.startswith("Use num_gpus = 24 (multiples of 24) with global_batch_size = 8, ")
    for fixed in _each_fix_applied(req, "WS001"):
        assert not {"WS001", "WS002", "BS001"} & set(_errors(fixed)), fixed
    # counts the batch divides are named alone: 48 sequences divide at dp 8 (24 GPUs) and 16 (48 GPUs)
    assert _errors(req | {"num_gpus": 25, "global_batch_size": 48})["WS001"].fix.startswith(
        "Use num_gpus = 24 or 48 (multiples of 24), ")


def test_an_expert_grid_count_fix_names_the_batch_the_count_divides():
    """WS002 on verl at ep=16 on 1 GPU with a 1-sequence global batch (bench/random_requests.py fixes 1 1000) named
    'num_gpus = 16': dp 16 there, which verl's SFT trainer refuses for the batch (VL003). Like WS001's, its counts are
    those the batch rules pass at, else the first with the batch change beside it (fix_values.kept_counts)."""
    req = dict(model="qwen3-235b-a22b", framework="verl", gpu="h200", num_gpus=1, ep=16, global_batch_size=1,
               micro_batch_size=1)
    assert _errors(req)["WS002"].fix.startswith("Use num_gpus = 16 with global_batch_size = 16 (multiples of ")
    for fixed in _each_fix_applied(req, "WS002"):
        assert not {"WS002", "VL003"} & set(_errors(fixed)), fixed
    # a batch the count divides is named alone
    assert _errors(req | {"global_batch_size": 32})["WS002"].fix.startswith("Use num_gpus = 16 (multiples of ")


def test_a_degree_fix_keeps_the_world_size_rules_passing():
    """TP004 on torchtitan at tp=8, ep=8 on 12 H20 (4-GPU NVLink domains; tests/test_fix_applied.py's draws, seed 13)
    named 'tp in {2, 4}': at tp=2 dp_shard is 6 and ep 8 does not divide dp_shard*tp = 12 (WS005), at tp=4 neither.
    The values it names keep the world-size rules that pass now passing, else the first comes with the ep at which
    they do (fix_values.kept_degrees, ep_beside): ep=1, the dense model's."""
    req = dict(model="llama-3-8b", framework="torchtitan", gpu="h20", num_gpus=12, tp_comm_overlap=True, tp=8, ep=8,
               grad_reduce_in_fp32=False)
    before = api.check_config(Request(**req))
    found = next(f for f in before.findings if f.id == "TP004")
    assert "tp in {2, 4} (tp=2 with ep=1)" in found.fix, found.fix
    in_effect = resolve(Request(**req))[1].model_dump()
    for alternative in alternatives(found.fix, "TP004"):
        if fixed := applied(req, alternative, in_effect):
            assert "WS005" not in _errors(fixed), (alternative, list(_errors(fixed)))


@pytest.mark.parametrize("req", [
    dict(model="glm-4.5", framework="megatron-bridge", gpu="a100-80gb", num_gpus=4, sequence_parallel=True, ep=8,
         activation_offload=True, moe_a2a_overlap=True),
    dict(model="qwen3-235b-a22b", framework="megatron-core", gpu="a100-80gb", num_gpus=4, global_batch_size=64,
         moe_a2a_overlap=True, recompute="selective", ep=8)])
def test_an_ep_fix_never_names_ep_1_beside_the_a2a_overlap(req):
    """WS002's 'ep in {1, 2, 4} at this GPU count' beside moe_a2a_overlap=true (bench/random_requests.py fixes 4 and 7
    x 200): applied as ep=1, EP009 came in (no expert all-to-all to hide). It leaves 1 out there."""
    fix = _errors(req)["WS002"].fix
    assert fix.endswith("or ep in {2, 4} at this GPU count."), fix
    for fixed in _each_fix_applied(req, "WS002"):
        assert not {"WS002", "EP009"} & set(_errors(fixed)), fixed


NEW_RULE_CASES = [
    # WS002 said "use a multiple of it (16 or 32)", which check --config cannot apply: now "Use num_gpus = 16 or 32
    # (multiples of ...)", and its eps
    ("WS002", dict(model="qwen3-30b-a3b", framework="megatron-core", gpu="h100", num_gpus=24, ep=16)),
    ("WS002", dict(model="mixtral-8x7b", framework="megatron-core", gpu="h100", num_gpus=12, tp=2, ep=8)),
    ("CP007", dict(model="gemma-2-27b", framework="megatron-bridge", gpu="h100", num_gpus=8, cp=2)),
    ("CP007", dict(model="gemma-2-27b", framework="megatron-bridge", gpu="h100", num_gpus=8, cp=2,
                   global_batch_size=4)),
    ("CG001", dict(model="llama-3.1-8b", framework="megatron-core", gpu="h100", num_gpus=8,
                   cuda_graph_impl="transformer_engine", recompute="full")),
    ("CG001", dict(model="llama-3.1-8b", framework="torchtitan", gpu="h100", num_gpus=8,
                   cuda_graph_impl="transformer_engine")),
    ("CG001", dict(model="llama-3.1-8b", framework="megatron-core", gpu="h100", num_gpus=8,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn", "moe_router"])),
    ("CG001", dict(model="llama-3.1-8b", framework="megatron-core", gpu="h100", num_gpus=8, cuda_graph_impl="local",
                   activation_offload=True, recompute="full")),
    ("CG001", dict(model="qwen3-30b-a3b", framework="megatron-core", gpu="h100", num_gpus=8, ep=8,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn", "moe_preprocess"])),
    ("CG001", dict(model="qwen3-30b-a3b", framework="megatron-core", gpu="h100", num_gpus=8, ep=8,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=["moe", "moe_router"])),
    ("CG001", dict(model="llama-3.1-8b", framework="megatron-core", gpu="h100", num_gpus=8,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn"], dropout=True,
                   recompute="selective", recompute_modules=["core_attn"])),
    ("CG002", dict(model="qwen3-30b-a3b", framework="megatron-core", gpu="h100", num_gpus=8, ep=8,
                   cuda_graph_impl="transformer_engine")),
    ("CG002", dict(model="qwen3-30b-a3b", framework="megatron-bridge", gpu="h100", num_gpus=8, ep=8,
                   cuda_graph_impl="full_iteration")),
    ("CG003", dict(model="deepseek-v2-lite", framework="megatron-core", gpu="h100", num_gpus=8, ep=8,
                   cuda_graph_impl="transformer_engine", cuda_graph_modules=["attn", "mlp"], moe_a2a_overlap=True)),
    ("RC008", dict(model="llama-4-scout", framework="torchtitan", gpu="h200", num_gpus=16, framework_version="0.1.0",
                   recompute="selective")),
    # with the file's selective_ac_option, recompute=full alone brought RC002 in: each alternative drops it too
    ("RC008", dict(model="llama-4-scout", framework="torchtitan", gpu="h200", num_gpus=16, framework_version="0.1.0",
                   recompute="selective", selective_ac_option="op")),
    ("CH001", dict(model="llama-4-scout", framework="verl", gpu="h200", num_gpus=16, zero_stage=3, seq_length=32768,
                   job="sft")),
    ("CH001", dict(model="llama-4-scout", framework="skyrl", gpu="h200", num_gpus=16, zero_stage=3, seq_length=32768,
                   job="sft")),
    # TT003's release (0.2.2) refuses cp > 1 (CP007): its 'cp=1 there' left dp 4 against a stated batch of 1 (BS001,
    # bench/random_requests.py fixes 3 1000); it names cp=1 and the batch with the release
    ("TT003", dict(model="llama-4-scout", framework="torchtitan", gpu="a100-80gb", num_gpus=4, cp=4,
                   global_batch_size=1, seq_length=131072)),
    ("TT003", dict(model="llama-4-scout", framework="torchtitan", gpu="h100", num_gpus=16, cp=2)),
    ("TT003", dict(model="llama-4-scout", framework="torchtitan", gpu="h100", num_gpus=16)),
    # PP003 named 'pp in {2, 4, 8} with vpp=2' at NeMo AutoModel's ZeRO-0, whose DDP strategy builds no pipeline
    # (AM004; bench/random_requests.py fixes 4 1000); at ZeRO-3 (FSDP2) the pipeline is named still
    ("PP003", dict(model="llama-3-70b", framework="nemo-automodel", gpu="mi300x", num_gpus=24, zero_stage=0, vpp=2)),
    ("PP003", dict(model="llama-3-70b", framework="nemo-automodel", gpu="mi300x", num_gpus=24, zero_stage=3, vpp=2)),
    # ... nor where combined 1F1B (moe_a2a_overlap) over Megatron-FSDP refuses virtual stages (PP015; fixes 10 1000)
    ("PP003", dict(model="qwen3-30b-a3b", framework="megatron-bridge", gpu="h100", num_gpus=32, ep=8, vpp=2,
                   zero_stage=3, moe_a2a_overlap=True)),
    # NT001's 'use cp=1' moved dp against a stated batch (BS001; fixes 9 and 10 1000): the batch is named beside it
    ("NT001", dict(model="llama-3-70b", framework="nanotron", gpu="a100-40gb", num_gpus=256, cp=4, zero_stage=2,
                   global_batch_size=64)),
    ("NT001", dict(model="qwen3-8b", framework="nanotron", gpu="a100-40gb", num_gpus=32, cp=2, global_batch_size=16)),
    # an etp left out follows tp (Megatron-Core's default on verl): 'tp in {2, 4, 8}' at tp=3, ep=8 on 24 GPUs moved
    # etp with tp, etp*ep no longer divided 24 (WS002; fixes 9 1000)
    ("TP002", dict(model="llama-4-maverick", framework="verl", gpu="h20", num_gpus=24, ep=8, tp=3,
                   tp_comm_overlap=True)),
    # DS002's 'pp=1 with ZeRO-2/3' kept vpp=2 (PP003; fixes 12 1000) and moved dp against a stated batch (BS001)
    ("DS002", dict(model="gpt-oss-20b", framework="deepspeed", gpu="a100-80gb", num_gpus=12, zero_stage=2, pp=2,
                   vpp=2)),
    ("DS002", dict(model="llama-3.1-8b", framework="deepspeed", gpu="h100", num_gpus=16, zero_stage=3, pp=2,
                   global_batch_size=8)),
    # EP002's 'ep in {1, 2, 4, 8}' beside moe_a2a_overlap: ep=1 leaves no all-to-all to hide (EP009; fixes 18 1000)
    ("EP002", dict(model="mixtral-8x22b", framework="megatron-bridge", gpu="h20", num_gpus=16, ep=16,
                   moe_a2a_overlap=True)),
]


def assert_each_fix_applies(rule_id: str, req: dict) -> None:
    """Every alternative the rule's fix names, applied as check --config applies it, passes that rule and brings no
    error in (rules judged only on an estimate aside)."""
    before = api.check_config(Request(**req))
    found = next(f for f in before.findings if f.id == rule_id)
    in_effect = resolve(Request(**req))[1].model_dump()
    fixes = [f for f in (applied(req, a, in_effect) for a in alternatives(found.fix, rule_id)) if f]
    assert fixes, found.fix
    for fixed in fixes:
        after = {f.id for f in api.check_config(Request(**fixed)).findings if f.severity == "error"}
        brought = after - {f.id for f in before.findings} - set(ESTIMATE_RULES)
        assert rule_id not in after and not brought, (found.fix, fixed, after)


@pytest.mark.parametrize("rule_id, req", NEW_RULE_CASES,
                         ids=[f"{r}-{q['framework']}-{i}" for i, (r, q) in enumerate(NEW_RULE_CASES)])
def test_the_newer_rules_name_fixes_that_apply(rule_id, req):
    """CP007, CG001-CG003 and CH001 named changes check --config could not apply ('Drop the MoE modules from
    cuda_graph_modules', 'Keep one: moe_router ... or moe', 'seq_length <= 8192'), a change that brought in the next
    assert ('recompute=selective' beside local graphs and activation_offload) or the batch rules (CP007's 'cp=1' at a
    stated batch of 4 on 8 GPUs: BS001; TT003's 'framework_version=0.2.2 (cp=1 there)' at cp=4 and a stated batch of 1
    on 4 GPUs, the same). Each names values (cuda_graph_modules="attn" written whole), every CUDA-graph
    rule passing at each alternative (rules/cuda_graphs.graph_fix), CP007 and TT003 the batch beside cp=1
    (layout_words); each alternative applied passes its rule and brings no error in."""
    assert_each_fix_applies(rule_id, req)


def test_pp003_names_a_pipeline_only_where_the_engine_builds_one():
    """NeMo AutoModel's DDP strategy (ZeRO-0) refuses any pp > 1 (AM004): PP003's fix there is vpp=1 alone; its FSDP2
    strategy (ZeRO-3) takes a pipeline, so the fix names the pps that split the layers there."""
    req = dict(model="llama-3-70b", framework="nemo-automodel", gpu="mi300x", num_gpus=24, vpp=2)
    fixes = {z: _errors({**req, "zero_stage": z})["PP003"].fix for z in (0, 3)}
    assert fixes[0] == "Set vpp=1.", fixes[0]
    assert fixes[3] == "Set vpp=1, or pp in {2, 4, 8} with vpp=2.", fixes[3]


@pytest.mark.parametrize("etp", [None, 3])
def test_a_tp_fix_moves_an_etp_left_out_with_tp(etp):
    """verl leaves etp to Megatron-Core, which sets it to tp: at tp=3, ep=8 on 24 GPUs (etp*ep = 24) TP001 named
    'tp in {1, 2, 4, 8}' ({2, 4, 8} beside tp_comm_overlap), and 2, 4 and 8 moved etp with them (etp*ep = 16, 32, 64
    do not divide 24: WS002). Every tp it names now passes WS002 as the request with it resolves; with etp=3 stated,
    etp stays and every tp tiles."""
    req = dict(model="llama-4-maverick", framework="verl", gpu="h20", num_gpus=24, ep=8, tp=3)
    req |= {"etp": etp} if etp else {}
    found = _errors(req)["TP001"]
    tps = [int(t) for t in re.search(r"tp in \{([\d, ]+)\}", found.fix).group(1).split(", ")]
    assert tps == ([1] if etp is None else [1, 2, 4, 8]), found.fix
    for tp in tps:
        assert "WS002" not in _errors({**req, "tp": tp}), (found.fix, tp)


def test_ws002_names_the_gpu_count_as_an_assignment_check_config_applies():
    """WS002 said 'use a multiple of it (16 or 32)', which no fix parser reads (only its 'ep in {...}' applied): the
    GPU count is now 'num_gpus = 16 or 32', applied by check --config, and the count applied passes WS002."""
    req = dict(model="qwen3-30b-a3b", framework="megatron-core", gpu="h100", num_gpus=24, ep=16)
    found = next(f for f in api.check_config(Request(**req)).findings if f.id == "WS002")
    in_effect = resolve(Request(**req))[1].model_dump()
    counts = [fixed["num_gpus"] for fixed in (applied(req, a, in_effect) for a in alternatives(found.fix, "WS002"))
              if fixed and fixed["num_gpus"] != 24]
    assert counts == [16], found.fix
    assert "WS002" not in {f.id for f in api.check_config(Request(**{**req, "num_gpus": 16})).findings}


# --------------------------------------------------------------------------- every rule's fix, applied

# Rules that name the first of several settings a framework lacks (or an RL phase's first shortfall): fixing it may
# reveal the next, which it then names (tests/test_fix_values_work.py's, with RL005's phases).
FIRST_OF_SEVERAL = ("AD001", "NT001", "OF001", "RL005")
ESTIMATE_RULES = ("MEM001", "MEM003", "RL005", "RL006")  # judged only once the plan's memory is estimated


def drawn(seed: int, n: int):
    """Random training and RL requests as bench/random_requests.py draws them, an RL step stated now in prompts,
    now in sequences (global_batch_size), now off a multiple."""
    rng = random.Random(seed)
    for i in range(n):
        req = draw_rl(rng) if i % 2 else draw(rng, 4)
        if i % 4 == 1 and rng.random() < 0.5:
            prompts = req.pop("prompts_per_step", None) or 64
            req["global_batch_size"] = prompts * req.get("samples_per_prompt", 1) + rng.choice([0, 1, 3, 8])
        yield req


def fixes_applied(req: dict):
    """(finding, alternative, the request with it) for every error and warning whose fix names a change, each
    alternative read as `check --config` reads it (fix_changes; a fix naming none that works, NO_FIX, skipped)."""
    try:
        report = api.check_config(Request(**req))
    except (MeshplanError, ValueError):
        return [], None
    in_effect = resolve(Request(**req))[1].model_dump()
    out = []
    for found in report.findings:
        if found.severity == "info" or NO_FIX.search(found.fix):
            continue
        for alternative in re.split(r",?\s+or\s+", found.fix):
            fixed = applied(req, alternative, in_effect)
            if fixed:
                out.append((found, alternative, fixed))
    return out, report


def what_breaks(found, fixed: dict, before) -> list[str]:
    """What is wrong with the request a fix made: refused, the rule itself again (a first-of-several rule on the
    same setting), or an error it brought in (one the estimate decides only where the plan was estimated before)."""
    try:
        after = {f.id: f for f in api.check_config(Request(**fixed)).findings}
    except (MeshplanError, ValueError) as exc:
        return [f"refused: {str(exc)[:160]}"]
    out = []
    if found.id in after and not (found.id in FIRST_OF_SEVERAL and
                                  after[found.id].message.split(":")[0] != found.message.split(":")[0]):
        out.append(f"{found.id} again: {after[found.id].message[:160]}")
    ids = {f.id for f in before.findings}
    out += [f"{rid} brought in: {f.message[:160]}" for rid, f in after.items() if f.severity == "error"
            and rid not in ids and (before.memory is not None or rid not in ESTIMATE_RULES)]
    return out


@pytest.mark.parametrize("req", [
    dict(model="qwen2.5-72b", framework="verl", gpu="h200", num_gpus=32, job="rl", zero_stage=3, prompt_length=2048,
         rollout_tp=1, rollout_memory_fraction=0.7),
    # fused, as verl's own Megatron scripts set it: verl 0.9.1's default for Qwen3 is unfused (its Megatron-Bridge
    # provider), 82.1 GiB, which fits no H100 (80.3 GiB fused, which fits by its allocated bytes)
    dict(model="qwen3-8b", framework="verl", gpu="h100", num_gpus=8, job="rl", rollout_memory_fraction=0.01,
         bias_activation_fusion=True)])
def test_a_rollout_fix_on_a_plan_that_fits_keeps_it_fitting(req):
    """RL006 (the engine holds no sequence) named the least fraction that holds one, 'rollout_memory_fraction=0.99',
    on a plan that fits: applied, the rollout phase overflowed (MEM001, RL005). Where the plan fits, each change it
    names is estimated and named only where it still fits."""
    assert api.check_config(Request(**req)).memory.fits
    for fixed in _each_fix_applied(req, "RL006"):
        assert not _errors(fixed), (fixed, list(_errors(fixed)))


@pytest.mark.parametrize("rule_id", ["TP001", "TP002"])
def test_a_tp_fix_never_names_tp_1_beside_tp_overlap(rule_id):
    """'tp in {1, 2, 4} works' beside tp_comm_overlap=true: applied as tp=1, TP005 came in (no TP communication to
    overlap). The tp values a TP rule names leave 1 out where the plan overlaps TP communication."""
    req = dict(model="llama-3-70b", framework="megatron-bridge", gpu="b200", num_gpus=12, seq_length=32768,
               micro_batch_size=4, tp_comm_overlap=True, tp=3)
    assert _errors(req)[rule_id].fix.startswith("tp in {2, 4} works")
    for fixed in _each_fix_applied(req, rule_id):
        assert "TP005" not in _errors(fixed), fixed


def test_a_one_stage_fix_clears_the_virtual_stages_too():
    """KF001's 'Set pp=1' on a plan at vpp=2 left the virtual stages, which PP003 then refused (no pipeline at
    pp=1). It names vpp=1 with pp=1."""
    req = dict(model="qwen3-30b-a3b", framework="kempnerforge", gpu="gb200", num_gpus=256, pp=4, vpp=2,
               recompute="full")
    assert _errors(req)["KF001"].fix == "Set pp=1, vpp=1 and scale with EP, TP and FSDP."
    for fixed in _each_fix_applied(req, "KF001"):
        assert not {"KF001", "PP003"} & set(_errors(fixed)), fixed


@pytest.mark.parametrize("req", [
    dict(model="gpt-oss-120b", framework="megatron-core", gpu="gb200", num_gpus=24, zero_stage=1, micro_batch_size=2,
         vpp=2),
    dict(model="olmoe-1b-7b", framework="torchtitan", gpu="b200", num_gpus=24, vpp=2, micro_batch_size=2)])
def test_a_pipeline_fix_counts_the_default_batch_the_fixed_request_takes(req):
    """PP003's 'pp in {2, 3, 6} with vpp=2' on 24 GPUs at micro-batch 2 with no global batch given: the fix counted
    the micro-batches of the default batch at dp=24 (1,056 sequences, 22 at pp=2), but the request with pp=2 takes its
    own default at dp=12 (1,032, 43 micro-batches), which PP005 (Megatron-Core) and PP011 (torch's interleaved 1F1B)
    refuse. The fix counts the batch the fixed request takes (rules/fix_values.batch_at)."""
    assert "global_batch_size" not in req and "PP003" in _errors(req)
    for fixed in _each_fix_applied(req, "PP003"):
        assert not {"PP003", "PP005", "PP011", "BS001"} & set(_errors(fixed)), (fixed, list(_errors(fixed)))


# Left open: none. A degree's fix (tp, pp, cp, ep) changes dp, and with it whether the batch divides (BS001, VL001,
# VL003, VL004, SK001): it names the degrees at which the batch rules pass, else the batch change beside them
# (rules/fix_values.kept_degrees, layout_words), so no pair is left open.
OPEN_PAIRS: set[tuple[str, str]] = set()
OPEN_AGAIN: set[str] = set()


def _open(rule_id: str, why: str) -> bool:
    brought = why.split(" brought in")[0] if " brought in" in why else None
    if brought is None:
        return rule_id in OPEN_AGAIN and why.startswith(f"{rule_id} again")
    return (rule_id, brought) in OPEN_PAIRS or ("*", brought) in OPEN_PAIRS


@pytest.mark.parametrize("seed", range(2))
def test_every_fix_that_names_a_change_passes_its_rule_when_applied(seed):
    """Every rule whose fix names a change, over random training and RL requests: each alternative applied as
    `check --config` applies it is not refused, its rule passes (a first-of-several rule on the same setting), and
    it brings in no error (one the estimate decides only where the plan was estimated before), but OPEN_PAIRS."""
    tried, failures, rules = 0, [], set()
    for req in drawn(seed, 250):
        out, before = fixes_applied(req)
        for found, alternative, fixed in out:
            tried += 1
            rules.add(found.id)
            failures += [f"{found.id} {alternative!r} on {req}: {why}" for why in what_breaks(found, fixed, before)
                         if not _open(found.id, why)]
    assert tried > 250 and len(rules) > 25, (tried, sorted(rules))
    assert not failures, "\n".join(failures[:6])


# --------------------------------------------------------------------------- a degree fix that moves dp

# The pairs the sweep left open (lane sweep41: seeds 0, 1, 5, 14, 15 of tests/test_fix_applied.py's draws): each fix
# changed a degree, and dp with it, against a stated batch.
DP_MOVING = [
    ("TP004", dict(model="nemotron-4-340b", framework="nanotron", gpu="h100", num_gpus=8, pp=1, global_batch_size=100,
                   etp=1, tp=3)),
    ("AD001", dict(model="deepseek-v2-lite", framework="deepspeed", gpu="h100", num_gpus=16, cp=4, lora_rank=64,
                   micro_batch_size=1, global_batch_size=100)),
    ("AD001", dict(model="llama-3.1-70b", framework="deepspeed", gpu="h200", num_gpus=256, cp=4, global_batch_size=64,
                   sequence_parallel=False)),
    ("EP001", dict(model="llama-3-70b", framework="kempnerforge", gpu="h200", num_gpus=24, activation_offload=True,
                   ep=16, seq_length=131072, global_batch_size=256)),
    ("PP001", dict(model="deepseek-v2-lite", framework="verl", gpu="h20", num_gpus=64, job="rl", pp=2,
                   prompts_per_mini_batch=32, param_offload=True, optimizer_offload=True, update_epochs=2,
                   rollout_engine="sglang", rollout_enforce_eager=True)),
    ("PP001", dict(model="deepseek-v2-lite", framework="verl", gpu="gb200", num_gpus=16, micro_batch_size=2,
                   global_batch_size=100, pp=8, cp=2)),
    ("PP001", dict(model="moonlight-16b-a3b", framework="verl", gpu="a100-40gb", num_gpus=16, job="rl", pp=2,
                   micro_batch_size=2, prompts_per_mini_batch=8, response_length=4096, rollout_memory_fraction=0.7,
                   update_epochs=2, rollout_enforce_eager=True)),
]


@pytest.mark.parametrize("rule_id, req", DP_MOVING, ids=[f"{r}-{q['framework']}-{q['num_gpus']}" for r, q in DP_MOVING])
def test_a_degree_fix_that_moves_dp_keeps_the_batch_whole(rule_id, req):
    """TP004's 'tp in {1, 2, 4, 8}' at global_batch_size=100 on 8 GPUs applied as tp=1 brought BS001 in (dp 8);
    DeepSpeed's 'use cp=1' (AD001), KempnerForge's 'Set ep=1' (EP001, ep a mesh dimension of its own) and verl's
    'pp in {1}' (PP001: VL003, VL004 at the doubled dp) the same. The fix names the degrees at which the batch rules
    pass, else the batch change beside the degree (rules/fix_values.kept_degrees, layout_words), in the field the
    request states its batch in; each alternative applied passes check."""
    assert_each_fix_applies(rule_id, req)


@pytest.mark.parametrize("rule_id, req, words", [
    (*DP_MOVING[0], "tp in {2, 4, 8}"),  # tp=1 leaves dp 8, which 100 does not divide: left out
    (*DP_MOVING[1], "use cp=1 with global_batch_size = 96."),  # the only value: the batch beside it
    (*DP_MOVING[3], "Set ep=1 (and etp=1) with global_batch_size = 264 for a dense model."),
    (*DP_MOVING[4], "pp in {1} with prompts_per_mini_batch = 64 splits evenly"),  # an RL job: its stated mini-batch
])
def test_the_batch_a_degree_fix_names_beside_it(rule_id, req, words):
    assert words in next(f for f in api.check_config(Request(**req)).findings if f.id == rule_id).fix


KF_MOE_TOML = (Path(__file__).resolve().parent / "configs" / "kempnerforge_70b_32gpu_tp4_pp4.toml")


def test_kempnerforge_one_stage_fix_names_the_dp_shard_the_file_states(tmp_path):
    """KF001's 'Set pp=1' on a KempnerForge TOML with dp_shard=1, tp=2, pp=4 on 8 GPUs: the file edit changed pp
    alone, and the fixed file's dp_shard*tp*pp = 1*2*1 = 2 no longer tiled the 8 GPUs (WS006: KempnerForge's
    JobConfig.validate asserts the product). A stated dp (Job.dp_stated) is named beside the degree the fix changes,
    and the file edit writes it in the file's dp_shard."""
    text = KF_MOE_TOML.read_text().replace("dp_shard = 2", "dp_shard = 1").replace("tp = 4\npp = 4", "tp = 2\npp = 4")
    path = tmp_path / "kf_moe.toml"
    path.write_text(text)
    imported = api.import_file(str(path))
    req = api.request_from_config(imported, {"model": "qwen3-30b-a3b", "num_gpus": 8})
    report = api.check_config(req, config=imported)
    found = next(f for f in report.findings if f.id == "KF001")
    assert found.fix == "Set pp=1, dp=4 and scale with EP, TP and FSDP.", found.fix
    edits = next(f for f in report.config_fixes if f.finding == "KF001").options[0]
    assert sorted(c.text.split("  #")[0] for c in edits) == ["[distributed] dp_shard = 4", "[distributed] pp = 1"]
    fixed = path.read_text().replace("dp_shard = 1", "dp_shard = 4").replace("pp = 4", "pp = 1")
    path.write_text(fixed)
    again = api.import_file(str(path))
    report = api.check_config(api.request_from_config(again, {"model": "qwen3-30b-a3b", "num_gpus": 8}))
    assert not {f.id for f in report.findings if f.severity == "error"} - set(ESTIMATE_RULES), report.findings


def _deepspeed_batch(config: dict, world: int) -> tuple[int, int, int]:
    """DeepSpeed edaa722 deepspeed/runtime/config.py _set_batch_related_parameters and _batch_assertion, for the three
    keys a ds_config may state (the branches a config with train_batch_size and the micro-batch takes)."""
    train, micro, acc = (config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                  "gradient_accumulation_steps"))
    if acc is None:
        acc = train // micro // world
    assert train == micro * acc * world, (train, micro, acc, world)
    return train, micro, acc


def test_a_ds_config_drop_dp_fix_is_the_edit_deepspeed_accepts(tmp_path):
    """WS003 on a ds_config stating train_batch_size 256, micro 4 and accumulation 8 (dp 8) checked on 12 GPUs:
    'Drop dp (it is derived: 12)' was written '(leave dp out)', no edit of the file, and dp 12 does not divide 256
    (BS001). The fix names the batch at the derived dp beside it, and the file edit removes
    gradient_accumulation_steps, the key the file states dp through (the card's read.dp_through), which DeepSpeed then
    derives (240 // 4 // 12 = 5): the file DeepSpeed's batch assertion accepts."""
    config = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
              "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config, indent=2))
    imported = api.import_file(str(path))
    req = api.request_from_config(imported, {"model": "llama-3.1-8b", "num_gpus": 12})
    report = api.check_config(req, config=imported)
    found = next(f for f in report.findings if f.id == "WS003")
    assert found.fix.startswith("Drop dp (it is derived: 12) with global_batch_size = 240 or "), found.fix
    edits = next(f for f in report.config_fixes if f.finding == "WS003").options[0]
    assert [c.text for c in edits] == ['{"train_batch_size": 240}  # line 2, was 256',
                                       "(remove gradient_accumulation_steps)  # line 4"]
    fixed = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"} | {"train_batch_size": 240}
    assert _deepspeed_batch(fixed, 12) == (240, 4, 5)
    path.write_text(json.dumps(fixed, indent=2))
    again = api.check_config(api.request_from_config(api.import_file(str(path)),
                                                     {"model": "llama-3.1-8b", "num_gpus": 12}))
    assert not {f.id for f in again.findings if f.severity == "error"} - set(ESTIMATE_RULES), again.findings


def test_every_face_names_the_batch_beside_the_degree(capsys):
    """The CLI's check, the MCP tool check_config and the api give the same AD001 fix, the batch beside cp=1."""
    import anyio

    from meshplan.faces import cli
    from meshplan.faces.mcp.server import app

    req = DP_MOVING[1][1]
    fix = _errors(req)["AD001"].fix
    assert "use cp=1 with global_batch_size = 96." in fix
    args = ["check", req["model"], "--framework", req["framework"], "--gpu", req["gpu"], "--num-gpus",
            str(req["num_gpus"]), "--cp", "4", "--lora-rank", "64", "--micro-batch-size", "1", "--global-batch-size",
            "100", "--json"]
    cli.main(args)
    out = json.loads(capsys.readouterr().out)
    assert next(f["fix"] for f in out["findings"] if f["id"] == "AD001") == fix

    async def call():
        return await app.call_tool("check_config", dict(req))

    structured = anyio.run(call).structured_content
    assert next(f["fix"] for f in structured["findings"] if f["id"] == "AD001") == fix


# A ds_config stating dp 8 through its batch keys (256 = micro 4 x accumulation 8 x dp 8), ZeRO-3 with the optimizer on
# the CPU: Llama-3.1-8B on 8 GPUs does not fit it (MEM001), and its fixes move the batch product.
OFFLOADED_DS_CONFIG = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
                       "bf16": {"enabled": True},
                       "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}}}


def test_a_ds_config_memory_fix_names_the_dp_its_degrees_leave(tmp_path):
    """MEM001's 'tp=2' on a ds_config stating dp 8 through its batch keys (train_batch_size 256 = micro 4 x
    accumulation 8 x dp 8) named no dp, where KempnerForge's KF001 names the one its pp=1 leaves (fix_values.
    dp_follows): it names dp = 8 GPUs / tp 2 = 4, written as the accumulation's removal, which DeepSpeed then derives
    (256 // 4 // 4 = 16); applied, check finds no error. A request that states no dp names none."""
    config = dict(OFFLOADED_DS_CONFIG)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config, indent=2))
    request = {"model": "llama-3.1-8b", "num_gpus": 8}
    imported = api.import_file(str(path))
    found = next(f for f in api.check_config(api.request_from_config(imported, request), config=imported).findings
                 if f.id == "MEM001")
    assert " or tp=2, dp=4 (" in found.fix, found.fix
    assert {"tp": 2, "dp": 4} in fix_changes(found.fix, imported.request)
    fixed = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}
    assert _deepspeed_batch(fixed, 8 // 2) == (256, 4, 16)
    path.write_text(json.dumps(fixed, indent=2))
    again = api.check_config(api.request_from_config(api.import_file(str(path)), request | {"tp": 2}))
    assert again.plan.dp == 4 and not [f.id for f in again.findings if f.severity == "error"], again.findings
    unstated = _errors({"framework": "deepspeed", "gpu": "h100", "micro_batch_size": 4, "global_batch_size": 256,
                        "zero_stage": 3, "optimizer_offload": True} | request)["MEM001"]
    assert " or tp=2 (" in unstated.fix, unstated.fix


def test_a_ds_config_fix_that_moves_the_batch_product_releases_the_accumulation(tmp_path):
    """MEM001 on a ds_config stating train_batch_size 256, micro 4 and accumulation 8 (dp 8) with ZeRO-3 and the
    optimizer on the CPU, for Llama-3.1-8B on 8 GPUs: its options 'micro_batch_size=1' and 'tp=2' were written as the
    micro-batch (or the launch flag) alone, and the file so edited broke DeepSpeed's batch assertion (256 != 1 x 8 x 8;
    WS003 on the fixed file). Each option that moves the product also removes gradient_accumulation_steps, the key
    the file states dp through, which DeepSpeed then derives: applied, check finds no error."""
    config = dict(OFFLOADED_DS_CONFIG)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config, indent=2))
    request = {"model": "llama-3.1-8b", "num_gpus": 8}
    report = api.check_config(api.request_from_config(api.import_file(str(path)), request),
                              config=api.import_file(str(path)))
    options = next(f for f in report.config_fixes if f.finding == "MEM001").options
    edits = {frozenset(c.field for c in option): option for option in options}
    assert [c.text for c in edits[frozenset({"micro_batch_size", "dp"})]] == [
        '{"train_micro_batch_size_per_gpu": 1}  # line 3, was 4', "(remove gradient_accumulation_steps)  # line 4"]
    assert [(c.value, c.text) for c in edits[frozenset({"tp", "dp"})] if c.field == "dp"] == [
        (4, "(remove gradient_accumulation_steps)  # line 4: DeepSpeed (with Megatron-DeepSpeed for TP/PP) derives it, "
            "dp 4")]
    released = {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}
    for file_keys, flags in (({"train_micro_batch_size_per_gpu": 1}, {}), ({}, {"tp": 2})):
        fixed = released | file_keys
        assert _deepspeed_batch(fixed, 8 // flags.get("tp", 1))[0] == 256
        path.write_text(json.dumps(fixed, indent=2))
        again = api.check_config(api.request_from_config(api.import_file(str(path)), request | flags))
        assert not [f.id for f in again.findings if f.severity == "error"], again.findings
