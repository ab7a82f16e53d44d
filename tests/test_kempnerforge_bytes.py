"""KempnerForge's own byte convention (cards/memory.yaml fsdp2_kempnerforge): it casts the model to bf16 before FSDP2
shards it (model.to(dtype=param_dtype)) and steps torch AdamW, whose moments take the parameter's dtype, so parameters,
gradients and moments are bf16 (2 + 2 + 4 B per parameter, not torchtitan's fp32 4 + 4 + 8); its default loss is
F.cross_entropy on the bf16 logits, no upcast (8 B per logit at its backward, the logits held by the caller).
bench/data/kempnerforge_memory holds the measured runs of KempnerForge's own config validation report.

Part of it tests the bench: it imports the bench's modules (production_mapping, production_scoring)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import bytes_per_param, convention, memory_card
from meshplan.knowledge.cards import framework_card
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import production_mapping as pmap
import production_scoring as pscore

DATA = Path(__file__).resolve().parent.parent / "bench" / "data" / "kempnerforge_memory"
FIELDS = dict(model="llama-3.1-8b", num_gpus=8, gpu="h100", global_batch_size=8, micro_batch_size=1, seq_length=4096,
              zero_stage=3, recompute="full")


def test_parameters_gradients_and_moments_are_bf16():
    """2 + 2 + 4 B per parameter, sharded at ZeRO-3 and replicated at 0: half of the fsdp2 preset's on one plan."""
    card = framework_card("kempnerforge")
    name, _, tensors = convention(card, 3)
    assert name == "fsdp2_kempnerforge"
    assert bytes_per_param(tensors, 8) == pytest.approx((2 + 2 + 4) / 8)
    assert bytes_per_param(convention(card, 0)[2], 8) == pytest.approx(2 + 2 + 4)
    kf = api.estimate_memory(Request(framework="kempnerforge", **FIELDS)).stages[0]
    titan = api.estimate_memory(Request(framework="torchtitan", framework_version="0.2.2", **FIELDS)).stages[0]
    assert kf.weights_bytes == pytest.approx(titan.weights_bytes / 2, rel=1e-6)
    assert kf.optimizer_bytes == pytest.approx(titan.optimizer_bytes / 2, rel=1e-6)


def test_loss_is_the_bf16_cross_entropy_with_the_logits_held():
    """logits 2 + saved bf16 log-softmax 2 + nll_loss's bf16 grad 2 + log-softmax backward's output 2, unchunked."""
    conv = convention(framework_card("kempnerforge"), 3)[1]
    assert (conv.logits_bytes_per_element, conv.loss_chunks) == (8, 1)


def test_the_fsdp2_transients_and_held_gradients_stay_fsdp2_s():
    """Only the resident states and the loss differ from the fsdp2 preset: the unit's fp32 reduce-scatter input, the
    prefetched bf16 unit and the backward walk are FSDP2's own (reduce_dtype fp32 in KempnerForge's policy too)."""
    kf = convention(framework_card("kempnerforge"), 3)[1]
    base = memory_card().conventions["fsdp2"]
    for field in ("gathered_bytes", "prefetched_bytes", "step_peak", "unsharded_param_bytes", "retained_reduce_bytes",
                  "grads_set_to_none", "freed_grads_stay_reserved"):
        assert getattr(kf, field) == getattr(base, field), field


def test_validation_runs_map_with_their_sources():
    """Every row of bench/data/kempnerforge_memory maps with every stated setting, cites the report's file and commit,
    and is compared as KempnerForge logs it: max_memory_allocated over the run (steady)."""
    rows, scores, summary = pscore.run(DATA)
    assert summary.mapped == len(rows) == len(scores) == 5
    for row, score in zip(rows, scores, strict=True):
        source = row["source"]
        assert source["commit"] and source["file"] and source["file"] in source["url"], row["id"]
        assert score.refused is None and not score.rule_errors and score.peak_error is not None, row["id"]
        assert (score.convention, score.moment) == ("allocated", "steady"), row["id"]


def test_a_row_that_ran_without_compile_is_scored_without(tmp_path):
    """KempnerForge compiles by default (train.compile_model); the report's PP run set it false, and says so."""
    rows, _, _ = pscore.run(DATA)
    compiled: dict[bool, set] = {True: set(), False: set()}
    for r in rows:
        stated = "without torch.compile" not in r["outcome"]["other"]
        compiled[stated].add(pmap.map_row(r, tmp_path).request.torch_compile)
    assert compiled == {True: {True}, False: {False}}


def test_logits_are_whole_on_every_tp_rank():
    """KempnerForge's output head gathers its vocabulary shards to Replicate before the plain cross-entropy
    (tensor_parallel.py: ColwiseParallel(output_layouts=Replicate())): the loss's bytes do not shrink with TP, where a
    vocab-parallel loss (torchtitan's loss_parallel) splits them."""
    from meshplan.arithmetic.memory_states import output_activations

    conv = convention(framework_card("kempnerforge"), 3)[1]
    assert conv.logits_over_tp == "replicated"
    tokens, vocab, h = 4 * 4096, 128256, 4096
    one, four = (output_activations(conv, tokens, vocab, tp, h, tp, 4) for tp in (1, 4))
    assert one - four == pytest.approx(conv.output_hidden_bytes * tokens * h * 3 / 4)
    titan = convention(framework_card("torchtitan"), 3, "0.2.2")[1]
    assert titan.logits_over_tp == "vocab_parallel"
    assert output_activations(titan, tokens, vocab, 4, h, 4, 4) == pytest.approx(
        (titan.logits_bytes_per_element * tokens * vocab + titan.output_hidden_bytes * tokens * h) / 4)
    kf = dict(model="llama-3-8b", num_gpus=12, gpu="h200", global_batch_size=96, micro_batch_size=4, seq_length=4096,
              tp=4, recompute="full")
    stage = api.estimate_memory(Request(framework="kempnerforge", **kf)).stages[0]
    assert stage.detail["logits_and_loss"] >= 8 * tokens * vocab


def test_the_token_embedding_is_whole_on_every_tp_rank():
    """tensor_parallel.py leaves the token embedding unparallelized ('Token embedding: Replicated'): at TP4 each rank
    holds the whole vocab x hidden embedding, 2 + 2 + 4 B per parameter sharded over dp, where torchtitan splits it."""
    fields = dict(model="llama-3-8b", num_gpus=8, gpu="h200", global_batch_size=8, micro_batch_size=1, tp=4,
                  seq_length=4096, recompute="full")
    kf = api.estimate_memory(Request(framework="kempnerforge", **fields)).stages[0]
    titan = api.estimate_memory(Request(framework="torchtitan", framework_version="0.2.2", **fields)).stages[0]
    embedding = 128256 * 4096  # llama-3-8b's vocab x hidden (untied)
    assert kf.detail["params_on_gpu"] - titan.detail["params_on_gpu"] == pytest.approx(embedding * 3 / 4, abs=2)
    assert kf.weights_bytes == pytest.approx(2 * kf.detail["params_on_gpu"] / 2, rel=1e-9)  # bf16, sharded over dp 2
