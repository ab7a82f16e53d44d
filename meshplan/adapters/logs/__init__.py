"""Reads what a training run's own log measured: its peak memory and its step time / throughput, one reader per
framework (each module names the framework source its line formats come from). Nothing is fitted here: the
figures are the log's, converted to bytes and seconds (common.py), with the line each came from.

megatron.py (Megatron-LM / Core / Bridge iteration and memory lines), deepspeed.py (ThroughputTimer and
see_memory_usage lines, plus Megatron-DeepSpeed's iteration lines), torchtitan.py (metrics lines), verl.py (console
metrics per RL step), skyrl.py (console tracker and timer lines), kempnerforge.py (metrics lines).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from meshplan.adapters.logs import deepspeed, kempnerforge, megatron, skyrl, torchtitan, verl
from meshplan.adapters.logs.common import ANSI, LogReading, summarise
from meshplan.core.errors import MeshplanError
from meshplan.schema.measured import MeasuredRun

MAX_LOG_CHARS = 64 << 20  # a training log excerpt; a longer text is refused, not read

# The reader of each framework's log (Megatron-Bridge logs through Megatron-Core's training loop).
READERS: dict[str, ModuleType] = {
    "megatron-core": megatron, "megatron-bridge": megatron, "deepspeed": deepspeed, "torchtitan": torchtitan,
    "verl": verl, "skyrl": skyrl, "kempnerforge": kempnerforge,
}
# Detection order: DeepSpeed's own lines before Megatron's (a Megatron-DeepSpeed log has both).
DETECTION = (("deepspeed", deepspeed), ("megatron-core", megatron), ("torchtitan", torchtitan), ("verl", verl),
             ("skyrl", skyrl), ("kempnerforge", kempnerforge))


def detect_log(text: str) -> str | None:
    """The framework whose log lines the text holds (None: none recognised)."""
    plain = ANSI.sub("", text)
    for name, module in DETECTION:
        if module.DETECT.search(plain):
            return name
    return None


def _formats() -> str:
    return ", ".join(sorted({m.__name__.rsplit(".", 1)[1] for m in READERS.values()}))


def read_log(text: str, path: str = "<log_text>", framework: str | None = None) -> MeasuredRun:
    """What the log measured, read with `framework`'s reader (detected when None). A log with no line that reader
    knows is a MeshplanError naming what was looked for and, when another framework's lines are there, whose."""
    if not isinstance(text, str) or not text.strip():
        raise MeshplanError(f"{path}: the log is empty.", fix="Pass the training log (stdout of the run).")
    if len(text) > MAX_LOG_CHARS:
        raise MeshplanError(f"{path}: more than {MAX_LOG_CHARS:,} characters; a log is read up to that.",
                            fix="Pass the part with the iteration and memory lines (tail -n 2000 LOG).")
    found = detect_log(text)
    name = framework or found
    if name is None:
        raise MeshplanError(f"{path}: no training-log line meshplan reads (it reads {_formats()} logs).",
                            fix="Pass the run's stdout with its iteration / step metrics lines.")
    module = READERS.get(name)
    if module is None:
        raise MeshplanError(f"meshplan has no log reader for {name} yet.", fix=f"It reads: {_formats()}.")
    read: Callable[[str, str, str], LogReading] = module.read
    reading = read(text, path, name)
    if reading.empty:
        other = f"; it looks like a {found} log" if found and READERS.get(found) is not module else ""
        raise MeshplanError(f"{path}: no {name} step or memory line found{other}.",
                            fix=f"Pass the {name} run's own log, or the config of the run this log is from "
                                f"(lines looked for: {module.LOOKS_LIKE}).")
    return summarise(reading)


def log_file_text(path: str) -> str:
    """A log file's text, read up to one character past MAX_LOG_CHARS and never whole: a long run's stdout can hold
    gigabytes, which `meshplan compare --log` read into memory in full before read_log refused it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_LOG_CHARS + 1)
    except OSError as exc:
        raise MeshplanError(f"Cannot read the log {path}: {exc.strerror or exc}.",
                            fix="Check the log's path.") from None


def read_log_file(path: str, framework: str | None = None) -> MeasuredRun:
    return read_log(log_file_text(path), path, framework)


__all__ = ["READERS", "detect_log", "log_file_text", "read_log", "read_log_file"]
