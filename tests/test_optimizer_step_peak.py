"""The optimizer step as a moment of its own (issue 24 item 4): what each implementation allocates inside
optimizer.step() (cards/memory.yaml optimizer_steps, memory_states.optimizer_step_temporaries), which one each
framework's engine builds on CUDA (the framework cards' optimizer_step), the step moment against the backward's in
estimate_memory, and the allocated peak found at its own moment (fsdp_walk.fsdp_allocated_peak,
memory.stage_allocated)."""

from __future__ import annotations

import pytest

from meshplan.arithmetic.memory_states import (
    decoupled_grads,
    memory_card,
    optimizer_fp8_recipe,
    optimizer_implementation,
    optimizer_step_temporaries,
    with_precision,
)
from meshplan.estimate.fsdp_walk import FsdpUnit, fsdp_allocated_peak, fsdp_step_peak
from meshplan.estimate.memory import estimate_memory, stage_allocated
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.resolve import carry_cards, resolve
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request


def job(model: str, framework: str, gpus: int, seq: int = 4096, layers: int | None = None) -> Job:
    arch = resolve(Request(model=model, framework=framework))[0].model
    if layers is not None:
        moe = arch.moe.model_copy(update={"moe_layers": []}) if arch.moe else None
        arch = arch.model_copy(update={"num_layers": layers, "moe": moe, "num_mtp_layers": 0})
    return carry_cards(Job(model=arch, gpu=get_gpu("h100"), num_gpus=gpus, gpus_per_node=8, seq_length=seq,
                           global_batch_size=gpus, framework=framework))


def steps():
    return memory_card().optimizer_steps


def tensors(framework: str, zero_stage: int, **plan):
    return with_precision(job("llama-3.1-8b", framework, 8), Plan(dp=8, zero_stage=zero_stage, **plan))[2]


# --------------------------------------------------------------------------- per implementation, by hand


def test_foreach_holds_one_fp32_copy_of_every_stepped_parameter():
    """torch's _multi_tensor_adam: _foreach_sqrt(exp_avg_sqs) allocates one tensor per parameter in the moments'
    dtype (fp32: the fsdp2 presets' 8 B of m, v over two buffers), all at once."""
    fsdp = tensors("verl", 3)
    assert optimizer_step_temporaries(steps()["foreach"], fsdp, stepped=1000, largest_tensor=10,
                                      zero_stage=3) == 4 * 1000


def test_fused_allocates_nothing_and_the_loop_two_copies_of_its_largest_tensor():
    fsdp = tensors("torchtitan", 3)
    assert optimizer_step_temporaries(steps()["fused"], fsdp, stepped=1000, largest_tensor=10, zero_stage=3) == 0
    assert optimizer_step_temporaries(steps()["for_loop"], fsdp, stepped=1000, largest_tensor=10,
                                      zero_stage=3) == 2 * 4 * 10


def test_megatron_copies_the_main_grads_only_when_they_are_16_bit():
    """distrib_optimizer.py _copy_model_grads_to_main_grads: .float() of an fp32 grad buffer is the buffer itself;
    of a bf16 one (--grad-reduce-in-bf16) a new fp32 copy of the shard."""
    step = steps()["megatron_distributed"]
    assert optimizer_step_temporaries(step, tensors("megatron-core", 1), stepped=1000, largest_tensor=10,
                                      zero_stage=1) == 0
    bf16 = tensors("megatron-core", 1, grad_reduce_in_fp32=False)
    assert optimizer_step_temporaries(step, bf16, stepped=1000, largest_tensor=10, zero_stage=1) == 4 * 1000


def test_megatron_precision_aware_optimizer_reads_the_16_bit_grads_without_a_copy():
    """distrib_optimizer.py _copy_model_grads_to_main_grads under use_precision_aware_optimizer_no_fp8_or_ds_fp8 hands
    FusedAdam the bf16 shard itself (decoupled_grad): no fp32 copy, where bf16 moments and bf16 weights or delayed
    fp8; under current-scaling fp8 (tensorwise) Megatron keeps its own fp32 master and copies the gradients."""
    step = steps()["megatron_distributed"]
    base = job("llama-3.1-8b", "megatron-core", 8)
    fp8 = base.model_copy(update={"precision": "fp8"})
    aware = dict(dp=8, zero_stage=1, grad_reduce_in_fp32=False, optimizer_state_dtype="bf16")
    assert decoupled_grads(base, Plan(**aware))
    assert decoupled_grads(fp8, Plan(**aware, fp8_recipe="delayed"))
    assert not decoupled_grads(fp8, Plan(**aware, fp8_recipe="tensorwise"))
    assert not decoupled_grads(base, Plan(dp=8, zero_stage=1, grad_reduce_in_fp32=False))
    bf16 = with_precision(base, Plan(**aware))[2]
    assert optimizer_step_temporaries(step, bf16, stepped=1000, largest_tensor=10, zero_stage=1,
                                      decoupled=True) == 0
    assert optimizer_step_temporaries(step, bf16, stepped=1000, largest_tensor=10, zero_stage=1) == 4 * 1000
    # the fp32 master as 16-bit remainders takes the same predicate: only where FusedAdam keeps the master
    masters = {t.bytes for t in bf16 if t.role == "master"}
    tensorwise = with_precision(fp8, Plan(**aware, fp8_recipe="tensorwise", fp8_param_gather=False))[2]
    assert masters == {2} and {t.bytes for t in tensorwise if t.role == "master"} == {4}


def test_precision_aware_step_moment_holds_no_gradient_copy_where_the_optimizer_config_holds_no_recipe():
    """The estimate's step moment: Megatron-Core (Megatron-LM's OptimizerConfig takes args.fp8_recipe, "delayed")
    with bf16 moments and bf16 gradients allocates nothing in the step; with fp32 moments the fp32 gradient copy is
    there. Megatron-Bridge's MixedPrecisionConfig hands its "tensorwise" to the OptimizerConfig in a bf16 run too, so
    there Megatron keeps the fp32 master and copies every gradient shard to fp32: 4 B per stepped parameter."""
    def estimate(framework, **plan):
        req = Request(model="llama-3.1-8b", framework=framework, gpu="h100", num_gpus=8, seq_length=4096,
                      global_batch_size=8, micro_batch_size=1, tp=1, pp=1, dp=8, zero_stage=1,
                      grad_reduce_in_fp32=False, **plan)
        return estimate_memory(*resolve(req)).stages[0]

    def step_bytes(framework, **plan):
        return estimate(framework, **plan).detail.get("optimizer_step_temporaries", 0)
    assert step_bytes("megatron-core", optimizer_state_dtype="bf16") == 0
    assert step_bytes("megatron-core") > 0
    bridge = estimate("megatron-bridge", optimizer_state_dtype="bf16")
    stepped = bridge.detail["params_on_gpu"] / 8  # the distributed optimizer's dp shard
    assert bridge.detail["optimizer_step_temporaries"] == pytest.approx(4 * stepped, rel=1e-3)
    # its master is the fp32 shard Megatron keeps (4 B), not FusedAdam's 16-bit remainders (2 B): 4 + 2 + 2 per
    # parameter of the shard beside Megatron-Core's 2 + 2 + 2
    core = estimate("megatron-core", optimizer_state_dtype="bf16")
    assert bridge.optimizer_bytes - core.optimizer_bytes == pytest.approx(2 * stepped, rel=1e-3)


def test_bridge_hands_its_mixed_precision_recipe_to_the_optimizer_config():
    """Megatron-Bridge's MixedPrecisionConfig.setup writes its fp8_recipe ("tensorwise" by default) into Megatron-Core's
    OptimizerConfig whatever the precision (the card's defaults.fp8_recipe_reaches_optimizer), so a bf16 run's
    precision-aware optimizer takes the non-decoupled path; a delayed-scaling fp8 run stays decoupled, and
    Megatron-Core's own bf16 run hands none over (its default recipe is delayed anyway)."""
    aware = dict(dp=8, zero_stage=1, grad_reduce_in_fp32=False, optimizer_state_dtype="bf16")
    bridge = job("llama-3.1-8b", "megatron-bridge", 8)
    core = job("llama-3.1-8b", "megatron-core", 8)
    assert optimizer_fp8_recipe(bridge, Plan(**aware)) == "tensorwise"
    assert not decoupled_grads(bridge, Plan(**aware))
    assert optimizer_fp8_recipe(core, Plan(**aware)) is None and decoupled_grads(core, Plan(**aware))
    fp8 = bridge.model_copy(update={"precision": "fp8"})
    assert decoupled_grads(fp8, Plan(**aware, fp8_recipe="delayed"))
    assert not decoupled_grads(fp8, Plan(**aware, fp8_recipe="tensorwise"))


def test_deepspeed_flattens_and_upcasts_per_group_capped_by_zero3_sub_groups():
    """16-bit flat copy 2 + fp32 copy 4 of the partition's gradients; ZeRO-3 steps sub groups of 1e9 elements."""
    step = steps()["deepspeed_zero"]
    ds = tensors("deepspeed", 2)
    assert optimizer_step_temporaries(step, ds, stepped=3e9, largest_tensor=10, zero_stage=2) == 6 * 3e9
    assert optimizer_step_temporaries(step, ds, stepped=3e9, largest_tensor=10, zero_stage=3) == 6 * 1e9
    assert optimizer_step_temporaries(step, ds, stepped=5e8, largest_tensor=10, zero_stage=3) == 6 * 5e8


def test_each_engine_names_the_implementation_it_builds():
    def impl(framework, zero_stage):
        return optimizer_implementation(job("llama-3.1-8b", framework, 8), Plan(dp=8, zero_stage=zero_stage))

    assert impl("verl", 3) == impl("skyrl", 3) == "foreach"  # AdamW without foreach/fused, on CUDA
    assert impl("verl", 1) == impl("megatron-core", 1) == impl("megatron-bridge", 1) == "megatron_distributed"
    assert impl("torchtitan", 3) == impl("kempnerforge", 3) == "fused"
    assert impl("deepspeed", 2) == "deepspeed_zero"


# --------------------------------------------------------------------------- the step moment in the estimate


def test_one_gpu_verl_allocates_most_at_the_optimizer_step():
    """One GPU, nothing sharded, 8,192 tokens without recompute: params 4 + grads 4 + moments 8 + the foreach step's
    4 B per parameter is the allocated peak (the loss moment has every gradient absent: set to None each step), while
    the reserved peak stays the loss's, whose churning activations carry the allocator's reserve."""
    report = estimate_memory(job("llama-3.1-8b", "verl", 1, seq=8192, layers=4),
                             Plan(dp=1, zero_stage=3, micro_batch_size=1, recompute="none"))
    stage = report.stages[0]
    params = stage.detail["params_on_gpu"]
    card = memory_card()
    assert stage.detail["optimizer_step_temporaries"] == int(4 * params)
    fixed = card.fixed_overhead_bytes + card.cuda_context_bytes
    assert stage_allocated(stage) == pytest.approx(20 * params + fixed, abs=8)
    assert stage.activations_bytes > 0  # the reported (reserved) peak is the backward's ...
    assert stage_allocated(stage) > stage.total_bytes - stage.detail["allocator_reserve"]  # ... not the allocated one
    assert any(a.startswith("Allocated peak") and "optimizer step" in a for a in report.assumptions)


def test_the_step_moment_decides_the_reserved_peak_when_activations_are_small():
    """Short sequences on one GPU: the step's moment is the reported peak, with no activations and its temporaries
    under other (with the allocator's reserve over them)."""
    report = estimate_memory(job("llama-3.1-8b", "verl", 1, seq=256, layers=4),
                             Plan(dp=1, zero_stage=3, micro_batch_size=1, recompute="full"))
    stage = report.stages[0]
    temp = stage.detail["optimizer_step_temporaries"]
    card = memory_card()
    assert stage.activations_bytes == 0 and stage.detail["gradients_absent_at_peak"] == 0
    assert stage.detail["allocator_reserve"] == int(card.allocator_reserve_fraction * temp)
    assert stage.other_bytes == int(card.fixed_overhead_bytes + card.cuda_context_bytes + temp
                                    + stage.detail["allocator_reserve"])
    assert any(a.startswith("Optimizer step (foreach") and "peak stage's peak" in a for a in report.assumptions)


def test_fused_engines_gain_no_step_temporaries():
    report = estimate_memory(job("llama-3.1-8b", "torchtitan", 8, layers=4),
                             Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="full"))
    assert "optimizer_step_temporaries" not in report.stages[0].detail


def test_deepspeed_zero2_step_moment_with_short_sequences():
    """DeepSpeed ZeRO-2 on 8 GPUs with 256 tokens: 16-bit weights 2 + grads 2/8 + optimizer 12/8 and the step's
    6/8 B per parameter of flat and fp32 gradient copies outweigh the activations."""
    report = estimate_memory(job("llama-3.1-8b", "deepspeed", 8, seq=256),
                             Plan(dp=8, zero_stage=2, micro_batch_size=1, recompute="full"))
    stage = report.stages[0]
    assert stage.detail["optimizer_step_temporaries"] == int(6 * stage.detail["params_on_gpu"] / 8)
    assert stage.activations_bytes == 0  # the step's moment


# --------------------------------------------------------------------------- the allocated peak at its own moment


def test_allocated_peak_found_at_its_own_moment():
    """With the freed gradients kept reserved, the reserved basis favours the loss moment (every gradient absent
    costs it nothing), while allocated bytes are highest at layer 1's reduce-scatter, with the output unit's large
    gradients already allocated: two moments, each the peak on its own basis."""
    conv = memory_card().conventions["fsdp2"].model_copy(update={
        "unsharded_param_bytes": 2, "gathered_layers": 1, "gathered_bytes": 6, "prefetched_bytes": 2,
        "retained_reduce_bytes": 4, "output_reduce_in_loss": False, "freed_grads_stay_reserved": True})
    units = [FsdpUnit("embedding", 10, 1, grads=1), FsdpUnit("layer 0", 20, 100, grads=2),
             FsdpUnit("layer 1", 1000, 300, grads=100), FsdpUnit("output", 5, 6000, grads=1000, loss=True)]
    reserved = fsdp_step_peak(conv, units, 0, grads_absent=True, reserve_fraction=0.0)
    allocated = fsdp_allocated_peak(conv, units, 0, grads_absent=True)
    assert reserved.name == "output backward"  # 6,401 + 10, its 1,103 absent still reserved
    assert allocated.name == "layer 1 reduce-scatter"  # 101 + 6,040 - 103 = 6,038 against 6,411 - 1,103
    assert allocated.activations + allocated.transient - allocated.absent_grads == 6038


def test_verl_checkpointed_step_reads_the_allocated_peak_late_in_the_backward():
    """Llama-3.1-8B's 32 layers on 8 GPUs, full recompute: the reserved peak is the loss (every sharded gradient
    absent but reserved), the allocated one the root unit's reduce-scatter at the end of the backward, with every
    gradient allocated beside its 6 B per parameter; the fit figure under expandable segments reads the latter."""
    report = estimate_memory(job("llama-3.1-8b", "verl", 8),
                             Plan(dp=8, zero_stage=3, micro_batch_size=1, recompute="full",
                                  expandable_segments=True))
    stage = report.stages[0]
    at_reserved = stage.total_bytes - stage.detail["allocator_reserve"]
    assert stage_allocated(stage) > at_reserved
    assert any(a.startswith("Allocated peak") and "end of backward" in a for a in report.assumptions)
    assert report.fit_bytes == stage_allocated(stage) + memory_card().expandable_segments_slack_bytes


def test_fake_tensor_steps_with_cudas_foreach_step():
    """Re-reads verl's FSDP2 steps counted under FakeTensorMode with AdamW's foreach step forced, as CUDA runs it
    (bench/data/fake_tensor_hf.json, bench/fake_tensor_hf.py), and recomputes meshplan's allocated peak at its own
    moment: the one-GPU steps, where the optimizer step decides, to the byte's 0.1%; every step within 3%."""
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    from fake_tensor_hf import POLICIES, meshplan_step

    data = json.loads((root / "bench" / "data" / "fake_tensor_hf.json").read_text())
    single = [row for row in data["steps"] if row["world"] == 1]
    assert len(single) == 4 and all(row["foreach"] for row in data["steps"])
    for row in data["steps"]:
        ours = meshplan_step(row["model"], row["layers"], row["tokens"], POLICIES[row["policy"]], row["world"],
                             row.get("reduce", "fp32"))  # the step's reduce dtype, as the row was counted
        diff = 100 * (ours - row["framework_peak_bytes"]) / row["framework_peak_bytes"]
        assert abs(diff) <= (0.1 if row["world"] == 1 else 3.0), (row["case"], row["policy"], diff)


@pytest.mark.slow
def test_harness_counts_the_foreach_step_as_the_estimate_does():
    """Runs verl's FSDP2 step of a 4-layer Llama-3.1-8B cut on one GPU in transformers' model code under
    FakeTensorMode (the cached torch 2.13 CPU venv), with AdamW's foreach step forced (CUDA's default) and with the
    CPU's default per-tensor loop: the foreach peak is meshplan's allocated peak (the optimizer step's moment), and
    the loop's is lower by the foreach copy less two copies of the largest tensor (the embedding table)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "bench"))
    from fake_tensor_hf import card_config, meshplan_step, served_harness

    cases = [{"kind": "step", "case": "llama", "model": "llama-3.1-8b", "config": card_config("llama-3.1-8b"),
              "num_layers": 4, "tokens": 2048, "override": {}, "policy": "full", "world": 1, "foreach": foreach}
             for foreach in (True, None)]
    foreach, loop = (r["peak"]["Total"] for r in served_harness(cases)["results"])
    ours = meshplan_step("llama-3.1-8b", 4, 2048, "full", 1)
    assert ours == pytest.approx(foreach, rel=1e-3)
    arch = resolve(Request(model="llama-3.1-8b", framework="verl"))[0].model
    params = foreach / 20  # 4 + 4 + 8 + 4 B per parameter at the step
    assert foreach - loop == pytest.approx(4 * params - 2 * 4 * arch.vocab_size * arch.hidden_size, rel=1e-3)


def test_megatron_cpu_offload_keeps_hybrid_optimizer_fp32_states_on_the_gpu_share():
    """Megatron's optimizer_cpu_offload builds HybridDeviceOptimizer (megatron-core 24bad8e677 optimizer/__init__.py,
    cpu_offloading/hybrid_optimizer.py) with none of the precision-aware kwargs: the share it steps on the GPU keeps an
    fp32 clone of each bf16 shard (4 B, made at construction), FusedAdam's default fp32 moments (8 B, not the plan's
    bf16) and an fp32 copy of each gradient shard (4 B, kept between steps), 16 B per parameter of that share; the
    gradients are decoupled under offload whatever the fp8 recipe (use_precision_aware_optimizer_no_fp8_or_ds_fp8), so
    Megatron makes no step copy of its own. Without offload the precision-aware bytes stay: 2 B remainders + 4 B."""
    base = job("llama-3.1-8b", "megatron-core", 8)
    fp8 = base.model_copy(update={"precision": "fp8"})
    aware = dict(dp=8, zero_stage=1, grad_reduce_in_fp32=False, optimizer_state_dtype="bf16")
    half = dict(aware, optimizer_offload=True, optimizer_offload_fraction=0.5)
    assert decoupled_grads(fp8, Plan(**half, fp8_recipe="tensorwise"))
    optimizer = {t.role: t.bytes for t in with_precision(base, Plan(**half))[2] if t.tensor_class == "optimizer"}
    assert optimizer == {"master": 4, "moments": 8, "grad_copy": 4}
    on_gpu = {t.role: t.bytes for t in with_precision(base, Plan(**aware))[2] if t.tensor_class == "optimizer"}
    assert on_gpu == {"master": 2, "moments": 4}
    # an fp32 gradient buffer: grad.to(fp32) is the buffer's own shard, no copy
    fp32_grads = with_precision(base, Plan(**{**half, "grad_reduce_in_fp32": True}))[2]
    assert {t.role: t.bytes for t in fp32_grads if t.tensor_class == "optimizer"} == {"master": 4, "moments": 8}
    step = steps()["megatron_distributed"]
    assert optimizer_step_temporaries(step, with_precision(base, Plan(**half))[2], stepped=1000, largest_tensor=10,
                                      zero_stage=1, decoupled=True) == 0

    def stage(**plan):
        req = Request(model="llama-3.1-8b", framework="megatron-core", gpu="h100", num_gpus=8, seq_length=4096,
                      global_batch_size=8, micro_batch_size=1, tp=1, pp=1, dp=8, zero_stage=1,
                      grad_reduce_in_fp32=False, optimizer_state_dtype="bf16", **plan)
        return estimate_memory(*resolve(req)).stages[0]

    shard = stage().optimizer_bytes / 6  # parameters this GPU's optimizer steps: 2 + 4 B each without offload
    half_offloaded = stage(optimizer_offload=True, optimizer_offload_fraction=0.5)
    assert half_offloaded.optimizer_bytes == pytest.approx(16 * shard / 2)
    assert stage(optimizer_offload=True).optimizer_bytes == 0
