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

import math
from dataclasses import dataclass
from functools import lru_cache

from meshplan.arithmetic.mesh import fast_domain, job_domain, per_domain, wired_node
from meshplan.knowledge.calibration import Calibration
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.plan import Job


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
    wired: int = 0  # GPUs of a node NVLink joins point to point, no NVSwitch (mesh.wired_node); 0: switched

    def nvlink_bw(self, k: int) -> float:
        """NVLink bytes/s one rank reaches in a collective of `k` members on its node: all its links behind an
        NVSwitch; joined point to point (`wired` GPUs), only the links to its k - 1 fellow members, (k - 1) /
        (wired - 1) of them (a TP2 pair of a 4-GPU HGX board: one third)."""
        if self.wired <= 1 or k >= self.wired:
            return self.intra_bw
        return self.intra_bw * max(1, k - 1) / (self.wired - 1)


def job_links(job: Job, cal: Calibration) -> Links:
    """The job's links: its GPU's, with the fast domain in the job's own ranks (mesh.job_domain) and its node's
    NVLink wiring (mesh.wired_node)."""
    return links(job.gpu, job.gpus_per_node, cal, domain=job_domain(job), wired=wired_node(job))


def links(gpu: GpuSpec, gpus_per_node: int, cal: Calibration, domain: int | None = None, wired: int = 0) -> Links:
    return Links(
        domain=fast_domain(gpu, gpus_per_node) if domain is None else domain,
        intra_bw=gpu.intra_node_bandwidth * cal.nvlink_efficiency,
        inter_bw=gpu.network_bandwidth * cal.network_efficiency,
        intra_lat=cal.latency_intra_s,
        inter_lat=cal.latency_inter_s,
        nic_scaling=cal.ring_nic_scaling,
        node=gpus_per_node,
        wired=wired,
    )


def _ring_bw(k: int, size: int, lk: Links) -> float:
    """Bytes/s a ring of `size` ranks, `k` of them per fast domain, moves: NVLink inside one domain (the links to
    its members: Links.nvlink_bw), else the domain's NICs (k**nic_scaling of them) capped by NVLink."""
    return lk.nvlink_bw(k) if k >= size else min(lk.nvlink_bw(k), k**lk.nic_scaling * lk.inter_bw)


def ring_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """All-gather or reduce-scatter of a tensor of `nbytes` (the full, unsharded size) over a ring."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    moved = nbytes * (size - 1) / size
    if k >= size:
        return moved / lk.nvlink_bw(k) + (size - 1) * lk.intra_lat
    domains = -(-size // k)
    return moved / _ring_bw(k, size, lk) + (k - 1) * lk.intra_lat + (domains - 1) * lk.inter_lat


def allreduce_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """Ring all-reduce = reduce-scatter + all-gather."""
    return 2.0 * ring_time(nbytes, size, stride, lk)


def small_allreduce_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """All-reduce of one decode step's activations (a batch x hidden tensor: kilobytes to a few megabytes): the
    ring's two passes of bytes at its bandwidth plus one small-message latency of the slowest link the group
    crosses, where `allreduce_time` adds a latency per ring hop (its per-hop latencies are the training
    collectives' calibration)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    latency = lk.intra_lat if k >= size else lk.inter_lat
    return 2.0 * nbytes * (size - 1) / size / _ring_bw(k, size, lk) + latency


def alltoall_time(nbytes: float, size: int, stride: int, lk: Links) -> float:
    """All-to-all where each rank holds `nbytes` spread evenly over the group (it keeps 1/size)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    intra = nbytes * (k - 1) / size
    inter = nbytes * (size - k) / size
    lat = lk.intra_lat if k >= size else lk.inter_lat
    return max(intra / lk.nvlink_bw(k), inter / lk.inter_bw) + lat


@lru_cache(maxsize=4096)  # the search asks for the same few (copies, domains, groups) many times
def domain_hit(copies: int, domains: int, domain_experts: int, experts: int = 0, num_groups: int = 1,
               group_topk: int = 1) -> float:
    """Chance that one given domain, holding `domain_experts` contiguous experts, receives at least one of a
    token's `copies` routed copies, with routing uniform over the experts it may pick.

    Group-limited routing (Megatron-Core moe_utils.group_limited_topk, HF n_group / topk_group; DeepSeek-V3's
    node-limited routing, at most 4 nodes per token) first picks `group_topk` of `num_groups` equal, contiguous
    groups, then the copies among the picked groups' experts. Where a domain holds whole groups (h of its groups
    picked, hypergeometric) or lies inside one group, the copies land only there; otherwise (groups straddling
    domains) the plain uniform chance is kept.
    """
    plain = 1.0 - (1.0 - 1.0 / domains) ** copies
    if num_groups <= 1 or group_topk >= num_groups or experts <= 0 or experts % num_groups:
        return plain
    per_group = experts // num_groups
    picked = group_topk * per_group  # experts a token may use
    if domain_experts % per_group == 0:
        held = domain_experts // per_group
        total = math.comb(num_groups, group_topk)
        return sum(math.comb(held, h) * math.comb(num_groups - held, group_topk - h) / total
                   * (1.0 - (1.0 - h * per_group / picked) ** copies)
                   for h in range(1, min(held, group_topk) + 1))
    if per_group % domain_experts == 0:
        return group_topk / num_groups * (1.0 - (1.0 - domain_experts / picked) ** copies)
    return plain


def dispatch_time(copy_bytes: float, copies: int, size: int, stride: int, lk: Links, dedup: bool,
                  experts: int = 0, num_groups: int = 1, group_topk: int = 1) -> float:
    """One MoE dispatch (or combine) all-to-all: each rank's tokens, `copies` routed copies of `copy_bytes`
    each, spread evenly over the `size` ranks of the expert-parallel group.

    `dedup` is Megatron-Core's flex dispatcher (DeepEP / HybridEP): a token crosses the network once per
    destination domain and is fanned out to the experts there over NVLink, so it crosses (n-1) x
    `domain_hit` times (n domains) instead of copies * (size-k)/size; group-limited routing (`experts`,
    `num_groups`, `group_topk`) lowers that chance. The plain all-to-all sends every copy, groups or not.
    """
    if size <= 1 or copy_bytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    if not dedup or k >= size:
        return alltoall_time(copy_bytes * copies, size, stride, lk)
    domains = -(-size // k)
    remote = copies * (size - k) / size
    domain_experts = experts * k // size if experts % size == 0 else 0
    crossings = (domains - 1) * domain_hit(copies, domains, domain_experts, experts if domain_experts else 0,
                                           num_groups, group_topk)
    # NVLink carries the copies for the own domain plus the fan-out of the copies that arrived.
    intra = copy_bytes * (copies * (k - 1) / size + remote)
    inter = copy_bytes * crossings
    return max(intra / lk.nvlink_bw(k), inter / lk.inter_bw) + lk.inter_lat


@lru_cache(maxsize=256)  # small ints; asked per MoE layer of every estimate of a job that sets the fake gate
def consecutive_routing(experts: int, top_k: int, ep: int, domain_ranks: int) -> tuple[float, float]:
    """(EP ranks, NVLink domains) one token's routed copies reach, averaged over tokens, where routing gives token t
    the consecutive experts (t x top_k + j) mod experts, j < top_k: NeMo AutoModel's FakeBalancedGate at noise 0
    (components/moe/layers.py, model.backend.fake_balanced_gate), its experts sharded contiguously over the `ep`
    ranks (experts / ep each), `domain_ranks` EP ranks per NVLink domain. The pattern repeats every `experts`
    tokens, so the mean over one period is exact."""
    local = experts // ep
    domain = local * min(domain_ranks, ep)
    ranks = domains = 0
    for t in range(experts):
        picked = [(t * top_k + j) % experts for j in range(top_k)]
        ranks += len({e // local for e in picked})
        domains += len({e // domain for e in picked})
    return ranks / experts, domains / experts


def consecutive_spread(experts: int, top_k: int, size: int, stride: int, lk: Links) -> tuple[float, float]:
    """consecutive_routing over an EP group of `size` ranks at `stride`, its NVLink domains as the links place them."""
    return consecutive_routing(experts, top_k, size, per_domain(size, stride, lk.domain))


def consecutive_dispatch_time(copy_bytes: float, ranks: float, domains: float, size: int, stride: int,
                              lk: Links) -> float:
    """One flex (DeepEP / HybridEP) dispatch (or combine) of consecutive routing (consecutive_routing's `ranks` and
    `domains` per token): DeepEP sends a token once per destination rank (is_token_in_rank), once per destination
    node over the network; a destination is the token's own rank (domain) with chance 1/size (1/domains of the
    group), as the consecutive blocks cycle over every rank. Every off-rank delivery crosses NVLink once (directly,
    or as the fan-out of a network arrival), the off-domain ones the network as well."""
    if size <= 1 or copy_bytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    if k >= size:
        return alltoall_time(copy_bytes * ranks, size, stride, lk)
    group_domains = -(-size // k)
    intra = copy_bytes * ranks * (size - 1) / size
    inter = copy_bytes * domains * (group_domains - 1) / group_domains
    return max(intra / lk.nvlink_bw(k), inter / lk.inter_bw) + lk.inter_lat


def p2p_time(nbytes: float, cross: bool, lk: Links, inter_lat: float | None = None) -> float:
    if nbytes <= 0:
        return 0.0
    if cross:
        return nbytes / lk.inter_bw + (lk.inter_lat if inter_lat is None else inter_lat)
    return nbytes / lk.nvlink_bw(2) + lk.intra_lat
