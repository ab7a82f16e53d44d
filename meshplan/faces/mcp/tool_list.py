"""The ten tools in the order tools/list names them, and what tools/list publishes for them, built the SDK's way.

`published_tools()` is the content of tool_schemas.json, the file the server lists its tools from at start-up
(deferred.py): each tool built with `Tool.from_function` on its own (its argument model, input schema and output
schema derived by the SDK, tools.sdk_tool), so the file is the SDK's answer for these functions. `meshplan docs`
rewrites the file and `meshplan docs --check` fails when it is stale (faces/docs.py), as does
tests/test_mcp_protocol_edges.py, which compares the server's wire with a server built by sdk_tool alone.
`real_tool` builds one tool for its first call, with the output schema the file publishes.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult
from pydantic import BaseModel

from .compare_tool import COMPARE_TOOL
from .report_tool import REPORT_TOOL
from .tools import TOOLS, ToolSpec, sdk_tool

SPECS: list[ToolSpec] = [*TOOLS, REPORT_TOOL, COMPARE_TOOL]


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


def listed(tool: Tool) -> dict[str, Any]:
    """What tools/list sends for `tool`, as JSON values (MCPServer.list_tools reads these fields)."""
    annotations = tool.annotations.model_dump(mode="json", by_alias=True, exclude_unset=True) \
        if tool.annotations is not None else None
    return {"name": tool.name, "title": tool.title, "description": tool.description, "inputSchema": tool.parameters,
            "outputSchema": tool.output_schema, "annotations": annotations}


def published_tools() -> list[dict[str, Any]]:
    """Every tool as tools/list publishes it, each built by the SDK from its function alone."""
    return [listed(sdk_tool(*spec)) for spec in SPECS]


def published_text() -> str:
    """tool_schemas.json's text: deterministic, so a stale file shows as a difference."""
    return json.dumps(published_tools(), indent=1, ensure_ascii=False) + "\n"


def real_tool(name: str, output_schema: dict[str, Any] | None) -> Tool:
    """The tool `name` as the SDK builds it (cancellable, its arguments checked as sent), its output schema the one
    published: the same the SDK derives from its result model (the file is checked against that), not derived again."""
    fn, title, description = next(spec for spec in SPECS if spec[0].__name__ == name)
    model = result_model(fn)
    output = (model, output_schema) if model is not None and output_schema is not None else None
    return sdk_tool(fn, title, description, output)
