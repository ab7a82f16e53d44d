"""Transformer Engine's FP8 quantize passes (meshplan/arithmetic/fp8_casts.py, cards/memory.yaml fp8_quantize): the
bytes per recipe and GPU counted by hand, which jobs run them, and how the layer time and the step carry them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.arithmetic.flops import Gemm
from meshplan.arithmetic.fp8_casts import fp8_casts, quantize_bytes, tensor_quantize_bytes, weight_cast_bytes
from meshplan.estimate import perf
from meshplan.estimate.layer_time import layer_gemms, layer_time, quantize_seconds
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

T, H, N, F = 8192.0, 8192.0, 10240.0, 28672.0  # tokens, hidden, qkv width, fc1 width (before the TP split)


def casts(**fields):
    job, plan = resolve(Request(**({"model": "llama-3-70b", "num_gpus": 64, "tp": 4, "pp": 4, "global_batch_size": 128,
                                    "seq_length": 8192, "precision": "fp8", "framework": "megatron-core"} | fields)))
    return job, plan, fp8_casts(job, plan)


def test_hopper_delayed_scaling_by_hand():
    """H100, delayed scaling, TP4 with SP: qkv's input is the fused norm's fp8 output (one byte written in place of
    two), gathered row-wise and transposed after the gather (read 1 + write 1 over the gathered elements); attn_out's
    input cast and transposed in one kernel (read 2, write 1 + 1); attn_out's output gradient quantized row-wise on its
    sequence shard (read 2, write 1), gathered, transposed; qkv's output gradient read 2, written 1 + 1."""
    _, _, c = casts(gpu="h100", fp8_recipe="delayed")
    assert (c.source_reads, c.copy_bytes, c.copies, c.rowwise_gather, c.norm_output, c.sp_gather) == \
        (1, 1.0, 2, True, "fp8", 4)
    qkv, out = Gemm("qkv", T, N / 4, H), Gemm("attn_out", T, H, H / 4)
    fwd, bwd = quantize_bytes(c, [qkv, out])
    assert fwd == pytest.approx(T * H / 4 * (1 - 2) + T * H / 4 * 4)
    assert bwd == pytest.approx(2 * T * H + T * N / 4 * 4 + T * H / 4 * 3 + 2 * T * H)


def test_current_scaling_reads_its_source_twice_but_once_after_a_fused_norm():
    """tensorwise: an amax kernel, then the cast (2 reads); the norm before a LayerNormLinear computes the amax itself
    (1 read); both write the row-wise copy on the shard and transpose after the gather on Hopper."""
    _, _, c = casts(gpu="h100", fp8_recipe="tensorwise")
    e = T * H
    assert tensor_quantize_bytes(c, e, gathered=False, fused=False) == (e * (2 * 2 + 2), 0.0)
    assert tensor_quantize_bytes(c, e, gathered=True, fused=True) == pytest.approx((e / 4 * (2 + 1), 2 * e))
    assert tensor_quantize_bytes(c, e, gathered=True, fused=False) == pytest.approx((e / 4 * (4 + 1), 2 * e))


def test_blackwell_per_tensor_recipes_write_one_copy_and_mxfp8_two_with_scales():
    """B200 runs FP8 GEMMs in any layout: delayed and tensorwise keep one copy for both GEMMs (no transpose); MXFP8
    writes a row-wise and a column-wise copy with an E8M0 scale per 32 elements each, both on the shard."""
    _, _, delayed = casts(gpu="b200", fp8_recipe="delayed")
    _, _, mx = casts(gpu="b200", fp8_recipe="mxfp8")
    e = T * H
    assert (delayed.copies, delayed.copy_bytes) == (1, 1.0)
    assert tensor_quantize_bytes(delayed, e, gathered=True, fused=True) == pytest.approx((e / 4 * (1 - 2), 0.0))
    assert (mx.copies, mx.copy_bytes, mx.rowwise_gather, mx.norm_output) == (2, 1.03125, False, None)
    assert tensor_quantize_bytes(mx, e, gathered=True, fused=True) == pytest.approx((e / 4 * (2 + 2 * 1.03125), 0.0))


def test_lora_frozen_linears_skip_the_column_wise_copies_but_their_weights_keep_one():
    _, _, c = casts(gpu="h100", fp8_recipe="delayed", lora_rank=16)
    assert (c.copies, c.weight_copies) == (1, 2)
    assert tensor_quantize_bytes(c, T * H, gathered=False, fused=False) == (T * H * 3, 0.0)


def test_weight_casts_per_step():
    """bf16 weights: read 2 (tensorwise twice), write the copies; fp8 primary weights: the column-wise copy made
    from the gathered row-wise one where the GPU needs it (Hopper's transpose), nothing for MXFP8 (gathers both) or
    Blackwell's per-tensor recipes."""
    assert weight_cast_bytes(casts(gpu="h100", fp8_recipe="delayed", fp8_param_gather=False)[2]) == 4
    assert weight_cast_bytes(casts(gpu="h100", fp8_recipe="tensorwise", fp8_param_gather=False)[2]) == 6
    assert weight_cast_bytes(casts(gpu="h100", fp8_recipe="delayed", fp8_param_gather=True)[2]) == 2
    assert weight_cast_bytes(casts(gpu="b200", fp8_recipe="delayed", fp8_param_gather=True)[2]) == 0
    assert weight_cast_bytes(casts(gpu="b200", fp8_recipe="mxfp8", fp8_param_gather=True)[2]) == 0
    assert weight_cast_bytes(casts(gpu="b200", fp8_recipe="mxfp8", fp8_param_gather=False)[2]) == 2 + 2.0625


def test_only_transformer_engine_fp8_jobs_run_them():
    assert casts(precision="bf16")[2] is None
    assert casts(framework="torchtitan", tp=1, pp=1, num_gpus=8, model="llama-3.1-8b")[2] is None  # torchao
    assert casts(framework="megatron-bridge")[2] is not None


@pytest.mark.parametrize("fields", [{"gpu": "h100", "fp8_recipe": "tensorwise"},
                                    {"model": "qwen3-30b-a3b", "gpu": "b200", "num_gpus": 8, "tp": 1, "pp": 1,
                                     "ep": 8, "fp8_recipe": "mxfp8", "global_batch_size": 64}])
def test_layer_time_carries_the_passes_as_memory_bound_work(fields):
    """The layer's memory-bound seconds grow by the quantize passes' bytes at the elementwise HBM bandwidth, its
    forward by the forward's; nothing else moves."""
    job, plan, _ = casts(**fields)
    cal = calibration(job.framework)
    _, _, ctx = perf._step_context(job, plan, cal)
    plain = replace(ctx, fp8_casts=None)
    for moe in (False, True) if job.model.moe else (False,):
        fwd, whole = quantize_seconds(ctx, layer_gemms(ctx, moe))
        assert 0 < fwd < whole
        with_casts, without = layer_time(ctx, moe), layer_time(plain, moe)
        assert with_casts.elementwise - without.elementwise == pytest.approx(whole)
        assert with_casts.fwd_compute - without.fwd_compute == pytest.approx(fwd)
        assert (with_casts.gemm, with_casts.attention, with_casts.tp) == (without.gemm, without.attention, without.tp)


def test_step_adds_the_weight_casts_once():
    """Each stage's once-per-step term grows by its decoder layers' linear weights on the rank (Llama-3-70B: q, k, v,
    o and the gated MLP, 20 layers over TP4) times weight_cast_bytes, whatever its micro-batches; none under bf16."""
    job, plan, _ = casts(gpu="h100", fp8_recipe="delayed", fp8_param_gather=False)
    terms = perf.step_terms(job, plan)
    per_layer = H * (H + 2 * 1024) + H * H + 3 * H * F
    for row in terms.rows:
        assert row.fp8_weights == pytest.approx(20 * per_layer / 4)
        extra = perf._optimizer_seconds(row, terms.inputs, terms.m) \
            - perf._optimizer_seconds(replace(row, fp8_weights=0.0), terms.inputs, terms.m)
        assert extra == pytest.approx(row.fp8_weights * 4 / terms.ctx.hbm)
    bf16 = perf.step_terms(*casts(gpu="h100", precision="bf16")[:2])
    assert [r.fp8_weights for r in bf16.rows] == [0.0] * len(bf16.rows)


def test_out_projection_saving_its_bf16_input_quantizes_it_twice():
    """Megatron-Core's linear_proj saves the attention output in bf16 under the recipes but delayed scaling
    (save_original_input): a row-wise quantize in the forward, a column-wise one for wgrad in the backward, each
    reading the source; under delayed scaling one cast-transpose in the forward."""
    _, _, tensorwise = casts(gpu="h100", fp8_recipe="tensorwise")
    _, _, delayed = casts(gpu="h100", fp8_recipe="delayed")
    assert tensorwise.original_input == {"attn_out"} and not delayed.original_input
    out = Gemm("attn_out", T, H, H / 4)
    grad_fwd, grad_after = tensor_quantize_bytes(tensorwise, T * H, gathered=True, fused=False)
    once = T * H / 4 * (2 * 2 + 1)
    assert quantize_bytes(tensorwise, [out]) == pytest.approx((once, once + grad_fwd + grad_after))
    assert quantize_bytes(delayed, [out])[0] == pytest.approx(T * H / 4 * (2 + 2))
