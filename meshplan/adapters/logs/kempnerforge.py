"""KempnerForge training logs, from kempnerforge/metrics/tracker.py (MetricsTracker._log_step, formatted by
kempnerforge/metrics/logger.py format_metrics):
    [step 10] loss=9.1800 | lr=3.00e-04 | grad_norm=1.340 | tok/s=42,000 | mfu=18.2% | mem=2.1/80GB | step_time=0.15s
`tok/s` is the whole job's tokens per second (tokens in the step across all GPUs / step seconds); `mem` is
torch.cuda.max_memory_allocated / 1024**3 over the device's total (kempnerforge/metrics/memory.py).
"""

from __future__ import annotations

import re

from meshplan.adapters.logs.common import NUMBER, LogReading, MemoryFigures, StepFigures, number, plain_lines
from meshplan.core.units import GIB

LINE = re.compile(r"\[step (\d+)\]\s+(.*)")
DETECT = re.compile(r"\[step \d+\].*\btok/s=")
LOOKS_LIKE = "'[step 10] loss=... tok/s=...'"  # what DETECT finds, in an error's words


def read(text: str, path: str, framework: str = "kempnerforge") -> LogReading:
    reading = LogReading(framework=framework, path=path)
    for i, line in enumerate(plain_lines(text), start=1):
        found = LINE.search(line)
        if found is None or "tok/s=" not in line:
            continue
        parts = dict(p.strip().partition("=")[::2] for p in found.group(2).split("|"))
        figures = StepFigures(line=i, step=int(found.group(1)))
        if re.fullmatch(NUMBER, parts.get("tok/s", "")):
            figures.tokens_per_s = number(parts["tok/s"])
        if (mfu := re.fullmatch(rf"({NUMBER})%", parts.get("mfu", ""))) is not None:
            figures.mfu = number(mfu.group(1)) / 100
        if (step := re.fullmatch(rf"({NUMBER})s", parts.get("step_time", ""))) is not None:
            figures.step_time_s = number(step.group(1))
        reading.steps.append(figures)
        if (mem := re.fullmatch(rf"({NUMBER})/{NUMBER}GB", parts.get("mem", ""))) is not None:
            reading.memory.append(MemoryFigures(line=i, allocated_bytes=number(mem.group(1)) * GIB))
    if reading.memory:
        reading.notes.append("peak allocated: KempnerForge's `mem` (max_memory_allocated, GiB to one decimal)")
    return reading
