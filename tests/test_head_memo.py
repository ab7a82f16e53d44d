"""The head stage's seconds shared across the plans of a search (perf.kept_head): its key leaves out HEAD_UNREAD and
the job's global batch (perf.job_family), so head_seconds and head_with_mtp must not read them; inside a scope each
distinct key is worked out once and the estimates are the same numbers as without the scope. And stage_work's inputs
hold only what its sums read (perf.stage_inputs without once_per_step)."""

from __future__ import annotations

import pytest

from meshplan.estimate import perf
from meshplan.estimate.layer_records import shared_layers
from meshplan.estimate.mtp_time import head_with_mtp
from meshplan.estimate.perf import HEAD_UNREAD, head_seconds, job_family, kept_head, stage_layers
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

CASES = [
    dict(model="deepseek-v3", gpu="h100", num_gpus=256, tp=2, pp=1, ep=32, etp=1, moe_a2a_overlap=True,
         framework="megatron-bridge", mtp_num_layers=1),
    dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=16, tp=2, pp=1, ep=4, etp=2, framework="megatron-core"),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=16, tp=2, pp=2, cp=2, seq_length=8192),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, framework="kempnerforge", sequence_parallel=False),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, tp=2, framework="kempnerforge"),
]
# a value other than the resolved one for every field the key leaves out
PERTURBED = {"dp": 3, "ep": 64, "etp": 4, "moe_token_dispatcher": "flex", "moe_a2a_overlap": False, "recompute": "full",
             "recompute_layers": 2, "recompute_method": "uniform", "recompute_modules": ["mlp", "moe"],
             "selective_ac_option": "op"}


def _context(job, plan):
    cal = calibration(job.framework)
    peaks = perf._peaks(job, cal)
    return perf.layer_context(job, plan, cal, perf.kept_links(job, cal), peaks, 2, None)


def _head(job, plan) -> float:
    return head_with_mtp(head_seconds(job, plan, ctx := _context(job, plan)), ctx.arch, ctx, stage_layers(job, plan))


def test_perturbed_covers_every_left_out_field():
    assert set(PERTURBED) == set(HEAD_UNREAD)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['model']}-{c.get('framework', '')}")
def test_head_reads_no_left_out_field_nor_the_global_batch(case):
    """If the head's formulas start reading one of these plan fields, take it out of HEAD_UNREAD (the key then holds
    it); if they read the job's global batch, job_family must keep it."""
    job, plan = resolve(Request(**case))
    base = _head(job, plan)
    assert base > 0.0
    for name, value in PERTURBED.items():
        assert _head(job, plan.model_copy(update={name: value})) == base, name
    bigger = job.model_copy(update={"global_batch_size": 2 * job.global_batch_size})
    assert job_family(bigger) == job_family(job)
    assert _head(bigger, plan) == base


def test_family_holds_the_jobs_other_values():
    job, _ = resolve(Request(**CASES[2]))
    assert job_family(job.model_copy(update={"seq_length": 4096})) != job_family(job)
    assert job_family(job.model_copy(update={"precision": "fp8"})) != job_family(job)


def test_head_kept_once_per_key_inside_a_scope_only(monkeypatch):
    """The search's references differ in their expert grid and global batch: inside a scope they share the head."""
    job, plan = resolve(Request(**CASES[0]))
    others = [(job.model_copy(update={"global_batch_size": job.global_batch_size * k}),
               plan.model_copy(update={"ep": ep, "dp": 256 // (2 * ep) if ep <= 128 else 1}))
              for k, ep in ((1, 32), (2, 16), (4, 8))]
    calls = []
    monkeypatch.setattr(perf, "head_seconds", lambda *a: calls.append(a) or head_seconds(*a))
    alone = [kept_head(j, p, _context(j, p), stage_layers(j, p)) for j, p in others]
    assert len(calls) == 3
    with shared_layers():
        shared = [kept_head(j, p, _context(j, p), stage_layers(j, p)) for j, p in others]
    assert shared == alone and len(calls) == 4
    bigger_tp = plan.model_copy(update={"tp": 4})
    with shared_layers():
        kept_head(job, plan, _context(job, plan), stage_layers(job, plan))
        kept_head(job, bigger_tp, _context(job, bigger_tp), stage_layers(job, bigger_tp))
    assert len(calls) == 6


@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: c["model"])
def test_stage_work_reads_no_once_per_step_term(case, monkeypatch):
    """A single-stage plan's stage_work builds no DP groups, sharding schedule or rank parameters (only the step's
    once-per-step terms and its sharding windows read them), and gives step_terms' slowest row all the same."""
    job, plan = resolve(Request(**case))
    terms = perf.step_terms(job, plan)
    row = terms.rows[terms.worst]

    def refused(*_a, **_k):
        raise AssertionError("stage_work read a once-per-step term")

    for name in ("dp_traffic", "sharding_schedule", "time_rank_parts"):
        monkeypatch.setattr(perf, name, refused)
    work = perf.stage_work(job, plan)
    assert tuple(work)[:6] == (terms.m, row.compute, row.recompute, row.tp, row.cp, row.ep)
