"""The shapes a figure is made of and the figure record the templates draw: layout only, no estimate."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.core.units import GIB

# Okabe & Ito's colour-blind-safe palette for the memory parts, then a longer cycle for the groups.
PART_COLOURS = {
    "weights": "#0072B2", "gradients": "#E69F00", "optimizer": "#009E73", "activations": "#CC79A7",
    "buffers": "#56B4E9", "reserve": "#BBBBBB", "host": "#F0E442",
}
GROUP_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]
NETWORK = "#C00000"  # what crosses the network is marked in this red


@dataclass(frozen=True)
class Shape:
    """One SVG element: a rect, a line or a text; `data` becomes data-* attributes, `title` a tooltip."""

    kind: str
    x: float
    y: float
    w: float = 0.0
    h: float = 0.0
    fill: str = "none"
    stroke: str = "none"
    text: str = ""
    css: str = ""
    title: str = ""
    dash: bool = False
    anchor: str = "start"
    data: dict[str, str] = field(default_factory=dict)


def rect(x: float, y: float, w: float, h: float, fill: str, css: str = "", title: str = "", stroke: str = "none",
         dash: bool = False, **data: object) -> Shape:
    return Shape("rect", x, y, max(0.0, w), max(0.0, h), fill=fill, stroke=stroke, css=css, title=title, dash=dash,
                 data={k.replace("_", "-"): str(v) for k, v in data.items()})


def line(x1: float, y1: float, x2: float, y2: float, stroke: str, css: str = "", dash: bool = False) -> Shape:
    return Shape("line", x1, y1, x2, y2, stroke=stroke, css=css, dash=dash)


def text(x: float, y: float, words: str, css: str = "", anchor: str = "start") -> Shape:
    return Shape("text", x, y, text=words, css=css, anchor=anchor)


@dataclass(frozen=True)
class Table:
    """The numbers beside a picture: a header row and rows of cells, as printed (greppable)."""

    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    """One picture: its id (the --svg file name), title, size, shapes, a caption and its numbers."""

    id: str
    title: str
    width: float
    height: float
    shapes: list[Shape]
    caption: str
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def gib_text(nbytes: float) -> str:
    """Bytes as the tables print them: GiB to two decimals and the exact bytes (what --json holds)."""
    return f"{nbytes / GIB:,.2f} GiB ({int(nbytes):,} B)"


def seconds(value: float) -> str:
    return f"{value:.4g} s"
