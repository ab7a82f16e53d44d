"""A hybrid Mamba-2 model's memory (model_type nemotron_h on Megatron-Core / Megatron-Bridge): each pipeline stage
weighs what its layers of the pattern weigh, and each layer keeps what its kind saves (cards/memory.yaml
mamba2_layer for a Mamba-2 layer, the transformer layer's terms for the attention, MLP and MoE layers)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tree_under_test import tree_env

from meshplan import api
from meshplan.arithmetic.mamba import hybrid_layer_activations
from meshplan.arithmetic.memory_states import memory_card
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import architecture_shape, memory_terms
from meshplan.knowledge.catalog import catalog_architecture
from meshplan.knowledge.model_counts import layer_params
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

# Nemotron-H-8B per token on one GPU at tp 1, bf16 (hidden 4096, d_inner 8192, 8 groups x state 128, 128 heads)
H, INNER, IN_PROJ, GROUPS = 4096, 8192, 2 * 8192 + 2 * 8 * 128 + 128, 8
MAMBA_TOKEN = 2 * H + 2 * H + 2 * IN_PROJ + 2 * INNER + 2 * INNER + 4 * GROUPS + 2 * INNER  # norm in, in_proj in,
# zxBCdt, out_x, gated norm input, its rstd, out_proj input
ATTN_TOKEN = 2 * H + 2 * H + 2 * (32 * 128 + 2 * 8 * 128) + 4 * 32 + 2 * 32 * 128  # no rotary copies: no RoPE
MLP_TOKEN = 2 * H + 2 * H + 2 * 21504 + 2 * 21504  # squared-ReLU, not gated: fc1 output and fc2 input


def _terms(**fields):
    job, plan = resolve(parse_request({"model": "nemotron-h-8b", "gpu": "h100", "num_gpus": 8, **fields}))
    return job, plan, memory_terms(job, plan, [])


def test_each_layer_kind_keeps_what_its_code_saves():
    _, _, terms = _terms()
    per_token = {k: v / terms.tokens for k, v in terms.per_kind.items()}
    assert per_token[("M", "none")] == MAMBA_TOKEN == 102_688
    assert per_token[("*", "none")] == ATTN_TOKEN
    assert per_token[("-", "none")] == MLP_TOKEN
    for kind in "M*-":
        assert per_token[(kind, "full")] == 2 * H  # full recompute keeps the layer's input


def test_tensor_and_sequence_parallelism_split_every_mamba_term():
    """Megatron's MambaMixer splits heads and groups over TP (every inner-wide term / tp); sequence parallelism splits
    the hidden-wide ones (the norm input and in_proj's input)."""
    _, _, sp = _terms(tp=4, sequence_parallel=True)
    _, _, no_sp = _terms(tp=4, sequence_parallel=False)
    assert sp.per_kind[("M", "none")] == MAMBA_TOKEN / 4 * sp.tokens
    assert no_sp.per_kind[("M", "none")] == (4 * H + (MAMBA_TOKEN - 4 * H) / 4) * no_sp.tokens


def test_the_cards_rows_are_what_the_mamba_layer_sums():
    """A row of cards/memory.yaml mamba2_layer reaches the estimate: dropped by selective recompute of its module,
    kept under fp8 at one byte where it is a linear layer's input."""
    job, _, terms = _terms()
    shape, lay = architecture_shape(job.model), terms.lay
    saves = memory_card().mamba2_layer.saves
    assert all(s.source for s in saves) and len(lay.mamba) == len(saves)
    layernorm = hybrid_layer_activations(shape, lay, "M", "selective", ("layernorm",))["mamba"]
    assert layernorm == (MAMBA_TOKEN - 2 * H) * terms.tokens
    fp8 = hybrid_layer_activations(shape, lay._replace(fp8=True), "M", "none")["mamba"]
    assert fp8 == (MAMBA_TOKEN - H - INNER) * terms.tokens
    with pytest.raises(ValueError, match="op_sac"):
        hybrid_layer_activations(shape, lay, "M", "op_sac")


def test_each_stage_weighs_its_own_layers():
    """pp 2: the 52 layers split 26/26, and each stage holds its layers' parameters (Mamba-2 mixers split over TP
    whole, the norms replicated) and the embedding or the output layer."""
    arch = catalog_architecture("nemotron-h-8b")
    report = api.estimate_memory(parse_request({"model": "nemotron-h-8b", "gpu": "h100", "num_gpus": 8, "pp": 2,
                                                "tp": 2}))
    vocab_rows = 131072 * 4096 / 2
    for stage, layers in zip(report.stages, (range(0, 26), range(26, 52)), strict=True):
        split = sum(sum(v for k, v in layer_params(arch, i).items() if k != "norms") for i in layers) / 2
        norms = sum(layer_params(arch, i)["norms"] for i in layers)
        edge = vocab_rows + (4096 if stage.stage == 1 else 0)  # embedding, or output layer and final norm
        assert stage.detail["params_on_gpu"] == int(split + norms + edge)
    assert report.stages[0].detail["params_on_gpu"] != report.stages[1].detail["params_on_gpu"]


def test_a_hybrid_moe_model_is_estimated_with_expert_parallelism():
    report = api.estimate_memory(parse_request({"model": "nemotron-3-nano-30b-a3b", "gpu": "h100", "num_gpus": 8,
                                                "ep": 8}))
    assert report.stages[0].detail["params_on_gpu"] < 31_577_940_288 / 4


@pytest.mark.parametrize("fields, words", [
    ({"framework": "torchtitan"}, "HY001: torchtitan has no model code"),
    ({"framework": "verl"}, "HY002: verl trains Nemotron-H-8B-Base-8K through transformers' NemotronH code"),
    # a LoRA job is planned on Megatron-Bridge (tests/test_hybrid_lora.py); elsewhere a rule refuses it
    ({"framework": "megatron-core", "job": "lora"}, "LORA001"),
    ({"framework": "verl", "lora_rank": 16}, "HY002"),
    ({"rollout_tp": 2}, "does not model an RL job"),
])
def test_what_is_not_modelled_for_a_hybrid_is_refused(fields, words):
    with pytest.raises(MeshplanError, match=words):
        api.estimate_memory(parse_request({"model": "nemotron-h-8b", "gpu": "h100", "num_gpus": 8, **fields}))


def test_cli_memory_of_a_hybrid():
    out = subprocess.run([sys.executable, "-m", "meshplan.faces.cli", "memory", "nemotron-h-8b", "--gpu", "h100",
                          "--json"], capture_output=True, text=True, env=tree_env(), check=False)
    assert out.returncode == 0, out.stderr
    assert '"params_on_gpu": 8100852736' in out.stdout
    assert "Mamba-2 layers" in out.stdout  # the band names them unvalidated; the assumptions say how they count
    assert "Hybrid layers (24 Mamba-2, 4 attention, 24 MLP)" in out.stdout


@pytest.mark.parametrize(("model", "counts"), [
    ("nemotron-h-8b", "24 Mamba-2, 4 attention, 24 MLP"),
    ("qwen3-next-80b-a3b", "36 Gated DeltaNet, 12 attention, 48 MoE"),
])
def test_memory_throughput_and_the_rl_refusal_count_a_hybrids_layer_kinds_in_one_wording(model, counts):
    """Memory's hybrid assumption counted every kind in its own order ('0 MoE', '0 MLP'), throughput's only the kinds
    the pattern has, in LAYER_KINDS' order, and the RL refusal put Gated DeltaNet last: one function
    (schema/model.layer_kind_counts) words them for all three."""
    req = {"model": model, "gpu": "h100", "num_gpus": 64, "framework": "megatron-core"}
    if model.startswith("qwen3-next"):
        req |= {"ep": 8, "pp": 4}
    words = f"Hybrid layers ({counts}):"
    memory = [a for a in api.estimate_memory(parse_request(req)).assumptions if a.startswith("Hybrid layers")]
    throughput = [a for a in api.estimate_throughput(parse_request(req)).assumptions
                  if a.startswith("Hybrid layers")]
    assert [a[:len(words)] for a in memory + throughput] == [words, words], (memory, throughput)
    with pytest.raises(MeshplanError, match=rf"is a hybrid model \({counts} layers\)"):
        api.estimate_memory(parse_request({**req, "framework": "verl", "job": "rl"}))


# --------------------------------------------------------------------------- against transformers' own code (slow)

def _hf_layout(tokens: int):
    """The Layout of Hugging Face code (the fsdp2_hf convention: HF's composite RMSNorm keeps an fp32 copy), tp 1."""
    from meshplan.arithmetic.activations import MOE_BYTES, Layout, attention_saves

    conv = memory_card().conventions["fsdp2_hf"]
    return Layout(tokens=tokens, seq_kv=tokens, tp=1, sp=False, etp=1, flash=True, dropout=False,
                  swiglu_unfused=conv.swiglu_unfused, fp8=False, moe=MOE_BYTES[conv.moe_activations],
                  attn=attention_saves(conv), mamba=memory_card().mamba2_layer.terms())


@pytest.mark.slow
def test_attention_and_mlp_layers_equal_transformers_nemotron_h_within_5_percent():
    """bench/fake_tensor_hybrid_harness.py runs Nemotron-H-8B's M, -, * blocks under FakeTensorMode. The attention
    and MLP layers agree within 5% (exactly, under HF's norm convention); the Mamba-2 layer's torch path keeps far
    more than the CUDA kernel Megatron-Core trains with (its conv output and the chunked scan's decay matrices,
    segment sums and states), which the card follows: there the HF count bounds meshplan's from above."""
    import json
    from pathlib import Path

    from framework_packages import HF_VENV, venv_python

    arch = catalog_architecture("nemotron-h-8b")
    import yaml

    card = Path(__file__).resolve().parents[1] / "cards" / "models" / "nemotron-h-8b.yaml"
    config = {k: v for k, v in yaml.safe_load(card.read_text())["config"].items() if k != "architectures"}
    config.update(hybrid_override_pattern="M-*", num_hidden_layers=3, vocab_size=1024)
    seq = 1024
    python = venv_python("transformers", HF_VENV, python_version="3.11")
    harness = Path(__file__).resolve().parents[1] / "bench" / "fake_tensor_hybrid_harness.py"
    out = subprocess.run([str(python), str(harness)], input=json.dumps({"seq": seq, "config": config}),
                         capture_output=True, text=True, timeout=900, check=True).stdout
    hf = json.loads(out.split("RESULT ", 1)[1])
    shape, lay = architecture_shape(arch), _hf_layout(seq)
    ours = {k: sum(hybrid_layer_activations(shape, lay, k, "none").values()) / seq for k in "M-*"}
    assert abs(ours["-"] - hf["1-"]) <= 0.05 * hf["1-"] and abs(ours["*"] - hf["2*"]) <= 0.05 * hf["2*"]
    assert hf["0M"] > 5 * ours["M"]



# --------------------------------------------------------------------------- FLOPs (stage 2's terms)

def test_model_flops_follow_megatrons_hybrid_flops():
    """Nemotron-H-8B at 8,192 tokens, Megatron-LM's hybrid_flops per token written out: 4 attention layers
    (p = 1, 8 of 32 query groups), 24 squared-ReLU MLPs (expansion 21504 / 4096), 24 Mamba-2 layers (d = 2h), logits."""
    from meshplan.arithmetic.flops import model_flops_per_token

    h, s = 4096, 8192
    attention = 4 * h * (h + h * 8 / 32) + 2 * s * h
    mlp = 4 * (21504 / h) * h * h
    mamba = 2 * h * (2 * 2 * h + 2 * 8 * 128 + 128) + 7 * 2 * h * 128 + 2 * 2 * h * h
    expected = 3 * (4 * attention + 24 * mlp + 24 * mamba + 2 * h * 131072)
    assert model_flops_per_token(catalog_architecture("nemotron-h-8b"), s) == pytest.approx(expected, rel=1e-12)


def test_a_mamba_layers_gemms_and_scan_on_one_rank():
    """in_proj and out_proj split over TP; the conv and the SSD chunked scan (chunk 128) per token: conv 2 x 4 taps x
    10,240 channels, C B^T 2 Q N per group, (L o C B^T) X 2 Q P and the two state products 4 N P per head."""
    from meshplan.arithmetic.flops import Shard
    from meshplan.arithmetic.mamba import mamba_gemms, ssd_scan_flops

    arch = catalog_architecture("nemotron-h-8b")
    for tp in (1, 4):
        sh = Shard(tokens=8192, tp=tp, ep=1, etp=1, sp=tp > 1)
        in_proj, out_proj = mamba_gemms(arch, sh)
        assert (in_proj.m, in_proj.n, in_proj.k) == (8192, IN_PROJ / tp, H)
        assert (out_proj.m, out_proj.n, out_proj.k) == (8192, H, INNER / tp)
        per_token = 2 * 4 * (INNER + 2 * 8 * 128) + 8 * 2 * 128 * 128 + 128 * (2 * 128 * 64 + 4 * 128 * 64)
        assert ssd_scan_flops(arch, sh) == 8192 * per_token / tp
