"""fp8 under torchao's Float8Linear (torchtitan, KempnerForge: the fsdp2 conventions of cards/memory.yaml): no fp8
weight kept between calls, the bf16 input saved for the backward, the same op-level SAC outputs as bf16; float8
all-gather halves the prefetched unit. Transformer Engine's conventions keep their fp8 copies."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.memory_states import fp8_inputs, with_precision
from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

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
    """The FSDP2 transient with float8 all-gather: the gathered unit is 1 B per parameter instead of bf16's 2. 0.2 (the
    fsdp2 preset) and 0.3.0 both walk the backward (tests/test_fsdp_step_peak.py): 0.2 peaks in its unchunked loss,
    the output unit (with the final norm) gathered and nothing prefetched yet; 0.3.0's output unit, gathered through
    the chunked loss, is fp8 too: 1 B per output-unit parameter less either way."""
    job, _, bf16 = estimate(precision="fp8", fp8_recipe="tensorwise", framework_version="0.2")
    *_, gathered = estimate(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True, framework_version="0.2")
    arch = job.model
    head = arch.vocab_size * arch.hidden_size + arch.hidden_size
    assert bf16.detail["gathered_layers"] == pytest.approx(2 * head, abs=1)
    assert gathered.detail["gathered_layers"] == pytest.approx(1 * head, abs=1)
    *_, bf16 = estimate(precision="fp8", fp8_recipe="tensorwise")
    *_, gathered = estimate(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True)
    assert bf16.detail["gathered_layers"] - gathered.detail["gathered_layers"] == pytest.approx(head, abs=1)


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
