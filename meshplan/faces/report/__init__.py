"""The plan report: pictures of one answer (memory per stage, the device mesh, the pipeline schedule, the step
time, an RL step's phases, recommend's candidates), drawn as inline SVG in one offline HTML file.

`gather.py` asks `meshplan.api` for the numbers (the same calls as the CLI's --json); which ranks form each group
(arithmetic/mesh.mesh_axes) and when each pipeline op runs (arithmetic/pipeline_timeline.timed_actions) come from
the layers the estimates use; `figures.py` and `figures_layout.py` turn the numbers into shapes (layout only: no
estimate is made here); `render.py` writes them through the jinja2 templates in `templates/`.
"""

from meshplan.faces.report.gather import PlanReport, gather
from meshplan.faces.report.render import figures, render_html, render_svgs, svg

__all__ = ["PlanReport", "figures", "gather", "render_html", "render_svgs", "svg"]
