"""Figures of one plan's memory, step time and RL phases: the api's numbers laid out as shapes.

Every height and width is a report field scaled to the picture; the numbers printed beside each picture are the
same fields, so a reader (or a test) can match each bar to `meshplan memory --json`.
"""

from __future__ import annotations

from meshplan.faces.report.shapes import (
    NETWORK,
    PART_COLOURS,
    Figure,
    Shape,
    Table,
    gib_text,
    line,
    rect,
    seconds,
    text,
)
from meshplan.schema.reports import MemoryReport, StageMemory, ThroughputReport

LEFT, TOP, PLOT_H = 70.0, 30.0, 300.0
RESERVE = "allocator_reserve"  # the detail key for memory the caching allocator holds beyond what is allocated


def stage_parts(stage: StageMemory) -> list[tuple[str, int]]:
    """A stage's stacked segments, bottom up: the report's parts, `other` split into buffers and the allocator's
    reserve (reserved but not allocated) where the report names it."""
    reserve = stage.detail.get(RESERVE, 0)
    return [("weights", stage.weights_bytes), ("gradients", stage.gradients_bytes),
            ("optimizer", stage.optimizer_bytes), ("activations", stage.activations_bytes),
            ("buffers", stage.other_bytes - reserve), ("reserve", reserve)]


def _y(value: float, top: float) -> float:
    return TOP + PLOT_H * (1.0 - value / top)


def _tick_step(top: float) -> float:
    """A round GiB step giving at most six ticks under `top` bytes."""
    step = 1.0
    while top / (step * 2**30) > 6:
        step *= 2.5 if str(step).startswith("2") else 2
    return step * 2**30


def _axis(top: float, width: float) -> list[Shape]:
    """The memory axis: round GiB ticks and the baseline."""
    shapes = [line(LEFT, TOP + PLOT_H, width - 10, TOP + PLOT_H, "#333")]
    step = _tick_step(top)
    for i in range(int(top // step) + 1):
        value = step * i
        shapes.append(text(LEFT - 6, _y(value, top) + 4, f"{value / 2**30:,.0f} GiB", "tick", anchor="end"))
        shapes.append(line(LEFT, _y(value, top), width - 10, _y(value, top), "#e4e4e4"))
    return shapes


def _limits(report: MemoryReport, budget: int, headroom: float, top: float, width: float
            ) -> tuple[list[Shape], list[Shape]]:
    """The capacity and headroom lines, and their labels: drawn after the bars, with a halo (svg.css limit-label),
    so a bar reaching the right edge does not hide them."""
    cap_y, budget_y = _y(report.capacity_bytes, top), _y(budget, top)
    lines = [line(LEFT, cap_y, width - 10, cap_y, "#000", "capacity"),
             line(LEFT, budget_y, width - 10, budget_y, NETWORK, "headroom-line", dash=True)]
    labels = [text(width - 12, cap_y - 4, f"capacity {gib_text(report.capacity_bytes)}", "label limit-label",
                   anchor="end"),
              text(width - 12, budget_y + 13, f"headroom line: {headroom:.0%} free", "label limit-label",
                   anchor="end")]
    return lines, labels


def _stage_bar(stage: StageMemory, x: float, w: float, top: float, peak: bool) -> list[Shape]:
    shapes, base = [], 0
    for part, nbytes in stage_parts(stage):
        if nbytes <= 0:
            continue
        y0, y1 = _y(base + nbytes, top), _y(base, top)
        shapes.append(rect(x, y0, w, y1 - y0, PART_COLOURS[part], f"seg seg-{part}",
                           f"stage {stage.stage} {part}: {gib_text(nbytes)}", stage=stage.stage, part=part,
                           bytes=nbytes))
        base += nbytes
    shapes.append(rect(x, _y(stage.total_bytes, top), w, PLOT_H * stage.total_bytes / top, "none",
                       "stage-bar", f"stage {stage.stage}: {gib_text(stage.total_bytes)} reserved",
                       stroke="#000" if peak else "#555", stage=stage.stage, total_bytes=stage.total_bytes,
                       allocated_bytes=stage.total_bytes - stage.detail.get(RESERVE, 0)))
    if stage.host_bytes:
        shapes.append(rect(x + w + 2, _y(stage.host_bytes, top), w / 3, PLOT_H * stage.host_bytes / top,
                           PART_COLOURS["host"], "seg seg-host host-bar", f"stage {stage.stage} offloaded to host: "
                           f"{gib_text(stage.host_bytes)}", stroke="#886", stage=stage.stage, bytes=stage.host_bytes))
    shapes.append(text(x + w / 2, TOP + PLOT_H + 16, str(stage.stage), "tick", anchor="middle"))
    return shapes


def _legend(x: float, y: float) -> list[Shape]:
    shapes = []
    for i, (part, colour) in enumerate(PART_COLOURS.items()):
        row, col = divmod(i, 4)
        shapes.append(rect(x + col * 92, y + row * 16, 10, 10, colour, "legend"))
        shapes.append(text(x + col * 92 + 14, y + row * 16 + 9, part, "label"))
    return shapes


def memory_figure(report: MemoryReport, budget: int, headroom: float) -> Figure:
    """One stacked bar per pipeline stage against the capacity and the headroom line."""
    n = len(report.stages)
    width = LEFT + max(420.0, min(1000.0, 70.0 * n)) + 20
    slot = (width - LEFT - 30) / n
    bar = min(60.0, slot * 0.6)
    tallest = max([s.total_bytes for s in report.stages] + [s.host_bytes for s in report.stages])
    top = max(report.capacity_bytes, tallest) * 1.08
    limit_lines, limit_labels = _limits(report, budget, headroom, top, width)
    shapes = [*_axis(top, width), *limit_lines]
    for i, stage in enumerate(report.stages):
        shapes += _stage_bar(stage, LEFT + 10 + i * slot, bar, top, stage.stage == report.peak_stage)
    shapes += limit_labels
    shapes.append(text(LEFT + (width - LEFT) / 2, TOP + PLOT_H + 34, "pipeline stage", "label", anchor="middle"))
    shapes += _legend(LEFT, TOP + PLOT_H + 46)
    rows = [[str(s.stage), str(s.layers), *(gib_text(b) for _, b in stage_parts(s)), gib_text(s.total_bytes),
             gib_text(s.total_bytes - s.detail.get(RESERVE, 0)), gib_text(s.host_bytes)] for s in report.stages]
    verdict = "fits" if report.fits else "does NOT fit"
    caption = (f"Per-GPU memory of each pipeline stage ({report.plan.short()}, {report.framework}): peak "
               f"{gib_text(report.peak_bytes)} on stage {report.peak_stage} of {gib_text(report.capacity_bytes)}; "
               f"{verdict} ({report.fit_basis} peak decides: {gib_text(report.fit_bytes)}), headroom "
               f"{gib_text(report.headroom_bytes)}.")
    header = ["stage", "layers", "weights", "gradients", "optimizer", "activations", "buffers", "allocator reserve",
              "reserved (total)", "allocated", "host-offloaded"]
    notes = [f"headroom line: {headroom:g} of capacity kept free ({gib_text(budget)} usable)",
             "allocated = reserved minus the allocator's reserve; the bar's outline is the reserved total"]
    return Figure("memory", "Memory per pipeline stage", width, TOP + PLOT_H + 84, shapes, caption,
                  [Table(header, rows)], notes)


STEP_PARTS = [("compute_s", "compute", "#0072B2"), ("tp_comm_s", "TP comm", "#E69F00"),
              ("cp_comm_s", "CP comm", "#F0E442"), ("ep_comm_s", "EP comm", "#D55E00"),
              ("dp_comm_s", "DP comm", "#009E73"), ("pp_comm_s", "PP comm", "#56B4E9"),
              ("bubble_s", "pipeline bubble", "#999999"), ("recompute_s", "recompute", "#CC79A7"),
              ("offload_s", "offload", "#886600"), ("other_s", "other", "#444444")]


def steptime_figure(report: ThroughputReport) -> Figure:
    """Where one step's time goes: the breakdown as one stacked bar, the step time marked. An RL step's breakdown is
    the actor's training step over its batch (ThroughputReport.actor_step_words), drawn against that step, not the
    RL step, whose parts the RL figure draws."""
    width, left, bar_w = 860.0, 20.0, 800.0
    parts = [(key, name, colour, getattr(report.breakdown, key)) for key, name, colour in STEP_PARTS]
    rl = report.rl is not None
    step = report.actor_step_s() if rl else report.step_time_s
    mark = "actor step" if rl else "step"
    total = max(step, sum(p[3] for p in parts)) or 1.0
    shapes, x = [], left
    for key, name, colour, value in parts:
        if value <= 0:
            continue
        w = bar_w * value / total
        shapes.append(rect(x, 30, w, 40, colour, "step-part", f"{name}: {seconds(value)}", part=key, seconds=value))
        x += w
    step_x = left + bar_w * step / total
    shapes += [line(step_x, 22, step_x, 78, "#000", "step-time"),
               text(step_x, 18, f"{mark} {seconds(step)}", "label",  # near the right edge: ends at the mark
                    anchor="end" if step_x > width - 80 else "middle")]
    for i, (_, name, colour, value) in enumerate(p for p in parts if p[3] > 0):
        shapes += [rect(left + (i % 5) * 160, 90 + (i // 5) * 18, 10, 10, colour, "legend"),
                   text(left + (i % 5) * 160 + 14, 99 + (i // 5) * 18, f"{name} {seconds(value)}", "label")]
    rows = [[name, seconds(value)] for _, name, _, value in parts]
    rows += [*([["actor step", seconds(step)]] if rl else []),
             ["RL step time" if rl else "step time", seconds(report.step_time_s)],
             ["tokens/s per GPU", f"{report.tokens_per_s_per_gpu:,.1f}"],
             ["MFU (the actor update's)" if rl else "MFU", f"{report.mfu:.2%}"]]
    caption = (f"One step of {report.plan.short()}: {seconds(report.step_time_s)}, "
               f"{report.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {report.mfu:.1%}." if not rl else
               f"The actor's training step of {report.plan.short()} over the RL step's batch: {seconds(step)} of the "
               f"RL step's {seconds(report.step_time_s)} (the RL figure draws the step's parts); "
               f"{report.tokens_per_s_per_gpu:,.0f} tokens/s per GPU over the RL step, MFU {report.mfu:.1%} (the "
               "actor update's).")
    notes = [report.error_band.text] if report.error_band is not None else []
    notes += [report.actor_step_words()] if report.actor_step_words() else []
    return Figure("steptime", "Actor step-time breakdown" if rl else "Step-time breakdown", width, 140, shapes,
                  caption, [Table(["part", "seconds"], rows)], notes)


RL_PARTS = [("generation_s", "generation (rollout)", "rollout"), ("reshard_s", "reshard weights", None),
            ("log_prob_s", "log-prob passes", "log_prob"), ("update_s", "update", "actor_update"),  # PPO's: + critic
            ("offload_s", "phase offloads", None)]


def rl_figure(memory: MemoryReport, throughput: ThroughputReport) -> Figure | None:
    """An RL step's parts over time (width: seconds), each as tall as its phase's peak memory."""
    rl = throughput.rl
    if rl is None or not memory.phases:
        return None
    phases = {p.phase: p for p in memory.phases}
    total = sum(getattr(rl, key) for key, _, _ in RL_PARTS) or 1.0
    top = max([memory.capacity_bytes] + [p.peak_bytes for p in memory.phases]) * 1.08
    width, plot_w = 900.0, 800.0
    shapes, x = [*_axis(top, width)], LEFT
    for key, name, phase_name in RL_PARTS:
        value = getattr(rl, key)
        w = plot_w * value / total
        phase = phases.get(phase_name) if phase_name else None
        peak = phase.peak_bytes if phase else 0
        colour = {"rollout": "#D55E00", "log_prob": "#56B4E9", "actor_update": "#0072B2"}.get(phase_name or "", "#BBB")
        h = PLOT_H * peak / top if peak else 6.0
        shapes.append(rect(x, TOP + PLOT_H - h, w, h, colour, "rl-phase", f"{name}: {seconds(value)}, peak "
                           f"{gib_text(peak)}", phase=phase_name or key, seconds=value, peak_bytes=peak))
        if w > 50:
            shapes.append(text(x + w / 2, TOP + PLOT_H + 16, name, "tick", anchor="middle"))
        x += w
    shapes += [line(LEFT, _y(memory.capacity_bytes, top), width - 10, _y(memory.capacity_bytes, top), "#000",
                    "capacity")]
    rows = [[p.phase, p.pool, gib_text(p.peak_bytes), gib_text(p.fit_bytes), str(p.stage), p.note]
            for p in memory.phases]
    times = [[name, seconds(getattr(rl, key))] for key, name, _ in RL_PARTS]
    times.append(["RL step", seconds(rl.step_s)])
    caption = (f"One RL step ({seconds(rl.step_s)}, limited by {rl.limited_by}): each part's width is its time, its "
               f"height the peak memory of the phase it runs; peak phase {memory.peak_phase}.")
    notes = [rl.overlap_words()] if rl.overlap_words() else []  # a separate pool: the parts drawn pass the step
    return Figure("rl", "RL step: phases over time with their memory", width, TOP + PLOT_H + 30, shapes, caption,
                  [Table(["phase", "pool", "peak", "fit figure", "stage", "note"], rows),
                   Table(["part", "seconds"], times)], notes)
