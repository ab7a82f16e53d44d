"""The stdio transport, plus the JSON-RPC error replies the SDK leaves out.

mcp 2.3.0 reads stdin line by line and drops a line that is not JSON or not a JSON-RPC message
(logged at debug level, no reply). A client that sent it then waits for an answer that never
comes. JSON-RPC 2.0 says such a line gets an error with `id: null`: -32700 when it is not JSON,
-32600 when it is JSON but not a valid message (keeping its `id` when one can be read). This module
sits between the SDK's stdio streams and its server loop and writes those replies; everything
else passes through untouched, and the server keeps serving the next line. It also keeps stray
prints off the wire (see serve_stdio).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError


def _request_id(exc: Exception) -> int | str | None:
    """The `id` of a line that parsed as JSON but is not a valid message, when it has a usable one."""
    if not isinstance(exc, ValidationError):
        return None
    for err in exc.errors():
        data = err.get("input")
        if isinstance(data, dict) and isinstance(data.get("id"), int | str) and not isinstance(data["id"], bool):
            return data["id"]
    return None


def error_reply(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error for a line the transport could not turn into a message."""
    if isinstance(exc, ValidationError) and any(e["type"] == "json_invalid" for e in exc.errors()):
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error: not JSON"))
    detail = ""
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "message"
        detail = f": {where}: {first['msg']}"
    message = f"Invalid Request: not a JSON-RPC 2.0 request, notification or response{detail}"
    return JSONRPCError(jsonrpc="2.0", id=_request_id(exc), error=ErrorData(code=INVALID_REQUEST, message=message))


async def serve_stdio(server: MCPServer[Any]) -> None:
    """Like `MCPServer.run_stdio_async`, but every unreadable line is answered instead of dropped."""
    lowlevel = server._lowlevel_server  # the object run_stdio_async itself drives; mcp is pinned <3
    # The SDK points file descriptor 1 at stderr while it serves, but `sys.stdout` is block-buffered
    # on a pipe: a stray print would sit in its buffer and reach the real stdout when the descriptor is
    # restored at exit. Pointing `sys.stdout` itself at stderr sends it there at once.
    async with stdio_server() as (read_stream, write_stream):
        forward, messages = create_context_streams[SessionMessage | Exception](0)

        async def pump() -> None:
            async with forward:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        await write_stream.send(SessionMessage(error_reply(item)))
                    else:
                        await forward.send(item)

        with contextlib.redirect_stdout(sys.stderr):
            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                await lowlevel.run(messages, write_stream, lowlevel.create_initialization_options())
