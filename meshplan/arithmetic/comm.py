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

from meshplan.arithmetic.mesh import fast_domain, flex_backend, job_domain, per_domain, wired_node
from meshplan.knowledge.calibration import Calibration, at_ranks, flex_dispatch_points, flex_sms
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
    # (ranks in the domain, bytes/s a rank receives) of a flex dispatch in its domain (flex_dispatch_time); (): NVLink
    flex_bw: tuple[tuple[int, float], ...] = ()
    sms: int = 0  # the GPU's SMs (GpuSpec.sm_count); 0: unknown
    # CTAs an NCCL ring holds (GpuSpec.nccl_ring_ctas): inside one NVLink domain, across nodes per GPU of a node in the
    # group, the most across nodes; (): none counted
    ring_ctas: tuple[int, int, int] = ()
    flex_sms: int = 0  # SMs the flex dispatcher's backend runs its kernels on (flex_sms); 0: none counted

    def nvlink_bw(self, k: int) -> float:
        """NVLink bytes/s one rank reaches in a collective of `k` members on its node: all its links behind an
        NVSwitch; joined point to point (`wired` GPUs), only the links to its k - 1 fellow members, (k - 1) /
        (wired - 1) of them (a TP2 pair of a 4-GPU HGX board: one third)."""
        if self.wired <= 1 or k >= self.wired:
            return self.intra_bw
        return self.intra_bw * max(1, k - 1) / (self.wired - 1)

    def flex_at(self, k: int) -> float:
        """Bytes/s a rank receives in a flex dispatch over `k` ranks of its domain (calibration.at_ranks of flex_bw);
        0.0 where the card has no figure (NVLink's bandwidth then)."""
        return at_ranks(self.flex_bw, k)


def job_links(job: Job, cal: Calibration) -> Links:
    """The job's links: its GPU's, with the fast domain in the job's own ranks (mesh.job_domain) and its node's
    NVLink wiring (mesh.wired_node)."""
    return links(job.gpu, job.gpus_per_node, cal, domain=job_domain(job), wired=wired_node(job),
                 backend=job.moe_flex_backend)


def links(gpu: GpuSpec, gpus_per_node: int, cal: Calibration, domain: int | None = None, wired: int = 0,
          backend: str | None = None) -> Links:
    """The links of `gpu` in nodes of `gpus_per_node`: its NVLink and NIC at the calibrated efficiencies, and what
    the flex dispatcher's `backend` (a job's Job.moe_flex_backend; None: the machine's, mesh.flex_backend) reaches in
    one NVLink domain on its generation, by the ranks it spans where the card measures that (cards/calibration.yaml
    flex_dispatch; none listed: NVLink's, as HybridEP on Hopper)."""
    backend = backend or flex_backend(gpu, gpus_per_node)
    flex = flex_dispatch_points(backend, gpu.arch)
    ctas = gpu.nccl_ring_ctas
    return Links(
        domain=fast_domain(gpu, gpus_per_node) if domain is None else domain,
        intra_bw=gpu.intra_node_bandwidth * cal.nvlink_efficiency,
        inter_bw=gpu.network_bandwidth * cal.network_efficiency,
        intra_lat=cal.latency_intra_s,
        inter_lat=cal.latency_inter_s,
        nic_scaling=cal.ring_nic_scaling,
        node=gpus_per_node,
        wired=wired,
        flex_bw=flex,
        sms=gpu.sm_count or 0,
        ring_ctas=(ctas.nvlink, ctas.network_per_node_gpu, ctas.network) if ctas is not None else (),
        flex_sms=flex_sms(backend),
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


def ring_sm_share(size: int, stride: int, lk: Links) -> float:
    """The share of a GPU's SMs an NCCL ring collective over a group of `size` ranks `stride` apart holds while it
    runs: one CTA per channel on an SM of its own (ring_channels); 0 for a group of one, or where the card counts
    none."""
    return _sm_share(ring_channels(size, stride, lk), lk)


def ring_channels(size: int, stride: int, lk: Links) -> int:
    """The channels NCCL's topology search gives a ring over `size` ranks `stride` apart, as the GPU's card counts
    them (Links.ring_ctas): inside one NVLink domain its figure there, across domains its figure per GPU of a domain
    in the group (per_domain), up to its most; 0 for a group of one, or where the card counts none."""
    if size <= 1 or not lk.ring_ctas:
        return 0
    nvlink, per_gpu, most = lk.ring_ctas
    k = per_domain(size, stride, lk.domain)
    return nvlink if k >= size else min(most, per_gpu * k)


NCCL_MAX_CHANNELS = 64
"""NVIDIA/nccl 5067397c src/include/device.h MAXCHANNELS, the default of NCCL_MAX_P2P_NCHANNELS (graph/paths.cc)."""


def alltoall_sm_share(size: int, stride: int, lk: Links, flex: bool = False) -> float:
    """The share of a GPU's SMs an EP all-to-all over `size` ranks `stride` apart holds while it runs, which compute
    launched beside it (moe_a2a_overlap) cannot use. NCCL's (the alltoall dispatcher's all_to_all_single, grouped
    send/recv): its p2p channels, one CTA each, the communicator's collective channels rounded up to a power of two
    (NVIDIA/nccl 5067397c src/graph/paths.cc ncclTopoComputeP2pChannels: p2pnChannels = pow2Up(min(nChannels,
    NCCL_MAX_P2P_NCHANNELS = MAXCHANNELS))), every one of them busy once the group's peers spread over them (each
    peer takes p2pnChannelsPerPeer channels from a base that rotates with the peer); so 32 of an H100's 132 SMs in
    one node (24 ring channels), 16 across nodes. The flex dispatcher's (`flex`): the SMs its backend is run on
    (Links.flex_sms: DeepEP 20, HybridEP 32), whatever the group. 0 for a group of one, or where the card counts
    none."""
    if size <= 1:
        return 0.0
    if flex:
        return _sm_share(lk.flex_sms, lk)
    channels = ring_channels(size, stride, lk)
    return _sm_share(min(NCCL_MAX_CHANNELS, 1 << (channels - 1).bit_length()) if channels else 0, lk)


def _sm_share(ctas: int, lk: Links) -> float:
    """`ctas` CTAs, each on an SM of its own, as a share of the GPU's SMs (at most all but one); 0 where either is
    unknown."""
    if ctas <= 0 or lk.sms <= 0:
        return 0.0
    return min(ctas, lk.sms - 1) / lk.sms


def beside_compute(comm: float, window: float, share: float) -> float:
    """Seconds a collective of `comm` seconds launched beside `window` seconds of compute adds to that window, where
    it holds `share` of the SMs (ring_sm_share): its part beyond the window, or the work the compute lost running on
    the other SMs while beside it (share x the seconds they overlap, done after it), whichever is longer. A GEMM of
    many waves runs at (1 - share) of its rate on the SMs left (estimate/tp_overlap.slowed_gemm, whose stretched
    GEMM overlaps a little more of a longer collective: this is the least it takes); share 0: max(0, comm - window)."""
    return contended(max(0.0, comm - window), min(comm, window), share)


def contended(exposed: float, hidden: float, share: float) -> float:
    """What a collective costs the step where `hidden` of its seconds ran beside compute and `exposed` did not, the
    collective holding `share` of the SMs: the compute finishes share x hidden later, the collective `exposed` after
    it would have; the later of the two (beside_compute's rule for any window, chunked or not)."""
    return max(exposed, share * hidden)


def hidden_beside(comm: float, window: float, share: float) -> float:
    """The seconds of a collective of `comm` seconds beside `window` seconds of compute that cost the step nothing:
    comm less what it adds to the window (beside_compute)."""
    return comm - beside_compute(comm, window, share)


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


def dispatch_time(copy_bytes: float, copies: int, size: int, stride: int, lk: Links, dedup: bool,
                  experts: int = 0, num_groups: int = 1, group_topk: int = 1, consecutive: bool = False) -> float:
    """One MoE dispatch (or combine) all-to-all: each rank's tokens, `copies` (top_k) routed copies of `copy_bytes`
    each, over the `size` ranks of the expert-parallel group.

    The plain all-to-all sends every copy, spread evenly over the group. `dedup` is Megatron-Core's flex dispatcher
    (DeepEP, flex_dispatch_time): a token goes once to each EP rank holding one of its experts, and once to each
    NVLink domain over the network, however many of its experts sit there; how many of each a token reaches is
    learned_routing's expectation (routing uniform over the `experts`, group-limited by `num_groups` /
    `group_topk`), or consecutive_routing's count where `consecutive` (NeMo AutoModel's fake balanced gate).
    """
    if size <= 1 or copy_bytes <= 0:
        return 0.0
    if not dedup:
        return alltoall_time(copy_bytes * copies, size, stride, lk)
    if experts <= 0 or experts % size:
        raise ValueError(f"the flex dispatch needs the experts ({experts}) split evenly over the {size} EP ranks")
    k = per_domain(size, stride, lk.domain)
    if consecutive:
        ranks, domains = consecutive_routing(experts, copies, size, k)
    else:
        ranks, domains = learned_routing(experts, copies, size, k, num_groups, group_topk)
    return flex_dispatch_time(copy_bytes, ranks, domains, size, stride, lk)


def _missed(lo: int, hi: int, experts: int, top_k: int, num_groups: int, group_topk: int) -> float:
    """Chance that none of a token's `top_k` distinct experts falls among the contiguous experts [lo, hi), its
    experts drawn uniformly without replacement (hypergeometric: C(pool - held, top_k) / C(pool, top_k)) from the
    whole pool, or, group-limited (Megatron-Core moe_utils.group_limited_topk: `group_topk` of `num_groups` equal
    contiguous groups, then the top_k among their experts), from the picked groups' experts, every choice of groups
    equally likely: _group_limited_misses over the block's experts in each group it touches. The chance reads of the
    block only what it holds (of each group it touches), so it is worked out once per that (_held_missed):
    learned_routing asks it of every EP rank's block and every domain's, blocks of one size that hold alike."""
    if num_groups <= 1 or group_topk >= num_groups or experts % num_groups:
        return _held_missed((hi - lo,), experts, top_k, 1, 1)
    per_group = experts // num_groups
    touched = range(lo // per_group, min(num_groups, (hi - 1) // per_group + 1)) if hi > lo else ()  # its groups
    return _held_missed(tuple(min(hi, (g + 1) * per_group) - max(lo, g * per_group) for g in touched), experts,
                        top_k, num_groups, group_topk)


@lru_cache(maxsize=4096)  # small ints: a few block shapes per (experts, top_k, groups) of a job's EP degrees
def _held_missed(held: tuple[int, ...], experts: int, top_k: int, num_groups: int, group_topk: int) -> float:
    """_missed of a block holding `held` experts of each group it touches (one figure, of the whole pool, where
    routing is not group-limited: num_groups 1): the hypergeometric chance, or the group-limited count over the
    choices of groups and experts, each one correctly rounded division of exact integers."""
    if num_groups == 1:
        return math.comb(experts - held[0], top_k) / math.comb(experts, top_k)
    per_group = experts // num_groups
    pool = group_topk * per_group
    if top_k > pool:
        raise ValueError(f"top_k {top_k} exceeds the {pool} experts of {group_topk} groups of {per_group}")
    misses = _group_limited_misses(list(held), num_groups - len(held), pool, group_topk, top_k)
    return misses / (math.comb(num_groups, group_topk) * math.comb(pool, top_k))


def _group_limited_misses(held: list[int], empty: int, pool: int, group_topk: int, top_k: int) -> int:
    """The choices of `group_topk` groups and then `top_k` of their `pool` experts that miss the block (an exact
    integer, so _missed's chance is one correctly rounded division): over the groups holding some of the block
    (`held`, its experts in each), ways[j, m] ways to pick j of them holding m of its experts, each completed by
    group_topk - j of the `empty` groups holding none (the groups are alike but for what they hold, so the count
    does not depend on which groups those are: a block inside one group is one DP step, not one per group)."""
    ways: dict[tuple[int, int], int] = {(0, 0): 1}
    for h in held:
        grown = dict(ways)  # this group left out
        for (j, m), w in ways.items():
            if j < group_topk:
                grown[j + 1, m + h] = grown.get((j + 1, m + h), 0) + w
        ways = grown
    return sum(w * math.comb(empty, group_topk - j) * math.comb(pool - m, top_k) for (j, m), w in ways.items())


@lru_cache(maxsize=1024)  # small ints; asked per MoE layer of every estimate under the flex dispatcher
def learned_routing(experts: int, top_k: int, ep: int, domain_ranks: int, num_groups: int = 1,
                    group_topk: int = 1) -> tuple[float, float]:
    """(EP ranks, NVLink domains) one token's `top_k` routed copies reach in expectation under learned routing,
    taken as uniform over the experts the token may pick (its top_k distinct), group-limited where the model says
    so (`num_groups` / `group_topk`, _missed): the sum over the ranks (domains) of the chance one of the copies
    lands there. The experts are sharded contiguously, experts / ep per rank (Megatron-Core's expert parallelism;
    DeepEP's get_dispatch_layout marks is_token_in_rank[token, expert / experts_per_rank]), `domain_ranks`
    consecutive EP ranks per NVLink domain. top_k = 1 reaches one rank; every expert on one rank, one rank."""
    local = experts // ep
    span = local * min(domain_ranks, ep)
    ranks = sum(1.0 - _missed(r * local, (r + 1) * local, experts, top_k, num_groups, group_topk)
                for r in range(ep))
    domains = sum(1.0 - _missed(lo, min(lo + span, experts), experts, top_k, num_groups, group_topk)
                  for lo in range(0, experts, span))
    return ranks, domains


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


def flex_dispatch_time(copy_bytes: float, ranks: float, domains: float, size: int, stride: int, lk: Links) -> float:
    """One flex (DeepEP) dispatch (or combine) where a token reaches `ranks` EP ranks and `domains` NVLink domains
    (learned_routing, consecutive_routing): DeepEP sends a token once per destination rank (intranode.cu dispatch
    copies token t to rank r's buffer only where is_token_in_rank[t, r]), once per destination node over the network
    (internode.cu: one RDMA send per node, then forwarded over NVLink to the node's ranks its SourceMeta marks); the
    combine mirrors it. A destination is the token's own rank (domain) with chance 1/size (1/domains of the group),
    the token's rank being independent of its routing. Every off-rank delivery crosses NVLink once (directly, or as
    the fan-out of a network arrival), the off-domain ones the network as well.

    Inside one domain the copies run on the backend's few SMs (intranode.cu: num_sms / 2 channels, a sender and a
    receiver SM each, the token's own rank served like the others), so a rank takes every delivery it receives at
    the backend's achieved bandwidth over the group's ranks there (lk.flex_at: cards/calibration.yaml flex_dispatch,
    HybridEP's on GB200 falling from 8 ranks to 36) where that is below the link's: the slower of the two. Across
    domains the network term rules and is left as it was."""
    if size <= 1 or copy_bytes <= 0:
        return 0.0
    k = per_domain(size, stride, lk.domain)
    if k >= size:
        received = copy_bytes * ranks
        link = alltoall_time(received, size, stride, lk)
        bw = lk.flex_at(k)
        return max(link, received / bw + lk.intra_lat) if bw else link
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
