"""An RL step's report says where the step goes by the RL step's parts. Before: the CLI's table listed the actor
update's breakdown as 'share of step' (compute 44% of a step that was a quarter generation and a third log-prob
passes, the shares summing to 45%), and the MCP summary named 'dp comm (0.12 s)' the largest cost besides compute."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest
from mcp_calls import call_tool

from meshplan import api
from meshplan.faces import cli
from meshplan.schema.request import Request

RL = dict(model="qwen3-8b", framework="verl", job="rl", num_gpus=8, rollout_tp=2)


@pytest.mark.parametrize("fields", [RL, dict(model="qwen3-8b", num_gpus=8)])
def test_a_colocated_steps_parts_add_to_the_step(fields):
    report = api.estimate_throughput(Request(**fields))
    assert sum(report.parts().values()) == pytest.approx(report.step_time_s, rel=1e-6)
    assert ("generation_s" in report.parts()) == (report.rl is not None)


def test_the_cli_and_mcp_word_an_rl_steps_parts():
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["throughput", "qwen3-8b", "--framework", "verl", "--job", "rl", "--num-gpus", "8",
                         "--rollout-tp", "2"]) == 0
    text = out.getvalue()
    assert "share of step" in text and "share of update" in text
    step_table = text.split("share of step", 1)[1].split("share of update", 1)[0]
    assert "generation" in step_table and "compute" not in step_table
    summary = call_tool("estimate_throughput", RL).structured_content["summary"]
    assert "besides compute" not in summary and "Parts: generation" in summary and "(the actor update's)" in summary


PPO = dict(model="qwen2.5-7b", framework="verl", job="rl", algorithm="ppo", num_gpus=8, samples_per_prompt=4,
           prompts_per_step=64, prompts_per_mini_batch=16)


def test_an_rl_steps_breakdown_is_named_the_actors_step_where_the_update_is_more():
    """The breakdown of an RL report is the actor's training step over the batch once (rl/step_time.rl_step_time's
    `update`); PPO's update adds the critic's and the mini-batches' steps. Before: the CLI titled it 'share of update'
    (PPO on 16 GPUs: compute 41.8 s '99.7% of update' beside an update of 83.9 s) and the HTML step-time figure drew
    it against the whole RL step's mark (5.3 s of bars under 'step 20.33 s')."""
    from meshplan.faces.report.figures import steptime_figure
    from meshplan.faces.report.gather import gather
    from meshplan.request.parse import parse_request

    report = api.estimate_throughput(Request(**PPO))
    assert report.rl.update_s > 1.5 * report.actor_step_s()
    words = report.actor_step_words()
    assert f"{report.actor_step_s():,.3g} s" in words and f"{report.rl.update_s:,.3g} s" in words
    assert api.estimate_throughput(Request(**RL)).actor_step_words() == ""  # GRPO, one mini-batch: the update itself
    out = io.StringIO()
    with redirect_stdout(out):
        cli.main(["throughput", *[f"--{k.replace('_', '-')}={v}" for k, v in PPO.items() if k != "model"],
                  "qwen2.5-7b"])
    text = out.getvalue()
    assert "share of actor step" in text and "share of update" not in text and "the update by part" in text
    assert "The update by part" in call_tool("estimate_throughput", PPO).structured_content["summary"]
    picture = steptime_figure(gather(parse_request(PPO)).throughput)
    marks = [s.text for s in picture.shapes if s.kind == "text" and "step" in (s.text or "")]
    assert [m for m in marks if m.startswith(("step ", "actor step "))] == [m for m in marks if "actor step" in m]
    assert len([m for m in marks if m.startswith("actor step ")]) == 1 and words in picture.notes


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_the_rl_mfu_says_what_it_divides_and_names_no_other_framework(framework):
    """An RL report's mfu is meshplan's model FLOPs over the actor update's seconds (RLStepTime.update_mfu), on every
    RL framework: its assumption said 'as verl reports it' on SkyRL too, and verl's own log counts the FLOPs another
    way (its flops_counter, rl/step_time.logged_update_mfu, which compare reads)."""
    report = api.estimate_throughput(Request(**{**RL, "framework": framework}))
    said = [a for a in report.assumptions if a.startswith("mfu is")]
    assert said == ["mfu is the actor update's: its model FLOPs over the update's seconds and the actor's GPUs "
                    "(verl's own log counts the FLOPs with its flops_counter, which `meshplan compare` reads as verl "
                    "counts them)."]
    assert report.mfu == report.rl.update_mfu
