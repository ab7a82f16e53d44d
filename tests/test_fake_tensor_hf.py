"""Hugging Face transformers' decoder layers as verl's and SkyRL's FSDP engines run them (cards/memory.yaml fsdp2_hf):
the preset's arithmetic term by term against the tensors transformers 5.9.0's code saves, written out by hand, and
(slow) against that code itself, counted under FakeTensorMode by bench/fake_tensor_hf_harness.py in the cached
torch 2.13.0 CPU + transformers 5.9.0 venv (built once, under a minute; then about 10 s)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import meshplan.estimate.memory as memory
from meshplan.arithmetic.activations import MOE_BYTES, Layout, attention_saves, layer_activations, shape_of
from meshplan.arithmetic.memory_states import convention_name, memory_card
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

ROOT = Path(__file__).resolve().parents[1]
T = 2048  # tokens of one packed micro-batch


def _layout(tokens: int = T, **kw) -> Layout:
    conv = memory_card().conventions["fsdp2_hf"]
    return Layout(**{"tokens": tokens, "seq_kv": tokens, "tp": 1, "sp": False, "etp": 1, "flash": True,
                     "dropout": False, "swiglu_unfused": conv.swiglu_unfused, "fp8": False,
                     "moe": MOE_BYTES[conv.moe_activations], "attn": attention_saves(conv), **kw})


def norm(width: int, rows: int = T) -> int:
    """HF's RMSNorm module: an fp32 copy of its input 4w, the fp32 rstd 4, the bf16 normalised tensor 2w per row."""
    return rows * (4 * width + 4 + 2 * width)


def test_verl_and_skyrl_fsdp_engines_use_the_hf_preset():
    assert convention_name(framework_card("verl"), 3) == "fsdp2_hf"
    assert convention_name(framework_card("skyrl"), 3) == "fsdp2_hf"
    assert convention_name(framework_card("verl"), 1) == "megatron"
    assert convention_name(framework_card("kempnerforge"), 3) == "fsdp2_kempnerforge"
    assert convention_name(framework_card("torchtitan"), 3) == "fsdp2_chunked_loss"


def test_llama_layer_counts_what_transformers_saves():
    """Per token (LlamaDecoderLayer): two RMSNorms (fp32 input copy, rstd, bf16 normalised; not the bf16 input);
    their outputs, the q/k/v_proj and gate/up_proj inputs, 2h each; RoPE nothing (cos/sin are the model's, made once
    under no_grad, and q * cos saves only cos); flash's q, k, v (the rotated Q and K) 2(h + 2gd), its output (the
    o_proj input) 2h and fp32 lse 4a; gate, silu, up and their product 4 * 2f."""
    llama = shape_of(resolve_model("llama-3.1-8b"))
    h, a, g, d, f = 4096, 32, 8, 128, 14336
    acts = layer_activations(llama, _layout(), False, "none")
    assert acts == {"norm_inputs": 2 * norm(h), "attention": T * (2 * h + 2 * (h + 2 * g * d) + 4 * a + 2 * h),
                    "mlp": T * (2 * h + 4 * 2 * f)}
    assert sum(acts.values()) == T * 200840  # bench/data/fake_tensor_hf.json: the same to the byte
    assert layer_activations(llama, _layout(), False, "full") == {"layer_input": T * 2 * h}


def test_qwen3_moe_layer_adds_head_norms_and_the_grouped_mm_experts():
    """Qwen3MoeDecoderLayer: the per-head q_norm/k_norm (rows of head_dim, one rstd per head) on top of Llama's
    terms; Qwen3MoeTopKRouter's fp32 softmax 4E, topk's int64 ids 8k, norm_topk_prob's fp32 quotient 4k and
    denominator 4; per routed copy (grouped_mm_experts_forward) the gathered fc1 input 2h, the gate_up output 2*2fe,
    silu output 2fe, the product 2fe, the expert output kept for the routing-weight multiply 2h, the bf16 weight 2,
    three int64 index tensors 3*8 and the bool sentinel mask 1."""
    qwen = shape_of(resolve_model("qwen3-30b-a3b"))
    h, a, g, d, e, k, fe = 2048, 32, 4, 128, 128, 8, 768
    acts = layer_activations(qwen, _layout(), True, "none")
    attention = T * (2 * h + 2 * (a * d + 2 * g * d) + 4 * a + 2 * a * d) + norm(d, T * a) + norm(d, T * g)
    copies = T * k
    moe = T * (2 * h + 4 * e + (8 + 4) * k + 4) + copies * (2 * h + 2 * 2 * fe + 2 * fe + 2 * fe + 2 * h + 27)
    assert acts == {"norm_inputs": 2 * norm(h), "attention": attention, "moe": moe}
    assert MOE_BYTES["hf"].per_copy == 8 + 8 + 8 + 1 + 2


def test_deepseek_v3_mla_pads_v_for_flash():
    """DeepseekV3Attention under flash: the two latent norms (q 1536, kv 512) and their outputs (the up-projection
    inputs); Q and K [a, 192] and V padded to 192 (flash keeps the padded copy); flash's output [a, 192] and its slice
    [a, 128] made contiguous for o_proj; the k_rot part of kv_a's output is not kept."""
    ds = shape_of(resolve_model("deepseek-v3"))
    h, a, f = 7168, 128, 18432
    q_lora, kv_lora, qk, dv = 1536, 512, 192, 128
    acts = layer_activations(ds, _layout(), False, "none")
    attention = (T * 2 * h + norm(q_lora) + T * 2 * q_lora + norm(kv_lora) + T * 2 * kv_lora
                 + T * 2 * a * (qk + qk + qk) + T * 4 * a + T * 2 * a * (qk + dv))
    assert acts == {"norm_inputs": 2 * norm(h), "attention": attention, "mlp": T * (2 * h + 4 * 2 * f)}
    assert sum(acts.values()) == T * 508432  # bench/data/fake_tensor_hf.json: the same to the byte


def test_the_router_keeps_fp32_copies_only_where_the_models_own_code_makes_them():
    """HF's DeepSeek-V3 and GLM-4-MoE routers run F.linear(x.float(), weight.float()), which saves both fp32 copies;
    Qwen3-MoE's router runs in bf16 (router_fp32_model_types)."""
    from meshplan.arithmetic.activations import moe_bytes

    conv = memory_card().conventions["fsdp2_hf"]
    deepseek, glm, qwen = (resolve_model(k) for k in ("deepseek-v3", "glm-4.5", "qwen3-30b-a3b"))
    assert moe_bytes(conv, qwen) == MOE_BYTES["hf"]
    assert moe_bytes(conv, deepseek) == moe_bytes(conv, glm) == MOE_BYTES["hf"]._replace(
        router_input_bytes=4, router_weight_bytes=4)
    ds = shape_of(deepseek)
    with_copies = sum(layer_activations(ds, _layout(moe=moe_bytes(conv, deepseek)), True, "none").values())
    without = sum(layer_activations(ds, _layout(), True, "none").values())
    # the fp32 layer input per token and the fp32 gate weight (256 experts x 7168) once per layer
    assert with_copies - without == T * 4 * 7168 + 4 * 256 * 7168


# --------------------------------------------------------------------------- against transformers' own code (slow)


def test_one_served_ask_keeps_to_one_fake_process_group():
    """A harness process holds one fake process group: an ask whose cases name two worlds is refused, before any
    server starts (bench/fake_tensor_hf.served_harness keeps one server per world)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import fake_tensor_hf as bench

    with pytest.raises(ValueError, match=r"name the worlds \[1, 8\]"):
        bench.served_harness([{"kind": "step", "world": 1}, {"kind": "head", "world": 8}])


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    sys.path.insert(0, str(ROOT / "bench"))
    import fake_tensor_hf as bench

    models = {model: {**spec, "tokens": T} for model, spec in bench.MODELS.items()}
    result = bench.served_harness(bench.cases(models))
    for res in result["results"]:
        assert res["ok"], res
    return bench.layer_rows(result["results"])


@pytest.mark.slow
def test_meshplan_layers_equal_transformers_layers_within_5_percent(rows):
    assert {(r["model"], r["layer"], r["policy"]) for r in rows} == {
        ("llama-3.1-8b", "dense", "none"), ("llama-3.1-8b", "dense", "full"), ("qwen3-30b-a3b", "MoE", "none"),
        ("qwen3-30b-a3b", "MoE", "full"), ("deepseek-v3", "dense", "none"), ("deepseek-v3", "dense", "full"),
        ("deepseek-v3", "MoE", "none"), ("deepseek-v3", "MoE", "full")}
    for r in rows:
        assert abs(r["diff_pct"]) < 5, r


@pytest.mark.slow
def test_the_harness_counts_the_hand_counted_llama_layer(rows):
    llama = {r["policy"]: r for r in rows if r["model"] == "llama-3.1-8b"}
    h, a, g, d, f = 4096, 32, 8, 128, 14336
    expected = 2 * norm(h) + T * (2 * h + 2 * (h + 2 * g * d) + 4 * a + 2 * h + 2 * h + 4 * 2 * f)
    assert llama["none"]["framework_per_layer_bytes"] == [expected, expected]
    # with the output counted and the released input not (the torchtitan harness's convention): 2h more
    assert llama["none"]["framework_bytes_with_output"] == expected + T * 2 * h
    assert llama["full"]["framework_per_layer_bytes"] == [T * 2 * h] * 2  # the checkpoint keeps the layer input


def test_ulysses_keeps_k_v_at_the_repeated_heads_and_flash_output_beside_the_out_projection_input():
    """Under Ulysses (verl's and SkyRL's _ulysses_flash_attention_forward) flash attention keeps the q, k, v it gets
    from the all-to-alls, full sequence and heads / degree, so a rank's q and output are the same bytes as without,
    but K and V are repeated to max(degree // kv_heads, 1) x kv_heads first (repeat_kv), and flash's output goes
    through another all-to-all into a new tensor, the o_proj input: both are kept. Llama-3.1-8B (8 KV heads) at
    Ulysses 16 keeps K and V at 16 heads; DeepSeek-V3's padded output was already counted apart from o_proj's input
    (test_deepseek_v3_mla_pads_v_for_flash), so MLA adds nothing."""
    llama = shape_of(resolve_model("llama-3.1-8b"))
    h, g, d = 4096, 8, 128
    plain = layer_activations(llama, _layout(), False, "none")["attention"]
    assert layer_activations(llama, _layout(ulysses=4), False, "none")["attention"] == plain + T * 2 * h
    assert layer_activations(llama, _layout(ulysses=16), False, "none")["attention"] == (
        plain + T * 2 * h + T * 2 * 2 * (16 - g) * d)
    assert layer_activations(llama, _layout(ulysses=16), False, "full") == {"layer_input": T * 2 * h}
    ds = shape_of(resolve_model("deepseek-v3"))
    assert layer_activations(ds, _layout(ulysses=8), False, "none") == layer_activations(ds, _layout(), False, "none")


def test_the_memory_estimate_of_a_ulysses_plan_counts_them(monkeypatch):
    """estimate_memory builds the layer's Layout at the plan's Ulysses degree where its engine runs Ulysses
    (rules/context.runs_ulysses): verl's FSDP engine, Llama-3.1-8B at Ulysses 4 and 32,768 tokens, no recompute,
    holds flash's output of each of its 32 layers beside o_proj's input, 8,192 tokens x 4,096 x 2 bytes each."""
    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h200", num_gpus=8, framework="verl", job="sft", zero_stage=3,
                                cp=4, seq_length=32768, global_batch_size=4, micro_batch_size=1, recompute="none"))
    ulysses = memory.estimate_memory(job, plan).stages[0].activations_bytes
    monkeypatch.setattr(memory, "runs_ulysses", lambda card, zero_stage: False)
    memory.per_kind_activations.cache_clear()
    assert ulysses - memory.estimate_memory(job, plan).stages[0].activations_bytes == 32 * 8192 * 4096 * 2


# --------------------------------------------------------------------------- the root gathered again at pp=1 (slow)


@pytest.fixture(scope="module")
def head_probes() -> dict[str, dict]:
    """fake_tensor_hf_harness.head_probe on a Llama-3.1-8B cut (2 layers, full recompute, 2,048 tokens, dp 8) under
    verl's wrap and KempnerForge's apply_fsdp2 wrap (the embedding in the root unit)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import fake_tensor_hf as bench

    spec = {"kind": "head", "model": "llama-3.1-8b", "config": bench.card_config("llama-3.1-8b"), "num_layers": 2,
            "tokens": T, "world": 8, "policy": "full", "override": {}}
    result = bench.served_harness([{**spec, "wrap": wrap} for wrap in ("verl", "kempnerforge")])
    for res in result["results"]:
        assert res["ok"], res
    return {res["wrap"]: res for res in result["results"]}


@pytest.mark.slow
def test_at_the_roots_pre_backward_only_what_the_convention_says_of_the_loss_is_alive(head_probes):
    """The root's pre_backward hook fires after the loss's backward: verl keeps the logits' bf16 gradient alone (the
    logits and the flash cross-entropy's buffer freed), KempnerForge train.py's bf16 logits beside it (the log-softmax
    and nll_loss's gradient freed): fsdp2_hf's and fsdp2_kempnerforge's head_backward_bytes_per_element, 2 and 4 B per
    logit. The same model under both wraps keeps the same layer and head inputs, so the difference is the logits.
    The root is unsharded (2 B per param) and the last layer prefetched (2 B per param)."""
    card = memory_card().conventions
    hf, kf = card["fsdp2_hf"], card["fsdp2_kempnerforge"]
    verl, forge = head_probes["verl"]["at_hook"], head_probes["kempnerforge"]["at_hook"]
    logits = T * head_probes["verl"]["vocab"]
    assert verl["Temp"] == forge["Temp"] == hf.head_backward_bytes_per_element * logits  # the logits' gradient
    more = forge["Activation"] + forge["Temp"] - verl["Activation"] - verl["Temp"]
    assert abs(more - (kf.head_backward_bytes_per_element - hf.head_backward_bytes_per_element) * logits) <= 16 * T
    for res in head_probes.values():
        assert res["at_hook"]["Unsharded Param"] == hf.unsharded_param_bytes * res["root_params"]
        assert res["at_hook"]["All Gather"] == hf.prefetched_bytes * res["layer_params"]


@pytest.mark.slow
def test_the_heads_backward_moment_is_what_head_moments_walks(head_probes):
    """From the forward's end to the head's input gradient, the peak rises by what fsdp_walk.head_moments adds to the
    loss's tensors: KempnerForge's root copy-out, its all-gather output beside its unsharded params ((2 + 2) B per
    param, the moment that decides there); verl's head matmul, the root gathered, the head's weight gradient and the
    last layer prefetched (2 B each) with the logits' gradient in place of the logits, plus the hidden-state gradient
    head_moments leaves out (2 B per hidden element)."""
    kf, verl = head_probes["kempnerforge"], head_probes["verl"]
    c = memory_card().conventions["fsdp2_kempnerforge"]
    rise = kf["head_peak"]["Total"] - kf["forward_end"]["Total"]
    assert rise == (c.unsharded_param_bytes + c.prefetched_bytes) * kf["root_params"]  # to the byte
    c = memory_card().conventions["fsdp2_hf"]
    rise = verl["head_peak"]["Total"] - verl["forward_end"]["Total"]
    # less the loss's fp32 per-token tensors the forward ended with (log-probs, lse: 12 B per token)
    assert abs(rise - (c.unsharded_param_bytes * (verl["root_params"] + verl["head_params"])
                       + c.prefetched_bytes * verl["layer_params"] + 2 * T * verl["hidden"])) <= 16 * T
