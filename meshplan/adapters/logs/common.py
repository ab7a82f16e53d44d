"""What every log reader shares: the records a log line gives (one training step's figures, one memory report) and
how a reading becomes one `MeasuredRun` (the peak memory over every report, the median of the steady steps).

Each framework's reader (one module each) only knows its own line formats, from the framework's source; units
are converted here once: torch's counters are bytes, and every framework divides them by 1024**3 even where it
prints "GB" (Megatron: MB = 1024**2).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, fields

from meshplan.schema.measured import MeasuredRun

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torchtitan and KempnerForge colour their metrics lines on a terminal
NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


def number(text: str) -> float:
    """A logged number: thousands separators dropped ('10,050' -> 10050.0)."""
    return float(text.replace(",", ""))


def plain_lines(text: str) -> list[str]:
    """The log's lines with terminal colour codes removed (line N of the list is line N + 1 of the file)."""
    return ANSI.sub("", text).splitlines()


@dataclass
class StepFigures:
    """One logged training step (or logging interval): the figures its line states, None where it states none."""

    line: int
    step: int | None = None
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    mfu: float | None = None
    tflops_per_gpu: float | None = None
    # an RL step's actor update alone (verl's timing_s/update_actor, SkyRL's timing/policy_train)
    actor_update_s: float | None = None
    global_batch_size: float | None = None  # as logged; a measured one is whole


@dataclass
class MemoryFigures:
    """One memory report: the peaks it states, bytes as logged (None: not stated; whole bytes once summarised)."""

    line: int
    allocated_bytes: float | None = None
    reserved_bytes: float | None = None


@dataclass
class LogReading:
    framework: str
    path: str
    steps: list[StepFigures] = field(default_factory=list)
    memory: list[MemoryFigures] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rl_fields: dict[str, int] | None = None  # an RL trainer's log: the RL request fields it states (MeasuredRun's)

    @property
    def empty(self) -> bool:
        return not self.steps and not self.memory


STEP_FIGURES = tuple(f.name for f in fields(StepFigures) if f.name not in ("line", "step"))


def steady(steps: list[StepFigures]) -> tuple[list[StepFigures], str]:
    """The steps a median is taken over: every logged step but the first when there are several (the first holds
    the warm-up: compilation, allocator growth, NCCL set-up), each step once (every rank may log it)."""
    seen: set[int] = set()
    unique = []
    for s in steps:
        if s.step is not None and s.step in seen:
            continue
        if s.step is not None:
            seen.add(s.step)
        unique.append(s)
    if len(unique) > 1:
        return unique[1:], f"median of {len(unique) - 1} logged steps (the first, warm-up, left out)"
    return unique, "the one logged step"


def _measured(records: list, attr: str, notes: list[str], path: str) -> list:
    """The records whose `attr` is a measurement: a logged time, rate, batch or peak is finite and positive, a batch
    whole, an MFU at most 1 (a negative step time such as 'elapsed time per iteration (ms): -5.0' was compared as
    measured, an infinite peak or batch raised OverflowError, a zero step time or batch was shown as measured while
    the rates derived from it read it as absent, and verl's perf/mfu/actor 1.018 was compared as 101.8% of the GPU's
    peak); the others are left out, each named with its line."""
    kept = []
    for record in records:
        value = getattr(record, attr)
        if value is None:
            continue
        if math.isfinite(value) and value > 0 and (attr != "global_batch_size" or float(value).is_integer()):
            if attr == "mfu" and value > 1:
                notes.append(f"{path}:{record.line}: mfu = {value:g} is over the GPU's peak, which no run reaches: the "
                             "framework divided its FLOPs by a lower peak than the GPU's, so it is not this GPU's MFU: "
                             "left out")
                continue
            kept.append(record)
        else:
            notes.append(f"{path}:{record.line}: {attr} = {value:g} is not a measurement (a logged time, rate, "
                         "batch or peak is finite and positive, a batch whole): left out")
    return kept


def summarise(reading: LogReading) -> MeasuredRun:
    """One MeasuredRun: the largest peak any memory report states, the median of each step figure."""
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    notes = list(reading.notes)
    for name, attr in (("peak_allocated_bytes", "allocated_bytes"), ("peak_reserved_bytes", "reserved_bytes")):
        stated = _measured(reading.memory, attr, notes, reading.path)
        if stated:
            top = max(stated, key=lambda m: getattr(m, attr))
            values[name] = int(getattr(top, attr))
            sources[name] = f"{reading.path}:{top.line}"
    kept, how = steady(reading.steps)
    for name in STEP_FIGURES:
        stated = _measured(kept, name, notes, reading.path)
        if stated:
            median = statistics.median(getattr(s, name) for s in stated)
            values[name] = int(median) if name == "global_batch_size" else float(median)
            lines = sorted({s.line for s in stated})
            sources[name] = f"{reading.path}:{lines[0]}" + (f"-{lines[-1]}" if len(lines) > 1 else "")
    if kept:
        notes.append(f"step figures: {how}")
    return MeasuredRun(framework=reading.framework, path=reading.path, steps=len(reading.steps), sources=sources,
                       notes=notes, rl_fields=reading.rl_fields, **values)
