"""A request states its cluster's inter-node network (network_gbps_per_node: Gb/s per node, its NICs x their line
rate), which replaces the GPU card's per-GPU network_bandwidth on the resolved job (request/resolve.cluster_gpu,
knowledge/hardware.with_node_network): every inter-node time reads it there, the search's too (its bounds and the
oracle: tests/test_search_bounds_hold.py, tests/test_search_oracle.py; every face: tests/test_faces_agree.py)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.comm import alltoall_time, job_links, ring_time
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.hardware import get_gpu
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import MAX_NODE_GBPS, Request

GBIT = 1e9 / 8  # bytes/s in one Gb/s
L8 = dict(model="llama-3.1-8b", gpu="h100", framework="megatron-core", seq_length=4096, global_batch_size=64)


def _job(**fields):
    return resolve(Request(**{**L8, "num_gpus": 32, **fields}))[0]


@pytest.mark.parametrize(("fields", "node"), [({}, 8), ({"gpus_per_node": 4}, 4), ({"num_gpus": 12}, 8)])
def test_the_node_rate_is_shared_by_the_nodes_gpus(fields, node):
    """Per GPU: the node's rate over the GPUs a node holds: the request's gpus_per_node, else the part's node, also
    where the launch split runs fewer of them (12 GPUs of 8-GPU nodes as 3 x 4: the idle GPUs' share is not taken)."""
    job = _job(network_gbps_per_node=400.0, **fields)
    assert job.gpu.network_bandwidth == pytest.approx(400 * GBIT / node, rel=1e-15)
    card = get_gpu("h100")
    # only the network differs from the catalog part
    assert job.gpu.model_dump(exclude={"network_bandwidth"}) == card.model_dump(exclude={"network_bandwidth"})
    note = next(n for n in job.notes if n.startswith("network_gbps_per_node=400:"))
    assert f"{400 / node:,.4g} Gb/s ({400 / node / 8:,.4g} GB/s) per GPU" in note and "400 Gb/s (50 GB/s)" in note


def test_no_network_given_is_the_catalog_part_and_no_note():
    job = _job()
    assert job.gpu is get_gpu("h100") and not any("network_gbps_per_node" in n for n in job.notes)


@pytest.mark.parametrize("gbps", [100.0, 400.0, 3200.0, 25600.0])
def test_a_cross_node_collective_takes_the_ratio_of_the_networks(gbps):
    """Where the traffic is bandwidth-bound on the network (a ring of one rank per node; an all-to-all's share to
    other nodes, over NVLink's), its time less the per-hop latencies is the bytes over the NIC's share at the
    calibrated efficiency: so it scales exactly by the inverse of the stated rate."""
    cal = calibration("megatron-core")
    lk = job_links(_job(network_gbps_per_node=gbps), cal)
    per_gpu = gbps * GBIT / 8 * cal.network_efficiency
    assert lk.inter_bw == pytest.approx(per_gpu, rel=1e-15)
    nbytes, size = 3e9, 4
    ring = ring_time(nbytes, size, 8, lk) - (size - 1) * lk.inter_lat  # stride 8: one rank per 8-GPU node
    assert ring == pytest.approx(nbytes * (size - 1) / size / min(lk.nvlink_bw(1), per_gpu), rel=1e-12)
    slower = job_links(_job(network_gbps_per_node=gbps / 2), cal)
    ring_slower = ring_time(nbytes, size, 8, slower) - (size - 1) * slower.inter_lat
    assert per_gpu < lk.nvlink_bw(1)  # every rate here is under NVLink's: the NIC bounds the ring
    assert ring_slower == pytest.approx(2 * ring, rel=1e-12)
    a2a = alltoall_time(nbytes, 32, 1, lk) - lk.inter_lat  # 24 of a rank's 32 shares go to other nodes
    assert nbytes * 24 / 32 / per_gpu > nbytes * 7 / 32 / lk.nvlink_bw(8)  # the network's share outlasts NVLink's
    assert a2a == pytest.approx(nbytes * 24 / 32 / per_gpu, rel=1e-12)
    assert alltoall_time(nbytes, 32, 1, slower) - slower.inter_lat == pytest.approx(2 * a2a, rel=1e-12)


def test_the_cards_own_rate_stated_changes_nothing_and_one_node_never_reads_it():
    """8 x 400 Gb/s per DGX H100 node is the card's 50 GB/s per GPU: the same estimate to the bit. A job on one node
    crosses no network, whatever it is."""
    base = Request(**L8, num_gpus=32, tp=2, pp=2)
    same = api.estimate_throughput(base.model_copy(update={"network_gbps_per_node": 3200.0}))
    assert same.step_time_s == api.estimate_throughput(base).step_time_s
    slow = api.estimate_throughput(base.model_copy(update={"network_gbps_per_node": 100.0}))
    assert slow.step_time_s > same.step_time_s
    one = Request(**L8, num_gpus=8, tp=2)
    assert (api.estimate_throughput(one.model_copy(update={"network_gbps_per_node": 1.0})).step_time_s
            == api.estimate_throughput(one).step_time_s)


def test_an_rl_jobs_weight_reshard_across_nodes_reads_it():
    """rl/step_time's weight reshard between a trainer and a rollout engine on GPUs of their own crosses the
    network: a slower network, a longer RL step."""
    rl = dict(model="qwen3-8b", gpu="h100", num_gpus=16, framework="verl", job="rl", placement="separate",
              rollout_gpus=8)
    fast = api.estimate_throughput(Request(**rl)).step_time_s
    assert api.estimate_throughput(Request(**rl, network_gbps_per_node=100.0)).step_time_s > fast


def test_recommend_and_min_gpus_search_on_the_stated_network():
    """The search's jobs resolve from the request, so recommend ranks on the cluster's network (its best is no
    faster than on the card's) and says so; its best row is the estimate of that plan on the same request."""
    req = Request(**L8, num_gpus=16)
    slow_req = req.model_copy(update={"network_gbps_per_node": 50.0})
    card, slow = api.recommend(req, top_k=1), api.recommend(slow_req, top_k=1)
    assert slow.candidates[0].throughput.step_time_s >= card.candidates[0].throughput.step_time_s
    assert any(a.startswith("network_gbps_per_node=50:") for a in slow.assumptions)
    assert not any("network_gbps_per_node" in a for a in card.assumptions)
    plan = slow.candidates[0].plan
    again = api.estimate_throughput(slow_req.model_copy(update={
        "tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp, "cp": plan.cp, "ep": plan.ep, "etp": plan.etp,
        "zero_stage": plan.zero_stage, "micro_batch_size": plan.micro_batch_size, "recompute": plan.recompute}))
    assert again.step_time_s == pytest.approx(slow.candidates[0].throughput.step_time_s, rel=1e-12)
    least = api.minimum_gpus(Request(model="llama-3.1-8b", gpu="h100", network_gbps_per_node=50.0))
    assert any(a.startswith("network_gbps_per_node=50:") for a in least.assumptions)


@pytest.mark.parametrize(("value", "said"), [
    (0, "network_gbps_per_node: Input should be greater than or equal to 1 (got 0)"),
    (0.5, "network_gbps_per_node: Input should be greater than or equal to 1 (got 0.5)"),
    (-400, "network_gbps_per_node: Input should be greater than or equal to 1 (got -400)"),
    (MAX_NODE_GBPS * 2, f"network_gbps_per_node: Input should be less than or equal to {MAX_NODE_GBPS} "
                        f"(got {MAX_NODE_GBPS * 2})"),
    ("400", "network_gbps_per_node: Input should be a valid number (got '400')"),
    (True, "network_gbps_per_node: Input should be a valid number (got True)"),
])
def test_an_out_of_range_or_wrong_typed_rate_is_refused_with_its_bounds(value, said):
    with pytest.raises(MeshplanError) as exc:
        parse_request({**L8, "num_gpus": 16, "network_gbps_per_node": value})
    assert str(exc.value).startswith(f"Invalid request: {said}")


def test_the_names_people_type_for_it_are_pointed_at_it():
    for name in ("network_bandwidth", "inter_node_bandwidth", "nic_bandwidth"):
        with pytest.raises(MeshplanError, match="Did you mean 'network_gbps_per_node'"):
            parse_request({**L8, name: 400})
