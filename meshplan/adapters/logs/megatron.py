"""Megatron-LM / Megatron-Core (and Megatron-Bridge, Megatron-DeepSpeed) training logs.

Two line kinds, from megatron/training/training.py (training_log, and report_memory in megatron/training/utils.py):
    [Rank 1] (after 1 iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved: ...
    [time] iteration 3/ 100 | consumed samples: ... | elapsed time per iteration (ms): 5410.6 |
        throughput per GPU (TFLOP/s/GPU): 241.4 | ... | global batch size: 128 | ...
report_memory divides torch's counters by 1024 * 1024 ("MB" = MiB). Megatron-DeepSpeed's iteration line adds
`samples per second`, `tokens per gpu per second (tgs)` and `TFLOPs` (its megatron/training.py).
"""

from __future__ import annotations

import re

from meshplan.adapters.logs.common import NUMBER, LogReading, MemoryFigures, StepFigures, number, plain_lines

MIB = 1 << 20
MEMORY = re.compile(rf"memory \(MB\) \| allocated: ({NUMBER}) \| max allocated: ({NUMBER}) \| reserved: ({NUMBER})"
                    rf" \| max reserved: ({NUMBER})")
ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
DETECT = re.compile(r"memory \(MB\) \| allocated:|\biteration\s+\d+\s*/\s*\d+\s*\|.*elapsed time per iteration")
LOOKS_LIKE = (  # what DETECT finds, in an error's words
    "' iteration       10/     100 | ... elapsed time per iteration (ms): ...' or "
    "'[Rank 0] (after 10 iterations) memory (MB) | allocated: ...'"
)

# The iteration line's fields meshplan reads: (Megatron's name, StepFigures field, scale to meshplan's unit)
FIELDS = {
    "elapsed time per iteration (ms)": ("step_time_s", 1e-3),
    "throughput per GPU (TFLOP/s/GPU)": ("tflops_per_gpu", 1.0),
    "TFLOPs": ("tflops_per_gpu", 1.0),
    "samples per second": ("samples_per_s", 1.0),
    "tokens per gpu per second (tgs)": ("tokens_per_s_per_gpu", 1.0),
    "global batch size": ("global_batch_size", 1.0),
}


def iteration_figures(text: str, line: int) -> StepFigures | None:
    """One iteration line's figures (None: not an iteration line)."""
    found = ITERATION.search(text)
    if found is None:
        return None
    figures = StepFigures(line=line, step=int(found.group(1)))
    for part in text[found.end():].split("|"):
        name, _, value = part.partition(":")
        target = FIELDS.get(name.strip())
        if target is None or not re.fullmatch(NUMBER, value.strip()):
            continue
        attr, scale = target
        setattr(figures, attr, number(value.strip()) * scale)  # a batch made whole once measured (common.summarise)
    return figures


def read_lines(reading: LogReading, lines: list[str]) -> None:
    for i, text in enumerate(lines, start=1):
        memory = MEMORY.search(text)
        if memory is not None:
            reading.memory.append(MemoryFigures(line=i, allocated_bytes=number(memory.group(2)) * MIB,
                                                reserved_bytes=number(memory.group(4)) * MIB))
            continue
        figures = iteration_figures(text, i)
        if figures is not None:
            reading.steps.append(figures)


def read(text: str, path: str, framework: str = "megatron-core") -> LogReading:
    reading = LogReading(framework=framework, path=path)
    read_lines(reading, plain_lines(text))
    if reading.memory:
        reading.notes.append("peak memory: Megatron's report_memory (max allocated / max reserved, MiB), the "
                             "largest over the ranks that printed it")
    return reading
