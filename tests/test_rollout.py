"""RL jobs (meshplan/rl/): the request fields, their defaults from the framework cards, the engine's
memory."""

from __future__ import annotations

import pytest

from meshplan.core.errors import MeshplanError
from meshplan.knowledge.cards import rl_card
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.rl.engine import engine_weight_bytes, kv_bytes_per_token

GRPO = {"model": "qwen3-30b-a3b", "num_gpus": 16, "ep": 8, "job": "rl", "samples_per_prompt": 8,
        "prompts_per_step": 64}


def rl(framework: str = "verl", **fields):
    return resolve(parse_request({**GRPO, "framework": framework, **fields}))


def test_defaults_are_each_frameworks_own_and_noted():
    job, plan = rl("verl")
    assert (plan.rollout_engine, plan.rollout_tp, plan.rollout_dp, plan.rollout_ep) == ("vllm", 2, 1, 1)
    assert plan.rollout_memory_fraction == 0.5 and plan.placement == "colocated" and plan.rollout_gpus == 16
    assert (job.rl.prompt_length, job.rl.response_length, job.rl.algorithm) == (512, 512, "grpo")
    assert "rollout_memory_fraction not given: 0.5, the verl default." in job.notes
    job, plan = rl("skyrl")
    assert (plan.rollout_tp, plan.rollout_memory_fraction, job.rl.response_length) == (1, 0.8, 1024)
    job, _ = resolve(parse_request({"model": "qwen3-8b", "framework": "skyrl", "num_gpus": 8, "job": "rl"}))
    assert job.rl.samples_per_prompt == 5 and job.rl.prompts_per_step == 1024


def test_the_trainer_step_is_prompts_x_samples_of_prompt_plus_response():
    job, plan = rl(response_length=4096, prompt_length=1024)
    assert job.seq_length == 5120 and job.global_batch_size == 64 * 8 and plan.dp == 16
    job, _ = rl(prompts_per_step=None, global_batch_size=256)
    assert job.rl.prompts_per_step == 32
    job, _ = rl(seq_length=6144, response_length=4096)
    assert job.rl.prompt_length == 2048
    training, plan = resolve(parse_request({"model": "qwen3-30b-a3b", "num_gpus": 16, "ep": 8, "framework": "verl"}))
    assert training.rl is None and plan.rollout_tp is None


def test_separate_placement_takes_the_rollout_gpus_out_of_num_gpus():
    job, plan = rl(placement="separate", rollout_gpus=4, ep=4)
    assert job.num_gpus == 12 and plan.rollout_gpus == 4 and plan.dp == 12


@pytest.mark.parametrize("fields, words", [
    ({"framework": "megatron-core"}, "megatron-core runs no RL job"),
    ({"job": "sft"}, "not for job=sft"),
    ({"framework": "skyrl", "rollout_engine": "sglang"}, "skyrl runs no sglang rollout engine"),
    ({"placement": "separate"}, "placement separate needs rollout_gpus"),
    ({"placement": "separate", "rollout_gpus": 16}, "leaves no GPU"),
    ({"seq_length": 8192, "prompt_length": 512, "response_length": 512}, "is not prompt_length [+] response_length"),
    ({"global_batch_size": 100}, "is not prompts_per_step x samples_per_prompt"),
])
def test_bad_rl_requests_are_clear_errors(fields, words):
    base = {**GRPO, "framework": "verl", **fields}
    with pytest.raises(MeshplanError, match=words):
        resolve(parse_request(base))


def test_rl_fields_imply_an_rl_job():
    job, _ = resolve(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8, "rollout_tp": 4}))
    assert job.rl is not None and "job not given: rl, as rollout_tp is given." in job.notes
    job, _ = resolve(parse_request({"model": "qwen3-8b", "framework": "verl", "num_gpus": 8,
                                    "rollout_enforce_eager": True}))
    assert job.rl is not None and "job not given: rl, as rollout_enforce_eager is given." in job.notes


@pytest.mark.parametrize("job", [None, "sft"])
def test_a_plan_fed_back_as_a_request_stays_a_training_job(job):
    """A recommendation's plan passed back as a request (api, or MCP/CLI taking its fields) became an RL job and
    was refused ('megatron-core runs no RL job (job=rl, rollout_enforce_eager)'; with job=sft 'rollout_enforce_eager
    is an RL field'): a training plan carries rollout_enforce_eager=False, the frameworks' default, which asks for
    no RL. The plan's own answer comes back."""
    from meshplan import api
    from meshplan.schema.request import Request

    asked = {"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h100", **({"job": job} if job else {})}
    best = api.recommend(Request(**asked), top_k=1).candidates[0]
    fields = best.plan.model_dump(exclude_none=True)
    assert fields["rollout_enforce_eager"] is False
    report = api.check_config(Request(**asked, **fields))
    assert report.ok and report.plan == best.plan and report.memory.peak_bytes == best.memory.peak_bytes
    assert api.estimate_memory(Request(**asked, **fields)).peak_bytes == best.memory.peak_bytes


def test_engine_weights_and_kv_per_token_are_exact():
    job, plan = rl(rollout_tp=4)
    arch = job.model  # Qwen3-30B-A3B: 48 layers, 4 KV heads of 128
    assert kv_bytes_per_token(arch, 4) == 2 * 2 * 1 * 128 * 48  # K and V, one head per TP rank
    assert kv_bytes_per_token(arch, 8) == kv_bytes_per_token(arch, 4)  # heads replicated past 4
    assert kv_bytes_per_token(arch, 2) == 2 * 2 * 2 * 128 * 48
    dsv3 = resolve(parse_request({"model": "deepseek-v3", "framework": "verl", "num_gpus": 8, "job": "rl"}))[0].model
    assert kv_bytes_per_token(dsv3, 8) == 2 * (512 + 64) * 61  # MLA latent + rope key, whole on every rank
    ep = plan.model_copy(update={"rollout_tp": 2, "rollout_dp": 4, "rollout_ep": 8})
    no_ep = plan.model_copy(update={"rollout_tp": 2, "rollout_dp": 4, "rollout_ep": 1})
    assert engine_weight_bytes(arch, ep) < engine_weight_bytes(arch, no_ep)  # experts over 8 ranks, not 2


def test_cards_state_each_engines_memory_fraction():
    assert rl_card("verl").engines["vllm"].memory_fraction_of == "total"
    assert rl_card("verl").engines["sglang"].memory_fraction_of == "free"
    assert set(rl_card("skyrl").engines) == {"vllm"}
    assert rl_card("megatron-core") is None


# --------------------------------------------------------------------------- memory per phase, time per step

GIB = 1 << 30
DAPO = {**GRPO, "framework": "verl", "algorithm": "dapo", "response_length": 4096, "recompute": "full"}


def phases(report):
    return {p.phase: p for p in report.phases}


def test_phase_offloads_free_the_rollout_not_the_update():
    from meshplan.rl.memory import rl_memory

    job, plan = resolve(parse_request(DAPO))
    on = plan.model_copy(update={"param_offload": True, "optimizer_offload": True})
    before, after = phases(rl_memory(job, plan)), phases(rl_memory(job, on))
    assert after["actor_update"].peak_bytes == before["actor_update"].peak_bytes  # back on the GPU for the update
    resident = before["rollout"].detail["trainer_resident"]
    assert resident > 0 and after["rollout"].detail["trainer_resident"] == 0
    # the engine's vLLM budget is a share of total memory, so the rollout falls by exactly the trainer's states
    assert before["rollout"].peak_bytes - after["rollout"].peak_bytes == pytest.approx(resident, abs=2)


def test_peak_is_the_largest_phase_and_names_it():
    from meshplan.rl.memory import rl_memory

    job, plan = resolve(parse_request({**DAPO, "algorithm": "ppo"}))
    report = rl_memory(job, plan)
    assert {p.phase for p in report.phases} == {"rollout", "log_prob", "actor_update", "critic_update"}
    top = max(report.phases, key=lambda p: p.peak_bytes)
    assert report.peak_bytes == top.peak_bytes and report.peak_phase == top.phase
    assert report.fit_bytes == max(p.fit_bytes for p in report.phases)
    assert report.fits == (report.fit_bytes <= job.gpu.memory_bytes)
    assert report.limited_by == (None if report.fits else "gpu")


def test_with_expandable_segments_the_training_phases_fit_on_their_allocated_peak():
    """verl launches with expandable segments (its card's allocator section): the log-prob and update phases are decided
    by their peak less the allocator reserve, plus the page slack (memory.fit_figure); the rollout engine's pool and
    every phase without the setting by the peak itself."""
    from meshplan.arithmetic.memory_states import memory_card
    from meshplan.rl.memory import rl_memory, trainer_reports

    slack = memory_card().expandable_segments_slack_bytes
    job, plan = resolve(parse_request(DAPO))
    on = plan.model_copy(update={"expandable_segments": True})
    off = plan.model_copy(update={"expandable_segments": False})
    update = trainer_reports(job, on)[0]
    with_it, without = phases(rl_memory(job, on)), phases(rl_memory(job, off))
    stage = with_it["actor_update"].stage
    reserve = update.stages[stage].detail["allocator_reserve"]
    assert reserve > 0
    assert with_it["actor_update"].fit_bytes == with_it["actor_update"].peak_bytes - reserve + slack
    assert with_it["rollout"].fit_bytes == with_it["rollout"].peak_bytes
    assert all(p.fit_bytes == p.peak_bytes for p in without.values())
    assert rl_memory(job, off).fit_basis == "reserved"


def test_vllm_budget_is_a_share_of_total_and_sglang_of_free_memory():
    from meshplan.rl.engine import engine_memory, kv_bytes_per_token

    job, plan = rl(response_length=4096, rollout_tp=4)
    capacity = job.gpu.memory_bytes
    vllm = engine_memory(job, plan, free_bytes=40 * GIB)
    assert vllm.budget_bytes == 0.5 * capacity
    assert vllm.kv_bytes == vllm.budget_bytes - vllm.weights_bytes - vllm.working_bytes
    per_rank = int(vllm.kv_bytes // (kv_bytes_per_token(job.model, 4) * (512 + 4096)))
    assert vllm.sequences_at_once == min(per_rank, 256)
    sglang = engine_memory(job, plan.model_copy(update={"rollout_engine": "sglang"}), free_bytes=40 * GIB)
    assert sglang.budget_bytes == 0.5 * 40 * GIB
    assert sglang.gpu_bytes == sglang.budget_bytes + sglang.cuda_graph_bytes + sglang.working_bytes


@pytest.mark.parametrize("placement", [{}, {"placement": "separate", "rollout_gpus": 8}])
def test_the_rollout_phase_carries_its_engine_typed_and_reports_its_bytes_only(placement):
    """RL006 reads the engine's budget from the rollout phase's typed record (PhaseMemory.engine), never undoing the
    reported detail's bytes by hand; the record stays out of the report (its bytes are detail's)."""
    import json

    from meshplan.rl.engine import engine_memory
    from meshplan.rl.memory import rl_memory

    job, plan = rl("verl", rollout_engine="sglang", **placement)  # a fraction of the free memory, activations outside
    rollout = phases(rl_memory(job, plan))["rollout"]
    engine = rollout.engine
    assert engine is not None and rollout.detail["engine"] == int(engine.gpu_bytes)
    assert rollout.detail["sequences_at_once"] == engine.sequences_at_once
    assert engine.gpu_bytes == pytest.approx(engine.budget_bytes + engine.cuda_graph_bytes + engine.working_bytes)
    if placement:  # the separate pool's engine starts on the GPU less the fixed bytes
        assert engine == engine_memory(job, plan, job.gpu.memory_bytes - rollout.detail["fixed"])
    assert "engine" not in json.loads(rollout.model_dump_json()) and "engine" not in rollout.model_dump()


def test_a_separate_pool_holds_only_the_engine():
    from meshplan.rl.memory import rl_memory

    job, plan = resolve(parse_request({**DAPO, "placement": "separate", "rollout_gpus": 8}))
    rollout = phases(rl_memory(job, plan))["rollout"]
    assert rollout.pool == "rollout" and "trainer_resident" not in rollout.detail
    assert phases(rl_memory(job, plan))["actor_update"].detail["cuda_graphs"] == 0  # no engine on the trainer's GPUs


def test_host_memory_short_is_named():
    from meshplan import api

    report = api.estimate_memory(parse_request({**DAPO, "param_offload": True,
                                                "optimizer_offload": True, "cpu_memory_per_node": 8}))
    assert report.fits and report.host_bytes_per_node > 8 * GIB and report.limited_by == "host"


def test_colocated_parts_add_and_a_separate_pool_overlaps():
    from meshplan import api

    t = api.estimate_throughput(parse_request(DAPO)).rl
    assert t.step_s == pytest.approx(t.generation_s + t.log_prob_s + t.update_s + t.reshard_s + t.offload_s)
    assert t.generation_s == pytest.approx(t.prefill_s + t.decode_s)
    sequences = 64 * 8
    per_rank = -(-sequences // t.replicas)
    assert t.replicas == 8 and t.decode_waves == -(-per_rank // min(t.sequences_at_once, per_rank))
    assert t.decode_s == pytest.approx(t.decode_waves * 4096 * t.decode_step_s)
    s = api.estimate_throughput(parse_request({**DAPO, "placement": "separate", "rollout_gpus": 8})).rl
    assert s.step_s == pytest.approx(max(s.generation_s, s.log_prob_s + s.update_s + s.offload_s) + s.reshard_s)
    assert api.estimate_throughput(parse_request({"model": "qwen3-8b", "num_gpus": 8})).rl is None


def test_recommend_for_an_rl_job_ranks_whole_rl_steps_that_fit():
    from meshplan import api
    from meshplan.check.config import check_config

    req = parse_request({**GRPO, "framework": "verl", "response_length": 4096})
    rec = api.recommend(req, top_k=3)
    assert rec.candidates, rec.rationale
    steps = [c.throughput.step_time_s for c in rec.candidates]
    assert steps == sorted(steps) and all(c.throughput.rl is not None for c in rec.candidates)
    job, _ = resolve(req)
    best = rec.candidates[0].plan
    assert best.rollout_tp and best.rollout_memory_fraction and best.placement == "colocated"
    # what decides the fit (MemorySummary.fit_bytes: the allocated peak under expandable segments, fit_basis), not the
    # reserved peak (80.3 GB reserved, 76.3 GB allocated on this request since the merges of 2026-12-07)
    assert rec.candidates[0].memory.fit_bytes <= (1 - rec.headroom) * job.gpu.memory_bytes
    assert not [f for f in check_config(job, best, include_memory=True).findings if f.severity == "error"]


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_recommend_ranks_an_rl_job_with_enforce_eager(framework):
    """recommend with rollout_enforce_eager (verl's and SkyRL's enforce_eager, as a DAPO script sets it) failed with the
    training search's own error ('meshplan.search.recommend ranks training layouts; this request is an RL job'): the RL
    recommend cleared a hand-kept list of the RL fields for the actor search, which lacked rollout_enforce_eager. Its
    rows keep the switch."""
    from meshplan import api

    rec = api.recommend(parse_request({**GRPO, "framework": framework, "rollout_enforce_eager": True}), top_k=2)
    assert rec.candidates and all(c.plan.rollout_enforce_eager for c in rec.candidates)


def test_enforce_eager_drops_the_graphs_and_pays_the_launches():
    from meshplan.knowledge.calibration import calibration_card
    from meshplan.rl.memory import rl_memory
    from meshplan.rl.step_time import decode_step_seconds

    job, plan = resolve(parse_request(DAPO))
    eager = plan.model_copy(update={"rollout_enforce_eager": True})
    graphs = calibration_card().rl.cuda_graph_bytes.value
    assert phases(rl_memory(job, plan))["actor_update"].detail["cuda_graphs"] == graphs
    assert phases(rl_memory(job, eager))["actor_update"].detail["cuda_graphs"] == 0
    with_graphs, _ = decode_step_seconds(job, plan, 32, 2048)
    without, words = decode_step_seconds(job, eager, 32, 2048)
    # Qwen3-30B-A3B at rollout TP 2: per layer 2 norms, 5 attention, rotary, q/k norms, 7 routed-expert kernels
    # and 2 all-reduces (cards/rollout_kernels.yaml), each at calibration.yaml's seconds per launch
    assert plan.rollout_tp == 2 and job.model.moe is not None and job.model.qk_norm != "none"
    per_layer = 2 + 5 + 1 + 2 + 7 + 2
    per_kernel = calibration_card().rl.eager_launch_s_per_kernel.value
    assert without - with_graphs == pytest.approx(48 * per_layer * per_kernel)
    assert f"{48 * per_layer:,} kernels" in words and "eager kernel launches" in words


def test_decode_all_reduces_carry_the_batch_activations_at_the_ring_bandwidth():
    """Each decode step all-reduces a batch x hidden bf16 tensor twice per layer over the rollout TP: across
    nodes (TP32 over 4 H20 nodes, verl's DeepSeek-V3 recipe) its bytes count beside the one latency, so the
    collectives grow with the batch; with EP the MoE layers' dispatch and combine carry every DP rank's tokens."""
    from meshplan.arithmetic.comm import links, small_allreduce_time
    from meshplan.knowledge.calibration import calibration
    from meshplan.rl.step_time import decode_collectives

    job, plan = resolve(parse_request({
        "model": "deepseek-v3", "gpu": "h20", "num_gpus": 96, "framework": "verl", "job": "rl", "tp": 8, "pp": 12,
        "ep": 8, "prompts_per_step": 96, "samples_per_prompt": 8, "response_length": 9632, "rollout_tp": 32}))
    cal = calibration(job.framework)
    lk = links(job.gpu, job.gpus_per_node, cal)
    arch = job.model
    ring_bw = min(lk.intra_bw, 8 ** lk.nic_scaling * lk.inter_bw)  # 8 of the 32 ranks share a node
    one = 2 * 68 * arch.hidden_size * 2 * 31 / 32 / ring_bw + lk.inter_lat
    assert small_allreduce_time(68 * arch.hidden_size * 2, 32, 1, lk) == pytest.approx(one)
    assert decode_collectives(job, plan, 68, cal) == pytest.approx(2 * arch.num_layers * one)
    assert decode_collectives(job, plan, 68, cal) > decode_collectives(job, plan, 1, cal) > 2 * arch.num_layers * (
        lk.inter_lat)
    # inside one node the same bytes move over NVLink at the intra-node latency
    inside = plan.model_copy(update={"rollout_tp": 8, "rollout_dp": 4})
    tp8 = 2 * 68 * arch.hidden_size * 2 * 7 / 8 / lk.intra_bw + lk.intra_lat
    assert decode_collectives(job, inside, 68, cal) == pytest.approx(2 * arch.num_layers * tp8)
    # EP over TP x DP: attention's all-reduce stays on the TP, the MoE layers' carry the DP ranks' tokens
    ep = inside.model_copy(update={"rollout_ep": 32})
    moe = len(arch.moe.moe_layers)
    routed = small_allreduce_time(4 * 68 * arch.hidden_size * 2, 32, 1, lk)
    assert decode_collectives(job, ep, 68, cal) == pytest.approx((2 * arch.num_layers - moe) * tp8 + moe * routed)


def test_skyrl_colocated_offloads_every_model_itself_and_verl_only_on_request():
    from meshplan.rl.memory import rl_memory

    for framework, resident in (("skyrl", False), ("verl", True)):
        job, plan = resolve(parse_request({**DAPO, "algorithm": "grpo", "framework": framework}))
        report = rl_memory(job, plan)
        rollout = phases(report)["rollout"].detail
        assert (rollout["trainer_resident"] > 0) == resident and (rollout["reference_resident"] > 0) == resident
        assert (report.host_bytes_per_node > 0) != resident  # SkyRL's own offload needs host memory


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_each_rl_phase_note_is_words_not_a_code_path(framework):
    """The actor update's phase note read 'meshplan.estimate.memory.estimate_memory' (a Python function's path) in
    the memory report's phases and the report's RL picture table."""
    from meshplan import api

    report = api.estimate_memory(parse_request({**GRPO, "framework": framework}))
    assert report.phases and all("meshplan." not in p.note for p in report.phases), [p.note for p in report.phases]


@pytest.mark.parametrize("mean_response", [None, 300])
def test_sequences_at_once_is_the_batch_the_decode_step_is_timed_at(mean_response):
    """A small step (16 sequences over 2 replicas) decodes 8 at once, not the KV cache's 256: the report's
    sequences_at_once, decode_waves and decode_step_s describe one batch (sweep40: '256 sequences at once, 1 waves'
    beside a step timed at 8)."""
    from meshplan import api
    from meshplan.rl.step_time import decode_step_seconds

    more = {"mean_response_length": mean_response} if mean_response else {}
    request = {"model": "qwen3-8b", "gpu": "h100", "framework": "verl", "job": "rl", "prompts_per_step": 16,
               "samples_per_prompt": 1, "response_length": 512, "placement": "separate", "rollout_gpus": 4,
               "num_gpus": 6, "pp": 2, **more}
    t = api.estimate_throughput(parse_request(request)).rl
    per_replica = -(-16 // t.replicas)
    assert t.replicas == 2 and t.sequences_at_once == per_replica and t.decode_waves == 1
    if mean_response is None:  # every response at the longest: the step at that batch and the mean context
        job, plan = resolve(parse_request(request))
        step, _ = decode_step_seconds(job, plan, per_replica, job.rl.mean_prompt + 512 / 2)
        assert t.decode_step_s == pytest.approx(step)


def test_the_parts_table_says_when_generation_overlaps_and_the_shares_pass_the_step(capsys):
    """A separate pool's generation runs beside the training side, so its RL step's parts add to more than the step
    (sweep40: shares of 51% + 9% + 25% + 12% + 53% without a word); colocated, they add to it and nothing is said."""
    from meshplan.faces import cli

    base = ["throughput", "qwen3-8b", "--gpu", "h100", "--framework", "verl", "--job", "rl", "--prompts-per-step",
            "16", "--response-length", "512", "--pp", "2"]
    assert cli.main([*base, "--placement", "separate", "--rollout-gpus", "4", "--num-gpus", "6"]) == 0
    separate = capsys.readouterr().out
    assert "overlaps the training side" in " ".join(separate.split()) and "more than the step" in separate
    assert cli.main([*base, "--num-gpus", "2"]) == 0
    assert "more than the step" not in capsys.readouterr().out
    from meshplan.faces.mcp import tools

    answer = tools.estimate_throughput(model="qwen3-8b", gpu="h100", framework="verl", job="rl", prompts_per_step=16,
                                       response_length=512, pp=2, placement="separate", rollout_gpus=4, num_gpus=6)
    assert "The parts add to" in answer.summary and "more than the step" in answer.summary


def test_recommend_keeps_a_phase_offload_the_user_fixed_on_skyrl():
    """SkyRL's optimizer_offload acts between an RL step's phases only (its card: phase_offloads_when rl), so rule OF001
    refuses it on a training job; the RL recommend ranks actor layouts with a training search, which carried the fixed
    knob and refused all 21,546 plans with OF001 while check passed the same job (sweep40). The update step the
    training search ranks has no phases: the knob stays on the RL plan (actor_layout), off the training request."""
    from meshplan import api

    req = {"model": "qwen3-8b", "gpu": "h100", "framework": "skyrl", "job": "rl", "num_gpus": 8,
           "prompts_per_step": 32, "samples_per_prompt": 4, "response_length": 1024, "optimizer_offload": True}
    rec = api.recommend(parse_request(req), top_k=2)
    assert rec.candidates and all(c.plan.optimizer_offload for c in rec.candidates)
    best = rec.candidates[0].plan
    check = api.check_config(parse_request({**req, **{k: getattr(best, k) for k in ("tp", "pp", "dp", "zero_stage")}}))
    assert not any(f.id == "OF001" for f in check.findings)


def test_an_engine_that_cannot_start_is_said_by_the_memory_and_the_step_time():
    """Qwen2.5-7B on 8 H100, verl with SGLang at its default fraction 0.5: check says RL006 (no sequence's KV cache
    once the engine's weights are in), but the memory face said 'fits' and the step time decoded one sequence at a
    time (851 s of generation) without a word. Both now lead their warnings with it; an engine that starts says
    nothing."""
    from meshplan import api
    from meshplan.schema.request import Request

    fields = dict(model="qwen2.5-7b", framework="verl", job="rl", num_gpus=8, rollout_engine="sglang",
                  prompt_length=256, response_length=1024)
    assert "RL006" in {f.id for f in api.check_config(Request(**fields)).findings}
    said = "The rollout engine cannot start: at rollout_memory_fraction 0.5"
    assert api.estimate_memory(Request(**fields)).warnings[0].startswith(said)
    timed = api.estimate_throughput(Request(**fields))
    assert timed.warnings[0].startswith(said)
    assert "1 sequence at once" in timed.model_dump_json()  # the step's note in the singular (was '1 sequences')
    started = Request(**fields, rollout_memory_fraction=0.85, param_offload=True, optimizer_offload=True)
    assert not any("cannot start" in w for w in api.estimate_throughput(started).warnings)
