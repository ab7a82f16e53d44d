"""KempnerForge's EP ranks are no data-parallel ranks (kempnerforge/distributed/utils.py get_dp_info counts
dp_replicate x dp_shard only), so ep=8 on 16 GPUs trains each replica's share of the step on 8 GPUs at once. The
memory and throughput reports and check warn it with its cost, in render's words (arithmetic/mesh.py
own_ep_ranks_note, one home). Before: only render's note said so, without the cost; throughput printed 427 s a
step, 1.4% MFU, unexplained."""

from __future__ import annotations

from meshplan import api
from meshplan.schema.request import Request

KF_EP8 = dict(model="qwen3-30b-a3b", framework="kempnerforge", num_gpus=16, gpu="h100", ep=8, recompute="full")


def _warned(lines: list[str]) -> list[str]:
    return [w for w in lines if "ranks of its own, not data-parallel" in w]


def test_every_report_warns_kempnerforges_ep_ranks_with_their_cost():
    req = Request(**KF_EP8)
    throughput = api.estimate_throughput(req)
    [said] = _warned(throughput.warnings)
    assert "512 of the step's 1,024 sequences" in said and "64 (data-parallel 16)" in said and "8x less" in said
    assert _warned(api.estimate_memory(req).warnings) == [said]
    assert _warned(api.check_config(req).next_steps) == [said]
    assert said in api.render_config("kempnerforge", req, force=True).notes


def test_no_warning_where_ep_folds_into_the_data_ranks():
    for req in (Request(**{**KF_EP8, "ep": 1}), Request(**{**KF_EP8, "framework": "torchtitan"})):
        assert not _warned(api.estimate_throughput(req).warnings + api.estimate_memory(req).warnings)
