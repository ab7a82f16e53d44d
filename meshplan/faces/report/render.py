"""Write a report: each figure as a standalone SVG, and all of them in one self-contained HTML file.

The drawing is plain SVG written by jinja2 templates (templates/figure.svg.j2, report.html.j2): jinja2 is already
meshplan's dependency (the adapters' templates), it escapes every value (a model name from a pasted config.json
cannot inject markup), and no browser, font or native library is needed to write the file. The HTML carries its
CSS inline, no script and no link to anything outside itself, so it opens offline and can be mailed as it is.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

from meshplan import __version__
from meshplan.faces.report.figures import memory_figure, rl_figure, steptime_figure
from meshplan.faces.report.figures_layout import candidates_figure, mesh_figure, schedule_figure
from meshplan.faces.report.gather import PlanReport
from meshplan.faces.report.shapes import Figure


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("meshplan.faces.report", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
    )


def figures(report: PlanReport) -> list[Figure]:
    """The report's pictures, in reading order; a picture with nothing to show (no pipeline, not RL) is left out."""
    found: list[Figure | None] = []
    if report.recommendation is not None:
        found.append(candidates_figure(report.recommendation))
    if report.memory is not None:
        found.append(memory_figure(report.memory, report.budget_bytes, report.headroom))
    if report.memory is not None and report.throughput is not None:
        found.append(rl_figure(report.memory, report.throughput))
    found.append(mesh_figure(report))
    found.append(schedule_figure(report))
    if report.throughput is not None:
        found.append(steptime_figure(report.throughput))
    return [f for f in found if f is not None]


def svg(figure: Figure) -> str:
    """One figure as a standalone SVG document (its styles inside it)."""
    return environment().get_template("figure.svg.j2").render(fig=figure, standalone=True)


def title(report: PlanReport) -> str:
    model = report.memory.model if report.memory is not None else report.request.model
    plan = f" with {report.plan.short()}" if report.plan is not None else ""
    return f"meshplan report: {model}{plan} on {report.request.gpu}"


def render_html(report: PlanReport, *, fragment: bool = False) -> str:
    """The whole report as one HTML document (or, `fragment`, its body only, for the served page)."""
    figs = figures(report)
    pictures = [(f, environment().get_template("figure.svg.j2").render(fig=f, standalone=False)) for f in figs]
    name = "report_body.html.j2" if fragment else "report.html.j2"
    return environment().get_template(name).render(report=report, pictures=pictures, title=title(report),
                                                    version=__version__)


def render_svgs(report: PlanReport, directory: Path) -> list[Path]:
    """Each figure as DIRECTORY/<id>.svg; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in figures(report):
        path = directory / f"{figure.id}.svg"
        path.write_text(svg(figure), encoding="utf-8")
        written.append(path)
    return written
