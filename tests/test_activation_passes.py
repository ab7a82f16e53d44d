"""The FFN activation's memory-bound work over the routed experts' elements as the expert GEMMs count them."""

from __future__ import annotations

import pytest

from meshplan.estimate.layer_time import elementwise_load
from meshplan.estimate.perf import step_terms
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

QWEN = dict(model="qwen3-30b-a3b", num_gpus=8, seq_length=4096, global_batch_size=64, micro_batch_size=1,
            gpu="gb200", precision="bf16")


def _ctx(framework: str = "megatron-bridge", **fields):
    job, plan = resolve(Request(framework=framework, **(QWEN | fields)))
    return step_terms(job, plan).ctx


def test_the_routed_activation_runs_over_the_whole_expert_width_of_every_copy_under_etp():
    """Each ETP rank runs its group's copies gathered (etp x the rows) at 1/etp of the width, as the expert GEMMs
    count them: the elements do not fall with etp."""
    one = elementwise_load(_ctx(ep=4, tp=2, etp=1), True)
    two = elementwise_load(_ctx(ep=4, tp=2, etp=2), True)
    assert two.routed_ffn == pytest.approx(one.routed_ffn) and one.routed_ffn > 0
