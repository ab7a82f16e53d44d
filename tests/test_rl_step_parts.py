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
