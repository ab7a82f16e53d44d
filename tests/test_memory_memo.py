"""A layout's memory terms shared across the plans of a search (estimate/memory.py layout_terms, micro_batch_terms;
memory_stage.stage_states): the memo leaves out MEMORY_PER_PLAN_FIELDS, so the layout's terms and its stages' model
states must not read them; inside a shared_layers scope each layout is resolved once and the estimates are the same
numbers as without the scope."""

from __future__ import annotations

import pytest

from meshplan.estimate import memory
from meshplan.estimate.layer_records import shared_layers
from meshplan.estimate.memory import _layout_terms, estimate_memory, layout_terms, memory_fit, memory_terms
from meshplan.estimate.memory_stage import held_activations, stage_states
from meshplan.estimate.memory_terms import MEMORY_PER_PLAN_FIELDS
from meshplan.request.resolve import resolve
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.request import Request

CASES = [
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2, cp=2, seq_length=8192),
    dict(model="deepseek-v3", gpu="h100", num_gpus=256, tp=2, pp=4, ep=32, etp=1, first_stage_layers=15,
         last_stage_layers=14, framework="megatron-bridge"),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2, framework="torchtitan"),
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, zero_stage=3, framework="verl", optimizer_offload=True),
]
# a value other than the resolved one for every field the memo leaves out
PERTURBED = {"micro_batch_size": 2, "recompute": "full", "recompute_layers": 2, "recompute_method": "uniform",
             "recompute_modules": ["mlp"], "selective_ac_option": "2"}


def resolved(case: dict):
    return resolve(Request(**case))


def test_perturbed_covers_every_left_out_field():
    assert set(PERTURBED) == set(MEMORY_PER_PLAN_FIELDS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_layout_terms_and_stage_states_read_no_left_out_field(case):
    """If a term starts reading one of these plan fields, take it out of MEMORY_PER_PLAN_FIELDS (the key then holds
    it): each field alone changes neither the layout's terms nor any stage's model states."""
    job, plan = resolved(case)
    base = _layout_terms(job, plan)
    terms = memory_terms(job, plan, [])
    states = [stage_states(terms, r, c) for r, c in enumerate(terms.pipeline.chunks)]
    for name, value in PERTURBED.items():
        other = plan.model_copy(update={name: value})
        assert _layout_terms(job, other) == base, name
        other_terms = memory_terms(job, other, [])
        assert [stage_states(other_terms, r, c) for r, c in enumerate(other_terms.pipeline.chunks)] == states, name


def test_layout_key_holds_the_fields_the_terms_read():
    job, plan = resolved(CASES[1])
    with shared_layers():
        first = layout_terms(job, plan)
        for name, value in {"tp": 4, "pp": 8, "ep": 16, "zero_stage": 0, "dp": 8,
                            "moe_a2a_overlap": True, "optimizer_state_dtype": "bf16"}.items():
            assert layout_terms(job, plan.model_copy(update={name: value})) is not first, name
        assert layout_terms(job, plan.model_copy(update={"recompute": "full", "micro_batch_size": 2})) is first
        other_job = job.model_copy(update={"seq_length": 2 * job.seq_length})
        assert layout_terms(other_job, plan) is not first  # per job


def test_memo_resolves_each_layout_once_and_only_inside_a_scope(monkeypatch):
    job, plan = resolved(CASES[0])
    calls = []

    def counted(j, p):
        calls.append(p)
        return _layout_terms(j, p)

    monkeypatch.setattr(memory, "_layout_terms", counted)
    variants = [plan.model_copy(update={"recompute": r, "micro_batch_size": b})
                for r in ("none", "selective", "full") for b in (1, 2)]
    for p in variants:
        memory_fit(job, p, job.gpu.memory_bytes)
    assert len(calls) == len(variants)  # no scope: nothing kept
    with shared_layers():
        for p in variants:
            memory_fit(job, p, job.gpu.memory_bytes)
    assert len(calls) == len(variants) + 1


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_estimates_inside_a_scope_are_the_same_numbers(case):
    job, plan = resolved(case)
    variants = [plan.model_copy(update=u) for u in (
        {}, {"recompute": "selective"}, {"recompute": "full"}, {"micro_batch_size": 2}, {},
        {"recompute": "full", "recompute_method": "block", "recompute_layers": 1},
        {"recompute": "full", "recompute_method": "uniform", "recompute_layers": 2},
        {"recompute": "selective", "recompute_modules": ["mlp", "core_attn"]})]
    plain = [outcome(estimate_memory, job, p) for p in variants]
    fits = [outcome(memory_fit, job, p, job.gpu.memory_bytes) for p in variants]
    assert sum(isinstance(r, dict) for r in plain) >= 5
    with shared_layers():
        assert [outcome(estimate_memory, job, p) for p in variants] == plain
        assert [outcome(memory_fit, job, p, job.gpu.memory_bytes) for p in variants] == fits


def outcome(estimate, *args):
    """The estimate's figures, or the rule that refused it (a variant a framework does not run)."""
    try:
        result = estimate(*args)
    except EstimateBlocked as exc:
        return exc.rule_id
    return result.model_dump() if hasattr(result, "model_dump") else result


def test_one_mode_activations_are_the_layer_by_layer_sums():
    """held_activations' one-mode path adds each layer's activations in order, as the per-layer walk does."""
    job, plan = resolved(CASES[1])
    for update in ({}, {"recompute": "selective"}, {"recompute": "full"}):
        terms = memory_terms(job, plan.model_copy(update=update), [])
        mode = "full" if terms.plan.recompute == "full" else terms.stored_mode
        for rank, chunks in enumerate(terms.pipeline.chunks):
            acts = held_activations(terms, rank, chunks)
            expected = 0.0
            for chunk, count in zip(chunks, acts.held, strict=True):
                chunk_bytes = 0.0
                for i in chunk:
                    chunk_bytes += terms.per_kind[(terms.table.moe[i], mode)]
                expected += count * chunk_bytes
            assert acts.bytes == expected
            assert acts.modes == {i: mode for chunk in chunks for i in chunk}


def test_layouts_with_the_same_layer_layout_share_its_activations():
    """One layer's activations per kind and mode (memory.per_kind_activations) depend on the model's Shape and the
    Layout only: two layouts that differ in pp, dp and ZeRO stage but not in the layer's layout share them."""
    job, plan = resolved(CASES[0])
    one = memory_terms(job, plan, [])
    other = memory_terms(job, plan.model_copy(update={"pp": 1, "dp": 4, "zero_stage": 2}), [])
    assert one.lay == other.lay
    assert one.per_kind is other.per_kind
