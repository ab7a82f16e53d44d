"""Hybrid sharding (Plan.dp_replicate, issue 24): states sharded over one replica's dp*cp / dp_replicate ranks,
the DP collectives over that group plus one all-reduce of the shard's gradients across the replicas per step; its
rules, its framework keys rendered and read back, and recommend keeping a given value."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.render import render
from meshplan.arithmetic import mesh
from meshplan.arithmetic.comm import allreduce_time, links
from meshplan.arithmetic.mesh import Group
from meshplan.estimate.perf import dp_traffic
from meshplan.estimate.sharding_traffic import DpTraffic
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

DENSE = dict(model="llama-3.1-8b", gpu="h100", num_gpus=32, global_batch_size=128)
MOE = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=32, ep=8, global_batch_size=128)


def _stages(**fields):
    return api.estimate_memory(Request(**fields)).stages


def test_default_is_one_and_stating_one_changes_nothing():
    _, plan = resolve(Request(framework="megatron-core", **DENSE))
    assert plan.dp_replicate == 1
    for fields in (dict(DENSE, framework="megatron-core", zero_stage=1),
                   dict(MOE, framework="megatron-core", zero_stage=3), dict(DENSE, framework="torchtitan")):
        assert _stages(**fields) == _stages(**fields, dp_replicate=1)
        a = api.estimate_throughput(Request(**fields))
        b = api.estimate_throughput(Request(**fields, dp_replicate=1))
        assert a.step_time_s == b.step_time_s


@pytest.mark.parametrize("base,zero", [(DENSE, 1), (MOE, 1), (MOE, 3), (DENSE, 3)])
def test_sharded_states_split_over_one_replica(base, zero):
    """Every sharded state over dp*cp / N ranks (dense) and expert-dp / N (routed experts): with N replicas the
    distributed optimizer's states (zero 1: all of the optimizer class sharded) are N times one shard; FSDP's
    (zero 3) weights, gradients and optimizer states likewise, the transient gathered units aside."""
    one = _stages(framework="megatron-core", zero_stage=zero, **base)
    for n in (2, 4):
        many = _stages(framework="megatron-core", zero_stage=zero, dp_replicate=n, **base)
        for a, b in zip(one, many, strict=True):
            assert b.optimizer_bytes == pytest.approx(n * a.optimizer_bytes, rel=1e-9)
            if zero == 1:  # weights and gradients are not sharded by the distributed optimizer
                assert (b.weights_bytes, b.gradients_bytes) == (a.weights_bytes, a.gradients_bytes)


def test_replica_groups_follow_megatrons_rank_order():
    # dp*cp = 16 ranks at stride tp=4, 4 replicas: 4 consecutive members per shard group, replicas 16 ranks apart
    assert mesh.replica_groups(Group(16, 4), 4) == (Group(4, 4), Group(4, 16))
    assert mesh.replica_groups(Group(8, 1), 1) == (Group(8, 1), Group(1, 8))


def test_replica_allreduce_by_hand():
    job, plan = resolve(Request(framework="megatron-core", zero_stage=1, tp=2, dp_replicate=4, **DENSE))
    lk = links(job.gpu, job.gpus_per_node, calibration())
    groups = mesh.mesh_groups(plan, law=job.card.world_size_law)
    traffic = dp_traffic(job, plan, lk, groups, calibration())
    assert (traffic.dense, traffic.replicas[0]) == (Group(4, 2), Group(4, 8))  # dp 16 / 4 replicas, stride tp 2
    dense, nbytes = 1.0e9, 4.0
    expected = allreduce_time(dense / 4 * nbytes, 4, 8, lk)  # each rank's quarter of the gradients, over replicas
    assert traffic.replica_allreduce(dense, 0.0, nbytes) == pytest.approx(expected)
    # Megatron-FSDP all-reduces across replicas in the last micro-batch only; FSDP2 with each unit's reduce-scatter
    assert not traffic.replicas_with_each_reduce and traffic.reduce(dense, 0.0, nbytes) == traffic(dense, 0.0, nbytes)
    fsdp2 = dp_traffic(job, plan, lk, groups, calibration("torchtitan"))
    assert fsdp2.reduce(dense, 0.0, nbytes) == pytest.approx(fsdp2(dense, 0.0, nbytes) + expected)
    plain = dp_traffic(job, plan.model_copy(update={"dp_replicate": 1}), lk, groups, calibration())
    assert plain.replicas is None and plain.dense == groups.dp_cp
    assert plain.replica_allreduce(dense, 0.0, nbytes) == 0.0
    assert DpTraffic(plan=plan, lk=lk, dense=Group(4, 2), expert=Group(1, 1)).replica_allreduce(1.0, 1.0, 2.0) == 0


def test_fsdp_gathers_inside_a_node_are_faster_across_nodes():
    """Megatron-FSDP over 32 ranks crosses nodes; with 4 replicas each shard group is one node of 8, its gathers and
    reduce-scatters on NVLink, one cross-node all-reduce of the shard per step: the step is shorter."""
    fields = dict(DENSE, framework="megatron-core", zero_stage=3)
    full = api.estimate_throughput(Request(**fields))
    hybrid = api.estimate_throughput(Request(**fields, dp_replicate=4))
    assert hybrid.step_time_s < full.step_time_s
    assert any("one replica's 8 ranks" in a for a in hybrid.assumptions)
    assert not any("Hybrid sharding" in a for a in full.assumptions)


def _ids(**fields):
    return [f.id for f in api.check_config(Request(**fields)).findings]


def test_rules():
    assert "DP001" in _ids(framework="megatron-core", zero_stage=1, dp_replicate=3, **DENSE)  # 3 does not divide 32
    assert "DP001" in _ids(framework="megatron-core", zero_stage=1, dp_replicate=16, **MOE)  # expert-dp is 4
    assert "DP002" in _ids(framework="megatron-core", zero_stage=0, dp_replicate=2, **DENSE)
    assert "AD001" in _ids(framework="deepspeed", zero_stage=3, dp_replicate=2, **DENSE)  # no key: its instead
    ok = _ids(framework="megatron-core", zero_stage=1, dp_replicate=2, **DENSE)
    assert not {"DP001", "DP002", "AD001"} & set(ok)


@pytest.mark.parametrize("framework,zero,key", [
    ("megatron-core", 1, "--num-distributed-optimizer-instances 4"),
    ("megatron-bridge", 1, "cfg.ddp.num_distributed_optimizer_instances = 4"),
    ("torchtitan", 3, "--parallelism.data_parallel_shard_degree 8"),
    ("nemo-automodel", 3, "dp_replicate_size: 4"),
    ("verl", 3, "actor_rollout_ref.actor.fsdp_config.fsdp_size=8"),
])
def test_rendered_with_the_frameworks_key(framework, zero, key):
    job, plan = resolve(Request(framework=framework, zero_stage=zero, dp_replicate=4, **DENSE))
    text = render(framework, job, plan, variant="fsdp" if framework == "verl" else None).text
    assert key in text


def test_import_reads_megatron_instances():
    text = ("torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
            "--use-distributed-optimizer --num-distributed-optimizer-instances 4 --num-layers 32 --hidden-size 4096 "
            "--ffn-hidden-size 14336 --num-attention-heads 32 --num-query-groups 8 --seq-length 4096 "
            "--micro-batch-size 1 --global-batch-size 128")
    assert api.import_config(text, framework="megatron-core").request["dp_replicate"] == 4


def test_torchtitan_shard_degree_one_at_cp_over_one_is_read_as_sharded_over_cp():
    """torchtitan's FSDP2 shards over the data-shard x CP ranks whenever cp > 1 (ParallelDims.fsdp_enabled, the
    card's engine.torch_cp.shards_over_cp): recommend's Gemma-2-27B pick on 16 H100, TP2 PP4 CP2 DP1 at ZeRO 3,
    renders data_parallel_shard_degree 1, which import read back as zero_stage 0 (replicas), 72.6 GiB where the plan
    is 68.2; it reads zero_stage 3 over the CP ranks, with its reason, and check of the file is the plan again. At
    cp 1 a shard degree of 1 beside replicas is still plain data parallelism."""
    req = Request(model="gemma-2-27b", gpu="h100", num_gpus=16, framework="torchtitan", tp=2, pp=4, cp=2, dp=1,
                  zero_stage=3, micro_batch_size=1, recompute="none", first_stage_layers=11, last_stage_layers=11)
    text = api.render_config("torchtitan", req).text
    assert "--parallelism.data_parallel_shard_degree 1 " in text and "context_parallel_degree 2 " in text
    imported = api.import_config(text, framework="torchtitan")
    assert (imported.request["zero_stage"], imported.request["dp"]) == (3, 1)
    assert any("shards over the data-shard x CP ranks" in n for n in imported.notes)
    back = api.request_from_config(imported, {"model": "gemma-2-27b", "gpu": "h100", "num_gpus": 16})
    assert api.estimate_memory(back).peak_bytes == api.estimate_memory(req).peak_bytes
    flat = text.replace("context_parallel_degree 2 ", "context_parallel_degree 1 ").replace(
        "data_parallel_replicate_degree 1 ", "data_parallel_replicate_degree 2 ")
    plain = api.import_config(flat, framework="torchtitan").request
    assert (plain["zero_stage"], plain["dp"]) == (0, 2)


def test_recommend_keeps_a_given_dp_replicate():
    rec = api.recommend(Request(framework="megatron-core", dp_replicate=2, **DENSE))
    assert rec.candidates and all(c.plan.dp_replicate == 2 and c.plan.dp % 2 == 0 for c in rec.candidates)
    assert all(c.plan.dp_replicate == 1 for c in api.recommend(Request(framework="megatron-core", **DENSE)).candidates)


def test_torchtitan_ep_borrows_one_replicas_ranks():
    """WS005 over dp_shard = dp / dp_replicate: EP 8 fits 32 shard ranks, not the 4 of one of 8 replicas."""
    fields = dict(MOE, framework="torchtitan", zero_stage=3)
    assert "WS005" not in _ids(**fields, dp_replicate=4)
    assert "WS005" in _ids(**fields, dp_replicate=8)


def test_rule_verdict_does_not_depend_on_an_earlier_plan_without_replicas():
    """AD001's per-knob memo (knowledge/adapter_knobs.missing_layout_knob) keys dp_replicate too: a plan without
    replicas checked first must not answer for one with them on a framework that cannot write them."""
    assert "AD001" not in _ids(framework="deepspeed", zero_stage=3, **DENSE)
    assert "AD001" in _ids(framework="deepspeed", zero_stage=3, dp_replicate=2, **DENSE)
