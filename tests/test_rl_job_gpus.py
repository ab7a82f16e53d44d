"""An RL job's GPUs in all have one home, rl/job.py rl_job_gpus: the trainer's (twice where PPO's critic runs on as
many of its own) plus a separate rollout pool's. The RL step's report (tokens per GPU) and min-gpus' scan (each trainer
count turned into the job's) both read it, so the three agree on colocated, separate and SkyRL PPO placed apart."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.request.resolve import resolve
from meshplan.rl.job import ResolvedRL, resolve_rl, rl_job_gpus
from meshplan.rl.memory import critic_apart
from meshplan.schema.request import Request
from meshplan.search import min_gpus

JOBS = {
    "colocated": (dict(model="qwen2.5-7b", framework="verl", job="rl", algorithm="grpo", gpu="h100"), 8, 8),
    "separate": (dict(model="qwen2.5-7b", framework="verl", job="rl", algorithm="grpo", gpu="h100",
                      placement="separate", rollout_gpus=8), 16, 8),
    "skyrl-ppo-separate": (dict(model="qwen2.5-7b", framework="skyrl", job="rl", algorithm="ppo", zero_stage=3,
                                gpu="h100", placement="separate", rollout_gpus=8), 24, 8),
}


@pytest.mark.parametrize("name", sorted(JOBS))
def test_the_jobs_gpus_are_one_function_the_report_and_min_gpus_read(name):
    fields, num_gpus, trainer = JOBS[name]
    req = Request(**fields, num_gpus=num_gpus)
    job, plan = resolve(req)
    assert job.num_gpus == trainer  # the trainer's (the policy's): what _pools leaves of num_gpus
    total = rl_job_gpus(job.num_gpus, critic_apart(job, plan), plan.placement, plan.rollout_gpus)
    assert total == num_gpus
    report = api.estimate_throughput(req)
    assert report.tokens_per_s / report.tokens_per_s_per_gpu == pytest.approx(total, rel=1e-9)
    found = api.minimum_gpus(Request(**fields))
    assert found.num_gpus is not None
    trainer_req, rl = resolve_rl(Request(**fields, num_gpus=found.num_gpus), [])
    assert rl is not None and rl.job_gpus(trainer_req.num_gpus) == found.num_gpus
    p = found.candidate.plan
    assert p.dp * p.cp * p.tp * p.pp == trainer_req.num_gpus  # the layout at the count is the trainer's


def test_min_gpus_scans_the_trainer_counts_the_one_home_of_the_jobs_gpus_allows(monkeypatch):
    """min-gpus turns its GPU limit into the trainer's by rl_job_gpus alone (through ResolvedRL.job_gpus): it derived
    the critic's copies again beside it (2 where critic_apart), so a change to that home left the scan's limit behind.
    Here the home counts every trainer GPU twice (as a critic of its own would) on a job whose critic is not apart:
    the scan must stop at the trainer count whose job fits max_gpus."""
    seen = {}

    class Stop(Exception):
        pass

    def scan(job, fixed, engine, headroom, user_gbs, limit, **_):
        seen["limit"] = limit
        raise Stop

    monkeypatch.setattr(ResolvedRL, "job_gpus", lambda self, trainer: 2 * trainer + (self.rollout_gpus or 0))
    monkeypatch.setattr(min_gpus, "scan_minimum", scan)
    fields, _, _ = JOBS["separate"]
    with pytest.raises(Stop):
        api.minimum_gpus(Request(**fields), max_gpus=64)
    assert seen["limit"] == (64 - 8) // 2


def test_the_rl_recommend_states_the_trainers_nodes():
    """12 GPUs of 8-GPU nodes run as 3 nodes x 4 (request/resolve.launch_gpus_per_node): the RL Recommendation says
    so as the training one does (its compared-at line), with the note in its assumptions."""
    rec = api.recommend(Request(model="qwen3-30b-a3b", gpu="h100", framework="verl", job="rl", algorithm="grpo",
                                num_gpus=12), top_k=1)
    assert rec.gpus_per_node == 4 and any("3 nodes x 4" in note for note in rec.assumptions)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_the_rl_recommendation_is_on_the_requests_gpus(name, capsys):
    """The RL recommend answered for the trainer's GPUs: a SkyRL PPO job asked on 24 GPUs (8 the rollout engine's, 8
    PPO's critic's) said 'Qwen2.5-7B on 8 GPUs' and '8 x H100' on the CLI, MCP and report. Its num_gpus is now the
    request's, trainer_gpus the trainer's share where the rest runs apart, and the words name each pool."""
    from meshplan.faces.cli import main

    fields, num_gpus, trainer = JOBS[name]
    rec = api.recommend(Request(**fields, num_gpus=num_gpus), top_k=1)
    assert rec.num_gpus == num_gpus
    assert rec.trainer_gpus == (None if trainer == num_gpus else trainer)
    p = rec.candidates[0].plan
    assert p.dp * p.cp * p.tp * p.pp == trainer
    args = ["recommend", "qwen2.5-7b", "--num-gpus", str(num_gpus)] + [
        f"--{k.replace('_', '-')}={v}" for k, v in fields.items() if k != "model"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Qwen2.5-7B on {num_gpus} GPUs")
    compared = next(line for line in out.splitlines() if line.startswith("compared at:"))
    if trainer != num_gpus:
        critic = ", PPO's critic's 8" if fields["framework"] == "skyrl" else ""
        assert f"{num_gpus} x NVIDIA H100 SXM5 80GB (h100; the trainer's {trainer}{critic} and the rollout " \
               f"engine's 8)" in compared
