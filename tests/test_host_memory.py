"""Host memory per node (rule MEM003, issue 23): a node holds at most its GPUs' worth of the job's ranks, and a job
smaller than a node only its own (mesh.ranks_per_node); check, recommend, the search's MEM003 floor, the oracle and
min-gpus read the same figure."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.arithmetic.mesh import ranks_per_node
from meshplan.core.units import GIB
from meshplan.request.parse import parse_request
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import exhaustive_top_k
from meshplan.search.engine import BestFirstSearch
from meshplan.search.estimators import default_engine
from meshplan.search.job import search_job
from meshplan.search.policy import headroom_for, memory_budget
from meshplan.search.refusal import Space, host_floor
from meshplan.search.space import Fixed, enumerate_layouts, micro_batches
from meshplan.search.zero_stages import offered_before

OFFLOAD = dict(model="llama-3.1-8b", optimizer_offload_fraction=1.0)  # 16 B per parameter on the host, ~119.7 GiB


@pytest.mark.parametrize(("gpus", "ranks"), [(1, 1), (2, 2), (4, 4), (12, 4), (16, 8)])
def test_a_node_is_charged_the_jobs_ranks_on_it(gpus, ranks):
    """Before: every job on 8-GPU nodes was charged 8 ranks (a 1-GPU job's optimizer states 8 times over). 12 GPUs
    run as 3 nodes x 4 (request/resolve.launch_gpus_per_node)."""
    job, _ = resolve(parse_request(dict(OFFLOAD, num_gpus=gpus)))
    assert job.gpus_per_node == (4 if gpus == 12 else 8) and ranks_per_node(job) == ranks
    report = api.estimate_memory(parse_request(dict(OFFLOAD, num_gpus=gpus, tp=1, pp=1)))
    worst = max(s.host_bytes for s in report.stages)
    assert report.host_bytes_per_node == worst * ranks
    assert f"x {ranks} GPU{'s' if ranks > 1 else ''})" in " ".join(report.assumptions)


def test_a_job_within_a_node_needs_the_same_host_whatever_the_nodes_size():
    """The training estimate and the RL report's extra host state (reference model, critic) alike."""
    for fields in (dict(OFFLOAD, num_gpus=4, tp=1, pp=1),
                   {"model": "qwen3-30b-a3b", "num_gpus": 4, "ep": 4, "job": "rl", "samples_per_prompt": 8,
                    "prompts_per_step": 64, "framework": "skyrl", "response_length": 4096, "recompute": "full"}):
        small = api.estimate_memory(parse_request(dict(fields, gpus_per_node=4)))
        large = api.estimate_memory(parse_request(dict(fields, gpus_per_node=8)))
        assert small.host_bytes_per_node == large.host_bytes_per_node > 0


def test_the_host_floor_counts_the_jobs_ranks_on_a_node():
    for gpus, ranks in ((2, 2), (16, 8)):
        req = Request(**OFFLOAD, num_gpus=gpus)
        job, _ = search_job(req)
        space = Space.of(job, Fixed.from_request(req, job))
        plan = space.plan(space.layouts[0], space.zeros[0], space.recomputes[0], 1)
        # 8.03B parameters x 16 B over the job's GPUs, times its ranks on a node
        assert min(host_floor(job, z, plan) for z in space.zeros) / GIB == pytest.approx(119.66 / gpus * ranks,
                                                                                          abs=0.01)


def test_a_host_between_the_old_and_the_new_figure_passes_everywhere():
    """2 GPUs with the whole optimizer on the CPU need 119.7 GiB of host memory on their node; before, 478.6 GiB
    (8 ranks' shards): a 200 GiB host was refused by check (MEM003) and by recommend's floor, and min-gpus answered
    8 GPUs (the first count whose 8 ranks' shards fit)."""
    req = Request(**OFFLOAD, num_gpus=2, cpu_memory_per_node=200)
    check = api.check_config(Request(**OFFLOAD, num_gpus=2, tp=1, pp=1, cpu_memory_per_node=200))
    assert check.memory.host_bytes_per_node / GIB == pytest.approx(119.66, abs=0.01)
    assert "MEM003" not in {f.id for f in check.findings}
    rec = api.recommend(req, top_k=3)
    assert rec.candidates and "MEM003" not in rec.rejected
    assert all(c.memory.host_bytes_per_node <= 200 * GIB for c in rec.candidates)
    oracle = exhaustive_top_k(req, 3)
    assert [c.throughput.step_time_s for c in rec.candidates] == pytest.approx(
        [r.step_time_s for r in oracle], rel=1e-12)
    least = api.minimum_gpus(Request(**OFFLOAD, cpu_memory_per_node=200))
    assert least.num_gpus == 1 and least.candidate.memory.host_bytes_per_node / GIB == pytest.approx(119.66, abs=0.01)


def host_and_gpu_rejects(req: Request) -> tuple[int, int]:
    """By brute force (as search/oracle.py walks the space): the plans that pass the structural rules and are over
    the GPU budget, and those within it whose offloads are over cpu_memory_per_node (what `check` calls MEM003). A
    plan at a ZeRO stage that is one plan with a stage offered before it which the rules pass (verl's Megatron
    engine's ZeRO 0 and 1 at dp 1: zero_stages.offered_before) is that plan, counted once (the search's
    SEARCH-SAME-STAGE)."""
    job, _ = search_job(req)
    fixed = Fixed.from_request(req, job)
    space = BestFirstSearch.for_job(job, fixed, default_engine(job.framework), 1)
    budget = memory_budget(job, headroom_for(req))
    gpu = host = 0
    for lay in enumerate_layouts(job, fixed)[0]:
        for mbs in micro_batches(job, lay, fixed):
            for zero in space.zeros:
                for recompute in space.recomputes:
                    plan = space.plan(lay, zero, recompute, mbs)
                    if any(space.engine.check(job, space.plan(lay, other, recompute, mbs)).ok
                           for other in offered_before(job, plan, space.zeros)):
                        continue
                    if space.engine.check(job, plan).ok:
                        memory = space.engine.memory(job, plan)
                        gpu += memory.fit_bytes > budget
                        host += memory.fit_bytes <= budget and memory.host_bytes_per_node > job.cpu_memory_per_node
    return gpu, host


@pytest.mark.parametrize("fields", [
    dict(model="deepseek-v2-lite", gpu="h100", seq_length=2048, global_batch_size=32, cpu_memory_per_node=64.0),
    # a need the host raised at one micro-batch is no floor of GPU memory at a larger one: read as one (need_range),
    # 3 plans within the GPU budget were counted under MEM001 at the larger micro-batches
    dict(model="qwen3-8b", seq_length=16384, global_batch_size=4, cpu_memory_per_node=60.0),
])
def test_the_search_counts_plans_only_the_host_rejects_under_mem003(fields):
    """Before: under MEM001 (the GPU's rule). verl's FSDP workers offload the optimizer when asked, more than the
    host holds at some layouts, so nothing is ranked and every plan is counted: those within the GPU budget under
    MEM003. (SkyRL's phase offload, which this test asked first, acts in an RL job only: OF001 refuses it on a
    training job.)"""
    req = Request(num_gpus=4, framework="verl", optimizer_offload=True, **fields)
    rec = api.recommend(req, top_k=3)
    gpu, host = host_and_gpu_rejects(req)
    assert not rec.candidates and rec.considered == sum(rec.rejected.values())
    # over the GPU budget: MEM001 over capacity, MEM002 within it but over the headroom (memory_rule_for)
    over_gpu = rec.rejected.get("MEM001", 0) + rec.rejected.get("MEM002", 0)
    assert (over_gpu, rec.rejected["MEM003"]) == (gpu, host) and host > 0
