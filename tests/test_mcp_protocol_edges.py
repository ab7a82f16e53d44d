"""The MCP server at the edges of the protocol: invalid ids, prompt and resource error codes, a quiet stderr
for user errors (but not for crashes), and cancelled calls that stop computing (issue 12).

JSON-RPC 2.0 and MCP: a request's id is a string or an integer, never null; a message whose id is anything
else is an Invalid Request (-32600, `id: null`); a notification (no id) is never answered. An unknown prompt,
a missing or unknown prompt argument and an unknown resource are Invalid params (-32602; for resources
SEP-2164 retired -32002); a crash is an Internal error (-32603).
"""

from __future__ import annotations

import inspect
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.server import MCPServer
from test_mcp_transports import INIT, MEMORY_ARGS, SERVER, RawServer, call
from tree_under_test import tree_env

from meshplan.core import cancel
from meshplan.core.errors import Cancelled, MeshplanError
from meshplan.faces.mcp import cancellable as cancellable_module
from meshplan.faces.mcp.cancellable import cancellable, run_cancellable
from meshplan.faces.mcp.compare_tool import COMPARE_TOOL
from meshplan.faces.mcp.http_edges import InvalidIdGuard
from meshplan.faces.mcp.prompts import PROMPTS, check_prompt_call
from meshplan.faces.mcp.report_tool import REPORT_TOOL
from meshplan.faces.mcp.server import app
from meshplan.faces.mcp.stdio import invalid_id_reply
from meshplan.faces.mcp.tools import READ_ONLY, TOOLS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def raw(tmp_path):
    server = RawServer(SERVER, tmp_path, env=tree_env({}))
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


def request(req_id: object, method: str = "tools/list", params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": req_id, "method": method, **({"params": params} if params is not None else {})}


# --------------------------------------------------------------------------- ids


def test_ids_that_are_not_strings_or_integers_get_invalid_request_with_a_null_id(raw):
    raw.initialize()
    for bad, kind in [({"a": 1}, "an object"), ([1], "an array"), (True, "a boolean"), (False, "a boolean"),
                      (None, "null"), (1.5, "a fraction"), (2.0, "a fraction")]:
        reply = raw.ask(request(bad))
        assert reply == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": f"Invalid Request: id must be a string or an integer, got {kind}"}}, bad
    deep = raw.ask('{"jsonrpc": "2.0", "method": "ping", "id": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert deep["id"] is None and deep["error"]["code"] in (-32700, -32600)
    # Valid ids still work, and the server kept serving after every bad line.
    assert raw.ask(request("a-string"))["id"] == "a-string"
    assert raw.ask(request(7))["id"] == 7
    assert raw.ask(request(2**70, "ping"))["id"] == 2**70
    assert raw.close() == 0


def test_notifications_and_null_id_error_responses_get_no_reply(raw):
    raw.initialize()
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}})
    raw.send({"jsonrpc": "2.0", "method": "tools/list"})  # no id: a notification, however odd
    # A client's error response for a line of ours it could not read: a response, so never answered.
    raw.send({"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}})
    # The next line on stdout answers the ping: nothing was written for the three lines before it.
    assert raw.ask(request(5, "ping")) == {"jsonrpc": "2.0", "id": 5, "result": {}}
    assert raw.close() == 0


def test_invalid_id_reply_reads_only_requests():
    assert invalid_id_reply('{"jsonrpc": "2.0", "id": 3, "method": "ping"}') is None
    assert invalid_id_reply('{"jsonrpc": "2.0", "id": "3", "method": "ping"}') is None
    assert invalid_id_reply('{"jsonrpc": "2.0", "method": "notifications/initialized"}') is None
    assert invalid_id_reply('{"jsonrpc": "2.0", "id": null, "error": {"code": 1, "message": "x"}}') is None
    assert invalid_id_reply('{"jsonrpc": "2.0", "id": ') is None  # not JSON: the parse error is the SDK's
    assert invalid_id_reply('{"id": ' + "[" * 100_000) is None  # nor a stack overflow here
    reply = invalid_id_reply('{"jsonrpc": "2.0", "id": {"nested": [1]}, "method": "tools/call"}')
    assert reply is not None and reply.id is None and reply.error.code == -32600


BAD_IDS = [({"a": 1}, "an object"), ([1], "an array"), (True, "a boolean"), (None, "null"), (1.5, "a fraction")]
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def post(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={**HEADERS, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def sse_data(text: str) -> dict:
    """The one JSON-RPC message of an SSE reply (the SDK answers a POSTed request as an event stream)."""
    return json.loads(next(line[5:] for line in text.splitlines() if line.startswith("data:")))


def test_ids_that_are_not_strings_or_integers_get_invalid_request_over_http(http_server):
    status, headers, _ = post(http_server, INIT)
    assert status == 200
    session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    assert post(http_server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)[0] == 202
    for bad, kind in BAD_IDS:
        status, _, text = post(http_server, request(bad, "ping"), session)
        assert (status, json.loads(text)) == (400, {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": f"Invalid Request: id must be a string or an integer, got {kind}"}}), bad
    # In a batch too (the SDK refuses batches anyway, but a bad id is named, as on stdio).
    status, _, text = post(http_server, [request(7, "ping"), request(False, "ping")], session)
    assert status == 400 and json.loads(text)["error"]["code"] == -32600 and "a boolean" in text
    # The same answer at the stateless 2026 protocol version, with no session at all.
    status, _, text = post(http_server, request(None, "ping"), {"mcp-protocol-version": "2026-07-28"})
    assert status == 400 and json.loads(text)["error"]["code"] == -32600
    # Valid ids, notifications and responses still reach the server, which kept serving.
    for good in ("a-string", 7, 2**70):
        status, _, text = post(http_server, request(good, "ping"), session)
        assert status == 200 and sse_data(text) == {"jsonrpc": "2.0", "id": good, "result": {}}
    status, _, text = post(http_server, call(8, "estimate_memory", MEMORY_ARGS), session)
    assert status == 200 and sse_data(text)["result"]["structuredContent"]["plan"]["tp"] == 2
    assert post(http_server, {"jsonrpc": "2.0", "method": "tools/list"}, session)[0] == 202  # no id: a notification
    assert post(http_server, {"jsonrpc": "2.0", "id": None, "error": {"code": 1, "message": "x"}}, session)[0] == 202
    # The SDK's own checks still come first: a foreign Host is refused, not answered.
    port = http_server.split(":")[2].split("/")[0]
    assert post(http_server, request(None, "ping"), {"Host": f"attacker.example:{port}"})[0] == 421


def echo_app(seen: list[bytes]):
    """An ASGI app that records the body it read and answers 200 with it."""

    async def app(scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        seen.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


async def guarded(chunks: list[bytes], path: str = "/mcp", max_body: int = 1 << 20) -> tuple[int, bytes, list[bytes]]:
    """POST CHUNKS (one ASGI message each) through InvalidIdGuard around echo_app: status, reply body, app saw."""
    seen: list[bytes] = []
    guard = InvalidIdGuard(echo_app(seen), None, max_body=max_body)
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-type", b"application/json")],
             "query_string": b"", "root_path": ""}
    await guard(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), seen


async def test_the_http_guard_hands_the_body_on_byte_for_byte():
    body = json.dumps(request(3, "tools/call", {"name": "x", "arguments": {"id": None}})).encode()
    thirds = [body[: len(body) // 3], body[len(body) // 3: 2 * len(body) // 3], body[2 * len(body) // 3:]]
    assert await guarded(thirds) == (200, body, [body])
    bad = json.dumps(request(None, "ping")).encode()
    status, reply, seen = await guarded([bad[:10], bad[10:]])
    assert status == 400 and json.loads(reply)["error"]["code"] == -32600 and seen == []  # the app never saw it
    # Over the size limit, on another path, or not JSON: the app gets it as sent, to answer itself.
    assert await guarded([bad[:10], bad[10:]], max_body=20) == (200, bad, [bad])
    assert await guarded([bad], path="/other") == (200, bad, [bad])
    deep = b'{"id": ' + b"[" * 100_000
    assert await guarded([deep]) == (200, deep, [deep])


# --------------------------------------------------------------------------- prompt and resource error codes


@pytest.fixture
async def client():
    async with Client(app) as c:
        yield c


@pytest.mark.parametrize(("name", "arguments", "message"), [
    ("plan_paralelism", {"model": "x", "gpus": "8"},
     "Unknown prompt 'plan_paralelism' (did you mean 'plan_parallelism'?); the prompts are: plan_parallelism, "
     "debug_oom."),
    ("plan_parallelism", {"model": "x"},
     "Missing required argument gpus: plan_parallelism takes model, gpus, framework, gpu (model and gpus required)."),
    ("debug_oom", {},
     "Missing required arguments model, gpus: debug_oom takes model, gpus, framework, layout, error, gpu "
     "(model and gpus required)."),
    ("debug_oom", {"model": "x", "gpus": "8", "gpu_type": "h100"},
     "Unknown argument 'gpu_type' (did you mean 'gpu' or 'gpus'?): debug_oom takes model, gpus, framework, layout, "
     "error, gpu (model and gpus required)."),
])
async def test_prompt_errors_are_invalid_params_that_name_what_is_allowed(client, name, arguments, message):
    with pytest.raises(MCPError) as exc:
        await client.get_prompt(name, arguments)
    assert (exc.value.error.code, exc.value.error.message) == (-32602, message)


async def test_prompt_checks_follow_the_prompts_the_server_lists():
    prompts = await app.list_prompts()
    assert {p.name for p in prompts} == {fn.__name__ for fn, _, _ in PROMPTS}
    for prompt in prompts:
        required = {a.name: "1" for a in prompt.arguments if a.required}
        check_prompt_call({"name": prompt.name, "arguments": required}, prompts)  # enough: no error
        check_prompt_call({"name": prompt.name, "arguments": {a.name: "1" for a in prompt.arguments}}, prompts)
        with pytest.raises(MCPError):
            check_prompt_call({"name": prompt.name, "arguments": {}}, prompts)
    check_prompt_call({"name": 5}, prompts)  # malformed params are left to the SDK's validation
    check_prompt_call({"name": "debug_oom", "arguments": "x"}, prompts)
    # The SDK client refuses to send a number; other clients do, and hear what to send instead.
    with pytest.raises(MCPError) as exc:
        check_prompt_call({"name": "plan_parallelism", "arguments": {"model": "x", "gpus": 8}}, prompts)
    assert (exc.value.code, exc.value.message) == (-32602, 'Prompt arguments are strings (MCP): send gpus="8", not 8.')


async def test_unknown_resources_are_invalid_params_per_sep_2164(client):
    for uri in ("card://nope", "nope://x", "skill://nope/SKILL.md"):
        with pytest.raises(MCPError) as exc:
            await client.read_resource(uri)
        assert exc.value.error.code == -32602 and exc.value.error.data == {"uri": uri}, uri


# --------------------------------------------------------------------------- stderr


USER_ERRORS = [
    call(10, "estimate_memory", {**MEMORY_ARGS, "tp": "abc"}),
    call(11, "estimate_memory", {**MEMORY_ARGS, "tensor_parallel_size": 8}),
    call(12, "describe_model", {"model": "no-such-model"}),
    call(13, "estimate_memory", {**MEMORY_ARGS, "gpu": "h1000"}),
    call(14, "recommend_parallelism", {"model": "llama-3.1-70b", "num_gpus": 1, "top_k": 0}),
    call(15, "render_config", {"framework": "megatron-core", "model": "llama-3.1-8b", "num_gpus": 8, "tp": 3}),
    call(16, "no_such_tool", {}),
    request(17, "prompts/get", {"name": "nope"}),
    request(18, "prompts/get", {"name": "plan_parallelism", "arguments": {"model": "x"}}),
    request(19, "prompts/get", {"name": "plan_parallelism", "arguments": {"model": "x", "gpus": "many"}}),
    request(20, "prompts/get", {"name": "debug_oom", "arguments": {"model": "x", "gpus": "8", "bogus": "1"}}),
    request(22, "prompts/get", {"name": "debug_oom", "arguments": {"model": "x", "gpus": 8}}),
    request(21, "resources/read", {"uri": "card://nope"}),
    request(True),
    "not json",
]


def test_user_errors_leave_no_traceback_on_stderr(tmp_path):
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:  # a file, not a pipe: a chatty server would stall on a full pipe
        server = RawServer(SERVER, tmp_path, env=tree_env({}), stderr=err)
    try:
        server.initialize()
        for line in USER_ERRORS:
            reply = server.ask(line)
            assert "error" in reply or reply["result"]["isError"], reply
        assert server.close() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]


CRASHING_PROMPT = """
from meshplan.faces.mcp import server

@server.app.prompt(name="broken")
def broken() -> str:
    raise RuntimeError("a bug in a prompt")

server.run()
"""


def test_a_crash_is_an_internal_error_and_keeps_its_traceback(tmp_path):
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        server = RawServer([sys.executable, "-c", CRASHING_PROMPT], tmp_path, env=tree_env({}), stderr=err)
    try:
        server.initialize()
        reply = server.ask(request(2, "prompts/get", {"name": "broken"}))
        assert reply["id"] == 2 and reply["error"]["code"] == -32603
        assert "a bug in a prompt" not in reply["error"]["message"]  # the cause stays on the server
        assert server.close() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    text = log.read_text()
    assert "Traceback" in text and "a bug in a prompt" in text


# --------------------------------------------------------------------------- cancellation


def spin_until_cancelled(started: threading.Event) -> str:
    """Work that only a cancellation ends, checking in the way the search does."""
    started.set()
    while True:
        cancel.checkpoint()
        time.sleep(0.001)


async def test_run_cancellable_returns_the_result_and_raises_the_error():
    assert await run_cancellable(lambda a, b: a + b, a=2, b=3) == 5

    def fails() -> None:
        raise MeshplanError("bad", fix="good")

    with pytest.raises(MeshplanError, match="bad"):
        await run_cancellable(fails)
    assert cancel.running() == 0


async def test_a_cancelled_call_stops_its_thread_before_it_returns():
    started, before = threading.Event(), cancel.cancelled()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_cancellable(spin_until_cancelled, started=started))
        while not started.is_set():
            await anyio.sleep(0.001)
        assert cancel.running() == 1
        t0 = time.perf_counter()
        tg.cancel_scope.cancel()
    assert time.perf_counter() - t0 < 0.5
    assert cancel.running() == 0 and cancel.cancelled() == before + 1


async def test_a_thread_without_checkpoints_is_abandoned_after_the_wait(monkeypatch):
    monkeypatch.setattr(cancellable_module, "STOP_WAIT_S", 0.05)
    release = threading.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_cancellable(release.wait, timeout=10))
        while cancel.running() == 0:
            await anyio.sleep(0.001)
        t0 = time.perf_counter()
        tg.cancel_scope.cancel()
    assert time.perf_counter() - t0 < 1.0  # the caller is not held hostage by the thread
    release.set()
    while cancel.running():
        await anyio.sleep(0.001)


def test_checkpoint_is_free_outside_a_scope_and_obeys_its_own_token():
    cancel.checkpoint()  # the CLI and the Python API: no token, no effect
    mine, other = cancel.Token(), cancel.Token()
    other.cancel()
    with cancel.scope(mine):
        cancel.checkpoint()  # another call's cancellation does not reach this one
        mine.cancel()
        with pytest.raises(Cancelled):
            cancel.checkpoint()
    assert mine.stopped and not issubclass(Cancelled, MeshplanError)  # the search's `except MeshplanError` lets it by


async def test_wrapped_tools_publish_the_same_schemas():
    raw = MCPServer("raw")
    for fn, title, description in [*TOOLS, REPORT_TOOL, COMPARE_TOOL]:
        raw.tool(name=fn.__name__, title=title, description=description, annotations=READ_ONLY)(fn)
    dump = [t.model_dump(mode="json", by_alias=True) for t in await raw.list_tools()]
    assert json.dumps([t.model_dump(mode="json", by_alias=True) for t in await app.list_tools()]) == json.dumps(dump)
    for fn, _, _ in [*TOOLS, REPORT_TOOL, COMPARE_TOOL]:
        wrapped = cancellable(fn)
        assert (wrapped.__name__, wrapped.__doc__) == (fn.__name__, fn.__doc__)
        assert inspect.signature(wrapped) == inspect.signature(fn)
        assert inspect.iscoroutinefunction(wrapped)


# The server as the SDK builds it tool by tool (each tool's argument model and output schema derived on its own:
# sdk_tool without an output schema), served over the same stdio transport: the tools listed from the published
# file (tool_schemas.json) and built on their first call must not show on the wire, and a stale file fails here.
SDK_BUILT_SERVER = """
from meshplan.faces.mcp import server, tool_list, tools

server.deferred_tools = lambda: [tools.sdk_tool(*spec) for spec in tool_list.SPECS]
server.app = server.build_server()
server.run()
"""
WIRE = [INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, request(2), request(3, "resources/list"),
        request(4, "resources/templates/list"), request(5, "prompts/list"),
        call(6, "describe_model", {"model": "deepseek-v3"}), call(7, "estimate_memory", MEMORY_ARGS),
        call(8, "estimate_memory", {**MEMORY_ARGS, "tensor_parallel": 2}), call(9, "check_config", {"tp": "2"}),
        call(10, "render_config", {**MEMORY_ARGS, "framework": "nanotron"}), call(11, "list_models", {}),
        call(12, "estimate_throughput", {**MEMORY_ARGS, "num_gpus": 0})]


def test_the_wire_is_byte_for_byte_the_sdk_built_servers(tmp_path):
    env = tree_env({})  # this tree, wherever it is installed from
    replies = []
    for argv in (SERVER, [sys.executable, "-c", SDK_BUILT_SERVER]):
        server = RawServer(argv, tmp_path, env=env)
        lines = []
        for message in WIRE:
            server.send(message)
            if "id" in message:
                lines.append(server.proc.stdout.readline())
        server.proc.stdin.close()
        assert server.proc.wait(timeout=30) == 0
        replies.append(lines)
    assert all(line.startswith('{"jsonrpc":"2.0","id":') for line in replies[0]), replies[0]
    assert [json.loads(line)["id"] for line in replies[0]] == [m["id"] for m in WIRE if "id" in m]
    assert replies[0] == replies[1]


# A server with one more tool that reports, from inside the server process, how many computations run.
COUNTING_SERVER = """
from meshplan.core import cancel
from meshplan.faces.mcp import server

@server.app.tool(name="computations")
def computations() -> dict[str, int]:
    return {"running": cancel.running(), "cancelled": cancel.cancelled()}

server.run()
"""
SLOW = {"model": "deepseek-v3", "gpu": "h100", "num_gpus": 6144}  # several seconds of search


async def test_cancelling_a_slow_recommend_over_stdio_stops_the_work(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-c", COUNTING_SERVER], cwd=str(tmp_path),
                                    env=tree_env({}))
    async with Client(params) as client:

        async def computations() -> dict:
            return (await client.call_tool("computations", {})).structured_content

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "recommend_parallelism", SLOW)
                while (await computations())["running"] == 0:
                    await anyio.sleep(0.02)
                await anyio.sleep(0.2)  # well inside the search
                tg.cancel_scope.cancel()  # the client sends notifications/cancelled
            t0 = time.perf_counter()
            while (now := await computations())["running"]:
                await anyio.sleep(0.01)
            stopped_in = time.perf_counter() - t0
        assert now == {"running": 0, "cancelled": 1}, now  # stopped at a checkpoint, not run to the end
        assert stopped_in < 1.0, stopped_in
        # The server is still serving.
        assert not (await client.call_tool("estimate_memory", MEMORY_ARGS)).is_error
