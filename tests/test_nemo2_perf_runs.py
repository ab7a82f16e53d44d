"""The distributed optimizer's parameter all-gather in fp8 (fp8_param_gather)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.comm import links
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.perf import dp_traffic, estimate_throughput, step_sync
from meshplan.estimate.sharding_traffic import optimizer_gather_bytes
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _zero1(gather: bool | None, precision: str = "fp8"):
    # 4 data-parallel ranks, one per node of 8 (tp 8): the parameter all-gather crosses the network
    return resolve(Request(model="llama-3-70b", gpu="b200", num_gpus=32, gpus_per_node=8, framework="megatron-core",
                           tp=8, pp=1, zero_stage=1, precision=precision, fp8_param_gather=gather,
                           seq_length=8192, micro_batch_size=1, global_batch_size=32))


def test_fp8_primary_weights_gather_their_linear_weights_in_one_byte():
    """Megatron-Core's distributed optimizer keeps fp8 parameters in a uint8 buffer and all-gathers them so: the
    decoder's weights at 1 B, the embedding and output layer (`edge`, no Transformer Engine modules) at bf16's 2."""
    job, plan = _zero1(True)
    dense, edge = 1.0e9, 0.25e9
    assert optimizer_gather_bytes(job, plan, dense, 0.0, edge) == (dense - edge + BF16 * edge, 0.0)
    off_job, off_plan = _zero1(False)
    assert optimizer_gather_bytes(off_job, off_plan, dense, 0.0, edge) == (BF16 * dense, 0.0)
    bf16_job, bf16_plan = _zero1(None, precision="bf16")
    assert optimizer_gather_bytes(bf16_job, bf16_plan, dense, 0.0, edge) == (BF16 * dense, 0.0)


def test_the_step_s_parameter_gather_shrinks_with_fp8_param_gather():
    """The ZeRO-1 step's all-gather after the optimizer moves the fp8 bytes (was bf16 whatever fp8_param_gather
    said), so the exposed DP time of an fp8 run with fp8 primary weights is lower; the gradient reduction is not."""
    job, on = _zero1(True)
    _, off = _zero1(False)
    cal = calibration("megatron-core")
    lk = links(job.gpu, job.gpus_per_node, cal)
    traffic = dp_traffic(on, lk, mesh_groups(on, law=job.card.world_size_law), cal)
    dense = 1.0e9
    sync_on = step_sync(job, on, cal, lk, traffic, dense, 0.0, False)
    sync_off = step_sync(job, off, cal, lk, traffic, dense, 0.0, False)
    assert sync_on.reduce == sync_off.reduce
    assert 0 < sync_on.gather < sync_off.gather
    assert sync_on.gather == pytest.approx(traffic(dense, 0.0, 1.0))  # no edge given: every weight in fp8, a floor
    assert estimate_throughput(job, on).breakdown.dp_comm_s < estimate_throughput(job, off).breakdown.dp_comm_s
