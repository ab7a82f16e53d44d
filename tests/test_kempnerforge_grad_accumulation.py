"""KempnerForge turns FSDP2's gradient sync off for every micro-batch of a step but the last (scripts/train.py
maybe_no_sync; cards/frameworks/kempnerforge.yaml grad_accumulation), so each FSDP unit keeps its unsharded gradient,
accumulated in fp32, until the last micro-batch's reduce-scatter: the rank's whole parameters (TP shard, local
experts whole) x 4 bytes, counted in FSDP2's backward walk (estimate/fsdp_walk.py accumulated_moments)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import accumulated_grad_bytes, convention
from meshplan.estimate.fsdp_walk import Accumulation, FsdpUnit, fsdp_backward_moments
from meshplan.estimate.memory import estimate_memory
from meshplan.estimate.sharding_traffic import sharding_schedule
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

DENSE = dict(model="mistral-7b", num_gpus=8, gpu="h100", tp=1, pp=1, micro_batch_size=1, seq_length=4096,
             zero_stage=3, recompute="full")
HELD = "unsharded_accumulated_gradients"


def _peak(framework: str = "kempnerforge", **kw):
    report = api.estimate_memory(Request(framework=framework, **{**DENSE, **kw}))
    return max(report.stages, key=lambda s: s.total_bytes)


def test_two_micro_batches_hold_every_parameter_in_fp32():
    """Two micro-batches per step (global batch 32 over 8 data ranks at micro-batch 2, where the last micro-batch's
    loss is the step's peak): there every unit still holds its fp32 accumulated gradient, the model's parameters x 4
    bytes."""
    params = api.describe_model("mistral-7b").total_params
    held = _peak(global_batch_size=32, micro_batch_size=2)
    assert held.detail[HELD] == pytest.approx(4 * params, rel=1e-6)
    assert held.gradients_bytes >= held.detail[HELD]


def test_one_micro_batch_holds_none():
    """With one micro-batch maybe_no_sync never turns the sync off: no unsharded gradient is held."""
    one = _peak(global_batch_size=8)
    assert HELD not in one.detail
    two = _peak(global_batch_size=16)
    assert two.total_bytes - one.total_bytes > 3 * api.describe_model("mistral-7b").total_params


def test_other_frameworks_reduce_every_micro_batch():
    """torchtitan reduce-scatters in every micro-batch's backward without PP (trainer.py train_step): nothing held
    (under PP torch's pipeline stage holds them: tests/test_fsdp_pipeline_hold.py)."""
    assert HELD not in _peak("torchtitan", global_batch_size=16).detail
    assert not framework_card("torchtitan").grad_accumulation.unsharded


def test_memory_and_time_read_one_schedule():
    """The card's grad_accumulation is the one home of when the gradients are reduced: a card that holds unsharded
    gradients (the memory) reduce-scatters once per step in the time model too (sharding_schedule)."""
    for name in ("kempnerforge", "torchtitan", "verl", "nemo-automodel"):
        job, plan = resolve(Request(framework=name, **{**DENSE, "global_batch_size": 16}))  # 2 micro-batches
        held = accumulated_grad_bytes(job.card, 2, True, plan.pp) > 0
        assert sharding_schedule(job, plan).reduce_each_microbatch is not held


def test_accumulated_bytes_per_parameter():
    card = framework_card("kempnerforge")
    assert accumulated_grad_bytes(card, 2, True) == 4
    assert accumulated_grad_bytes(card, 1, True) == 0
    assert accumulated_grad_bytes(card, 4, False) == 0  # replicated: the gradient itself is the unsharded one


def _walk(m: int):
    card = framework_card("kempnerforge")
    units = [FsdpUnit("a", 10.0, 5.0, grads=1.0), FsdpUnit("b", 20.0, 5.0, grads=2.0),
             FsdpUnit("out", 30.0, 50.0, grads=3.0, loss=True)]
    return fsdp_backward_moments(convention(card, 3)[1], units, 0.0, True,
                                 Accumulation(accumulated_grad_bytes(card, m, True), m))


def test_walk_holds_what_each_micro_batch_holds():
    """Three or more micro-batches: a middle one holds every unit's gradient at every moment, no sharded gradient
    yet. Two: the first holds the units backward has passed, the last those it has not reduced yet; the output unit is
    KempnerForge's root, reduced at the end of the backward, so the first holds its gradient only from there on and
    the last until then."""
    middle = _walk(3)
    assert {s.accumulated for s in middle} == {4 * 60.0} and {s.absent_grads for s in middle} == {6.0}
    two = {s.name: s for s in _walk(2)}
    assert two["out backward (last micro-batch)"].accumulated == 4 * 60.0
    assert two["a reduce-scatter (last micro-batch)"].accumulated == 4 * (10.0 + 30.0)
    assert two["out reduce-scatter (end of backward) (last micro-batch)"].accumulated == 4 * 30.0
    assert two["a reduce-scatter (first micro-batch)"].accumulated == 4 * 20.0
    assert two["out reduce-scatter (end of backward) (first micro-batch)"].accumulated == 4 * (10.0 + 20.0)
    assert two["out backward (first micro-batch)"].accumulated == 0.0


DSV3 = dict(framework="kempnerforge", model="deepseek-v3", num_gpus=1024, gpu="h100", global_batch_size=1024)


def test_deepseek_v3_ep4_holds_its_local_experts_whole():
    """The pick before this term (TP1 EP4 DP256, micro-batch 2, full recompute: two micro-batches) holds the rank's
    dense parameters and its 64 local experts whole, 4 bytes each (about 670 GiB): far over an H100."""
    report = api.estimate_memory(Request(**DSV3, tp=1, pp=1, ep=4, micro_batch_size=2, recompute="full"))
    d = api.describe_model("deepseek-v3")
    routed = next(c.params for c in d.components if c.name == "routed_experts")
    stage = report.stages[0]
    assert stage.detail[HELD] == pytest.approx(4 * (d.total_params - routed + routed / 4), rel=1e-6)
    assert not report.fits


def test_deepseek_v3_recommend_ranks_no_layout_holding_them_over_the_gpu():
    """recommend ranked TP1 EP4 DP256 micro-batch 2 (53.8 GiB) first before the held gradients were counted; with
    them every layout it ranks fits (at 1,024 H100 and global batch 1,024 none does)."""
    rec = api.recommend(Request(**DSV3), top_k=3)
    assert all(c.memory.peak_bytes <= c.memory.capacity_bytes for c in rec.candidates)
    assert not any(c.plan.tp == 1 and c.plan.ep == 4 and c.plan.micro_batch_size == 2 for c in rec.candidates)


def _without_mtp(job):
    """The job with its model trained at MTP depth 0 (KempnerForge builds no MTP block), whatever the default."""
    return job.model_copy(update={"model": job.model.model_copy(update={"num_mtp_layers": 0,
                                                                        "mtp_repeated_layer": False})})


def test_deepseek_v3_at_depth_0_still_holds_every_parameter():
    """Trained without its MTP block no MTP activations sit beside the loss, so the walk peaks in the last decoder
    layer's backward of the last micro-batch. KempnerForge's apply_fsdp2 wraps only the blocks and then the whole
    model (fully_shard(model): the embedding, final norm and output head), whose input, the token ids, needs no
    gradient: that root unit reduce-scatters after the whole backward, so its accumulated gradient is still held
    there and the stage holds every parameter, as the test above asks at the checkpoint's depth."""
    job, plan = resolve(Request(**DSV3, tp=1, pp=1, ep=4, micro_batch_size=2, recompute="full"))
    stage = estimate_memory(_without_mtp(job), plan).stages[0]
    assert "mtp_params" not in stage.detail
    assert stage.detail[HELD] == pytest.approx(4 * stage.detail["params_on_gpu"], rel=1e-9)


def test_the_root_unit_reduces_after_the_whole_backward():
    """KempnerForge's root unit (embedding, final norm, output head; the walk's output unit) reduce-scatters in the
    end-of-backward callback: in the last of two micro-batches every moment before it still holds the root's
    accumulated gradient. With one micro-batch it holds its gathered parameters (2 B) through the decoder's backward
    and the unsharded gradients (2 B) of its head and norm, not yet the embedding's (`grads_last`), which the
    embedding's backward, the graph's last, writes."""
    card = framework_card("kempnerforge")
    conv = convention(card, 3)[1]
    units = [FsdpUnit("a", 10.0, 5.0, grads=1.0), FsdpUnit("root", 30.0, 50.0, grads=3.0, loss=True, grads_last=20.0)]
    two = fsdp_backward_moments(conv, units, 0.0, True, Accumulation(accumulated_grad_bytes(card, 2, True), 2))
    last = {s.name: s.accumulated for s in two if "(last micro-batch)" in s.name}
    assert last.pop("root reduce-scatter (end of backward) (last micro-batch)") == 4 * 30.0
    assert set(last.values()) == {4 * 40.0}
    one = {s.name: s for s in fsdp_backward_moments(conv, units, 0.0, True)}
    a = one["a backward"]
    assert a.transient == 2 * 10.0 + 2 * 30.0 + 2 * (30.0 - 20.0)  # a gathered; the root's params and head grads
