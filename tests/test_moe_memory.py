"""The MoE layer's activation terms against Megatron-Core's source (cards/moe_memory_audit.md), on Qwen3-30B-A3B
trained by Megatron-Bridge on 16 H100 with EP16 and HybridEP (its skills card's measured run)."""

from __future__ import annotations

from typing import get_args

import pytest

from meshplan import api
from meshplan.arithmetic.activations import (
    GENERIC_MOE,
    MEGATRON_CORE_MOE,
    MOE_BYTES,
    Layout,
    layer_activations,
    shape_of,
)
from meshplan.arithmetic.memory_states import MoeActivations, convention, memory_card
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.schema.request import Request

GIB = 1 << 30
T, H, E, K, F = 4096, 2048, 128, 8, 768  # tokens per micro-batch (mbs 1 x 4096), hidden, experts, top-k, expert FFN


def _qwen3_layout(**kw) -> Layout:
    """TP1 PP1 EP16 ETP1, no sequence parallelism, flash attention, fused SwiGLU, bf16 (Megatron's convention)."""
    base = {"tokens": T, "seq_kv": T, "tp": 1, "sp": False, "etp": 1, "flash": True, "dropout": False,
            "swiglu_unfused": False, "fp8": False, "ep": 16, "moe": MEGATRON_CORE_MOE}
    return Layout(**(base | kw))


def test_megatron_moe_layer_term_by_term():
    """Each byte of the no-recompute MoE term, as cards/moe_memory_audit.md derives it from Megatron-Core."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    assert (qwen.h, qwen.experts, qwen.top_k, qwen.f_expert, qwen.f_shared) == (H, E, K, F, 0)
    moe = layer_activations(qwen, _qwen3_layout(), True, "none")["moe"]
    copies = T * K  # dropless, balanced: each rank computes its own t*k copies on average, whatever the EP degree
    expected = (
        2 * T * H                   # pre-MLP norm output: the router's gating linear keeps it (bf16)
        + T * 4 * E                 # fp32 softmax over all experts, kept for the aux loss
        + T * (4 * (2 * E + 1))     # fused permute's int32 row_id_map [tokens, 2E + 1]
        + T * K * (8 + 4)           # top-k int64 indices and the fp32 softmax over the top-k logits
        + copies * 4                # the fp32 prob of each copy, kept by the weighted SwiGLU
        + copies * 2 * H            # expert fc1 input (the dispatched tokens; TE GroupedLinear keeps it)
        + copies * 2 * 2 * F        # fc1 output (gate and up), the SwiGLU input
        + copies * 2 * F            # SwiGLU output, fc2 input
    )
    assert moe == expected
    # per routed copy 2h + 6f + 4 = 8708 B (was 6h + 6f = 16896 B: two more hidden-wide copies per token copy)
    per_copy = (moe - 2 * T * H - T * (12 * E + 12 * K + 4)) / copies
    assert per_copy == 2 * H + 6 * F + 4 == 8708


def test_the_expert_degree_does_not_change_the_copies_a_rank_computes():
    """Without a capacity factor each EP rank receives on average the t*k copies it sends (balanced routing), so the
    per-rank term is the same at EP 1, 8 and 16; ETP gathers the copies of its group (fc1/fc2 widths split)."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    per_ep = {ep: layer_activations(qwen, _qwen3_layout(ep=ep), True, "none")["moe"] for ep in (1, 8, 16)}
    assert len(set(per_ep.values())) == 1
    etp2 = layer_activations(qwen, _qwen3_layout(etp=2), True, "none")["moe"]
    copies = T * K
    # twice the copies: their fc1 input and prob double, the fc1/fc2 widths halve (so those bytes stay)
    assert etp2 - per_ep[16] == copies * (2 * H + 4)


def test_moe_act_recompute_keeps_fc1_output_and_probs():
    """recompute_modules moe_act (experts.py CheckpointWithoutOutput around bias_act_func): only the fc2 input goes."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    none = layer_activations(qwen, _qwen3_layout(), True, "none")["moe"]
    act = layer_activations(qwen, _qwen3_layout(), True, "selective", ("moe_act",))["moe"]
    assert none - act == T * K * 2 * F


def test_fp8_router_keeps_the_bf16_layer_input():
    """Under fp8 the experts keep one-byte inputs, but the router (no fp8 module) keeps the bf16 layer input, and a
    shared expert's fc1 its own fp8 copy next to it."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    bf16 = layer_activations(qwen, _qwen3_layout(), True, "none")["moe"]
    fp8 = layer_activations(qwen, _qwen3_layout(fp8=True), True, "none")["moe"]
    copies = T * K
    assert bf16 - fp8 == copies * (1 * H + 1 * F)  # fc1 input and fc2 input in one byte; the layer input stays bf16
    ds = shape_of(resolve_model("deepseek-v3"))  # one shared expert
    lay = _qwen3_layout(fp8=True)
    keep_input = layer_activations(ds, lay, True, "none")["moe"]
    norm_recomputed = layer_activations(ds, lay, True, "selective", ("layernorm",))["moe"]
    assert keep_input - norm_recomputed == T * ds.h * (2 + 1)


def test_generic_convention_keeps_the_older_count():
    """Frameworks not re-derived (DeepSpeed, nanotron, the fsdp2 preset of torchtitan 0.2, KempnerForge and verl's
    and SkyRL's FSDP engines) keep fp32 logits and probabilities and two hidden-wide copies per routed token;
    Megatron's conventions use Megatron-Core's count, torchtitan 0.3's its own (test_activations_torchtitan.py)."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    mega = layer_activations(qwen, _qwen3_layout(), True, "none")["moe"]
    generic = layer_activations(qwen, _qwen3_layout(moe=GENERIC_MOE), True, "none")["moe"]
    copies = T * K
    assert generic - mega == copies * (2 * 2 * H - 4) + T * (8 * E - (12 * E + 12 * K + 4))
    card = memory_card()
    assert {name: c.moe_activations for name, c in card.conventions.items()} == {
        "megatron": "megatron_core", "megatron_fsdp": "megatron_core", "deepspeed": "generic",
        "fsdp2": "generic", "fsdp2_chunked_loss": "fp32_router", "fsdp2_hf": "hf", "fsdp2_automodel": "generic",
        "fsdp2_kempnerforge": "generic", "nanotron": "generic"}
    assert {name: c.moe_activations_flex for name, c in card.conventions.items() if c.moe_activations_flex} == {
        "fsdp2_automodel": "automodel_deepep"}
    assert set(MOE_BYTES) == {"megatron_core", "generic", "fp32_router", "hf", "automodel_deepep"}
    assert set(MOE_BYTES) == set(get_args(MoeActivations))  # the card's key and the table name the same counts
    assert MOE_BYTES[convention(framework_card("megatron-bridge"), 1)[1].moe_activations] is MEGATRON_CORE_MOE


def _qwen3_ep16() -> Request:
    """Megatron-Bridge skills card best_configs.qwen3_30b_h100_16 (production_configs_dev.yaml
    mbridge_card_qwen3_30b_16_h100_hybridep): 16 H100, TP1 PP1 EP16, mbs 1, seq 4096, gbs 1024, BF16, no recompute,
    flex dispatcher (HybridEP), forced-balanced routing; rank-0 peak allocated 62.166 GiB (66.75 GB). Its perf recipe
    (perf_recipes/qwen/h100/qwen3_moe.py, published_runs.STUDY_RECIPES) fuses the activation."""
    return Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, gpus_per_node=8, seq_length=4096,
                   global_batch_size=1024, micro_batch_size=1, precision="bf16", framework="megatron-bridge",
                   tp=1, pp=1, cp=1, ep=16, etp=1, dp=16, sequence_parallel=False, recompute="none",
                   moe_token_dispatcher="flex", bias_activation_fusion=True)


def test_qwen3_30b_ep16_allocated_peak_within_band_of_measured():
    """Compared as bench/production_configs.py does for an allocated peak: our peak less the CUDA context and the
    allocator's reserve. Before the audit: 82.5 GB (+24%); the two hidden-wide copies per routed token were 12.3 GB."""
    report = api.estimate_memory(_qwen3_ep16())
    stage = report.stages[report.peak_stage]
    layers = stage.detail["layer_activations"]
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    lay = _qwen3_layout()
    assert layers == int(48 * sum(layer_activations(qwen, lay, True, "none").values()))
    allocated = report.peak_bytes - memory_card().cuda_context_bytes - stage.detail["allocator_reserve"]
    measured = 66.75e9
    assert allocated / measured - 1 == pytest.approx(0.045, abs=0.01)
    assert abs(allocated / measured - 1) <= 0.07
    assert report.fits
