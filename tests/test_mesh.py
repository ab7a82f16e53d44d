"""Mesh arithmetic has one home (meshplan/arithmetic/mesh.py): the world-size laws, derived DP, expert DP and the fast
domain.

Before, the cost model treated 8 GPUs of an h100-pcie node as one NVLink domain while the search and TP004 used
2, and the decision-table fitting capped GB200 TP at its 4-GPU tray while the search allowed the 72-GPU rack.
"""

from __future__ import annotations

import pytest

from meshplan.arithmetic import mesh
from meshplan.arithmetic.comm import job_links, p2p_time, ring_time
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.hardware import get_gpu, gpu_catalog
from meshplan.request.resolve import resolve
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request
from meshplan.search.space import Layout, within_nvlink


@pytest.mark.parametrize(("gpu", "per_node", "domain"), [
    ("h100", 8, 8),          # one node is one NVLink domain
    ("h100", 4, 4),          # a smaller node ends the domain
    ("h100-pcie", 8, 2),     # PCIe cards are NVLink-bridged in pairs
    ("gb200", 4, 72),        # NVL72 spans 18 four-GPU trays
    ("a100-80gb", 8, 8),
])
def test_fast_domain(gpu, per_node, domain):
    assert mesh.fast_domain(get_gpu(gpu), per_node) == domain


def test_every_caller_sees_the_same_fast_domain():
    for gpu in gpu_catalog().values():
        job, _ = resolve(Request(model="llama-3.1-8b", gpu=gpu.key, num_gpus=gpu.gpus_per_node * 2))
        domain = mesh.job_domain(job)
        assert domain == min(mesh.fast_domain(gpu, job.gpus_per_node), job.num_gpus)
        assert job_links(job, calibration(job.framework)).domain == domain, gpu.key
        for tp in (1, 2, 4, 8, 16, 32, 64):
            inside = tp <= domain and domain % tp == 0
            assert within_nvlink(job, Layout(tp=tp, pp=1, cp=1, ep=1, etp=1, dp=1)) == inside, (gpu.key, tp)


@pytest.mark.parametrize(("law", "plan", "world"), [
    ("megatron", Plan(tp=2, pp=4, cp=2, dp=8, ep=16), 128),        # EP folds into dp*cp
    ("torchtitan", Plan(tp=2, pp=4, cp=2, dp=8, ep=16), 128),
    ("kempnerforge", Plan(tp=2, pp=1, cp=1, dp=4, ep=8), 64),        # EP ranks of its own
])
def test_world_size_laws(law, plan, world):
    assert mesh.world_size(law, plan) == world
    assert mesh.derived_dp(law, world, plan.tp, plan.pp, plan.cp, plan.ep) == plan.dp


def test_expert_grid_and_expert_dp():
    plan = Plan(tp=2, pp=8, ep=64, etp=1, dp=64)
    assert mesh.expert_dp(1024, plan, "megatron") == 2.0           # DeepSeek-V3 on 1,024: 1024 / (8*64*1)
    assert mesh.expert_grid_fits("megatron", 1024, 2, 8, 1, 64, 64, 1)
    assert not mesh.expert_grid_fits("megatron", 1024, 2, 8, 1, 64, 64, 4)   # 1024/8 = 128 is not a multiple of 256
    assert not mesh.expert_grid_fits("torchtitan", 96, 2, 1, 1, 48, 64, 1)  # ep must divide dp*cp*tp = 96
    assert mesh.expert_grid_fits("kempnerforge", 96, 2, 1, 1, 48, 64, 1)
    assert mesh.smallest_world("megatron", 2, 8, 1, 1, 64, 1) == 8 * 64
    assert mesh.smallest_world("kempnerforge", 2, 1, 1, 1, 8, 1) == 16


def test_groups_cross_domains_by_stride():
    assert not mesh.crosses_domains(8, 1, 8)        # TP8 in a node
    assert mesh.crosses_domains(16, 1, 8)           # TP16 needs two nodes
    assert mesh.crosses_domains(2, 8, 8)            # any group strided by a whole node leaves it
    assert mesh.per_domain(64, 2, 8) == 4           # EP64 over ETP2: four members per node


def test_a_group_straddling_a_domain_boundary_crosses_it():
    """Groups are not always aligned to the domain: TP4 on 5 ranks per node puts ranks 4-7 on two nodes (one on the
    first), TP3 on 8 puts 6-8 on two; the ring is held to its domain with the fewest members. Before, per_domain took
    min(size, domain // stride) and counted them inside NVLink."""
    assert mesh.per_domain(4, 1, 5) == 1 and mesh.crosses_domains(4, 1, 5)
    assert mesh.per_domain(4, 1, 6) == 2 and not mesh.tp_fits_domain(4, 6)
    assert mesh.per_domain(3, 1, 8) == 1 and mesh.per_domain(6, 1, 8) == 2
    assert mesh.per_domain(3, 4, 8) == 1            # DP3 over TP4: ranks 0, 4 | 8
    assert mesh.per_domain(12, 1, 8) == 4           # 0-7 | 8-11 and 12-15 | 16-23: four on the thinner side
    # aligned groups as before
    assert mesh.per_domain(4, 2, 8) == 4 and mesh.per_domain(16, 1, 8) == 8 and mesh.per_domain(5, 4, 20) == 5
    assert mesh.tp_fits_domain(5, 5) and mesh.tp_fits_domain(2, 6)


def test_the_jobs_domain_is_its_own_ranks():
    """20 H100 run as 5 nodes x 4 (TP4 inside a node); as 4 nodes x 5, asked, TP4 crosses nodes; 6 H100 on one node:
    every group of the 6 ranks is inside."""
    job, _ = resolve(Request(model="llama-3.1-70b", gpu="h100", num_gpus=20))
    assert mesh.job_domain(job) == 4 and mesh.tp_fits_domain(4, mesh.job_domain(job))
    job, _ = resolve(Request(model="llama-3.1-70b", gpu="h100", num_gpus=20, gpus_per_node=5))
    assert mesh.job_domain(job) == 5 and not mesh.tp_fits_domain(4, mesh.job_domain(job))
    job, _ = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=6))
    assert job.gpus_per_node == 8 and mesh.job_domain(job) == 6
    assert not mesh.crosses_domains(3, 1, 6) and not mesh.crosses_domains(2, 3, 6)


@pytest.mark.parametrize(("tp", "cp", "pp", "ep", "etp", "world"), [
    (2, 2, 2, 1, 1, 32), (8, 1, 4, 1, 1, 64), (1, 4, 1, 1, 1, 16), (2, 1, 2, 8, 1, 32), (2, 1, 2, 4, 2, 32)])
def test_mesh_axes_are_megatron_s_rank_order(tp, cp, pp, ep, etp, world):
    """Which ranks form each group (the mesh picture's groups): Megatron-Core's RankGenerator order, checked against
    each rank's coordinates. Dense: rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i)); experts within a pipeline stage:
    rank = etp_i + etp*(ep_i + ep*edp_i) + stage offset. A group is the ranks that share every other coordinate."""
    dp = world // (tp * cp * pp)
    plan = Plan(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
    dense = {"TP": (tp, 1), "CP": (cp, tp), "DP": (dp, tp * cp), "PP": (pp, tp * cp * dp)}
    stage = world // pp
    expert = {"ETP": (etp, 1), "EP": (ep, etp), "EDP": (stage // (ep * etp), ep * etp)}

    def coordinates(rank: int, sizes: list[int]) -> list[int]:
        out = []
        for size in sizes:
            rank, c = divmod(rank, size)
            out.append(c)
        return [*out, rank]

    axes = {a.name: a for a in mesh.mesh_axes(plan, world, domain=8, moe=ep > 1, law="megatron")}
    wanted = {n: v for n, v in dense.items() if v[0] > 1} | ({n: v for n, v in expert.items() if v[0] > 1}
                                                            if ep > 1 else {})
    assert {n: (a.size, a.stride) for n, a in axes.items()} == wanted
    for name, axis in axes.items():
        names, sizes = (list(dense), [tp, cp, dp]) if not axis.expert else (list(expert), [etp, ep])
        position = names.index(name)
        for rank in range(world):
            local = rank if not axis.expert else rank % stage
            mine = coordinates(local, sizes)
            members = axis.members(axis.group_of(rank))
            assert rank in members and len(members) == axis.size
            for other in members:
                theirs = coordinates(other if not axis.expert else other % stage, sizes)
                assert [c for i, c in enumerate(theirs) if i != position] == \
                    [c for i, c in enumerate(mine) if i != position], (name, rank, other)
                assert axis.expert is False or other // stage == rank // stage  # experts stay in their stage
        assert axis.crosses_network == mesh.crosses_domains(axis.size, axis.stride, 8)


def test_mesh_groups_are_the_one_home_of_the_strides():
    """The estimates time their collectives over mesh.mesh_groups (the groups mesh_axes draws): DP x CP at stride
    tp (dense gradients, Megatron-FSDP's dense shards), expert-DP at stride ep*etp, the pipeline at tp*cp*dp, and
    a2a+p2p CP's two levels (the all-to-all inside a node at stride tp, the ring over them)."""
    plan = Plan(tp=2, cp=4, pp=2, dp=4, ep=8, etp=2)
    g = mesh.mesh_groups(plan, edp=2, law="megatron")
    assert (g.dp_cp, g.edp, g.pp, g.ep, g.cp) == ((16, 2), (2, 16), (2, 32), (8, 2), (4, 2))
    assert mesh.mesh_groups(plan, dp=3, law="megatron").pp == (2, 24)
    assert mesh.hierarchical_cp_groups(plan, gpus_per_node=4) == ((2, 2), (2, 4))
    assert g.edp.crosses(8) and not g.ep.crosses(16)


@pytest.mark.parametrize(("tp", "ep", "dp"), [(8, 2, 4), (4, 4, 2), (1, 8, 4), (2, 1, 8)])
def test_kempnerforge_groups_are_its_device_mesh(tp, ep, dp):
    """KempnerForge's DeviceMesh (kempnerforge/distributed/setup.py: dims dp_shard, ep, tp row-major, tp innermost):
    rank = tp_i + tp*(ep_i + ep*dp_i). Its EP group is the ranks sharing tp_i and dp_i (stride tp), its data group the
    ranks sharing tp_i and ep_i (stride tp*ep), and its FSDP shards the experts over that data group too
    (parallel.py apply_fsdp2 gives every fully_shard the dp_shard mesh): expert_dp = dp, not world/(pp*ep*etp)."""
    plan = Plan(tp=tp, pp=1, cp=1, dp=dp, ep=ep, etp=1)
    world = tp * ep * dp
    g = mesh.mesh_groups(plan, edp=int(mesh.expert_dp(world, plan, "kempnerforge")), law="kempnerforge")
    assert (g.tp, g.ep, g.dp, g.dp_cp, g.edp) == ((tp, 1), (ep, tp), (dp, tp * ep), (dp, tp * ep), (dp, tp * ep))
    assert mesh.expert_dp(world, plan, "kempnerforge") == dp
    assert mesh.expert_dp(world, plan, "megatron") == world / ep  # Megatron folds the TP ranks into expert-DP
    for rank in range(world):
        t, e, d = rank % tp, rank // tp % ep, rank // (tp * ep)
        assert rank == g.ep.stride * e + t + g.dp.stride * d
    axes = {a.name: (a.size, a.stride) for a in mesh.mesh_axes(plan, world, domain=8, moe=True, law="kempnerforge")}
    assert axes.get("EP", (1, 1)) == ((ep, tp) if ep > 1 else (1, 1)) and axes.get("DP") == (dp, tp * ep)


def test_estimates_do_not_place_ranks_by_hand():
    """No estimate module works out which ranks share a node itself: they read mesh_groups' strides (one home)."""
    import ast
    from pathlib import Path

    import meshplan.estimate

    by_hand = {"crosses_domains", "per_domain", "hierarchical_cp_sizes"}
    for path in Path(meshplan.estimate.__file__).parent.glob("*.py"):
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        assert not names & by_hand, (path.name, names & by_hand)


@pytest.mark.parametrize(("num_gpus", "domain"), [
    (64, 64),     # one rack holds the whole job
    (72, 72),
    (256, 64),    # 64 trays: segments of 16 (64 GPUs), never the 72-GPU rack
    (96, 48),     # 24 trays: 12 divide them, 18 do not
    (144, 72),    # 36 trays: whole racks
    (200, 40),    # 50 trays: 10
])
def test_a_job_over_several_racks_is_placed_by_segments(num_gpus, domain):
    """GB200 NVL72 jobs larger than one rack are placed in scheduler segments of whole trays inside one rack that
    divide the job's trays (Slurm's --segment must divide the node count; NVIDIA recommends 16 for large jobs), so a
    256-GPU job's ranks fill 64 GPUs of a rack, not 72. Before, a 256-GPU job's EP64 groups
    were taken to straddle 72-GPU racks (ranks 64-127 over two) and its all-to-all timed mostly on the network:
    Megatron-Bridge's GB200 DeepSeek-V3 and Qwen3-235B rows fell from -8% / -16% to -45% / -56% tokens/s."""
    job, _ = resolve(Request(model="deepseek-v3", gpu="gb200", num_gpus=num_gpus))
    assert mesh.job_domain(job) == domain
    assert job_links(job, calibration(job.framework)).domain == domain
    if num_gpus == 256:
        assert mesh.per_domain(64, 1, domain) == 64 and not mesh.crosses_domains(64, 1, domain)
        assert "divide its 64 nodes (the largest: 16)" in mesh.segment_words(job)
    if num_gpus <= 72:
        assert mesh.segment_words(job) is None


def test_segments_apply_only_to_domains_spanning_nodes():
    assert mesh.segment_domain(get_gpu("h100"), 8, 256) is None
    # an 8-GPU island on nodes of 4 (KempnerForge's 4 x H200 nodes): no NVLink between the nodes, no segment
    assert mesh.segment_domain(get_gpu("h200"), 4, 32) is None
    assert mesh.segment_domain(get_gpu("gb200"), 4, 250) is None   # no whole number of trays: the rack stands


def _h200_job(num_gpus: int, gpus_per_node: int | None):
    return resolve(Request(model="llama-3.1-8b", gpu="h200", num_gpus=num_gpus, gpus_per_node=gpus_per_node))[0]


def test_a_pair_on_a_four_gpu_board_runs_on_its_own_links():
    """A 4-GPU Hopper SXM node joins its GPUs point to point, six of each GPU's 18 NVLinks to each other GPU, no
    NVSwitch (cards/hardware.yaml point_to_point_node): a collective of k of its 4 GPUs reaches (k - 1) / 3 of the
    GPU's NVLink bandwidth, a TP2 pair a third, all four the whole of it. On the catalog's switched 8-GPU node, and on
    a launch split of it (12 H200 as 3 nodes x 4, node_gpus None), every group reaches the whole."""
    cal = calibration("megatron-core")
    board = job_links(_h200_job(8, 4), cal)
    switched = job_links(_h200_job(8, None), cal)
    split = job_links(_h200_job(12, None), cal)
    assert (board.wired, switched.wired, split.wired) == (4, 0, 0) and split.node == 4
    whole = switched.intra_bw
    assert [board.nvlink_bw(k) for k in (2, 3, 4)] == pytest.approx([whole / 3, whole * 2 / 3, whole])
    assert [switched.nvlink_bw(k) for k in (2, 4)] == [split.nvlink_bw(2), whole] == [whole, whole]
    nbytes = 1e9  # a TP2 all-gather inside the node moves half of it over the pair's links
    assert ring_time(nbytes, 2, 1, board) - board.intra_lat == pytest.approx(nbytes / 2 / (whole / 3))
    assert ring_time(nbytes, 2, 1, switched) - switched.intra_lat == pytest.approx(nbytes / 2 / whole)
    assert ring_time(nbytes, 4, 1, board) == pytest.approx(ring_time(nbytes, 4, 1, switched))
    assert p2p_time(nbytes, False, board) - board.intra_lat == pytest.approx(nbytes / (whole / 3))
    # a 2-GPU job on one such node (torchrun --nproc_per_node=2) is a pair of the 4-GPU board all the same
    assert job_links(_h200_job(2, 4), cal).nvlink_bw(2) == pytest.approx(whole / 3)
