"""The data-parallel gradient reduction's overlap as the plan sets it (grad_reduce_overlap).

Megatron-Core's DistributedDataParallelConfig overlap_grad_reduce / overlap_param_gather default to False, and
DeepSpeed's zero_optimization.overlap_comm to False below ZeRO-3: a run that leaves them off waits for the whole
reduction after the backward. With grad_reduce_overlap=false the time model hides none of it (the calibrated
dp_overlap / zero_grad_overlap / param_gather_overlap apply only with it on, the default, as render writes it).
"""

from __future__ import annotations

import pytest

from meshplan.arithmetic.comm import links, ring_time
from meshplan.arithmetic.mesh import mesh_groups
from meshplan.estimate.perf import dp_traffic, estimate_throughput, step_sync
from meshplan.estimate.sharding_traffic import (
    ShardingSchedule,
    ShardUnit,
    exposed_by_schedule,
    exposed_sharding,
    sharding_schedule,
)
from meshplan.knowledge.calibration import calibration
from meshplan.knowledge.cards import framework_card
from meshplan.knowledge.model_counts import total_params
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

EXPERT_PARAMS = 48 * 128 * 3 * 2048 * 768  # Qwen3-30B-A3B's routed experts


def qwen30b(gpus: int, framework: str = "megatron-core", **kw):
    return resolve(Request(model="qwen3-30b-a3b", gpu="h20", num_gpus=gpus, framework=framework, tp=1, pp=1, ep=8,
                           etp=1, seq_length=10240, micro_batch_size=1, global_batch_size=256, zero_stage=1, **kw))


def test_default_is_on_and_off_is_noted():
    job, plan = qwen30b(16)
    assert plan.grad_reduce_overlap is True
    assert not any("grad_reduce_overlap" in n for n in job.notes)
    job, plan = qwen30b(16, grad_reduce_overlap=False)
    assert plan.grad_reduce_overlap is False
    assert any(n.startswith("grad_reduce_overlap=false") for n in job.notes)


@pytest.mark.parametrize("gpus", [16, 32])
def test_off_exposes_the_whole_zero1_sync_by_hand(gpus):
    job, plan = qwen30b(gpus, grad_reduce_overlap=False)
    lk = links(job.gpu, job.gpus_per_node, calibration("megatron-core"))
    dense = total_params(job.model) - EXPERT_PARAMS
    expert_dp = gpus // 8
    # fp32 gradients reduce-scattered, bf16 parameters all-gathered: dense over dp, experts over the expert-DP group
    hand = sum(ring_time(dense * nbytes, gpus, 1, lk) + ring_time(EXPERT_PARAMS / 8 * nbytes, expert_dp, 8, lk)
               for nbytes in (4, 2))
    off = estimate_throughput(job, plan)
    assert off.breakdown.dp_comm_s == pytest.approx(hand, rel=1e-12)
    # the same exposure verl's Megatron engine runs (its calibration overrides the three overlaps with 0)
    assert off.breakdown.dp_comm_s == pytest.approx(estimate_throughput(*qwen30b(gpus, "verl")).breakdown.dp_comm_s,
                                                    rel=1e-12)


def test_off_adds_exactly_the_hidden_share_to_the_step():
    on = estimate_throughput(*qwen30b(32))
    off = estimate_throughput(*qwen30b(32, grad_reduce_overlap=False))
    assert on.breakdown.dp_comm_s < off.breakdown.dp_comm_s
    # nothing but the once-per-step sync changes: the step grows by exactly what the overlap had hidden
    assert off.step_time_s - on.step_time_s == pytest.approx(off.breakdown.dp_comm_s - on.breakdown.dp_comm_s,
                                                             rel=1e-9)
    dp = next(a for a in off.assumptions if a.startswith("DP:"))
    assert "reduce-scattered with 0% of the last backward hiding it" in dp and "0% of the next forward" in dp


@pytest.mark.parametrize("framework", ["verl", "torchtitan", "nanotron"])
def test_off_is_refused_where_the_framework_has_no_such_setting(framework):
    from meshplan.core.errors import MeshplanError
    with pytest.raises(MeshplanError, match=r"grad_reduce_overlap=false: .* has no setting") as err:
        resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework=framework, grad_reduce_overlap=False))
    assert err.value.fix == "Leave grad_reduce_overlap out for this framework."


# --------------------------------------------------------------------------- readers and renderers
CORE_SCRIPT = """torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py \\
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --expert-model-parallel-size 8 \\
    --use-distributed-optimizer --micro-batch-size 1 --global-batch-size 256 --seq-length 4096 --bf16 \\
    --num-layers 48 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 32 --num-query-groups 4 \\
    --num-experts 128 --moe-ffn-hidden-size 768 --moe-router-topk 8 --kv-channels 128 --swiglu{extra}
"""


@pytest.mark.parametrize("extra,on", [("", False), (" --overlap-grad-reduce", True),
                                      (" --overlap-grad-reduce --overlap-param-gather", True)])
def test_megatron_lm_script_reads_overlap_grad_reduce_and_its_default_off(extra, on):
    from meshplan import api
    imported = api.import_config(CORE_SCRIPT.format(extra=extra), path="train.sh", framework="megatron-core")
    assert imported.request["grad_reduce_overlap"] is on
    assert not imported.unsupported
    if not on:  # Megatron-Core's DistributedDataParallelConfig default
        assert imported.defaults["grad_reduce_overlap"] is False


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("zero", [0, 1])
def test_megatron_lm_render_writes_the_switch_and_reads_it_back(on, zero):
    from meshplan import api
    from meshplan.request.parse import parse_request
    rendered = api.render_config("megatron-core", parse_request(dict(
        model="llama-3.1-8b", num_gpus=16, framework="megatron-core", zero_stage=zero, tp=4,
        grad_reduce_overlap=on)))
    assert ("--overlap-grad-reduce" in rendered.text) is on
    assert ("--overlap-param-gather" in rendered.text) is (on and zero > 0)  # arguments.py: distributed optimizer
    imported = api.import_config(rendered.text, path="train.sh", framework="megatron-core")
    assert imported.request["grad_reduce_overlap"] is on


@pytest.mark.parametrize("stage,default", [(1, False), (2, False), (3, None)])
def test_deepspeed_config_without_overlap_comm_takes_deepspeed_default(stage, default):
    """DeepSpeedZeroConfig.overlap_comm None means stage == 3: off at ZeRO-1/2; at ZeRO-3 on, meshplan's default."""
    import json

    from meshplan import api
    from meshplan.request.parse import parse_request
    rendered = api.render_config("deepspeed", parse_request(dict(model="llama-3.1-8b", num_gpus=8, zero_stage=stage,
                                                                 framework="deepspeed")))
    config = json.loads(rendered.text)
    assert config["zero_optimization"]["overlap_comm"] is True  # render writes it as the plan times it
    del config["zero_optimization"]["overlap_comm"]
    imported = api.import_config(json.dumps(config), path="ds_config.json", framework="deepspeed")
    assert imported.request.get("grad_reduce_overlap") is default


@pytest.mark.parametrize("on", [True, False])
def test_bridge_render_writes_both_ddp_switches_and_reads_them_back(on):
    from meshplan import api
    from meshplan.request.parse import parse_request
    rendered = api.render_config("megatron-bridge", parse_request(dict(
        model="llama-3.1-8b", num_gpus=16, framework="megatron-bridge", tp=4, grad_reduce_overlap=on)))
    assert f"cfg.ddp.overlap_grad_reduce = {on}" in rendered.text
    assert f"cfg.ddp.overlap_param_gather = {on}" in rendered.text  # the plan's zero_stage 1: distributed optimizer
    imported = api.import_config(rendered.text, path="cfg.py", framework="megatron-bridge")
    assert imported.request["grad_reduce_overlap"] is on and not imported.unsupported


def _zero3(framework: str, on: bool):
    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=16, framework=framework, zero_stage=3,
                                grad_reduce_overlap=on))
    return job, plan, estimate_throughput(job, plan)


def test_in_line_sharding_waits_for_every_transfer_whole():
    """ShardingSchedule.overlapped false: each unit's all-gathers (forward and, resharded, backward) and
    reduce-scatter are summed whole, where exposed_sharding hides them behind the neighbouring units' compute."""
    units = (ShardUnit(1, 0.5, 0.0, 0.2, 0.4), ShardUnit(30, 0.3, 0.6, 1.0, 2.0),
             ShardUnit(1, 0.7, 1.1, 0.5, 1.0, resharded=False))
    moved = 2 * 0.5 + 30 * (2 * 0.3 + 0.6) + (0.7 + 1.1)  # the last unit kept gathered: no backward all-gather
    hidden = exposed_by_schedule(units, ShardingSchedule(True, True, True, True))
    in_line = exposed_by_schedule(units, ShardingSchedule(True, True, True, True, overlapped=False))
    assert in_line.micro == pytest.approx(moved)
    assert hidden.micro == pytest.approx(exposed_sharding(units, True, True, True)) and hidden.micro < moved
    assert in_line.step_gather == in_line.step_reduce == 0.0


def test_deepspeed_zero3_with_overlap_comm_false_runs_its_transfers_in_line():
    """DeepSpeed's ZeRO-3 puts its all-gathers (partitioned_param_coordinator's __allgather_stream) and reduce-scatters
    (stage3's reduce_and_partition_stream) on the default stream when overlap_comm is false (the card's
    sharding_overlap_off, units compute_stream at ZeRO-3): the step waits for every transfer, and the DP assumption
    says so."""
    job, _, off = _zero3("deepspeed", False)
    _, _, on = _zero3("deepspeed", True)
    assert job.card.sharding_overlap_off.units == "compute_stream" and job.card.sharding_overlap_off.zero_stages == [3]
    assert off.breakdown.dp_comm_s > on.breakdown.dp_comm_s and off.step_time_s > on.step_time_s
    # only the sharding traffic moves: compute, recompute and the other collectives are the same
    for part in ("compute_s", "recompute_s", "tp_comm_s", "ep_comm_s", "pp_comm_s"):
        assert getattr(off.breakdown, part) == getattr(on.breakdown, part)
    [dp] = [a for a in off.assumptions if a.startswith("DP (ZeRO-3")]
    assert "runs on the compute stream" in dp and "waits whole" in dp
    [dp_on] = [a for a in on.assumptions if a.startswith("DP (ZeRO-3")]
    assert "hides behind the neighbouring layer" in dp_on


def _mfsdp(framework: str, zero: int, replicas: int, on: bool, card=None, **kw):
    job, plan = resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=32, framework=framework, zero_stage=zero,
                                tp=1, pp=1, dp_replicate=replicas, grad_reduce_overlap=on, **kw))
    if card is not None:  # the same job on another card (the resolver attaches the framework's own)
        job = job.model_copy().attach_cards(card)
    return job, plan, estimate_throughput(job, plan)


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
def test_megatron_fsdp_cards_say_it_turns_its_overlap_back_on(framework):
    """MegatronFSDP.__init__ sets overlap_grad_reduce (optim_grads, optim_grads_params) and overlap_param_gather
    (optim_grads_params) back to True on the ddp config Megatron-Core's adapter passes it, whichever the flags."""
    off = framework_card(framework).sharding_overlap_off
    assert off.units == "overlapped" and off.zero_stages == [2, 3]
    assert "MegatronFSDP.__init__" in off.source


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_megatron_fsdp_zero3_is_the_same_step_with_the_switch_off(framework, replicas):
    """At ZeRO-3 every transfer is a unit's (its all-gathers prefetched, its reduce-scatter, and with replicas the
    outer all-reduce the same reduce_gradients call issues): none moves in line, the step is the switch-on step."""
    job, plan, off = _mfsdp(framework, 3, replicas, False)
    _, _, on = _mfsdp(framework, 3, replicas, True)
    assert sharding_schedule(job, plan).overlapped
    assert off.step_time_s == on.step_time_s and off.breakdown == on.breakdown
    [dp] = [a for a in off.assumptions if a.startswith("DP (ZeRO-3")]
    assert "changes none of that" in dp and "sharding_overlap_off" in dp and "not modelled" not in dp


@pytest.mark.parametrize("replicas", [1, 2])
def test_megatron_fsdp_zero2_exposes_only_the_gather_after_the_optimizer(replicas):
    """At optim_grads (ZeRO-2) overlap_param_gather is left as set: the updated parameters' all-gather after the
    optimizer (start_param_sync, synchronous) waits whole, while the units' reduce-scatters and the replicas'
    all-reduce stay hidden. The step grows by exactly the gather's hidden share of the first rank's forward, less the
    forward's work its NCCL kernels would have taken beside it."""
    batch = dict(seq_length=8192, micro_batch_size=4, global_batch_size=128)  # one micro-batch, a long forward
    job, plan, off = _mfsdp("megatron-core", 2, replicas, False, **batch)
    _, plan_on, on = _mfsdp("megatron-core", 2, replicas, True, **batch)
    cal = calibration("megatron-core")
    lk = links(job.gpu, job.gpus_per_node, cal)
    traffic = dp_traffic(job, plan, lk, mesh_groups(plan, law=job.card.world_size_law), cal)
    dense = total_params(job.model)
    sync_off = step_sync(job, plan, cal, lk, traffic, dense, 0.0, True)
    sync_on = step_sync(job, plan_on, cal, lk, traffic, dense, 0.0, True)
    assert sync_off.reduce_hidden == sync_on.reduce_hidden == cal.dp_overlap  # the replicas' all-reduce: kept
    assert (sync_on.reduce > 0) is (replicas > 1)
    assert sync_off.gather == sync_on.gather > 0 and sync_off.gather_hidden == 0.0
    assert sync_on.gather_hidden == cal.param_gather_overlap
    assert plan.num_microbatches(job.global_batch_size) == 1
    # switch on, the forward hides param_gather_overlap of it, here all of it, less the forward's work the gather's
    # NCCL kernels take (comm.contended: sm_share of its seconds); off, it is all exposed
    assert 0.0 < sync_on.sm_share < 1.0
    assert off.breakdown.dp_comm_s - on.breakdown.dp_comm_s == pytest.approx(
        sync_off.gather * (1.0 - sync_on.sm_share), rel=1e-9)
    assert off.step_time_s - on.step_time_s == pytest.approx(sync_off.gather * (1.0 - sync_on.sm_share), rel=1e-9)
    [dp] = [a for a in off.assumptions if a.startswith("DP (ZeRO-2")]
    assert "changes none of that" in dp and "after the optimizer follows the switch and waits whole" in dp


def test_the_schedule_reads_the_card_not_the_framework():
    """The same plan on Megatron-Core's engine with DeepSpeed's fact (units on the compute stream) moves every unit's
    transfer in line, and without any fact its replicas' all-reduce is no longer kept hidden: the card decides."""
    card = framework_card("megatron-core")
    ds = framework_card("deepspeed").sharding_overlap_off.model_copy(update={"zero_stages": [2, 3]})
    job, plan, in_line = _mfsdp("megatron-core", 3, 2, False, card.model_copy(update={"sharding_overlap_off": ds}))
    _, _, kept = _mfsdp("megatron-core", 3, 2, False)
    _, _, unread = _mfsdp("megatron-core", 3, 2, False, card.model_copy(update={"sharding_overlap_off": None}))
    assert not sharding_schedule(job, plan).overlapped
    assert in_line.step_time_s > unread.step_time_s > kept.step_time_s
    [dp] = [a for a in unread.assumptions if a.startswith("DP (ZeRO-3")]
    assert "grad_reduce_overlap=false is not modelled on this schedule" in dp


def test_deepspeed_zero0_all_reduces_after_the_backward_whatever_the_switch():
    """Without ZeRO, DeepSpeedEngine.backward all-reduces the gradients only once the loss's backward has returned
    (allreduce_gradients, buffered_allreduce_fallback): cards/calibration.yaml frameworks.deepspeed dp_overlap 0, where
    Megatron-Core's --overlap-grad-reduce hides dp_overlap of the same all-reduce behind the backward."""
    def zero0(framework: str, on: bool):
        return estimate_throughput(*resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=64, framework=framework,
                                                    zero_stage=0, tp=1, pp=1, grad_reduce_overlap=on)))
    assert calibration("deepspeed").dp_overlap == 0.0 and calibration("megatron-core").dp_overlap > 0.0
    on, off = zero0("deepspeed", True), zero0("deepspeed", False)
    assert on.step_time_s == off.step_time_s and on.breakdown.dp_comm_s == off.breakdown.dp_comm_s
    megatron_on, megatron_off = zero0("megatron-core", True), zero0("megatron-core", False)
    assert megatron_on.breakdown.dp_comm_s < megatron_off.breakdown.dp_comm_s
    # the same all-reduce, exposed, and then BF16_Optimizer's all-gather of the bf16 weights from its dp shards (its
    # own ZeRO-1), inside optimizer.step(): the gather ZeRO-1 runs after its reduce-scatter, half the all-reduce
    zero1 = estimate_throughput(*resolve(Request(model="llama-3.1-8b", gpu="h100", num_gpus=64, framework="deepspeed",
                                                 zero_stage=1, tp=1, pp=1, grad_reduce_overlap=False)))
    gather = zero1.breakdown.dp_comm_s - megatron_off.breakdown.dp_comm_s / 2
    assert gather > 0
    assert on.breakdown.dp_comm_s == pytest.approx(megatron_off.breakdown.dp_comm_s + gather)
    [dp] = [a for a in on.assumptions if a.startswith("DP:")]
    assert "all-reduced after the last backward, none of it hidden" in dp
    assert "bf16 parameters are all-gathered, 0% of the next forward hiding it" in dp
    [megatron_dp] = [a for a in megatron_off.assumptions if a.startswith("DP:")]
    assert "all-gathered" not in megatron_dp
