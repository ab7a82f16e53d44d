"""torchtitan 0.3.0's ZeRO-0 (data_parallel_shard_degree 1) is FSDP2's fully_shard over a shard of one with dp
replicas (HSDP), not DDP (cards/frameworks/torchtitan.yaml engine.replica_shard): the estimate is ZeRO-3's at
dp_replicate = dp, which renders the same degrees; torchtitan 0.2.x ran DDP there (ddp_releases)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.adapters.render import RefusedLayout
from meshplan.arithmetic import mesh
from meshplan.arithmetic.memory_states import convention, replicas_at, replicates_by_sharding, state_replicas
from meshplan.core.errors import MeshplanError
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


OLD_CP = dict(BASE, num_gpus=16, cp=2, seq_length=8192, recompute="selective")


@pytest.mark.parametrize("release", ["0.1.0", "0.2.2"])
def test_zero0_at_cp_is_refused_where_the_release_runs_it_as_zero3_over_cp(release):
    """torchtitan 0.1/0.2 run ZeRO-0 as DDP (ddp_releases), but at cp > 1 ParallelDims.fsdp_enabled (dp_shard > 1 or
    cp > 1) sends them to fully_shard over dp_shard x cp with dp replicas: the file meshplan writes would run ZeRO-3
    over the CP ranks, not the replicated states it estimates. TT004 refuses it on check, render and the estimates;
    its first fix is the ZeRO-3 plan that file is (the same degrees, estimated as it runs), its second cp=1."""
    req = Request(**OLD_CP, zero_stage=0, framework_version=release)
    found = {f.id: f for f in api.check_config(req).findings}["TT004"]
    assert found.severity == "error"
    assert "runs fully_shard over the 2 CP ranks with 8 replicas" in found.message
    assert "8 B of model states per parameter on each GPU" in found.message and "replicated, 16 B" in found.message
    assert found.fix.startswith("Use zero_stage=3 with dp_replicate=8 ")
    with pytest.raises(RefusedLayout, match="TT004"):
        api.render_config("torchtitan", req)
    with pytest.raises(MeshplanError, match="TT004"):
        api.estimate_memory(req)
    fixed = Request(**OLD_CP, zero_stage=3, dp_replicate=8, framework_version=release)
    assert "TT004" not in {f.id for f in api.check_config(fixed).findings}
    forced = api.render_config("torchtitan", req, force=True).text
    assert len(_parallelism(forced)) >= 4
    assert _parallelism(api.render_config("torchtitan", fixed).text) == _parallelism(forced)
    states = api.estimate_memory(fixed).stages[0]
    assert states.optimizer_bytes == pytest.approx(8 / 2 * states.detail["params_on_gpu"], rel=1e-6)  # over cp
    for passing in (dict(cp=1, seq_length=8192), dict(zero_stage=3)):
        fields = {**OLD_CP, "zero_stage": 0, "framework_version": release, **passing}
        assert "TT004" not in {f.id for f in api.check_config(Request(**fields)).findings}


def test_zero0_at_cp_passes_on_0_3_where_it_is_estimated_as_it_runs():
    """0.3.0's ZeRO-0 is fully_shard over dp_shard x cp at every cp (replica_shard), which the estimate takes."""
    assert "TT004" not in {f.id for f in api.check_config(Request(**OLD_CP, zero_stage=0)).findings}


def test_the_search_drops_zero0_at_cp_on_0_2():
    """recommend's candidates at a given cp on 0.2.2 hold no ZeRO-0 plan (on main before TT004: 0 and 3 both)."""
    report = api.recommend(Request(**OLD_CP, framework_version="0.2.2"), top_k=50)
    assert report.candidates and {c.plan.zero_stage for c in report.candidates} == {3}


def _parallelism(config: str) -> list[str]:
    """The parallel degrees' lines of a rendered torchtitan file (0.2's TOML, or the 0.3 flags a 0.1 job renders)."""
    return [line.strip(" \\") for line in config.splitlines() if "_degree" in line]
