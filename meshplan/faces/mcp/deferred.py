"""The tools listed from tool_schemas.json at start-up and each built on its first call.

A host launches the server and waits for its tool list. Building the ten tools the SDK's way (an argument model per
tool, the input schemas, the output schemas from the result models, which import every report model) was most of
meshplan's share of that wait. The list is the same JSON every time, so it is generated once (tool_list.py,
`meshplan docs`, checked by `meshplan docs --check` and the tests) and read here; the first call of a tool builds the
real one (tool_list.real_tool: arguments checked as sent, cancellable, its result validated against its model) and
every call runs through it, so a call behaves exactly as it did when every tool was built at start-up.
"""

from __future__ import annotations

import json
import threading
from importlib import resources
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.types import ToolAnnotations
from pydantic import PrivateAttr

if TYPE_CHECKING:
    from mcp.server.mcpserver.context import Context

SCHEMA_FILE = "tool_schemas.json"

_BUILDING = threading.Lock()  # two first calls at once (HTTP, or threads) build a tool once


def _never_called(**_: Any) -> None:
    raise RuntimeError("a deferred tool runs through the tool it builds (DeferredTool.run)")


class DeferredTool(Tool):
    """A tool as tools/list publishes it, its name, schemas and annotations from the file; the SDK's tool is built on
    the first call and runs every call. Nothing but `run` reads a tool's function or argument model (MCPServer lists
    `parameters` and `output_schema`, and the HTTP transport's header check reads `parameters`)."""

    _real: Tool | None = PrivateAttr(default=None)

    def real(self) -> Tool:
        """The SDK's tool for this name, built once."""
        if self._real is None:
            with _BUILDING:
                if self._real is None:
                    from . import tool_list  # the tools' functions, their arguments and result models

                    self._real = tool_list.real_tool(self.name, self.output_schema)
        return self._real

    async def run(self, arguments: dict[str, Any], context: Context[Any, Any], convert_result: bool = False) -> Any:
        return await self.real().run(arguments, context, convert_result=convert_result)


def published() -> list[dict[str, Any]]:
    """The tools as tool_schemas.json publishes them, in tools/list's order."""
    return json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8"))


def deferred_tools() -> list[Tool]:
    """Every tool of the file, listed as published and built on its first call."""
    tools: list[Tool] = []
    for entry in published():
        annotations = entry["annotations"]
        tools.append(DeferredTool(
            fn=_never_called, name=entry["name"], title=entry["title"], description=entry["description"],
            parameters=entry["inputSchema"], is_async=True,
            fn_metadata=FuncMetadata(arg_model=ArgModelBase, output_schema=entry["outputSchema"]),
            annotations=None if annotations is None else ToolAnnotations.model_validate(annotations)))
    return tools
