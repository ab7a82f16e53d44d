"""torchtitan training logs, from torchtitan/components/metrics.py (MetricsProcessor.log):
    step: 200  loss:  6.1384  memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%
`memory` is device_memory_monitor's max_reserved_gib (torch.cuda max_memory_reserved / 1024**3) since the last log
line; `tps` is tokens per second per GPU (tokens since the last log / (seconds x the non-data-parallel size), i.e.
per data-parallel rank, divided over the ranks that share its tokens); `mfu` is in percent. Older releases print
`est_tflops` / `est_mfu`; grad_norm and data-loading time may sit between the fields.
"""

from __future__ import annotations

import re

from meshplan.adapters.logs.common import NUMBER, LogReading, MemoryFigures, StepFigures, number, plain_lines
from meshplan.core.units import GIB

STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:")
MEMORY = re.compile(rf"\bmemory:\s*({NUMBER})GiB")
TPS = re.compile(rf"\btps:\s*({NUMBER})")
TFLOPS = re.compile(rf"\b(?:est_)?tflops:\s*({NUMBER})")
MFU = re.compile(rf"\b(?:est_)?mfu:\s*({NUMBER})%")
DETECT = re.compile(r"\bstep:\s*\d+\s+loss:.*\bmemory:\s*[\d.]+GiB")
LOOKS_LIKE = "'step: 10  loss: ...  memory: 30.2GiB(...) ...'"  # what DETECT finds, in an error's words


def read(text: str, path: str, framework: str = "torchtitan") -> LogReading:
    reading = LogReading(framework=framework, path=path)
    for i, line in enumerate(plain_lines(text), start=1):
        step = STEP.search(line)
        if step is None:
            continue
        figures = StepFigures(line=i, step=int(step.group(1)))
        for pattern, attr, scale in ((TPS, "tokens_per_s_per_gpu", 1.0), (TFLOPS, "tflops_per_gpu", 1.0),
                                     (MFU, "mfu", 0.01)):
            if (found := pattern.search(line)) is not None:
                setattr(figures, attr, number(found.group(1)) * scale)
        reading.steps.append(figures)
        if (memory := MEMORY.search(line)) is not None:
            reading.memory.append(MemoryFigures(line=i, reserved_bytes=number(memory.group(1)) * GIB))
    if reading.memory:
        reading.notes.append("peak reserved: torchtitan's `memory` (max_memory_reserved since the previous log line)")
    return reading
