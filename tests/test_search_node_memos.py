"""What the SHARD and RULES levels and the per-token references keep instead of working out again, each the same
values as worked out afresh: check_errors' knobs per what knobs reads of a layout (SearchPlans.knob_row), the
stretch's bound without the chains from the same pass (stretch's `plain`: pipeline_bound and chained read both), the
references' jobs per global batch size (_per_token), the rules' verdicts found by the job's identity (verdicts), an
offload plan with no knob set (offload_plan: nothing moves, whatever the card), and a reference whose EP overlap the
rules refuse estimated once with the plain one (_plain_twin)."""

from __future__ import annotations

import dataclasses

from meshplan.arithmetic.offload import OffloadPlan, offload_plan
from meshplan.knowledge.cards import framework_card
from meshplan.rules import engine as rules_engine
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, search_job
from meshplan.search.space import Fixed, Layout

KIMI = Request(model="kimi-k2", num_gpus=256, gpu="h100")


def search_of(req: Request) -> BestFirstSearch:
    job, _ = search_job(req)
    return BestFirstSearch.for_job(job, Fixed.from_request(req, job), default_engine(job.framework), 5)


def test_knob_rows_are_each_layouts_knobs():
    search = search_of(KIMI)
    lays = [Layout(tp=4, pp=4, cp=1, ep=16, etp=1, dp=16, vpp=vpp, first=first) for vpp in (1, 2) for first in
            (None, 14)] + [Layout(tp=2, pp=8, cp=1, ep=32, etp=1, dp=16, vpp=1, schedule="")]
    for lay in lays:
        for zero in search.zeros:
            for mbs in (1, 2):
                row = search.knob_row(lay, zero, mbs)
                assert row == [search.knobs(lay, zero, recompute, mbs) for recompute in search.recomputes]
    assert len(search.knob_rows) == 3 * len(search.zeros) * 2  # first/last splits share their vpp's rows


def test_plain_is_the_stretch_without_its_chains():
    search = search_of(KIMI)
    for lay in (Layout(tp=4, pp=4, cp=1, ep=16, etp=1, dp=16, vpp=2),
                Layout(tp=2, pp=8, cp=1, ep=32, etp=1, dp=16, vpp=4, first=6, last=6)):
        for mbs in (1, 2):
            rate = search.token_rate(lay, mbs, search.recomputes[0], exact=True)
            plain: list[float] = []
            bound = search.stretch_one(lay, mbs, *rate, plain=plain)
            assert plain == [search.stretch_one(lay, mbs, *rate[:3])]
            assert search.chained(lay, mbs, rate) == (bound < plain[0])


def test_references_share_a_job_per_global_batch():
    search = search_of(KIMI)
    lay = Layout(tp=4, pp=4, cp=1, ep=16, etp=1, dp=16, vpp=2)
    for mbs in (1, 2, 4):
        search.pipeline_bound(lay, mbs, search.recomputes[0], interleave=True)
    assert search.ref_jobs
    for gbs, job in search.ref_jobs.items():
        assert job.global_batch_size == gbs
        assert job.model_copy(update={"global_batch_size": search.job.global_batch_size}) == search.job


def test_verdicts_known_by_identity(monkeypatch):
    job, _ = search_job(KIMI)
    other = job.model_copy(update={"global_batch_size": 2 * job.global_batch_size})
    kept = rules_engine.verdicts(job)
    assert rules_engine.verdicts(other) is kept  # the same job but a JOB_READS field: one Verdicts
    keyed: list = []
    monkeypatch.setattr(rules_engine, "job_key", lambda one: keyed.append(one))
    for _ in range(3):
        assert rules_engine.verdicts(job) is kept and rules_engine.verdicts(other) is kept
    assert keyed == []  # each found by identity, its key not worked out again


def test_no_offload_knob_moves_nothing():
    plan = Layout(tp=4, pp=4, cp=1, ep=16, etp=1, dp=16).plan(zero_stage=1, recompute="none", micro_batch_size=1,
                                                              sequence_parallel=True, cp_comm_type="p2p")
    for framework in ("megatron-core", "deepspeed", "torchtitan", "verl"):
        assert offload_plan(framework_card(framework), plan) == OffloadPlan()
        assert not offload_plan(framework_card(framework), plan).any


def test_a_reference_whose_overlap_the_rules_refuse_is_the_plain_reference_estimated_once():
    """A work reference that may overlap its EP all-to-all where no ZeRO stage's rules let it (full recompute) is the
    plain reference's plan: _per_token estimates it once and gives both keys the plain one's figure and parts."""
    search = search_of(KIMI)
    planned: list = []
    work = search.engine.stage_work
    assert work is not None

    def counted(job, plan):
        planned.append(plan)
        return work(job, plan)

    search.engine = dataclasses.replace(search.engine, stage_work=counted)
    lay = Layout(tp=2, pp=4, cp=1, ep=32, etp=1, dp=32, vpp=2)
    ref = Layout(tp=2, pp=1, cp=1, ep=32, etp=1, dp=128)
    assert search.pipeline_overlaps(lay) and not any(search.a2a_overlap(ref, zero, "full") for zero in search.zeros)
    b_tok, per_token, exposed, refs = search.token_rate(lay, 1, "full", exact=True)
    assert len(planned) == 1 and not planned[0].moe_a2a_overlap  # one estimate for both keys
    kept, parts = search.caches.token_time, search.caches.token_parts
    plain, overlapped = ("work", 2, 32, 1, "full", b_tok, False), ("work", 2, 32, 1, "full", b_tok, True)
    assert kept[overlapped] == kept[plain] == per_token and exposed == 0.0
    assert parts[overlapped] == parts[plain] == search.token_parts(refs)[:5]
    fresh = search_of(KIMI)  # the plain reference worked out alone: the same figure and parts
    assert fresh._per_token(plain, 2, 1, 32, 1, b_tok, "full", "work") == per_token
    assert fresh.caches.token_parts[plain] == parts[plain]
