"""Each trained MTP depth's output layer, loss and eh_proj in the step time (estimate/mtp_time.py): Megatron-Core's
process_mtp_loss runs the model's output layer and loss once per depth, and each MultiTokenPredictionLayer projects
2h -> h through eh_proj (megatron/core/transformer/multi_token_prediction.py). Both tests fail before the change: the
head's seconds did not move with the depth (only the depths' decoder layers did)."""

from __future__ import annotations

from meshplan.arithmetic.gemm import gemm_seconds
from meshplan.estimate import perf
from meshplan.estimate.mtp_time import eh_proj_gemm
from meshplan.knowledge.calibration import calibration
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve

SUPER = "nemotron-3-super-120b-a12b"


def _inputs(model: str = SUPER, **fields):
    job, plan = resolve(parse_request({"model": model, "gpu": "gb200", "num_gpus": 64, "seq_length": 8192,
                                       "global_batch_size": 512, "micro_batch_size": 1, "tp": 2, "ep": 64, "etp": 1,
                                       "sequence_parallel": True, "framework": "megatron-bridge", **fields}))
    _, _, ctx = perf._step_context(job, plan, calibration(job.framework))
    return job, plan, ctx, perf.stage_inputs(job, plan, ctx)


def test_the_head_runs_once_more_per_trained_depth_with_its_eh_proj():
    """Super at depth 0, 1 and 2 (the recipe's repeated layer): the head stage's head term is the output layer and
    loss (perf.head_seconds) x (1 + depths) plus one eh_proj GEMM per depth."""
    heads = {}
    for depth in (0, 1, 2):
        job, plan, ctx, inp = _inputs(mtp_num_layers=depth, mtp_use_repeated_layer=depth > 1)
        one = perf.head_seconds(job, plan, ctx)
        eh = gemm_seconds([eh_proj_gemm(job.model, ctx)], ctx.cal, ctx.bf16_peak, ctx.fp8_peak)
        assert inp.head == one + depth * (one + eh)
        heads[depth] = inp.head
    assert heads[0] < heads[1] < heads[2]


def test_the_step_grows_by_the_depths_heads():
    """The step at depth 2 exceeds depth 0's by more than its two extra decoder layer pairs alone: the 16
    micro-batches' two more output layers (a 131K-vocabulary logits GEMM and its loss each) are in it."""
    slow = perf.step_terms(*_inputs(mtp_num_layers=2, mtp_use_repeated_layer=True)[:2])
    fast = perf.step_terms(*_inputs(mtp_num_layers=0)[:2])
    job, plan, ctx, inp = _inputs(mtp_num_layers=0)
    m = slow.m
    layers = inp.hybrid["*"].compute + inp.hybrid["E"].compute
    gained = slow.rows[slow.worst].compute - fast.rows[fast.worst].compute
    assert gained > 2 * layers + 2 * 0.99 * perf.head_seconds(job, plan, ctx)
    assert m == 16
