"""The MCP server as a separate process: stdio and streamable HTTP, entry points, robustness, hygiene.

Hosts start the server from their own working directory with almost no environment, talk to it
over a pipe, and give up on it if one bad line kills it; these tests do the same.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest
from http_servers import serving
from mcp import Client, StdioServerParameters
from tree_under_test import tree_env

pytestmark = pytest.mark.anyio

SERVER = [sys.executable, "-m", "meshplan.faces.mcp"]
SCRIPTS = Path(sysconfig.get_path("scripts"))
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "0"}}}
MEMORY_ARGS = {"model": "llama-3.1-8b", "num_gpus": 8, "tp": 2}


@pytest.fixture
def anyio_backend():
    return "asyncio"


# --------------------------------------------------------------------------- stdio


async def test_stdio_round_trip_from_outside_the_repo(tmp_path):
    # env=None: the SDK passes only its short allow-list (HOME, PATH, SHELL, TERM, USER, LOGNAME).
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"], cwd=str(tmp_path),
                                    env=tree_env({}))
    async with Client(params) as client:
        assert client.server_info.name == "meshplan"
        assert len((await client.list_tools()).tools) == 10
        result = await client.call_tool("estimate_memory", MEMORY_ARGS)
        assert not result.is_error and result.structured_content["plan"]["dp"] == 4
        failed = await client.call_tool("describe_model", {"model": "no-such-model"})
        assert failed.is_error and "Unknown model" in failed.content[0].text
        card = await client.read_resource("card://models/llama-3.1-8b")
        assert "Llama" in card.contents[0].text


class RawServer:
    """A server on a pipe, driven one JSON-RPC line at a time, with every stdout line checked to be JSON."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], stderr: Any = subprocess.PIPE):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                     cwd=cwd, env=env, text=True, bufsize=1)

    def send(self, line: object) -> None:
        self.proc.stdin.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"server closed stdout; stderr: {self.proc.stderr.read()[-2000:] if self.proc.stderr else ''}"
        return json.loads(line)  # anything but JSON on stdout would corrupt the stream

    def ask(self, line: object) -> dict:
        self.send(line)
        return self.reply()

    def initialize(self) -> dict:
        info = self.ask(INIT)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return info

    def close(self) -> int:
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()
        return code


@pytest.fixture
def raw(tmp_path):
    server = RawServer(SERVER, tmp_path, env=tree_env({}))  # an empty environment but the tree under test
    yield server
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait()


def call(req_id: int, name: str, arguments: object) -> dict:
    return {"jsonrpc": "2.0", "id": req_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def test_bad_lines_get_error_replies_and_the_server_keeps_serving(raw):
    assert raw.initialize()["result"]["serverInfo"]["name"] == "meshplan"

    assert raw.ask("this is not json")["error"]["code"] == -32700
    truncated = raw.ask('{"jsonrpc": "2.0", "id": 3, "method": ')
    assert truncated == {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error: not JSON"}}
    assert raw.ask("[" * 100_000)["error"]["code"] == -32700
    reply = raw.ask([])
    assert reply["error"]["code"] == -32600 and reply["id"] is None
    reply = raw.ask({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": "oops"})
    assert reply["error"]["code"] == -32600 and reply["id"] == 7
    assert raw.ask({"id": 8})["error"]["code"] == -32600

    reply = raw.ask({"jsonrpc": "2.0", "id": 9, "method": "no/such/method"})
    assert reply["id"] == 9 and reply["error"]["code"] == -32601

    for req_id, arguments, expected in [
        (10, {**MEMORY_ARGS, "tp": "abc"}, "valid integer"),
        (11, {**MEMORY_ARGS, "num_gpus": 10**40}, "less than or equal"),
        (12, {**MEMORY_ARGS, "seq_length": -5}, "greater than or equal"),
        (13, {"model": 1e308}, "valid string"),
        (14, {**MEMORY_ARGS, "micro_batch_size": 1.5}, "integer"),
        (15, {**MEMORY_ARGS, "sequence_parallel": "perhaps"}, "boolean"),
        (19, {"model": "x" * ((1 << 20) + 1)}, "at most 1048576 characters"),
    ]:
        name = "describe_model" if req_id in (13, 19) else "estimate_memory"
        reply = raw.ask(call(req_id, name, arguments))
        assert reply["id"] == req_id and reply["result"]["isError"] is True, reply
        assert expected in reply["result"]["content"][0]["text"]

    reply = raw.ask(call(16, "nope", {}))
    assert reply["result"]["isError"] and "Unknown tool" in reply["result"]["content"][0]["text"]

    reply = raw.ask(call(17, "estimate_memory", MEMORY_ARGS))
    assert reply["result"]["isError"] is False and reply["result"]["structuredContent"]["plan"]["tp"] == 2
    assert len(raw.ask({"jsonrpc": "2.0", "id": 18, "method": "tools/list"})["result"]["tools"]) == 10
    assert raw.close() == 0


NOISY_SERVER = """
from meshplan.faces.mcp import server

@server.app.tool(name="noisy")
def noisy() -> str:
    print("stray print from a tool")
    return "done"

server.run()
"""


def test_stray_prints_go_to_stderr_not_into_the_stream(tmp_path):
    noisy = RawServer([sys.executable, "-c", NOISY_SERVER], tmp_path, env=tree_env({}))
    try:
        noisy.initialize()
        reply = noisy.ask(call(2, "noisy", {}))
        assert reply["id"] == 2 and reply["result"]["isError"] is False
        assert noisy.ask(call(3, "describe_model", {"model": "70B"}))["id"] == 3
        noisy.proc.stdin.close()
        rest = noisy.proc.stdout.read()
        assert noisy.proc.wait(timeout=30) == 0
        assert all(json.loads(line) for line in rest.splitlines())
        assert "stray print from a tool" in noisy.proc.stderr.read()
    finally:
        if noisy.proc.poll() is None:
            noisy.proc.kill()


@pytest.mark.parametrize("argv", [
    [str(SCRIPTS / "meshplan-mcp")],
    [str(SCRIPTS / "meshplan"), "serve"],
], ids=["meshplan-mcp", "meshplan-serve"])
def test_entry_points_speak_mcp_over_stdio(argv, tmp_path):
    server = RawServer(argv, tmp_path, env=tree_env({}))
    try:
        info = server.initialize()["result"]
        assert info["serverInfo"]["name"] == "meshplan" and info["instructions"]
        assert server.close() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


def test_start_up_imports_nothing_heavy(tmp_path):
    code = "import json, sys, meshplan.faces.mcp.server; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env=tree_env())
    loaded = set(json.loads(out.stdout))
    lazy = {"meshplan.estimate.memory", "meshplan.estimate.perf", "meshplan.check.config", "meshplan.search",
            "meshplan.knowledge.catalog", "meshplan.knowledge.model_config", "meshplan.request.resolve",
            "meshplan.adapters.render", "jinja2", "numpy", "torch",
            # the api, the parser and the card loader wait for the first call too: only the schemas load
            "meshplan.api", "meshplan.request.parse", "meshplan.knowledge.cards"}
    assert not lazy & loaded


# --------------------------------------------------------------------------- streamable HTTP


async def test_http_round_trip(http_server):
    async with Client(http_server) as client:
        assert client.server_info.name == "meshplan"
        assert len((await client.list_tools()).tools) == 10
        result = await client.call_tool("estimate_memory", MEMORY_ARGS)
        assert not result.is_error and result.structured_content["plan"]["tp"] == 2
        failed = await client.call_tool("estimate_memory", {**MEMORY_ARGS, "gpu": "h1000"})
        assert failed.is_error and "Unknown GPU" in failed.content[0].text


def _post(url: str, headers: dict[str, str]) -> int:
    body = json.dumps(INIT).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_http_refuses_dns_rebinding(http_server):
    port = http_server.split(":")[2].split("/")[0]
    assert _post(http_server, {}) == 200
    assert _post(http_server, {"Host": f"attacker.example:{port}"}) == 421
    assert _post(http_server, {"Origin": "http://attacker.example"}) == 403
    assert _post(http_server, {"Origin": f"http://localhost:{port}"}) == 200


async def test_200_concurrent_http_calls_all_succeed(http_server):
    clients, per_client = 8, 25
    results: dict[tuple[int, int], int] = {}

    async def one_client(c: int) -> None:
        async with Client(http_server) as client:
            async def one_call(i: int) -> None:
                tp = (1, 2, 4, 8)[(c + i) % 4]
                result = await client.call_tool("estimate_memory", {**MEMORY_ARGS, "tp": tp})
                assert not result.is_error, result.content
                results[(c, i)] = result.structured_content["plan"]["tp"]
                assert results[(c, i)] == tp

            async with anyio.create_task_group() as tg:
                for i in range(per_client):
                    tg.start_soon(one_call, i)

    with anyio.fail_after(300):
        async with anyio.create_task_group() as tg:
            for c in range(clients):
                tg.start_soon(one_client, c)
    assert len(results) == clients * per_client == 200


def test_http_binds_loopback_by_default_and_always_checks_the_host_header():
    import inspect

    from meshplan.faces.cli import build_parser
    from meshplan.faces.mcp.server import DEFAULT_HOST, run, transport_security

    # a host left unset (None, so that a stdio server can refuse one given) binds DEFAULT_HOST, loopback
    assert DEFAULT_HOST == "127.0.0.1" and inspect.signature(run).parameters["host"].default is None
    assert build_parser().parse_args(["serve"]).host is None
    settings = transport_security("127.0.0.1")
    assert settings.enable_dns_rebinding_protection
    assert "localhost:*" in settings.allowed_hosts and "attacker.example:*" not in settings.allowed_hosts
    # Bound wider, the protection stays on: only the names the operator lists are accepted.
    wide = transport_security("0.0.0.0", ["planner.internal"])
    assert wide.enable_dns_rebinding_protection and "planner.internal:*" in wide.allowed_hosts
    assert "0.0.0.0:*" not in wide.allowed_hosts
    assert "10.0.0.5:*" in transport_security("10.0.0.5").allowed_hosts


def test_bad_transport_settings_are_clear_errors():
    from meshplan.core.errors import MeshplanError
    from meshplan.faces.mcp.server import run

    with pytest.raises(MeshplanError, match="Unknown transport 'sse'"):
        run(transport="sse")
    with pytest.raises(MeshplanError, match="Port 70000 is out of range"):
        run(transport="http", port=70000)


# --------------------------------------------------------------------------- a client that hangs up over HTTP


# The real HTTP server (server.run) with two tools more: one that works until it is cancelled (checking in the way
# the search does, and bounded all the same), and one that reports from inside the server how many computations run.
HANG_UP_SERVER = """
import sys, time
from meshplan.core import cancel
from meshplan.faces.mcp import server
from meshplan.faces.mcp.cancellable import cancellable

def work(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        cancel.checkpoint()
        time.sleep(0.002)
    return "ran to the end"

def computations() -> dict[str, int]:
    return {"running": cancel.running(), "cancelled": cancel.cancelled()}

server.app.tool(name="work")(cancellable(work))
server.app.tool(name="computations")(computations)
server.run(transport="http", port=int(sys.argv[1]))
"""
SSE_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-06-18"}


def _rpc(url: str, body: dict, session: str | None = None) -> tuple[dict[str, str], dict | None]:
    """POST one JSON-RPC message; the response headers and the JSON-RPC reply in its SSE stream (None: no reply)."""
    headers = {**SSE_HEADERS, **({"mcp-session-id": session} if session else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
        replies = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        return dict(response.headers), (replies[-1] if replies else None)


def _tool(req_id: int, name: str, arguments: dict) -> dict:
    return {"jsonrpc": "2.0", "id": req_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@pytest.fixture
def hang_up_server(tmp_path):
    with serving([sys.executable, "-c", HANG_UP_SERVER], tmp_path) as port:
        yield port


def test_a_client_that_hangs_up_over_http_cancels_its_call(hang_up_server):
    """Closing the connection mid-call stops the work at its next checkpoint, as `notifications/cancelled` does;
    an answered call is not cancelled, and the session keeps serving."""
    url = f"http://127.0.0.1:{hang_up_server}/mcp"
    headers, _ = _rpc(url, INIT)
    session = headers["mcp-session-id"]
    _rpc(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)

    def computations(req_id: int) -> dict:
        _, reply = _rpc(url, _tool(req_id, "computations", {}), session)
        assert reply is not None
        return reply["result"]["structuredContent"]

    _, answered = _rpc(url, _tool(2, "work", {"seconds": 0}), session)
    assert answered is not None and answered["result"]["structuredContent"] == {"result": "ran to the end"}
    assert computations(3) == {"running": 0, "cancelled": 0}

    body = json.dumps(_tool(4, "work", {"seconds": 600})).encode()
    head = (f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{hang_up_server}\r\nContent-Length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in {**SSE_HEADERS, "mcp-session-id": session}.items()) + "\r\n")
    client = socket.create_connection(("127.0.0.1", hang_up_server), timeout=30)
    client.sendall(head.encode() + body)
    deadline = time.monotonic() + 60  # bounds the test, far inside the call's own 600 s
    req_id = 5
    while computations(req_id)["running"] == 0:
        assert time.monotonic() < deadline, "the call never started"
        req_id += 1
    client.close()  # hang up mid-call
    while (now := computations(req_id))["running"]:
        assert time.monotonic() < deadline, "the call kept running after its client hung up"
        req_id += 1
    assert now == {"running": 0, "cancelled": 1}, now  # stopped at a checkpoint, not run to its end
    assert computations(req_id + 1) == {"running": 0, "cancelled": 1}  # still serving


def test_start_up_pauses_the_collector_and_freezes_what_it_built():
    import gc

    from meshplan.faces.mcp import start_up

    frozen = gc.get_freeze_count()
    try:
        with start_up():
            assert not gc.isenabled()
            built = [[] for _ in range(100)]  # what start-up builds lives as long as the process
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(built)
        gc.disable()
        with start_up():  # a caller that had paused it keeps it paused
            pass
        assert not gc.isenabled()
    finally:
        gc.unfreeze()  # this test process is not a server: give its objects back to the collector
        gc.enable()
