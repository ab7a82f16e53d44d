"""The memory-bound passes of an engine that trains transformers' modeling code eagerly (verl's and SkyRL's FSDP
engines: the card's eager_model_code), counted from that code (bench/step_op_census.py, cards/calibration.yaml
hf_eager_*), in place of the fused kernels' counts."""

from __future__ import annotations

import pytest

from meshplan.estimate.layer_records import BF16
from meshplan.estimate.layer_time import eager_edge_seconds, elementwise_load, elementwise_seconds
from meshplan.estimate.moe_time import dispatch_and_router_bytes
from meshplan.estimate.perf import estimate_throughput, hf_eager_code, step_terms
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

L8B = dict(model="llama-3.1-8b", num_gpus=8, seq_length=8192, global_batch_size=16, micro_batch_size=1)
QWEN = dict(model="qwen3-30b-a3b", num_gpus=8, seq_length=8192, global_batch_size=16, micro_batch_size=1)


def _job(framework: str, zero_stage: int, fields: dict = L8B):
    return resolve(Request(framework=framework, zero_stage=zero_stage, **fields))


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_the_fsdp_engine_runs_transformers_code_eagerly_the_megatron_engine_does_not(framework):
    assert hf_eager_code(*_job(framework, 3))
    assert not hf_eager_code(*_job(framework, 1))


def test_frameworks_with_their_own_model_code_are_not_hf_eager():
    """Only verl's and SkyRL's cards name an engine that runs transformers' code eagerly: every other framework's
    estimates (Megatron's fused kernels, torchtitan's and KempnerForge's own blocks, NeMo AutoModel's) are as before."""
    from meshplan.core.card_files import framework_names
    from meshplan.knowledge.cards import framework_card

    assert {name for name in framework_names() if framework_card(name).eager_model_code} == {"verl", "skyrl"}
    for framework in ("torchtitan", "megatron-core", "kempnerforge", "nemo-automodel"):
        job, plan = resolve(Request(framework=framework, **L8B))
        assert not hf_eager_code(job, plan)


def test_a_dense_layer_moves_the_hidden_and_ffn_counts():
    job, plan = _job("verl", 3)
    ctx = step_terms(job, plan).ctx
    assert ctx.hf_eager
    cal, load = ctx.cal, elementwise_load(ctx, False)
    assert load.hidden == 8192 * 4096 and load.dense_ffn == 8192 * 14336  # dp 8, tp 1: every token of the row
    assert load.query == 8192 * 32 * 128 and load.key_value == 8192 * 2 * 8 * 128 and load.normed == 0  # no Q/K norm
    want = BF16 * (cal.hf_eager_hidden_passes * load.hidden + cal.hf_eager_query_passes * load.query
                   + cal.hf_eager_key_value_passes * load.key_value + cal.hf_eager_ffn_passes * load.dense_ffn)
    assert elementwise_seconds(ctx, load) == pytest.approx(want / ctx.hbm, rel=1e-12)


def test_per_head_qk_norms_and_mla_latents_are_normed_elements():
    """Qwen3's q_norm and k_norm run on every query and key; MLA's kv_a_layernorm on its latent (DeepSeek-V2-Lite:
    no query latent)."""
    job, plan = _job("verl", 3, QWEN)
    load = elementwise_load(step_terms(job, plan).ctx, True)
    assert load.normed == 8192 * (32 * 128 + 4 * 128) == load.query + load.key_value / 2
    job, plan = _job("verl", 3, dict(QWEN, model="deepseek-v2-lite"))
    load = elementwise_load(step_terms(job, plan).ctx, True)
    assert load.normed == 8192 * 512
    assert load.query == 8192 * 16 * 192 and load.key_value == 8192 * 16 * (192 + 128)


def test_fused_engines_carry_no_attention_elements():
    job, plan = _job("verl", 1)  # the Megatron engine: fused kernels, the elementwise_passes form
    load = elementwise_load(step_terms(job, plan).ctx, False)
    assert load.query == load.key_value == load.normed == 0


def test_the_moe_block_moves_its_dispatch_count_over_the_routed_copies():
    job, plan = _job("verl", 3, QWEN)
    ctx = step_terms(job, plan).ctx
    dispatch, _ = dispatch_and_router_bytes(ctx)
    assert dispatch == ctx.cal.hf_eager_dispatch_passes * BF16 * 8192 * 8 * 2048  # tokens x top_k x hidden


@pytest.mark.parametrize("fields", [L8B, QWEN])
def test_at_the_fused_counts_the_step_is_the_fused_one(fields):
    """With hf_eager_* set to the fused kernels' counts the eager engine's step is the step without the card fact but
    for the embedding's own passes (eager_edge_seconds, not a count): the counts are the only other thing the fact
    changes."""
    job, plan = _job("verl", 3, fields)
    cal = calibration("verl")
    fused = cal.with_overrides(hf_eager_hidden_passes=cal.elementwise_passes,
                               hf_eager_ffn_passes=cal.elementwise_passes, hf_eager_query_passes=0.0,
                               hf_eager_key_value_passes=0.0, hf_eager_qk_norm_passes=0.0,
                               hf_eager_dispatch_passes=cal.moe_dispatch_passes)
    plain = job.model_copy().attach_cards(job.card.model_copy(update={"eager_model_code": None}))
    assert not hf_eager_code(plain, plan)
    ctx = step_terms(job, plan).ctx
    embedding = BF16 * (3 * 8192 * job.model.hidden_size + job.model.vocab_size * job.model.hidden_size) / ctx.hbm
    steps = plan.num_microbatches(job.global_batch_size)
    assert estimate_throughput(job, plan, fused).step_time_s - steps * embedding == pytest.approx(
        estimate_throughput(plain, plan, fused).step_time_s, rel=1e-12)
    assert estimate_throughput(job, plan).step_time_s > estimate_throughput(plain, plan).step_time_s


@pytest.mark.parametrize("fields", [L8B, QWEN])
def test_the_final_norm_and_the_embedding_outside_the_layers(fields):
    """eager_edge_seconds: the final RMSNorm at one fp32 RMSNorm's count over tokens x hidden, the embedding's
    gather (read and written) and its dense backward (the hidden gradient read, vocab x hidden written); none on
    the fused engine."""
    job, plan = _job("verl", 3, fields)
    terms = step_terms(job, plan)
    ctx, arch, tokens = terms.ctx, job.model, 8192
    norm = ctx.cal.hf_eager_qk_norm_passes * BF16 * tokens * arch.hidden_size
    embedding = BF16 * (3 * tokens * arch.hidden_size + arch.vocab_size * arch.hidden_size)
    assert eager_edge_seconds(ctx, arch.vocab_size) == pytest.approx((norm + embedding) / ctx.hbm, rel=1e-12)


def test_verl_fsdp_loss_moves_its_own_bytes_per_logit():
    """verl's FSDP engine's loss (the temperature's in-place division, flash_attn's Triton kernels and autograd's
    CopySlices) moves the convention's 26 B per logit whatever the fused cross-entropy's calibration says; so does the
    Megatron engine's, Megatron's unfused vocab_parallel_cross_entropy that verl calls itself (the card's
    engine.megatron_loss, memory_states.megatron_loss)."""
    from dataclasses import replace

    from meshplan.arithmetic.memory_states import megatron_loss_name, with_precision
    from meshplan.estimate.perf import head_seconds

    job, plan = _job("verl", 3)
    assert with_precision(job, plan)[1].loss_hbm_bytes_per_logit == 26
    ctx = step_terms(job, plan).ctx
    bare = replace(ctx, hf_eager=False)
    assert head_seconds(job, plan, ctx) - head_seconds(job, plan, bare) == pytest.approx(
        eager_edge_seconds(ctx, job.model.vocab_size), rel=1e-9)
    more = replace(bare, cal=ctx.cal.with_overrides(cross_entropy_bytes_per_logit=99.0))
    assert head_seconds(job, plan, more) == head_seconds(job, plan, bare)
    less = replace(bare, hbm=bare.hbm * 2)  # only the loss's passes read the bandwidth
    loss = 26 * 8192 * job.model.vocab_size / bare.hbm
    assert head_seconds(job, plan, bare) - head_seconds(job, plan, less) == pytest.approx(loss / 2, rel=1e-9)
    mjob, mplan = _job("verl", 1)
    assert with_precision(mjob, mplan)[1].loss_hbm_bytes_per_logit is None
    mctx = step_terms(mjob, mplan).ctx
    assert megatron_loss_name(mjob, mplan) == "unfused"
    assert head_seconds(mjob, mplan, replace(mctx, cal=mctx.cal.with_overrides(cross_entropy_bytes_per_logit=99.0))) \
        == head_seconds(mjob, mplan, mctx)
