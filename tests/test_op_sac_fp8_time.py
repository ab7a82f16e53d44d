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


def test_separate_qkv_release_recomputes_wk():
    """torchtitan <= 0.2's llama3 runs wq, wk, wv as three linears (cards/memory.yaml fsdp2 qkv_projections:
    separate; 6fc499f models/llama3/model/model.py), so its op-level SAC counts mm 1..7 as wq, wk, wv, wo, w1, w3, w2
    and recomputes wk, wo and w3; 0.3.0's fused wqkv counts 1..5 and recomputes wo and w3. The K part is the GQA
    KV width (8 heads x 128 for Llama 3 8B)."""
    from meshplan.estimate.recompute import op_sac_recomputed, separate_k_width

    terms = {}
    for version in ("0.1", "0.3.0"):
        job, plan = resolve(Request(**ROW, precision="bf16", framework_version=version))
        cal = calibration(job.framework)
        ctx = perf.layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), perf._peaks(job, cal), 1,
                                 None)
        gemms = layer_gemms(ctx, False)
        again = op_sac_recomputed(gemms, True, separate_k_width(ctx))
        terms[version] = (ctx, gemms, [(g.name, g.n) for g in again], op_sac_terms(gemms, ctx))
    assert terms["0.1"][2] == [("qkv", 1024), ("attn_out", 4096), ("mlp_fc1", 14336)]
    assert terms["0.3.0"][2] == [("attn_out", 4096), ("mlp_fc1", 14336)]
    ctx, gemms = terms["0.1"][0], terms["0.1"][1]
    qkv = next(g for g in gemms if g.name == "qkv")
    wk = gemm_terms([replace(qkv, n=1024)], ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)[0]
    assert terms["0.1"][3] == [wk, *terms["0.3.0"][3]]
