"""moe_shared_expert_overlap where a request leaves it out: the framework's default for the model, a card fact resolved
once into the Job (cards/frameworks/*.yaml defaults.moe_shared_expert_overlap): Megatron-Bridge's DeepSeek-V2/V3,
Kimi-K2 and GLM-4.5 bridges turn it on (NVIDIA-NeMo/Megatron-Bridge v0.6.0 51885cf1 deepseek_v2_bridge.py,
deepseek_v3_bridge.py, kimi_bridge.py, glm45_bridge.py provider_bridge), Megatron-Core's TransformerConfig leaves it
off, the other frameworks have no key. A default yields to the plan (knowledge/adapter_knobs.shared_expert_overlap):
off beside Bridge's flex dispatcher (apply_flex_dispatcher_backend), moe_a2a_overlap (the performance scripts'
_set_moe_a2a_overlap_overrides) and a recomputed shared_experts module, where rule EP012 refuses the same plans only
when the request asks for it. Its time: each EP all-to-all hidden up to the shared experts' GEMMs launched beside it
(Megatron-LM 24bad8e677 token_dispatcher.py, shared_experts.py), moe_time.shared_overlap_windows. Before: the default
was off everywhere, so a DeepSeek-V3 request on Bridge was estimated (and rendered) as a run Bridge does not launch by
default."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.comm import alltoall_sm_share, hidden_beside, links
from meshplan.arithmetic.gemm import gemm_terms
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_time import layer_gemms, layer_time
from meshplan.estimate.moe_time import EP_ALL_TO_ALLS_PER_LAYER, shared_overlap_windows
from meshplan.estimate.perf import _peaks, layer_context
from meshplan.knowledge.adapter_knobs import shared_expert_overlap
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

SMALL = dict(gpu="h100", num_gpus=16, seq_length=4096, global_batch_size=32, micro_batch_size=1, tp=2, ep=8, etp=1,
             recompute="selective")


def _job(model: str, framework: str = "megatron-bridge", **kw):
    return resolve(Request(model=model, framework=framework, **{**SMALL, **kw}))


@pytest.mark.parametrize("model", ["deepseek-v2-lite", "deepseek-v3", "moonlight-16b-a3b", "kimi-k2", "glm-4.5-air"])
def test_bridge_providers_that_turn_it_on(model):
    job, plan = _job(model)
    assert job.moe_shared_expert_overlap and not job.moe_shared_expert_overlap_asked
    assert shared_expert_overlap(job, plan)
    assert any("moe_shared_expert_overlap not given: on" in n for n in job.notes)


@pytest.mark.parametrize("model", ["llama-4-scout", "qwen3-next-80b-a3b", "nemotron-3-nano-30b-a3b", "qwen3-30b-a3b"])
def test_bridge_providers_that_leave_it_off(model):
    """No v0.6 bridge builds Llama 4; Qwen3-Next's leaves it and its recipe sets it False; Nemotron-H's yields to the
    checkpoint's config and its recipes set it False; Qwen3-MoE has no shared experts."""
    job, plan = _job(model, pp=1, tp=1) if model == "nemotron-3-nano-30b-a3b" else _job(model)
    assert not job.moe_shared_expert_overlap and not shared_expert_overlap(job, plan)


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "nemo-automodel"])
def test_other_frameworks_leave_it_off(framework):
    """Megatron-Core's TransformerConfig default is False (and --moe-shared-expert-overlap a store_true flag); the
    frameworks without the key are not refused a default they do not have."""
    job, plan = _job("deepseek-v2-lite", framework, **({} if framework == "megatron-core" else
                                                       {"tp": 1, "etp": None}))
    assert not job.moe_shared_expert_overlap and not shared_expert_overlap(job, plan)
    assert not any(f.id == "EP012" for f in api.check_config(Request(
        model="deepseek-v2-lite", framework=framework,
        **{**SMALL, **({} if framework == "megatron-core" else {"tp": 1, "etp": None})})).findings)


def test_the_request_wins():
    job, plan = _job("deepseek-v3", moe_shared_expert_overlap=False)
    assert job.moe_shared_expert_overlap_asked and not shared_expert_overlap(job, plan)
    job, plan = _job("qwen3-next-80b-a3b", moe_shared_expert_overlap=True)
    assert shared_expert_overlap(job, plan)


@pytest.mark.parametrize("change", [{"moe_token_dispatcher": "flex"}, {"moe_a2a_overlap": True},
                                    {"recompute_modules": ["core_attn", "shared_experts"]}])
def test_the_default_yields_to_a_plan_that_cannot_keep_it(change):
    """Bridge's flex setup and performance scripts turn it off (Megatron-Core refuses it beside a recomputed
    shared_experts): no EP012 for the default, the estimate without its bytes, the render writes it off. Asked, the
    same plan is refused by EP012."""
    req = Request(model="moonlight-16b-a3b", framework="megatron-bridge", **{**SMALL, **change})
    job, plan = resolve(req)
    assert job.moe_shared_expert_overlap and not shared_expert_overlap(job, plan)
    assert not any(f.id == "EP012" for f in api.check_config(req).findings)
    off = api.estimate_memory(req.model_copy(update={"moe_shared_expert_overlap": False}))
    assert api.estimate_memory(req).peak_bytes == off.peak_bytes
    assert "model.moe_shared_expert_overlap = True" not in api.render_config("megatron-bridge", req, force=True).text
    assert any(f.id == "EP012" for f in api.check_config(
        req.model_copy(update={"moe_shared_expert_overlap": True})).findings)


def test_a_bridge_file_without_the_key_reads_as_the_provider_default():
    """A Bridge config that does not set the key runs the provider's default: read back as left out, resolved on for
    DeepSeek's provider, off for Qwen3-Next's."""
    req = Request(model="moonlight-16b-a3b", framework="megatron-bridge", **SMALL)
    out = api.render_config("megatron-bridge", req)
    text = "\n".join(line for line in out.text.splitlines() if "moe_shared_expert_overlap" not in line)
    back = api.request_from_config(api.import_config(text, framework="megatron-bridge", path=out.filename),
                                   {"model": "moonlight-16b-a3b", "num_gpus": 16})
    assert back.moe_shared_expert_overlap is None
    job, plan = resolve(back)
    assert shared_expert_overlap(job, plan)
    assert api.estimate_memory(back).peak_bytes == api.estimate_memory(req).peak_bytes


def _moe_layer(framework: str, **kw):
    job, plan = _job("deepseek-v3", framework, num_gpus=256, ep=32, pp=8, first_stage_layers=7, last_stage_layers=6,
                     global_batch_size=256, **kw)
    cal = calibration(job.framework)
    ctx = layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), _peaks(job, cal), 4, None)
    return ctx, layer_time(ctx, True)


def test_each_all_to_all_is_hidden_up_to_the_shared_gemms_beside_it():
    """fc1's forward beside the dispatch, fc2's beside the combine, their backward (two thirds of each) beside the
    gradients' all-to-alls: the layer's exposed EP time drops by what those GEMMs hide of each all-to-all at the SMs
    its CTAs leave them (comm.hidden_beside), and nothing else moves."""
    ctx_on, on = _moe_layer("megatron-bridge")
    ctx_off, off = _moe_layer("megatron-bridge", moe_shared_expert_overlap=False)
    assert ctx_on.shared_expert_overlap and not ctx_off.shared_expert_overlap
    assert shared_overlap_windows(ctx_off, [], []) == ()
    one = off.ep / EP_ALL_TO_ALLS_PER_LAYER
    gemms = layer_gemms(ctx_on, True)
    terms = gemm_terms(gemms, ctx_on.cal, ctx_on.bf16_peak, ctx_on.fp8_peak, ctx_on.ridge_rows)
    fc1 = sum(t for g, t in zip(gemms, terms, strict=True) if g.name == "shared_expert_fc1")
    fc2 = sum(t for g, t in zip(gemms, terms, strict=True) if g.name == "shared_expert_fc2")
    windows = shared_overlap_windows(ctx_on, gemms, terms)
    assert windows == pytest.approx((fc1 / 3, fc2 / 3, fc2 * 2 / 3, fc1 * 2 / 3))
    ep = mesh_groups(ctx_on.plan, law=ctx_on.law).ep  # each window's GEMMs on the SMs NCCL's all-to-all leaves
    share = alltoall_sm_share(ep.size, ep.stride, ctx_on.lk)
    assert share == pytest.approx(16 / 132)  # EP32 over four H100 nodes
    assert off.ep - on.ep == pytest.approx(sum(hidden_beside(one, w, share) for w in windows))
    assert 0 < off.ep - on.ep < off.ep
    assert (on.gemm, on.attention, on.elementwise, on.tp) == (off.gemm, off.attention, off.elementwise, off.tp)


def test_the_time_follows_the_default():
    """DeepSeek-V3 on Bridge, left out: faster than asked off by the hidden all-to-all, as fast as asked on; on
    Megatron-Core, left out, as asked off."""
    base = dict(model="deepseek-v3", gpu="h100", num_gpus=256, seq_length=4096, global_batch_size=256,
                micro_batch_size=1, tp=2, pp=8, ep=32, etp=1, first_stage_layers=7, last_stage_layers=6)

    def rate(**kw):
        return api.estimate_throughput(Request(**{**base, **kw})).tokens_per_s_per_gpu
    default = rate(framework="megatron-bridge")
    assert default == rate(framework="megatron-bridge", moe_shared_expert_overlap=True)
    assert default > rate(framework="megatron-bridge", moe_shared_expert_overlap=False)
    assert rate(framework="megatron-core") == rate(framework="megatron-core", moe_shared_expert_overlap=False)
