"""The token dispatcher's memory-bound passes under expert tensor parallelism
(estimate/moe_time.dispatch_and_router_bytes): the routed copies are whole hidden vectors at any ETP; Megatron-Core's
alltoall dispatcher gathers the received copies over the expert-TP group before sorting them by expert, so the sort
and unsort half of its passes grows with etp while the permute and unpermute half stays on the rank's own copies.
Before 2026-12-06 the bytes were divided by etp."""

from __future__ import annotations

import pytest

from meshplan.estimate.moe_time import dispatch_and_router_bytes
from meshplan.estimate.perf import step_terms
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

LAYOUT = dict(model="qwen3-30b-a3b", framework="megatron-bridge", gpu="h100", num_gpus=8, ep=4, tp=2,
              seq_length=4096, micro_batch_size=1, global_batch_size=64)


def _bytes(etp: int) -> tuple[float, float]:
    job, plan = resolve(Request(etp=etp, **LAYOUT))
    return dispatch_and_router_bytes(step_terms(job, plan).ctx)


@pytest.mark.parametrize("etp", [2])
def test_the_sort_half_of_the_dispatch_passes_runs_over_the_expert_tp_groups_gathered_copies(etp):
    one_dispatch, one_router = _bytes(1)
    dispatch, router = _bytes(etp)
    assert one_dispatch > 0
    assert dispatch == pytest.approx(one_dispatch * (1 + etp) / 2, rel=1e-12)
    assert router == pytest.approx(one_router, rel=1e-12)  # the router's logits are per token, not per copy
