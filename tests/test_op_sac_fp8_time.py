"""torchtitan's op-level SAC under float8 recomputes the same GEMMs as in bf16 (time side).

torchtitan 6fc499f models/llama3/infra/parallelize.py _custom_policy counts aten.mm per block and recomputes every
second one; torchao's Float8Linear reaches that policy as aten.mm on Float8TrainingTensor arguments (the subclass
runs _scaled_mm below the SAC mode: cards/frameworks/torchtitan.yaml recompute.source, bench/torchao_fp8_probe.py
sac), so a float8 Llama block recomputes wo and w3 as a bf16 one does, at fp8 speed. The memory side already
read it so (activations._op_sac); the step time counted no fp8 GEMM in the recompute."""

from __future__ import annotations

from dataclasses import replace

from meshplan.arithmetic.comm import links
from meshplan.arithmetic.gemm import gemm_terms
from meshplan.estimate import perf
from meshplan.estimate.layer_time import layer_gemms
from meshplan.estimate.perf import estimate_throughput
from meshplan.estimate.recompute import op_sac_terms
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

ROW = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, seq_length=8192, global_batch_size=8, micro_batch_size=1,
           framework="torchtitan", dp=8, zero_stage=3, recompute="selective")


def test_fp8_block_recomputes_wo_and_w3_at_fp8_speed():
    job, plan = resolve(Request(**ROW, precision="fp8"))
    cal = calibration(job.framework)
    ctx = perf.layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), perf._peaks(job, cal), 1, None)
    assert ctx.fp8_peak is not None and ctx.fp8_peak > ctx.bf16_peak
    gemms = layer_gemms(ctx, False)
    wo = next(g for g in gemms if g.name == "attn_out")
    fc1 = next(g for g in gemms if g.name == "mlp_fc1")
    assert wo.fp8 and fc1.fp8
    # the block's mm calls in order, every second one recomputed: wo (attn_out) and w3 (half of the gated fc1)
    expected = gemm_terms([wo, replace(fc1, n=fc1.n / 2)], cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
    assert op_sac_terms(gemms, ctx) == expected
    assert all(t > 0 for t in expected)


def test_fp8_recompute_counts_the_fp8_gemms():
    """The step's recompute under fp8 holds the fp8 GEMMs' forward: more than its bf16 share scaled by the fp8 / bf16
    peak ratio would leave if no GEMM were counted (old: the elementwise forward share only)."""
    fp8 = estimate_throughput(*resolve(Request(**ROW, precision="fp8")))
    bf16 = estimate_throughput(*resolve(Request(**ROW, precision="bf16")))
    job, plan = resolve(Request(**ROW, precision="fp8"))
    cal = calibration(job.framework)
    ctx = perf.layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), perf._peaks(job, cal), 1, None)
    gemm_part = sum(op_sac_terms(layer_gemms(ctx, False), ctx)) / 3 * job.model.num_layers
    assert gemm_part > 0
    assert fp8.breakdown.recompute_s >= gemm_part
    assert bf16.breakdown.recompute_s > fp8.breakdown.recompute_s  # the bf16 GEMMs run slower
