"""FSDP2 under pipeline parallelism (torchtitan, KempnerForge): torch.distributed.pipelining's PipelineStage turns
resharding and gradient sync off for every micro-batch's backward (stage.py backward_maybe_with_nosync) and reduces
only in the schedule's post-backward, so each unit of a stage stays gathered (bf16, 2 B per parameter) and holds its
unsharded gradient in reduce_dtype (fp32, 4 B) to the end of the step (the cards' grad_accumulation `pipeline`,
memory_states.pipeline_held, fsdp_walk.pipeline_moments)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import accumulated_grad_bytes, convention, pipeline_held
from meshplan.estimate.fsdp_walk import Accumulation, FsdpUnit, fsdp_backward_moments
from meshplan.knowledge.cards import framework_card
from meshplan.schema.request import Request

HELD = "unsharded_accumulated_gradients"
PP2 = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, seq_length=8192, global_batch_size=32, micro_batch_size=1,
           tp=1, pp=2, dp=4, recompute="full")


def _stages(framework: str = "torchtitan", **kw):
    return api.estimate_memory(Request(framework=framework, **{**PP2, **kw})).stages


def test_cards_say_which_frameworks_hold_under_a_pipeline():
    """torchtitan reduces every micro-batch without PP but holds under PP; KempnerForge holds in both; frameworks
    whose pipeline is not torch's PipelineStage over FSDP2 hold nothing."""
    titan, kf = framework_card("torchtitan"), framework_card("kempnerforge")
    assert pipeline_held(titan, 2) and pipeline_held(kf, 4)
    assert not pipeline_held(titan, 1) and not pipeline_held(framework_card("megatron-core"), 4)
    assert accumulated_grad_bytes(titan, 4, True, 2) == 4 and accumulated_grad_bytes(titan, 4, True, 1) == 0
    assert accumulated_grad_bytes(kf, 1, True, 4) == 4  # the stage holds with one micro-batch too
    assert accumulated_grad_bytes(titan, 4, False, 2) == 0  # replicated: the gradient itself is the unsharded one
    assert titan.grad_accumulation.gathered_through_forward and not kf.grad_accumulation.gathered_through_forward


UNITS = [FsdpUnit("emb", 10.0, 5.0, grads=1.0), FsdpUnit("l0", 20.0, 5.0, 7.0, grads=2.0),
         FsdpUnit("out", 30.0, 50.0, grads=3.0, loss=True)]


def _walk(framework: str, cooldown: float | None = None, version: str | None = None):
    card = framework_card(framework)
    conv = convention(card, 3, version)[1]
    acc = Accumulation(accumulated_grad_bytes(card, 4, True, 2), 4, pipeline=True,
                       through_forward=card.grad_accumulation.gathered_through_forward, cooldown_other=cooldown)
    return conv, {s.name: s for s in fsdp_backward_moments(conv, UNITS, 100.0, True, acc)}


def test_gathered_through_forward_holds_every_unit_at_every_moment():
    """torchtitan 0.2 (no reshard after forward under PP, the fsdp2 preset): every backward moment holds the stage's
    60 parameters gathered (2 B) and their fp32 gradients (4 B); no unit reduce-scatters in a micro-batch, no sharded
    gradient exists yet (set to None, written by the post-backward)."""
    conv, m = _walk("torchtitan", version="0.2.2")
    assert conv.unsharded_param_bytes == 2
    assert m["l0 backward (a middle micro-batch)"].transient == 2 * 60.0
    assert m["l0 backward (a middle micro-batch)"].activations == 100.0 + 5.0 + 5.0 + 7.0
    assert m["l0 accumulate (a middle micro-batch)"].transient == 2 * 60.0 + 2 * 20.0  # its bf16 gradient, added in
    assert m["out backward (a middle micro-batch)"].transient == 2 * 60.0  # the loss: every unit already gathered
    assert all(s.accumulated == 4 * 60.0 and s.absent_grads == 6.0 for k, s in m.items() if "micro-batch" in k)
    assert not any("reduce-scatter (a middle" in k or "after a backward" in k for k in m)


def test_resharding_forward_holds_the_passed_units_and_all_after_a_backward():
    """KempnerForge reshards after each forward (apply_fsdp2's default): a backward right after a forward holds the
    units it has passed (plus the one it prefetches); one right after another backward holds them all, beside one
    micro-batch fewer of the others' activations."""
    conv, m = _walk("kempnerforge", cooldown=60.0)
    b, pre = conv.unsharded_param_bytes, conv.prefetched_bytes
    assert m["out backward (a middle micro-batch)"].transient == b * 30.0  # the loss: only its own unit
    assert m["l0 backward (a middle micro-batch)"].transient == b * (20.0 + 30.0) + pre * 10.0
    assert m["emb backward (a middle micro-batch)"].transient == b * 60.0
    after = m["out backward (a middle micro-batch, after a backward)"]
    assert after.transient == b * 60.0 and after.activations == 60.0 + 5.0 + 5.0 + 50.0
    _, one = _walk("kempnerforge", cooldown=None)
    assert not any("after a backward" in k for k in one)


def test_resharded_loss_unit_gathered_again_holds_its_all_gather_output():
    """KempnerForge's loss unit, resharded after its forward, is gathered again for the head's backward: its copy-out
    holds the all-gather output (prefetched_bytes) beside its unsharded parameters, with what the loss leaves alive
    (`head`: 20 of its 50) and nothing prefetched yet; listed only where a head figure is given, and not where the
    units stay gathered through the forward (torchtitan 0.2)."""
    units = [*UNITS[:2], UNITS[2]._replace(head=20.0)]
    card = framework_card("kempnerforge")
    conv = convention(card, 3, None)[1]
    acc = Accumulation(accumulated_grad_bytes(card, 4, True, 2), 4, pipeline=True, through_forward=False)
    m = {s.name: s for s in fsdp_backward_moments(conv, units, 100.0, True, acc)}
    again = m["out gathered again (a middle micro-batch)"]
    assert again.activations == 100.0 + 5.0 + 5.0 + 20.0
    assert again.transient == (conv.unsharded_param_bytes + conv.prefetched_bytes) * 30.0
    assert again.accumulated == 4 * 60.0 and again.absent_grads == 6.0
    _, plain = _walk("kempnerforge")
    assert not any("gathered again" in k for k in plain)
    titan = convention(framework_card("torchtitan"), 3, "0.2.2")[1]
    held = acc._replace(through_forward=True)
    assert not any("gathered again" in s.name for s in fsdp_backward_moments(titan, units, 100.0, True, held))


def test_post_backward_reduces_unit_by_unit_with_nothing_else_alive():
    """The schedule's post-backward, in forward order: the unit reshards, copies its fp32 gradient into the
    reduce-scatter input; the units after it still gathered with their gradients."""
    conv, m = _walk("kempnerforge")
    b = conv.unsharded_param_bytes
    first = m["emb reduce-scatter (the schedule's post-backward)"]
    assert first.activations == 0.0
    assert first.transient == b * 50.0 + 4 * 10.0
    assert first.accumulated == 4 * 60.0 and first.absent_grads == 6.0
    second = m["l0 reduce-scatter (the schedule's post-backward)"]
    assert second.transient == b * 30.0 + 4 * 20.0 + conv.retained_reduce_bytes * 10.0
    assert second.accumulated == 4 * 50.0 and second.absent_grads == 5.0


def test_torchtitan_pp2_stage_holds_its_parameters_gathered_and_in_fp32():
    """torchtitan 0.2 (the fsdp2 preset), PP2: each stage holds 4 B of unsharded gradient per parameter of the stage,
    and at least 2 B gathered at its peak moment."""
    for stage in _stages(framework_version="0.2.2"):
        params = stage.detail["params_on_gpu"]
        assert stage.detail[HELD] == pytest.approx(4 * params, rel=1e-6)
        assert stage.detail["gathered_layers"] >= 2 * params


def test_torchtitan_chunked_loss_output_unit_reduces_every_micro_batch():
    """torchtitan 0.3's ChunkedLossWrapper turns the lm_head unit's sync on at its last chunk: the last stage holds
    the gradients of its other units only."""
    last = _stages()[-1]
    head = last.detail["output_layer_params"]
    assert last.detail[HELD] < 4 * last.detail["params_on_gpu"]
    assert last.detail[HELD] >= 4 * (last.detail["params_on_gpu"] - head) - 1e-3 * head


def test_pp1_unchanged():
    """Without a pipeline torchtitan holds nothing (it reduce-scatters each micro-batch)."""
    assert all(HELD not in s.detail for s in _stages(pp=1, dp=8))


def test_kempnerforge_pp4_peak_counts_the_gathered_stage():
    """KempnerForge's validation row 70b_32gpu_tp4_pp4 (51.0 GiB allocated, measured): stage 0 at its peak holds its
    5.33e9 parameters gathered (2 B) beside their fp32 gradients (4 B)."""
    report = api.estimate_memory(Request(model="llama-3-70b", gpu="h200", num_gpus=32, gpus_per_node=4,
                                         seq_length=4096, global_batch_size=8, micro_batch_size=1,
                                         framework="kempnerforge", tp=4, pp=4, dp=2, recompute="full"))
    first = report.stages[0]
    params = first.detail["params_on_gpu"]
    assert first.detail[HELD] == pytest.approx(4 * params, rel=1e-6)
    assert first.detail["gathered_layers"] >= 2 * params


def test_automodel_pp2_holds_as_torchtitan_does():
    """NeMo AutoModel runs FSDP2 under torch's PipelineStage too (pipelining/functional.py), its layers not resharded
    after forward under PP (parallelizer.py): each stage holds 4 B of unsharded fp32 gradient per parameter and its
    units gathered, as torchtitan 0.2's (neither chunks its loss); without PP its defer_fsdp_grad_sync decides
    (tests/test_automodel_defer_grad_sync.py): off, nothing is held."""
    card = framework_card("nemo-automodel")
    assert pipeline_held(card, 2) and card.grad_accumulation.gathered_through_forward
    for stage in _stages("nemo-automodel"):
        params = stage.detail["params_on_gpu"]
        assert stage.detail[HELD] == pytest.approx(4 * params, rel=1e-6)
        assert stage.detail["gathered_layers"] >= 2 * params
    assert all(HELD not in s.detail for s in _stages("nemo-automodel", pp=1, dp=8, defer_fsdp_grad_sync=False))

