"""Mesh arithmetic: how the parallel degrees multiply into a GPU count, and which groups leave the fast domain.

One home for the facts every other module used to recompute: the world-size law of each framework family
(cards/frameworks/*.yaml `world_size_law`), the data-parallel size derived from a GPU count, the
expert-data-parallel size, and the *fast domain*: the GPUs one GPU reaches over its scale-up fabric
(NVLink / xGMI) without touching the network. A process group is `size` ranks spaced `stride` apart in
Megatron-Core's rank order (TP innermost, then CP, then DP, PP outermost; experts ETP, EP, expert-DP, PP);
groups are aligned to domain boundaries, so how many members share a domain decides which link carries them.
KempnerForge's law has its own order (EP a mesh dimension between the data ranks and TP) and shards the experts
over the data ranks alone (mesh_groups, expert_dp).

Sources: NVIDIA/Megatron-LM megatron/core/parallel_state.py (initialize_model_parallel: world % (tp*pp*cp) and
world % (etp*ep*pp), rank order 'tp-cp-ep-dp-pp'); torchtitan ParallelDims (EP borrows from dp_shard*cp*tp);
KempnerForge's mesh (EP is a dimension of its own, see cards/frameworks/kempnerforge.yaml).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple, Protocol

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import WorldSizeLaw  # the laws a framework card may name; each is implemented here
from meshplan.schema.hardware import GpuSpec
from meshplan.schema.plan import Job, Plan

# --------------------------------------------------------------------------- GPU counts


def rl_job_gpus(trainer_gpus: int, critic_apart: bool, placement: str | None, rollout_gpus: int | None) -> int:
    """The RL job's GPUs in all, from the trainer's: the policy's, twice where PPO's critic runs on as many of its own
    (critic_apart), plus the rollout engine's where it is placed apart (colocated, it shares the trainer's). The one
    home of the count rl/job._pools splits num_gpus into; the RL report's per-GPU rate, min-gpus' scan and the
    world-size rules' fixes (rules/context.request_gpus) read it."""
    return trainer_gpus * (2 if critic_apart else 1) + ((rollout_gpus or 0) if placement == "separate" else 0)


def ep_has_own_ranks(law: WorldSizeLaw) -> bool:
    """KempnerForge's law makes expert parallelism a mesh dimension of its own; Megatron's and torchtitan's fold
    the experts into the data/context/tensor ranks."""
    return law == "kempnerforge"


def own_ep_ranks(law: WorldSizeLaw, ep: int) -> int:
    """Ranks expert parallelism adds to a replica: ep where it has ranks of its own, else 1."""
    return ep if ep_has_own_ranks(law) else 1


def own_ep_ranks_note(job: Job, plan: Plan) -> str | None:
    """Where expert parallelism has ranks of its own, what that costs in words: its EP ranks are no data-parallel
    ranks (KempnerForge's get_dp_info counts dp_replicate x dp_shard only), so each replica's ep GPUs all train the
    same share of the step, and each GPU trains ep times the sequences the same layout at ep=1 gives it. The one
    home of the fact: render's note, the memory and throughput reports' warnings (and check's) all word it here."""
    law = job.card.world_size_law
    if plan.ep == 1 or not ep_has_own_ranks(law):
        return None
    world = world_size(law, plan)
    at_ep1 = derived_dp(law, world, plan.tp, plan.pp, plan.cp)
    gbs = job.global_batch_size
    return (f"{job.card.display_name} gives expert parallelism ranks of its own, not data-parallel ones "
            f"(dp_replicate*dp_shard*tp*pp*cp*ep = {world} GPUs, data-parallel {plan.dp}): the {plan.ep} EP ranks "
            f"of a replica train the same {gbs / plan.dp:,.0f} of the step's {gbs:,} sequences, where ep=1 on these "
            f"GPUs gives each replica {gbs / at_ep1:,.0f} (data-parallel {at_ep1}), {at_ep1 / plan.dp:g}x less work "
            f"per GPU.")


def replica_size(law: WorldSizeLaw, tp: int, pp: int, cp: int, ep: int = 1) -> int:
    """GPUs per data-parallel replica: tp*pp*cp (times ep under KempnerForge's law)."""
    return tp * pp * cp * own_ep_ranks(law, ep)


def world_size(law: WorldSizeLaw, plan: Plan) -> int:
    """GPUs a plan occupies under the framework's law."""
    return replica_size(law, plan.tp, plan.pp, plan.cp, plan.ep) * plan.dp


def derived_dp(law: WorldSizeLaw, num_gpus: int, tp: int, pp: int, cp: int, ep: int = 1) -> int:
    """The data-parallel size a GPU count leaves once the model-parallel degrees are placed (at least 1)."""
    return max(1, num_gpus // replica_size(law, tp, pp, cp, ep))


def file_data_parallel(num_gpus: int, tp: int = 1, pp: int = 1, cp: int = 1) -> int | None:
    """The data-parallel size a config file's GPU count leaves over its tp x pp x cp ranks, as the readers turn a
    per-rank batch into the step's (torchtitan's local_batch_size x dp, verl's global micro-batch / dp: both
    frameworks' dp is world / (tp x pp x cp)); None where the count is not a whole number of those replicas, which
    neither framework launches."""
    replica = tp * pp * cp
    return num_gpus // replica if num_gpus >= replica and num_gpus % replica == 0 else None


def replica_formula(law: WorldSizeLaw, ep: int = 1) -> str:
    """replica_size as a reader checks it by hand."""
    return "tp*pp*cp" + ("*ep" if own_ep_ranks(law, ep) > 1 else "")


def smallest_world(law: WorldSizeLaw, tp: int, pp: int, cp: int, dp: int, ep: int, etp: int) -> int:
    """The fewest GPUs that hold these degrees: the dense replica times dp, and (where experts fold into those
    ranks) a multiple of ep*etp per pipeline stage."""
    if ep_has_own_ranks(law):
        return replica_size(law, tp, pp, cp, ep) * dp
    return pp * math.lcm(tp * cp * dp, ep * etp)


def expert_grid_fits(law: WorldSizeLaw, world: int, tp: int, pp: int, cp: int, dp: int, ep: int, etp: int) -> bool:
    """Whether the expert layout tiles the ranks: Megatron-Core needs world % (pp*ep*etp) == 0 (its expert
    grid is ETP x EP x expert-DP per stage); torchtitan's EP borrows from dp_shard*cp*tp, which ep must divide;
    KempnerForge's EP ranks are a mesh dimension of their own, so any ep fits."""
    if law == "megatron":
        return world % pp == 0 and (world // pp) % (ep * etp) == 0
    if law == "torchtitan":
        return (dp * cp * tp) % ep == 0
    return True


class ExpertDegrees(Protocol):
    """What the expert arithmetic reads: a `Plan`, or the search's `space.Layout` before it becomes one."""

    pp: int
    ep: int
    etp: int


def expert_group(plan: ExpertDegrees) -> int:
    """Ranks one copy of the expert weights is spread over along the pipeline and expert axes: pp*ep*etp."""
    return plan.pp * plan.ep * plan.etp


def expert_dp_formula(law: WorldSizeLaw) -> str:
    """expert_dp as a reader checks it by hand."""
    return "world/(pp*ep*etp" + ("*tp)" if ep_has_own_ranks(law) else ")")


class ExpertShardDegrees(ExpertDegrees, Protocol):
    """What expert_dp reads: the expert degrees and tp (KempnerForge's TP ranks hold copies of the experts)."""

    tp: int


def expert_dp(world: int, plan: ExpertShardDegrees, law: WorldSizeLaw) -> float:
    """The ranks the routed experts' states are sharded over, at least 1 (exact when the rules pass): Megatron-Core's
    expert-data-parallel size world / (pp*ep*etp) (torchtitan's EP borrows the same ranks); under KempnerForge's law
    world / (pp*ep*etp*tp) = dp x cp, its FSDP mesh: fully_shard wraps every unit, the MoE block's experts too, over
    dp_shard (x dp_replicate) alone (kempnerforge/distributed/parallel.py apply_fsdp2, get_dp_mesh), and its TP ranks
    hold copies of the experts (tensor_parallel.py _build_block_tp_plan leaves an MoE block's mlp unsharded)."""
    copies = plan.tp if ep_has_own_ranks(law) else 1
    return max(1.0, world / (expert_group(plan) * copies))


# --------------------------------------------------------------------------- ranks on a node


def whole_nodes(num_gpus: int, gpus_per_node: int, whose: str = "") -> int:
    """The nodes `num_gpus` processes launch on at `gpus_per_node` each (one, part-filled, for a count within a node).
    Launchers (torchrun, Ray) start the same number of processes on every node, so a count over one node that is no
    multiple of it cannot launch: refused in one wording wherever it is met, by the resolver for a request's
    gpus_per_node (request/resolve.launch_gpus_per_node) and by render for a Job built outside it
    (adapters/common.nodes). `whose`: what the count is where it is not the request's num_gpus (an RL job's trainer
    share)."""
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        below = num_gpus - num_gpus % gpus_per_node
        raise MeshplanError(
            f"{num_gpus} GPUs{whose} do not fill whole {gpus_per_node}-GPU nodes (gpus_per_node={gpus_per_node}): "
            "launchers (torchrun, Ray) start the same number of processes on every node.",
            fix=f"Use a multiple of {gpus_per_node} GPUs ({below} or {below + gpus_per_node}), gpus_per_node a divisor "
                f"of {num_gpus}, or leave gpus_per_node out (meshplan then picks the launch split).")
    return max(1, num_gpus // gpus_per_node)


def ranks_per_node(job: Job) -> int:
    """The most ranks of the job one node holds: the processes launched per node (the job's gpus_per_node: 12 GPUs
    of 8-GPU nodes run as 3 x 4, request/resolve.launch_gpus_per_node), or every GPU of a job smaller than a node.
    What multiplies a rank's
    host bytes into the node's (the estimate's host_bytes_per_node, MEM003 and its floor before the search)."""
    return min(job.gpus_per_node, job.num_gpus)


# --------------------------------------------------------------------------- the fast domain


def fast_domain(gpu: GpuSpec, gpus_per_node: int) -> int:
    """GPUs one GPU reaches over NVLink/xGMI without the network.

    A rack-scale NVLink domain larger than the GPU's usual node (GB200 NVL72) spans nodes and is the domain
    whatever the node size; otherwise the domain is the smaller of the NVLink island and the node (an H100
    PCIe node of 8 links only NVLink-bridged pairs: 2).
    """
    if gpu.nvlink_domain > gpu.gpus_per_node:
        return gpu.nvlink_domain
    return max(1, min(gpu.nvlink_domain, gpus_per_node))


def job_domain(job: Job) -> int:
    """The fast domain in the job's own ranks: fast_domain, but no more than the job's GPUs (a job on part of one
    node, or of one rack-scale domain, has all its ranks in it), so every group of the job's ranks is aligned with it
    there (per_domain); a job over more than one rack-scale domain, its scheduler segment (`segment_domain`)."""
    domain = fast_domain(job.gpu, job.gpus_per_node)
    if job.num_gpus <= domain:
        return job.num_gpus
    return segment_domain(job.gpu, job.gpus_per_node, job.num_gpus) or domain


def segment_domain(gpu: GpuSpec, gpus_per_node: int, num_gpus: int) -> int | None:
    """GPUs of one scheduler segment where a job spans several multi-node NVLink domains (GB200 NVL72, Slurm
    topology/block --segment): whole nodes inside one domain, as many as divide the job's nodes (a segment must), its
    ranks filling one segment before the next, as NeMo's and Megatron-Bridge's GB200 performance launchers ask for
    (cards/hardware.yaml gb200 sources). None: a domain inside one node (an 8-GPU NVLink island run as nodes of
    fewer GPUs, 4 H200 per node, reaches no GPU of another node: domain_spans_nodes), or GPUs that fill no whole
    number of nodes."""
    if not domain_spans_nodes(gpu, gpus_per_node) or num_gpus % gpus_per_node:
        return None
    nodes, most = num_gpus // gpus_per_node, gpu.nvlink_domain // gpus_per_node
    return max(size for size in range(1, most + 1) if nodes % size == 0) * gpus_per_node


def segment_words(job: Job) -> str | None:
    """Why the job's fast domain is a scheduler segment, not its GPU's NVLink domain (job_domain), for the faces that
    draw or name the domain; None where it is the domain."""
    domain, physical = job_domain(job), fast_domain(job.gpu, job.gpus_per_node)
    if job.num_gpus <= physical or domain == physical:
        return None
    return (f"fast domain {domain} GPUs: a job over more than one {physical}-GPU NVLink domain is placed in scheduler "
            f"segments of whole nodes inside one domain that divide its {job.num_gpus // job.gpus_per_node} nodes "
            f"(the largest: {domain // job.gpus_per_node}), its ranks filling one segment before the next (Slurm "
            "topology/block --segment; cards/hardware.yaml)")


def wired_node(job: Job) -> int:
    """GPUs of the job's node that NVLink joins point to point, no NVSwitch between them (0: switched): the node the
    request named, where its GPU's boards of that size have no NVSwitch (GpuSpec.point_to_point_node: HGX H100/H200
    4-GPU baseboards, six of each GPU's 18 NVLinks to each of the three others, `nvidia-smi topo -m` NV6, where NVIDIA
    lists NVSwitch on its 8-GPU baseboards only; cards/hardware.yaml). A launch split of the catalog's 8-GPU node
    (node_gpus None) stays switched."""
    most = job.gpu.point_to_point_node
    node = job.node_gpus
    return node if most is not None and node is not None and node <= most else 0


def domain_spans_nodes(gpu: GpuSpec, gpus_per_node: int) -> bool:
    """A multi-node NVLink domain (GB200 NVL72): what only HybridEP's dispatcher covers."""
    return fast_domain(gpu, gpus_per_node) > gpus_per_node


def flex_backend(gpu: GpuSpec, gpus_per_node: int) -> str:
    """Megatron-Core's moe_flex_dispatcher_backend on this machine: "hybridep" where one NVLink domain spans several
    nodes (GB200 NVL72: megatron-core 0.19.2's TransformerConfig says only HybridEP supports multi-node NVLink),
    else "deepep" (the field's default). What meshplan renders (adapters/common.flex_backend) and what the flex
    dispatch is timed as (comm.links: cards/calibration.yaml flex_dispatch)."""
    return "hybridep" if domain_spans_nodes(gpu, gpus_per_node) else "deepep"


def per_domain(size: int, stride: int, domain: int) -> int:
    """Members of a group that share one fast domain: where the groups are aligned to domain boundaries (a block of
    size x stride ranks divides the domain or is a multiple of it, and the stride divides it), the domain's share;
    otherwise some group straddles a boundary (TP4 on 5 ranks per node: ranks 4-7 on two nodes) and its ring is held
    to its domain with the fewest members (`straddled_share`)."""
    if stride >= domain:
        return 1
    block = size * stride
    if domain % stride == 0 and (domain % block == 0 or block % domain == 0):
        return max(1, min(size, domain // stride))
    return straddled_share(size, stride, domain)


@lru_cache(maxsize=1024)
def straddled_share(size: int, stride: int, domain: int) -> int:
    """The fewest members any group of `size` ranks `stride` apart has in a domain it touches, over the groups of one
    period of the rank order (lcm of the groups' block and the domain: the pattern repeats after it): at the ends of
    a group, the members before or after a boundary; in between, at least domain // stride."""
    block = size * stride
    fewest = size
    for start in range(0, math.lcm(block, domain), block):
        for first in range(start, start + stride):
            last = first + (size - 1) * stride
            lo, hi = first // domain, last // domain
            if lo == hi:
                continue
            head = ((lo + 1) * domain - 1 - first) // stride + 1
            tail = (last - (first + -(-(hi * domain - first) // stride) * stride)) // stride + 1
            fewest = min(fewest, head, tail, domain // stride if hi - lo > 1 else size)
    return max(1, fewest)


def hierarchical_cp_sizes(cp: int, tp: int, gpus_per_node: int) -> tuple[int, int]:
    """a2a+p2p context parallelism as meshplan renders it (hierarchical_context_parallel_sizes): the all-to-all
    group is the largest divisor of cp that fits beside tp in one node, the ring runs over the rest; their product
    is cp (Megatron-LM megatron/training/arguments.py validate_args)."""
    inner = max((d for d in range(1, cp + 1) if cp % d == 0 and tp * d <= gpus_per_node), default=1)
    return inner, cp // inner


def crosses_domains(size: int, stride: int, domain: int) -> bool:
    """Whether a group of `size` ranks spaced `stride` apart needs the network."""
    return size > per_domain(size, stride, domain)


def tp_fits_domain(tp: int, domain: int) -> bool:
    """Tensor parallelism (stride 1, traffic every layer) stays on the fast fabric."""
    return not crosses_domains(tp, 1, domain)


# --------------------------------------------------------------------------- which ranks form each group


class Group(NamedTuple):
    """A kind of process group in Megatron-Core's rank order: `size` members spaced `stride` ranks apart."""

    size: int
    stride: int

    def crosses(self, domain: int) -> bool:
        """Whether one such group needs the network (crosses_domains)."""
        return crosses_domains(self.size, self.stride, domain)

    def members_in(self, domain: int) -> int:
        """How many of one such group's members share one fast domain (per_domain)."""
        return per_domain(self.size, self.stride, domain)


class MeshGroups(NamedTuple):
    """Every process group of a plan, in Megatron-Core's rank order (parallel_state.py RankGenerator
    'tp-cp-ep-dp-pp'): dense TP (stride 1), CP (stride tp), DP (stride tp*cp), PP (stride tp*cp*dp), and the data
    and context ranks together (DP x CP, stride tp: what dense gradients are reduced and Megatron-FSDP shards over);
    experts ETP (stride 1), EP (stride etp), expert-DP (stride ep*etp) within a pipeline stage. KempnerForge's law
    orders them its own way (_mesh_groups)."""

    tp: Group
    cp: Group
    dp: Group
    pp: Group
    dp_cp: Group
    etp: Group
    ep: Group
    edp: Group


def mesh_groups(plan: Plan, dp: int | None = None, edp: int = 1, *, law: WorldSizeLaw) -> MeshGroups:
    """The plan's process groups with `dp` data-parallel ranks (default plan.dp) and `edp` expert-data-parallel ranks
    (pass it where the expert-DP group is read), in the rank order of the framework's `law`: the one place the
    rank-order strides are written (mesh_axes draws them, the estimates time their collectives over them)."""
    return _mesh_groups(plan.tp, plan.cp, plan.dp if dp is None else dp, plan.pp, plan.etp, plan.ep, edp,
                        ep_has_own_ranks(law))


@lru_cache(maxsize=4096)  # a pure function of seven ints and a flag, asked per stage and per layer of every estimate
def _mesh_groups(tp: int, cp: int, dp: int, pp: int, etp: int, ep: int, edp: int, ep_own: bool) -> MeshGroups:
    if ep_own:
        # KempnerForge's DeviceMesh (kempnerforge/distributed/setup.py init_distributed: dims pp, dp_replicate,
        # dp_shard, ep, tp, row-major, tp innermost): EP ranks tp apart, the data ranks tp*ep apart, and its FSDP
        # shards the experts over those same data ranks (expert_dp); cp is no dimension of it (not wired), kept
        # beside tp so the product holds.
        data = Group(dp * cp, tp * ep)  # dp_shard (cp is 1: KempnerForge's cp is refused, adapter knob cp)
        return MeshGroups(tp=Group(tp, 1), cp=Group(cp, tp), dp=Group(dp, tp * cp * ep),
                          pp=Group(pp, tp * cp * ep * dp), dp_cp=data, etp=Group(etp, 1), ep=Group(ep, tp * cp),
                          edp=data)
    return MeshGroups(tp=Group(tp, 1), cp=Group(cp, tp), dp=Group(dp, tp * cp), pp=Group(pp, tp * cp * dp),
                      dp_cp=Group(dp * cp, tp), etp=Group(etp, 1), ep=Group(ep, etp), edp=Group(edp, ep * etp))


def torch_dp_degrees(plan: Plan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree) of a torch-native FSDP2 framework's mesh
    (torchtitan, KempnerForge), as their renders write them: zero_stage 3 shards over dp / dp_replicate (HSDP with
    dp_replicate replicas), zero_stage 0 replicates over dp with a shard degree of 1 (which torchtitan 0.3 still runs
    as fully_shard: memory_states.replicates_by_sharding). Rule WS005 reads the shard degree torchtitan borrows EP
    ranks from."""
    return (plan.dp_replicate, plan.dp // plan.dp_replicate) if plan.zero_stage == 3 else (plan.dp, 1)


def replica_groups(group: Group, replicas: int) -> tuple[Group, Group]:
    """Hybrid sharding (Plan.dp_replicate): a data-parallel `group` split into `replicas` replicas, as (the shard
    group one replica's states are sharded over: group.size / replicas consecutive members, the same stride; the
    replica group: one member of each replica, group.size / replicas members apart). Megatron-Core's
    parallel_state.py intra/inter partial data-parallel groups (create_hierarchical_groups over
    [intra size, num_distributed_optimizer_instances]); torchtitan's and FSDP2's (dp_replicate, dp_shard) mesh."""
    inner = max(1, group.size // replicas)
    return Group(inner, group.stride), Group(replicas, group.stride * inner)


def hierarchical_cp_groups(plan: Plan, gpus_per_node: int) -> tuple[Group, Group]:
    """a2a+p2p context parallelism's two levels (hierarchical_cp_sizes): the all-to-all over the CP ranks inside one
    node (stride tp) and the ring over those groups (stride tp x the all-to-all's size)."""
    inner, outer = hierarchical_cp_sizes(plan.cp, plan.tp, gpus_per_node)
    return Group(inner, plan.tp), Group(outer, plan.tp * inner)


@dataclass(frozen=True)
class MeshAxis:
    """One kind of process group in Megatron-Core's rank order: its name, members per group, their spacing, whether
    a group needs the network (`crosses_domains`), and whether it is an expert group."""

    name: str
    size: int
    stride: int
    crosses_network: bool
    expert: bool = False

    def group_of(self, rank: int) -> int:
        """The index of the group `rank` belongs to (groups numbered in rank order of their first member)."""
        block = rank // (self.stride * self.size)
        return block * self.stride + rank % self.stride

    def members(self, group: int) -> list[int]:
        """The ranks of group `group`, in order."""
        block, offset = divmod(group, self.stride)
        first = block * self.stride * self.size + offset
        return [first + i * self.stride for i in range(self.size)]


def mesh_axes(plan: Plan, world: int, domain: int, moe: bool, law: WorldSizeLaw) -> list[MeshAxis]:
    """The groups of size > 1 a plan forms over `world` ranks, in the rank order of the framework's `law`
    (mesh_groups; Megatron-Core's parallel_state.py RankGenerator 'tp-cp-ep-dp-pp': dense TP (stride 1), CP (stride
    tp), DP (stride tp*cp), PP (stride tp*cp*dp); with experts, ETP (stride 1), EP (stride etp), expert-DP (stride
    ep*etp) within a pipeline stage)."""
    dp = max(1, world // replica_size(law, plan.tp, plan.pp, plan.cp, plan.ep))
    g = mesh_groups(plan, dp, int(expert_dp(world, plan, law)), law=law)
    found = [MeshAxis(name, group.size, group.stride, group.crosses(domain))
             for name, group in [("TP", g.tp), ("CP", g.cp), ("DP", g.dp), ("PP", g.pp)] if group.size > 1]
    if moe and plan.ep > 1:
        found += [MeshAxis(name, group.size, group.stride, group.crosses(domain), expert=True)
                  for name, group in [("ETP", g.etp), ("EP", g.ep), ("EDP", g.edp)] if group.size > 1]
    return found


DEFAULT_BATCH_TOKENS = 1 << 22  # ~4M tokens per step, the Llama 3 pre-training starting batch


def default_global_batch(seq_length: int, num_gpus: int, micro_batch_size: int = 1, dp: int = 1) -> int:
    """The sequences per step when none is given (the one home of this default, every face's): DEFAULT_BATCH_TOKENS
    worth, at least one sequence, rounded up to a multiple of the GPU count, so that every data-parallel size a
    search weighs at micro-batch 1 divides it and recommend, check and render of one request take the same batch;
    a layout whose micro-batch x dp does not divide that takes the next multiple of both (BS001 would refuse it)."""
    unit = math.lcm(num_gpus, micro_batch_size * dp)
    sequences = max(1, DEFAULT_BATCH_TOKENS // seq_length)
    return max(unit, -(-sequences // unit) * unit)
