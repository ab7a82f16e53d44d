"""A layout's memory terms shared across the plans of a search (estimate/memory.py layout_terms, micro_batch_terms;
memory_stage.stage_states): the memo leaves out MEMORY_PER_PLAN_FIELDS, so the layout's terms and its stages' model
states must not read them; inside a shared_layers scope each layout is resolved once and the estimates are the same
numbers as without the scope."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import fields

import pytest
from read_watch import ReadPlan

from meshplan.arithmetic.memory_states import optimizer_implementation, with_precision
from meshplan.arithmetic.offload import offload_plan
from meshplan.core.errors import MeshplanError
from meshplan.estimate import memory, memory_stage
from meshplan.estimate.layer_records import scope_memo, shared_layers
from meshplan.estimate.memory import (
    ENGINE_FIELDS,
    _layer_layout,
    _layout_terms,
    estimate_memory,
    layout_terms,
    memory_fit,
    memory_terms,
)
from meshplan.estimate.memory_stage import (
    _plain_stage_fit,
    _stage_states,
    held_activations,
    layer_classes,
    stage_fit,
    stage_states,
    states_key,
)
from meshplan.estimate.memory_terms import (
    MEMORY_PER_PLAN_FIELDS,
    PIPELINE_SHAPE_FIELDS,
    STATES_BY_SIZE_FIELDS,
    STATES_UNREAD_FIELDS,
    MemoryTerms,
    stage_params,
)
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


def test_memo_resolves_each_layout_once_and_only_inside_a_scope(record_calls):
    job, plan = resolved(CASES[0])
    calls = record_calls(memory, "_layout_terms")
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
    # at least four estimated (verl's FSDP engine sets no selective recompute, method or modules: RC006, RC003, RC004)
    assert sum(isinstance(r, dict) for r in plain) >= 4
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
            assert held_activations(terms, rank, chunks, False) == (acts.bytes, acts.held, {})  # modes unasked


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_terms_built_by_copy_are_the_constructors_record(case):
    """memory.built_terms fills MemoryTerms by copy from its LayoutTerms: every field and nothing else, the record the
    dataclass's constructor makes of the same values; and the layer's Layout made from the layout's one of 0 tokens
    is the one _layer_layout makes of the plan with its tokens (no other field of it reads the micro-batch or the
    recompute), inside a scope and without."""
    job, plan = resolved(case)
    names = {f.name for f in fields(MemoryTerms)}
    for scope in (False, True):
        with shared_layers() if scope else nullcontext():
            for update in ({}, *({name: value} for name, value in PERTURBED.items()), {"micro_batch_size": 4}):
                terms = memory_terms(job, plan.model_copy(update=update), [])
                assert set(vars(terms)) == names, update
                assert MemoryTerms(**{name: getattr(terms, name) for name in names}) == terms, update
                assert terms.lay == _layer_layout(job, terms.plan, terms.conv, terms.tokens), update


def test_layouts_with_the_same_layer_layout_share_its_activations():
    """One layer's activations per kind and mode (memory.per_kind_activations) depend on the model's Shape and the
    Layout only: two layouts that differ in pp, dp and ZeRO stage but not in the layer's layout share them."""
    job, plan = resolved(CASES[0])
    one = memory_terms(job, plan, [])
    other = memory_terms(job, plan.model_copy(update={"pp": 1, "dp": 4, "zero_stage": 2}), [])
    assert one.lay == other.lay
    assert one.per_kind is other.per_kind


# a value other than the resolved one for every pipeline-shape field (memory_terms.PIPELINE_SHAPE_FIELDS)
PIPELINE_VARIANTS = {"vpp": 2, "pipeline_schedule": "gpipe", "pipeline_microbatches": 4, "first_stage_layers": 3,
                     "last_stage_layers": 5, "pipeline_layout": None, "account_for_embedding": True,
                     "account_for_loss": True}


def test_pipeline_variants_cover_every_pipeline_shape_field():
    assert set(PIPELINE_VARIANTS) == set(PIPELINE_SHAPE_FIELDS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_stage_states_shared_across_ranks_and_pipeline_shapes_are_each_stages_own(case):
    """Inside a scope a stage's model states are kept per states_key, so stages of other ranks and of layouts that
    differ in a pipeline-shape field share them: each must equal the stage's own states computed afresh (if a term
    read a pipeline-shape field, or a layer's value the layer classes do not compare, some stage would differ)."""
    job, plan = resolved(case)
    variants = [plan, *(plan.model_copy(update={name: value}) for name, value in PIPELINE_VARIANTS.items())]
    variants += [plan.model_copy(update={"pp": 1, "vpp": 1, "first_stage_layers": None, "last_stage_layers": None})]
    shared = 0
    with shared_layers():
        for p in variants:
            try:
                terms = memory_terms(job, p, [])
            except MeshplanError:  # a variant the layout cannot hold (an uneven split past the layers)
                continue
            for rank, chunks in enumerate(terms.pipeline.chunks):
                mine = stage_states(terms, rank, chunks)
                shared += mine.params.layers != stage_params(terms, rank, chunks).layers
                assert mine == _stage_states(terms, rank, chunks), (p.short(), rank)
    memo_sizes = []
    with shared_layers():
        for p in variants[:3]:
            terms = memory_terms(job, p, [])
            for rank, chunks in enumerate(terms.pipeline.chunks):
                stage_states(terms, rank, chunks)
        memo_sizes.append(len(scope_memo("stage_states")))
    assert shared == 0
    assert memo_sizes[0] < sum(len(memory_terms(job, p, []).pipeline.chunks) for p in variants[:3]) or plan.pp == 1


def test_states_key_tells_stages_with_other_layers_apart():
    job, plan = resolved(CASES[1])  # DeepSeek-V3: dense first layers, then MoE
    terms = memory_terms(job, plan, [])
    keys = [states_key(terms, rank, chunks) for rank, chunks in enumerate(terms.pipeline.chunks)]
    assert keys[1] == keys[2]  # two middle stages of 16 MoE layers
    assert len({keys[0], keys[1], keys[3]}) == 3  # the first (with the dense layers and the embedding), the last
    classes = layer_classes(job.model)
    assert classes[0] != classes[-1] and len(set(classes)) == 2


def test_stage_states_shared_across_layouts_of_other_depths_are_each_stages_own():
    """Layouts of 1 to 8 stages on one world (middle and last stages of the same layers, tied and untied
    embeddings, ZeRO stages): every stage's shared states are its own."""
    for model in ("gemma-2-27b", "llama-3.1-8b"):  # tied embeddings; untied
        job, base = resolve(Request(model=model, gpu="h100", num_gpus=16, tp=1, pp=2))
        with shared_layers():
            for pp in (1, 2, 4, 8):
                for zero in (1, 3):
                    plan = base.model_copy(update={"pp": pp, "dp": 16 // pp, "zero_stage": zero})
                    terms = memory_terms(job, plan, [])
                    for rank, chunks in enumerate(terms.pipeline.chunks):
                        assert stage_states(terms, rank, chunks) == _stage_states(terms, rank, chunks), (pp, rank)


# a value other than the resolved one for every field the states' key leaves out (memory_terms.STATES_UNREAD_FIELDS)
UNREAD_VARIANTS = {"cp_comm_type": "a2a", "moe_token_dispatcher": "flex", "moe_a2a_overlap": True,
                   "tp_comm_overlap": True, "attention_backend": "unfused", "dropout": True,
                   "expandable_segments": True, "grad_reduce_overlap": False}
# layouts of the same dp*cp (the sizes the states' key holds instead of cp and dp: STATES_BY_SIZE_FIELDS)
SIZE_VARIANTS = ({"cp": 2, "dp": 1}, {"cp": 1, "dp": 2})


def test_unread_variants_cover_every_unread_field():
    assert set(UNREAD_VARIANTS) == set(STATES_UNREAD_FIELDS)
    assert {name for update in SIZE_VARIANTS for name in update} == set(STATES_BY_SIZE_FIELDS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_states_key_leaves_out_the_fields_the_states_do_not_read(case):
    """If a stage's model states start reading one of STATES_UNREAD_FIELDS (or cp or dp other than through the
    layout's data-parallel sizes), take it out of that set: each such variant keys every stage as the plan does, and
    its states computed afresh are the plan's."""
    job, plan = resolved(case)
    terms = memory_terms(job, plan, [])
    keys = [states_key(terms, r, c) for r, c in enumerate(terms.pipeline.chunks)]
    states = [_stage_states(terms, r, c) for r, c in enumerate(terms.pipeline.chunks)]
    total = plan.cp * plan.dp
    variants = {**UNREAD_VARIANTS, **{f"size{i}": u for i, u in enumerate(SIZE_VARIANTS)}}
    for name, value in variants.items():
        update = {name: value} if name in UNREAD_VARIANTS else {"cp": value["cp"], "dp": total // value["cp"]}
        other = plan.model_copy(update=update)
        try:
            other_terms = memory_terms(job, other, [])
        except MeshplanError:  # a variant the framework does not run
            continue
        chunks = other_terms.pipeline.chunks
        assert [states_key(other_terms, r, c) for r, c in enumerate(chunks)] == keys, name
        assert [_stage_states(other_terms, r, c) for r, c in enumerate(chunks)] == states, name


def test_states_key_shares_layouts_of_the_same_dense_dp_and_tells_other_sizes_apart():
    job, plan = resolved(CASES[0])  # cp=2, dp=2
    terms = memory_terms(job, plan, [])
    swapped = memory_terms(job, plan.model_copy(update={"cp": 1, "dp": 4}), [])
    halved = memory_terms(job, plan.model_copy(update={"cp": 1, "dp": 2}), [])
    chunks = terms.pipeline.chunks[0]
    assert states_key(swapped, 0, chunks) == states_key(terms, 0, chunks)
    assert states_key(halved, 0, chunks) != states_key(terms, 0, chunks)  # dense_dp 2, not 4


FIT_VARIANTS = [{}, {"recompute": "selective"}, {"recompute": "full"}, {"micro_batch_size": 2},
                {"recompute": "full", "recompute_method": "block", "recompute_layers": 1},
                {"recompute": "full", "recompute_method": "uniform", "recompute_layers": 2},
                {"dropout": True}, {"dropout": False}, {"attention_backend": "unfused"}, {"vpp": 2},
                {"cp": 1, "dp": 4}, {"cp": 1, "dp": 4, "micro_batch_size": 2}, {"expandable_segments": True},
                {"zero_stage": 2}, {}]


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_stage_fits_shared_inside_a_scope_are_each_stages_own(case, record_calls):
    """Inside a scope a plain stage's fit (Megatron's: no FSDP2 walk) is kept per plain_fit_key, so plans of other
    layouts whose stages have the same states, chunks, held micro-batches and activation terms share it: every
    memory_fit inside the scope gives the numbers it gives without one (if the key left out something the fit reads,
    some variant would take another's figure), and the shared stages are evaluated fewer times."""
    job, plan = resolved(case)
    variants = [plan.model_copy(update=u) for u in FIT_VARIANTS]
    plain = [outcome(memory_fit, job, p, job.gpu.memory_bytes) for p in variants]
    calls = record_calls(memory_stage, "_plain_stage_fit")
    with shared_layers():
        assert [outcome(memory_fit, job, p, job.gpu.memory_bytes) for p in variants] == plain
        shared_calls = len(calls)
        for p in variants:  # each stage's kept fit is its own
            try:
                terms = memory_terms(job, p, [])
            except MeshplanError:
                continue
            for rank, chunks in enumerate(terms.pipeline.chunks):
                if not terms.offload.any and not memory_stage.walks(terms):
                    fresh = _plain_stage_fit(terms, stage_states(terms, rank, chunks), rank, chunks)
                    assert stage_fit(terms, rank, chunks) == fresh, (p.short(), rank)
    calls.clear()
    for p in variants:
        outcome(memory_fit, job, p, job.gpu.memory_bytes)
    assert shared_calls < len(calls)


ENGINE_CASES = [*CASES,
                dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, precision="fp8", fp8_recipe="delayed",
                     optimizer_state_dtype="bf16", torch_compile=True, grad_reduce_in_fp32=False),
                dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework="deepspeed", zero_stage=3,
                     optimizer_offload=True, param_offload=True)]


@pytest.mark.parametrize("case", ENGINE_CASES, ids=lambda c: f"{c['model']}-{c.get('framework', 'megatron-core')}")
def test_engine_terms_read_only_the_engine_fields(case):
    """memory.engine_terms keeps with_precision, offload_plan and optimizer_implementation per ENGINE_FIELDS: if one
    of them starts reading another plan field, add it there."""
    job, plan = resolved(case)
    reads = ReadPlan(plan)
    assert with_precision(job, reads) == with_precision(job, plan)
    assert offload_plan(job.card, reads) == offload_plan(job.card, plan)
    assert optimizer_implementation(job, reads) == optimizer_implementation(job, plan)
    assert reads.read <= set(ENGINE_FIELDS), reads.read - set(ENGINE_FIELDS)
    assert "zero_stage" in reads.read


def test_engine_terms_shared_inside_a_scope_by_the_engine_fields(record_calls):
    """Layouts of other degrees share the engine's terms inside a scope, and each is the one computed afresh; another
    ZeRO stage or precision knob is its own."""
    job, plan = resolved(CASES[0])
    calls = record_calls(memory, "with_precision")
    others = [plan.model_copy(update=u) for u in ({"pp": 1, "dp": 4}, {"tp": 4, "pp": 1, "cp": 2, "dp": 2})]
    with shared_layers():
        first = memory.engine_terms(job, plan)
        for other in others:
            assert memory.engine_terms(job, other) is first
        assert len(calls) == 1
        for update in ({"zero_stage": 0}, {"optimizer_state_dtype": "bf16"}, {"grad_reduce_in_fp32": False}):
            other = plan.model_copy(update=update)
            assert memory.engine_terms(job, other) is not first, update
            assert memory.engine_terms(job, other)[:3] == with_precision(job, other), update
