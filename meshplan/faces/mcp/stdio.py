"""The stdio transport, plus the JSON-RPC error replies the SDK leaves out.

mcp 2.3.0 reads stdin line by line and drops a line that is not JSON or not a JSON-RPC message
(logged at debug level, no reply). A client that sent it then waits for an answer that never
comes. JSON-RPC 2.0 says such a line gets an error with `id: null`: -32700 when it is not JSON,
-32600 when it is JSON but not a valid message (keeping its `id` when one can be read). This module
sits between the SDK's stdio streams and its server loop and writes those replies; everything
else passes through untouched, and the server keeps serving the next line. It also keeps stray
prints off the wire (see serve_stdio).

A request whose `id` is an object, an array, a boolean, a fraction or null is not a request either (MCP:
"a string or integer ID", never null), but the SDK reads it as a notification, because a notification is
anything with a `method` and its `id` is dropped, and answers nothing. Such lines are answered here, before
the SDK sees them, with -32600 and `id: null` (the id cannot be echoed back: it is not a valid id).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _UnownedTextWrapper, stdio_server
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


def invalid_id_reply(line: str) -> JSONRPCError | None:
    """The -32600 reply for a request whose `id` is present but not a string or an integer; None otherwise.

    Only lines that mention `"id"` are parsed here; every other line (and anything that is not a JSON
    object) is left to the SDK, which parses each line anyway.
    """
    if '"id"' not in line:
        return None
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # the SDK's own parse answers -32700 or -32600 for these
        return None
    return invalid_id_error(data)


def invalid_id_error(data: object) -> JSONRPCError | None:
    """`invalid_id_reply` for a message already parsed from JSON (the HTTP transport reads whole bodies)."""
    if not isinstance(data, dict) or "id" not in data or "method" not in data:
        return None  # not a request; a response with `id: null` is legal (JSON-RPC) and gets no reply
    rid = data["id"]
    if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
        return None
    kinds = {bool: "a boolean", float: "a fraction", list: "an array", dict: "an object"}
    kind = "null" if rid is None else kinds.get(type(rid), type(rid).__name__)
    message = f"Invalid Request: id must be a string or an integer, got {kind}"
    return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message))


class _Lines:
    """The stdin lines the SDK gets: all of them, less those with an invalid id, which are answered here."""

    def __init__(self, source: Any):
        self.source = aiter(source)
        self.wire: Any = None  # the transport's write stream, which exists only once stdio_server has started
        self.attached = anyio.Event()

    def attach(self, write_stream: Any) -> None:
        self.wire = write_stream
        self.attached.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await anext(self.source)
            reply = invalid_id_reply(line)
            if reply is None:
                return line
            await self.attached.wait()
            # Answered before the next line is read, so before the end of input closes the wire.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self.wire.send(SessionMessage(reply))


@contextlib.contextmanager
def _stdin() -> Iterator[Any]:
    """stdin as the SDK's stdio_server claims it (fd 0 pointed at the null device while serving, so neither
    the tools nor a child process can read the wire), for a transport that reads the lines itself."""
    buffer, release = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
    try:
        yield anyio.wrap_file(_UnownedTextWrapper(buffer, encoding="utf-8", errors="replace"))
    finally:
        if release is not None:
            release()


async def serve_stdio(server: MCPServer[Any]) -> None:
    """Like `MCPServer.run_stdio_async`, but every unreadable line is answered instead of dropped."""
    lowlevel = server._lowlevel_server  # the object run_stdio_async itself drives; mcp is pinned <3
    # The SDK points file descriptor 1 at stderr while it serves, but `sys.stdout` is block-buffered
    # on a pipe: a stray print would sit in its buffer and reach the real stdout when the descriptor is
    # restored at exit. Pointing `sys.stdout` itself at stderr sends it there at once.
    with _stdin() as stdin:
        lines = _Lines(stdin)
        async with stdio_server(stdin=lines) as (read_stream, write_stream):
            lines.attach(write_stream)
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
