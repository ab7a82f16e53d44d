"""DeepSpeed training logs (and Megatron-DeepSpeed's, whose iteration lines are Megatron's: megatron.py).

From deepspeed/utils/timer.py (ThroughputTimer.stop) and deepspeed/runtime/utils.py (see_memory_usage):
    epoch=0/micro_step=199/global_step=199, RunningAvgSamplesPerSec=58.73, CurrSamplesPerSec=61.35,
        MemAllocated=6.01GB, MaxMemAllocated=19.52GB
    MA 4.96 GB         Max_MA 5.09 GB         CA 6.39 GB         Max_CA 6 GB
Both divide torch's counters by 1024**3 ("GB" = GiB); see_memory_usage rounds Max_CA to whole GiB. The engine's
ThroughputTimer counts the global batch (train_batch_size), so CurrSamplesPerSec is the whole job's.
"""

from __future__ import annotations

import re

from meshplan.adapters.logs import megatron
from meshplan.adapters.logs.common import NUMBER, LogReading, MemoryFigures, StepFigures, number, plain_lines
from meshplan.core.units import GIB

TIMER = re.compile(rf"global_step=(\d+), RunningAvgSamplesPerSec=({NUMBER}), CurrSamplesPerSec=({NUMBER}), "
                   rf"MemAllocated=({NUMBER})GB, MaxMemAllocated=({NUMBER})GB")
SEE_MEMORY = re.compile(rf"\bMA ({NUMBER}) GB\s+Max_MA ({NUMBER}) GB\s+CA ({NUMBER}) GB\s+Max_CA ({NUMBER}) GB")
DETECT = re.compile(r"CurrSamplesPerSec=|\bMax_MA [\d.]+ GB")
LOOKS_LIKE = (  # what DETECT finds, in an error's words
    "'[Rank 0] ... CurrSamplesPerSec=..., MemAllocated=...' or "
    "'MA ... Max_MA 12.3 GB ...'"
)


def read(text: str, path: str, framework: str = "deepspeed") -> LogReading:
    reading = LogReading(framework=framework, path=path)
    lines = plain_lines(text)
    timer_steps: list[StepFigures] = []
    for i, line in enumerate(lines, start=1):
        if (found := TIMER.search(line)) is not None:
            timer_steps.append(StepFigures(line=i, step=int(found.group(1)), samples_per_s=number(found.group(3))))
            reading.memory.append(MemoryFigures(line=i, allocated_bytes=number(found.group(5)) * GIB))
        elif (found := SEE_MEMORY.search(line)) is not None:
            reading.memory.append(MemoryFigures(line=i, allocated_bytes=number(found.group(2)) * GIB,
                                                reserved_bytes=number(found.group(4)) * GIB))
    megatron.read_lines(reading, lines)  # Megatron-DeepSpeed: its iteration lines carry the step time
    if not reading.steps:
        reading.steps = timer_steps
    if any(m.reserved_bytes is not None for m in reading.memory):
        reading.notes.append("peak reserved: see_memory_usage's Max_CA, which DeepSpeed rounds to whole GiB")
    if timer_steps:
        reading.notes.append("DeepSpeed's CurrSamplesPerSec counts the global batch (the whole job's samples/s)")
    return reading
