"""NeMo AutoModel's routed experts at full EP (ep over every dp*cp*tp rank, ep_shard 1): its
components/moe/parallelizer.py apply_fsdp passes them to the block's fully_shard as ignored_params and gives them no
unit of their own (the card's full_ep_experts), so the FSDP walk gathers, reduces and accumulates only a MoE layer's
dense parameters, while the experts' bf16 .grad is a state written by the step's first backward (fsdp_walk.layer_units
own_grads). DeepSeek-V3's layer shapes at EP 64 on 64 data-parallel ranks, its 256-GPU row's
(bench/data/nemo_automodel automodel_dsv3_256)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import accumulated_grad_bytes, convention, experts_in_units, state_bytes
from meshplan.estimate.fsdp_walk import Accumulation, fsdp_backward_moments, layer_units
from meshplan.estimate.memory_terms import param_table_for
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.catalog import resolve_model
from meshplan.schema.request import Request

EP = DP = 64
LAYER = 10  # a MoE layer of DeepSeek-V3 (the first three are dense)


def _units(framework: str):
    """One DeepSeek-V3 MoE layer's FSDP unit at TP1 EP64 over 64 data-parallel ranks (expert_dp 1), as the walk
    builds it on this framework, with the DeepSeek-V3 shapes: 256 experts of 3 x 2048 x 7168 parameters."""
    card = framework_card(framework)
    arch = resolve_model("deepseek-v3")
    table = param_table_for(arch, card.moe_whole_over_tp)
    tensors = convention(card, 3)[2]
    per_kind = {(table.kind[LAYER], "full"): 100.0, (table.kind[LAYER], "none"): 300.0}
    units, _ = layer_units(table, per_kind, tensors, DP, 1.0, "op_sac", 1, EP, (LAYER,), ("full",),
                           experts_in_units(card, EP, 1.0))
    return card, tensors, table, units[0]


def test_the_experts_shapes():
    """The table's experts of the layer are DeepSeek-V3's 256 x 3 x 2048 x 7168, 4 of them on each of 64 EP ranks."""
    _, _, table, _ = _units("nemo-automodel")
    assert table.experts[LAYER] == 256 * 3 * 2048 * 7168


def test_automodel_full_ep_unit_holds_the_dense_parameters_alone():
    """AutoModel's unit is the layer's dense parameters; its gradients still count the 4 local experts' whole bf16
    .grad (2 B each: the convention's resident dtype), beside the dense ones sharded over 64."""
    card, tensors, table, unit = _units("nemo-automodel")
    dense, local = table.tp_sharded[LAYER] + table.replicated[LAYER], 4 * 3 * 2048 * 7168
    assert card.full_ep_experts.ignored and not experts_in_units(card, EP, 1.0)
    assert unit.params == dense
    assert unit.own_grads == state_bytes(tensors, local, 1.0)["gradients"] == 2 * local
    assert unit.grads == pytest.approx(state_bytes(tensors, dense, DP)["gradients"] + 2 * local)


def test_ep_shard_and_torchtitan_keep_the_experts_in_a_unit():
    """With an EP shard over more than one rank AutoModel fully_shards the experts (their own unit); torchtitan's
    card says nothing of ignored experts (its experts' fully_shard over the edp mesh): both count them in a unit."""
    assert experts_in_units(framework_card("nemo-automodel"), EP, 2.0)
    assert not experts_in_units(framework_card("nemo-automodel"), EP, 1.0)
    assert experts_in_units(framework_card("nemo-automodel"), 1, 1.0)  # no EP: the block's unit holds them
    _, _, table, unit = _units("torchtitan")
    assert unit.params == table.tp_sharded[LAYER] + table.replicated[LAYER] + 4 * 3 * 2048 * 7168
    assert unit.own_grads == 0.0


def test_walk_moments_under_a_pipeline_gather_and_hold_the_dense_parameters():
    """Under PP (torch's PipelineStage: every unit gathered, its fp32 unsharded gradient held to the step's end) a
    middle micro-batch's moment of the full-EP layer holds its dense parameters gathered (2 B) and their fp32 gradient
    (4 B), not the experts'; the gradients not yet written are the dense ones only (the experts' .grad was written by
    the step's first backward)."""
    card, tensors, table, unit = _units("nemo-automodel")
    conv = convention(card, 3)[1]
    dense = table.tp_sharded[LAYER] + table.replicated[LAYER]
    acc = Accumulation(accumulated_grad_bytes(card, 8, True, 4), 8, pipeline=True,
                       through_forward=card.grad_accumulation.gathered_through_forward)
    m = {s.name: s for s in fsdp_backward_moments(conv, [unit], 0.0, True, acc)}
    s = m["layer 10 backward (a middle micro-batch)"]
    assert conv.unsharded_param_bytes == 2 and acc.bytes_per_param == 4
    assert s.transient == 2 * dense
    assert s.accumulated == 4 * dense
    assert s.absent_grads == pytest.approx(state_bytes(tensors, dense, DP)["gradients"])


# the row as bench/production_mapping.py maps it (local batch 8 of 1-sample pipeline micro-batches)
DSV3_256 = dict(model="deepseek-v3", framework="nemo-automodel", gpu="h100", num_gpus=256, gpus_per_node=8,
                seq_length=4096, global_batch_size=512, micro_batch_size=1, tp=1, pp=4, vpp=8, ep=64, dp=64,
                zero_stage=3, recompute="full", moe_token_dispatcher="flex", moe_fake_balanced_gate=True,
                loss_fp32_upcast=False, framework_version="main@2025-10-02")


def test_dsv3_256_stage_holds_fp32_gradients_of_its_dense_parameters():
    """The 256-GPU row's first stage: its held fp32 gradients are 4 B per dense parameter of the stage (the experts'
    are their own bf16 .grad, a state), dense = (params_on_gpu - weight_params) x 64 / 63 (weight_params: dense / 64
    plus the experts whole at expert_dp 1); at its peak, a decoder layer's backward in a middle micro-batch, its
    gathered parameters are every unit's dense ones in bf16 (the units stay gathered through the forward)."""
    report = api.estimate_memory(Request(**DSV3_256))
    stage, d = report.stages[0], report.stages[0].detail
    dense = (d["params_on_gpu"] - d["weight_params"]) * DP / (DP - 1)
    assert d["unsharded_accumulated_gradients"] == pytest.approx(4 * dense, rel=1e-6)
    assert report.peak_stage == stage.stage == 0
    assert any("stage 0 peaks at the layer" in a and "backward (a middle micro-batch) moment" in a
               for a in report.assumptions)
    assert d["gathered_layers"] == pytest.approx(2 * dense, rel=1e-6)
