"""One layer's time shared across the plans of a search (estimate/layer_records.py: LayerKey, shared_layers,
memo_layer): the key leaves out PER_STEP_FIELDS, so layer_time must not read them; inside a scope each distinct key is
computed once and the estimates are the same numbers as without the scope; the scope is per context and dropped."""

from __future__ import annotations

import dataclasses

import pytest
from read_watch import ReadPlan

from meshplan import api
from meshplan.estimate import layer_records
from meshplan.estimate.layer_records import PER_STEP_FIELDS, DispatchPasses, layer_key, memo_layer, shared_layers
from meshplan.estimate.layer_time import layer_time
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.plan import LoraSpec
from meshplan.schema.request import Request

CASES = [
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2, cp=2, seq_length=8192),
    dict(model="deepseek-v3", gpu="h100", num_gpus=256, tp=2, pp=1, ep=32, etp=1, moe_a2a_overlap=True,
         framework="megatron-bridge"),
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, tp=2, pp=1, ep=4, etp=2, framework="megatron-core"),
]
# a value other than the resolved one for every field the key leaves out
PERTURBED = {"pp": 7, "vpp": 3, "dp": 5, "zero_stage": 3, "recompute": "full", "recompute_layers": 2,
             "recompute_method": "uniform", "first_stage_layers": 3, "last_stage_layers": 5,
             "pipeline_layout": "Et|tL", "account_for_embedding": True, "account_for_loss": True}


def contexts(case: dict):
    from meshplan.arithmetic.comm import links
    from meshplan.estimate import perf

    job, plan = resolve(Request(**case))
    cal = calibration(job.framework)
    peaks = perf._peaks(job, cal)
    m = max(1, job.global_batch_size // (plan.micro_batch_size * plan.dp))
    return job, plan, perf.layer_context(job, plan, cal, links(job.gpu, job.gpus_per_node, cal), peaks, m, None)


def test_perturbed_covers_every_left_out_field():
    assert set(PERTURBED) == set(PER_STEP_FIELDS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_layer_time_reads_no_per_step_field(case):
    """If a formula starts reading one of these plan fields, take it out of PER_STEP_FIELDS (the key then holds it)."""
    _, plan, ctx = contexts(case)
    moe_kinds = (False, True) if ctx.arch.moe is not None else (False,)
    for moe in moe_kinds:
        base = layer_time(ctx, moe)
        for name, value in PERTURBED.items():
            other = dataclasses.replace(ctx, plan=plan.model_copy(update={name: value}))
            assert layer_key(other, moe) == layer_key(ctx, moe)
            assert layer_time(other, moe) == base, name


def test_key_holds_the_plan_fields_the_layer_reads():
    _, plan, ctx = contexts(CASES[1])
    for name, value in {"tp": 4, "ep": 16, "etp": 2, "sequence_parallel": not plan.sequence_parallel,
                        "moe_token_dispatcher": "flex", "moe_a2a_overlap": False, "cp": 2}.items():
        other = dataclasses.replace(ctx, plan=plan.model_copy(update={name: value}))
        assert layer_key(other, True) != layer_key(ctx, True), name
    assert layer_key(ctx, True) != layer_key(ctx, False)


def test_memo_computes_each_key_once_and_only_inside_a_scope():
    _, _, ctx = contexts(CASES[0])
    calls = []

    def counted(c, moe):
        calls.append(moe)
        return layer_time(c, moe)

    memo_layer(counted, ctx, False)
    memo_layer(counted, ctx, False)
    assert len(calls) == 2  # no scope: nothing kept
    with shared_layers():
        first = memo_layer(counted, ctx, False)
        with shared_layers():  # nested: the outer scope's memo
            assert memo_layer(counted, ctx, False) is first
        assert memo_layer(counted, ctx, False) is first
    assert len(calls) == 3
    assert layer_records._MEMO.get() is None  # dropped on exit


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_estimates_inside_a_scope_are_the_same_numbers(case):
    job, plan, _ = contexts(case)
    plain = [estimate_throughput(job, plan.model_copy(update={"recompute": r})).model_dump()
             for r in ("none", "selective", "none")]
    with shared_layers():
        shared = [estimate_throughput(job, plan.model_copy(update={"recompute": r})).model_dump()
                  for r in ("none", "selective", "none")]
    assert shared == plain


def test_recommend_is_the_same_with_and_without_sharing(monkeypatch):
    req = Request(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, framework="megatron-core", seq_length=4096)
    shared = api.recommend(req).model_dump()
    import meshplan.estimate.perf as perf

    monkeypatch.setattr(perf, "memo_layer", lambda compute, ctx, moe, *_: compute(ctx, moe))
    assert api.recommend(req).model_dump() == shared


LAYER_FIELDS = ("gemm", "attention", "elementwise", "overhead", "tp", "tp_fwd", "cp", "cp_fwd", "ep", "recompute",
                "fwd_compute", "attention_fwd", "op_sac_fwd", "module_fwd")


@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: c["model"])
def test_an_overlapped_moe_layer_is_its_plain_twins_but_its_ep(case):
    """Inside a scope, an MoE layer whose plan overlaps its EP all-to-all, asked after its plain twin (the search's
    per-token references time one micro-batch alone first), is had from the twin (layer_time.overlapped_twin), not
    computed again, and every field is layer_time's own; without the twin in the memo it is computed."""
    from meshplan.estimate.layer_time import overlapped_twin

    _, plan, ctx = contexts(case)
    plain = dataclasses.replace(ctx, plan=plan.model_copy(update={"moe_a2a_overlap": False}), a2a_steady_share=0.0)
    overlapped = dataclasses.replace(ctx, plan=plan.model_copy(update={"moe_a2a_overlap": True}),
                                     a2a_steady_share=0.5)
    calls = []

    def counted(c, moe):
        calls.append(c)
        return layer_time(c, moe)

    own = layer_time(overlapped, True)
    assert own.ep != layer_time(plain, True).ep  # (the overlap changes the layer's EP seconds)
    with shared_layers():
        memo_layer(counted, overlapped, True, overlapped_twin)  # no twin yet: computed
    assert calls == [overlapped]
    calls.clear()
    with shared_layers():
        memo_layer(counted, plain, True, overlapped_twin)
        twin = memo_layer(counted, overlapped, True, overlapped_twin)
        assert memo_layer(counted, overlapped, True, overlapped_twin) is twin
    assert calls == [plain]  # the overlapped layer from its twin
    assert [getattr(twin, name) for name in LAYER_FIELDS] == [getattr(own, name) for name in LAYER_FIELDS]


def test_key_holds_a_list_field_by_its_values():
    """recompute_modules (the plan's one list field) enters the key as a tuple: equal lists share a key, a
    different list or None does not."""
    _, plan, ctx = contexts(CASES[0])
    keyed = [layer_key(dataclasses.replace(ctx, plan=plan.model_copy(update={"recompute_modules": modules})), False)
             for modules in (["mlp"], ["mlp"], ["mlp", "core_attn"], None)]
    assert keyed[0] == keyed[1] and hash(keyed[0]) == hash(keyed[1])
    assert keyed[0] != keyed[2] and keyed[0] != keyed[3]


# for every field a dense layer's key leaves out, a value other than the resolved one
DENSE_PERTURBED_PLAN = {"ep": lambda p: 2 * p.ep, "etp": lambda p: 2 * p.etp,
                        "moe_token_dispatcher": lambda p: "alltoall" if p.moe_token_dispatcher == "flex" else "flex",
                        "moe_a2a_overlap": lambda p: not p.moe_a2a_overlap}
DENSE_PERTURBED_CONTEXT = {"a2a_steady_share": lambda c: c.a2a_steady_share + 0.25,
                           "routed_load": lambda c: c.routed_load + 0.3,
                           "moe_host_syncs": lambda c: c.moe_host_syncs + 1,
                           "dispatch_passes": lambda c: DispatchPasses(4.0, 4.0) if c.dispatch_passes is None else
                           DispatchPasses(c.dispatch_passes.own + 4, c.dispatch_passes.received + 4),
                           "gather_dispatch": lambda c: not c.gather_dispatch,
                           "experts_fused": lambda c: not c.experts_fused,
                           "stacked_experts": lambda c: not c.stacked_experts,
                           "expert_launches": lambda c: (c.expert_launches[0] + 32.0, c.expert_launches[1] + 64.0),
                           "shared_expert_overlap": lambda c: not c.shared_expert_overlap}


def test_dense_perturbed_covers_every_left_out_field():
    assert set(DENSE_PERTURBED_PLAN) == set(layer_records.MOE_ONLY_FIELDS)
    assert set(DENSE_PERTURBED_CONTEXT) == set(layer_records.MOE_ONLY_CONTEXT)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_dense_layer_reads_no_moe_only_field(case):
    """If a dense layer's formula starts reading one of these, take it out of MOE_ONLY_FIELDS / MOE_ONLY_CONTEXT."""
    _, plan, ctx = contexts(case)
    base = layer_time(ctx, False)
    changed = [dataclasses.replace(ctx, plan=plan.model_copy(update={name: value(plan)}))
               for name, value in DENSE_PERTURBED_PLAN.items()]
    changed += [dataclasses.replace(ctx, **{name: value(ctx)}) for name, value in DENSE_PERTURBED_CONTEXT.items()]
    changed.append(dataclasses.replace(ctx, shard=dataclasses.replace(ctx.shard, ep=2 * ctx.shard.ep,
                                                                      etp=2 * ctx.shard.etp)))
    for other in changed:
        assert layer_key(other, False) == layer_key(ctx, False)
        assert layer_time(other, False) == base
        if ctx.arch.moe is not None:  # an MoE layer keys them all
            assert layer_key(other, True) != layer_key(ctx, True)


def test_dense_key_still_holds_what_a_dense_layer_reads():
    _, plan, ctx = contexts(CASES[0])
    for name, value in {"tp": 4, "cp": 1, "sequence_parallel": not plan.sequence_parallel,
                        "micro_batch_size": 2, "cp_comm_type": "a2a"}.items():
        other = dataclasses.replace(ctx, plan=plan.model_copy(update={name: value}))
        assert layer_key(other, False) != layer_key(ctx, False), name
    assert layer_key(dataclasses.replace(ctx, shard=dataclasses.replace(ctx.shard, tokens=1.0)), False) \
        != layer_key(ctx, False)
    lora = dataclasses.replace(ctx, lora=LoraSpec(rank=8, targets=["linear_qkv"]))
    assert layer_key(dataclasses.replace(lora, routed_load=1.3), False) != layer_key(lora, False)  # LoRA: all kept


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_job_facts_read_of_the_plan_only_fact_reads_and_are_the_same_inside_a_scope(case):
    """perf.job_facts keeps layer_context's job-level fields per the values of FACT_READS: if a formula there starts
    reading another plan field, add it to FACT_READS (and the memo's key). Inside a scope the contexts and the layer
    kinds (stage_time.layer_kinds, kept per model and layers) are the ones built without it."""
    from meshplan.arithmetic.comm import links
    from meshplan.estimate import perf
    from meshplan.estimate.stage_time import layer_kinds

    job, plan, ctx = contexts(case)
    cal = calibration(job.framework)
    peaks, lk = perf._peaks(job, cal), links(job.gpu, job.gpus_per_node, cal)
    for lora in (None, LoraSpec(rank=8, targets=["linear_qkv"])):
        lora_job = job.model_copy(update={"lora": lora})
        watched = ReadPlan(plan)
        perf._job_facts(lora_job, watched, cal, lk, peaks, None)  # type: ignore[arg-type]
        assert watched.read <= set(perf.FACT_READS), watched.read - set(perf.FACT_READS)
    pipeline = perf.stage_layers(job, plan)
    kinds = [layer_kinds(s, pipeline.layers(s), job.model, pipeline) for s in range(plan.pp)]
    with shared_layers():
        for _ in range(2):
            _, _, scoped = perf._step_context(job, plan, cal)
            assert scoped == ctx
            assert [layer_kinds(s, pipeline.layers(s), job.model, pipeline) for s in range(plan.pp)] == kinds


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["model"])
def test_recompute_forwards_wait_for_their_first_read(case, monkeypatch):
    """layer_time leaves a layer's recompute forwards (module_fwd, op_sac_fwd: only a selective recompute reads them)
    to their first read (LayerTime.later): a layer no such plan reads never works them out, and read they are
    recomputed_forwards' own numbers, worked out once."""
    from meshplan.arithmetic.gemm import gemm_terms
    from meshplan.estimate import layer_time as layer_time_module
    from meshplan.estimate.layer_time import elementwise_load, elementwise_seconds, layer_gemms
    from meshplan.estimate.recompute import recomputed_forwards

    _, _, ctx = contexts(case)
    calls = []

    def counted(*args):
        calls.append(args)
        return recomputed_forwards(*args)

    monkeypatch.setattr(layer_time_module, "recomputed_forwards", counted)
    for moe in (False, True) if ctx.arch.moe is not None else (False,):
        calls.clear()
        lt = layer_time(ctx, moe)
        assert not calls  # not worked out for a layer nothing reads them of
        gemms, load = layer_gemms(ctx, moe), elementwise_load(ctx, moe)
        terms = gemm_terms(gemms, ctx.cal, ctx.bf16_peak, ctx.fp8_peak, ctx.ridge_rows)
        module_fwd, op_sac_fwd = recomputed_forwards(ctx, gemms, load, elementwise_seconds(ctx, load), terms)
        assert lt.op_sac_fwd == op_sac_fwd and lt.module_fwd == module_fwd and module_fwd
        assert lt.module_fwd is lt.module_fwd and len(calls) == 1  # once


def test_kept_links_are_the_jobs_links_once_per_job_inside_a_scope():
    """perf.kept_links is comm.job_links of the job: inside a shared_layers scope one object per job and calibration
    (the floors and the step's context ask it of every plan), outside a scope worked out per call."""
    from meshplan.arithmetic.comm import job_links
    from meshplan.estimate import perf

    job, _ = resolve(Request(**CASES[1]))
    cal = calibration(job.framework)
    other = job.model_copy(update={"global_batch_size": 2 * job.global_batch_size})
    assert perf.kept_links(job, cal) == job_links(job, cal)
    assert perf.kept_links(job, cal) is not perf.kept_links(job, cal)
    with shared_layers():
        kept = perf.kept_links(job, cal)
        assert kept == job_links(job, cal) and perf.kept_links(job, cal) is kept
        assert perf.kept_links(other, cal) == job_links(other, cal) and perf.kept_links(other, cal) is not kept


def test_layer_kinds_of_a_dense_model_without_mtp_keep_no_key():
    """Every layer of a dense model without MTP (Llama) is dense: stage_time.layer_kinds gives [False] per layer
    without building a key, so its shared_layers memo holds nothing (an MoE model's kinds are kept)."""
    from meshplan.estimate import perf
    from meshplan.estimate.layer_records import scope_memo
    from meshplan.estimate.stage_time import layer_kinds

    for case, kept in ((CASES[0], 0), (CASES[2], 1)):
        job, plan, _ = contexts(case)
        pipeline = perf.stage_layers(job, plan)
        with shared_layers():
            kinds = layer_kinds(0, pipeline.layers(0), job.model, pipeline)
            assert len(scope_memo("layer_kinds")) == kept
        if not kept:
            assert kinds == [False] * len(pipeline.layers(0))
