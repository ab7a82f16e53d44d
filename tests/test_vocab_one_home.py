"""The vocabulary the framework builds is one figure (arithmetic/memory_states.built_vocab), read by the memory's
embedding, head and logits and by the step time's logits GEMM, cross-entropy, logits traffic and the rank's
parameters. Megatron pads it to make_vocab_size_divisible_by (128) x tp; the time used to read the model's own."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.comm import links
from meshplan.arithmetic.flops import logits_gemm
from meshplan.arithmetic.gemm import gemm_seconds
from meshplan.arithmetic.memory_states import built_vocab, convention, megatron_loss
from meshplan.estimate.memory import memory_terms
from meshplan.estimate.memory_terms import time_rank_parts
from meshplan.estimate.perf import _peaks, head_seconds, layer_context
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

# llama-3.1-8b's 128256 rows are 1002 x 128: Megatron pads them to 128512 at tp=4 (a multiple of 512)
MEGATRON_TP4 = dict(framework="megatron-core", model="llama-3.1-8b", gpu="h200", num_gpus=8, tp=4, seq_length=4096,
                    global_batch_size=16, micro_batch_size=1, recompute="full")


def test_built_vocab_pads_where_the_convention_does():
    megatron = convention(framework_card("megatron-core"), 1)[1]
    kempnerforge = convention(framework_card("kempnerforge"), 3)[1]
    assert built_vocab(128256, megatron, 1) == 128256 and built_vocab(128256, megatron, 4) == 128512
    assert built_vocab(50257, megatron, 1) == 50304
    assert built_vocab(128256, kempnerforge, 4) == 128256  # KempnerForge builds nn.Linear(dim, vocab_size)


def test_time_reads_the_padded_vocabulary_the_memory_holds():
    job, plan = resolve(Request(**MEGATRON_TP4))
    h = job.model.hidden_size
    vocab = memory_terms(job, plan, []).vocab
    assert vocab == 128512 != job.model.vocab_size
    parts = time_rank_parts(job, plan)
    assert parts.embedding == vocab * h / 4 and parts.head == vocab * h / 4
    cal = calibration("megatron-core")
    ctx = layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), _peaks(job, cal), 4, None)
    gemm = gemm_seconds([logits_gemm(job.model, ctx.shard, vocab)], cal, ctx.bf16_peak, None)
    per_logit = megatron_loss(job, plan).hbm_bytes_per_logit  # Megatron-LM's unfused loss (perf.loss_hbm_bytes)
    loss = per_logit * ctx.shard.tokens * vocab / 4 / ctx.hbm
    assert head_seconds(job, plan, ctx) == pytest.approx(gemm + loss, rel=1e-12)
