"""NeMo AutoModel's MoE under the DeepEP (flex) dispatcher, as its GroupedExpertsDeepEP keeps it (cards/memory.yaml
fsdp2_automodel moe_activations_flex, activations.AUTOMODEL_DEEPEP_MOE), and the gradient sync of its published MoE
runs from before its outer model was an FSDP unit (published_runs.automodel_reduced_every_micro_batch): the counts
behind its gpt-oss-120B / 64 H100 row (bench/data/nemo_automodel, automodel_gptoss_120b_64)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.arithmetic.activations import (
    AUTOMODEL_DEEPEP_MOE,
    GENERIC_MOE,
    MEGATRON_CORE_MOE,
    Layout,
    attention_saves,
    layer_activations,
    least_moe_bytes,
    moe_bytes,
    shape_of,
)
from meshplan.arithmetic.memory_states import activation_saves, convention, expert_gate_bytes, memory_card
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.published_runs import AUTOMODEL_MOE_ROOT_SHARDED_SINCE, automodel_reduced_every_micro_batch
from meshplan.schema.request import Request

T = 8192  # tokens of one micro-batch: mbs 2 x 4096, the row's


def _conv(framework: str = "nemo-automodel"):
    return convention(framework_card(framework), 3)[1]


def _layout(moe, **kw) -> Layout:
    """TP1 EP16, flash attention, bf16, the fsdp2 preset's unfused dense SwiGLU (AutoModel's own MLP class)."""
    base = {"tokens": T, "seq_kv": 4096, "tp": 1, "sp": False, "etp": 1, "flash": True, "dropout": False,
            "swiglu_unfused": True, "fp8": False, "ep": 16, "moe": moe}
    return Layout(**(base | kw))


def test_the_flex_dispatcher_picks_the_engines_own_count():
    """AutoModel's convention keeps the generic count for its torch dispatcher and its DeepEP path's under flex; a
    convention without a flex count of its own (Megatron's) keeps its one count under flex."""
    gpt = resolve_model("gpt-oss-120b")
    conv = _conv()
    assert moe_bytes(conv, gpt, "flex") == AUTOMODEL_DEEPEP_MOE
    assert moe_bytes(conv, gpt, "alltoall") == moe_bytes(conv, gpt) == GENERIC_MOE
    assert moe_bytes(_conv("megatron-bridge"), gpt, "flex") == MEGATRON_CORE_MOE
    assert moe_bytes(conv, gpt, "flex", fake_gate=True) == AUTOMODEL_DEEPEP_MOE._replace(router_saves=False)


def test_deepep_moe_layer_term_by_term():
    """Per routed copy grouped_gemm keeps fc1's input (2 B per hidden element) and fc2's input (2 B per expert-width
    element), the compiled clamped activation its input, the biased fc1 output, gate and up (4 B per expert-width
    element), and the fp32 routing prob (4 B); the router keeps the layer input and the generic router count."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    h, e, k, f = gpt.h, gpt.experts, gpt.top_k, gpt.f_expert
    assert (h, e, k, f) == (2880, 128, 4, 2880)
    copies = T * k
    deepep = layer_activations(gpt, _layout(AUTOMODEL_DEEPEP_MOE), True, "none")["moe"]
    assert deepep == 2 * T * h + T * 8 * e + copies * (4 + 2 * h + 2 * 2 * f + 2 * f)
    generic = layer_activations(gpt, _layout(GENERIC_MOE), True, "none")["moe"]
    # the generic count keeps two more hidden-wide copies of every routed token and the activation's output
    assert generic - deepep == copies * (2 * 2 * h + 2 * f - 4)
    # 6 B per expert-width element, not 8; 2 B per hidden element, not 6
    assert (deepep - 2 * T * h - T * 8 * e) / copies == 4 + 2 * h + 6 * f == 23044


def test_fake_balanced_gate_keeps_no_router_tensors():
    """FakeBalancedGate's weights are constant and its indices an arange: no router tensor and no copy of the layer
    input is kept (the experts' own dispatched copy is); with shared experts their fc1 still keeps the input."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    fake = AUTOMODEL_DEEPEP_MOE._replace(router_saves=False)
    real = layer_activations(gpt, _layout(AUTOMODEL_DEEPEP_MOE), True, "none")["moe"]
    assert real - layer_activations(gpt, _layout(fake), True, "none")["moe"] == 2 * T * gpt.h + T * 8 * gpt.experts
    ds = shape_of(resolve_model("deepseek-v3"))
    real = layer_activations(ds, _layout(AUTOMODEL_DEEPEP_MOE), True, "none")["moe"]
    assert real - layer_activations(ds, _layout(fake), True, "none")["moe"] == T * 8 * ds.experts


@pytest.mark.parametrize("model", ["gpt-oss-120b", "deepseek-v3", "qwen3-30b-a3b"])
@pytest.mark.parametrize("fake", [False, True])
def test_the_floors_count_is_at_most_each_dispatchers(model, fake):
    """The search's floors (least_moe_bytes) do not know the plan's dispatcher: their count is at most either's,
    and short of the least by no more than the routing prob of each copy (the generic count keeps none, DeepEP's
    no hidden-wide copy)."""
    arch, conv = resolve_model(model), _conv()
    shape = shape_of(arch)
    least = least_moe_bytes(conv, arch, fake)
    for mode, modules in (("none", ()), ("selective", ("moe_act",)), ("selective", ("layernorm",))):
        floor = layer_activations(shape, _layout(least), True, mode, modules)["moe"]
        each = [layer_activations(shape, _layout(moe_bytes(conv, arch, d, fake)), True, mode, modules)["moe"]
                for d in ("alltoall", "flex")]
        assert min(each) - T * shape.top_k * 4 <= floor <= min(each)


def _row_request(**kw) -> Request:
    """automodel_gptoss_120b_64 as the bench maps it: 64 H100, EP64 (the experts whole on every rank, outside FSDP),
    FSDP over 64, mbs 2 x 4096, GBS 512 (4 micro-batches), no recompute, DeepEP, fake balanced gate, bf16 loss."""
    base = {"model": "gpt-oss-120b", "gpu": "h100", "num_gpus": 64, "gpus_per_node": 8, "seq_length": 4096,
            "global_batch_size": 512, "micro_batch_size": 2, "framework": "nemo-automodel", "tp": 1, "pp": 1,
            "cp": 1, "ep": 64, "etp": 1, "dp": 64, "zero_stage": 3, "recompute": "none",
            "moe_token_dispatcher": "flex", "moe_fake_balanced_gate": True, "loss_fp32_upcast": False}
    return Request(**(base | kw))


def test_the_estimate_counts_the_deepep_layers():
    """The whole estimate's layer activations are the 36 layers' DeepEP count; the torch dispatcher's generic."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    flex = api.estimate_memory(_row_request()).stages[0].detail["layer_activations"]
    torch_dispatch = api.estimate_memory(_row_request(moe_token_dispatcher="alltoall")).stages[0].detail[
        "layer_activations"]
    # the two norms' inputs, the QKV input, Q K V (64 + 2 x 8 heads of 64), the fp32 lse, the out-projection input
    per_layer = T * (2 * 2 * gpt.h + 2 * gpt.h + (64 + 2 * 8) * 64 * 2 + 4 * 64 + 64 * 64 * 2)
    routed = T * gpt.top_k * (4 + 2 * gpt.h + 6 * gpt.f_expert)
    assert flex == 36 * (per_layer + routed)
    # the fake gate keeps no router tensor on either path; the generic count two more hidden-wide copies per routed
    # copy and the activation's output, less the routing prob
    assert torch_dispatch - flex == 36 * T * gpt.top_k * (4 * gpt.h + 2 * gpt.f_expert - 4)


def test_runs_before_the_outer_model_was_sharded_reduced_every_micro_batch():
    """AutoModel's MoE parallelizer left the outer ...ForCausalLM unsharded until 8134b0c03 (2025-11-11), so
    get_sync_ctx deferred nothing: its own MoE models' runs without PP reduced every micro-batch."""
    assert AUTOMODEL_MOE_ROOT_SHARDED_SINCE == "2025-11-11"
    ran = automodel_reduced_every_micro_batch
    assert ran("nemo-automodel", "2025-10-02 (main branch)", "gpt_oss", 1)
    assert ran("nemo-automodel", "2025-10", "qwen3_moe", 1)  # a month-only date counts as before
    assert not ran("nemo-automodel", "2025-11-11", "gpt_oss", 1)
    assert not ran("nemo-automodel", "2025-10-02", "gpt_oss", 2)  # PP: not modelled, the card's hold stays
    assert not ran("nemo-automodel", "2025-10-02", "llama", 1)  # the dense path sharded the whole model
    assert not ran("torchtitan", "2025-10-02", "gpt_oss", 1)
    assert not ran("nemo-automodel", None, "gpt_oss", 1)


def test_bench_row_reads_the_release_fact():
    """The bench maps automodel_gptoss_120b_64 with defer_fsdp_grad_sync false; a row stating the setting keeps it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from production_rows import load_rows
    from production_sources import defer_field

    rows = {r["id"]: r for r in load_rows(Path(__file__).resolve().parents[1]
                                          / "bench/data/nemo_automodel/production_configs_dev.yaml")}
    row = rows["automodel_gptoss_120b_64"]
    dense = rows["automodel_llama3_70b_64"]  # its notes state defer_fsdp_grad_sync false; without them, the default
    assert defer_field({**dense, "outcome": {**dense["outcome"], "other": ""}}, "nemo-automodel") == {}
    assert defer_field(rows["automodel_dsv3_256"], "nemo-automodel") == {}  # PP 4: the card's pipeline hold stays
    assert defer_field(row, "nemo-automodel") == {"defer_fsdp_grad_sync": False}
    assert defer_field({**row, "source": {**row["source"], "version_or_date": "2026-03-01"}}, "nemo-automodel") == {}
    stated = {**row, "outcome": {**row["outcome"], "other": "it sets distributed.defer_fsdp_grad_sync true"}}
    assert defer_field(stated, "nemo-automodel") == {"defer_fsdp_grad_sync": True}
    held = api.estimate_memory(_row_request()).stages[0]
    reduced = api.estimate_memory(_row_request(defer_fsdp_grad_sync=False)).stages[0]
    assert held.detail["unsharded_accumulated_gradients"] > 0
    assert "unsharded_accumulated_gradients" not in reduced.detail or \
        reduced.detail["unsharded_accumulated_gradients"] == 0
    assert reduced.gradients_bytes == reduced.weights_bytes  # bf16 sharded grads beside bf16 sharded params


# ------------------------------------------------------------------------- gpt-oss's own gate under Hugging Face's code


def _hf_layout(model: str, **kw) -> Layout:
    """verl's / SkyRL's FSDP engine (fsdp2_hf), as the estimate lays out gpt-oss's layer."""
    conv = memory_card().conventions["fsdp2_hf"]
    arch = resolve_model(model)
    base = {"attn": attention_saves(conv), "act": activation_saves(conv, arch.activation),
            "expert_gate": expert_gate_bytes(conv, arch.model_type)}
    return _layout(moe_bytes(conv, arch), **(base | kw))


def test_gpt_oss_clamped_gate_keeps_its_intermediates_under_hf_code():
    """GptOssExperts._apply_gate keeps the gate_up output 4, sigmoid's output, the clamped gate, up + 1 and glu 2
    each: 12 B per routed copy and expert-width element, then fc2's input 2; the default gate (act_fn(gate) * up) 6 + 2.
    Only gpt-oss has one; NeMo AutoModel's compiled DeepEP activation keeps its input only whatever the model."""
    gpt = shape_of(resolve_model("gpt-oss-120b"))
    copies = T * gpt.top_k
    own = layer_activations(gpt, _hf_layout("gpt-oss-120b"), True, "none")["moe"]
    default = layer_activations(gpt, _hf_layout("gpt-oss-120b", expert_gate=0), True, "none")["moe"]
    assert own - default == copies * gpt.f_expert * (14 - 8)
    hf = memory_card().conventions["fsdp2_hf"]
    assert expert_gate_bytes(hf, "gpt_oss") == 12 and expert_gate_bytes(hf, "qwen3_moe") == 0
    assert expert_gate_bytes(_conv(), "gpt_oss") == 0  # AutoModel's own model code
    qwen = resolve_model("qwen3-30b-a3b")
    lay = _hf_layout("qwen3-30b-a3b")
    assert lay.expert_gate == 0
    assert layer_activations(shape_of(qwen), lay, True, "none") == layer_activations(
        shape_of(qwen), lay._replace(expert_gate=0), True, "none")


@pytest.mark.slow
def test_the_gate_is_what_gpt_oss_experts_keep():
    """transformers 5.9.0's GptOssExperts under FakeTensorMode (bench/fake_tensor_hf_harness.py expert_gate_saves, a
    cut of gpt-oss-120b's config): its own gate keeps 6 B per routed copy and expert-width element more than
    _default_apply_gate, the card's 12 against the act2fn count's 6."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import fake_tensor_hf as bench

    case = {"kind": "expert_gate", "model": "gpt-oss-120b", "config": bench.card_config("gpt-oss-120b"),
            "tokens": 512, "top_k": 4, "policy": "none",
            "override": {"hidden_size": 256, "intermediate_size": 128, "num_local_experts": 8,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}}
    res = bench.served_harness([case])["results"][0]
    assert res["ok"], res
    assert res["experts_class"] == "GptOssExperts" and (res["copies"], res["width"]) == (512 * 4, 128)
    own, default = res["bytes"]["own"], res["bytes"]["default"]
    act = activation_saves(memory_card().conventions["fsdp2_hf"], "silu")
    default_gate = 2 * 2 + act[1] + 2  # the whole gate_up (silu's input, a view of it) and silu's output
    assert own - default == res["copies"] * res["width"] * (
        expert_gate_bytes(memory_card().conventions["fsdp2_hf"], "gpt_oss") - default_gate)
