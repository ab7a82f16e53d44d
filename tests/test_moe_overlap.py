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


def test_the_all_to_all_holds_nccls_p2p_channels_or_its_flex_backends_sms():
    """alltoall_sm_share: NCCL's p2p channels are the communicator's channels rounded up to a power of two
    (ncclTopoComputeP2pChannels), the flex dispatcher's its backend's SMs (cards/calibration.yaml flex_dispatch sms)."""
    from meshplan.arithmetic.comm import alltoall_sm_share, links
    from meshplan.knowledge.calibration import calibration
    from meshplan.knowledge.hardware import get_gpu

    def lk(gpu: str, backend: str | None = None):
        part = get_gpu(gpu)
        return links(part, part.gpus_per_node, calibration("megatron-core"), backend=backend)

    h100, b200 = lk("h100"), lk("b200")
    assert alltoall_sm_share(8, 1, h100) == pytest.approx(32 / 132)  # 24 ring channels in a node -> 32
    assert alltoall_sm_share(32, 1, h100) == pytest.approx(16 / 132)  # across nodes: 16, a power of two already
    assert alltoall_sm_share(8, 1, b200) == pytest.approx(32 / 148)
    assert alltoall_sm_share(8, 1, lk("h100", "deepep"), flex=True) == pytest.approx(20 / 132)
    assert alltoall_sm_share(8, 1, lk("gb200", "hybridep"), flex=True) == pytest.approx(32 / 148)
    assert alltoall_sm_share(1, 1, h100) == 0.0 and alltoall_sm_share(1, 1, h100, flex=True) == 0.0


def test_hidden_all_to_all_slows_the_compute_beside_it():
    """With `share` of the SMs held, a direction whose all-to-all the other chunk hides costs share x its seconds
    (comm.beside_compute), one it does not hide its part beyond the window; never more than the plain all-to-all."""
    one, share = 1.0, 0.25
    assert overlapped_a2a(one, 5.0, 5.0, steady=1.0, share=share) == pytest.approx(2 * share * 2.0)
    assert overlapped_a2a(one, 0.5, 1.0, steady=1.0, share=share) == pytest.approx(1.0 + 1.5)  # beyond > slowed
    for fwd, bwd in ((0.1, 0.2), (1.0, 3.0), (9.0, 9.0)):
        assert overlapped_a2a(one, fwd, bwd, 1.0, share) <= EP_ALL_TO_ALLS_PER_LAYER * one
        assert overlapped_a2a(one, fwd, bwd, 1.0, share) >= overlapped_a2a(one, fwd, bwd, 1.0)


def test_the_overlap_gains_less_than_the_all_to_all_it_hides():
    """Qwen3-30B-A3B at EP8 inside one H100 node, 32 micro-batches: the first forward's all-to-all exposed, every
    steady one hidden, and the step still pays the compute slowed by NCCL's 32 CTAs of 132 SMs beside them."""
    fields = dict(Q30, ep=8, num_gpus=8, micro_batch_size=4)
    off, on = (estimate_throughput(Request(**fields, moe_a2a_overlap=v)) for v in (False, True))
    steady = 31 / 32
    assert on.breakdown.ep_comm_s == pytest.approx(off.breakdown.ep_comm_s * ((1 - steady) + steady * 32 / 132),
                                                   rel=1e-3)
