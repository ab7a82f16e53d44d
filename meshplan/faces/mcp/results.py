"""What the MCP tools return: meshplan's reports plus a one-line `summary` and `next_steps`.

Some hosts (Claude Code among them) hand the model only `structuredContent`, never the text block,
so each result must read on its own: the report's numbers, a sentence that states the answer, and
which tool to call next. These classes extend the reports (same fields as `meshplan ... --json`)
and only add words; every number in a summary is copied from the report it summarises.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from meshplan.schema.model import ModelReport, ModelSummary
from meshplan.schema.reports import (
    CheckReport,
    MemoryReport,
    MinimumGpus,
    Recommendation,
    RenderResult,
    ThroughputReport,
)

_SUMMARY = Field(description="The answer in one or two sentences (GiB for reading; the fields hold bytes)")
_NEXT = Field(default_factory=list, description="Which tool to call next, and why")


class ModelAnswer(ModelReport):
    """Parameter counts of one model, exact from its config, under each vendor's convention."""

    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


class ModelCatalog(BaseModel):
    """The model catalog: keys to pass as `model` to any tool, with exact parameter counts."""

    model_config = ConfigDict(extra="forbid")

    count: int
    models: list[ModelSummary]
    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


class MemoryAnswer(MemoryReport):
    """Per-GPU memory of every pipeline stage in bytes; the worst stage decides `fits`."""

    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


class ThroughputAnswer(ThroughputReport):
    """Predicted step time (s), tokens/s per GPU and MFU, with where the time goes."""

    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


class CheckAnswer(CheckReport):
    """Every rule of the framework run over the layout; `ok` is false when any finding is an error."""

    summary: str = _SUMMARY


class RecommendationAnswer(Recommendation):
    """Ranked layouts that fit (fastest first), why the first won, and what was rejected and why."""

    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


class MinimumGpusAnswer(MinimumGpus):
    """The smallest GPU count at which a layout passes the rules and keeps the headroom, and the best layout there."""

    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


class RenderAnswer(RenderResult):
    """The layout written in the framework's own configuration language, ready to paste."""

    summary: str = _SUMMARY
    next_steps: list[str] = _NEXT


def extend(report: BaseModel, cls: type[BaseModel], **extra: Any) -> Any:
    """`report` as an instance of its subclass `cls` with the extra fields; no re-validation (it was valid)."""
    values = {name: getattr(report, name) for name in type(report).model_fields}
    values.update(extra)
    return cls.model_construct(_fields_set=set(values), **values)
