"""GPU catalog look-up: the card is the data, this module only finds entries and explains misses."""

from __future__ import annotations

from functools import cache

from meshplan.core.errors import MeshplanError, closest
from meshplan.core.units import GBIT_BYTES
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


def with_node_network(gpu: GpuSpec, gbps_per_node: float, node_gpus: int) -> GpuSpec:
    """`gpu` on a cluster whose nodes' NICs move `gbps_per_node` Gb/s each direction, shared evenly by a node's
    `node_gpus` GPUs: the part's record with that share as its network_bandwidth (bytes/s per GPU), the one figure
    every inter-node time reads (arithmetic/comm.links, rl/step_time's weight reshard, rules TP004 and RL004). The
    catalog's figure is a DGX's, one NIC per GPU (H100: 400 Gb/s); a cluster of fewer or slower NICs differs (Jean
    Zay's A100 nodes: 4x Omni-Path 100 Gb/s, 50 Gb/s per GPU)."""
    return gpu.model_copy(update={"network_bandwidth": gbps_per_node * GBIT_BYTES / node_gpus})
