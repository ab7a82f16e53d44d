"""Data-parallel sharding traffic (ZeRO-2/3, FSDP2, Megatron-FSDP): the exposed-time formula unit by unit, the
schedule each framework runs (per micro-batch or once per step), and what it does to the step time."""

from __future__ import annotations

import pytest

from meshplan.estimate.perf import estimate_throughput
from meshplan.estimate.sharding_traffic import (
    ShardingSchedule,
    ShardUnit,
    exposed_by_schedule,
    exposed_sharding,
    in_line_sharding,
    sharding_schedule,
)
from meshplan.knowledge.calibration import calibration
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request


def _job(**fields):
    return resolve(Request(**fields))


# --------------------------------------------------------------------------- the formula


def test_forward_gathers_hide_behind_the_previous_layer_and_the_first_waits():
    layers = [ShardUnit(count=3, gather=2.0, reduce=3.0, fwd=1.0, bwd=4.0)]
    # first gather whole (2), then each of the 2 others max(0, 2 - 1) = 1
    assert exposed_sharding(layers, True, False, False) == pytest.approx(4.0)


def test_backward_hides_next_gather_and_previous_reduce_scatter_on_the_same_links():
    layers = [ShardUnit(count=3, gather=2.0, reduce=3.0, fwd=1.0, bwd=4.0)]
    # edges: first backward gather 2 + last reduce-scatter 3; windows (backward order): unit 1 hides the gather of
    # unit 2 (2 - 4 -> 0), unit 2 hides gather + reduce-scatter (2 + 3 - 4 = 1), unit 3 the reduce-scatter of
    # unit 2 (3 - 4 -> 0)
    assert exposed_sharding(layers, False, True, True) == pytest.approx(6.0)
    assert exposed_sharding(layers, True, True, True) == pytest.approx(10.0)
    # reduce-scatters only (ZeRO-2, or a deferred FSDP sync): 3 at the end, windows hide 3 - 4 -> 0
    assert exposed_sharding(layers, False, False, True) == pytest.approx(3.0)


def test_a_deferred_reduce_scatter_shares_the_last_backward_with_its_gathers():
    """FSDP2 holding its gradients to the last micro-batch (KempnerForge's set_requires_gradient_sync): that
    backward still all-gathers each unit again, on the same data-parallel process group (one NCCL stream) as the
    reduce-scatters, so the step's reduce costs what the gathers and reduce-scatters leave exposed together less
    what the gathers alone leave, not the reduce-scatters over idle links."""
    layers = [ShardUnit(count=3, gather=2.0, reduce=3.0, fwd=1.0, bwd=4.0)]
    deferred = ShardingSchedule(True, True, gather_each_microbatch=True, reduce_each_microbatch=False)
    out = exposed_by_schedule(layers, deferred)
    assert out.micro == pytest.approx(exposed_sharding(layers, True, True, False))  # 4 forward + 2 backward = 6
    # together 10 (the test above), the gathers alone 6: the last backward pays 4 more, where the reduce-scatters
    # alone over free links would leave 3 (the last one; each window hides 3 - 4 -> 0)
    assert out.step_reduce == pytest.approx(4.0)
    assert out.step_reduce > exposed_sharding(layers, False, False, True)
    # reduced every micro-batch, nothing is left for the step
    assert exposed_by_schedule(layers, ShardingSchedule(True, True, True, True)).step_reduce == 0.0


def test_embedding_has_no_compute_to_hide_the_first_layer_gather():
    units = [ShardUnit(1, gather=1.0, reduce=1.0, fwd=0.0, bwd=0.0),
             ShardUnit(2, gather=2.0, reduce=2.0, fwd=3.0, bwd=6.0)]
    assert exposed_sharding(units, True, False, False) == pytest.approx(1.0 + 2.0 + 0.0)
    # backward: layer 2 gather exposed (2); layer 2 hides layer 1's gather (0); layer 1 hides layer 2's
    # reduce-scatter and the embedding's gather (2 + 1 - 6 -> 0); the embedding hides layer 1's reduce-scatter (2 - 0);
    # the embedding's own reduce-scatter ends the pass (1)
    assert exposed_sharding(units, False, True, True) == pytest.approx(2.0 + 2.0 + 1.0)


def test_kept_head_is_not_gathered_again_and_long_layers_hide_everything_but_the_edges():
    units = [ShardUnit(4, gather=1.0, reduce=1.0, fwd=10.0, bwd=20.0),
             ShardUnit(1, gather=5.0, reduce=5.0, fwd=0.1, bwd=0.2, resharded=False)]
    # forward: first layer 1, the head's gather behind the last layer (5 - 10 -> 0)
    assert exposed_sharding(units, True, False, False) == pytest.approx(1.0)
    # backward: the head starts gathered (0) and hides the last layer's gather (1 - 0.2 = 0.8); the first layer's
    # reduce-scatter ends the pass (1); the last layer hides the head's reduce-scatter (5 + 1 - 20 -> 0)
    assert exposed_sharding(units, False, True, True) == pytest.approx(0.8 + 1.0)


def test_nothing_to_move_is_free():
    units = [ShardUnit(5, 0.0, 0.0, 1.0, 2.0)]
    assert exposed_sharding(units, True, True, True) == 0.0
    assert exposed_sharding([], True, True, True) == 0.0


# --------------------------------------------------------------------------- the schedule per framework


@pytest.mark.parametrize(("framework", "zero", "pp", "expected"), [
    # Megatron-FSDP: released after forward, reduce-scattered every backward, with or without PP
    ("megatron-core", 3, 1, (True, True, True, True)),
    ("megatron-core", 3, 2, (True, True, True, True)),
    # Megatron-FSDP optim_grads (ZeRO-2): gradients only, every backward
    ("megatron-core", 2, 1, (False, True, False, True)),
    # distributed optimizer: once per step, outside the unit-by-unit path
    ("megatron-core", 1, 1, (False, False, False, False)),
    # torchtitan: FSDP2 reshards and reduces every micro-batch without PP; under PP gathered and reduced once
    ("torchtitan", 3, 1, (True, True, True, True)),
    ("torchtitan", 3, 2, (True, True, False, False)),
    # KempnerForge: reshards every micro-batch, gradient sync only on the last micro-step
    ("kempnerforge", 3, 1, (True, True, True, False)),
    # NeMo AutoModel: PP layers not resharded after forward, torch's PipelineStage defers the reduce-scatter
    ("nemo-automodel", 3, 2, (True, True, False, False)),
    # without PP: defer_fsdp_grad_sync (its default True) reduces on the last micro-batch only (get_sync_ctx)
    ("nemo-automodel", 3, 1, (True, True, True, False)),
])
def test_schedule_follows_the_framework(framework, zero, pp, expected):
    job, plan = _job(model="llama-3.1-8b", framework=framework, num_gpus=16, pp=pp, zero_stage=zero)
    sched = sharding_schedule(job, plan)
    assert (sched.params_sharded, sched.grads_sharded, sched.gather_each_microbatch,
            sched.reduce_each_microbatch) == expected


# --------------------------------------------------------------------------- the step


def test_zero3_is_no_longer_free():
    fields = dict(model="llama-3-70b", num_gpus=32, tp=4, pp=4, vpp=5)
    zero1 = estimate_throughput(*_job(**fields, zero_stage=1))
    zero3 = estimate_throughput(*_job(**fields, zero_stage=3))
    assert zero3.breakdown.dp_comm_s > zero1.breakdown.dp_comm_s
    assert zero3.step_time_s > zero1.step_time_s


def test_per_microbatch_traffic_scales_with_the_micro_batches_and_per_step_traffic_does_not(monkeypatch):
    base = dict(model="llama-3.1-8b", num_gpus=64, pp=2, micro_batch_size=1, seq_length=4096)
    # Megatron-FSDP: all of it per micro-batch (no once-per-step part), so twice the micro-batches, twice the time
    one = estimate_throughput(*_job(**base, framework="megatron-core", zero_stage=3, global_batch_size=256))
    two = estimate_throughput(*_job(**base, framework="megatron-core", zero_stage=3, global_batch_size=512))
    assert one.breakdown.dp_comm_s > 0
    assert two.breakdown.dp_comm_s == pytest.approx(2 * one.breakdown.dp_comm_s)
    # torchtitan under PP: gathered once, reduced once, whatever the micro-batch count
    one = estimate_throughput(*_job(**base, framework="torchtitan", global_batch_size=256))
    two = estimate_throughput(*_job(**base, framework="torchtitan", global_batch_size=512))
    assert one.breakdown.dp_comm_s > 0
    assert two.breakdown.dp_comm_s == pytest.approx(one.breakdown.dp_comm_s)
    # the card's fact (grad_accumulation.gathered_through_forward) is what decides it: re-gathering every
    # micro-batch costs more
    job, plan = _job(**base, framework="torchtitan", global_batch_size=256)
    monkeypatch.setattr("meshplan.estimate.sharding_traffic.keeps_gathered", lambda card, pp: False)
    regather = estimate_throughput(job, plan)
    assert regather.breakdown.dp_comm_s > one.breakdown.dp_comm_s


def test_more_compute_per_layer_hides_more_of_the_same_traffic():
    """Across nodes the per-layer gathers outlast a small micro-batch's compute; a larger one hides them."""
    exposed = []
    for mbs in (1, 2, 4):
        job, plan = _job(model="llama-3.1-70b", framework="megatron-core", num_gpus=128, zero_stage=3,
                         micro_batch_size=mbs, global_batch_size=512, seq_length=2048)
        exposed.append(estimate_throughput(job, plan).breakdown.dp_comm_s)
    assert exposed[0] > exposed[1] > exposed[2]


def test_the_assumption_names_the_schedule():
    report = estimate_throughput(*_job(model="llama-3.1-8b", framework="torchtitan", num_gpus=16, pp=2))
    line = next(a for a in report.assumptions if a.startswith("DP"))
    assert "once per step" in line and "last micro-batch only" in line


# --------------------------------------------------------------------------- the bytes each element moves


def test_gradients_move_in_the_dtype_the_plan_reduces_them_in():
    """grad_reduce_in_fp32=False halves the gradient traffic (Megatron-Core grad_reduce_in_fp32, Megatron-FSDP
    megatron_fsdp_grad_comm_dtype bf16); left out, the framework's default (4 bytes for Megatron-Core)."""
    from meshplan.estimate.sharding_traffic import grad_reduce_bytes

    base = dict(model="llama-3-8b", gpu="h100", num_gpus=64, framework="megatron-core", tp=1, pp=1, zero_stage=3,
                seq_length=4096, micro_batch_size=1, global_batch_size=256)
    times = {}
    for fp32 in (None, True, False):
        job, plan = _job(**base, grad_reduce_in_fp32=fp32)
        times[fp32] = estimate_throughput(job, plan).breakdown.dp_comm_s
        assert grad_reduce_bytes(plan, calibration("megatron-core")) == {None: 4, True: 4, False: 2}[fp32]
    assert times[None] == pytest.approx(times[True]) and times[False] < times[True]


def test_fp8_weights_are_gathered_in_one_byte():
    from meshplan.estimate.sharding_traffic import param_gather_bytes

    job, plan = _job(model="llama-3-8b", gpu="h100", num_gpus=64, framework="megatron-core", zero_stage=3,
                     precision="fp8", fp8_param_gather=True, seq_length=4096, global_batch_size=256)
    assert param_gather_bytes(job, plan) == 1.0
    job, plan = _job(model="llama-3-8b", gpu="h100", num_gpus=64, framework="megatron-core", zero_stage=3,
                     precision="fp8", seq_length=4096, global_batch_size=256)
    assert param_gather_bytes(job, plan) == 2.0


@pytest.mark.parametrize(("fields", "fp8"), [
    (dict(framework="megatron-bridge", fp8_recipe="tensorwise"), True),  # its preset keeps fp8 weights
    (dict(framework="megatron-bridge", fp8_recipe="delayed"), True),
    (dict(framework="megatron-bridge", fp8_recipe="blockwise"), False),  # its preset does not
    (dict(framework="megatron-bridge", fp8_recipe="tensorwise", fp8_param_gather=False), False),
    (dict(framework="megatron-core", fp8_recipe="tensorwise"), False),  # Megatron-Core's default: off
    (dict(framework="megatron-core", fp8_recipe="tensorwise", fp8_param_gather=True), True),
    (dict(framework="torchtitan", fp8_recipe="tensorwise"), False),  # enable_fsdp_float8_all_gather: off
    (dict(framework="torchtitan", fp8_recipe="tensorwise", fp8_param_gather=True), True),
    (dict(framework="megatron-bridge", precision="bf16"), False),
])
def test_the_fsdp_units_and_the_distributed_optimizer_gather_fp8_weights_alike(fields, fp8):
    """One predicate (memory_states.fp8_param_gather: the plan's, else the framework's default for the recipe) for the
    FSDP units' all-gather (param_gather_bytes) and the distributed optimizer's (optimizer_gather_bytes): a Megatron-
    Bridge run leaving fp8_param_gather out gathers its units in one byte wherever its preset keeps fp8 weights (the
    units read only the plan's field before, two bytes where the optimizer's gather took one)."""
    from meshplan.estimate.sharding_traffic import optimizer_gather_bytes, param_gather_bytes

    base = dict(model="llama-3-8b", gpu="h100", num_gpus=64, precision="fp8", seq_length=4096,
                global_batch_size=256) | fields
    units = _job(**base, zero_stage=3)
    optimizer = _job(**base, zero_stage=1 if fields["framework"] != "torchtitan" else 3)
    assert param_gather_bytes(*units) == (1.0 if fp8 else 2.0)
    assert optimizer_gather_bytes(*optimizer, 1000.0, 0.0, 0.0) == ((1000.0 if fp8 else 2000.0), 0.0)


def test_a_root_unit_gathers_embedding_and_head_first_in_both_passes_and_reduces_them_last():
    """KempnerForge's root unit (embedding, final norm and head: the convention's embedding_in_root): gathered whole
    before the embedding, again whole at the head's backward, reduce-scattered whole after every block."""
    embed, head, layers = 5.0, 1.0, ShardUnit(2, gather=2.0, reduce=2.0, fwd=3.0, bwd=6.0)
    root = [ShardUnit(1, gather=embed + head, reduce=2 * (embed + head), fwd=0.0, bwd=0.0, resharded=False),
            layers, ShardUnit(1, gather=embed + head, reduce=0.0, fwd=0.1, bwd=0.2, gathers_fwd=False)]
    # forward: the root whole (6), then the layers (2 - 0 and 2 - 3 -> 0); the head gathers nothing
    assert exposed_sharding(root, True, False, False) == pytest.approx(6.0 + 2.0)
    # backward: the root whole first (6); the head's backward hides the last layer's gather (2 - 0.2 = 1.8); the
    # layers hide theirs and nothing of the root's; the embedding's backward (no window) leaves the first layer's
    # reduce-scatter (2); the root's reduce-scatter, embedding and head together, ends the pass (12)
    assert exposed_sharding(root, False, True, True) == pytest.approx(6.0 + 1.8 + 2.0 + 12.0)
    # apart (torchtitan's units): the head's gather and reduce-scatter hide behind the layers
    apart = [ShardUnit(1, gather=embed, reduce=2 * embed, fwd=0.0, bwd=0.0), layers,
             ShardUnit(1, gather=head, reduce=2 * head, fwd=0.1, bwd=0.2)]
    assert exposed_sharding(apart, True, True, True) < exposed_sharding(root, True, True, True)
    # on the compute stream (in line), the same transfers: the root once each way, its reduce once
    assert in_line_sharding(root, True, True, True) == pytest.approx(6.0 + 2 * (2 * 2.0 + 2.0) + 12.0 + 6.0)


def test_edge_units_with_a_root_move_the_embedding_and_the_head_as_one_unit():
    """edge_units' root form: the embedding's place carries the whole root's forward gather and its reduce-scatter
    (not gathered again there), the head's place the whole root's backward gather and nothing in the forward."""
    from types import SimpleNamespace

    from meshplan.arithmetic.comm import job_links
    from meshplan.arithmetic.mesh import Group
    from meshplan.estimate.sharding_traffic import DpTraffic, edge_units

    job, plan = _job(model="llama-3-8b", framework="kempnerforge", num_gpus=32, gpus_per_node=4, gpu="h200", tp=4)
    cal = calibration(job.framework)
    traffic = DpTraffic(plan, job_links(job, cal), Group(8, 4), Group(8, 4))
    parts = SimpleNamespace(embedding=525e6, head=131e6, norm=4096)
    embed, head = edge_units(job.model, plan, parts, 0.03, traffic, 4.0, None, True, root=True)
    whole = 525e6 + 131e6 + 4096
    assert embed.gather == head.gather == pytest.approx(traffic(whole, 0.0, 2.0))
    assert embed.reduce == pytest.approx(traffic.reduce(whole, 0.0, 4.0)) and head.reduce == 0.0
    assert (embed.gathers_fwd, embed.resharded, head.gathers_fwd, head.resharded) == (True, False, False, True)
    apart_embed, apart_head = edge_units(job.model, plan, parts, 0.03, traffic, 4.0, None, True)
    assert apart_embed.gather + apart_head.gather == pytest.approx(embed.gather, rel=1e-2)
    assert apart_head.gathers_fwd and apart_embed.resharded


def test_fsdp2_at_zero_stage_2_keeps_each_unit_gathered_into_its_backward():
    """FSDP2's reshard_after_forward=False (the plan's zero_stage 2, NeMo AutoModel's distributed.reshard_after_forward
    false): gathered every micro-batch's forward, not again in its backward; zero_stage 3 gathers both ways."""
    fields = dict(model="llama-3.1-8b", framework="nemo-automodel", num_gpus=16)
    kept = sharding_schedule(*_job(**fields, zero_stage=2))
    freed = sharding_schedule(*_job(**fields, zero_stage=3))
    assert kept.gather_each_microbatch and not kept.regathered
    assert freed.gather_each_microbatch and freed.regathered
    layers = [ShardUnit(count=3, gather=2.0, reduce=3.0, fwd=1.0, bwd=4.0)]
    # the forward's gathers alike (4, test above), the backward's (2 first, then hidden) left out
    assert exposed_by_schedule(layers, kept).micro == pytest.approx(exposed_sharding(layers, True, False, False))
    assert exposed_by_schedule(layers, freed).micro == pytest.approx(exposed_sharding(layers, True, True, False))
    assert exposed_by_schedule(layers, kept).micro < exposed_by_schedule(layers, freed).micro
