"""A plan meshplan answers with, passed back whole, is checked as the layout it is: no warning that a setting it
states has no effect. recommend's first Llama-3.1-70B plan on 64 H100 states moe_token_dispatcher=alltoall and
cp_comm_type=p2p (every Plan does: the dispatcher of a dense model, the CP exchange at cp 1); passed back to
check_config they read as given and unread, and EP011 (a dispatcher given for a dense model) and CP008 (a CP type
given at cp 1) warned of them on every framework and face. The plan's own values are what leaving the fields out
runs: CP008 warns of a type other than the default alone, and EP011 is retired (rules card)."""

from __future__ import annotations

import json

import pytest
from mcp_calls import call_tool

from meshplan import api
from meshplan.faces import cli
from meshplan.rules.engine import rule_specs
from meshplan.schema.plan import Plan
from meshplan.schema.request import Request

JOB = {"model": "llama-3.1-70b", "gpu": "h100", "num_gpus": 64}
NO_EFFECT = frozenset(spec.id for spec in rule_specs().values() if spec.no_effect)


def passed_back(plan: dict, framework: str) -> dict:
    """The request of a plan passed back whole: the job's fields and every plan field the request takes."""
    return {**JOB, "framework": framework,
            **{k: v for k, v in plan.items() if k in Request.model_fields and k in Plan.model_fields and v is not None}}


def _ids(findings: list) -> set[str]:
    return {f["id"] if isinstance(f, dict) else f.id for f in findings}


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-bridge", "torchtitan", "verl"])
def test_recommends_plan_passed_back_to_the_api_warns_of_nothing_it_states(framework):
    rec = api.recommend(Request(**JOB, framework=framework), top_k=1)
    plan = rec.candidates[0].plan
    assert plan.moe_token_dispatcher == "alltoall" and (plan.cp > 1 or plan.cp_comm_type == "p2p")
    fields = passed_back(plan.model_dump(), framework)
    assert {"moe_token_dispatcher", "cp_comm_type"} <= fields.keys()
    report = api.check_config(Request(**fields))
    assert not _ids(report.findings) & NO_EFFECT, [f.id for f in report.findings]
    assert report.plan == plan  # the same layout, read back


def _argv(fields: dict) -> list[str]:
    """The CLI's flags for a request's fields (lists spread, booleans as true/false; an empty list, cuda_graph_modules
    without graphs, has no flag form: left out, which is the same)."""
    argv = [fields["model"]]
    for key, value in fields.items():
        if key == "model" or value == []:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan"])
def test_the_plan_passed_back_on_the_cli_and_the_mcp_tool(capsys, framework):
    """recommend's plan as the MCP tool and the CLI's --json give it, passed back whole to their check."""
    tool = call_tool("recommend_parallelism", {**JOB, "framework": framework, "top_k": 1}).structured_content
    fields = passed_back(tool["candidates"][0]["plan"], framework)
    checked = call_tool("check_config", fields).structured_content
    assert not _ids(checked["findings"]) & NO_EFFECT, checked["findings"]
    assert cli.main(["recommend", *_argv({**JOB, "framework": framework}), "--top-k", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["candidates"][0]["plan"]
    assert cli.main(["check", *_argv(passed_back(plan, framework)), "--json"]) in (0, 1)
    said = json.loads(capsys.readouterr().out)
    assert not _ids(said["findings"]) & NO_EFFECT, said["findings"]
    assert _ids(said["findings"]) == _ids(checked["findings"])


def test_a_cp_type_other_than_the_default_at_cp_1_still_warns():
    """CP008 fires on a type the user chose at cp 1, not on the one every plan states there."""
    base = {**JOB, "model": "llama-3.1-8b", "num_gpus": 8}
    assert "CP008" in _ids(api.check_config(Request(**base, cp_comm_type="a2a")).findings)
    assert "CP008" not in _ids(api.check_config(Request(**base, cp_comm_type="p2p")).findings)
