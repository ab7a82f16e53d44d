"""The meshplan MCP server: meshplan's functions as tools, its cards and skills as resources, two prompts.

It holds no planning logic; the tools call `meshplan.api` (see tools.py). Start-up cost matters,
because hosts launch the server on demand and time out slow ones: only the SDK, the request schema
and the card file names are loaded here; the tools are listed from their published schemas
(deferred.py) and each is built on its first call, the estimators imported with the first call that
needs them. In stdio mode stdout carries JSON-RPC only: stray prints and all logging go to stderr, and a
line that is not JSON-RPC gets an error reply (stdio.py).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from meshplan import __version__
from meshplan.core import server_files
from meshplan.core.errors import MeshplanError, closest

from .deferred import deferred_tools
from .http_edges import InvalidIdGuard
from .prompts import register_prompts
from .resources import register_resources
from .stdio import serve_stdio

INSTRUCTIONS = """\
meshplan answers "how should I parallelize this LLM training job?" with numbers: exact parameter counts, \
per-GPU memory per pipeline stage, step time and MFU, rule checks with stable ids, and configs for \
Megatron-Bridge, Megatron-Core, verl, SkyRL, torchtitan, KempnerForge and DeepSpeed. \
Which tool answers which question: "how should I lay out / shard model X on N GPUs?" -> recommend_parallelism; \
"is this layout or config valid, what will break?" -> check_config; \
"will it fit, why did it run out of memory, where does memory go?" -> estimate_memory; \
"how fast, what MFU, why slow?" -> estimate_throughput; \
"give me the config for framework F" -> render_config; \
"how many (active) parameters does X have?" -> describe_model; \
"which models do you know?" -> list_models; \
"how many GPUs do I need at least?" -> minimum_gpus; \
"show me / draw the plan (memory per stage, mesh, pipeline schedule)" -> render_report; \
"my run measured this (a pasted log): how does it compare with the prediction?" -> compare_run. \
All tools take the same flat arguments (model, gpu, num_gpus, seq_length, global_batch_size, \
micro_batch_size, precision, framework, tp, pp, vpp, cp, ep, etp, dp, sequence_parallel, zero_stage, \
recompute, headroom); a field left out (or null) is searched by recommend_parallelism and filled with a stated \
default elsewhere; an unknown field is an error naming the closest one. \
A model is a catalog key, a Hugging Face id, a size like "70B", a config.json path, or a config.json's text \
itself, as model or as config_text (over HTTP a path names the server's file, refused unless its operator opened \
that folder: send the config.json's text, and a framework config as config_text). \
Results are bytes and seconds; each carries a summary, its assumptions and next steps. Quote the \
tools' numbers rather than estimating. Background: skill://parallelism-strategies/SKILL.md; the data \
behind every answer: card://index.\
"""

LOOPBACK = ("127.0.0.1", "localhost", "::1")
KEEP_ALIVE_S = 75
WILDCARD = ("0.0.0.0", "::", "")


def unknown_tool_message(name: str, known: Sequence[str]) -> str:
    """What a call to a tool the server does not have hears: the name, the closest ones, every tool."""
    hints = closest(name, known, n=2)
    hint = f" (did you mean {' or '.join(hints)}?)" if hints else ""
    return f"Unknown tool {name!r}{hint}; the tools are: {', '.join(known)}."


class MeshplanServer(MCPServer):
    """The SDK's server, but an unknown tool's error names the closest tools and lists them all (the SDK says only
    'Unknown tool: NAME'). It stays a tool error (isError), the SDK's path, so the model reads it and can retry."""

    async def call_tool(self, name: str, arguments: dict, context=None):  # type: ignore[no-untyped-def]
        if self._tool_manager.get_tool(name) is None:
            raise ToolError(unknown_tool_message(name, [t.name for t in self._tool_manager.list_tools()]))
        return await super().call_tool(name, arguments, context)


def build_server() -> MCPServer:
    server = MeshplanServer(
        "meshplan",
        title="meshplan: LLM training parallelism planner",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
        tools=deferred_tools(),
    )
    register_resources(server)
    register_prompts(server)
    return server


app = build_server()


def _host_patterns(host: str) -> list[str]:
    name = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return [name, f"{name}:*"]


def transport_security(host: str, allowed_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """DNS-rebinding protection for every bind address: loopback names always, plus the bound or named hosts.

    The SDK turns the protection on by itself only for a loopback bind; a server bound wider must still
    refuse a page on another site that resolves its name to this machine, so the Host header is checked
    against the names the operator gave.
    """
    names = ["127.0.0.1", "localhost", "::1", *allowed_hosts]
    if host not in LOOPBACK + WILDCARD:
        names.append(host)
    hosts = [p for name in names for p in _host_patterns(name)]
    origins = [f"{scheme}://{p}" for p in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


STDIO_WAITING = "meshplan MCP server on stdio: waiting for a client's JSON-RPC on stdin; Ctrl-C to stop"
STOPPED = "meshplan MCP server: stopped (Ctrl-C)"
EXIT_INTERRUPTED = 130  # the shell's status for a process ended by SIGINT


def _stop_now(signum: int, frame: object) -> None:
    """End a stdio server on the first Ctrl-C.

    The SDK reads stdin in a worker thread that cannot be cancelled: a terminal read blocks until a
    line arrives, so the event loop's own Ctrl-C handling waits for it (the first Ctrl-C seemed
    ignored) and the second one printed a traceback. Nothing is in flight worth keeping on a stdio
    server, so the process ends at once with the shell's SIGINT status.
    """
    sys.stderr.write(STOPPED + "\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765


def chosen_transport(transport: str | None, http: bool) -> str:
    """The transport --transport and --http name together: `--http --transport stdio` named two (argparse kept the
    last one given, without a word)."""
    if http and transport not in (None, "http", "streamable-http"):
        raise MeshplanError(f"--http and --transport {transport} name two transports.",
                            fix="Give one: --http (or --transport http) to serve over HTTP, or neither for stdio.")
    return "http" if http else (transport or "stdio")


def server_folders(folders: Sequence[str]) -> list[Path]:
    """The folders --allow-server-files names, each an existing folder (a typo would open nothing, silently)."""
    found = []
    for folder in folders:
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise MeshplanError(f"--allow-server-files {folder}: not a folder on this machine.",
                                fix="Name a folder that exists (the HTTP server's callers may read the files in it).")
        found.append(path.resolve())
    return found


def run(
    transport: str = "stdio", host: str | None = None, port: int | None = None, allowed_hosts: Sequence[str] = (),
    allow_server_files: Sequence[str] = (),
) -> None:
    """Serve over stdio (default) or streamable HTTP at http://HOST:PORT/mcp (host and port None: DEFAULT_HOST,
    DEFAULT_PORT); blocks until the client leaves.

    Both modes say on stderr what they wait for (stdout is the JSON-RPC wire). Ctrl-C ends a stdio
    server with status 130 at once; an HTTP server shuts down and raises KeyboardInterrupt, which the
    entry points turn into the same status. A host, port or allowed host given to a stdio server is refused: it
    binds nothing, and `serve --port 9000` ran on stdio without a word.

    Over HTTP the caller is remote, so the server reads none of its own files for a request (a model's config.json
    path, a launch script, a file a pasted script names: core/server_files.py), but inside the folders
    `allow_server_files` names; over stdio the caller is the machine's user and its paths are read as given.
    """
    if transport == "stdio":
        given = [name for name, set_ in (("--host", host is not None), ("--port", port is not None),
                                         ("--allowed-host", bool(allowed_hosts))) if set_]
        if given:
            raise MeshplanError(f"{' and '.join(given)} set{'s' if len(given) == 1 else ''} where the HTTP server "
                                "binds, and this server runs on stdio, which binds nothing.",
                                fix="Add --http to serve at http://HOST:PORT/mcp, or drop " + " and ".join(given) + ".")
        if allow_server_files:
            raise MeshplanError("--allow-server-files opens a folder to an HTTP server's remote callers, and this "
                                "server runs on stdio, whose user's paths are read as given.",
                                fix="Add --http to serve at http://HOST:PORT/mcp, or drop --allow-server-files.")
        print(STDIO_WAITING, file=sys.stderr, flush=True)
        in_main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, _stop_now) if in_main else None
        try:
            anyio.run(serve_stdio, app)
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous)
        return
    if transport not in ("http", "streamable-http"):
        raise MeshplanError(f"Unknown transport {transport!r}.", fix="Use 'stdio' (default) or 'http'.")
    host = DEFAULT_HOST if host is None else host
    port = DEFAULT_PORT if port is None else port
    if not 0 < port < 65536:
        raise MeshplanError(f"Port {port} is out of range.", fix="Use a port between 1 and 65535, e.g. 8765.")
    folders = server_folders(allow_server_files)
    if host in WILDCARD and not allowed_hosts:
        print(
            f"meshplan-mcp: bound to {host or 'all interfaces'}, but only loopback Host headers are accepted; "
            "pass --allowed-host NAME for the name clients use.",
            file=sys.stderr,
        )
    import uvicorn

    sock = bound_socket(host, port)  # before the line that says the server is up: a taken port is said, not claimed
    security = transport_security(host, allowed_hosts)
    from meshplan.faces.report.page import PageRouter  # the page at / (the report's jinja2 loads with it)

    asgi = PageRouter(InvalidIdGuard(app.streamable_http_app(transport_security=security, host=host), security),
                      security)
    # Keep idle connections open longer than uvicorn's 5 s default: a client that reuses a pooled
    # connection just as the server closes it gets a reset on its next POST, which a busy host hits.
    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S)
    reads = (f"callers' paths read inside {', '.join(map(str, folders))} only" if folders else
             "no file of this machine read for a caller (--allow-server-files DIR opens one folder)")
    print(f"meshplan MCP server on {http_url(host, port)} (streamable HTTP), the web page at "
          f"{http_url(host, port)[:-len('mcp')]}; {reads}; Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        with server_files.remote(folders):  # every request's reads confined; the tools' threads inherit it
            uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        print(STOPPED, file=sys.stderr, flush=True)
        raise


def bound_socket(host: str, port: int) -> socket.socket:
    """A socket bound to HOST:PORT as uvicorn binds one (Config.bind_socket: IPv6 where the host has a ':', the
    address reusable), for uvicorn to serve on. Bound here so that a port in use or a host that is not this machine's
    is a MeshplanError with its fix, before the server says it is up: uvicorn printed the server's address, then its
    own 'ERROR: [Errno 98] ... address already in use' and exited 3."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # gaierror too: a name that does not resolve
        sock.close()
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            raise MeshplanError(f"Cannot serve on {host}:{port}: the port is in use ({why}).",
                                fix="Pass another --port, or stop the server that holds this one.") from None
        raise MeshplanError(f"Cannot serve on {host}:{port}: {why}.",
                            fix="Pass --host an address of this machine: 127.0.0.1 (the default), ::1, or 0.0.0.0 "
                                "for every interface.") from None
    return sock


def http_url(host: str, port: int) -> str:
    """The URL a client uses for a server bound to HOST:PORT (a wildcard bind is reached on loopback)."""
    name = "127.0.0.1" if host in WILDCARD else host
    name = f"[{name}]" if ":" in name and not name.startswith("[") else name
    return f"http://{name}:{port}/mcp"
