"""The ninth tool, `render_report`: the plan's pictures for hosts that show images.

The result's content is the summary first (for hosts that show only text), then the memory picture as SVG image
content, then the whole offline HTML report as an embedded resource; `structuredContent` carries the summary, the
pictures' names and the plan, so hosts that read only that still get the answer. The numbers are the api's
(meshplan/faces/report/gather.py), the same as estimate_memory's and recommend_parallelism's.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent, TextResourceContents
from pydantic import BaseModel, ConfigDict, Field

from meshplan.core.units import gib
from meshplan.schema.options import ReportOptions
from meshplan.schema.plan import Plan

from .tools import option_parameters, request_parameters, take_options, to_request, tool_errors, with_signature

REPORT_URI = "report://meshplan/report.html"


class ReportAnswer(BaseModel):
    """The plan's pictures: which were drawn, of which plan, and the answer in words."""

    model_config = ConfigDict(extra="forbid")

    summary: str = Field(description="The answer in one or two sentences")
    plan: Plan | None = Field(description="The layout drawn (None: nothing to draw)")
    drawn: str = Field(description="Which plan is drawn, in words")
    figures: list[str] = Field(description="The pictures in the report, by name (memory, mesh, schedule, ...)")
    html_uri: str = Field(description="The URI of the embedded HTML report in this result's content")
    html_chars: int = Field(description="Length of the HTML report")
    next_steps: list[str] = Field(default_factory=list, description="Which tool to call next, and why")


RENDER_REPORT = (
    "Use when the user wants to SEE a plan: returns pictures of per-GPU memory per pipeline stage (stacked bars "
    "against capacity and the headroom line), the device mesh with each TP/CP/DP/PP/EP group coloured and the "
    "groups that cross the network marked, the pipeline schedule with its bubble, the step-time breakdown, an RL "
    "step's phases, and with recommend=true the top candidates side by side (or a nothing-fits answer's closest "
    "misses). Content: a text summary, the memory picture as SVG image content, and the whole report as an "
    "offline HTML resource. Takes the same arguments as estimate_memory (plus recommend, top_k); the numbers are "
    "the same as the other tools'."
)


def _summary(found: Any) -> str:
    if found.memory is None:
        return f"Nothing to draw: {found.drawn_as}."
    memory = found.memory
    text = (f"{memory.model}, {memory.plan.short()} on {memory.framework} ({found.drawn_as}): peak "
            f"{gib(memory.peak_bytes)} of {gib(memory.capacity_bytes)} on stage {memory.peak_stage}, "
            f"{'fits' if memory.fits else 'does NOT fit'}")
    if found.throughput is not None:
        text += f"; {found.throughput.step_time_s:.3g} s per step, MFU {found.throughput.mfu:.1%}"
    return text + "."


@with_signature([*request_parameters(), *option_parameters(ReportOptions)],
                Annotated[CallToolResult, ReportAnswer])  # type: ignore[arg-type]
def render_report(**args: Any) -> CallToolResult:
    from meshplan.faces import report

    with tool_errors():
        options = take_options(ReportOptions, args)
        found = report.gather(to_request(args), recommend=options.recommend, top_k=options.top_k)
    pictures = report.figures(found)
    html = report.render_html(found)
    answer = ReportAnswer(
        summary=_summary(found), plan=found.plan, drawn=found.drawn_as, figures=[f.id for f in pictures],
        html_uri=REPORT_URI, html_chars=len(html),
        next_steps=["Open the embedded HTML resource for every picture with its numbers beside it.",
                    "Call estimate_memory / estimate_throughput with the plan's fields for the same numbers as JSON."])
    content: list[Any] = [TextContent(type="text", text=answer.summary)]
    memory = next((f for f in pictures if f.id == "memory"), None)
    if memory is not None:
        data = base64.b64encode(report.svg(memory).encode()).decode()
        content.append(ImageContent(type="image", data=data, mime_type="image/svg+xml"))
    content.append(EmbeddedResource(type="resource", resource=TextResourceContents(
        uri=REPORT_URI, mime_type="text/html", text=html)))
    return CallToolResult(content=content, structured_content=answer.model_dump(mode="json"))


REPORT_TOOL = (render_report, "Draw a plan (memory, mesh, schedule)", RENDER_REPORT)

