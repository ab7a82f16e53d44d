"""Figures of where the ranks go and when they work: the device mesh with each parallel group coloured, the
pipeline schedule with its bubble, and recommend's candidates side by side (or a nothing-fits answer's misses).
"""

from __future__ import annotations

import itertools

from meshplan.arithmetic.mesh import MeshAxis
from meshplan.arithmetic.pipeline_timeline import Shape as TimelineShape
from meshplan.arithmetic.pipeline_timeline import rank_actions, timed_actions
from meshplan.arithmetic.schedule import plan_shape
from meshplan.check.split import layout_cells
from meshplan.core.units import GIB, plural
from meshplan.faces.report.gather import PlanReport
from meshplan.faces.report.shapes import (
    GROUP_COLOURS,
    NETWORK,
    Figure,
    Shape,
    Table,
    gib_text,
    line,
    rect,
    seconds,
    text,
)
from meshplan.knowledge.cards import framework_card
from meshplan.rl.engine import ep_words
from meshplan.schema.reports import Candidate, NearMiss, Recommendation
from meshplan.search.answer import offload_words

MAX_DRAWN_RANKS = 256  # a larger world is drawn by its first ranks (whole groups of the inner axes), and says so


MAX_LISTED_RANKS = 16  # a longer group 0 is listed by these first ranks, its last one and its size


def ranks_text(ranks: list[int]) -> str:
    """Group 0's ranks as the table lists them: all of a short group; a long one's first MAX_LISTED_RANKS, its last
    and how many (a DP group of 390,625 ranks wrote every one into the page)."""
    if len(ranks) <= MAX_LISTED_RANKS + 1:
        return " ".join(map(str, ranks))
    return f"{' '.join(map(str, ranks[:MAX_LISTED_RANKS]))} … {ranks[-1]} ({len(ranks):,} ranks)"


def drawn_ranks(world: int) -> int:
    """How many ranks the mesh picture draws: all of them up to MAX_DRAWN_RANKS."""
    return min(world, MAX_DRAWN_RANKS)


def _cell(report: PlanReport) -> float:
    return max(5.0, min(16.0, 160.0 / report.gpus_per_node))


def _rank_xy(report: PlanReport, rank: int, top: float) -> tuple[float, float]:
    """Nodes are columns, a node's GPUs run down its column."""
    node, local = divmod(rank, report.gpus_per_node)
    cell = _cell(report)
    return 20 + node * (cell + 8), top + 18 + local * (cell + 1)


def _domains(report: PlanReport, shown: int, top: float) -> list[Shape]:
    """An outline per fast (NVLink) domain: inside a node, or around several nodes' columns (NVL72)."""
    shapes, cell = [], _cell(report)
    for first in range(0, shown, report.domain):
        last = min(shown, first + report.domain) - 1
        nodes = range(first // report.gpus_per_node, last // report.gpus_per_node + 1)
        x0, y0 = _rank_xy(report, first if len(nodes) == 1 else nodes[0] * report.gpus_per_node, top)
        x1, y1 = _rank_xy(report, last if len(nodes) == 1 else nodes[-1] * report.gpus_per_node
                          + min(report.gpus_per_node, report.domain) - 1, top)
        shapes.append(rect(x0 - 2, y0 - 2, x1 - x0 + cell + 4, y1 - y0 + cell + 4, "none", "domain",
                           "fast (NVLink) domain", stroke="#333"))
    return shapes


def _axis_panel(report: PlanReport, axis: MeshAxis, top: float, shown: int) -> list[Shape]:
    cell = _cell(report)
    groups = report.world // axis.size
    where = "crosses the network" if axis.crosses_network else "inside a fast domain"
    shapes = [text(20, top + 12, f"{axis.name}: {groups} groups of {axis.size} (stride {axis.stride}), {where}",
                   "panel-title network" if axis.crosses_network else "panel-title")]
    for rank in range(shown):
        x, y = _rank_xy(report, rank, top)
        group = axis.group_of(rank)
        shapes.append(rect(x, y, cell, cell, GROUP_COLOURS[group % len(GROUP_COLOURS)], "rank",
                           f"rank {rank}: {axis.name} group {group}", axis=axis.name, rank=rank, group=group))
    first = [r for r in axis.members(0) if r < shown]
    if axis.crosses_network and len(first) > 1:  # group 0's path across the network, drawn in red
        for a, b in itertools.pairwise(first):
            (xa, ya), (xb, yb) = _rank_xy(report, a, top), _rank_xy(report, b, top)
            shapes.append(line(xa + cell / 2, ya + cell / 2, xb + cell / 2, yb + cell / 2, NETWORK, "network-link"))
    return [*shapes, *_domains(report, shown, top)]


def mesh_figure(report: PlanReport) -> Figure | None:
    """One panel per parallel axis (size > 1): every drawn rank coloured by its group, fast domains outlined."""
    if not report.axes:
        return None
    shown = drawn_ranks(report.world)
    cell = _cell(report)
    panel_h = 18 + report.gpus_per_node * (cell + 1) + 22
    nodes = -(-shown // report.gpus_per_node)
    width = max(560.0, 40 + nodes * (cell + 8))
    shapes: list[Shape] = []
    for i, axis in enumerate(report.axes):
        shapes += _axis_panel(report, axis, 10 + i * panel_h, shown)
    rows = [[a.name, str(a.size), str(a.stride), str(report.world // a.size), "yes" if a.crosses_network else "no",
             ranks_text(a.members(0))] for a in report.axes]
    caption = (f"{report.world} GPUs of {report.gpu_name}, {report.gpus_per_node} per node (columns), fast domain "
               f"{report.domain} GPUs (outlined); each panel colours one kind of group; a red line follows group 0 of "
               "each kind that crosses the network.")
    notes = ["ranks in Megatron-Core's order (TP innermost, then CP, DP, PP; experts ETP, EP, expert-DP), the order "
             "meshplan's communication estimate assumes"]
    if shown < report.world:
        notes.append(f"showing ranks 0-{shown - 1} of {report.world}")
    return Figure("mesh", "Device mesh and parallel groups", width, 10 + len(report.axes) * panel_h, shapes, caption,
                  [Table(["group", "size", "stride", "groups", "crosses network", "group 0 ranks"], rows)], notes)


CHUNK_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999"]
MAX_DRAWN_MICROBATCHES_PER_RANK = 2  # micro-batches drawn: 2 x pp (all of them when fewer), enough for the shape
# Unit times of the picture: a chunk's forward 1, its backward 2, of which the weight gradient 1 where the schedule
# runs it apart (zero-bubble, DualPipeV). The shape of the schedule, not its seconds (those are the estimate's).
UNIT_FORWARD, UNIT_BACKWARD, UNIT_WEIGHT_GRADIENT = 1.0, 2.0, 1.0
ORDER_WORDS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B",
               "interleaved_zero_bubble": "interleaved zero-bubble", "zbv_zero_bubble": "ZBV zero-bubble",
               "dualpipev": "DualPipeV", "combined_1f1b": "combined 1F1B"}
ACTION_STYLE = {"F": ("fwd", "forward"), "B": ("bwd", "backward"), "I": ("bwd igrad", "input-gradient backward"),
                "W": ("wgrad", "weight-gradient backward")}


def drawn_microbatches(pp: int, vpp: int, microbatches: int) -> int:
    """Micro-batches the picture draws: all of them, or 2 x pp when there are more (the steady state repeats);
    with several chunks per rank, a multiple of pp once there are pp or more (Megatron runs them in groups of pp)."""
    drawn = max(1, min(microbatches, MAX_DRAWN_MICROBATCHES_PER_RANK * pp))
    return drawn - drawn % pp if vpp > 1 and drawn >= pp else drawn


def schedule_shape(report: PlanReport, microbatches: int) -> TimelineShape:
    """The pipeline the estimate replays for the drawn plan (arithmetic/schedule.plan_shape: the framework's order,
    or the plan's pipeline_schedule), at the drawn micro-batch count."""
    plan = report.plan
    assert plan is not None
    return plan_shape(framework_card(report.framework), plan.pp, plan.vpp, microbatches, plan.runs_schedule)


def _schedule_slots(shape: TimelineShape) -> tuple[list[Shape], float]:
    """A rectangle per action of every rank, where pipeline_timeline.timed_actions puts it; the step's end."""
    p = shape.pp
    split = any(a.kind == "W" for r in range(p) for a in rank_actions(shape, r))
    ranks = timed_actions(shape, [UNIT_FORWARD] * p, [UNIT_BACKWARD] * p, 0.0,
                          [UNIT_WEIGHT_GRADIENT if split else 0.0] * p)
    end = max(t.end for timed in ranks for t in timed)
    unit, row_h, left = min(24.0, 860.0 / end), 20.0, 60.0
    shapes: list[Shape] = []
    for rank, timed in enumerate(ranks):
        y = 20 + rank * (row_h + 4)
        shapes += [rect(left, y, end * unit, row_h, "url(#bubble)", "bubble", f"rank {rank} idle", rank=rank),
                   text(left - 6, y + 14, f"rank {rank}", "tick", anchor="end")]
        for t in timed:
            a = t.action
            css, words = ACTION_STYLE[a.kind]
            stage = shape.stage(a.chunk, rank)
            shapes.append(rect(left + t.start * unit, y, (t.end - t.start) * unit, row_h,
                               CHUNK_COLOURS[a.chunk % len(CHUNK_COLOURS)], f"slot {css}",
                               f"rank {rank} {words} micro-batch {a.mb} chunk {a.chunk} (stage {stage})",
                               stroke="#fff", rank=rank, microbatch=a.mb, chunk=a.chunk, stage=stage, kind=a.kind,
                               start=round(t.start, 6)))
            if unit * (t.end - t.start) >= 14:
                shapes.append(text(left + (t.start + t.end) / 2 * unit, y + 14, f"{a.kind}{a.mb}",
                                   "slot-label" if a.kind == "F" else "slot-label light", anchor="middle"))
    return shapes, end


def schedule_figure(report: PlanReport) -> Figure | None:
    """Each pipeline rank's forwards and backwards in the order and at the moments the step-time estimate replays
    them (arithmetic/pipeline_timeline.py); the gaps are the bubble."""
    plan = report.plan
    if plan is None or plan.pp == 1:
        return None
    drawn = drawn_microbatches(plan.pp, plan.vpp, report.microbatches)
    shape = schedule_shape(report, drawn)
    shapes, end = _schedule_slots(shape)
    left, row_h = 60.0, 20.0
    unit = min(24.0, 860.0 / end)
    bd = report.throughput.breakdown if report.throughput else None
    name = ORDER_WORDS.get(shape.order, shape.order)
    rows = [["schedule", name], ["pipeline ranks (pp)", str(plan.pp)], ["virtual chunks per rank", str(shape.vpp)],
            ["micro-batches per step", str(report.microbatches)], ["micro-batches drawn", str(drawn)]]
    if shape.order in ("interleaved_1f1b", "interleaved_zero_bubble", "combined_1f1b"):
        rows.append(["micro-batches per chunk in turn", str(shape.group)])
    if bd is not None and report.throughput is not None:
        rows += [["bubble", seconds(bd.bubble_s)], *([["actor step", seconds(report.throughput.actor_step_s())]]
                                                      if report.throughput.rl is not None else []),
                 ["RL step time" if report.throughput.rl is not None else "step time",
                  seconds(report.throughput.step_time_s)]]
    caption = (f"The {name} schedule on {plan.pp} pipeline ranks as the step-time estimate replays it: F forward, "
               "B backward, I and W its input- and weight-gradient halves where the schedule runs them apart "
               "(colour: virtual chunk); hatched gaps are the pipeline bubble.")
    notes = ["unit times (a forward 1, a backward 2, its weight gradient 1 of those) show the schedule's shape; the "
             "seconds are the throughput estimate's"]
    if drawn < report.microbatches:
        notes.append(f"drawn with {drawn} of {report.microbatches} micro-batches (the steady state repeats)")
    return Figure("schedule", f"Pipeline schedule ({name}) and its bubble", left + end * unit + 20,
                  30 + plan.pp * (row_h + 4), shapes, caption, [Table(["", "value"], rows)], notes)


def _column(x: float, label: str, speed: float, fastest: float, peak: int, capacity: int, css: str) -> list[Shape]:
    """One candidate: tokens/s per GPU (left bar, scaled to the fastest) and peak memory against capacity (right)."""
    top, h = 30.0, 200.0
    shapes = [text(x + 40, top + h + 18, label, "tick", anchor="middle")]
    if fastest > 0:
        sh = h * speed / fastest
        shapes.append(rect(x, top + h - sh, 34, sh, "#0072B2", f"{css} speed", f"{label}: {speed:,.0f} tokens/s/GPU",
                           tokens_per_s_per_gpu=speed))
        if speed > 0:  # the value on the bar: the picture reads without its table
            shapes.append(text(x + 17, top + h - sh - 3, f"{speed:,.0f}", "tick bar-value", anchor="middle"))
    mh = h * min(peak / capacity, 1.2) / 1.2
    shapes += [rect(x + 40, top + h - mh, 34, mh, NETWORK if peak > capacity else "#009E73", f"{css} peak",
                    f"{label}: peak {gib_text(peak)}", peak_bytes=peak),
               line(x + 38, top + h - h / 1.2, x + 78, top + h - h / 1.2, "#000", "capacity")]
    if peak > 1.2 * capacity:  # the bar stops at 1.2 x capacity: its top says how far over it goes
        shapes.append(text(x + 57, top - 4, f"{peak / capacity:.1f}× capacity", "tick clipped", anchor="middle"))
    else:
        shapes.append(text(x + 57, top + h - mh - 3, f"{peak / GIB:,.1f} GiB", "tick bar-value", anchor="middle"))
    return shapes


def candidates_figure(rec: Recommendation) -> Figure:
    """recommend's ranked layouts side by side, with why each lost to the first; when nothing fits, the misses."""
    rows: list[list[str]] = []
    shapes: list[Shape] = []
    ranked: list[tuple[str, Candidate | NearMiss]] = [(f"#{c.rank}", c) for c in rec.candidates]
    if rec.best_below_headroom is not None:
        ranked.append(("thin headroom", rec.best_below_headroom))
    ranked += [(f"miss {i + 1}", m) for i, m in enumerate(rec.closest)]
    fastest = max([c.throughput.tokens_per_s_per_gpu for _, c in ranked if isinstance(c, Candidate)], default=0.0)
    layouts = layout_cells([c.plan for _, c in ranked])  # a split where two rows would read alike
    # an RL row: the rollout engine and the offloads beside the actor's layout, which RL rows share (the CLI's columns;
    # a rollout_ep above 1 is a MoE model's alone, rule RL007)
    layouts = [layout + (f"; rollout {c.plan.rollout_engine} TP{c.plan.rollout_tp} DP{c.plan.rollout_dp}"
                         f"{ep_words(True, c.plan)} at {c.plan.rollout_memory_fraction:g}; offload "
                         f"{offload_words(c.plan)}" if c.plan.rollout_engine is not None else "")
               for (_, c), layout in zip(ranked, layouts, strict=True)]
    for i, ((label, c), layout) in enumerate(zip(ranked, layouts, strict=True)):
        speed = c.throughput.tokens_per_s_per_gpu if isinstance(c, Candidate) else 0.0
        css = "candidate" if isinstance(c, Candidate) and label.startswith("#") else "near-miss"
        shapes += _column(20 + i * 100, label, speed, fastest, c.memory.peak_bytes, c.memory.capacity_bytes, css)
        time = seconds(c.throughput.step_time_s) if isinstance(c, Candidate) else "-"
        rows.append([label, layout, str(c.plan.micro_batch_size), c.plan.recompute, time,
                     f"{speed:,.1f}" if speed else "-", gib_text(c.memory.peak_bytes), c.rationale])
    if rec.candidates:
        caption = (f"The {len(rec.candidates)} fastest of {rec.considered:,} layouts for {rec.model} on "
                   f"{plural(rec.num_gpus, 'GPU')}: left bar tokens/s per GPU, right bar peak memory against capacity "
                   "(the line).")
    else:
        caption = (f"Nothing keeps the headroom on {plural(rec.num_gpus, 'GPU')}: the closest layouts, peak memory "
                   "against capacity (red: over)."
                   + (f" The smallest GPU count that fits: {rec.min_gpus}." if rec.min_gpus else ""))
    notes = [rec.rationale] + [f"not ranked, {rule}: {n:,}" for rule, n in sorted(rec.rejected.items())]
    header = ["", "plan", "micro-batch", "recompute", "step time", "tokens/s/GPU", "peak memory", "why"]
    return Figure("candidates", "Recommend: candidates side by side", max(560.0, 40 + len(ranked) * 100), 260,
                  shapes, caption, [Table(header, rows)], notes)
