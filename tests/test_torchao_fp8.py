"""fp8 under torchao's Float8Linear (torchtitan, KempnerForge: the fsdp2 conventions of cards/memory.yaml): no fp8
weight kept between calls, the bf16 input saved for the backward, the same op-level SAC outputs as bf16; float8
all-gather halves the prefetched unit. Transformer Engine's conventions keep their fp8 copies."""

from __future__ import annotations

import pytest

from meshplan.memory import estimate_memory
from meshplan.memory_states import fp8_inputs, with_precision
from meshplan.request import resolve
from meshplan.schema import Request

# torchtitan's 2025-06 Trainy run: Llama 3.1 8B, 32 H200, FSDP, local batch 2 x 8192, op-level SAC
TRAINY = dict(model="llama-3.1-8b", gpu="h200", num_gpus=32, framework="torchtitan", seq_length=8192,
              micro_batch_size=2, global_batch_size=64, dp=32, zero_stage=3, recompute="selective")


def estimate(**fields):
    job, plan = resolve(Request(**{**TRAINY, **fields}))
    return job, plan, estimate_memory(job, plan).stages[0]


@pytest.mark.parametrize("version", ["0.2", "0.3.0"])
def test_torchao_fp8_keeps_what_bf16_keeps(version):
    """Weights, activations and every detail equal bf16's: no fp8 weight copy, inputs saved in bf16."""
    *_, bf16 = estimate(framework_version=version)
    job, plan, fp8 = estimate(framework_version=version, precision="fp8")
    assert not fp8_inputs(job, with_precision(job, plan)[1])
    assert "fp8_weight_copies" not in fp8.detail
    assert (fp8.weights_bytes, fp8.activations_bytes, fp8.total_bytes) == (
        bf16.weights_bytes, bf16.activations_bytes, bf16.total_bytes)


def test_float8_all_gather_prefetches_one_byte_per_parameter():
    """The FSDP2 transient: one unit's bf16 grads 2 + fp32 reduce-scatter input 4 per parameter, plus the unit
    prefetched next at 2 B (bf16 all-gather) or 1 B (float8 all-gather): the difference is one decoder layer's
    parameters (the worst unit is the output layer with the final norm, preceded by the last decoder layer; 0.2, the
    fsdp2 preset). 0.3.0 walks the backward (tests/test_fsdp_step_peak.py): the output unit, gathered through the
    chunked loss, is fp8 too, 1 B per parameter less."""
    job, _, bf16 = estimate(precision="fp8", fp8_recipe="tensorwise", framework_version="0.2")
    *_, gathered = estimate(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True, framework_version="0.2")
    arch = job.model
    h, kv, f = arch.hidden_size, arch.num_kv_heads * arch.head_dim, arch.ffn_hidden_size
    layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h  # wq, wk, wv, wo, w1, w2, w3, two RMSNorm weights
    assert bf16.detail["gathered_layers"] - gathered.detail["gathered_layers"] == pytest.approx(layer, abs=1)
    assert gathered.detail["gathered_layers"] == pytest.approx(6 * (arch.vocab_size * h + h) + 1 * layer, abs=1)
    *_, bf16 = estimate(precision="fp8", fp8_recipe="tensorwise")
    *_, gathered = estimate(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    assert bf16.detail["gathered_layers"] - gathered.detail["gathered_layers"] == pytest.approx(arch.vocab_size * h + h,
                                                                                                abs=1)


def test_op_sac_keeps_k_in_0_3_only():
    """torchtitan <= 0.2 runs wq, wk, wv (mm 2, wk, recomputed); 0.3.0's fused wqkv keeps K with Q and V:
    2 B x tokens x kv width per layer, over the 32 layers of one micro-batch."""
    job, _, old = estimate(framework_version="0.2")
    *_, new = estimate(framework_version="0.3.0")
    t, kv = 2 * 8192, job.model.num_kv_heads * job.model.head_dim
    assert new.detail["layer_activations"] - old.detail["layer_activations"] == 32 * 2 * t * kv


def test_transformer_engine_keeps_its_fp8_copies():
    """Megatron-Core (Transformer Engine): the fp8 weight per linear parameter and one-byte saved inputs stay."""
    fields = dict(model="llama-3.1-8b", num_gpus=8, tp=8, sequence_parallel=True)
    job, plan = resolve(Request(**fields, precision="fp8"))
    conv = with_precision(job, plan)[1]
    assert fp8_inputs(job, conv) and conv.fp8_weight_bytes == 2
    fp8 = estimate_memory(job, plan)
    assert fp8.stages[0].detail["fp8_weight_copies"] > 0
    assert any("Transformer Engine" in a for a in fp8.assumptions)


def test_the_assumption_says_what_torchao_keeps():
    job, plan = resolve(Request(**TRAINY, precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True))
    text = next(a for a in estimate_memory(job, plan).assumptions if a.startswith("fp8:"))
    assert text == ("fp8: no fp8 weight kept between calls (cast per call, all-gathered in fp8); linear-layer inputs "
                    "saved in bf16, as without fp8.")
