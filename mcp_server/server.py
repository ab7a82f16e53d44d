"""The meshplan MCP server: meshplan's functions as tools, its cards and skills as resources, two prompts.

It holds no planning logic; the tools call `meshplan.api` (see tools.py). Start-up cost matters,
because hosts launch the server on demand and time out slow ones: only the SDK, the request schema
and the card file names are loaded here; the estimators are imported on the first call that needs
them. In stdio mode stdout carries JSON-RPC only: stray prints and all logging go to stderr, and a
line that is not JSON-RPC gets an error reply (stdio.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import anyio
from mcp.server import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

from meshplan import __version__
from meshplan.errors import MeshplanError

from .prompts import register_prompts
from .resources import register_resources
from .stdio import serve_stdio
from .tools import register_tools

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
"which models do you know?" -> list_models. \
All tools take the same flat arguments (model, gpu, num_gpus, seq_length, global_batch_size, \
micro_batch_size, precision, framework, tp, pp, vpp, cp, ep, etp, dp, sequence_parallel, zero_stage, \
recompute); a model is a catalog key, a Hugging Face id, a config.json path or a size like "70B". \
Results are bytes and seconds; each carries a summary, its assumptions and next steps. Quote the \
tools' numbers rather than estimating. Background: skill://parallelism-strategies/SKILL.md; the data \
behind every answer: card://index.\
"""

LOOPBACK = ("127.0.0.1", "localhost", "::1")
KEEP_ALIVE_S = 75
WILDCARD = ("0.0.0.0", "::", "")


def build_server() -> MCPServer:
    server = MCPServer(
        "meshplan",
        title="meshplan: LLM training parallelism planner",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
    )
    register_tools(server)
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


def run(
    transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765, allowed_hosts: Sequence[str] = ()
) -> None:
    """Serve over stdio (default) or streamable HTTP at http://HOST:PORT/mcp; blocks until the client leaves."""
    if transport == "stdio":
        anyio.run(serve_stdio, app)
        return
    if transport not in ("http", "streamable-http"):
        raise MeshplanError(f"Unknown transport {transport!r}.", fix="Use 'stdio' (default) or 'http'.")
    if not 0 < port < 65536:
        raise MeshplanError(f"Port {port} is out of range.", fix="Use a port between 1 and 65535, e.g. 8765.")
    if host in WILDCARD and not allowed_hosts:
        print(
            f"meshplan-mcp: bound to {host or 'all interfaces'}, but only loopback Host headers are accepted; "
            "pass --allowed-host NAME for the name clients use.",
            file=sys.stderr,
        )
    import uvicorn

    asgi = app.streamable_http_app(transport_security=transport_security(host, allowed_hosts), host=host)
    # Keep idle connections open longer than uvicorn's 5 s default: a client that reuses a pooled
    # connection just as the server closes it gets a reset on its next POST, which a busy host hits.
    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S)
    uvicorn.Server(config).run()
