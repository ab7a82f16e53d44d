"""Two moments of the optimizer step (issue 24): the first iteration's allocated peak when the optimizer state is
allocated inside the first step (cards/memory.yaml optimizer_steps state_allocated; memory_stage.
first_iteration_allocated), and what Muon's step allocates while it orthogonalizes a matrix (cards/memory.yaml
muon_step; memory_states.muon_matrix_step_bytes, muon.step_working_bytes, memory_stage.step_moment)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.flops import Shard
from meshplan.arithmetic.memory_states import memory_card, muon_matrix_step_bytes
from meshplan.arithmetic.muon import step_working_bytes
from meshplan.estimate.memory import estimate_memory, memory_terms
from meshplan.estimate.memory_stage import (
    STEP_MOMENT,
    Overheads,
    first_iteration_allocated,
    lazy_optimizer_state,
    muon_step_bytes,
)
from meshplan.estimate.memory_terms import stage_params
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request


def job(model: str, framework: str, gpus: int, **extra) -> Job:
    arch = resolve(Request(model=model, framework=framework))[0].model
    return carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=gpus, gpus_per_node=8, seq_length=4096,
                           global_batch_size=32, framework=framework, **extra))


def stage0(j: Job, p: Plan):
    terms = memory_terms(j, p, [])
    return terms, stage_params(terms, 0, terms.pipeline.chunks[0])


# --------------------------------------------------------------------------- Muon's working set, by hand


def test_muon_gathered_matrix_peaks_when_newton_schulz_converts_back_to_fp32():
    """An 8 x 4 matrix, 4 x 4 on this rank, all-gathered (duplicated): shard 16, whole 32, Gram side 4. finish:
    4 x 16 (Nesterov) + 8 x 32 (gathered shards and their cat) + 6 x 32 (bf16 X and its fp32 copy) + 4 x 16 (A, B)
    = 576, above normalize 512, update 512, gram 480 and scale 12 x 16 + 4 x 32 = 320."""
    step = memory_card().muon_step["emerging_optimizers"]
    assert muon_matrix_step_bytes(step, (4, 4), (8, 4), gathered=True) == 576


def test_muon_blockwise_matrix_peaks_at_the_scaling():
    """The same shard orthogonalized alone (blockwise): finish 4 x 16 + 6 x 16 + 4 x 16 = 224, scale 12 x 16 +
    4 x 16 = 256 (the fp32 result, two scaled copies and the Nesterov momentum)."""
    step = memory_card().muon_step["emerging_optimizers"]
    assert muon_matrix_step_bytes(step, (4, 4), (8, 4), gathered=False) == 256


def test_the_stages_largest_matrix_decides_and_duplicated_costs_more_than_blockwise():
    """Llama-3-70B at TP4: fc1 (2 x 28672 x 8192, 14336 rows on a rank) is the largest matrix; duplicated mode
    gathers it whole."""
    j = job("llama-3-70b", "megatron-core", 32)
    muon = framework_card("megatron-core").muon
    step = memory_card().muon_step["emerging_optimizers"]
    shard = Shard(1, 4, 1, 1, True)
    fc1 = muon_matrix_step_bytes(step, (14336, 8192), (57344, 8192), gathered=True)
    assert muon.tp_mode == "duplicated"
    assert step_working_bytes(j.model, shard, [False], muon, step) == pytest.approx(fc1)
    blockwise = muon.model_copy(update={"tp_mode": "blockwise"})
    assert step_working_bytes(j.model, shard, [False], blockwise, step) == pytest.approx(
        muon_matrix_step_bytes(step, (14336, 8192), (14336, 8192), gathered=False))
    assert fc1 > 3 * step_working_bytes(j.model, shard, [False], blockwise, step)


def test_muon_step_moment_carries_the_working_set_and_adam_none():
    """Under Muon the step moment's temporaries are Megatron's fp32 grad copies (none with fp32 main grads) plus
    the working set; under Adam the working set is 0."""
    j = job("llama-3-70b", "megatron-core", 32)
    muon_plan = Plan(tp=4, pp=4, dp=2, sequence_parallel=True, optimizer="muon")
    terms, params = stage0(j, muon_plan)
    work = muon_step_bytes(terms, params)
    shard = Shard(1, 4, 1, 1, True)
    assert work == step_working_bytes(j.model, shard, [False], framework_card("megatron-core").muon,
                                      memory_card().muon_step["emerging_optimizers"])
    report = estimate_memory(j, muon_plan)
    assert report.stages[0].detail["optimizer_step_temporaries"] == int(work)
    adam_terms, adam_params = stage0(j, muon_plan.model_copy(update={"optimizer": "adam"}))
    assert muon_step_bytes(adam_terms, adam_params) == 0


# --------------------------------------------------------------------------- the first iteration


def test_lazy_state_is_the_moments_on_this_gpu_and_none_for_deepspeed():
    """Megatron's FusedAdam allocates exp_avg and exp_avg_sq (8 B, sharded over dp) inside its first step;
    DeepSpeed builds them at construction."""
    j = job("llama-3.1-8b", "megatron-core", 8)
    terms, params = stage0(j, Plan(tp=2, pp=2, dp=2))
    assert terms.step.state_allocated == "first_step"
    assert lazy_optimizer_state(terms, params) == pytest.approx(8 * (params.dense + params.experts) / 2)
    ds = job("llama-3.1-8b", "deepspeed", 8)
    ds_terms, ds_params = stage0(ds, Plan(dp=8, zero_stage=1))
    assert ds_terms.step.state_allocated == "init"
    assert lazy_optimizer_state(ds_terms, ds_params) == 0


def test_precision_aware_optimizer_allocates_its_master_in_the_first_step_too():
    """Under Megatron's precision-aware optimizer (bf16 moments, bf16 weights) TE's FusedAdam holds the master as
    16-bit remainders and initialize_state allocates it with exp_avg and exp_avg_sq in its first step: 2 + 2 + 2 B
    per sharded parameter; with fp32 moments Megatron's own fp32 master shard exists before, only the 8 B are lazy."""
    j = job("llama-3.1-8b", "megatron-core", 8)
    aware = Plan(tp=2, pp=2, dp=2, zero_stage=1, optimizer_state_dtype="bf16", grad_reduce_in_fp32=False)
    terms, params = stage0(j, aware)
    assert lazy_optimizer_state(terms, params) == pytest.approx(6 * (params.dense + params.experts) / 2)
    plain, plain_params = stage0(j, aware.model_copy(update={"optimizer_state_dtype": None}))
    assert lazy_optimizer_state(plain, plain_params) == pytest.approx(8 * (params.dense + params.experts) / 2)


def test_muon_lazy_state_is_its_one_momentum_on_the_matrices():
    j = job("llama-3.1-8b", "megatron-core", 8)
    adam_terms, params = stage0(j, Plan(tp=2, pp=2, dp=2))
    muon_terms, _ = stage0(j, Plan(tp=2, pp=2, dp=2, optimizer="muon"))
    matrices = params.linear - params.head - params.experts
    assert lazy_optimizer_state(muon_terms, params) == pytest.approx(
        lazy_optimizer_state(adam_terms, params) - 4 * matrices / 2)


def test_first_iteration_backward_runs_without_the_lazy_state():
    """max(each backward moment less the lazy state, the step moment): the backward at 100 GB and the step at
    50 GB give 100 GB less the moments, or the step where that is lower."""
    j = job("llama-3.1-8b", "megatron-core", 8)
    terms, params = stage0(j, Plan(tp=2, pp=2, dp=2))
    lazy = lazy_optimizer_state(terms, params)
    moments = [Overheads(1.0, 0.0, 0.0, None), Overheads(0.0, 0.0, 0.0, STEP_MOMENT)]
    assert first_iteration_allocated(terms, params, moments, [100e9, 50e9]) == 100e9 - lazy
    assert first_iteration_allocated(terms, params, moments, [lazy + 1e9, 50e9]) == 50e9


def test_bridge_fp8_sft_first_iteration_peaks_at_the_first_step():
    """Megatron-Bridge's Llama-3-70B FP8-CS SFT perf recipe (TP4 PP4 VPP5 DP2, bf16 main grads): the steady
    backward peak holds the moments; the first iteration's peak is its step moment (states, the fp32 copies of
    the bf16 grad shard, the fixed overhead), below the steady one by more than a fifth."""
    j = job("llama-3-70b", "megatron-bridge", 32, precision="fp8")
    plan = Plan(tp=4, pp=4, vpp=5, dp=2, sequence_parallel=True, fp8_recipe="tensorwise", grad_reduce_in_fp32=False)
    report = estimate_memory(j, plan)
    terms, _ = stage0(j, plan)
    s = report.stages[0]
    step = s.weights_bytes + s.gradients_bytes + s.optimizer_bytes + terms.other_fixed \
        + s.detail["optimizer_step_temporaries"]
    assert s.detail["first_iteration_allocated_peak"] == pytest.approx(step, abs=8)
    assert s.detail["first_iteration_allocated_peak"] < 0.8 * s.detail["allocated_peak"]


# --------------------------------------------------------------------------- fp8: the out-projection's saved input


def test_out_projection_keeps_an_fp8_copy_only_under_delayed_scaling_in_megatron():
    """Megatron's attention.py sets save_original_input on linear_proj for every fp8 recipe but delayed: the
    out-projection then saves the bf16 attention output the kernel keeps anyway, not a second, fp8 copy. torchao's
    Float8Linear (torchtitan) saves bf16 inputs under every recipe."""
    from meshplan.arithmetic.memory_states import fp8_out_proj_copy, with_precision

    def copy(framework: str, recipe: str | None, precision: str = "fp8") -> bool:
        j = job("llama-3.1-8b", framework, 8, precision=precision)
        p = Plan(tp=2, dp=4, fp8_recipe=recipe)
        return fp8_out_proj_copy(j, p, with_precision(j, p)[1])

    assert copy("megatron-bridge", "delayed") and copy("megatron-core", "delayed")
    assert not copy("megatron-bridge", "tensorwise") and not copy("megatron-core", "mxfp8")
    assert not copy("megatron-core", None, "bf16") and not copy("torchtitan", "tensorwise")


def test_the_fp8_copy_is_one_byte_per_attention_output_element():
    from meshplan.arithmetic.activations import Layout, layer_activations, shape_of

    arch = job("llama-3-70b", "megatron-bridge", 32).model
    lay = Layout(tokens=4096, seq_kv=4096, tp=4, sp=True, etp=1, flash=True, dropout=False, swiglu_unfused=False,
                 fp8=True)
    shape = shape_of(arch)
    without = layer_activations(shape, lay, False, "none")["attention"]
    with_copy = layer_activations(shape, lay._replace(fp8_out_proj_copy=True), False, "none")["attention"]
    assert with_copy - without == 4096 * 64 * 128 / 4
