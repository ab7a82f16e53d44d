"""GPU catalog look-up: the card is the data, this module only finds entries and explains misses."""

from __future__ import annotations

from functools import cache

from meshplan.core.errors import MeshplanError, closest
from meshplan.knowledge.cards import HardwareCard, load_card
from meshplan.schema.hardware import GpuSpec


@cache
def gpu_catalog() -> dict[str, GpuSpec]:
    return {g.key: g for g in load_card("hardware", HardwareCard).gpus}


@cache
def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for gpu in gpu_catalog().values():
        for name in [gpu.key, *gpu.aliases]:
            index[name.lower().replace("_", "-").replace(" ", "-")] = gpu.key
    return index


def get_gpu(name: str) -> GpuSpec:
    """A GPU by key or alias (case-insensitive; 'h100' is the SXM 80GB part)."""
    key = _index().get(str(name).strip().lower().replace("_", "-").replace(" ", "-"))
    if key is None:
        hints = closest(str(name), gpu_catalog())
        raise MeshplanError(
            f"Unknown GPU {name!r}.",
            fix=(f"Did you mean: {', '.join(hints)}? " if hints else "")
            + f"Known GPUs: {', '.join(gpu_catalog())}.",
        )
    return gpu_catalog()[key]
