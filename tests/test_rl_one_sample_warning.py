"""GRPO over one response per prompt is a warning on every face (rule RL008), not an assumption. Before, resolve_rl
noted 'samples_per_prompt is 1: GRPO's group advantage of a single response is zero' among the assumptions (which
the CLI's recommend never prints, and which misread the frameworks: verl and SkyRL take a one-response group's mean
as 0 and std as 1, so the advantage is the raw reward, not zero)."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.faces.cli import main
from meshplan.faces.mcp import tools
from meshplan.schema.request import Request

ONE = dict(model="qwen3-8b", framework="verl", job="rl", num_gpus=8, gpu="h100", samples_per_prompt=1)
FITS = dict(param_offload=True, optimizer_offload=True)


def _said(lines: list[str]) -> bool:
    return any(line.startswith("RL008 (warning): samples_per_prompt=1 with GRPO") for line in lines)


def test_every_answer_warns_of_a_one_response_group():
    assert "RL008" in {f.id for f in api.check_config(Request(**ONE)).findings}
    assert _said(api.estimate_memory(Request(**ONE, **FITS)).warnings)
    assert _said(api.estimate_throughput(Request(**ONE, **FITS)).warnings)
    assert _said(api.recommend(Request(**ONE), top_k=1).warnings)
    assert _said(api.render_config("verl", Request(**ONE, **FITS)).warnings)
    assert not any("group advantage" in a for a in api.recommend(Request(**ONE), top_k=1).assumptions)


@pytest.mark.parametrize("samples, algorithm", [(2, "grpo"), (1, "ppo")])
def test_no_warning_where_the_group_or_a_critic_gives_the_baseline(samples, algorithm):
    req = Request(**{**ONE, "samples_per_prompt": samples, "algorithm": algorithm}, **FITS)
    assert not _said(api.estimate_throughput(req).warnings)
    assert "RL008" not in {f.id for f in api.check_config(req).findings}


def test_the_cli_and_mcp_recommend_show_it(capsys):
    assert main(["recommend", "qwen3-8b", "--framework", "verl", "--job", "rl", "--num-gpus", "8", "--gpu", "h100",
                 "--samples-per-prompt", "1", "--top-k", "1"]) == 0
    assert "RL008 (warning): samples_per_prompt=1 with GRPO" in " ".join(capsys.readouterr().out.split())
    answer = tools.recommend_parallelism(**ONE, top_k=1)
    assert _said(answer.warnings)
