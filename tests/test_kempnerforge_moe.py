"""KempnerForge's MoE layout as its source builds it (cards/frameworks/kempnerforge.yaml, arithmetic/mesh.py): EP a
mesh dimension of its own between the data ranks and TP, every FSDP unit (the experts too) sharded over dp_shard
alone, and TP leaving the MoE block whole, each TP rank routing and computing every token of its micro-batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.arithmetic.comm import links
from meshplan.arithmetic.flops import moe_gemms
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.layer_time import elementwise_load
from meshplan.estimate.memory import _world
from meshplan.estimate.perf import _peaks, layer_context
from meshplan.estimate.tp_overlap import TP_COLLECTIVES_ATTENTION_ONLY, moe_layer_tp_ops
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

MOE = dict(model="deepseek-v2-lite", num_gpus=16, global_batch_size=64, micro_batch_size=2, gpu="h100")


def _ctx(framework: str, tp: int, ep: int):
    job, plan = resolve(Request(framework=framework, tp=tp, ep=ep, **MOE))
    cal = calibration(framework)
    return job, plan, layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), _peaks(job, cal), 4, None)


def _rows(ctx, prefix: str) -> float:
    return sum(g.m * g.count for g in moe_gemms(ctx.arch, ctx.shard) if g.name.startswith(prefix))


def test_experts_are_sharded_over_the_data_ranks_alone():
    """KempnerForge's fully_shard takes the dp_shard mesh for the experts too (parallel.py apply_fsdp2): its expert
    states split over dp, while Megatron-Core's expert-DP is world / (pp*ep*etp), the TP ranks folded in."""
    job, plan, _ = _ctx("kempnerforge", tp=2, ep=2)
    assert plan.dp == 4 and _world(job, plan)[1] == plan.dp
    mjob, mplan, _ = _ctx("megatron-core", tp=2, ep=2)
    assert _world(mjob, mplan)[1] == 16 / (mplan.pp * mplan.ep * mplan.etp) == 4  # etp 2 by default there


def test_ep_ranks_are_tp_apart():
    """KempnerForge's mesh (dp_shard, ep, tp): EP2 beside TP4 spans 8 ranks; Megatron's order puts EP at stride etp."""
    job, plan, _ = _ctx("kempnerforge", tp=4, ep=2)
    assert mesh_groups(plan, law=job.card.world_size_law).ep == (2, 4)
    tjob, tplan, _ = _ctx("torchtitan", tp=4, ep=2)
    assert tplan.etp == 1 and mesh_groups(tplan, law=tjob.card.world_size_law).ep == (2, 1)


def test_moe_block_runs_every_token_on_each_tp_rank():
    """TP leaves KempnerForge's MoE block whole (tensor_parallel.py: no mlp.* entry, no sequence parallelism for
    MoE): its routed rows, shared expert and router are TP1's on every TP rank; torchtitan's TP2 halves them."""
    _, _, kf1 = _ctx("kempnerforge", tp=1, ep=2)
    _, _, kf2 = _ctx("kempnerforge", tp=2, ep=2)
    for prefix in ("expert_", "shared_expert_", "router"):
        assert _rows(kf1, prefix) > 0 and _rows(kf2, prefix) == pytest.approx(_rows(kf1, prefix))
    shared = [g for g in moe_gemms(kf2.arch, kf2.shard) if g.name == "shared_expert_fc2"]
    assert shared[0].k == kf2.arch.moe.shared_expert_ffn_hidden_size  # the shared expert whole, not / tp
    _, _, mc1 = _ctx("torchtitan", tp=1, ep=2)
    _, _, mc2 = _ctx("torchtitan", tp=2, ep=2)
    assert _rows(mc2, "expert_") == pytest.approx(_rows(mc1, "expert_") / 2)  # its TP ranks' sequence shards
    assert elementwise_load(kf2, True).dispatch_bytes == pytest.approx(elementwise_load(kf1, True).dispatch_bytes)
    # no TP collective inside the block: attention's alone, though the model has a shared expert
    assert kf2.arch.moe.shared_expert_ffn_hidden_size and moe_layer_tp_ops(kf2.arch, kf2.shard.moe_whole) \
        == TP_COLLECTIVES_ATTENTION_ONLY < moe_layer_tp_ops(mc2.arch, mc2.shard.moe_whole)


def test_moe_block_activations_are_whole_on_each_tp_rank():
    """The MoE block's saved tensors (router, dispatched copies, experts, shared expert) on a KempnerForge TP rank are
    TP1's of the same micro-batch; the attention's stay TP-sharded. The estimate builds its layout with it."""
    from meshplan.arithmetic.activations import layer_activations
    from meshplan.arithmetic.memory_states import memory_card
    from meshplan.estimate.memory import _layer_layout, architecture_shape
    from meshplan.knowledge.cards import framework_card

    job, plan, _ = _ctx("kempnerforge", tp=2, ep=2)
    conv = memory_card().conventions[framework_card("kempnerforge").convention_for(None)]
    lay = _layer_layout(job, plan, conv, 8192)
    assert lay.moe_whole and lay.tp == 2
    shape = architecture_shape(job.model)
    whole = layer_activations(shape, lay, True, "none")
    tp1 = layer_activations(shape, lay._replace(tp=1, sp=False), True, "none")
    split = layer_activations(shape, lay._replace(moe_whole=False, sp=True), True, "none")  # Megatron-Core's cut
    assert whole["moe"] == pytest.approx(tp1["moe"]) and whole["moe"] > 1.5 * split["moe"]
    assert whole["attention"] < tp1["attention"]  # attention's stay TP-sharded


def test_sequence_parallel_is_off_for_moe_and_tied_models():
    """apply_tensor_parallel: seq_parallel = not is_pp_stage and not tie and not is_moe. A request that leaves
    sequence_parallel out gets it off for an MoE or tied-embedding model, on for the rest; other frameworks keep it."""
    _, plan, _ = _ctx("kempnerforge", tp=2, ep=2)
    assert not plan.sequence_parallel
    dense = dict(num_gpus=64, global_batch_size=64, micro_batch_size=1, gpu="h100", tp=8, framework="kempnerforge")
    assert resolve(Request(model="llama-3.1-8b", **dense))[1].sequence_parallel
    assert not resolve(Request(model="gpt3-175b", **dense))[1].sequence_parallel  # tied embeddings
    assert resolve(Request(model="gpt3-175b", **{**dense, "framework": "torchtitan"}))[1].sequence_parallel
    _, tplan, _ = _ctx("torchtitan", tp=2, ep=2)
    assert tplan.sequence_parallel


def test_dispatch_reads_three_counts_back_with_ep():
    """ep_dispatch_and_compute reads send_counts, recv_counts and the local experts' bincount back to the host
    (expert_parallel.py lines 145, 150, 186); _local_forward one bincount (moe.py 288-290): the card's moe_host_syncs,
    each a moe_host_sync_s stall in the MoE layer's overhead. Megatron-Core keeps one."""
    from meshplan.estimate.layer_time import layer_overhead
    from meshplan.estimate.moe_time import moe_host_syncs

    for ep, syncs in ((1, 1.0), (2, 3.0), (4, 3.0)):
        job, plan, ctx = _ctx("kempnerforge", tp=1, ep=ep)
        assert moe_host_syncs(job, plan) == ctx.moe_host_syncs == syncs
        assert layer_overhead(ctx, True) == pytest.approx(
            ctx.cal.layer_overhead_s + syncs * ctx.cal.moe_host_sync_s)
    mjob, mplan, _ = _ctx("megatron-core", tp=1, ep=2)
    assert moe_host_syncs(mjob, mplan) == 1.0


def test_shared_experts_are_whole_on_each_tp_rank():
    """No mlp.* entry in its TP plan for an MoE block: the shared experts' weights stay whole on each TP rank, as the
    router's do (memory_terms.param_table_for), where Megatron-Core splits them over TP."""
    from meshplan.estimate.memory_terms import param_table_for
    from meshplan.knowledge.catalog import resolve_model
    from meshplan.knowledge.model_counts import layer_params

    arch = resolve_model("deepseek-v2-lite")
    moe_layer = arch.moe.moe_layers[0]
    p = layer_params(arch, moe_layer)
    assert p["shared_experts"] > 0
    whole, split = param_table_for(arch, True), param_table_for(arch, False)
    assert whole.replicated[moe_layer] == split.replicated[moe_layer] + p["shared_experts"]
    assert whole.tp_sharded[moe_layer] == split.tp_sharded[moe_layer] - p["shared_experts"]
    assert whole.linear_whole[moe_layer] == p["shared_experts"] and split.linear_whole[moe_layer] == 0
    dense = next(i for i in range(arch.num_layers) if not arch.is_moe_layer(i))
    assert whole.tp_sharded[dense] == split.tp_sharded[dense]
    from meshplan.estimate.memory import memory_terms
    from meshplan.estimate.memory_terms import stage_params

    job, plan, _ = _ctx("kempnerforge", tp=2, ep=2)
    terms = memory_terms(job, plan, [])
    got = stage_params(terms, 0, [terms.pipeline.layers(0)])
    layers = range(arch.num_layers)
    assert got.dense == pytest.approx(sum(whole.tp_sharded[i] / 2 + whole.replicated[i] for i in layers)
                                      + terms.vocab * arch.hidden_size  # the embedding whole (embedding_over_tp)
                                      + terms.vocab * arch.hidden_size + terms.norm_width)  # head (no SP: whole)


def test_stacked_expert_weights_are_copied_and_kept_each_forward():
    """grouped_expert_forward stacks every local expert's weights (moe.py lines 50-53) on each forward: a bf16 copy
    of the local experts (64 / ep x 3 x 2048 x 1408 for DeepSeek-V2-Lite) read and written in the forward, and kept
    by torch._grouped_mm until the layer's backward unless the block is recomputed."""
    from meshplan.arithmetic.activations import layer_activations, shape_of, stacked_expert_bytes
    from meshplan.estimate.layer_time import layer_time
    from meshplan.estimate.memory import _layer_layout, engine_terms

    job, plan, ctx = _ctx("kempnerforge", tp=1, ep=2)
    shape = shape_of(job.model)
    weights = stacked_expert_bytes(shape, 2, 1)
    assert weights == 2 * 32 * 3 * 2048 * 1408
    assert ctx.stacked_experts and elementwise_load(ctx, True).weight_copy_bytes == 2 * weights
    plain = layer_time(replace(ctx, stacked_experts=False), True)
    stacked = layer_time(ctx, True)
    assert stacked.elementwise - plain.elementwise == pytest.approx(2 * weights / ctx.hbm)
    assert stacked.fwd_compute - plain.fwd_compute == pytest.approx(2 * weights / ctx.hbm)
    conv = engine_terms(job, plan)[1]
    lay = _layer_layout(job, plan, conv, int(ctx.shard.tokens))
    assert lay.stacked_experts
    kept = sum(layer_activations(shape, lay, True, "none").values())
    assert kept - sum(layer_activations(shape, lay._replace(stacked_experts=False), True, "none").values()) == weights
    assert layer_activations(shape, lay, True, "full") == layer_activations(
        shape, lay._replace(stacked_experts=False), True, "full")
    _, _, mctx = _ctx("megatron-core", tp=1, ep=2)
    assert not mctx.stacked_experts and elementwise_load(mctx, True).weight_copy_bytes == 0.0
