"""The skill's evals: every question in skills/parallelism-strategies/evals/evals.json is answered through
meshplan.api (the functions the MCP tools call) and its ground truth is checked.

Ground truths are stable facts or checkable properties (a rule id fires, the top layout fits with tp <= 8),
not exact estimator outputs, so they hold while the estimators are recalibrated.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from meshplan import api
from meshplan.schema.request import Request

EVALS = Path(__file__).resolve().parents[1] / "skills" / "parallelism-strategies" / "evals" / "evals.json"
TOOLS = {"recommend_parallelism", "check_config", "estimate_memory", "estimate_throughput", "render_config",
         "describe_model", "list_models"}


def load_evals() -> list[dict]:
    return json.loads(EVALS.read_text(encoding="utf-8"))


def call_tool(tool: str, arguments: dict) -> Any:
    """The answer the MCP tool of that name would compute, as JSON-like data."""
    args = dict(arguments)
    if tool == "describe_model":
        result = api.describe_model(args["model"])
    elif tool == "list_models":
        result = api.list_models()
    elif tool == "recommend_parallelism":
        top_k = args.pop("top_k", 5)
        result = api.recommend(Request(**args), top_k=top_k)
    elif tool == "render_config":
        framework = args.pop("framework")
        options = {k: args.pop(k) for k in ("variant", "version") if k in args}
        result = api.render_config(framework, Request(**args), **options)
    else:
        result = getattr(api, tool)(Request(**args))
    return _plain(result)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def resolve_path(data: Any, path: str) -> Any:
    """Dotted path with integer indices; `[*].key` maps over a list."""
    if not path:
        return data
    if path.startswith("[*]."):
        return [resolve_path(item, path[4:]) for item in data]
    for part in path.split("."):
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def check(result: Any, spec: dict) -> None:
    op, expected = spec["op"], spec.get("value")
    got = resolve_path(result, spec["path"])
    where = f"{spec['path']} {op} {expected!r} (got {got!r:.300})"
    if op == "==":
        assert got == expected, where
    elif op in ("<=", ">=", "<", ">"):
        assert {"<=": got <= expected, ">=": got >= expected, "<": got < expected, ">": got > expected}[op], where
    elif op == "between":
        assert expected[0] <= got <= expected[1], where
    elif op == "len==":
        assert len(got) == expected, where
    elif op == "len>=":
        assert len(got) >= expected, where
    elif op == "divides":
        assert expected % got == 0, where
    elif op == "contains":
        assert expected in got, where
    elif op == "icontains":
        assert expected.lower() in got.lower(), where
    elif op == "not_contains":
        assert expected not in got, where
    elif op == "contains_any":
        assert any(e in got for e in expected), where
    elif op == "has_id":
        assert expected in {f["id"] for f in got}, where
    elif op == "lacks_id":
        assert expected not in {f["id"] for f in got}, where
    elif op == "ratio_between":
        ratio = got / resolve_path(result, spec["denominator"])
        assert expected[0] <= ratio <= expected[1], f"{where}; ratio {ratio:.3f}"
    else:
        raise AssertionError(f"unknown check op {op!r}")


@cache
def _answer(index: int) -> Any:
    item = load_evals()[index]
    return call_tool(item["tool"], item["arguments"])


def test_evals_are_well_formed():
    items = load_evals()
    assert len(items) >= 30
    ids = [e["id"] for e in items]
    assert len(ids) == len(set(ids)), "duplicate eval ids"
    for e in items:
        assert set(e) == {"id", "question", "expected_skill", "tool", "arguments", "ground_truth", "checks",
                          "expected_behavior"}, e["id"]
        assert e["tool"] in TOOLS, e["id"]
        assert e["expected_skill"] == "parallelism-strategies"
        assert e["checks"] and e["ground_truth"].strip() and e["question"].strip()
    assert {e["tool"] for e in items} == TOOLS, "every MCP tool answers at least one eval"


@pytest.mark.parametrize("index", range(len(load_evals())), ids=[e["id"] for e in load_evals()])
def test_eval_ground_truth(index):
    item = load_evals()[index]
    result = _answer(index)
    for spec in item["checks"]:
        check(result, spec)


def test_check_ops_can_fail():
    """The checker itself rejects wrong answers (a checker that always passes would hide every regression)."""
    result = {"ok": True, "findings": [{"id": "TP001"}], "plan": {"tp": 3}, "a": 1.0, "b": 4.0, "text": "x"}
    failing = [
        {"path": "ok", "op": "==", "value": False},
        {"path": "findings", "op": "has_id", "value": "WS002"},
        {"path": "findings", "op": "lacks_id", "value": "TP001"},
        {"path": "plan.tp", "op": "divides", "value": 64},
        {"path": "plan.tp", "op": "<=", "value": 2},
        {"path": "a", "op": "ratio_between", "value": [0.5, 1.0], "denominator": "b"},
        {"path": "text", "op": "contains_any", "value": ["y", "z"]},
    ]
    for spec in failing:
        with pytest.raises(AssertionError):
            check(result, spec)
