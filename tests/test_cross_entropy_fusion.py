"""Megatron-Core's cross_entropy_loss_fusion and cross_entropy_fusion_impl as request fields, end to end: the bytes each
of its three losses keeps per logit and moves per logit (cards/memory.yaml megatron_cross_entropy, counted from
tensor_parallel/cross_entropy.py, fusions/fused_cross_entropy.py and Transformer Engine's Triton kernels), the default
each framework runs (Megatron-LM's unfused loss, Megatron-Bridge's provider: fused native, te for DeepSeek and Kimi),
the memory and the loss's time reading the one choice, rule PR009 (Megatron-LM 0.19 refuses te), a framework without
the switch refused, and the flags and Bridge fields rendered and read back."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import (
    built_vocab,
    megatron_loss,
    megatron_loss_name,
    memory_card,
    output_activations,
    with_precision,
)
from meshplan.core.errors import MeshplanError
from meshplan.estimate.perf import loss_hbm_bytes, step_terms
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, seq_length=8192, global_batch_size=64,
            micro_batch_size=1, tp=2, pp=1, recompute="none")
BF16, FP32 = 2, 4


def _job(framework: str = "megatron-core", **fields):
    return resolve(Request(**BASE | dict(framework=framework) | fields))


def test_the_card_counts_each_loss_from_its_code():
    """Kept at the peak: the unfused and native losses the fp32 softmax (the gradient in place) beside the bf16
    gradient; Transformer Engine's (v2.17) the bf16 logits with the gradient written over them. Moved: the unfused
    loss's eager ops one pass each, the native one's compiled functions one pass each, Transformer Engine's three
    kernels over the bf16 logits."""
    card = memory_card().megatron_cross_entropy
    assert card["unfused"].logits_bytes_per_element == FP32 + BF16
    assert card["native"].logits_bytes_per_element == FP32 + BF16
    assert card["te"].logits_bytes_per_element == BF16
    forward = (BF16 + FP32) + FP32 + 2 * FP32 + 2 * FP32 + FP32 + 2 * FP32  # float, max, -=, exp, sum, div_
    backward = 2 * FP32 + (FP32 + BF16)  # mul_(grad_output), autograd's cast to the bf16 input's dtype
    assert card["unfused"].hbm_bytes_per_logit == forward + backward == 52
    compiled = (BF16 + FP32) + 2 * FP32 + 2 * FP32 + (FP32 + FP32 + BF16)  # three forward functions, the gradients
    assert card["native"].hbm_bytes_per_logit == compiled == 32
    triton = BF16 + 2 * BF16 + 2 * BF16  # online softmax, the loss + in-place gradient, element_mul
    assert card["te"].hbm_bytes_per_logit == triton == 10


@pytest.mark.parametrize(("framework", "model", "fields", "expected"), [
    ("megatron-core", "llama-3.1-8b", {}, (False, "native", "unfused")),
    ("megatron-bridge", "llama-3.1-8b", {}, (True, "native", "native")),
    ("megatron-bridge", "deepseek-v3", dict(num_gpus=256, tp=1, ep=8), (True, "te", "te")),
    ("megatron-bridge", "llama-3.1-8b", dict(cross_entropy_loss_fusion=False), (False, "native", "unfused")),
    ("megatron-core", "llama-3.1-8b", dict(cross_entropy_loss_fusion=True), (True, "native", "native")),
])
def test_each_framework_runs_its_default_unless_asked(framework, model, fields, expected):
    job, plan = _job(framework, model=model, **fields)
    assert (job.cross_entropy_loss_fusion, job.cross_entropy_fusion_impl, megatron_loss_name(job, plan)) == expected


def test_an_impl_without_the_fusion_is_noted_as_read_by_nothing():
    job, plan = _job(cross_entropy_fusion_impl="te")
    assert megatron_loss_name(job, plan) == "unfused"
    assert any("no effect without cross_entropy_loss_fusion" in n for n in job.notes)


def test_a_framework_without_the_switch_refuses_both_fields():
    for field, value in (("cross_entropy_loss_fusion", True), ("cross_entropy_fusion_impl", "te")):
        with pytest.raises(MeshplanError, match=field) as refused:
            _job("torchtitan", **{field: value})
        assert refused.value.fields == (field,)
    job, plan = _job("torchtitan")
    assert job.cross_entropy_loss_fusion is None and megatron_loss(job, plan) is None


def test_memory_takes_the_loss_the_job_runs():
    """The convention's bytes per logit are the job's loss's (with_precision), so the last stage's output activations
    move by 4 B per logit of the TP shard between the fp32 losses and Transformer Engine's."""
    tokens, tp = BASE["seq_length"], BASE["tp"]
    seen = {}
    for fusion, impl in ((False, "native"), (True, "native"), (True, "te")):
        job, plan = _job("megatron-bridge", cross_entropy_loss_fusion=fusion, cross_entropy_fusion_impl=impl)
        conv = with_precision(job, plan)[1]
        vocab = built_vocab(job.model.vocab_size, conv, tp)
        seen[megatron_loss_name(job, plan)] = output_activations(conv, tokens, vocab, tp, job.model.hidden_size, tp,
                                                                     plan.micro_batch_size)
    assert seen["unfused"] == seen["native"]
    assert seen["native"] - seen["te"] == pytest.approx((FP32 + BF16 - BF16) * tokens * vocab / tp)
    unfused = api.estimate_memory(Request(**BASE | dict(framework="megatron-bridge", cross_entropy_loss_fusion=False)))
    te = api.estimate_memory(Request(**BASE | dict(framework="megatron-bridge", cross_entropy_fusion_impl="te")))
    assert te.peak_bytes < unfused.peak_bytes
    assert any("Transformer Engine's fused cross-entropy" in a for a in te.assumptions)


def test_the_loss_time_reads_the_same_choice():
    """head_seconds' loss term is the job's loss's HBM bytes per logit (perf.loss_hbm_bytes); a framework without the
    switch keeps its convention's, else the calibration's fused figure."""
    cal = calibration()
    heads = {}
    for fusion, impl in ((False, "native"), (True, "native"), (True, "te")):
        job, plan = _job("megatron-bridge", cross_entropy_loss_fusion=fusion, cross_entropy_fusion_impl=impl)
        conv = with_precision(job, plan)[1]
        assert loss_hbm_bytes(job, plan, conv, cal) == megatron_loss(job, plan).hbm_bytes_per_logit
        heads[megatron_loss_name(job, plan)] = step_terms(job, plan).inputs.head
    ctx = step_terms(job, plan).ctx
    per_byte = ctx.shard.tokens * built_vocab(job.model.vocab_size, conv, plan.tp) / plan.tp / ctx.hbm
    assert heads["unfused"] - heads["native"] == pytest.approx((52 - 32) * per_byte, rel=1e-6)
    assert heads["native"] - heads["te"] == pytest.approx((32 - 10) * per_byte, rel=1e-6)
    job, plan = _job("torchtitan", tp=1)
    conv = with_precision(job, plan)[1]
    assert loss_hbm_bytes(job, plan, conv, cal) == (conv.loss_hbm_bytes_per_logit or cal.cross_entropy_bytes_per_logit)


def test_pr009_refuses_te_on_megatron_lm_0_19_only():
    te = dict(cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    found = api.check_config(Request(**BASE | dict(framework="megatron-core") | te)).findings
    refused = [f for f in found if f.id == "PR009"]
    assert refused and "native" in refused[0].message and "0.19" in refused[0].message
    assert "megatron-bridge" in refused[0].fix
    for fields in (dict(framework="megatron-bridge") | te,
                   dict(framework="megatron-core", cross_entropy_loss_fusion=True),
                   dict(framework="megatron-core", cross_entropy_fusion_impl="te")):
        assert not [f for f in api.check_config(Request(**BASE | fields)).findings if f.id == "PR009"]


@pytest.mark.parametrize(("framework", "fields", "written"), [
    ("megatron-core", dict(cross_entropy_loss_fusion=True), ["--cross-entropy-loss-fusion",
                                                             "--cross-entropy-fusion-impl native"]),
    ("megatron-bridge", dict(cross_entropy_fusion_impl="te"), ["cross_entropy_fusion_impl = 'te'"]),
    ("megatron-bridge", dict(cross_entropy_loss_fusion=False), ["cross_entropy_loss_fusion = False"]),
])
def test_render_writes_the_loss_and_import_reads_it_back(framework, fields, written):
    text = api.render_config(framework, Request(**BASE | dict(framework=framework) | fields)).text
    for words in written:
        assert words in text
    read = api.import_config(text, framework=framework).request
    job, _ = _job(framework, **fields)
    assert read["cross_entropy_loss_fusion"] is job.cross_entropy_loss_fusion
    if job.cross_entropy_loss_fusion:
        assert read["cross_entropy_fusion_impl"] == job.cross_entropy_fusion_impl
    default = api.render_config(framework, Request(**BASE | dict(framework=framework))).text
    assert "cross_entropy" not in str(api.import_config(default, framework=framework).request)


def test_a_launch_line_is_read():
    read = api.import_config("torchrun pretrain_gpt.py --cross-entropy-loss-fusion --cross-entropy-fusion-impl te "
                             "--tensor-model-parallel-size 2").request
    assert (read["cross_entropy_loss_fusion"], read["cross_entropy_fusion_impl"]) == (True, "te")


@pytest.mark.parametrize(("framework", "fields"), [
    ("verl", dict(zero_stage=1)),  # its Megatron engine: verl/utils/megatron/tensor_parallel.py's log-probs
    ("deepspeed", dict(zero_stage=1)),  # Megatron-DeepSpeed's GPT model: gpt_model.py CrossEntropy
])
def test_an_engine_that_calls_megatrons_loss_itself_is_timed_with_the_unfused_entry(framework, fields):
    """verl's Megatron engine and Megatron-DeepSpeed have no switch, but their training step calls Megatron's unfused
    vocab_parallel_cross_entropy itself (the card's engine.megatron_loss): the loss's time reads that card entry's
    52 B per logit, not the calibration's fused 16 B, and its memory the entry's 6 B per logit."""
    job, plan = _job(framework, **fields)
    assert job.cross_entropy_loss_fusion is None
    assert job.card.engine.megatron_loss[job.card.engine_at(plan.zero_stage)] == "unfused"
    unfused = memory_card().megatron_cross_entropy["unfused"]
    assert megatron_loss(job, plan) == unfused
    conv = with_precision(job, plan)[1]
    assert loss_hbm_bytes(job, plan, conv, calibration()) == unfused.hbm_bytes_per_logit == 52
    assert conv.logits_bytes_per_element == unfused.logits_bytes_per_element == FP32 + BF16
    assert any("unfused vocab-parallel" in a for a in api.estimate_memory(Request(
        **BASE | dict(framework=framework) | fields)).assumptions)


def test_the_engine_loss_follows_the_plans_engine():
    """A search moves verl between its Megatron engine (zero_stage 0-2) and its FSDP engine (3): the FSDP plan keeps
    its convention's own loss (fsdp2_hf, flash_attn's Triton kernels), whatever engine the request resolved at."""
    job, plan = _job("verl", zero_stage=1)
    fsdp = plan.model_copy(update={"zero_stage": 3})
    assert megatron_loss_name(job, plan) == "unfused" and megatron_loss_name(job, fsdp) is None
    conv = with_precision(job, fsdp)[1]
    assert loss_hbm_bytes(job, fsdp, conv, calibration()) == conv.loss_hbm_bytes_per_logit == 26


def test_an_engine_without_a_switch_still_refuses_the_fields():
    with pytest.raises(MeshplanError, match=r"engine\.megatron_loss") as refused:
        _job("verl", zero_stage=1, cross_entropy_loss_fusion=True)
    assert refused.value.fields == ("cross_entropy_loss_fusion",)


@pytest.mark.parametrize(("version", "refused"), [
    (None, True), ("0.19.2", True), ("0.19", True), ("0.20.0", True), ("main", True),
    ("0.18.2", False), ("0.14", False), ("0.16.0rc1", False),
])
def test_pr009_reads_the_release_the_request_names(version, refused):
    """Megatron-LM took te with the fusion until 168cb15d (first in core_v0.19.0): a request naming 0.14-0.18 is
    estimated with 0.19.2's facts but not refused, since PR009 reads the version asked (Job.framework_version_asked)."""
    fields = dict(framework="megatron-core", cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="te")
    req = Request(**BASE | fields | ({} if version is None else dict(framework_version=version)))
    job, _ = resolve(req)
    assert job.framework_version == (None if version is None else "0.19.2")
    assert job.framework_version_asked == (None if version in (None, "0.19.2") else version)
    found = [f for f in api.check_config(req).findings if f.id == "PR009"]
    assert bool(found) is refused


def test_a_render_for_an_older_release_names_it_and_how_to_check_it():
    """A request naming Megatron-LM 0.15 with te and the fusion renders (PR009 reads the release asked), in 0.19.2's
    keys: the script's header names the release asked, not only 0.19.2 (which refuses te: the header said 'Megatron-Core
    0.19.2' over a flag that release rejects), and a note says the file names no release, so check reads it as 0.19.2's
    unless told: checked with framework_version 0.15 the imported file passes PR009, without it PR009 refuses it."""
    fields = dict(framework="megatron-core", framework_version="0.15", cross_entropy_loss_fusion=True,
                  cross_entropy_fusion_impl="te")
    result = api.render_config("megatron-core", Request(**BASE | fields))
    header = result.text.splitlines()[1]
    assert "Megatron-Core 0.15 " in header and "0.19.2" in header, header
    assert any("framework_version 0.15" in note and "check" in note for note in result.notes), result.notes
    imported = api.import_config(result.text, framework="megatron-core")
    told = api.request_from_config(imported, {"framework_version": "0.15"})
    untold = api.request_from_config(imported, {})
    assert not [f for f in api.check_config(told).findings if f.id == "PR009"]
    assert [f for f in api.check_config(untold).findings if f.id == "PR009"]


@pytest.mark.parametrize(("fields", "named"), [
    ({}, "cross_entropy_loss_fusion and cross_entropy_fusion_impl not given"),
    (dict(cross_entropy_loss_fusion=True), "cross_entropy_fusion_impl not given"),
])
def test_bridges_te_default_is_noted_whenever_it_is_taken(fields, named):
    """Megatron-Bridge's DeepSeek provider runs Transformer Engine's loss: a request that turns the fusion on but
    leaves the impl out takes te too, and reads whose default it is (the note was written only where both fields were
    left out, so the fusion asked alone ran te unsaid); an impl asked is no default and gets no note."""
    job, _ = _job("megatron-bridge", model="deepseek-v3", num_gpus=256, tp=1, ep=8, **fields)
    assert job.cross_entropy_fusion_impl == "te"
    said = [n for n in job.notes if "cross_entropy" in n]
    assert len(said) == 1 and said[0].startswith(named) and "deepseek_v3 model provider" in said[0], said
    asked, _ = _job("megatron-bridge", model="deepseek-v3", num_gpus=256, tp=1, ep=8, cross_entropy_fusion_impl="te")
    assert not [n for n in asked.notes if "cross_entropy" in n]
