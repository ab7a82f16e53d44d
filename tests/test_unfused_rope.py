"""gpt-oss's rotary embedding as Megatron-Core and Megatron-Bridge run it (verl's and SkyRL's Megatron engines through
Bridge's providers): unfused (its YaRN concentration factor, which Transformer Engine's fused RoPE does not take; Bridge
turns the fusion off beside position_embedding_type yarn),
its passes counted from Megatron-Core's code (bench/activation_census.py) and timed over the rotated queries and
keys (estimate/attention_time.runs_unfused_rope, layer_time.elementwise_seconds)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.estimate.attention_time import runs_unfused_rope, yarn_concentration
from meshplan.estimate.layer_records import BF16
from meshplan.estimate.layer_time import elementwise_load, elementwise_seconds, rotated_elements
from meshplan.estimate.perf import step_terms
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.model import RopeSpec
from meshplan.schema.request import Request

CENSUS = Path(__file__).resolve().parents[1] / "bench" / "data" / "activation_census.json"
FUSED_ROPE_PASSES = 4  # Transformer Engine's FusedRoPEFunc: one read and one write forward, the same backward
GPT_OSS = dict(model="gpt-oss-120b", num_gpus=64, seq_length=4096, global_batch_size=1280, micro_batch_size=4,
               ep=64, gpu="gb200", precision="bf16")


def _job(framework: str = "megatron-bridge", **fields):
    return resolve(Request(framework=framework, **(GPT_OSS | fields)))[0]


def test_the_card_holds_what_the_census_counted_less_the_fused_kernel():
    forward, backward = json.loads(CENSUS.read_text())["rotary"]["unfused_functions"]
    assert forward == pytest.approx(12, abs=0.1) and backward == pytest.approx(14, abs=0.1)
    assert calibration().unfused_rope_passes == pytest.approx(forward + backward - FUSED_ROPE_PASSES, abs=0.2)


def test_yarn_concentration_is_megatron_cores():
    assert yarn_concentration(_job().model.rope) == pytest.approx(0.1 * math.log(32.0) + 1.0)
    assert yarn_concentration(RopeSpec(scaling="yarn", factor=40, mscale=0.707, mscale_all_dim=0.707)) == 1.0
    assert yarn_concentration(RopeSpec(scaling="yarn", factor=1.0)) == 1.0
    assert yarn_concentration(RopeSpec(scaling="yarn", factor=4, mscale=1.0, mscale_all_dim=0.0)) == pytest.approx(
        0.1 * math.log(4) + 1.0)


@pytest.mark.parametrize(("framework", "model", "unfused"), [
    ("megatron-bridge", "gpt-oss-120b", True),   # position_embedding_type yarn: Bridge turns the fusion off
    ("megatron-core", "gpt-oss-120b", True),     # concentration 1.35: TE's fused RoPE takes no mscale
    ("megatron-bridge", "llama-3.1-8b", False),  # plain rope (llama3 scaling): the fused kernel
    ("megatron-bridge", "deepseek-v3", False),   # MLA's own rotary path
    ("torchtitan", "gpt-oss-120b", False),       # its own model code, no such card fact
])
def test_which_jobs_run_the_unfused_rope(framework, model, unfused):
    job, plan = resolve(Request(model=model, framework=framework, num_gpus=64, gpu="gb200"))
    assert runs_unfused_rope(job, plan.zero_stage) is unfused


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
@pytest.mark.parametrize("job_kind", ["rl", "sft"])
@pytest.mark.parametrize(("zero_stage", "unfused"), [
    (1, True),   # the Megatron engine: Bridge's gpt-oss provider (position_embedding_type yarn) turns the fusion off
    (3, False),  # the FSDP engine: transformers' modeling code, its rotary in the hf_eager_* passes
])
def test_rl_frameworks_run_the_unfused_rope_on_their_megatron_engine_only(framework, job_kind, zero_stage, unfused):
    job, plan = resolve(Request(model="gpt-oss-20b", framework=framework, num_gpus=8, gpu="h100", job=job_kind,
                                zero_stage=zero_stage))
    ctx = step_terms(job, plan).ctx
    assert job.card.engine_at(zero_stage) == ("megatron" if unfused else "fsdp")
    assert ctx.unfused_rope is unfused and runs_unfused_rope(job, plan.zero_stage) is unfused
    load = elementwise_load(ctx, True)
    assert load.rotated == (rotated_elements(ctx) if unfused else 0.0)
    fused = replace(ctx, unfused_rope=False)
    extra = elementwise_seconds(ctx, load) - elementwise_seconds(fused, elementwise_load(fused, True))
    assert extra == pytest.approx(BF16 * calibration().unfused_rope_passes * load.rotated / ctx.hbm)
    assert (extra > 0) is unfused


def test_megatron_core_keeps_the_fused_kernel_at_a_concentration_of_one():
    job = _job("megatron-core")
    rope = job.model.rope.model_copy(update={"mscale": 1.0, "mscale_all_dim": 1.0})
    flat = job.model_copy(update={"model": job.model.model_copy(update={"rope": rope})})
    assert not runs_unfused_rope(flat, 1)
    bridge = _job()
    flat_bridge = bridge.model_copy(update={"model": bridge.model.model_copy(update={"rope": rope})})
    assert runs_unfused_rope(flat_bridge, 1)  # Bridge refuses the fusion for any position_embedding_type but rope


def test_the_passes_are_timed_over_the_rotated_queries_and_keys():
    job, plan = resolve(Request(framework="megatron-bridge", **GPT_OSS))
    ctx = step_terms(job, plan).ctx
    assert ctx.unfused_rope
    # 16,384 tokens x (64 query + 8 KV heads) x 64
    assert rotated_elements(ctx) == 4 * 4096 * (64 + 8) * 64
    load = elementwise_load(ctx, True)
    assert load.rotated == rotated_elements(ctx)
    fused = elementwise_seconds(replace(ctx, unfused_rope=False), elementwise_load(replace(ctx, unfused_rope=False),
                                                                                      True))
    extra = elementwise_seconds(ctx, load) - fused
    assert extra == pytest.approx(BF16 * 22 * rotated_elements(ctx) / ctx.hbm)
