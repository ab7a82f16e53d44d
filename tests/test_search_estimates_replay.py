"""Every memory_fit and step_terms a search asks inside its shared_layers scope (where the stages' model states are
shared across ranks and layouts, a dominated middle stage is left out, layer times are shared) gives the numbers the
same call gives alone, outside any scope (every stage evaluated afresh): replayed on every plan of whole searches."""

from __future__ import annotations

import pytest

from meshplan.estimate.memory import memory_fit
from meshplan.estimate.perf import step_terms
from meshplan.schema.request import Request
from meshplan.search import estimators, recommend

REQUESTS = [
    Request(model="llama-3.1-70b", num_gpus=32, gpu="h100"),
    Request(model="qwen3-30b-a3b", num_gpus=16, framework="megatron-bridge", gpu="h100"),
    Request(model="llama-3.1-8b", num_gpus=16, framework="torchtitan", gpu="h100"),
]


def step_figures(terms):
    return (terms.floor, terms.m, terms.worst, terms.dp_exposed, terms.optimizer, terms.offload_s, terms.rows)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: f"{r.model}-{r.framework}")
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
    for job, plan, figures in steps:
        assert step_figures(step_terms(job, plan)) == figures, plan.short()
