"""min-gpus (issue 23): the scan's floor counts every parameter (routed experts included) and never over-counts; the
count it answers is the one recommend's own search ranks a layout at; RL jobs get an answer on every face."""

import json
import math
import random
from dataclasses import replace

import pytest

from meshplan import api
from meshplan.arithmetic.memory_states import bytes_per_param
from meshplan.core.errors import MeshplanError
from meshplan.faces.cli import main
from meshplan.schema.reports import Finding
from meshplan.schema.request import Request
from meshplan.search import BestFirstSearch, default_engine, minimum_gpus, recommend, search_job
from meshplan.search.gpu_count import fits_somewhere, states_floor
from meshplan.search.policy import headroom_for, memory_budget, min_headroom_fraction
from meshplan.search.space import Fixed, enumerate_layouts, micro_batches, params_split, state_preset
from meshplan.search.zero_stages import bound_preset


def _floor(model: str, gpu: str = "h100", **fields) -> int:
    req = Request(model=model, gpu=gpu, num_gpus=8, **fields)
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    budget = memory_budget(job, min_headroom_fraction())
    zeros = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1, budget_bytes=budget).zeros
    return states_floor(job, zeros, budget, fixed.carried)


def test_the_floor_counts_the_routed_experts():
    """Kimi-K2's routed experts' bf16 weights alone need ~26 H100s (the scan used to start at 4): the floor counts
    every parameter's states, experts included, at the lightest stage's bytes per parameter."""
    req = Request(model="kimi-k2", gpu="h100", num_gpus=8)
    job, _ = search_job(req)
    dense, routed = params_split(job)
    assert routed / dense > 50
    budget = memory_budget(job, min_headroom_fraction())
    assert _floor("kimi-k2") >= math.ceil(2 * routed / budget) >= 26
    per_param = bytes_per_param(state_preset(job, 3, Fixed.from_request(req, job).carried)[1], 1.0)
    assert _floor("kimi-k2") == math.ceil(per_param * (dense + routed) / budget)
    # a LoRA job's frozen base keeps its weights only: a far lower floor
    assert _floor("llama-3.1-70b", lora_rank=16, framework="megatron-bridge") < _floor("llama-3.1-70b") / 4


MODELS = ["llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v2-lite", "olmoe-1b-7b", "qwen3-235b-a22b",
          "moonlight-16b-a3b"]
FRAMEWORKS = ["megatron-core", "megatron-bridge", "deepspeed", "torchtitan", "nanotron", "kempnerforge", "verl",
              "skyrl"]


@pytest.mark.parametrize("seed", range(4))
def test_the_floor_never_over_counts(seed):
    """The floor is a lower bound: for sampled jobs and layouts, the figure that decides the estimate's fit is at least
    the floor's bytes per GPU (every parameter's unsharded state bytes over the GPU count, less gradients a trainer
    frees before its backward), for every framework, ZeRO stage, optimizer, precision and micro-batch count."""
    rng = random.Random(seed)
    checked = 0
    while checked < 40:
        extra = {}
        if rng.random() < 0.3:
            extra["optimizer"] = "muon"
        if rng.random() < 0.2:
            extra["precision"] = "fp8"
        try:
            gpus = rng.choice([3, 8, 16, 32, 64])
            req = Request(model=rng.choice(MODELS), framework=rng.choice(FRAMEWORKS), seq_length=2048, num_gpus=gpus,
                          global_batch_size=rng.choice([None, gpus]), **extra)  # one micro-batch per step, or many
            job, _ = search_job(req)
            fixed = Fixed.from_request(req, job)
            search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
        except MeshplanError:
            continue
        dense, routed = params_split(job)
        per_gpu = min(bytes_per_param(bound_preset(job, z, fixed.carried)[1], 1.0)
                      for z in search.zeros) * (dense + routed) / job.num_gpus
        layouts, _ = enumerate_layouts(job, fixed)
        for lay in rng.sample(layouts, min(4, len(layouts))):
            sizes = micro_batches(job, lay, fixed)
            for zero in search.zeros if sizes else ():
                try:
                    memory = search.engine.memory(job, search.plan(lay, zero, "full", sizes[0]))
                except MeshplanError:
                    continue
                assert min(memory.fit_bytes, memory.peak_bytes) >= per_gpu, (req, lay, zero)
                checked += 1


def test_the_floor_leaves_out_gradients_a_trainer_frees_before_the_backward():
    """verl (torch FSDP2, gradients set to None each step) with one micro-batch per step: its backward peaks before its
    gradients exist, but optimizer.step() holds every one of them beside the foreach step's fp32 temporaries (issue 24,
    cards/memory.yaml optimizer_steps): Moonlight-16B-A3B on 3 A100, ZeRO-3, 85.1 GB of states and 21.3 GB of the
    step's temporaries do not fit, 4 GPUs do. The floor (and the search's model-state bounds, which leave those
    gradients out) stay below the estimate."""
    req = Request(model="moonlight-16b-a3b", framework="verl", gpu="a100-80gb", num_gpus=3, seq_length=1024,
                  global_batch_size=12)
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    search = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    layout = next(lay for lay in enumerate_layouts(job, fixed)[0] if lay.dp == 3)
    memory = search.engine.memory(job, search.plan(layout, 3, "full", 4))
    assert memory.stages[0].detail["optimizer_step_temporaries"] > 0
    budget = memory_budget(job, min_headroom_fraction())
    assert memory.fit_bytes > budget
    assert states_floor(job, search.zeros, budget, fixed.carried) <= 3
    assert search.states_bound(layout, 3) <= memory.fit_bytes
    assert not recommend(req, top_k=1).candidates
    assert recommend(req.model_copy(update={"num_gpus": 4, "global_batch_size": 16}), top_k=1).candidates


def test_min_gpus_is_the_count_recommend_ranks_at():
    """The count min-gpus answers is settled by recommend's own search there: its candidate is recommend's #1 at that
    count, and recommend one node below ranks nothing and names the same count."""
    req = Request(model="mixtral-8x22b", gpu="h100", seq_length=4096)
    result = minimum_gpus(req)
    assert result.num_gpus is not None and result.stopped_by == "found"
    there = recommend(req.model_copy(update={"num_gpus": result.num_gpus}), top_k=1)
    assert there.candidates[0].plan == result.candidate.plan
    assert there.candidates[0].throughput.step_time_s == result.candidate.throughput.step_time_s
    below = recommend(req.model_copy(update={"num_gpus": result.num_gpus - 8}), top_k=1)
    assert below.candidates == [] and below.min_gpus == result.num_gpus


@pytest.mark.slow
def test_deepseek_v3_min_gpus_agrees_with_recommend():
    """Issue 23: min-gpus said 192 while `recommend --num-gpus 192` found nothing (it ran out of its clock)."""
    result = minimum_gpus(Request(model="deepseek-v3", gpu="h100"))
    assert result.num_gpus is not None and result.candidate is not None
    there = recommend(Request(model="deepseek-v3", gpu="h100", num_gpus=result.num_gpus), top_k=1)
    assert there.candidates and there.candidates[0].plan == result.candidate.plan


RL = dict(model="qwen3-30b-a3b", gpu="h100", framework="verl", job="rl", algorithm="grpo")


def test_min_gpus_answers_an_rl_job_with_a_fixed_layout():
    """It used to end in `KeyError: None` (the training search's answer checked as an RL plan without rollout fields):
    now the trainer's counts are scanned and each settled by the RL recommend, whose #1 comes back."""
    result = api.minimum_gpus(Request(**RL, tp=2, ep=8))
    assert result.num_gpus is not None and result.stopped_by == "found"
    plan = result.candidate.plan
    assert (plan.tp, plan.ep) == (2, 8) and plan.rollout_tp is not None and plan.rollout_memory_fraction
    rl = api.recommend(Request(**RL, tp=2, ep=8, num_gpus=result.num_gpus), top_k=1)
    assert rl.candidates[0].plan == plan
    assert "RL step's batch" in " ".join(result.assumptions)
    # the answer's sentence names that layout, the rollout engine and the offloads, not only the RL step's time
    best = result.rationale.split("The fastest layout there that passes every rule and fits: ", 1)[1]
    assert best.startswith(f"{plan.short()}, micro-batch {plan.micro_batch_size}")
    assert f"rollout {plan.rollout_engine} TP{plan.rollout_tp} DP{plan.rollout_dp}" in best and "offload " in best
    assert rl.rationale == f"#1: {rl.candidates[0].rationale}"


def test_min_gpus_for_an_rl_job_on_the_cli(capsys):
    args = ["min-gpus", "qwen3-30b-a3b", "--framework", "verl", "--job", "rl", "--algorithm", "grpo", "--tp", "2",
            "--ep", "8", "--gpu", "h100"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_gpus"] and data["candidate"]["plan"]["rollout_tp"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("smallest GPU count: ")


def test_the_scan_counts_work_not_time(monkeypatch):
    """The scan's bounds are counts (cards/search.yaml): a scan cut by the searches bound says so."""
    from meshplan.search import gpu_count
    from meshplan.search.space import search_card

    tiny = search_card().limits.model_copy(update={"min_gpus_max_searches": 1})
    monkeypatch.setattr(gpu_count, "search_limits", lambda: tiny)
    calls = []
    real = gpu_count.scan_minimum

    def never(world, job):
        calls.append(world)
        return False

    def scan(*args, **kwargs):
        return real(*args, **{**kwargs, "ranks": never})

    monkeypatch.setattr("meshplan.search.min_gpus.scan_minimum", scan)
    cut = minimum_gpus(Request(model="llama-3.1-70b", gpu="h100"))
    assert cut.num_gpus is None and cut.stopped_by == "counts" and len(calls) == 1
    assert "1 full searches" in cut.rationale and "not proof" in cut.rationale


def _scan_at(model: str, num_gpus: int, engine=None):
    """fits_somewhere's arguments for `model` on num_gpus H100 at the default headroom, with `engine`."""
    req = Request(model=model, gpu="h100")
    job, _ = search_job(req.model_copy(update={"num_gpus": num_gpus}))
    return (job, Fixed.from_request(req, job), engine or default_engine(job.framework),
            memory_budget(job, headroom_for(req)))


def test_the_scan_asks_the_rules_only_of_a_stage_whose_lightest_variant_fits():
    # Kimi-K2 on 248 H100: every layout's lightest variant is over the headroom, so no count-248 search runs; the
    # scan's condition settles it from the floors and the estimates alone (it asked ~1,300 rule checks, mostly
    # PP015/PP005 on every micro-batch of interleaved splits, before asking the estimate).
    base = default_engine("megatron-core")
    asked = []
    engine = replace(base, check=lambda job, plan: asked.append(plan) or base.check(job, plan))
    assert not fits_somewhere(*_scan_at("kimi-k2", 248, engine))
    assert asked == []
    assert fits_somewhere(*_scan_at("kimi-k2", 256, engine))  # and where one fits, the rules are still asked
    assert asked


def test_an_estimate_the_rules_block_counts_as_a_fit_where_they_pass_another_plan():
    # the estimate comes before the rules; one that raises proves nothing of the stage's other plans (EP009 refuses
    # the overlap at full recompute only), so it counts as a fit where the rules pass some plan of the stage (the
    # count is left to recommend's search), and a stage the rules reject on every plan is skipped, not an error
    base = default_engine("megatron-core")

    def blocked(*_, **__):
        raise MeshplanError("blocked by a rule")

    def rejecting(job, plan):
        report = base.check(job, plan)
        finding = Finding(id="PP015", severity="error", message="rejected", fix="none")
        return report.model_copy(update={"ok": False, "findings": [finding]})

    assert not fits_somewhere(*_scan_at("llama-3.1-8b", 8, replace(base, memory_fit=blocked, check=rejecting)))
    assert fits_somewhere(*_scan_at("llama-3.1-8b", 8, replace(base, memory_fit=blocked)))


RECOMPUTE_RULED = [
    # OF002: DeepSpeed's activation offload needs full recompute; the scan asked the rules at none only and found
    # no count up to its bound
    (dict(model="llama-3.1-8b", gpu="h100", framework="deepspeed", activation_offload=True, seq_length=2048,
          global_batch_size=8, headroom=0.1), 2),
    # EP009: a fixed moe_a2a_overlap refuses full recompute; the scan's estimate at full raised out of min-gpus
    (dict(model="deepseek-v2-lite", gpu="b200", framework="megatron-core", moe_a2a_overlap=True, seq_length=2048,
          global_batch_size=24, headroom=0.4), 4),
]


@pytest.mark.parametrize(("fields", "count"), RECOMPUTE_RULED, ids=["OF002", "EP009"])
def test_the_scan_reads_the_rules_at_every_recompute(fields, count):
    """fits_somewhere asks the rules at each recompute, and an estimate they block counts as a fit: the count is the
    first the scan checks (its floor), where recommend ranks a layout."""
    got = minimum_gpus(Request(**fields))
    assert got.num_gpus == count and f"from {count}:" in got.rationale
    assert recommend(Request(**fields, num_gpus=count), top_k=1).candidates


def test_the_count_min_gpus_answers_launches():
    """recommend ranks layouts on 20 H100 for Llama-3.1-70B at 8K tokens (TP4 PP5), but launchers start the same
    number of processes on every node (adapters/common.nodes): 20 GPUs run as 5 nodes x 4 (request/resolve
    launch_gpus_per_node), so render writes that, and refuses 20 where the request says 8 per node. min-gpus still
    answers the least count of whole nodes, and render writes its plan."""
    req = Request(model="llama-3.1-70b", gpu="h100", seq_length=8192)
    at_20 = recommend(req.model_copy(update={"num_gpus": 20}), top_k=1).candidates
    assert at_20 and at_20[0].plan.tp * at_20[0].plan.pp * at_20[0].plan.cp * at_20[0].plan.dp == 20
    result = minimum_gpus(req)
    assert result.num_gpus == 24 and result.num_gpus % 8 == 0
    plan = result.candidate.plan.model_dump(exclude_defaults=True)
    fields = {k: v for k, v in plan.items() if k in Request.model_fields}
    rendered = api.render_config("megatron-core", req.model_copy(update={
        "num_gpus": 24, "global_batch_size": result.global_batch_size, **fields}))
    assert rendered.text
    twenty = at_20[0].plan.model_dump(exclude_defaults=True)
    layout = {k: v for k, v in twenty.items() if k in Request.model_fields}
    at_twenty = req.model_copy(update={"num_gpus": 20, **layout})
    assert "--nnodes 5 --nproc-per-node 4" in api.render_config("megatron-core", at_twenty).text
    with pytest.raises(MeshplanError, match="whole 8-GPU nodes"):
        api.render_config("megatron-core", at_twenty.model_copy(update={"gpus_per_node": 8}), force=True)


def test_min_gpus_names_its_best_layout_once_in_a_persons_words():
    """It read 'Best layout there: Fastest predicted layout that passes every rule and fits. TP2 ...', recommend's
    row opening repeated after its own; and recommend's answer said 'ranked the fastest 1 distinct layouts'."""
    result = api.minimum_gpus(Request(model="llama-3.1-8b", gpu="h100"))
    plan = result.candidate.plan
    assert "Fastest predicted" not in result.rationale and "Best layout there" not in result.rationale
    assert f"The fastest layout there that passes every rule and fits: {plan.short()}, micro-batch" in result.rationale
    one = api.recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8), top_k=1)
    assert "ranked the fastest layout that passes every rule and keeps " in one.rationale
    assert "distinct layouts" not in one.rationale and "Fastest predicted" not in one.rationale
    assert f"#1: {one.candidates[0].plan.short()}" in one.rationale
    two = api.recommend(Request(model="llama-3.1-8b", gpu="h100", num_gpus=8), top_k=2)
    assert f"ranked the fastest {len(two.candidates)} distinct layouts that pass every rule and keep " in two.rationale
