"""How a checked layout is named in a header: light (no rule or estimate is loaded), so the MCP server's start-up
and the CLI's tables can import it."""

from __future__ import annotations

from meshplan.arithmetic import mesh
from meshplan.core.units import plural
from meshplan.knowledge.cards import framework_card
from meshplan.schema.reports import CheckReport


def layout_text(report: CheckReport) -> str:
    """The plan as a header names it: its degrees, and where a world-size rule (WS*) failed, the GPUs those degrees
    make and that the GPU count does not divide into them (dp is then only what the count left over)."""
    broken = sorted({f.id for f in report.findings if f.severity == "error" and f.id.startswith("WS")})
    if not broken:
        return report.plan.short()
    world = mesh.world_size(framework_card(report.framework).world_size_law, report.plan)
    return (f"{report.plan.short()} ({plural(world, 'GPU')}: the GPU count does not divide into this layout, "
            f"{', '.join(broken)})")
