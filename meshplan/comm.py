"""Collective and point-to-point times on a two-level topology: a fast domain (NVLink) and the network.

Ranks are numbered the Megatron-Core way (TP innermost, then CP, then DP, PP outermost; experts
ETP, EP, expert-DP, PP), so a process group is `size` ranks spaced `stride` apart. How many of
them share one fast domain decides which link a collective runs on. A ring over several domains
could move each domain's share through all k member NICs in parallel (one NCCL ring per NIC); the
measured runs get less, so a ring's cross-domain bandwidth is NIC x k**ring_nic_scaling (fitted),
capped by NVLink; all-to-all traffic to other
domains always leaves through the sender's own NIC. Times are bandwidth terms plus a per-hop
latency (alpha-beta model).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.calibration import Calibration
from meshplan.mesh import fast_domain, per_domain
from meshplan.schema import GpuSpec


@dataclass(frozen=True)
class Links:
    """Effective link speeds of one job: achievable bytes/s and per-hop latencies."""

    domain: int  # GPUs sharing the fast interconnect
    intra_bw: float
    inter_bw: float
    intra_lat: float
    inter_lat: float
    nic_scaling: float  # how much of the k NICs of a domain one ring really uses: k ** nic_scaling
    node: int = 0  # GPUs per host (the a2a level of hierarchical CP stays inside one)


def links(gpu: GpuSpec, gpus_per_node: int, cal: Calibration) -> Links:
    return Links(
        domain=fast_domain(gpu, gpus_per_node),
        intra_bw=gpu.intra_node_bandwidth * cal.nvlink_efficiency,
        inter_bw=gpu.network_bandwidth * cal.network_efficiency,
        intra_lat=cal.latency_intra_s,
        inter_lat=cal.latency_inter_s,
        nic_scaling=cal.ring_nic_scaling,
        node=gpus_per_node,
    )


def ring_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """All-gather or reduce-scatter of a tensor of `nbytes` (the full, unsharded size) over a ring."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    moved = nbytes * (size - 1) / size
    if k >= size:
        return moved / lk.intra_bw + (size - 1) * lk.intra_lat
    domains = -(-size // k)
    bw = min(lk.intra_bw, k**lk.nic_scaling * lk.inter_bw)
    return moved / bw + (k - 1) * lk.intra_lat + (domains - 1) * lk.inter_lat


def allreduce_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """Ring all-reduce = reduce-scatter + all-gather."""
    return 2.0 * ring_time(nbytes, size, stride, lk)


def alltoall_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """All-to-all where each rank holds `nbytes` spread evenly over the group (it keeps 1/size)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    intra = nbytes * (k - 1) / size
    inter = nbytes * (size - k) / size
    lat = lk.intra_lat if k >= size else lk.inter_lat
    return max(intra / lk.intra_bw, inter / lk.inter_bw) + lat


def dispatch_time(copy_bytes: float, copies: int, size: int, stride: int, lk: Links, dedup: bool) -> float:
    """One MoE dispatch (or combine) all-to-all: each rank's tokens, `copies` routed copies of `copy_bytes`
    each, spread evenly over the `size` ranks of the expert-parallel group.

    `dedup` is Megatron-Core's flex dispatcher (DeepEP / HybridEP): a token crosses the network once per
    destination domain and is fanned out to the experts there over NVLink. With uniform routing a given
    remote domain holds at least one of the copies with probability 1 - (1 - 1/n)^copies (n domains), so
    a token crosses the network (n-1)(1 - (1 - 1/n)^copies) times instead of copies * (size-k)/size.
    """
    if size <= 1 or copy_bytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    if not dedup or k >= size:
        return alltoall_time(copy_bytes * copies, size, stride, lk)
    domains = -(-size // k)
    remote = copies * (size - k) / size
    crossings = (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** copies)
    # NVLink carries the copies for the own domain plus the fan-out of the copies that arrived.
    intra = copy_bytes * (copies * (k - 1) / size + remote)
    inter = copy_bytes * crossings
    return max(intra / lk.intra_bw, inter / lk.inter_bw) + lk.inter_lat


def p2p_time(nbytes: float, cross: bool, lk: Links, inter_lat: float | None = None) -> float:
    if nbytes <= 0:
        return 0.0
    if cross:
        return nbytes / lk.inter_bw + (lk.inter_lat if inter_lat is None else inter_lat)
    return nbytes / lk.intra_bw + lk.intra_lat
