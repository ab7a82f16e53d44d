"""FSDP2's reduce output in the backward walk (fsdp_walk.reduce_output_bytes; cards/memory.yaml fsdp2, with the torch
2.13 lines): foreach_reduce writes each unit's reduce-scatter into a reduce_dtype output of the unit's sharded size,
a buffer of its own where the sharded gradient exists already or is of another dtype; a shard of one rank copies the
input into it through a quotient where the framework set a gradient_divide_factor (torchtitan); with replicas (HSDP,
torchtitan 0.3.0's ZeRO-0) each unit's output is kept to the end of its backward."""

from __future__ import annotations

from meshplan.arithmetic.memory_states import memory_card, reduce_input_in
from meshplan.estimate.fsdp_walk import FsdpUnit, ReduceOutput, fsdp_backward_moments, reduce_output_bytes
from meshplan.estimate.memory import estimate_memory
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request

P, S = 1000.0, 125.0  # a unit's parameters, and what one rank holds of them over a shard of 8


def conv(name: str):
    return memory_card().conventions[name]


def test_output_bytes_are_the_reduce_dtype_per_sharded_parameter():
    """bytes = reduce_dtype bytes x the unit's sharded parameters where the output is apart from the gradient, 0 where
    it is the gradient; the quotient = reduce_dtype bytes x the parameters a one-rank shard holds, where the framework
    sets a divide factor (torchtitan), none where it does not (verl's and SkyRL's engines)."""
    titan = conv("fsdp2_chunked_loss")
    sharded = FsdpUnit("u", P, 0.0, sharded=S)
    alone = FsdpUnit("u", P, 0.0, sharded=P, alone=P)
    assert reduce_output_bytes(titan, sharded, True) == (4 * S, 0.0)
    assert reduce_output_bytes(titan, sharded, False) == (0.0, 0.0)
    assert reduce_output_bytes(titan, alone, True) == (4 * P, 4 * P)
    assert reduce_output_bytes(titan, alone, False) == (0.0, 4 * P)
    assert reduce_output_bytes(conv("fsdp2_hf"), alone, True) == (4 * P, 0.0)
    bf16 = titan.model_copy(update=reduce_input_in(titan, 2))  # reduce_dtype bf16: the output too
    assert reduce_output_bytes(bf16, alone, True) == (2 * P, 2 * P)


def test_the_reduce_output_moment_follows_each_copy_in():
    """After a unit's copy-in (bf16 gradients 2 + fp32 input 4 per parameter) its gradients are freed and the output
    is written: input 4 x P + output 4 x S, the gradient still allocated (zeroed in place, not freed: apart)."""
    c = conv("fsdp2")
    units = [FsdpUnit("a", P, 10.0, sharded=S), FsdpUnit("b", P, 10.0, sharded=S)]
    moments = {m.name: m for m in fsdp_backward_moments(c, units, 0.0, False, output=ReduceOutput(False, False))}
    copy_in, written = moments["a reduce-scatter"], moments["a reduce output"]
    prefetch = c.prefetched_bytes * 0  # unit a is the first: nothing before it to prefetch
    assert copy_in.transient == 6 * P + prefetch
    assert written.transient == 4 * P + 4 * S
    assert moments["b reduce output"].transient == 4 * P + 4 * S + c.prefetched_bytes * P  # a prefetched


def test_replicas_keep_every_reduced_units_output_to_the_end_of_the_backward():
    """With replicas each output is all-reduced and held in _all_reduce_state until finalize_backward: unit a, reduced
    after b, runs its backward and its reduce beside b's output (4 x S); without replicas nothing is kept."""
    c = conv("fsdp2")
    units = [FsdpUnit("a", P, 10.0, sharded=S), FsdpUnit("b", P, 10.0, sharded=S)]
    plain = {m.name: m for m in fsdp_backward_moments(c, units, 0.0, False, output=ReduceOutput(False, False))}
    kept = {m.name: m for m in fsdp_backward_moments(c, units, 0.0, False, output=ReduceOutput(False, True))}
    for name in ("a backward", "a gradients", "a reduce-scatter", "a reduce output"):
        assert kept[name].transient - plain[name].transient == 4 * S
    for name in ("b backward", "b reduce output"):
        assert kept[name].transient == plain[name].transient


def test_an_output_that_becomes_the_gradient_is_counted_as_the_gradient():
    """Gradients set to None (one micro-batch) and of the reduce dtype: the output is the sharded gradient, so the
    moment after the copy-in holds the input and no longer counts the unit's gradient absent; nothing is kept beside
    it, with replicas or not."""
    c = conv("fsdp2")
    units = [FsdpUnit("a", P, 10.0, grads=4 * S, sharded=S), FsdpUnit("b", P, 10.0, grads=4 * S, sharded=S)]
    moments = {m.name: m for m in fsdp_backward_moments(c, units, 0.0, True, output=ReduceOutput(False, True))}
    assert moments["b reduce-scatter"].absent_grads == 8 * S
    assert moments["b reduce output"].absent_grads == 4 * S
    assert moments["b reduce output"].transient == 4 * P + c.prefetched_bytes * P
    # a's gathered params and b's retained input, no output of b's beside them: it is b's gradient
    assert moments["a backward"].transient == (c.unsharded_param_bytes + c.retained_reduce_bytes) * P


def titan_zero0_cut(recompute: str, zero_stage: int):
    arch = resolve(Request(model="llama-3.1-8b", framework="torchtitan"))[0].model
    job = carry_cards(Job(model=arch.model_copy(update={"num_layers": 4}), gpu=get_gpu("h100"), num_gpus=8,
                          gpus_per_node=8, seq_length=8192, global_batch_size=8, framework="torchtitan"))
    return estimate_memory(job, Plan(dp=8, zero_stage=zero_stage, micro_batch_size=1, recompute=recompute))


def test_torchtitan_zero0_peaks_at_the_embeddings_reduce_beside_the_layers_kept_outputs():
    """torchtitan 0.3.0's ZeRO-0 (fully_shard over a shard of one, 8 replicas), Llama-3.1-8B cut to 4 layers, full
    AC: the last reduce, the embedding's, holds its fp32 input, output and divide quotient (3 x 4 x E) beside the four
    decoder units' fp32 outputs (4 x 4 x L, L = 2h^2 + 2h*kv + 3hf + 2h), as FSDPMemTracker counts it
    (bench/data/fake_tensor_memory.json: 'Temp' 9.121 GiB, by allocation site in foreach_reduce)."""
    h, kv, f, vocab = 4096, 1024, 14336, 128256
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    report = titan_zero0_cut("full", 0)
    stage = report.stages[0]
    assert any("peaks at the embedding reduce output moment" in a for a in report.assumptions)
    assert stage.detail["gathered_layers"] == 3 * 4 * vocab * h + 4 * 4 * layer
    # sharded over 8 with no replicas the peak stays in the loss, at its last chunk's reduce: no unit's output is kept
    sharded = titan_zero0_cut("full", 3)
    assert any("peaks at the output layer and loss reduce output moment" in a for a in sharded.assumptions)
