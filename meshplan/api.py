"""The operations every face of meshplan offers, taking flat requests: the CLI and the MCP tools call these.

Each function resolves the request once and hands `Job` and `Plan` to the pure module that owns the
computation. Heavy modules are imported inside the functions so `meshplan describe` and the MCP
server start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshplan.request.parse import parse_request
from meshplan.schema.imported import ImportedConfig
from meshplan.schema.model import ModelReport, ModelSummary
from meshplan.schema.reports import (
    CheckReport,
    MemoryReport,
    MinimumGpus,
    Recommendation,
    RenderResult,
    ThroughputReport,
)
from meshplan.schema.request import Request


def describe_model(model: str) -> ModelReport:
    from meshplan.knowledge.catalog import describe_model as describe

    return describe(model)


def list_models() -> list[ModelSummary]:
    from meshplan.knowledge.catalog import model_summaries

    return model_summaries()


def estimate_memory(req: Request) -> MemoryReport:
    from meshplan.estimate.accuracy import with_band
    from meshplan.request.resolve import resolve
    from meshplan.rl.memory import job_memory as estimate  # an RL job: the peak over its phases

    job, plan = resolve(req)
    return with_band(estimate(job, plan), job, plan)  # the error measured in its regime (cards/accuracy.yaml)


def estimate_throughput(req: Request) -> ThroughputReport:
    from meshplan.estimate.accuracy import with_band
    from meshplan.request.resolve import resolve
    from meshplan.rl.step_time import job_throughput as estimate  # an RL job: the whole RL step, by part

    job, plan = resolve(req)
    return with_band(estimate(job, plan), job, plan)  # the error measured in its regime (cards/accuracy.yaml)


def check_config(req: Request) -> CheckReport:
    from meshplan.check.config import check_config as check
    from meshplan.request.resolve import resolve

    job, plan = resolve(req)
    return check(job, plan)


def recommend(req: Request, top_k: int = 5) -> Recommendation:
    from meshplan.rl.job import is_rl_request

    if is_rl_request(req):  # the whole RL step: actor layout, rollout engine, memory fraction, offloads
        from meshplan.search.rl import recommend_rl

        return recommend_rl(req, top_k=top_k)
    from meshplan.search import recommend as search

    return search(req, top_k=top_k)


def minimum_gpus(req: Request, max_gpus: int | None = None) -> MinimumGpus:
    """The smallest GPU count at which a layout passes the rules and keeps the headroom, and the best layout there."""
    from meshplan.search import minimum_gpus as scan

    return scan(req, max_gpus=max_gpus)


def render_config(framework: str, req: Request, *, force: bool = False, **options: Any) -> RenderResult:
    """The plan in `framework`'s own keys, after its rules: a rule error (a layout the framework rejects, or one
    that does not fit) raises `RefusedLayout` with the findings and their fixes, unless `force`; then, and for
    warnings, the findings travel in `warnings`."""
    from meshplan.adapters.render import render, require_target, vet_layout
    from meshplan.check.config import check_config as check
    from meshplan.request.resolve import resolve

    require_target(framework)
    job, plan = resolve(req.model_copy(update={"framework": framework}))
    notes, warnings = vet_layout(job, plan, check(job, plan), force=force)
    result = render(framework, job, plan, **options)
    return result.model_copy(update={"notes": [*result.notes, *notes], "warnings": [*warnings, *result.warnings]})


def import_config(text: str, *, path: str = "<config_text>", framework: str | None = None,
                  config_format: str | None = None) -> ImportedConfig:
    """The request a framework config or launch script states, field by field with its line (never run)."""
    from meshplan.adapters.read import import_config as read

    return read(text, path, framework, config_format)


def import_file(path: str, *, framework: str | None = None, config_format: str | None = None) -> ImportedConfig:
    """import_config of a file on disk."""
    from meshplan.adapters.read import import_file as read

    return read(path, framework, config_format)


def request_from_config(imported: ImportedConfig, given: Mapping[str, Any] | None = None) -> Request:
    """The Request a file states, with the fields `given` beside it (flags, tool arguments) over the file's."""
    from meshplan.adapters.read import request_values

    return parse_request(request_values(imported, given or {}))
