"""Throughput model: exact FLOP cases, communication arithmetic, pipeline bubble, behaviour and errors."""

from __future__ import annotations

import json
import math

import pytest

from meshplan.arithmetic.comm import alltoall_time, job_links, links, p2p_time, per_domain, ring_time
from meshplan.arithmetic.flops import Gemm, model_flops_per_token, noncausal_flops_per_token
from meshplan.arithmetic.gemm import gemm_efficiency
from meshplan.arithmetic.schedule import megatron_stages, stages_for
from meshplan.core.errors import MeshplanError
from meshplan.estimate.attention_time import attention_efficiency
from meshplan.estimate.perf import estimate_throughput, grad_accumulation_bytes, stage_layers
from meshplan.knowledge.calibration import CALIBRATION_KEYS, calibration, calibration_card
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.hardware import get_gpu
from meshplan.knowledge.model_counts import total_params
from meshplan.request.resolve import resolve
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request


def estimate(**fields):
    job, plan = resolve(Request(**fields))
    return estimate_throughput(job, plan)


# --------------------------------------------------------------------------- FLOPs


def test_llama_8b_flops_by_hand_and_megatron_bridge():
    arch = resolve_model("llama-3.1-8b")
    L, h, a, g, f, V, s = 32, 4096, 32, 8, 14336, 128256, 8192
    attention = 12 * h * h * (1 + g / a + s / (2 * h))  # q = h: 6*(2h^2 + 2h*kv) + 6*s*h
    mlp = 18 * h * f  # SwiGLU: 6 x 3hf
    logits = 6 * h * V
    assert model_flops_per_token(arch, s) == pytest.approx(L * (attention + mlp) + logits, rel=1e-12)
    # Megatron-Bridge's published Llama3-8B GFLOP/token at s 8192 (estimators.md 3.1)
    assert model_flops_per_token(arch, s) / 1e9 == pytest.approx(51.47, abs=0.005)


def test_gpt3_175b_flops_is_korthikanti_with_causal_halving():
    arch = resolve_model("gpt3-175b")
    L, h, V, s = 96, 12288, 50257, 2048
    # 72 L h^2 (1 + s/(6h) + V/(12 L h)) per token, with the s/(6h) attention term halved for causality
    expected = 72 * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))
    assert model_flops_per_token(arch, s) == pytest.approx(expected, rel=1e-12)
    noncausal = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert noncausal_flops_per_token(arch, s) == pytest.approx(noncausal, rel=1e-12)


@pytest.mark.parametrize(
    ("model", "seq", "gflops", "mtp"),
    [
        ("llama-3.1-70b", 8192, 449.2, None),
        ("llama-3.1-405b", 8192, 2524.0, None),
        ("deepseek-v3", 4096, 260.0, None),  # MLA, 1 dense-first layer group, 256 experts top-8 + shared, 1 MTP
        ("deepseek-v3", 4096, 249.8, 0),
        ("qwen3-30b-a3b", 4096, 23.0, None),
    ],
)
def test_flops_match_megatron_bridge_published(model, seq, gflops, mtp):
    got = model_flops_per_token(resolve_model(model), seq, mtp_layers=mtp) / 1e9
    assert got == pytest.approx(gflops, rel=6e-4)


def test_moe_counts_top_k_not_all_experts():
    arch = resolve_model("mixtral-8x7b")
    dense_view = arch.model_copy(update={"moe": arch.moe.model_copy(update={"top_k": arch.moe.num_experts})})
    h, fe, L = arch.hidden_size, arch.moe.expert_ffn_hidden_size, arch.num_layers
    extra = 18 * h * fe * (arch.moe.num_experts - arch.moe.top_k) * L
    assert model_flops_per_token(dense_view, 4096) - model_flops_per_token(arch, 4096) == pytest.approx(extra)


# --------------------------------------------------------------------------- communication arithmetic


def test_ring_and_alltoall_volumes_inside_one_node():
    cal = calibration()
    lk = links(get_gpu("h100"), 8, cal)
    bw = 450e9 * cal.nvlink_efficiency
    nbytes = 64e6
    assert ring_time(nbytes, 8, 1, lk) == pytest.approx(nbytes * 7 / 8 / bw + 7 * cal.latency_intra_s)
    assert alltoall_time(nbytes, 8, 1, lk) == pytest.approx(nbytes * 7 / 8 / bw + cal.latency_intra_s)
    assert p2p_time(nbytes, False, lk) == pytest.approx(nbytes / bw + cal.latency_intra_s)
    assert ring_time(nbytes, 1, 1, lk) == 0.0


def test_ring_across_nodes_uses_the_network():
    cal = calibration()
    lk = links(get_gpu("h100"), 8, cal)
    nbytes = 64e6
    # stride 8: one member per node, so every hop is on a 50 GB/s NIC
    net = 50e9 * cal.network_efficiency
    assert per_domain(4, 8, 8) == 1
    assert ring_time(nbytes, 4, 8, lk) == pytest.approx(nbytes * 3 / 4 / net + 3 * cal.latency_inter_s)
    assert ring_time(nbytes, 16, 1, lk) > ring_time(nbytes, 8, 1, lk)


def test_gb200_nvlink_domain_spans_trays():
    cal = calibration()
    lk = links(get_gpu("gb200"), 4, cal)
    assert lk.domain == 72
    assert per_domain(8, 1, lk.domain) == 8
    # 72 is no multiple of 16: over more than one rack, the TP16 group of ranks 64-79 has 8 in each
    assert per_domain(16, 1, lk.domain) == 8
    job, _ = resolve(Request(model="llama-3.1-70b", gpu="gb200", num_gpus=64))
    assert job_links(job, cal).domain == 64 and per_domain(16, 1, 64) == 16  # one rack holds every group of 64


def test_gemm_efficiency_grows_with_every_dimension():
    cal = calibration()
    base = gemm_efficiency(Gemm("x", 4096, 1024, 4096), cal)
    assert gemm_efficiency(Gemm("x", 4096, 256, 4096), cal) < base
    assert gemm_efficiency(Gemm("x", 1024, 1024, 4096), cal) < base
    assert gemm_efficiency(Gemm("x", 4096, 1024, 1024), cal) < base
    assert base < cal.gemm_peak_fraction


# --------------------------------------------------------------------------- pipeline


def test_stage_layers_interleaved_and_uneven():
    job, _ = resolve(Request(model="llama-3.1-8b", num_gpus=4, pp=2))
    eight = job.model_copy(update={"model": job.model.model_copy(update={"num_layers": 8})})
    assert stage_layers(eight, Plan(pp=2, vpp=2)).layers(0) == (0, 1, 4, 5)
    assert stage_layers(eight, Plan(pp=2, vpp=2)).layers(1) == (2, 3, 6, 7)
    assert megatron_stages(10, 3, 1, 2, 4).chunks == (((0, 1),), ((2, 3, 4, 5),), ((6, 7, 8, 9),))
    # Megatron's interleaved uneven split (get_transformer_layer_offset): each rank's share over its chunks,
    # the virtual stages in order: rank 0 runs layer 0 then 5, the middle rank 1-2 then 6-7.
    assert megatron_stages(10, 3, 2, 2, 4).chunks == (((0,), (5,)), ((1, 2), (6, 7)), ((3, 4), (8, 9)))
    with pytest.raises(MeshplanError):
        megatron_stages(10, 2, 1, 3, 4)  # two stages given, 3 layers left for none


def test_bubble_is_p_minus_1_over_m_v():
    # No host floor and no pipeline traffic, so every stage of llama-3.1-8b (32 layers) differs only by
    # the logits on the last stage; interleaving must divide the fill/drain exactly by v.
    quiet = calibration("megatron-core").with_overrides(host_time_per_layer_s=0.0, pp_latency_inter_s=0.0)
    # the fused loss (Megatron-Bridge's default), whose logits pass keeps the last stage near the others
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=4, pp=4, global_batch_size=8,
                                cross_entropy_loss_fusion=True))
    one = estimate_throughput(job, plan, quiet)
    two = estimate_throughput(job, plan.model_copy(update={"vpp": 2}), quiet)
    assert two.breakdown.bubble_s == pytest.approx(one.breakdown.bubble_s / 2, rel=0.02)
    m, p = 8, 4
    stage = one.breakdown.compute_s / m
    # fill/drain of three stages of a pipeline whose slowest (last) stage also holds the logits
    assert one.breakdown.bubble_s / (m * stage) == pytest.approx((p - 1) / m, rel=0.25)
    assert one.breakdown.bubble_s / (m * stage) < (p - 1) / m


def test_nanotron_balances_stages_with_the_lm_head_as_a_block():
    # Playbook 1B: layer cost 4*32*64*2048 + 3*8192*2048 = 2^26, LM head 131072*2048 = 4 layers' worth.
    arch = resolve_model("llama-3.1-8b").model_copy(update={
        "num_layers": 16, "hidden_size": 2048, "ffn_hidden_size": 8192, "num_attention_heads": 32,
        "num_kv_heads": 32, "head_dim": 64, "vocab_size": 131072})
    h = arch.hidden_size
    assert 4 * arch.num_attention_heads * arch.head_dim * h + 3 * arch.ffn_hidden_size * h == 2**26
    two = stages_for(arch, framework_card("nanotron"), 1, 1, 2, 1, None, None)
    # cumulative cost equals the half-way threshold after 10 layers (not above it), so layer 11 stays on rank 0
    assert two.counts == (11, 5) and two.head_rank == 1
    four = stages_for(arch, framework_card("nanotron"), 1, 1, 4, 1, None, None)
    assert four.counts == (6, 5, 5, 0) and four.head_rank == 3  # the last rank holds only the LM head
    assert [i for r in range(4) for i in four.layers(r)] == list(range(16))


def test_nanotron_pipeline_terms_are_nanotron_only_and_add_exactly():
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=16, tp=2, pp=2, global_batch_size=32,
                                framework="megatron-core"))
    base = calibration("megatron-core")
    assert base.pp_host_sync == 0 and base.pp_cross_sync_per_layer_s == 0
    off = estimate_throughput(job, plan, base)
    on = estimate_throughput(job, plan, base.with_overrides(pp_cross_sync_per_layer_s=1e-3))
    m = 32 // (plan.micro_batch_size * plan.dp)
    # pp 2 with tp*dp = 8 per stage: the stages sit on different nodes; 16 layers on the slowest stage, tp 2
    assert on.breakdown.pp_comm_s - off.breakdown.pp_comm_s == pytest.approx(m * 16 * 2 * 1e-3)
    synced = estimate_throughput(job, plan, base.with_overrides(pp_host_sync=1.0))
    assert synced.step_time_s > off.step_time_s
    flat = plan.model_copy(update={"pp": 1, "dp": 8})
    assert estimate_throughput(job, flat, base.with_overrides(pp_host_sync=1.0)).step_time_s == pytest.approx(
        estimate_throughput(job, flat, base).step_time_s)


def test_nanotron_zero1_parameter_gather_is_not_hidden():
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=64, global_batch_size=64, framework="nanotron",
                                zero_stage=1))
    cal = calibration("nanotron")
    assert cal.param_gather_overlap == 0.0 < calibration("megatron-core").param_gather_overlap
    exposed = estimate_throughput(job, plan, cal)
    hidden = estimate_throughput(job, plan, cal.with_overrides(param_gather_overlap=1.0))
    assert exposed.breakdown.dp_comm_s > hidden.breakdown.dp_comm_s



def test_nanotron_zero1_all_reduces_fp32_gradients_after_the_backward():
    # nanotron with ZeRO-1 + fp32 accumulation skips DDP (trainer._init_model) and all-reduces the whole
    # fp32 gradient buffer after the backward; Megatron-Core reduce-scatters from backward hooks.
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=64, global_batch_size=64, framework="nanotron",
                                zero_stage=1))
    assert plan.pp == 1 and plan.zero_stage == 1
    cal = calibration("nanotron")
    mc = calibration("megatron-core")
    assert (cal.zero_grad_allreduce, cal.zero_grad_overlap) == (1.0, 0.0)
    assert mc.zero_grad_allreduce == 0.0 and mc.zero_grad_overlap == mc.dp_overlap
    lk = links(job.gpu, job.gpus_per_node, cal)
    # one stage holds every weight (untied head included); the stage tables leave out the final norm (h
    # weights, 5e-7 of the model), hence rel 1e-6
    params = total_params(job.model) / plan.tp
    grads = ring_time(params * cal.grad_reduce_bytes, plan.dp, plan.tp, lk)
    gather = ring_time(params * 2, plan.dp, plan.tp, lk)
    r = estimate_throughput(job, plan, cal)
    assert r.breakdown.dp_comm_s == pytest.approx(2 * grads + gather, rel=1e-6)  # all-reduce + bf16 gather
    scattered = estimate_throughput(job, plan, cal.with_overrides(zero_grad_allreduce=0.0))
    assert scattered.breakdown.dp_comm_s == pytest.approx(grads + gather, rel=1e-6)
    # the ZeRO-1 overlap is its own constant: dp_overlap (ZeRO-0's DDP hooks) leaves ZeRO-1 unchanged
    assert estimate_throughput(job, plan, cal.with_overrides(dp_overlap=0.9)).step_time_s == pytest.approx(
        r.step_time_s, rel=1e-12)
    hidden = estimate_throughput(job, plan, cal.with_overrides(zero_grad_overlap=1.0))
    assert hidden.breakdown.dp_comm_s < r.breakdown.dp_comm_s
    zero0 = estimate_throughput(job, plan.model_copy(update={"zero_stage": 0}), cal)
    assert zero0.breakdown.dp_comm_s < r.breakdown.dp_comm_s  # hooks overlap it; no gather

def test_breakdown_adds_up_to_step_time_and_mfu_definition():
    r = estimate(model="llama-3.1-70b", num_gpus=64, tp=4, pp=4, vpp=2, global_batch_size=128,
                 recompute="selective")
    assert sum(r.breakdown.model_dump().values()) == pytest.approx(r.step_time_s, rel=1e-9)
    flops = model_flops_per_token(resolve_model("llama-3.1-70b"), 4096) * 4096 * 128
    assert r.model_flops_per_step == pytest.approx(flops)
    assert r.mfu == pytest.approx(flops / (r.step_time_s * 64 * get_gpu("h100").bf16_flops))
    assert r.tokens_per_s_per_gpu == pytest.approx(4096 * 128 / r.step_time_s / 64)
    assert 0 < r.mfu < 1


# --------------------------------------------------------------------------- behaviour


def test_tp_across_nodes_is_slower():
    inside = estimate(model="llama-3.1-70b", num_gpus=32, tp=8, pp=4, global_batch_size=64)
    across = estimate(model="llama-3.1-70b", num_gpus=32, tp=16, pp=2, global_batch_size=64)
    assert across.breakdown.tp_comm_s > inside.breakdown.tp_comm_s
    assert across.tokens_per_s_per_gpu < inside.tokens_per_s_per_gpu
    assert any("TP 16" in w for w in across.warnings)


def test_more_micro_batches_shrink_the_bubble():
    few = estimate(model="llama-3.1-8b", num_gpus=8, pp=8, global_batch_size=8)
    many = estimate(model="llama-3.1-8b", num_gpus=8, pp=8, global_batch_size=64)
    assert few.breakdown.bubble_s / few.step_time_s > many.breakdown.bubble_s / many.step_time_s
    assert any("bubble" in w for w in estimate(model="llama-3.1-8b", num_gpus=8, pp=8, global_batch_size=4).warnings)


def test_full_recompute_repeats_the_forward_share_of_each_term():
    """Exact case: the forward compute, the card's forward share of the fixed overhead, the TP traffic's forward
    share (tp_fwd: half where the backward mirrors the forward), half the EP traffic and the exposed CP traffic of the
    forward (cp_fwd)."""
    from meshplan.estimate.layer_records import LayerTime
    from meshplan.estimate.recompute import recompute_time

    cal = calibration("megatron-core")
    assert cal.forward_share_of_layer_overhead == 0.5
    lt = LayerTime(overhead=6.0, tp=4.0, tp_fwd=2.0, cp=9.0, cp_fwd=3.0, ep=2.0, fwd_compute=10.0, attention_fwd=1.5)
    assert recompute_time(lt, "full", cal) == 10.0 + 6.0 * 0.5 + 4.0 / 2 + 9.0 / 3 + 2.0 / 2
    assert recompute_time(lt, "selective", cal) == 1.5 and recompute_time(lt, "none", cal) == 0.0
    half = cal.with_overrides(forward_share_of_layer_overhead=0.25)
    assert recompute_time(lt, "full", half) == recompute_time(lt, "full", cal) - 6.0 * 0.25


def test_op_sac_repeats_the_gemms_it_does_not_keep():
    """torchtitan's op-level SAC: a Llama block recomputes mm 2 (wo) and 4 (w3, half the gated fc1); a DeepSeek-V3
    MoE block (MLA: q_down 1, q_up 2, kv_down 3, kv_up 4, attn_out 5; shared w1 6, w3 7, fc2 8) recomputes q_up,
    kv_up, shared w1 and fc2, the router and every routed expert GEMM; under fp8 the same ones (torchao's
    Float8Linear reaches the policy as aten.mm and is counted as in bf16); its recompute time is that forward, the
    elementwise forward share and half the TP traffic's forward half."""
    from meshplan.arithmetic.flops import Shard, attention_gemms, mlp_gemms, moe_gemms
    from meshplan.estimate.layer_records import LayerTime
    from meshplan.estimate.recompute import op_sac_recomputed, recompute_time

    llama = resolve_model("llama-3.1-8b")
    sh = Shard(tokens=8192, tp=1, ep=1, etp=1, sp=False)
    gemms = attention_gemms(llama, sh) + mlp_gemms(llama, sh, llama.ffn_hidden_size, "mlp")
    again = op_sac_recomputed(gemms, True)
    assert [(g.name, g.n) for g in again] == [("attn_out", 4096), ("mlp_fc1", 14336)]
    ds = resolve_model("deepseek-v3")
    again = op_sac_recomputed(attention_gemms(ds, sh) + moe_gemms(ds, sh), True)
    assert [g.name for g in again] == ["q_up", "kv_up", "router", "expert_fc1", "expert_fc2", "shared_expert_fc1",
                                       "shared_expert_fc2"]
    assert again[5].n == ds.moe.shared_expert_ffn_hidden_size  # w1 only
    cal = calibration("torchtitan")
    lt = LayerTime(tp=4.0, tp_fwd=2.0, op_sac_fwd=3.0, attention_fwd=1.5)
    assert recompute_time(lt, "selective", cal, "op_sac") == 3.0 + 4.0 / 2 / 2
    assert recompute_time(lt, "selective", cal) == 1.5


def test_op_sac_terms_are_the_recomputed_gemms_timed_again():
    """recomputed_forwards reads op-level SAC's GEMM seconds from the layer's own gemm_terms (a gated fc1's halves
    timed once): the same floats as timing op_sac_recomputed's GEMMs afresh, bf16 and fp8, dense and MoE."""
    from meshplan.arithmetic.comm import links
    from meshplan.arithmetic.gemm import gemm_terms
    from meshplan.estimate import perf
    from meshplan.estimate.layer_time import layer_gemms
    from meshplan.estimate.recompute import op_sac_recomputed, op_sac_terms, separate_k_width

    halves = 0
    for fields in (dict(model="llama-3.1-8b", num_gpus=8, tp=2), dict(model="llama-3.1-8b", num_gpus=8, tp=2,
                                                                    framework_version="0.1"),
                   dict(model="deepseek-v3", num_gpus=256, ep=32),
                   dict(model="deepseek-v3", num_gpus=256, ep=32, precision="fp8")):
        job, plan = resolve(Request(gpu="h100", framework="torchtitan", **fields))
        cal = calibration(job.framework)
        ctx = perf.layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), perf._peaks(job, cal), 4,
                                 None)
        for moe in (False, True) if job.model.moe else (False,):
            gemms = layer_gemms(ctx, moe)
            terms = gemm_terms(gemms, cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
            again = gemm_terms(op_sac_recomputed(gemms, job.model.gated_mlp, separate_k_width(ctx)), cal,
                               ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
            assert op_sac_terms(gemms, ctx, terms) == again == op_sac_terms(gemms, ctx)
            halves += sum(g.name.endswith("_fc1") and g not in gemms for g in
                          op_sac_recomputed(gemms, job.model.gated_mlp, separate_k_width(ctx)))
    assert halves  # some gated fc1 halves were compared


def test_recompute_modules_repeat_their_memory_bound_passes():
    """layernorm: 2 norms x (read + write) over the hidden activations; moe_act / mlp / shared_experts: the gated
    activation's 3 passes (plain 2) over their FFN width; moe: its activations plus the forward half of the
    dispatcher's and router's bytes; all at the elementwise HBM bandwidth (ctx.hbm)."""
    from dataclasses import replace

    from meshplan.estimate.layer_records import ElementwiseLoad
    from meshplan.estimate.perf import step_terms
    from meshplan.estimate.recompute import module_memory_bound
    from meshplan.request.resolve import resolve

    def megatron_ctx(model: str, **fields):  # a Megatron-Core layer context, elementwise HBM at 1,000 B/s
        job, plan = resolve(Request(model=model, framework="megatron-core", gpu="h100", **fields))
        return replace(step_terms(job, plan).ctx, hbm=1000.0)

    ctx = megatron_ctx("qwen3-30b-a3b", num_gpus=8, ep=8, global_batch_size=64)  # fused SwiGLU, no expert bias
    out = module_memory_bound(ctx, ElementwiseLoad(10.0, 100.0, 20.0, 0.0, 600.0, 200.0))
    assert out == pytest.approx({"layernorm": 2 * 2 * 2 * 10.0 / 1000, "moe_act": 3 * 2 * 100.0 / 1000,
                                 "shared_experts": 3 * 2 * 20.0 / 1000, "mlp": 0.0,
                                 "moe": (3 * 2 * 120.0 + 400.0) / 1000}, rel=1e-12)
    gelu = megatron_ctx("gpt3-175b", num_gpus=64, tp=8, pp=8, seq_length=2048, global_batch_size=64)  # plain GELU
    plain = module_memory_bound(gelu, ElementwiseLoad(10.0, 0.0, 0.0, 50.0, 0.0, 0.0))
    assert plain["mlp"] == pytest.approx(2 * 2 * 50.0 / 1000, rel=1e-12)
    base = dict(model="qwen3-30b-a3b", num_gpus=8, tp=1, pp=1, ep=8, global_batch_size=64, recompute="selective")
    none = estimate(**base, recompute_modules=["core_attn"]).breakdown.recompute_s
    assert estimate(**base, recompute_modules=["core_attn", "layernorm"]).breakdown.recompute_s > none
    assert estimate(**base, recompute_modules=["core_attn", "moe_act"]).breakdown.recompute_s > none


def test_recompute_modules_repeat_their_forward():
    """Megatron's recompute_modules: core_attn repeats the attention core, mlp / moe / shared_experts / mla_up_proj
    what layer_time puts in module_fwd (moe also its dispatch and combine); a module with nothing there costs
    nothing."""
    from meshplan.estimate.layer_records import LayerTime
    from meshplan.estimate.recompute import recompute_time

    cal = calibration("megatron-core")
    lt = LayerTime(attention_fwd=1.5, ep=4.0, module_fwd={"mlp": 3.0, "moe": 5.0, "shared_experts": 0.5,
                                                          "mla_up_proj": 0.25})
    assert recompute_time(lt, "selective", cal, modules=("core_attn", "mla_up_proj")) == 1.75
    assert recompute_time(lt, "selective", cal, modules=("moe",)) == 5.0 + 4.0 / 2
    assert recompute_time(lt, "selective", cal, modules=("moe_act", "layernorm")) == 0.0
    base = dict(model="deepseek-v3", num_gpus=1024, tp=2, pp=16, ep=64, etp=1, global_batch_size=4096,
                recompute="selective", first_stage_layers=3, last_stage_layers=2)
    core = estimate(**base).breakdown.recompute_s
    more = estimate(**base, recompute_modules=["core_attn", "moe", "mla_up_proj"]).breakdown.recompute_s
    assert more > core > 0


def test_recompute_costs_time():
    none = estimate(model="llama-3.1-8b", num_gpus=8, tp=8, global_batch_size=16)
    sel = estimate(model="llama-3.1-8b", num_gpus=8, tp=8, global_batch_size=16, recompute="selective")
    full = estimate(model="llama-3.1-8b", num_gpus=8, tp=8, global_batch_size=16, recompute="full")
    assert none.breakdown.recompute_s == 0
    assert 0 < sel.breakdown.recompute_s < full.breakdown.recompute_s
    assert none.step_time_s < sel.step_time_s < full.step_time_s
    assert none.mfu > full.mfu  # MFU does not count recomputed FLOPs


def test_fp8_uses_fp8_peak_and_is_faster():
    bf16 = estimate(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=64)
    fp8 = estimate(model="llama-3.1-70b", num_gpus=64, tp=8, global_batch_size=64, precision="fp8")
    assert fp8.step_time_s < bf16.step_time_s
    # MFU is against the FP8 peak, twice the BF16 one on H100
    assert fp8.mfu == pytest.approx(fp8.model_flops_per_step / (fp8.step_time_s * 64 * 1978.9e12))


def test_context_parallel_ring_and_moe_all_to_all_show_up():
    cp = estimate(model="llama-3.1-8b", num_gpus=16, tp=2, cp=4, seq_length=131072, global_batch_size=8,
                  cp_comm_type="a2a")  # cp divides the 4 KV heads per TP rank (CP003)
    assert cp.breakdown.cp_comm_s > 0
    inside = estimate(model="mixtral-8x7b", num_gpus=64, tp=1, ep=8, global_batch_size=256)
    assert inside.breakdown.ep_comm_s > 0
    qwen = estimate(model="qwen3-30b-a3b", num_gpus=64, ep=8, global_batch_size=256)
    wide = estimate(model="qwen3-30b-a3b", num_gpus=64, ep=32, global_batch_size=256)
    assert wide.breakdown.ep_comm_s > qwen.breakdown.ep_comm_s
    assert any("EP 32" in w for w in wide.warnings)


def test_more_data_parallel_nodes_cost_gradient_sync():
    one_node = estimate(model="llama-3.1-8b", num_gpus=8, global_batch_size=8, framework="nanotron")
    many = estimate(model="llama-3.1-8b", num_gpus=64, global_batch_size=64, framework="nanotron")
    assert many.breakdown.dp_comm_s > one_node.breakdown.dp_comm_s
    assert many.tokens_per_s_per_gpu < one_node.tokens_per_s_per_gpu


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("fields", "rule_id"),
    [
        ({"model": "llama-3.1-8b", "gpu": "a100", "num_gpus": 8, "precision": "fp8"}, "FP001"),
        ({"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2, "dp": 2}, "WS003"),
        ({"model": "llama-3.1-8b", "num_gpus": 8, "ep": 2}, "EP001"),
        ({"model": "llama-3.1-8b", "num_gpus": 64, "tp": 64}, "TP001"),
        ({"model": "llama-3.1-8b", "num_gpus": 64, "pp": 64}, "PP001"),  # first in card order, before PP007
        ({"model": "mixtral-8x7b", "num_gpus": 24, "ep": 3}, "EP002"),
        ({"model": "llama-3.1-8b", "num_gpus": 16, "global_batch_size": 8}, "BS001"),
    ],
)
def test_bad_layouts_stop_on_the_rule_with_its_fix(fields, rule_id):
    """The estimate refuses in the rule's own words (tests/test_rules.py checks every blocking rule)."""
    with pytest.raises(EstimateBlocked) as info:
        estimate(**fields)
    assert info.value.rule_id == rule_id and str(info.value).startswith(f"{rule_id}: ")
    assert info.value.fix == info.value.finding.fix


# --------------------------------------------------------------------------- the card and the command


def test_calibration_card_sources_every_constant():
    card = calibration_card()
    assert set(card.constants) == set(CALIBRATION_KEYS)
    for name, const in card.constants.items():
        assert const.source and const.meaning, name
        assert const.fitted != "pending", f"{name} was never fitted"
        assert math.isfinite(const.value) and const.value >= 0, name
    for fw in card.frameworks.values():
        assert fw.source
    h100 = {fw: attention_efficiency(resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8, framework=fw))[0],
                                     calibration(fw)) for fw in ("nanotron", "megatron-core")}
    assert h100["nanotron"] == ("flash_attn_2", 0.35) and h100["megatron-core"][0] == "cudnn"


def test_cli_throughput_json_and_batch(tmp_path, capsys):
    from meshplan.faces.cli import main

    assert main(["throughput", "llama-3.1-8b", "--num-gpus", "8", "--tp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > 0 and set(out["breakdown"]) >= {"compute_s", "tp_comm_s", "bubble_s", "dp_comm_s"}
    batch = tmp_path / "reqs.jsonl"
    batch.write_text(
        json.dumps({"model": "llama-3.1-8b", "num_gpus": 8}) + "\n"
        + json.dumps({"model": "llama-3.1-8b", "gpu": "a100", "num_gpus": 8, "precision": "fp8"}) + "\n"
    )
    assert main(["throughput", "--batch", str(batch)]) == 2  # the fp8-on-A100 line fails
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["line"] for x in lines] == [1, 2]
    assert lines[0]["tokens_per_s_per_gpu"] > 0
    assert "FP8" in lines[1]["error"]
    assert main(["throughput", "llama-3.1-8b", "--num-gpus", "8", "--tp", "2"]) == 0
    table = capsys.readouterr().out
    assert "tokens/s/GPU" in table and "compute" in table


# --------------------------------------------------------------------------- attention without flash


def test_unfused_attention_is_batched_gemms_plus_softmax_and_dropout_passes():
    """GPT-22B-like layer, TP8, s 2048, one sequence: the unfused attention time redone by hand."""
    job, plan = resolve(Request(model="70B", gpu="a100", num_gpus=8, tp=8, global_batch_size=1,
                                sequence_parallel=True, recompute="selective"))
    cal = calibration(job.framework)
    flash = estimate_throughput(job, plan)
    plain = estimate_throughput(job, plan.model_copy(update={"attention_backend": "unfused", "dropout": False}))
    dropped = estimate_throughput(job, plan.model_copy(update={"attention_backend": "unfused", "dropout": True}))
    arch, s = job.model, job.seq_length
    heads, d = arch.num_attention_heads / 8, arch.head_dim
    hbm = job.gpu.hbm_bandwidth * cal.hbm_efficiency
    peak = job.gpu.bf16_flops
    gemm = 3 * 2 * (2 * s * s * d * heads) / (peak * gemm_efficiency(Gemm("qk", s, s, d), cal))
    scores = heads * s * s
    fwd_plain = gemm / 3 + scores * cal.softmax_bytes_per_score_fwd / hbm
    total_plain = gemm + scores * (cal.softmax_bytes_per_score_fwd + cal.softmax_bytes_per_score_bwd) / hbm
    extra_dropout = scores * (cal.dropout_bytes_per_score_fwd + cal.dropout_bytes_per_score_bwd) / hbm
    flash_attn = 3.5 * 2 * s * (s / 2) * heads * 2 * d / (peak * cal.attention_peak_fraction)
    layers = arch.num_layers
    # Compute differs by the attention alone; selective recompute repeats the attention forward.
    assert plain.breakdown.compute_s - flash.breakdown.compute_s == pytest.approx(layers * (total_plain - flash_attn))
    assert plain.breakdown.recompute_s == pytest.approx(layers * fwd_plain)
    assert dropped.breakdown.compute_s - plain.breakdown.compute_s == pytest.approx(layers * extra_dropout)
    assert flash.step_time_s < plain.step_time_s < dropped.step_time_s
    assert any("unfused attention" in a for a in dropped.assumptions)
    assert any("flash attention" in a for a in flash.assumptions)


def test_moe_layers_pay_dispatch_passes_router_and_a_host_sync_per_micro_batch():
    job, plan = resolve(Request(model="olmoe-1b-7b", num_gpus=8, ep=8, global_batch_size=16, seq_length=2048))
    base = calibration(job.framework).with_overrides(moe_host_sync_s=0.0, moe_dispatch_passes=0.0,
                                                     moe_router_bytes_per_logit=0.0)
    fixed = base.with_overrides(moe_host_sync_s=0.004)
    moved = base.with_overrides(moe_dispatch_passes=10.0)
    routed_bytes = base.with_overrides(moe_router_bytes_per_logit=40.0)
    t0, t1, t2, t3 = (estimate_throughput(job, plan, c) for c in (base, fixed, moved, routed_bytes))
    arch = job.model
    m = job.global_batch_size // (plan.micro_batch_size * plan.dp)
    moe_layers = len(arch.moe.moe_layers)
    assert t1.breakdown.compute_s - t0.breakdown.compute_s == pytest.approx(m * moe_layers * 0.004)  # one sync each
    tokens = plan.micro_batch_size * job.seq_length
    routed = tokens * arch.moe.top_k * arch.hidden_size
    hbm = job.gpu.hbm_bandwidth * base.hbm_efficiency
    assert t2.breakdown.compute_s - t0.breakdown.compute_s == pytest.approx(m * moe_layers * 10 * 2 * routed / hbm)
    assert t3.breakdown.compute_s - t0.breakdown.compute_s == pytest.approx(
        m * moe_layers * 40 * tokens * arch.moe.num_experts / hbm)
    # A bigger micro-batch amortises the sync: fewer micro-batches, the same cost each.
    job4, plan4 = resolve(Request(model="olmoe-1b-7b", num_gpus=8, ep=8, global_batch_size=16, seq_length=2048,
                                  micro_batch_size=2))
    gap = estimate_throughput(job4, plan4, fixed).step_time_s - estimate_throughput(job4, plan4, base).step_time_s
    assert gap == pytest.approx((m // 2) * moe_layers * 0.004, rel=0.02)
    assert any("MoE layers" in a for a in t1.assumptions)


def test_grouped_gemm_slows_with_few_tokens_per_expert():
    """Expert GEMMs: the shape curve times rows/(rows + moe_gemm_half_ridges x ridge rows), rows = tokens per local
    expert, ridge rows = the GPU's bf16_peak / hbm_bandwidth."""
    from meshplan.arithmetic.flops import Gemm
    from meshplan.arithmetic.gemm import expert_ridge_rows, gemm_efficiency

    cal = calibration("megatron-core").with_overrides(moe_gemm_half_ridges=4.0)
    ridge = expert_ridge_rows(989e12, 3.35e12)
    assert ridge == pytest.approx(295.2, abs=0.1)
    half = 4.0 * ridge
    dense, expert = Gemm("mlp_fc1", half, 4096, 4096), Gemm("expert_fc1", half, 4096, 4096)
    assert gemm_efficiency(expert, cal, ridge) == pytest.approx(gemm_efficiency(dense, cal, ridge) * 0.5)
    big = Gemm("expert_fc1", 9 * half, 4096, 4096)
    assert gemm_efficiency(big, cal, ridge) / gemm_efficiency(Gemm("mlp_fc1", 9 * half, 4096, 4096), cal, ridge) \
        == pytest.approx(0.9)
    # A GPU with less compute per byte of bandwidth (H20: 148 TFLOP/s on 4 TB/s) needs fewer rows per expert.
    h20 = expert_ridge_rows(148e12, 4.0e12)
    assert h20 == pytest.approx(37.0)
    assert gemm_efficiency(expert, cal, h20) > gemm_efficiency(expert, cal, ridge)
    # More EP gives each local expert more rows (the ep ranks pool their tokens): its GEMMs run nearer peak.
    job1, plan1 = resolve(Request(model="olmoe-1b-7b", num_gpus=8, ep=1, global_batch_size=16, seq_length=2048))
    job8, plan8 = resolve(Request(model="olmoe-1b-7b", num_gpus=8, ep=8, global_batch_size=16, seq_length=2048))
    flops = [estimate_throughput(j, p, cal).breakdown.compute_s for j, p in ((job1, plan1), (job8, plan8))]
    assert flops[1] < flops[0]


def test_flex_dispatch_sends_a_token_once_per_destination_rank_and_domain():
    from meshplan.arithmetic.comm import alltoall_time, dispatch_time, learned_routing
    from meshplan.knowledge.calibration import flex_dispatch_bandwidth

    cal = calibration("megatron-core")
    lk = links(get_gpu("h100"), 8, cal)
    copy = 1e6  # bytes of one routed copy of the rank's tokens
    # Inside one node: the all-to-all sends all 8 copies, flex one per destination rank (128 experts, 16 a rank),
    # every one it receives (its own rank's too) at DeepEP's achieved bandwidth on Hopper where that is below NVLink.
    ranks, _ = learned_routing(128, 8, 8, 8)
    assert dispatch_time(copy, 8, 8, 1, lk, dedup=False, experts=128) == alltoall_time(8 * copy, 8, 1, lk)
    assert lk.flex_at(8) == flex_dispatch_bandwidth("deepep", "hopper")
    assert dispatch_time(copy, 8, 8, 1, lk, dedup=True, experts=128) == pytest.approx(
        max(ranks * copy * 7 / 8 / lk.intra_bw, ranks * copy / lk.flex_at(8)) + lk.intra_lat)
    # EP64 over 8 nodes, top-8 of 256: all-to-all sends 8 * 56/64 copies over the network; flex crosses NVLink once
    # per off-rank destination rank and the network once per off-node destination node.
    plain = dispatch_time(copy, 8, 64, 1, lk, dedup=False, experts=256)
    flex = dispatch_time(copy, 8, 64, 1, lk, dedup=True, experts=256)
    assert plain == pytest.approx(8 * copy * 56 / 64 / lk.inter_bw + lk.inter_lat)
    ranks, nodes = learned_routing(256, 8, 64, 8)
    assert flex == pytest.approx(max(copy * ranks * 63 / 64 / lk.intra_bw, copy * nodes * 7 / 8 / lk.inter_bw)
                                 + lk.inter_lat)
    assert flex < plain


def test_flex_dispatcher_changes_expert_traffic_and_the_dispatchers_permutes():
    base = dict(model="mixtral-8x7b", num_gpus=64, tp=1, pp=1, ep=8, global_batch_size=128)
    inside = estimate(**base, moe_token_dispatcher="flex").breakdown.ep_comm_s
    # Mixtral: 1 expert a rank, top-2 reach 2 ranks either way; DeepEP's 20 SMs copy them slower than NCCL's NVLink
    assert inside > estimate(**base).breakdown.ep_comm_s
    # Qwen3-30B-A3B at EP8 in one H100 node: 16 experts a rank, so top-8 reach ~5.3 ranks: fewer bytes, at DeepEP's
    # 308 GB/s against NVLink's 360 on 7/8 of the 8 copies, a little less time
    node = dict(model="qwen3-30b-a3b", num_gpus=8, ep=8, global_batch_size=64)
    assert estimate(**node, moe_token_dispatcher="flex").breakdown.ep_comm_s < estimate(**node).breakdown.ep_comm_s
    wide = dict(model="qwen3-30b-a3b", num_gpus=64, ep=32, global_batch_size=128)
    flex, plain = estimate(**wide, moe_token_dispatcher="flex"), estimate(**wide)
    assert flex.breakdown.ep_comm_s < plain.breakdown.ep_comm_s
    # DeepEP's dispatcher permutes the copies once each way (8 passes), the alltoall's also sorts them by expert (16):
    # the layer's memory-bound work less (tests/test_flex_permute_passes.py counts it)
    assert flex.breakdown.compute_s < plain.breakdown.compute_s
    assert any("flex dispatcher" in a for a in flex.assumptions)


def test_step_terms_work_out_each_stages_dp_sync_once_per_its_parameters(monkeypatch):
    """step_terms' DP term asks step_sync once per distinct (dense, expert, edge) parameters of its stages (all else it
    reads is the plan's): the middle stages of a deep pipeline share one, and the term is the same as asking it per
    stage."""
    from meshplan.estimate import perf

    job, plan = resolve(Request(model="llama-3.1-70b", gpu="h100", num_gpus=64, tp=4, pp=8, zero_stage=1))
    asked = []
    real = perf.step_sync

    def counted(*args, **kw):
        asked.append((*args[-3:-1], kw["edge"]))
        return real(*args, **kw)

    monkeypatch.setattr(perf, "step_sync", counted)
    terms = perf.step_terms(job, plan)
    keys = [(row.dense_params, row.expert_params, perf.stage_edge(s, terms.inputs)) for s, row in enumerate(terms.rows)]
    assert len(asked) == len(set(keys)) < plan.pp
    per_stage = max(perf._dp_exposed(s, row, terms.inputs) for s, row in enumerate(terms.rows))
    assert terms.dp_exposed == per_stage * plan.schedule_runs(job.global_batch_size)


@pytest.mark.parametrize(("framework", "zero_stage", "m", "expected"), [
    ("deepspeed", 0, 8, 8 * 18),  # BF16_Optimizer: bf16 grad cast to fp32 (2 + 4) and added into its buffer (4 + 4 + 4)
    ("deepspeed", 1, 8, 7 * 6),  # AccumulateGrad: the first micro-batch's grad kept, each later one added in place
    ("deepspeed", 1, 1, 0),
    ("deepspeed", 3, 8, 0),  # not read: the calibration's 0
    ("nanotron", 1, 8, 8 * 10),  # no card section: the framework's calibration, every micro-batch
    ("megatron-core", 1, 8, 0),  # fused into the weight-gradient GEMM
])
def test_grad_accumulation_bytes_per_stage(framework, zero_stage, m, expected):
    """The gradient accumulation outside the GEMM a step pays per parameter: the framework card's pass at the plan's
    ZeRO stage (cards/frameworks/deepspeed.yaml grad_accumulation_pass), else the calibration's per micro-batch."""
    job, plan = resolve(Request(model="llama-3.1-8b", num_gpus=8, framework=framework, zero_stage=zero_stage,
                                pp=2 if zero_stage < 2 else 1, global_batch_size=64))
    assert grad_accumulation_bytes(job, plan, calibration(framework), m) == expected


def test_deepspeed_accumulation_pass_in_the_step():
    """The pass adds its HBM time to the step once per micro-batch: DeepSpeed's ZeRO-0 step (BF16_Optimizer) with
    twice the micro-batches spends 18 B per parameter more on each added one, over the GPU's HBM bandwidth, beside
    its compute (the other_s term holds the optimizer step and the accumulation), at the calibration's achieved HBM
    bandwidth."""
    fields = dict(model="llama-3.1-8b", num_gpus=8, framework="deepspeed", zero_stage=0, pp=1, dp=8,
                  micro_batch_size=1)
    job, plan = resolve(Request(**fields, global_batch_size=64))
    double = estimate(**fields, global_batch_size=128)
    added = plan.num_microbatches(job.global_batch_size)
    extra = double.breakdown.other_s - estimate_throughput(job, plan).breakdown.other_s
    hbm = job.gpu.hbm_bandwidth * calibration("deepspeed").hbm_efficiency
    assert extra == pytest.approx(added * 18 * total_params(job.model) / hbm, rel=1e-6)


def test_the_pipeline_assumption_is_said_only_where_there_is_a_pipeline():
    """At pp 1 the throughput's assumptions said 'the step replayed ... each waiting for its neighbour stage and one
    p2p hop; slowest stage 0', of a job with no neighbour stage: they say its micro-batches run one after another with
    the gradients accumulated; at pp > 1 the pipeline's words stay, with the same micro-batch count (step_microbatches
    per data-parallel rank: 1,024 sequences over dp 4 at micro-batch 1)."""
    from meshplan import api
    from meshplan.schema.request import Request

    flat = api.estimate_throughput(Request(model="llama-3.1-8b", num_gpus=8, tp=2)).assumptions
    piped = api.estimate_throughput(Request(model="llama-3.1-8b", num_gpus=8, pp=2)).assumptions
    assert not any("neighbour stage" in a for a in flat)
    assert ("No pipeline (pp 1): 256 micro-batches per step, each rank's forward and backward run one after another, "
            "the gradients accumulated over them.") in flat
    assert any(a.startswith("Pipeline: 256 micro-batches;") and "neighbour stage" in a for a in piped)
