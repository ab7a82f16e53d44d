"""The data-parallel gradient reduction's overlap as the plan sets it (grad_reduce_overlap).

Megatron-Core's DistributedDataParallelConfig overlap_grad_reduce / overlap_param_gather default to False, and
DeepSpeed's zero_optimization.overlap_comm to False below ZeRO-3: a run that leaves them off waits for the whole
reduction after the backward. With grad_reduce_overlap=false the time model hides none of it (the calibrated
dp_overlap / zero_grad_overlap / param_gather_overlap apply only with it on, the default, as render writes it).
"""

from __future__ import annotations

import pytest

from meshplan.arithmetic.comm import links, ring_time
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.model_counts import total_params
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

EXPERT_PARAMS = 48 * 128 * 3 * 2048 * 768  # Qwen3-30B-A3B's routed experts


def qwen30b(gpus: int, framework: str = "megatron-core", **kw):
    return resolve(Request(model="qwen3-30b-a3b", gpu="h20", num_gpus=gpus, framework=framework, tp=1, pp=1, ep=8,
                           etp=1, seq_length=10240, micro_batch_size=1, global_batch_size=256, zero_stage=1, **kw))


def test_default_is_on_and_off_is_noted():
    job, plan = qwen30b(16)
    assert plan.grad_reduce_overlap is True
    assert not any("grad_reduce_overlap" in n for n in job.notes)
    job, plan = qwen30b(16, grad_reduce_overlap=False)
    assert plan.grad_reduce_overlap is False
    assert any(n.startswith("grad_reduce_overlap=false") for n in job.notes)


@pytest.mark.parametrize("gpus", [16, 32])
def test_off_exposes_the_whole_zero1_sync_by_hand(gpus):
    job, plan = qwen30b(gpus, grad_reduce_overlap=False)
    lk = links(job.gpu, job.gpus_per_node, calibration("megatron-core"))
    dense = total_params(job.model) - EXPERT_PARAMS
    expert_dp = gpus // 8
    # fp32 gradients reduce-scattered, bf16 parameters all-gathered: dense over dp, experts over the expert-DP group
    hand = sum(ring_time(dense * nbytes, gpus, 1, lk) + ring_time(EXPERT_PARAMS / 8 * nbytes, expert_dp, 8, lk)
               for nbytes in (4, 2))
    off = estimate_throughput(job, plan)
    assert off.breakdown.dp_comm_s == pytest.approx(hand, rel=1e-12)
    # the same exposure verl's Megatron engine runs (its calibration overrides the three overlaps with 0)
    assert off.breakdown.dp_comm_s == pytest.approx(estimate_throughput(*qwen30b(gpus, "verl")).breakdown.dp_comm_s,
                                                    rel=1e-12)


def test_off_adds_exactly_the_hidden_share_to_the_step():
    on = estimate_throughput(*qwen30b(32))
    off = estimate_throughput(*qwen30b(32, grad_reduce_overlap=False))
    assert on.breakdown.dp_comm_s < off.breakdown.dp_comm_s
    # nothing but the once-per-step sync changes: the step grows by exactly what the overlap had hidden
    assert off.step_time_s - on.step_time_s == pytest.approx(off.breakdown.dp_comm_s - on.breakdown.dp_comm_s,
                                                             rel=1e-9)
    dp = next(a for a in off.assumptions if a.startswith("DP:"))
    assert "reduce-scattered with 0% of the last backward hiding it" in dp and "0% of the next forward" in dp


def test_verl_is_unchanged_by_the_switch():
    """verl's calibration already hides nothing: the switch cannot expose more."""
    on = estimate_throughput(*qwen30b(32, "verl"))
    off = estimate_throughput(*qwen30b(32, "verl", grad_reduce_overlap=False))
    assert on.step_time_s == off.step_time_s
