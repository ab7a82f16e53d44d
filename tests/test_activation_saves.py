"""What the MLP's activation keeps for its backward (cards/memory.yaml act2fn_saves, activations._mlp): Hugging Face
transformers' ACT2FN classes where verl's and SkyRL's FSDP engines run the model code (fsdp2_hf, activation_saves
act2fn), a fused kernel that keeps its input elsewhere (Megatron-Core's bias_gelu / squared_relu / bias_swiglu,
Transformer Engine, torchtitan); by hand here, and (slow) against transformers 5.9.0's own classes and MLP modules
under FakeTensorMode (bench/fake_tensor_hf_harness.py, in the cached HF venv)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.arithmetic.activations import MOE_BYTES, Layout, attention_saves, layer_activations, shape_of
from meshplan.arithmetic.memory_states import _complete, activation_saves, memory_card
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.cards import CardError
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.families_card import families_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

ROOT = Path(__file__).resolve().parents[1]
T = 2048


def _layout(conv_name: str, activation: str, **kw) -> Layout:
    conv = memory_card().conventions[conv_name]
    return Layout(**{"tokens": T, "seq_kv": T, "tp": 1, "sp": False, "etp": 1, "flash": True, "dropout": False,
                     "swiglu_unfused": conv.swiglu_unfused, "fp8": False, "moe": MOE_BYTES[conv.moe_activations],
                     "attn": attention_saves(conv), "act": activation_saves(conv, activation), **kw})


def _mlp(model: str, conv: str = "fsdp2_hf", activation: str | None = None, **kw) -> float:
    arch = resolve_model(model)
    if activation is not None:
        arch = arch.model_copy(update={"activation": activation})
    return layer_activations(shape_of(arch), _layout(conv, arch.activation, **kw), False, "none")["mlp"]


def test_the_card_names_every_activation_transformers_knows():
    """act2fn_saves has an entry for each name cards/model_families.yaml lets a config.json name, and the card check
    refuses a table that misses one."""
    card = memory_card()
    assert set(card.act2fn_saves.activations) == set(families_card().activations)
    short = card.model_copy(update={"act2fn_saves": card.act2fn_saves.model_copy(update={
        "activations": {k: v for k, v in card.act2fn_saves.activations.items() if k != "gelu_new"}})})
    with pytest.raises(CardError, match="act2fn_saves"):
        _complete(short)


def test_python_op_gelus_keep_their_intermediates_under_the_hf_engine():
    """Per token, the MLP keeps its fc1 input 2h and, of f wide: GPT-NeoX's gelu_fast (FastGELUActivation) its input
    and six intermediates, then fc2's input: 2 + 12 + 2 B; GPT-2's gelu_new (NewGELUActivation) its input, tanh's
    output, 0.5x and 1 + tanh: 2 + 6 + 2 B; a fused gelu 2 + 2 B (what every convention counted before)."""
    h, f = 6144, 24576  # GPT-NeoX-20B
    assert _mlp("gpt-neox-20b") == T * (2 * h + (2 + 12 + 2) * f)
    assert _mlp("gpt-neox-20b", activation="gelu") == T * (2 * h + (2 + 2) * f)
    h, f = 12288, 49152  # GPT-3 175B (model_type gpt2, activation_function gelu_new)
    assert resolve_model("gpt3-175b").activation == "gelu_new"
    assert _mlp("gpt3-175b") == T * (2 * h + (2 + 6 + 2) * f)


def test_relu2_and_gated_silu_keep_what_they_kept():
    """Nemotron's relu2 keeps relu's output (not its input) and fc2's input, 2 + 2 B per f: what the fused count
    (fc1 output, fc2 input) said; a gated SiLU MLP (LlamaMLP) keeps gate, up, silu's output and the product, 8 B per
    f, as swiglu_unfused counted it; so does Gemma-2's gated gelu_pytorch_tanh (F.gelu keeps its input)."""
    h, f = 18432, 73728
    assert _mlp("nemotron-4-340b") == T * (2 * h + 4 * f) == _mlp("nemotron-4-340b", "megatron")
    h, f = 4096, 14336
    assert _mlp("llama-3.1-8b") == T * (2 * h + 8 * f) == _mlp("llama-3.1-8b", activation=None, act=None)
    h, f = 4608, 36864
    assert _mlp("gemma-2-27b") == T * (2 * h + 8 * f)


def test_a_gated_activation_that_drops_its_input_frees_gate_only_outside_the_grouped_experts():
    """LlamaMLP with relu (keeps its output only): gate_proj's output is freed, up's, relu's and the product kept, 6 B
    per f. Hugging Face's grouped-mm experts chunk one gate_up output, and up's chunk keeps the whole tensor, so the
    gate half stays: 2 B more per routed copy and expert width."""
    h, f = 4096, 14336
    assert _mlp("llama-3.1-8b", activation="relu") == T * (2 * h + 6 * f)
    qwen = resolve_model("qwen3-30b-a3b")
    relu = qwen.model_copy(update={"activation": "relu"})
    silu_moe = layer_activations(shape_of(qwen), _layout("fsdp2_hf", "silu"), True, "none")["moe"]
    relu_moe = layer_activations(shape_of(relu), _layout("fsdp2_hf", "relu"), True, "none")["moe"]
    assert silu_moe == relu_moe  # silu keeps the gate half; relu does not, but up's chunk does


def test_fused_conventions_read_no_activation():
    """Megatron-Core's MLP (bias_gelu_impl, squared_relu, bias_swiglu_impl) and Transformer Engine's activations keep
    their input whatever the model's activation: gelu_fast counts as gelu there."""
    for conv in ("megatron", "fsdp2_chunked_loss", "deepspeed"):
        assert activation_saves(memory_card().conventions[conv], "gelu_fast") is None
        assert _mlp("gpt-neox-20b", conv) == _mlp("gpt-neox-20b", conv, activation="gelu")


def test_the_estimate_of_a_gpt_neox_job_on_verl_counts_them():
    """estimate_memory's layer activations for GPT-NeoX-20B on verl's FSDP engine, no recompute: each of its 44 layers
    keeps gelu_fast's six intermediates, 12 B per token and f (tokens: 4,096 of one micro-batch)."""
    request = Request(model="gpt-neox-20b", gpu="h200", num_gpus=8, framework="verl", job="sft", zero_stage=3,
                      seq_length=4096, global_batch_size=8, micro_batch_size=1, recompute="none")
    job, plan = resolve(request)
    fast = estimate_memory(job, plan).stages[0].detail["layer_activations"]
    plain = estimate_memory(job.model_copy(update={"model": job.model.model_copy(update={"activation": "gelu"})}),
                            plan).stages[0].detail["layer_activations"]
    assert fast - plain == 44 * 4096 * 12 * 24576


def test_an_activation_no_table_knows_is_refused():
    """An Architecture built by hand with an activation transformers lacks is refused by name under the HF engine."""
    with pytest.raises(MeshplanError, match="'swiglu' is none transformers' ACT2FN knows"):
        activation_saves(memory_card().conventions["fsdp2_hf"], "swiglu")
    assert activation_saves(memory_card().conventions["megatron"], "swiglu") is None


# --------------------------------------------------------------------------- against transformers' own code (slow)


@pytest.fixture(scope="module")
def harness() -> list[dict]:
    sys.path.insert(0, str(ROOT / "bench"))
    import fake_tensor_hf as bench

    result = bench.served_harness(bench.mlp_cases(T))
    for res in result["results"]:
        assert res["ok"], res
    return result["results"]


@pytest.mark.slow
def test_the_card_is_what_each_act2fn_class_keeps(harness):
    measured = next(r["activations"] for r in harness if r["kind"] == "activations")
    card = memory_card().act2fn_saves.activations
    assert measured == {name: {"input": s.input, "inner_bytes": s.inner_bytes} for name, s in card.items()}


@pytest.mark.slow
def test_the_mlp_modules_keep_what_meshplan_counts(harness):
    """GPTNeoXMLP (gelu_fast), GPT2MLP (gelu_new), NemotronMLP (relu2), LlamaMLP (silu) and Gemma2MLP (gated
    gelu_pytorch_tanh), each to the byte."""
    sys.path.insert(0, str(ROOT / "bench"))
    import fake_tensor_hf as bench

    rows = bench.mlp_rows(harness)
    assert {r["model"] for r in rows} == set(bench.MLP_MODELS)
    for r in rows:
        assert r["framework_bytes"] == r["meshplan_bytes"], r
