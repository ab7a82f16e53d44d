"""Megatron-Core's moe_shared_expert_overlap, end to end: the request field, what it keeps for the backward (Megatron-LM
24bad8e677 transformer/moe/shared_experts.py: pre_forward_comm all-gathers the layer input over the TP group into
cached_fc1_input, and linear_fc1, parallel_mode None under the overlap, keeps that gathered copy), rule EP012
(transformer_config.py's checks), and both Megatron faces' keys rendered and read back. Before: the field could not be
said, and Megatron-Bridge's Moonlight recompute study, whose 8-H100 recipe sets it, was under-counted by its bytes."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.activations import BF16, Layout, layer_activations, shape_of
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model
from meshplan.schema.request import Request

MOONLIGHT = dict(model="moonlight-16b-a3b", gpu="h100", num_gpus=8, seq_length=4096, global_batch_size=4,
                 micro_batch_size=1, tp=2, ep=8, etp=1, dp=4, sequence_parallel=True, recompute="selective",
                 framework="megatron-bridge", optimizer_state_dtype="bf16", grad_reduce_in_fp32=False)


def _moe_layer(overlap: bool, **kw) -> float:
    shape = shape_of(resolve_model("moonlight-16b-a3b"))
    lay = Layout(**{**dict(tokens=4096, seq_kv=4096, tp=2, sp=True, etp=1, flash=True, dropout=False,
                           swiglu_unfused=False, fp8=False, ep=8), **kw, "shared_expert_overlap": overlap})
    return sum(layer_activations(shape, lay, True, "selective", ("core_attn",)).values())


def test_the_overlap_keeps_the_gathered_layer_input_under_sequence_parallelism():
    """bf16: the whole sequence's tokens x hidden beside the local norm output the router keeps; without SP or at
    tp 1 the shared experts' copy_to_tensor_model_parallel_region hands fc1 the local tensor itself: nothing more;
    fp8: the gathered fp8 copy in place of the local one."""
    h = 2048
    assert _moe_layer(True) - _moe_layer(False) == pytest.approx(BF16 * 4096 * h)
    assert _moe_layer(True, tp=1) == _moe_layer(False, tp=1)
    assert _moe_layer(True, fp8=True) - _moe_layer(False, fp8=True) == pytest.approx(4096 * h - 4096 * h / 2)


def test_the_estimate_adds_it_on_every_moe_layer_of_the_stage():
    """Moonlight on 8 H100 (Bridge's recompute study): 26 MoE layers (the first is dense), one micro-batch in flight.
    The backward moment's layer activations are compared: without the overlap that study's peak is its optimizer step
    (the fp32 gradient copy, test_optimizer_step_peak), whose stage holds no activations."""
    without = api.estimate_memory(Request(**MOONLIGHT, moe_shared_expert_overlap=False))
    with_overlap = api.estimate_memory(Request(**MOONLIGHT, moe_shared_expert_overlap=True))
    added = with_overlap.stages[0].detail["layer_activations"] - without.stages[0].detail["layer_activations"]
    assert added == pytest.approx(26 * BF16 * 4096 * 2048, rel=1e-6)
    assert any("moe_shared_expert_overlap" in a for a in api.estimate_throughput(
        Request(**MOONLIGHT, moe_shared_expert_overlap=True)).assumptions)


@pytest.mark.parametrize("framework, key", [("megatron-bridge", "model.moe_shared_expert_overlap = True"),
                                            ("megatron-core", "--moe-shared-expert-overlap")])
def test_both_megatron_faces_render_it_and_read_it_back(framework, key):
    req = Request(**{**MOONLIGHT, "framework": framework}, moe_shared_expert_overlap=True)
    out = api.render_config(framework, req)
    assert key in out.text
    back = api.request_from_config(api.import_config(out.text, framework=framework, path=out.filename),
                                   {"model": "moonlight-16b-a3b", "num_gpus": 8})
    assert back.moe_shared_expert_overlap is True


@pytest.mark.parametrize("change, words", [
    ({"framework": "torchtitan"}, "the torchtitan config meshplan writes has no key for it"),
    # verl takes it through override_transformer_config: not "verl has no key for it", which the fix contradicted
    ({"framework": "verl"}, "the verl config meshplan writes has no key for it"),
    ({"recompute_modules": ["shared_experts"]}, "recomputed shared_experts"),
    ({"moe_a2a_overlap": True}, "overlap_moe_expert_parallel_comm"),
    ({"moe_token_dispatcher": "flex"}, "Megatron-Bridge turns it off beside the flex dispatcher"),
])
def test_rule_ep012_refuses_what_megatron_core_refuses_or_turns_off(change, words):
    with pytest.raises(MeshplanError, match="EP012") as err:
        api.estimate_memory(Request(**{**MOONLIGHT, **change}, moe_shared_expert_overlap=True))
    assert words in str(err.value)


def test_megatron_core_runs_it_beside_the_flex_dispatcher():
    """Megatron-Core's flex dispatcher calls the shared experts' pre_forward_comm as alltoall does (Megatron-LM
    token_dispatcher.py; transformer_config.py takes alltoall or flex): EP012 passes it there, the gathered input is
    counted as beside alltoall, and render writes the flag. Only Megatron-Bridge's flex setup turns it off."""
    core = {**MOONLIGHT, "framework": "megatron-core", "moe_token_dispatcher": "flex"}
    without = api.estimate_memory(Request(**core))
    with_overlap = api.estimate_memory(Request(**core, moe_shared_expert_overlap=True))
    added = with_overlap.stages[0].activations_bytes - without.stages[0].activations_bytes
    assert added == pytest.approx(26 * BF16 * 4096 * 2048, rel=1e-6)
    assert "--moe-shared-expert-overlap" in api.render_config("megatron-core",
                                                              Request(**core, moe_shared_expert_overlap=True)).text


def test_bridge_render_writes_the_overlap_as_the_plan_runs_it():
    """The key is written for every model with shared experts, as the plan runs it: on where the request leaves it
    out on a model whose Bridge provider turns it on (Moonlight is a deepseek_v3 checkpoint), off where the request
    says so (a recipe may set it otherwise than its provider: the perf recipes turn it off), and it reads back as
    written. A model without shared experts gets no key."""
    out = api.render_config("megatron-bridge", Request(**MOONLIGHT))
    assert "model.moe_shared_expert_overlap = True" in out.text
    off = api.render_config("megatron-bridge", Request(**MOONLIGHT, moe_shared_expert_overlap=False))
    assert "model.moe_shared_expert_overlap = False" in off.text
    back = api.request_from_config(api.import_config(off.text, framework="megatron-bridge", path=off.filename),
                                   {"model": "moonlight-16b-a3b", "num_gpus": 8})
    assert back.moe_shared_expert_overlap is False
    qwen = api.render_config("megatron-bridge", Request(**{**MOONLIGHT, "model": "qwen3-30b-a3b"}))
    assert "moe_shared_expert_overlap" not in qwen.text


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_rule_ep013_warns_where_the_model_has_no_shared_experts(framework):
    """Megatron-Core acts on the overlap only beside moe_shared_expert_intermediate_size (transformer_config.py) and
    starts the run without it: a warning, no refusal (EP012 refused it before), the estimates those without it."""
    qwen = {**MOONLIGHT, "model": "qwen3-30b-a3b", "framework": framework}
    report = api.check_config(Request(**qwen, moe_shared_expert_overlap=True))
    assert [f.id for f in report.findings if f.id.startswith("EP01")] == ["EP014"]
    with_overlap = api.estimate_memory(Request(**qwen, moe_shared_expert_overlap=True))
    assert with_overlap.peak_bytes == api.estimate_memory(Request(**qwen)).peak_bytes
    assert any("EP014" in w for w in with_overlap.warnings)
    assert not any("moe_shared_expert_overlap" in a for a in api.estimate_throughput(
        Request(**qwen, moe_shared_expert_overlap=True)).assumptions)
