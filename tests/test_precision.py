"""The precision knobs: optimizer_state_dtype, fp8_param_gather, grad_reduce_in_fp32 and fp8_recipe, in bytes
(memory_states.with_precision, cards/memory.yaml precision), in the estimate and through render and parse."""

from __future__ import annotations

import pytest

from meshplan.adapters.parse import parse_plan
from meshplan.adapters.render import render
from meshplan.arithmetic.memory_states import bytes_per_param, with_precision
from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

L8 = dict(model="llama-3.1-8b", num_gpus=8)


def states(**fields):
    job, plan = resolve(Request(**{**L8, **fields}))
    return job, plan, with_precision(job, plan)


@pytest.mark.parametrize("fields,per_param", [
    ({}, 2 + 4 + 12 / 8),  # Megatron's 6 + 12/d
    # precision-aware optimizer, bf16 moments: the fp32 master kept as 16-bit remainders (store_param_remainders)
    ({"optimizer_state_dtype": "bf16"}, 2 + 4 + (2 + 4) / 8),
    ({"optimizer_state_dtype": "fp8"}, 2 + 4 + (2 + 2) / 8),
    ({"optimizer_state_dtype": "bf16", "grad_reduce_in_fp32": False}, 2 + 2 + (2 + 4) / 8),  # bf16 grad buffer
    ({"grad_reduce_in_fp32": True}, 2 + 4 + 12 / 8),  # Megatron's default, explicit
    # fp8 with current scaling: Megatron-Core manages an fp32 master (no remainders)
    ({"optimizer_state_dtype": "bf16", "precision": "fp8", "fp8_recipe": "tensorwise"}, 2 + 4 + (4 + 4) / 8),
    ({"optimizer_state_dtype": "bf16", "precision": "fp8", "fp8_recipe": "delayed"}, 2 + 4 + (2 + 4) / 8),
    # fp8 primary weights: TE's FusedAdam rebuilds the master from bf16 weights only, so it stays fp32
    ({"optimizer_state_dtype": "bf16", "precision": "fp8", "fp8_param_gather": True}, 2 + 4 + (4 + 4) / 8),
])
def test_model_state_bytes_per_parameter(fields, per_param):
    _, _, (_, _, tensors) = states(**fields)
    assert bytes_per_param(tensors, 8) == pytest.approx(per_param)


@pytest.mark.parametrize("fields,fp8_bytes", [
    ({"fp8_recipe": "delayed"}, 2),  # Hopper: row-wise + transposed copy
    ({}, 2),  # Megatron-Core's default recipe, delayed
    ({"fp8_recipe": "tensorwise", "gpu": "b200"}, 1),  # Blackwell runs any layout: one copy
    ({"fp8_recipe": "mxfp8", "gpu": "b200"}, 2 + 2 / 32),  # both directions, one E8M0 scale per 32
    ({"fp8_recipe": "blockwise"}, 2),
    ({"fp8_recipe": "tensorwise", "fp8_param_gather": True}, 2 - 2),  # fp8 primary weights replace the bf16 ones
    ({"fp8_recipe": "tensorwise", "fp8_param_gather": True, "gpu": "b200"}, 1 - 2),
])
def test_fp8_weight_bytes_per_linear_parameter(fields, fp8_bytes):
    _, _, (_, conv, _) = states(precision="fp8", **fields)
    assert conv.fp8_weight_bytes == pytest.approx(fp8_bytes)


def test_fsdp2_fp8_all_gather_halves_the_prefetched_unit():
    _, _, (_, base, _) = states(framework="torchtitan", precision="fp8", fp8_recipe="tensorwise")
    _, _, (_, gathered, _) = states(framework="torchtitan", precision="fp8", fp8_recipe="tensorwise",
                                    fp8_param_gather=True)
    # 0.3.0 prefetches nothing in the backward (the chunked loss clears FSDP's order); its running unit is fp8 too
    assert (base.prefetched_bytes, gathered.prefetched_bytes) == (0, 0)
    assert (base.unsharded_param_bytes, gathered.unsharded_param_bytes) == (2, 1)
    _, _, (_, base, _) = states(framework="torchtitan", framework_version="0.2", precision="fp8",
                                fp8_recipe="tensorwise")
    _, _, (_, gathered, _) = states(framework="torchtitan", framework_version="0.2", precision="fp8",
                                    fp8_recipe="tensorwise", fp8_param_gather=True)
    assert (base.prefetched_bytes, gathered.prefetched_bytes) == (2, 1)
    assert base.fp8_weight_bytes == gathered.fp8_weight_bytes == 0  # torchao casts per call: no copy kept


def test_estimate_moves_by_the_formula():
    """Per stage: the optimizer bytes fall by (8 - 4) moments + (4 - 2) master per sharded parameter, the gradient
    buffer by 2 per parameter, and nothing else moves."""
    fields = dict(model="llama-3.1-70b", num_gpus=64, tp=8, pp=2)
    base = estimate_memory(*resolve(Request(**fields)))
    low = estimate_memory(*resolve(Request(**fields, optimizer_state_dtype="bf16", grad_reduce_in_fp32=False)))
    for a, b in zip(base.stages, low.stages, strict=True):
        params = a.detail["params_on_gpu"]
        assert a.optimizer_bytes - b.optimizer_bytes == pytest.approx(params * 6 / 4, rel=1e-6)  # dp = 4
        assert a.gradients_bytes - b.gradients_bytes == pytest.approx(params * 2, rel=1e-6)
        assert a.activations_bytes == b.activations_bytes and a.weights_bytes == b.weights_bytes


def test_default_recipe_is_noted():
    job, _ = resolve(Request(**L8, precision="fp8", framework="megatron-bridge"))
    assert any(n.startswith("fp8_recipe not given: tensorwise") for n in job.notes)
    job, _ = resolve(Request(**L8, precision="fp8", fp8_recipe="delayed"))
    assert not any(n.startswith("fp8_recipe not given") for n in job.notes)


@pytest.mark.parametrize("framework,version,fields", [
    ("torchtitan", "0.2", dict(precision="fp8", fp8_recipe="tensorwise", fp8_param_gather=True,
                               grad_reduce_in_fp32=True)),
    ("torchtitan", "0.2", dict(precision="fp8", fp8_recipe="rowwise")),
    ("torchtitan", "0.2", dict(gpu="b200", precision="fp8", fp8_recipe="mxfp8")),
    ("megatron-bridge", None, dict(precision="fp8", fp8_recipe="blockwise", optimizer_state_dtype="fp8")),
])
def test_round_trip(framework, version, fields):
    job, plan = resolve(Request(**L8, framework=framework, **fields))
    result = render(framework, job, plan, version=version)
    parsed = parse_plan(framework, result.variant, result.text, job.model.num_layers)
    expected = plan.model_dump()
    assert {k: expected[k] for k in parsed} == parsed
    assert "fp8_recipe" in parsed


def test_render_refuses_what_a_version_or_preset_lacks():
    job, plan = resolve(Request(**L8, framework="torchtitan", precision="fp8", fp8_recipe="tensorwise"))
    with pytest.raises(MeshplanError, match="cannot express precision=fp8"):
        render("torchtitan", job, plan)  # 0.3.0 picks fp8 in the registry config
    job, plan = resolve(Request(**L8, framework="megatron-bridge", precision="fp8", fp8_recipe="delayed",
                                fp8_param_gather=False))
    with pytest.raises(MeshplanError, match="preset") as info:
        render("megatron-bridge", job, plan, variant="run_recipe")
    assert "bf16_with_fp8_delayed_scaling_mixed" in info.value.fix
    text = render("megatron-bridge", job, plan).text  # the python variant sets the fields themselves
    assert "cfg.mixed_precision = get_mixed_precision_config('bf16_with_fp8_delayed_scaling_mixed')" in text
    assert "cfg.mixed_precision.fp8_param_gather = False" in text
    job, plan = resolve(Request(**L8, precision="fp8"))
    assert "--fp8-recipe delayed" in render("megatron-core", job, plan).text  # the card's default, written out


def test_bridge_presets_keep_fp8_weights_by_default():
    """Left out, fp8_param_gather is Megatron-Bridge's preset's: on for tensorwise (its fp8 weights replace the bf16
    weight and its cache), off for blockwise; Megatron-Core's default is off."""
    _, _, (_, tensorwise, _) = states(framework="megatron-bridge", precision="fp8", fp8_recipe="tensorwise")
    _, _, (_, blockwise, _) = states(framework="megatron-bridge", precision="fp8", fp8_recipe="blockwise")
    _, _, (_, core, _) = states(precision="fp8", fp8_recipe="tensorwise")
    assert (tensorwise.fp8_weight_bytes, blockwise.fp8_weight_bytes, core.fp8_weight_bytes) == (0, 2, 2)
    job, plan = resolve(Request(**L8, framework="megatron-bridge", precision="fp8", fp8_recipe="tensorwise"))
    text = render("megatron-bridge", job, plan).text
    assert "get_mixed_precision_config('bf16_with_fp8_current_scaling_mixed')" in text
    assert "fp8_param_gather" not in text  # the preset's own
