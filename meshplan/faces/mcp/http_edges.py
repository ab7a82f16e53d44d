"""The streamable HTTP transport's edges the SDK leaves open: a request whose id is not a string or an integer,
and a client that hangs up in the middle of a tool call.

mcp 2.3.0's handshake-era HTTP transport reads such a POST as a notification (a notification is anything
with a `method`; the bad `id` is dropped) and answers `202 Accepted` with no body, so the client waits for
a reply that never comes. Over stdio the same message gets -32600 with `id: null` (stdio.py); this ASGI
wrapper gives HTTP the same reply, built by the same function, with the status the SDK itself uses for an
Invalid Request (400: MCP streamable HTTP, "If the server cannot accept the input, it MUST return an HTTP
error status code (e.g., 400 Bad Request)", with a JSON-RPC error that has no id).

Only a POST to the MCP endpoint that passes the SDK's own Host/Origin/Content-Type checks is looked at; its
body is read (up to the SDK's body limit) and handed on unchanged when it is anything else, so the app sees
exactly the bytes the client sent.

A client that closes its connection while a tool call runs is a cancellation: the handshake-era transport runs
the call in the session, apart from the connection, so without this the call computes to its bound for nobody.
When the client's side of a `tools/call` POST ends before its response has, this wrapper hands the session a
`notifications/cancelled` for that request id, the message a client sends when it cancels, so the call stops
at its next checkpoint (cancellable.py).
"""

from __future__ import annotations

import json

import anyio
import pydantic_core
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
from mcp.types import JSONRPCError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .stdio import invalid_id_error

JSON = "application/json"


def invalid_id_body_reply(body: bytes) -> JSONRPCError | None:
    """The -32600 reply for a POST body holding a request (or, in a batch, any request) with an invalid id.

    Bodies that never mention `"id"`, are not JSON or nest too deeply are left to the SDK, which answers
    those itself; so is a batch whose ids are all valid.
    """
    if b'"id"' not in body:
        return None
    try:
        data = pydantic_core.from_json(body)
    except ValueError:  # not JSON, or nested past the parser's limit: the SDK's parse error answers it
        return None
    messages = data if isinstance(data, list) else [data]
    return next((reply for m in messages if (reply := invalid_id_error(m)) is not None), None)


# The requests whose work a hang-up cancels: tool calls compute; the rest answer at once.
WATCHED_METHODS = ("tools/call",)
SESSION_HEADER = b"mcp-session-id"
HUNG_UP = "the HTTP client closed the connection"


def watched_request_id(body: bytes) -> int | str | None:
    """The id of a single JSON-RPC request whose work a hang-up should cancel (a tool call), else None."""
    if b'"id"' not in body:
        return None
    try:
        data = pydantic_core.from_json(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("method") not in WATCHED_METHODS:
        return None
    req_id = data.get("id")
    return req_id if isinstance(req_id, (int, str)) and not isinstance(req_id, bool) else None


def cancel_message(scope: Scope, request_id: int | str) -> tuple[Scope, bytes]:
    """A POST in the same session (same Host, Origin and session headers) carrying `notifications/cancelled`."""
    body = json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled",
                       "params": {"requestId": request_id, "reason": HUNG_UP}}).encode()
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"content-type")]
    headers += [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]
    return {**scope, "headers": headers}, body


class InvalidIdGuard:
    """ASGI wrapper around the streamable HTTP app: answers invalid-id requests, passes everything else on."""

    def __init__(self, app: ASGIApp, security: TransportSecuritySettings | None, path: str = "/mcp",
                 max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE):
        self.app = app
        self.security = TransportSecurityMiddleware(security)
        self.path = path.rstrip("/")
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        read, body = await self._read_body(scope, receive)
        pending = list(read)

        async def replay() -> Message:
            """The messages already read, in order, then the client's own stream."""
            return pending.pop(0) if pending else await receive()

        reply = invalid_id_body_reply(body) if body is not None else None
        if reply is None or await self.security.validate_request(Request(scope), is_post=True) is not None:
            watched = watched_request_id(body) if body is not None else None
            if watched is not None and any(k == SESSION_HEADER for k, _ in scope["headers"]):
                await self._cancel_on_hang_up(scope, replay, send, watched)
            else:
                await self.app(scope, replay, send)  # a refused Host/Origin/Content-Type is the SDK's to answer
            return
        content = reply.model_dump_json(by_alias=True, exclude_unset=True)
        status = ERROR_CODE_HTTP_STATUS[reply.error.code]
        await Response(content, status_code=status, media_type=JSON)(scope, replay, send)

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[list[Message], bytes | None]:
        """The ASGI messages read and the whole body, or None for the body when it is over the limit or cut
        short (then only what was read so far is returned, for the app to read on from)."""
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return [], None
        read: list[Message] = []
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                return read, None
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body:
                return read, None
            if not message.get("more_body", False):
                return read, b"".join(chunks)

    async def _cancel_on_hang_up(self, scope: Scope, receive: Receive, send: Send, request_id: int | str) -> None:
        """Run the app on a tool call's POST; if the client hangs up before the response ends, cancel the call.

        The client's messages are relayed to the app by a task of ours, so the hang-up (`http.disconnect`) is seen
        whether or not the app itself listens for it (SSE and JSON responses alike).
        """
        answered = False
        to_app, from_client = anyio.create_memory_object_stream[Message](16)

        async def sending(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        async def relay() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" and not answered:
                    with anyio.CancelScope(shield=True):  # the call is cancelled before the app hears of it
                        await self._post_cancel(scope, request_id)
                await to_app.send(message)
                if message["type"] == "http.disconnect":
                    return

        async with to_app, from_client, anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await self.app(scope, from_client.receive, sending)
            tg.cancel_scope.cancel()  # the app is done: nothing left to relay

    async def _post_cancel(self, scope: Scope, request_id: int | str) -> None:
        """Hand the session a `notifications/cancelled` for `request_id` (its reply, a 202, goes nowhere)."""
        cancel_scope, body = cancel_message(scope, request_id)
        sent = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> Message:
            return sent.pop() if sent else {"type": "http.disconnect"}

        async def discard(message: Message) -> None:
            return None

        await self.app(cancel_scope, receive, discard)
