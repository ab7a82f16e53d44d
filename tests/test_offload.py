"""CPU offload: what each framework's knob moves, the GPU and host bytes it changes, and its time."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.offload import offload_card, offload_plan, offload_time
from meshplan.core.errors import MeshplanError
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

GIB = 1 << 30


def memory(**fields):
    return api.estimate_memory(parse_request(fields))


def both(**fields):
    """The estimate without and with the given offload fields (the rest the same)."""
    offload = {k: fields.pop(k) for k in list(fields) if "offload" in k}
    return memory(**fields), memory(**fields, **offload)


def test_megatron_cpu_optimizer_moves_its_share_and_keeps_16_bytes_per_parameter_on_the_host():
    base, off = both(model="llama-3.1-8b", num_gpus=8, tp=2, optimizer_offload_fraction=0.5)
    b, o = base.stages[0], off.stages[0]
    assert o.weights_bytes == b.weights_bytes and o.gradients_bytes == b.gradients_bytes
    assert o.optimizer_bytes == pytest.approx(b.optimizer_bytes / 2, abs=1)
    shard = o.detail["optimizer_params"]  # this GPU's shard of the distributed optimizer: params / (tp * dp)
    assert shard == pytest.approx(o.detail["params_on_gpu"] / 4, rel=1e-9)
    assert o.host_bytes == int(16 * shard * 0.5) == o.detail["host_cpu_optimizer"]
    assert off.host_bytes_per_node == o.host_bytes * 8
    assert off.peak_bytes < base.peak_bytes


def test_fsdp2_cpu_offload_moves_every_state_and_counts_the_shard_once_on_the_host():
    base, off = both(model="llama-3.1-8b", framework="torchtitan", num_gpus=8, param_offload=True)
    b, o = base.stages[0], off.stages[0]
    assert o.weights_bytes == o.gradients_bytes == o.optimizer_bytes == 0
    # fp32 shard 4 + fp32 grads 4 + Adam moments 8: the CPU optimizer's own 16 bytes, not 16 + the moved classes
    assert o.host_bytes == int(16 * o.detail["optimizer_params"])
    assert o.host_bytes == pytest.approx(b.weights_bytes + b.gradients_bytes + b.optimizer_bytes, rel=1e-6)
    assert o.detail["gathered_layers"] == b.detail["gathered_layers"]  # the units are still gathered on the GPU


def test_deepspeed_offloads_params_apart_from_the_optimizer():
    base, off = both(model="llama-3.1-8b", framework="deepspeed", num_gpus=8, zero_stage=3, param_offload=True,
                     optimizer_offload=True)
    b, o = base.stages[0], off.stages[0]
    assert o.weights_bytes == o.gradients_bytes == o.optimizer_bytes == 0
    shard = o.detail["optimizer_params"]
    assert o.detail["host_cpu_optimizer"] == int(16 * shard)
    assert o.detail["host_weights"] == b.weights_bytes  # the 16-bit partition, beside the CPU Adam's fp32 copy
    assert o.host_bytes == pytest.approx(16 * shard + b.weights_bytes, abs=2)


def test_verl_phase_offloads_leave_the_update_peak_alone_and_need_host_memory():
    dsv3 = dict(model="deepseek-v3", gpu="h20", framework="verl", num_gpus=96, tp=8, pp=12, ep=8, etp=1,
                last_stage_layers=6, recompute="full", seq_length=3072, global_batch_size=96)
    base = memory(**dsv3)
    phase = memory(**dsv3, param_offload=True, optimizer_offload=True)
    assert phase.peak_bytes == base.peak_bytes
    last = phase.stages[-1]
    # param_offload copies the parameter buffer to the host and releases the gradient buffer, no host copy (verl
    # megatron_utils.offload_megatron_model_to_cpu)
    assert last.gradients_bytes > 0
    assert last.host_bytes == last.weights_bytes + last.optimizer_bytes
    assert "between RL phases only" in " ".join(phase.assumptions)
    assert "released between RL phases, no host copy: gradients" in " ".join(phase.assumptions)


def test_deepseek_v3_on_96_h20_as_verl_ran_it():
    """verl docs/perf/dpsk.md: TP8 PP12 EP8, last stage 6 layers, full recompute, param/grad offload and the whole
    optimizer on the CPU: 66 GB per GPU and ~1.5 TB of host memory per node (issue 16's bar: 20% and 30%)."""
    report = memory(model="deepseek-v3", gpu="h20", framework="verl", num_gpus=96, tp=8, pp=12, ep=8, etp=1,
                    last_stage_layers=6, recompute="full", seq_length=3072, global_batch_size=96,
                    param_offload=True, optimizer_offload_fraction=1.0)
    assert report.fits
    assert report.peak_bytes == pytest.approx(66e9, rel=0.20)
    assert report.host_bytes_per_node == pytest.approx(1.5e12, rel=0.30)
    assert report.stages[-1].optimizer_bytes == 0


def test_activation_offload_keeps_the_layers_in_flight():
    base, off = both(model="llama-3.1-8b", num_gpus=8, tp=2, seq_length=8192, activation_offload=True)
    b, o = base.stages[0], off.stages[0]
    layer = b.detail["layer_activations"] / 32  # one micro-batch in flight, 32 equal layers
    resident = offload_card().activation_offload_resident_layers * layer
    assert o.detail["host_activations"] == pytest.approx(b.detail["layer_activations"] - resident, rel=1e-6)
    assert b.activations_bytes - o.activations_bytes == pytest.approx(o.detail["host_activations"], abs=2)


def test_cpu_adam_time_is_charged_per_offloaded_parameter():
    job, plan = resolve(parse_request(dict(model="llama-3.1-8b", num_gpus=8, tp=2, optimizer_offload_fraction=0.5)))
    seconds, how = offload_time(job, plan, optimizer_params=1e9, host_activation_bytes=0.0, param_bytes_moved=0.0,
                                compute_s=1.0)
    assert seconds == pytest.approx(offload_card().cpu_adam_s_per_param * 1e9 * 0.5)
    assert "CPU Adam" in how


def test_activation_transfers_cost_only_what_the_compute_cannot_hide():
    job, plan = resolve(parse_request(dict(model="llama-3.1-8b", num_gpus=8, tp=2, activation_offload=True,
                                           global_batch_size=4)))
    m = plan.num_microbatches(job.global_batch_size)
    moved = 2 * 10e9 * m
    seconds, _ = offload_time(job, plan, optimizer_params=0, host_activation_bytes=10e9, param_bytes_moved=0,
                              compute_s=0.1)
    assert seconds == pytest.approx(moved / job.gpu.host_bandwidth - 0.1)
    hidden, _ = offload_time(job, plan, optimizer_params=0, host_activation_bytes=10e9, param_bytes_moved=0,
                             compute_s=100.0)
    assert hidden == 0


def test_phase_offload_has_no_step_time():
    job, plan = resolve(parse_request(dict(model="qwen3-30b-a3b", framework="verl", num_gpus=16, ep=8,
                                           param_offload=True, optimizer_offload=True)))
    off = offload_plan(job.card, plan)
    assert off.phase == {"weights", "gradients", "optimizer"} and off.cpu_optimizer == 0  # 0.9.1: grads go with params
    assert offload_time(job, plan, optimizer_params=1e9, host_activation_bytes=0, param_bytes_moved=0,
                        compute_s=1.0)[0] == 0


def test_a_fraction_turns_the_optimizer_offload_on_and_a_contradiction_is_an_error():
    job, plan = resolve(parse_request(dict(model="llama-3.1-8b", num_gpus=8, optimizer_offload_fraction=0.25)))
    assert plan.optimizer_offload and plan.optimizer_offload_fraction == 0.25
    assert any("optimizer_offload not given" in n for n in job.notes)
    with pytest.raises(MeshplanError, match="contradicts"):
        resolve(parse_request(dict(model="llama-3.1-8b", num_gpus=8, optimizer_offload=False,
                                   optimizer_offload_fraction=0.25)))
    with pytest.raises(MeshplanError, match="optimizer_offload_fraction"):
        parse_request(dict(model="llama-3.1-8b", optimizer_offload_fraction=1.5))


def test_an_offload_the_engine_lacks_is_refused_not_ignored():
    from meshplan.rules.engine import EstimateBlocked

    with pytest.raises(EstimateBlocked, match="OF001"):
        memory(model="llama-3.1-8b", framework="kempnerforge", num_gpus=8, param_offload=True)
    with pytest.raises(EstimateBlocked, match="OF001") as info:
        memory(model="llama-3.1-8b", num_gpus=8, param_offload=True)  # Megatron-Core: no parameter offload
    assert "optimizer_offload" in info.value.fix


def test_a_phase_offload_on_a_skyrl_training_job_is_refused_by_check_recommend_and_render_alike():
    """optimizer_offload=true on a SkyRL SFT job: recommend ranked layouts with it and check passed it, but render
    refused it, since SkyRL's SFT trainer (main_sft, the training job's entry point) sets colocate_all false and
    never offloads its policy between phases (the card's offload phase_offloads_when: rl). Rule OF001 now refuses
    it on such a job, in all three, naming the in-step knob instead; an RL job keeps it."""
    sft = dict(model="llama-3.1-8b", framework="skyrl", job="sft", num_gpus=8, optimizer_offload=True)
    for fields in (dict(tp=2), dict(zero_stage=3)):  # SkyRL's megatron and FSDP strategies
        found = {f.id: f for f in api.check_config(parse_request({**sft, **fields})).findings}
        assert found["OF001"].severity == "error" and "RL" in found["OF001"].message, found
        assert "optimizer_offload=false" in found["OF001"].fix
    assert "optimizer_offload_fraction" in api.check_config(parse_request({**sft, "tp": 2})).findings[0].fix
    assert "param_offload" in next(f.fix for f in api.check_config(parse_request({**sft, "zero_stage": 3})).findings
                                   if f.id == "OF001")  # the FSDP strategy's in-step offload (variant sft-fsdp)
    with pytest.raises(MeshplanError, match="No layout can pass rule OF001") as refused:
        api.recommend(parse_request(sft), top_k=1)
    assert "optimizer_offload=false" in refused.value.fix
    assert "does not have. No layout can pass" in str(refused.value)  # the finding's message is a sentence of its own
    with pytest.raises(MeshplanError, match="OF001"):
        api.render_config("skyrl", parse_request({**sft, "tp": 2}))
    rl = api.check_config(parse_request(dict(model="llama-3.1-8b", framework="skyrl", job="rl", num_gpus=8, tp=2,
                                             optimizer_offload=True)))
    assert "OF001" not in {f.id for f in rl.findings}


def test_host_memory_short_names_a_share_that_fits():
    report = api.check_config(parse_request(dict(
        model="deepseek-v3", gpu="h20", framework="verl", num_gpus=96, tp=8, pp=12, ep=8, etp=1,
        last_stage_layers=6, recompute="full", seq_length=3072, global_batch_size=96, param_offload=True,
        optimizer_offload_fraction=1.0, cpu_memory_per_node=1100)))
    mem3 = next(f for f in report.findings if f.id == "MEM003")
    share = float(mem3.fix.split("optimizer_offload_fraction=")[1].split()[0])
    fixed = memory(model="deepseek-v3", gpu="h20", framework="verl", num_gpus=96, tp=8, pp=12, ep=8, etp=1,
                   last_stage_layers=6, recompute="full", seq_length=3072, global_batch_size=96, param_offload=True,
                   optimizer_offload_fraction=share, cpu_memory_per_node=1100)
    assert 0 < share < 1 and fixed.host_bytes_per_node <= 1100 * GIB


def test_the_step_time_carries_the_offload_term():
    fields = dict(model="qwen3-30b-a3b", num_gpus=8, tp=2, pp=2, ep=4, etp=1, global_batch_size=8, micro_batch_size=1)
    base = api.estimate_throughput(parse_request(fields))
    off = api.estimate_throughput(parse_request(dict(fields, optimizer_offload_fraction=0.5)))
    shard = api.estimate_memory(parse_request(dict(fields, optimizer_offload_fraction=0.5)))
    params = max(s.detail["optimizer_params"] for s in shard.stages if s.host_bytes == max(
        t.host_bytes for t in shard.stages))
    assert off.breakdown.offload_s == pytest.approx(offload_card().cpu_adam_s_per_param * params * 0.5)
    assert off.step_time_s == pytest.approx(base.step_time_s + off.breakdown.offload_s)
    assert any("CPU Adam" in a for a in off.assumptions) and base.breakdown.offload_s == 0


@pytest.mark.parametrize("framework", ["skyrl", "verl"])
def test_a_phase_optimizer_offload_off_beside_an_in_step_share_is_no_contradiction(framework):
    """On verl's and SkyRL's Megatron engines optimizer_offload moves the optimizer between an RL step's phases and
    optimizer_offload_fraction is Megatron-Core's in-step CPU optimizer: two knobs (offload_after_step / megatron
    optimizer_offload, and optimizer_config_kwargs). optimizer_offload=false with a share was refused as a
    contradiction, and MEM001's 'optimizer_offload_fraction=1.0' with it, applied to a SkyRL request that turned
    offload_after_step off; on Megatron-Core, one knob, it still is."""
    fields = dict(model="llama-3.1-8b", gpu="h100", num_gpus=8, job="rl", optimizer_offload=False,
                  optimizer_offload_fraction=1.0)
    _, plan = resolve(Request(framework=framework, **fields))
    assert not plan.optimizer_offload and plan.optimizer_offload_fraction == 1.0
    with pytest.raises(MeshplanError, match="contradicts"):
        resolve(Request(framework="megatron-core", **{k: v for k, v in fields.items() if k != "job"}))


def test_megatron_cores_cpu_optimizer_steps_the_ranks_shard_so_it_shrinks_with_the_data_parallel_degree():
    """The verl rows' CPU optimizer (Megatron-Core's HybridDeviceOptimizer at optimizer_offload_fraction 1.0) steps
    the distributed optimizer's shard, not the rank's replicated parameters (core_v0.12.2 / core_v0.13.0
    distrib_optimizer.py rebuilds it over its opt_group_ranges): at TP1 PP1 EP8 the dense parameters over dp = N and
    the experts over edp = N / 8, total / N each, so its seconds halve as the GPUs double, as the compute does."""
    from meshplan.estimate.memory import step_offload_time
    from meshplan.knowledge.model_counts import total_params

    qwen = dict(model="qwen3-30b-a3b", gpu="h20", framework="verl", tp=1, pp=1, ep=8, etp=1, job="rl",
                algorithm="dapo", prompts_per_step=512, prompts_per_mini_batch=128, samples_per_prompt=16,
                prompt_length=2048, response_length=8192, rollout_tp=4, param_offload=True, optimizer_offload=True,
                optimizer_offload_fraction=1.0)
    for n in (8, 16, 32):
        job, plan = resolve(parse_request({**qwen, "num_gpus": n}))
        seconds, how = step_offload_time(job, plan, compute_s=0.0)
        assert seconds == pytest.approx(offload_card().cpu_adam_s_per_param * total_params(job.model) / n, rel=1e-9)
        assert "CPU Adam" in how


def test_verl_moves_the_actors_offloaded_weights_around_each_phase_that_runs_them():
    """verl's param_offload loads the actor's weights back and offloads them again for the weight sync, the old
    policy's log-prob pass and the update (its card's rl.step_phases, phase_offload around: 3); a rollout placed apart
    syncs without a load (2); the optimizer states move once, the reference's weights once (a round trip, its
    Megatron param_offload)."""
    from meshplan.rl.memory import phase_setting, reference_bytes, state_loads
    from meshplan.rl.step_time import rl_step_time

    run = dict(model="qwen2.5-7b", gpu="h20", framework="verl", tp=2, pp=2, job="rl", algorithm="grpo",
               prompts_per_step=48, prompts_per_mini_batch=24, samples_per_prompt=4, prompt_length=1024,
               response_length=2048, rollout_tp=2, micro_batch_size=1)
    for placement, fields, loads in (("colocated", {"num_gpus": 16}, 3),
                                     ("separate", {"num_gpus": 16, "placement": "separate", "rollout_gpus": 4}, 2)):
        job, plan = resolve(parse_request({**run, **fields, "param_offload": True, "optimizer_offload": True}))
        assert state_loads(job, plan)["actor"] == (loads, 1), placement
        assert state_loads(job, plan)["reference"] == (1, 0), placement
        timing, _, _, memory = rl_step_time(job, plan)
        stage = max(memory.stages, key=lambda s: s.total_bytes)
        moved = loads * stage.weights_bytes + stage.optimizer_bytes + reference_bytes(phase_setting(job, plan), stage)
        assert timing.offload_s == pytest.approx(2 * moved / job.gpu.host_bandwidth, rel=1e-9), placement


def _skyrl(algorithm: str, placement: str, **fields):
    base = dict(model="qwen2.5-7b", gpu="h20", framework="skyrl", job="rl", algorithm=algorithm, num_gpus=16,
                prompts_per_step=48, prompts_per_mini_batch=24, samples_per_prompt=4, prompt_length=1024,
                response_length=2048, rollout_tp=2, micro_batch_size=1, zero_stage=3, tp=1, pp=1)
    if placement == "separate":
        base |= {"placement": "separate", "rollout_gpus": 4}
    return resolve(parse_request({**base, **fields}))


def test_skyrl_swaps_each_model_in_once_per_run_of_its_phases():
    """SkyRL's WorkerDispatch loads a model's states when a phase needs them and leaves them until another model of
    the colocation group runs (rl.phase_offload swap). Colocated (colocate_all, the engine in the group): GRPO's policy
    loads once (its log-prob pass, update and sync run back to back) and its reference once; PPO's critic update
    between the policy's log-prob pass and its update loads the policy's weights twice, the critic's twice (values,
    update), each optimizer once. Placed apart (colocate_policy_ref): the policy and the reference swap once each,
    the critic on its own GPUs is never moved; with no reference (DAPO) the policy swaps with nothing, so no state of
    it leaves the GPU and the step moves none."""
    from meshplan.rl.memory import phase_setting, state_loads
    from meshplan.rl.step_time import rl_step_time

    expected = {("grpo", "colocated"): {"actor": (1, 1), "reference": (1, 0), "critic": (0, 0)},
                ("ppo", "colocated"): {"actor": (2, 1), "reference": (1, 0), "critic": (2, 1)},
                ("dapo", "colocated"): {"actor": (1, 1), "reference": (0, 0), "critic": (0, 0)},
                ("grpo", "separate"): {"actor": (1, 1), "reference": (1, 0), "critic": (0, 0)},
                ("ppo", "separate"): {"actor": (1, 1), "reference": (1, 0), "critic": (0, 0)},
                ("dapo", "separate"): {"actor": (0, 0), "reference": (0, 0), "critic": (0, 0)}}
    for (algorithm, placement), loads in expected.items():
        job, plan = _skyrl(algorithm, placement)
        assert {m: tuple(n) for m, n in state_loads(job, plan).items()} == loads, (algorithm, placement)
    job, plan = _skyrl("dapo", "separate", optimizer_offload=True)
    setting = phase_setting(job, plan)
    assert not setting.phase_classes and not setting.auto
    timing, _, _, memory = rl_step_time(job, plan)
    assert timing.offload_s == 0.0
    s = memory.stages[0]  # the log-prob passes keep the policy's weights and optimizer (its gradients freed)
    log_prob = next(p for p in memory.phases if p.phase == "log_prob")
    assert log_prob.detail["resident"] == int(s.weights_bytes + s.optimizer_bytes)
    assert s.detail["host_between_phases"] > 0 and memory.host_bytes_per_node == 0  # the knob's host never filled


def test_ppos_critic_beside_the_actor_moves_as_its_loads_say():
    """The phase offloads' time counts PPO's critic beside the actor, a copy of the actor's states at its own loads
    (SkyRL colocated: weights twice, optimizer once), and the reference's weights at its one load: the offload is
    2 x (actor + critic + reference bytes moved) over the host link."""
    from meshplan.rl.memory import phase_setting, reference_bytes
    from meshplan.rl.step_time import rl_step_time

    job, plan = _skyrl("ppo", "colocated")
    setting = phase_setting(job, plan)
    assert setting.critic_beside_actor and setting.ref_on_host and not setting.ref_per_unit
    timing, _, _, memory = rl_step_time(job, plan)
    s = max(memory.stages, key=lambda st: st.total_bytes)
    per_class = {"weights": s.weights_bytes, "optimizer": s.optimizer_bytes, "gradients": s.gradients_bytes}
    actor = sum(per_class[c] * (2 if c == "weights" else 1) for c in setting.phase_classes)
    moved = 2 * actor + reference_bytes(setting, s)  # the critic loads as the actor does here: (2, 1)
    assert timing.offload_s == pytest.approx(2 * moved / job.gpu.host_bandwidth, rel=1e-9)
    grpo, grpo_plan = _skyrl("grpo", "colocated")
    assert rl_step_time(grpo, grpo_plan)[0].offload_s < timing.offload_s


def test_verls_fsdp_reference_streams_its_weights_in_and_writes_none_back():
    """verl's FSDP reference sits on the host under FSDP CPU offload (reference_pass_weights per_unit): its pass copies
    each unit's shard to the GPU and frees it, no copy back, so its weights count once one way, not a round trip."""
    from meshplan.rl.memory import phase_setting, reference_bytes
    from meshplan.rl.step_time import phase_offload_bytes, rl_step_time

    job, plan = resolve(parse_request(dict(
        model="qwen2.5-7b", gpu="h20", framework="verl", job="rl", algorithm="grpo", num_gpus=16, zero_stage=3,
        prompts_per_step=48, prompts_per_mini_batch=24, samples_per_prompt=4, prompt_length=1024,
        response_length=2048, rollout_tp=2, micro_batch_size=1)))
    setting = phase_setting(job, plan)
    assert setting.ref_per_unit
    timing, _, _, memory = rl_step_time(job, plan)
    stage = max(memory.stages, key=lambda s: s.total_bytes)
    round_trip, one_way = phase_offload_bytes(setting, stage)
    assert one_way == pytest.approx(reference_bytes(setting, stage)) and one_way > 0
    assert timing.offload_s == pytest.approx((2 * round_trip + one_way) / job.gpu.host_bandwidth, rel=1e-9)
