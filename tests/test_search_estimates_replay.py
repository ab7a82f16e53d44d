"""Every memory_fit and step_terms a search asks inside its shared_layers scope (where the stages' model states are
shared across ranks and layouts, a dominated middle stage is left out, layer times are shared) gives the numbers the
same call gives alone, outside any scope (every stage evaluated afresh): replayed on every plan of whole searches."""

from __future__ import annotations

import pytest

from meshplan.estimate.memory import estimate_memory, memory_fit
from meshplan.estimate.perf import step_terms
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

    monkeypatch.setattr(estimators, "memory_fit", recorded_fit)
    monkeypatch.setattr(estimators, "step_terms", recorded_terms)
    recommend(req)
    assert len(fits) > 50 and len(steps) > 20
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
