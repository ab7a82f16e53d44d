"""Every memory_fit and step_terms a search asks inside its shared_layers scope (where the stages' model states are
shared across ranks and layouts, a dominated middle stage is left out, layer times are shared) gives the numbers the
same call gives alone, outside any scope (every stage evaluated afresh): replayed on every plan of whole searches.
Every stage_work and stage_cp the per-token references ask gives what step_terms of the same plan gives alone."""

from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.estimate.memory import estimate_memory, memory_fit
from meshplan.estimate.perf import stage_cp, stage_work, step_terms
from meshplan.schema.request import Request
from meshplan.search import estimators, recommend

REQUESTS = [
    Request(model="llama-3.1-70b", num_gpus=32, gpu="h100"),
    Request(model="qwen3-30b-a3b", num_gpus=16, framework="megatron-bridge", gpu="h100"),
    Request(model="llama-3.1-8b", num_gpus=16, framework="torchtitan", gpu="h100"),
]
KIMI = Request(model="kimi-k2", num_gpus=256, gpu="h100")  # the big MoE search: 4.7 K fit-only estimates


def step_figures(terms):
    return (terms.floor, terms.m, terms.worst, terms.dp_exposed, terms.optimizer, terms.offload_s, terms.rows)


def work_of(job, plan):
    """step_terms' m and slowest row's compute, recompute, TP, CP, EP (what stage_work stands for), or its refusal."""
    try:
        t = step_terms(job, plan)
    except MeshplanError as e:
        return str(e)
    row = t.rows[t.worst]
    return (t.m, row.compute, row.recompute, row.tp, row.cp, row.ep)


def cp_of(job, plan):
    """step_terms' m and slowest row's cp (what stage_cp stands for), or its refusal."""
    work = work_of(job, plan)
    return work if isinstance(work, str) else (work[0], work[4])


def recording(estimator, calls: list):
    """`estimator` that appends (job, plan, its answer as a tuple, or its refusal's text) to `calls`."""
    def recorded(job, plan):
        try:
            answer = estimator(job, plan)
        except MeshplanError as e:
            calls.append((job, plan, str(e)))
            raise
        calls.append((job, plan, tuple(answer)))
        return answer
    return recorded


@pytest.mark.parametrize("req", [*REQUESTS, pytest.param(KIMI, marks=pytest.mark.slow)],
                         ids=lambda r: f"{r.model}-{r.framework}")
def test_a_searchs_estimates_are_the_plain_ones(req, monkeypatch):
    fits, steps = [], []

    def recorded_fit(job, plan, *args):
        verdict = memory_fit(job, plan, *args)
        fits.append((job, plan, args, verdict))
        return verdict

    def recorded_terms(job, plan, *args, **kwargs):
        terms = step_terms(job, plan, *args, **kwargs)
        steps.append((job, plan, step_figures(terms)))
        return terms

    works: list = []
    cps: list = []
    monkeypatch.setattr(estimators, "memory_fit", recorded_fit)
    monkeypatch.setattr(estimators, "step_terms", recorded_terms)
    monkeypatch.setattr(estimators, "stage_work", recording(stage_work, works))
    monkeypatch.setattr(estimators, "stage_cp", recording(stage_cp, cps))
    recommend(req, top_k=8)  # eight ranked rows: enough whole searches' estimates to replay (fits, steps, works)
    # enough of each to replay: Qwen3-30B-A3B on Megatron-Bridge takes 17 step estimates (108 on alltoall alone)
    # since the flex dispatcher's DeepEP permutes in 8 passes, not 16, and its plans prune the rest; the others more;
    # and 41 memory fits since the joint refit of 2026-12-07 (a2a63: host sync 3.25 -> 1.50 ms), which prunes more
    assert len(fits) > 30 and len(steps) > 12 and len(works) > 5
    for job, plan, work in works:
        assert work_of(job, plan) == (work if isinstance(work, str) else work[:6]), plan.short()
    for job, plan, cp in cps:
        assert cp_of(job, plan) == cp, plan.short()
    for job, plan, args, verdict in fits:
        assert memory_fit(job, plan, *args) == verdict, (plan.short(), args)
        assert_reports_verdict(job, plan, args, verdict)
    for job, plan, figures in steps:
        assert step_figures(step_terms(job, plan)) == figures, plan.short()


def assert_reports_verdict(job, plan, args, verdict):
    """A fit verdict is the full report's: a complete one its fit figure and host bytes per node, one found over
    (at stage `over`) a floor of them over the budget or the host limit."""
    budget, host = args[0], args[1] if len(args) > 1 else None
    report = estimate_memory(job, plan)
    if verdict.complete:
        assert (verdict.figure, verdict.host_per_node) == (report.fit_bytes, report.host_bytes_per_node), plan.short()
        return
    assert verdict.figure <= report.fit_bytes and verdict.host_per_node <= report.host_bytes_per_node, plan.short()
    assert verdict.figure > budget or (host is not None and verdict.host_per_node > host), plan.short()


WORK_CASES = [  # single stage (stage_work's own arithmetic) and its step_terms fallbacks (a pipeline, offload)
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=1, cp=2, seq_length=8192, recompute="full"),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2, cp=2, seq_length=8192),
    dict(model="deepseek-v3", gpu="h100", num_gpus=256, tp=2, pp=1, ep=32, etp=1, moe_a2a_overlap=True,
         framework="megatron-bridge"),
    dict(model="deepseek-v3", gpu="h100", num_gpus=512, tp=2, pp=1, cp=4, ep=32, etp=1, seq_length=16384,
         framework="megatron-core"),  # MTP blocks and dense first layers, a K/V ring
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=32, tp=2, pp=1, cp=4, ep=4, etp=1, seq_length=32768,
         framework="megatron-core", cp_comm_type="a2a+p2p"),
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, tp=2, pp=1, ep=4, etp=2, framework="megatron-core",
         zero_stage=3, recompute="selective"),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, pp=1, framework="megatron-bridge", lora_rank=16),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=1, pp=1, framework="deepspeed", zero_stage=3,
         optimizer_offload=True),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=1, pp=1, framework="deepspeed", zero_stage=2,
         optimizer_offload=True),  # refused (OF001): the same refusal
]


@pytest.mark.parametrize("case", WORK_CASES, ids=lambda c: f"{c['model']}-pp{c['pp']}-{c.get('framework', '')}")
def test_stage_work_is_step_terms_slowest_row(case):
    from meshplan.request.resolve import resolve

    try:
        job, plan = resolve(Request(**case))
    except MeshplanError as e:  # a case the request layer refuses tests nothing
        pytest.skip(str(e))
    try:
        work = tuple(stage_work(job, plan))[:6]  # (its layers' and head's parts: test_stage_work_parts_add_up)
    except MeshplanError as e:
        work = str(e)
    assert work == work_of(job, plan)
    try:
        cp = tuple(stage_cp(job, plan))
    except MeshplanError as e:
        cp = str(e)
    assert cp == cp_of(job, plan)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "deepseek-v2-lite", "deepseek-v3"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_stage_work_parts_add_up(model, recompute):
    """A one-stage plan's parts (one layer of each kind, one decoder layer's recompute, the head: what the search's
    bounds weigh an uneven split's ranks by, search/rank_chains.py) add up to its compute, TP, EP and recompute: each
    layer of a kind costs the same, the MTP blocks like the last layer without recompute, the head once."""
    from meshplan.request.resolve import resolve
    from meshplan.search.rank_chains import model_layers

    job, plan = resolve(Request(model=model, num_gpus=8, gpu="h100", tp=1, pp=1, ep=8 if "deepseek" in model else 1,
                                recompute=recompute, seq_length=2048))
    work = stage_work(job, plan)
    arch = job.model
    total, moe_total = model_layers(arch)
    moe_decoder = len(arch.moe.moe_layers) if arch.moe else 0
    parts = ((total - moe_total) * work.dense + moe_total * work.moe + (arch.num_layers - moe_decoder) * work.dense_rec
             + moe_decoder * work.moe_rec + work.head)
    assert parts == pytest.approx(work.compute + work.recompute + work.tp + work.ep, rel=1e-12)
    assert work.head > 0 and (work.moe > 0) == (moe_total > 0) and (work.dense_rec > 0) == (recompute != "none")


@pytest.mark.parametrize("model", ["llama-3.1-8b", "deepseek-v3"])
def test_stage_work_shares_one_stage_inputs_across_recomputes(model, monkeypatch):
    """Inside a shared_layers scope, the single-stage plans of stage_work that differ only in their recompute (the
    search's per-token references at each recompute) build one StageInputs (perf._one_stage_inputs): each gives the
    numbers, refusals included, it gives alone, in any order."""
    from meshplan.estimate import perf
    from meshplan.estimate.layer_records import shared_layers
    from meshplan.request.resolve import resolve

    job, plan = resolve(Request(model=model, num_gpus=8, gpu="h100", tp=1, pp=1, ep=8 if "deepseek" in model else 1,
                                seq_length=2048))
    plans = [plan.model_copy(update={"recompute": r}) for r in ("none", "full", "selective", "full", "none")]
    alone = []
    for one in plans:
        try:
            alone.append(tuple(stage_work(job, one)))
        except MeshplanError as e:
            alone.append(str(e))
    built = []
    real = perf.stage_inputs
    monkeypatch.setattr(perf, "stage_inputs", lambda *args, **kw: built.append(args) or real(*args, **kw))
    shared = []
    with shared_layers():
        for one in plans:
            try:
                shared.append(tuple(stage_work(job, one)))
            except MeshplanError as e:
                shared.append(str(e))
    assert shared == alone and len(set(alone)) == 3
    assert len(built) == 1
