"""The optimizer step's time reads the passes its implementation makes (cards/memory.yaml optimizer_steps
hbm_bytes_per_param): torch's foreach and per-tensor AdamW (what verl's, SkyRL's and NeMo AutoModel's FSDP engines
build: neither foreach nor fused given, torch picks foreach on CUDA) read and write the fp32 parameters, gradients
and moments in eight passes, 80 B per parameter, where a fused step (torchtitan's, KempnerForge's, Megatron's
FusedAdam) makes one (cards/calibration.yaml optimizer_bytes_per_param). Measured on one H200 (bench/gpu_steps.py),
the verl step was 29-52% too fast before this; 21-38% after."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.memory_states import optimizer_implementation, optimizer_step_bytes
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.model_counts import total_params
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def one_gpu(framework: str):
    return resolve(Request(model="llama-3.1-8b", gpu="h200", num_gpus=1, framework=framework, zero_stage=3,
                           seq_length=4096, global_batch_size=1, micro_batch_size=1, recompute="full"))


@pytest.mark.parametrize(("framework", "implementation", "step_bytes"), [
    ("verl", "foreach", 80.0), ("skyrl", "foreach", 80.0), ("nemo-automodel", "foreach", 80.0),
    ("torchtitan", "fused", None), ("kempnerforge", "fused", None),
])
def test_each_engine_s_step_bytes(framework, implementation, step_bytes):
    job, plan = one_gpu(framework)
    assert optimizer_implementation(job, plan) == implementation
    assert optimizer_step_bytes(job, plan) == step_bytes


def test_a_foreach_step_takes_the_extra_passes_over_every_parameter(monkeypatch):
    """On one GPU every parameter is stepped there: verl's step with torch's foreach AdamW takes (80 - 30) B more per
    parameter at the GPU's HBM bandwidth than the same step read as fused, and nothing else moves."""
    from meshplan.estimate import perf
    job, plan = one_gpu("verl")
    foreach = estimate_throughput(job, plan)
    monkeypatch.setattr(perf, "optimizer_step_bytes", lambda job, plan: None)  # as a fused step is timed
    fused = estimate_throughput(job, plan)
    cal = calibration("verl")
    extra = (80.0 - cal.optimizer_bytes_per_param) * total_params(job.model) / (job.gpu.hbm_bandwidth
                                                                                * cal.hbm_efficiency)
    assert foreach.breakdown.other_s - fused.breakdown.other_s == pytest.approx(extra, rel=1e-9)
    assert foreach.step_time_s - fused.step_time_s == pytest.approx(extra, rel=1e-9)
    assert foreach.breakdown.compute_s == fused.breakdown.compute_s
