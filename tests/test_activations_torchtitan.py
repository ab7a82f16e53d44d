"""torchtitan 0.3's layer without recompute (cards/memory.yaml fsdp2_chunked_loss: its RoPE, MLA, flex attention and
MoE saves) term by term, as its model code saves it: the hand count of tests/test_fake_tensor_memory.py and the
FakeTensorMode counts of bench/data/fake_tensor_memory.json (bench/fake_tensor_harness.py)."""

from __future__ import annotations

import json
from pathlib import Path

from test_fake_tensor_memory import T as HARNESS_TOKENS
from test_fake_tensor_memory import no_recompute_bytes

from meshplan.arithmetic.activations import (
    MOE_BYTES,
    AttentionSaves,
    Layout,
    attention_saves,
    layer_activations,
    shape_of,
)
from meshplan.arithmetic.memory_states import memory_card
from meshplan.knowledge.catalog import resolve_model

ROOT = Path(__file__).resolve().parents[1]


def _layout(tokens: int, **kw) -> Layout:
    conv = memory_card().conventions["fsdp2_chunked_loss"]
    return Layout(**{"tokens": tokens, "seq_kv": tokens, "tp": 1, "sp": False, "etp": 1, "flash": True,
                     "dropout": False, "swiglu_unfused": True, "fp8": False, "moe": MOE_BYTES[conv.moe_activations],
                     "attn": attention_saves(conv), **kw})


def test_llama_block_counts_the_tensors_torchtitans_code_saves():
    """Per token: the block input and the post-attention residual (the norms' inputs) 2*2h; the attention-norm
    output 2h; rotated Q, K and the contiguous V 2(h + 2gd); the complex64 RoPE rows 8*d/2; the flex output 2h with
    its fp32 logsumexp and max 2*4a; the FFN-norm output 2h; w1, w3, silu and their product 4*2f."""
    llama = shape_of(resolve_model("llama-3.1-8b"))
    h, a, g, d, f = 4096, 32, 8, 128, 14336
    t = HARNESS_TOKENS
    acts = layer_activations(llama, _layout(t), False, "none")
    attention = t * (2 * h + 2 * (h + 2 * g * d) + 4 * d + 8 * a + 2 * h)
    assert acts == {"norm_inputs": t * 2 * 2 * h, "attention": attention, "mlp": t * (2 * h + 4 * 2 * f)}
    # the slow harness test's hand count of the same block, less the two RMSNorms' fp32 rstd (4 B per token each)
    assert sum(acts.values()) == no_recompute_bytes() - t * 2 * 4
    # Megatron's layout: the fused QKV output V views lives on (Q and K dims again), flash keeps the lse only
    megatron = layer_activations(llama, _layout(t, attn=AttentionSaves()), False, "none")
    assert megatron["attention"] - acts["attention"] == t * (2 * (h + g * d) - 4 * d - 4 * a)


def test_deepseek_v3_mla_and_moe_term_by_term():
    ds = shape_of(resolve_model("deepseek-v3"))
    h, a, f, e, k, fe, fs = 7168, 128, 18432, 256, 8, 2048, 2048
    q_lora, kv_lora, nope, rope, dv = 1536, 512, 128, 64, 128
    t = 4 * 4096
    attention = t * (
        2 * h                            # attention-norm output (wq_a and wkv_a input)
        + 2 * 2 * (q_lora + kv_lora)     # q and kv latents: their norms' inputs and outputs
        + 2 * rope                       # k_pe, the rest of wkv_a's output the kv norm's input views
        + 2 * 2 * a * (nope + rope)      # Q and K after the concatenations
        + 2 * a * dv + 2 * a * nope      # V, a view of wkv_b's output, whose K-nope half so lives on
        + 8 * rope / 2                   # complex64 RoPE rows
        + 8 * a                          # flex attention's fp32 logsumexp and max
        + 2 * a * dv                     # attention output (wo input)
    )
    dense = layer_activations(ds, _layout(t), False, "none")
    assert dense == {"norm_inputs": t * 2 * 2 * h, "attention": attention, "mlp": t * (2 * h + 4 * 2 * f)}
    moe = layer_activations(ds, _layout(t), True, "none")
    copies = t * k
    assert moe["moe"] == (
        t * 4 * h + 4 * e * h            # the router gate's fp32 autocast copies of its input and weight
        + t * 2 * h                      # the bf16 FFN-norm output, which the shared expert's w1/w3 keep
        + t * 4 * e                      # fp32 sigmoid scores
        + t * k * (8 + 4) + t * 4        # int64 top-k ids, their fp32 scores, route_norm's fp32 denominator
        + copies * (8 + 8 + 4)           # int64 argsort and token indices, fp32 scores in expert order
        + copies * 4 * h                 # combine's fp32 copy of each expert output (times its score)
        + copies * 2 * h                 # the dispatched tokens (grouped mm input)
        + copies * 4 * 2 * fe            # w1, w3, silu, product of the routed experts
        + t * 4 * 2 * fs                 # and of the shared expert
    )


def test_deepseek_v3_layers_equal_the_fake_tensor_counts():
    """Less what meshplan leaves out: the fp32 rstd of the four RMSNorms (attention, q latent, kv latent, FFN: 16 B
    per token), the MoE's int32 expert offsets [experts], and the tracker's 20 bytes of bookkeeping."""
    data = json.loads((ROOT / "bench" / "data" / "fake_tensor_memory.json").read_text())
    rows = {r["layer"]: r for r in data["layers"] if r["arch"] == "deepseek-v3-671b" and r["policy"] == "none"}
    ds = shape_of(resolve_model("deepseek-v3"))
    t = rows["dense"]["seq"] * rows["dense"]["micro_batch"]
    dense, moe = (sum(layer_activations(ds, _layout(t), m, "none").values()) for m in (False, True))
    assert dense == rows["dense"]["framework_bytes"] - 16 * t - 20
    assert moe == rows["MoE"]["framework_bytes"] - 16 * t - 4 * ds.experts - 20


def test_moe_without_shared_experts_keeps_only_the_routers_fp32_copy():
    """torchtitan's router saves its own fp32 copy of the FFN-norm output; the bf16 output itself is saved only
    by shared experts (the dispatch gathers rows by index, which saves indices), so Qwen3-30B-A3B keeps 4h, not 6h."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    assert qwen.f_shared == 0
    t = 4096
    with_shared = shape_of(resolve_model("qwen3-30b-a3b"))._replace(f_shared=768)
    no_shared, shared = (layer_activations(s, _layout(t), True, "none")["moe"] for s in (qwen, with_shared))
    assert shared - no_shared == t * 2 * qwen.h + t * 4 * 2 * 768
    copies = t * qwen.top_k
    assert no_shared == (t * 4 * qwen.h + 4 * qwen.experts * qwen.h + t * (4 * qwen.experts + 12 * qwen.top_k + 4)
                         + copies * (20 + 4 * qwen.h + 2 * qwen.h + 4 * 2 * qwen.f_expert))
