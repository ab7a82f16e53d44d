"""torchtitan 0.3.0's ZeRO-0 (data_parallel_shard_degree 1) is FSDP2's fully_shard over a shard of one with dp
replicas (HSDP), not DDP (cards/frameworks/torchtitan.yaml engine.replica_shard): the estimate is ZeRO-3's at
dp_replicate = dp, which renders the same degrees; torchtitan 0.2.x ran DDP there (ddp_releases)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic import mesh
from meshplan.arithmetic.memory_states import convention, replicas_at, replicates_by_sharding, state_replicas
from meshplan.estimate.memory import state_shards
from meshplan.estimate.sharding_traffic import sharding_schedule
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.engine_card import EngineFacts
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(model="llama-3.1-8b", gpu="h100-sxm", framework="torchtitan", seq_length=4096, global_batch_size=64,
            micro_batch_size=1)
LAYOUTS = [dict(num_gpus=8), dict(num_gpus=16, cp=2, seq_length=8192), dict(num_gpus=16, tp=2, pp=2)]


def test_the_card_states_it_for_0_3_not_0_2():
    card = framework_card("torchtitan")
    assert replicates_by_sharding(card, 0, None) and replicates_by_sharding(card, 0, "0.3.0")
    assert not replicates_by_sharding(card, 0, "0.2.2") and not replicates_by_sharding(card, 0, "0.1.0")
    assert not replicates_by_sharding(card, 3, None)
    # no other framework's card says it: verl's FSDP engine, DeepSpeed and Megatron replicate with DDP at ZeRO-0
    for name in ("verl", "deepspeed", "megatron-core", "kempnerforge", "skyrl"):
        assert not replicates_by_sharding(framework_card(name), 0, None), name


def test_a_replica_shard_names_the_zero0_engine():
    facts = framework_card("verl").engine.model_dump()
    facts["replica_shard"] = {"engines": ["fsdp"], "source": "x"}  # verl's ZeRO-0 runs its Megatron engine
    with pytest.raises(ValueError, match="replica_shard"):
        EngineFacts.model_validate(facts)


@pytest.mark.parametrize("fields", LAYOUTS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_zero0_is_zero3_at_dp_replicas(fields):
    """The same TOML (data_parallel_replicate_degree dp, data_parallel_shard_degree 1), the same estimate."""
    plan0 = resolve(Request(**{**BASE, **fields, "zero_stage": 0}))[1]
    plan3 = resolve(Request(**{**BASE, **fields, "zero_stage": 3, "dp_replicate": plan0.dp}))[1]
    assert mesh.torch_dp_degrees(plan0) == mesh.torch_dp_degrees(plan3) == (plan0.dp, 1)
    mem0, mem3 = api.estimate_memory(Request(**{**BASE, **fields, "zero_stage": 0})), \
        api.estimate_memory(Request(**{**BASE, **fields, "zero_stage": 3, "dp_replicate": plan0.dp}))
    assert [s.model_dump() for s in mem0.stages] == [s.model_dump() for s in mem3.stages]
    t0 = api.estimate_throughput(Request(**{**BASE, **fields, "zero_stage": 0}))
    t3 = api.estimate_throughput(Request(**{**BASE, **fields, "zero_stage": 3, "dp_replicate": plan0.dp}))
    assert t0.step_time_s == t3.step_time_s and t0.breakdown == t3.breakdown
    assert any("fully_shard over a shard of" in a for a in mem0.assumptions)
    assert any("fully_shard over a shard of" in a for a in t0.assumptions)


def test_states_are_sharded_over_cp_with_dp_replicas():
    """ZeRO-3's tensors (fp32 weights 4, fp32 grads 4, Adam 8) over a shard of dp_shard x cp = cp ranks."""
    job, plan = resolve(Request(**{**BASE, "num_gpus": 16, "cp": 2, "seq_length": 8192, "zero_stage": 0}))
    assert state_replicas(job, plan) == plan.dp == 8
    assert state_shards(job, plan)[0] == 2  # dp*cp / dp replicas
    _, _, tensors = convention(job.card, 0, job.framework_version)
    assert {t.tensor_class: (t.bytes, t.shard) for t in tensors} == {
        "weights": (4, "dp"), "gradients": (4, "dp"), "optimizer": (8, "dp")}
    old = job.model_copy(update={"framework_version": "0.2.2"})
    assert state_replicas(old, plan) == 1  # DDP: nothing to replicate over, nothing sharded
    assert all(t.shard == "none" for t in convention(job.card, 0, "0.2.2")[2])


@pytest.mark.parametrize("version", [None, "0.2.2"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_replicas_at_every_stage_follow_the_card(zero, version):
    """replicas_at and state_replicas read the ZeRO stage before the card (the search asks them per grid): dp where
    the card's ZeRO-0 shards over one (0.3), else the plan's dp_replicate, at every stage and replica count; the
    convention's preset is ZeRO-3's exactly there."""
    job, _ = resolve(Request(**{**BASE, "num_gpus": 16, "zero_stage": 3}))
    job = job.model_copy(update={"framework_version": version})
    card, shards = job.card, replicates_by_sharding(job.card, zero, version)
    assert shards == (zero == 0 and version is None)
    for dp_replicate in (1, 2, 4):
        want = 16 if shards else dp_replicate
        assert replicas_at(job, zero, 16, dp_replicate) == want
        plan = resolve(Request(**{**BASE, "num_gpus": 16, "zero_stage": 3, "dp_replicate": dp_replicate}))[1]
        assert state_replicas(job, plan.model_copy(update={"zero_stage": zero})) == want
    assert (convention(card, zero, version)[0] == convention(card, 3, version)[0]) or not shards


def test_memory_holds_the_units_transient():
    """0.3.0's ZeRO-0 gathers each unit's bf16 parameters and holds its fp32 reduce input (gathered_layers); the
    16 bytes per parameter of 0.2.2's DDP are the same states with no unit's transient."""
    new = api.estimate_memory(Request(**{**BASE, "num_gpus": 8, "zero_stage": 0}))
    old = api.estimate_memory(Request(**{**BASE, "num_gpus": 8, "zero_stage": 0, "framework_version": "0.2.2"}))
    s_new, s_old = new.stages[0], old.stages[0]
    params = s_new.detail["params_on_gpu"]
    assert s_new.weights_bytes == s_old.weights_bytes == pytest.approx(4 * params, rel=1e-6)
    assert s_new.optimizer_bytes == s_old.optimizer_bytes == pytest.approx(8 * params, rel=1e-6)
    assert s_new.detail["gathered_layers"] > 0 and "gathered_layers" not in s_old.detail


def test_time_gathers_and_reduces_each_unit_with_the_replicas_allreduce():
    job, plan = resolve(Request(**{**BASE, "num_gpus": 8, "zero_stage": 0}))
    sched = sharding_schedule(job, plan)
    assert sched.params_sharded and sched.grads_sharded and sched.per_step
    old = job.model_copy(update={"framework_version": "0.2.2"})
    assert not sharding_schedule(old, plan).per_step  # DDP: one all-reduce per step
    new_t = api.estimate_throughput(Request(**{**BASE, "num_gpus": 8, "zero_stage": 0}))
    assert any("8 replicas" in a and "all-reduced across" in a for a in new_t.assumptions)


def test_ws005_reads_the_rendered_shard_degree():
    """At zero_stage 0 the render writes data_parallel_shard_degree 1, so EP borrows from cp*tp alone
    (torchtitan 0.3.0 parallel_dims.py efsdp = dp_shard*cp*tp // ep)."""
    moe = dict(BASE, model="qwen3-30b-a3b", num_gpus=16)
    report = api.check_config(Request(**moe, zero_stage=0, ep=4))
    assert "WS005" in {f.id for f in report.findings}
    report = api.check_config(Request(**moe, zero_stage=3, ep=4))
    assert "WS005" not in {f.id for f in report.findings}
    report = api.check_config(Request(**moe, zero_stage=0, ep=2, tp=2))
    assert "WS005" not in {f.id for f in report.findings}


def test_render_says_it():
    req = Request(**{**BASE, "model": "llama-3.1-8b", "num_gpus": 8, "zero_stage": 0, "param_offload": True})
    notes = api.render_config("torchtitan", req, force=True).notes
    assert any("still wraps each block in fully_shard" in n for n in notes)
    old = api.render_config("torchtitan", req.model_copy(update={"framework_version": "0.2.2"}), force=True).notes
    assert not any("fully_shard" in n for n in old)
