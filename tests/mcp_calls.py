"""One way for a test to ask the MCP server's tools in process (fastmcp's Client over the app, as an agent would):
the faces-agree checks call it instead of each carrying its own client, event loop and anyio fixture."""

from __future__ import annotations

import anyio
from mcp import Client


def call_tools(*calls: tuple[str, dict]) -> list:
    """Each (tool, arguments) called in order on one client; their CallToolResults (an error is a result whose
    is_error is set, not an exception)."""
    from meshplan.faces.mcp.server import app  # the server loads with the first call, not at collection

    async def run() -> list:
        async with Client(app) as client:
            return [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(run)


def call_tool(name: str, arguments: dict):
    """One tool's CallToolResult."""
    return call_tools((name, arguments))[0]
