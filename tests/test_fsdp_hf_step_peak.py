"""verl's and SkyRL's FSDP2 step (cards/memory.yaml fsdp2_hf): the root unit [norm, lm_head] is resharded after its
forward and reduced only at the end of the backward (fsdp_walk.fsdp_backward_moments output_resharded_at_loss,
output_held_bytes), and the loss keeps 8 B per logit; by hand, and through estimate_memory."""

from __future__ import annotations

from meshplan.arithmetic.memory_states import memory_card
from meshplan.estimate.fsdp_walk import FsdpUnit, fsdp_backward_moments, fsdp_step_peak
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request


def conv(**update):
    """fsdp2_hf's walk with round byte counts (as tests/test_fsdp_step_peak.py) and the root held 4 B per param."""
    base = {"step_peak": "backward_walk", "unsharded_param_bytes": 2, "gathered_layers": 1, "gathered_bytes": 6,
            "prefetched_bytes": 2, "retained_reduce_bytes": 4, "output_reduce_in_loss": False,
            "output_resharded_at_loss": True, "output_held_bytes": 4}
    return memory_card().conventions["fsdp2_hf"].model_copy(update=base | update)


UNITS = [FsdpUnit("embedding", 10, 1, grads=1), FsdpUnit("layer 0", 20, 100, grads=2),
         FsdpUnit("layer 1", 1000, 300, grads=100), FsdpUnit("output", 5, 40, grads=0.5, loss=True)]


def test_every_moment_by_hand():
    got = {m.name: (m.activations, m.transient, m.absent_grads) for m in fsdp_backward_moments(conv(), UNITS, 0, True)}
    held = 4 * 5  # the root's bf16 params and grads, from its backward to the end
    assert got == {
        # resharded after the forward: nothing gathered at the loss; every grad absent
        "output backward": (1 + 100 + 300 + 40, 0, 103.5),
        # no reduce-scatter of the root here, so nothing retained into layer 1; each unit's pre_backward copy-out
        # (its all-gather output beside its unsharded params, 2 + 2) before it prefetches the unit before it
        "layer 1 gathered": (401, 4 * 1000 + held, 103.5),
        "layer 1 backward": (401, 2 * 1000 + 2 * 20 + held, 103.5),
        "layer 1 gradients": (101, 4 * 1000 + 2 * 20 + held, 103.5),
        "layer 1 reduce-scatter": (101, 6 * 1000 + 2 * 20 + held, 103.5),
        "layer 0 gathered": (101, 4 * 20 + 4 * 1000 + held, 3.5),
        "layer 0 backward": (101, 2 * 20 + 2 * 10 + 4 * 1000 + held, 3.5),
        "layer 0 gradients": (1, 4 * 20 + 2 * 10 + 4 * 1000 + held, 3.5),
        "layer 0 reduce-scatter": (1, 6 * 20 + 2 * 10 + held, 3.5),
        "embedding gathered": (1, 4 * 10 + 4 * 20 + held, 1.5),
        "embedding backward": (1, 2 * 10 + 4 * 20 + held, 1.5),
        "embedding gradients": (0, 4 * 10 + 4 * 20 + held, 1.5),
        "embedding reduce-scatter": (0, 6 * 10 + held, 1.5),
        # the end-of-backward callback: the root's grads into their fp32 input, the embedding's input still held
        "output reduce-scatter (end of backward)": (0, 6 * 5 + 4 * 10, 0.5),
    }


def test_without_the_fields_the_root_is_walked_as_torchtitans_output_unit():
    plain = {m.name: m.transient for m in fsdp_backward_moments(
        conv(output_resharded_at_loss=False, output_held_bytes=0), UNITS, 0, False)}
    assert plain["output backward"] == 2 * 5
    assert plain["layer 1 backward"] == 2 * 1000 + 2 * 20 + 4 * 5
    assert "output reduce-scatter" in plain and "output reduce-scatter (end of backward)" not in plain


def test_held_root_decides_when_it_is_large():
    """A root of 2,000 params held at 4 B lifts layer 1's reduce-scatter past the loss: 101 + 6,040 + 8,000."""
    units = [*UNITS[:3], FsdpUnit("output", 2000, 40, grads=250, loss=True)]
    peak = fsdp_step_peak(conv(), units, 0, grads_absent=False, reserve_fraction=0.0)
    assert (peak.name, peak.activations, peak.transient) == ("layer 1 reduce-scatter", 101, 6040 + 8000)


def test_verl_step_walks_with_8_bytes_per_logit():
    card = memory_card().conventions["fsdp2_hf"]
    assert (card.step_peak, card.logits_bytes_per_element, card.output_held_bytes) == ("backward_walk", 8, 4)
    assert card.grads_set_to_none and card.output_resharded_at_loss
    arch = resolve(Request(model="llama-3.1-8b", framework="verl"))[0].model
    job = carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=8, gpus_per_node=8, seq_length=8192,
                          global_batch_size=8, framework="verl"))
    stage = estimate_memory(job, Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="full")).stages[0]
    tokens, hidden, vocab = 8192, arch.hidden_size, arch.vocab_size
    assert stage.detail["logits_and_loss"] == int(8 * tokens * vocab + 8 * tokens * hidden)
    # one micro-batch, set to None: at the loss every sharded gradient is still absent (and reserved)
    assert stage.detail["gradients_absent_at_peak"] == stage.detail["freed_gradients_reserved"] > 0


def test_root_gathered_again_for_the_heads_backward_by_hand():
    """head_moments: after the loss's peak the root's pre_backward gathers it again, with 10 of the loss alive (the
    logits' gradient and what the loss still holds): its all-gather output beside its copy-out (2 + 2 B per param),
    then the head's matmul with layer 1 prefetched and the head's weight gradient written (root_held, 2 + 2 B)."""
    units = [*UNITS[:3], FsdpUnit("output", 5, 40, grads=0.5, loss=True, head=10)]
    got = {m.name: (m.activations, m.transient, m.absent_grads) for m in fsdp_backward_moments(conv(), units, 0, True)}
    assert got["output gathered again"] == (401 + 10, (2 + 2) * 5, 103.5)
    assert got["output head backward"] == (401 + 10, 4 * 5 + 2 * 1000, 103.5)
    # the other moments are the walk's without them; a unit with nothing said of its head (head 0) lists neither
    plain = {m.name: (m.activations, m.transient, m.absent_grads)
             for m in fsdp_backward_moments(conv(), UNITS, 0, True)}
    assert {k: v for k, v in got.items() if k not in ("output gathered again", "output head backward")} == plain
    # a root that holds the embedding (KempnerForge's) has no embedding gradient yet at its head's backward
    kf = [*UNITS[1:3], FsdpUnit("root", 15, 40, grads=1.5, loss=True, head=10, grads_last=10)]
    got = {m.name: m.transient for m in fsdp_backward_moments(conv(), kf, 0, True)}
    assert got["root gathered again"] == 4 * 15
    assert got["root head backward"] == 2 * 15 + 2 * 5 + 2 * 1000


def test_the_gathered_root_decides_when_what_the_head_sees_outweighs_twice_the_root():
    """KempnerForge's shape: a 2,000-param root holding a 1,000-param embedding, two 20-param layers keeping 1,000
    each, 3,000 of loss at its peak and 2,500 left at the head's backward. The copy-out (2,000 + 2,500 + 4 x 2,000)
    beats the end-of-backward reduce-scatter (6 x 2,000 + 4 x 20, no activation) because 4,500 > 2 x 2,000 + 80, the
    loss (2,000 + 3,000) and the head's matmul (4,500 + 4 x 2,000 - 2 x 1,000 + 2 x 20)."""
    units = [FsdpUnit("layer 0", 20, 1000, grads=2), FsdpUnit("layer 1", 20, 1000, grads=2),
             FsdpUnit("root", 2000, 3000, grads=200, loss=True, head=2500, grads_last=1000)]
    moments = {m.name: m.activations + m.transient for m in fsdp_backward_moments(conv(), units, 0, False)}
    assert moments["root gathered again"] == 12500
    assert moments["root reduce-scatter (end of backward)"] == 12080
    assert moments["root backward"] == 5000 and moments["root head backward"] == 10540
    peak = fsdp_step_peak(conv(), units, 0, grads_absent=False, reserve_fraction=0.0)
    assert (peak.name, peak.activations, peak.transient) == ("root gathered again", 4500, 8000)
    # with half the loss left at the head, the end-of-backward reduce-scatter decides again
    units[-1] = units[-1]._replace(head=1500)
    assert fsdp_step_peak(conv(), units, 0, grads_absent=False,
                          reserve_fraction=0.0).name == "root reduce-scatter (end of backward)"


def test_kempnerforge_pp1_peaks_with_its_root_gathered_again():
    """KempnerForge, Llama-3.1-8B cut to 2 layers at 6,144 tokens, dp 8, full recompute: the root (embedding, final
    norm, output head) gathered again after the loss's peak decides, its all-gather output beside its unsharded copy
    (4 B per param) and 4 B per logit (train.py's logits and their gradient) beside the layers' kept inputs."""
    arch = resolve(Request(model="llama-3.1-8b", framework="kempnerforge"))[0].model
    arch = arch.model_copy(update={"num_layers": 2})
    job = carry_cards(Job(model=arch, gpu=get_gpu("h200"), num_gpus=8, gpus_per_node=8, seq_length=6144,
                          global_batch_size=8, framework="kempnerforge"))
    report = estimate_memory(job, Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="full"))
    stage = report.stages[0]
    c = memory_card().conventions["fsdp2_kempnerforge"]
    assert c.head_backward_bytes_per_element == 4 and c.logits_bytes_per_element == 8
    root = 2 * arch.vocab_size * arch.hidden_size + arch.hidden_size  # untied embedding + head + final norm
    assert stage.detail["gathered_layers"] == int((c.unsharded_param_bytes + c.prefetched_bytes) * root)
    logits = 6144 * arch.vocab_size
    assert stage.activations_bytes == int(stage.detail["layer_activations"] + stage.detail["embedding_activations"]
                                          + stage.detail["logits_and_loss"] - 4 * logits)
    assert any("loss gathered again moment" in a for a in report.assumptions)
