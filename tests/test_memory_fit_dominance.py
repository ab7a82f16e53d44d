"""memory_fit leaves out a middle pipeline stage no more than one it evaluated before (memory_stage.Dominance): the
same model states, the same layers per virtual chunk, no more micro-batches held in any chunk. Its verdict must be
the one of evaluating every stage in order (outside a shared_layers scope no two ranks share their states, so
nothing is left out there), over budgets that stop it at different stages and from different first stages."""

from __future__ import annotations

import pytest

from meshplan.estimate import memory_stage
from meshplan.estimate.layer_records import shared_layers
from meshplan.estimate.memory import estimate_memory, memory_fit, memory_terms
from meshplan.request.resolve import resolve
from meshplan.rules.engine import EstimateBlocked
from meshplan.schema.request import Request

SETUPS = [
    dict(model="llama-3.1-70b", gpu="h100", num_gpus=64, tp=4, pp=8, cp=1),
    dict(model="deepseek-v3", gpu="h100", num_gpus=256, tp=2, pp=8, ep=16, etp=1, first_stage_layers=7,
         last_stage_layers=6, framework="megatron-bridge"),
    dict(model="llama-3.1-8b", gpu="h100", num_gpus=32, tp=2, pp=4, first_stage_layers=6, last_stage_layers=10),
]
VARIANTS = [{}, {"vpp": 2}, {"vpp": 2, "micro_batch_size": 2}, {"recompute": "full"}, {"recompute": "selective"},
            {"pipeline_schedule": "gpipe"}, {"expandable_segments": True}, {"zero_stage": 3}, {"micro_batch_size": 4},
            {"recompute": "full", "recompute_method": "block", "recompute_layers": 2}]
SHARES = (0.3, 0.5, 0.7, 0.9, 1.0, 2.0)  # of the capacity: budgets that stop at the first stage, later, or never


def verdicts(job, plans, budgets, firsts):
    out = []
    for plan in plans:
        for budget in budgets:
            for first in firsts:
                try:
                    out.append(memory_fit(job, plan, budget, None, first))
                except EstimateBlocked as exc:
                    out.append(exc.rule_id)
    return out


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: f"{s['model']}-{s.get('framework', 'megatron-core')}")
def test_left_out_stages_change_no_verdict(setup, monkeypatch):
    job, plan = resolve(Request(**setup))
    plans = [plan.model_copy(update=u) for u in VARIANTS]
    budgets = [int(job.gpu.memory_bytes * share) for share in SHARES]
    firsts = (0, 1, plan.pp // 2, plan.pp - 1)
    every_stage = verdicts(job, plans, budgets, firsts)
    covered = []
    real = memory_stage.Dominance.covers

    def counted(self, rank, chunks):
        covered.append(real(self, rank, chunks))
        return covered[-1]

    monkeypatch.setattr(memory_stage.Dominance, "covers", counted)
    with shared_layers():
        left_out = verdicts(job, plans, budgets, firsts)
        assert left_out == every_stage
    assert sum(covered) > len(plans)  # stages were left out
    # a verdict that fits read (or left out) every stage: the report's fit figure and peak, bit for bit
    per_plan = len(budgets) * len(firsts)
    complete = 0
    for i, plan in enumerate(plans):
        try:
            report = estimate_memory(job, plan)
        except EstimateBlocked:
            continue
        for verdict in left_out[i * per_plan:(i + 1) * per_plan]:
            if verdict.complete:
                assert (verdict.figure, verdict.peak) == (report.fit_bytes, report.peak_bytes), plan
                complete += 1
    assert complete >= len(plans)


def test_nothing_left_out_outside_a_scope_or_with_offload_or_fsdp2_walk():
    job, plan = resolve(Request(**SETUPS[0]))
    with shared_layers():
        for update in ({"optimizer_offload": True}, {}):
            assert memory_stage.Dominance(memory_terms(job, plan.model_copy(update=update), [])).on is (not update)
        fsdp2 = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=32, tp=2, pp=4, framework="torchtitan"))
        assert not memory_stage.Dominance(memory_terms(*fsdp2, [])).on
    t = memory_terms(job, plan, [])
    dominance = memory_stage.Dominance(t)
    for rank, chunks in enumerate(t.pipeline.chunks):
        assert not dominance.covers(rank, chunks)
        dominance.add(rank, chunks, 0, None)
