"""The tools' output schemas, generated in one pass over every result model.

The SDK derives each tool's output schema on its own (`TypeAdapter(model).json_schema()` per tool), so the models
the reports share (Plan, MemorySummary, ThroughputReport, ...) are walked again for every tool that nests them:
that was a third of the server's start-up. Here one pydantic generator walks each model once, and each tool's
schema is cut from the shared definitions: its root model's definition plus the definitions it reaches, sorted
as pydantic sorts a schema it generates, so the JSON is the SDK's own key for key (the tool list is compared with
the SDK's in tests/test_mcp_protocol_edges.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Annotated, Any, get_args, get_origin

from mcp.server.mcpserver.utilities.func_metadata import StrictJsonSchema
from mcp.types import CallToolResult
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_LOCAL = "#/$defs/"


def result_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    """The meshplan model a tool's structured output is checked against, read from its return annotation as the
    SDK reads it (`Model`, or `Annotated[CallToolResult, Model]`); None for any other annotation, which is left
    to the SDK to derive."""
    returns = inspect.signature(fn, eval_str=True).return_annotation
    if get_origin(returns) is Annotated:
        base, *extra = get_args(returns)
        returns = extra[0] if base is CallToolResult and len(extra) == 1 else None
    ours = isinstance(returns, type) and issubclass(returns, BaseModel) and returns.__module__.startswith("meshplan.")
    return returns if ours else None


def _references(value: Any, found: set[str]) -> set[str]:
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith(_LOCAL):
            found.add(ref[len(_LOCAL):])
        for item in value.values():
            _references(item, found)
    elif isinstance(value, list):
        for item in value:
            _references(item, found)
    return found


def _reached(name: str, definitions: dict[str, Any]) -> set[str]:
    """The definitions `name`'s own definition reaches, directly or through others."""
    seen: set[str] = set()
    todo = _references(definitions[name], set())
    while todo:
        ref = todo.pop()
        if ref not in seen:
            seen.add(ref)
            todo |= _references(definitions[ref], set())
    return seen


def output_schemas(models: Sequence[type[BaseModel]]) -> dict[type[BaseModel], dict[str, Any]]:
    """Each model's output schema, as `TypeAdapter(model).json_schema(schema_generator=StrictJsonSchema)` gives it.

    A model whose schema is not a plain definition, or that reaches itself (pydantic keeps such a root as a `$ref`,
    which the SDK rewrites), is left out: its tool's schema is the SDK's to derive.
    """
    roots, shared = models_json_schema([(model, "validation") for model in models], schema_generator=StrictJsonSchema)
    definitions = shared.get("$defs", {})
    sorter = StrictJsonSchema(by_alias=True)  # pydantic's key order: alphabetical but in `properties` and `default`
    schemas = {}
    for model in models:
        root = roots[(model, "validation")]
        if list(root) != ["$ref"]:
            continue
        name = root["$ref"].removeprefix(_LOCAL)
        reached = _reached(name, definitions)
        if name in reached:
            continue
        schema = dict(definitions[name])
        if reached:
            schema["$defs"] = {ref: definitions[ref] for ref in reached}
        schemas[model] = sorter.sort(schema)
    return schemas
