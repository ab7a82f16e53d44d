"""moe_a2a_overlap (issue 15 item 1): the knob's preconditions (EP009), its render / parse round trip, and the
exposed all-to-all it leaves in the step time."""

from __future__ import annotations

import pytest

from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.api import check_config, estimate_throughput
from meshplan.core.errors import MeshplanError
from meshplan.estimate.moe_time import EP_ALL_TO_ALLS_PER_LAYER, a2a_steady_share, overlapped_a2a
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

Q30 = dict(model="qwen3-30b-a3b", num_gpus=16, seq_length=4096, global_batch_size=1024, framework="megatron-bridge")


def ep009(**fields) -> list[str]:
    report = check_config(Request(**{**Q30, **fields}))
    return [f.message for f in report.findings if f.id == "EP009"]


@pytest.mark.parametrize("fields,words", [
    (dict(ep=1, pp=2, vpp=2), "ep=1"),
    (dict(ep=8, pp=2), "without virtual pipeline stages"),
    (dict(ep=8, recompute="full"), "full recompute"),
    (dict(ep=8, recompute="selective", recompute_modules=["moe"]), "'moe' in recompute_modules"),
    (dict(ep=8, framework="torchtitan"), "torchtitan has no schedule"),
    (dict(model="llama-3.1-8b", ep=1), "has no experts"),
])
def test_each_precondition_fails_with_its_reason(fields, words):
    messages = ep009(moe_a2a_overlap=True, **fields)
    assert len(messages) == 1 and words in messages[0], messages


@pytest.mark.parametrize("fields", [dict(ep=16), dict(ep=8, pp=2, vpp=2), dict(ep=8, recompute="selective",
                                                                             recompute_modules=["moe_act"])])
def test_the_preconditions_hold(fields):
    assert ep009(moe_a2a_overlap=True, **fields) == []
    assert ep009(**fields) == []  # off: nothing to check


@pytest.mark.parametrize("framework,variant", [("megatron-core", None), ("megatron-bridge", None),
                                               ("megatron-bridge", "run_recipe")])
def test_round_trip(framework, variant):
    job, plan = resolve(Request(**{**Q30, "framework": framework, "ep": 8, "pp": 2, "vpp": 2,
                                   "moe_a2a_overlap": True}))
    assert plan.moe_a2a_overlap
    result = render(framework, job, plan, variant=variant)
    assert parse_plan(framework, result.variant, result.text, job.model.num_layers)["moe_a2a_overlap"] is True
    text = result.text
    assert ("delay-wgrad-compute" in text) if framework == "megatron-core" else ("delay_wgrad_compute" in text)
    off = render(framework, *resolve(Request(**{**Q30, "framework": framework, "ep": 8})), variant=variant)
    assert "moe_a2a_overlap" not in parse_plan(framework, off.variant, off.text, job.model.num_layers)


def test_frameworks_without_it_refuse_to_render():
    job, plan = resolve(Request(**{**Q30, "framework": "verl", "ep": 8, "moe_a2a_overlap": True}))
    with pytest.raises(MeshplanError, match="moe_a2a_overlap"):
        render("verl", job, plan)


def test_steady_share_counts_megatron_warmup():
    assert a2a_steady_share(64, 1, 1) == 63 / 64  # the first forward runs alone
    assert a2a_steady_share(32, 4, 2) == (64 - (3 * 2 + 1 * 4)) / 64  # interleaved: (pp-1)*2 + (vpp-1)*pp
    assert a2a_steady_share(2, 8, 2) == 0.0  # all warm-up


def test_overlap_hides_up_to_the_other_directions_compute():
    one = 1.0
    assert overlapped_a2a(one, fwd_compute=5.0, bwd_compute=5.0, steady=1.0) == 0.0  # all hidden
    assert overlapped_a2a(one, fwd_compute=0.5, bwd_compute=1.0, steady=1.0) == 1.0 + 1.5  # 2-1 and 2-0.5 exposed
    assert overlapped_a2a(one, 0.5, 1.0, steady=0.5) == 0.5 * 2.5 + 0.5 * EP_ALL_TO_ALLS_PER_LAYER


def test_overlap_shortens_the_step_only_where_there_is_an_all_to_all():
    fields = dict(Q30, ep=16)
    off, on = (estimate_throughput(Request(**fields, moe_a2a_overlap=v)) for v in (False, True))
    assert on.breakdown.ep_comm_s < off.breakdown.ep_comm_s
    assert on.breakdown.compute_s == off.breakdown.compute_s
