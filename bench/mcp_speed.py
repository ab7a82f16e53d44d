"""Speed of the MCP server: in-process tool latency, stdio round trip, and time to the first tools/list.

    python bench/mcp_speed.py [--calls 200] [--launches 5] [--json]

Targets (issue 6): p50 in-process estimate_memory call <= 20 ms; stdio round trip of a check_config
call <= 100 ms after start-up; first tools/list answered <= 1.5 s after launch. The machine's load
average is printed with the figures, because a shared 2-core box moves them a lot.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

REQUEST = {"model": "llama-3.1-70b", "gpu": "h100", "num_gpus": 64, "tp": 8, "pp": 2, "seq_length": 8192,
           "global_batch_size": 512}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_ms": 1e3 * statistics.median(ordered), "p90_ms": 1e3 * pick(0.9), "max_ms": 1e3 * ordered[-1],
            "n": len(ordered)}


async def in_process(calls: int) -> dict[str, dict[str, float]]:
    """One tools/call through the SDK's in-memory Client (full MCP handling, no pipe), and the bare API call."""
    from mcp import Client

    from meshplan import api
    from meshplan.faces.mcp.server import app
    from meshplan.schema.request import Request

    out = {}
    async with Client(app) as client:
        for name in ("estimate_memory", "check_config", "estimate_throughput", "describe_model"):
            args = {"model": REQUEST["model"]} if name == "describe_model" else REQUEST
            result = await client.call_tool(name, args)  # warm: lazy imports, card caches
            assert not result.is_error, result.content
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                await client.call_tool(name, args)
                samples.append(time.perf_counter() - start)
            out[f"client {name}"] = quantiles(samples)
    samples = []
    req = Request(**REQUEST)
    for _ in range(calls):
        start = time.perf_counter()
        api.estimate_memory(req)
        samples.append(time.perf_counter() - start)
    out["api.estimate_memory (no MCP)"] = quantiles(samples)
    return out


def child_env() -> dict[str, str]:
    """A launched interpreter's environment: nothing of this shell's but its PYTHONPATH, so a bench run with
    PYTHONPATH=<a checkout> times that checkout's server, as a host with that path would launch it (without it,
    the installed meshplan)."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": path} if path else {}


class Pipe:
    def __init__(self, cwd: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "meshplan.faces.mcp"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd, env=child_env(),
                                     text=True, bufsize=1)

    def ask(self, message: dict) -> dict:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def launch_to_tools_list(cwd: str) -> tuple[float, float]:
    """Wall time from spawn to the tools/list reply, and the server's CPU time for the whole launch.

    On a busy machine the wall time mostly measures the queue for a CPU; the CPU time (user + system,
    start-up to exit) is what the launch would take on an idle core.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    pipe = Pipe(cwd)
    pipe.ask(INIT)
    pipe.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
    reply = pipe.ask({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    elapsed = time.perf_counter() - start
    assert reply["result"]["tools"], reply  # the tools meshplan registers (their count grows with the faces)
    pipe.close()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def import_cpu(code: str) -> float:
    """CPU time of a fresh interpreter running `code`: the floor any server start-up pays."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def stdio_round_trips(cwd: str, calls: int) -> dict[str, float]:
    pipe = Pipe(cwd)
    pipe.ask(INIT)
    pipe.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
    message = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "check_config", "arguments": REQUEST}}
    assert pipe.ask({**message, "id": 1})["result"]["isError"] is False  # warm-up: first call imports the rules
    samples = []
    for i in range(calls):
        start = time.perf_counter()
        reply = pipe.ask({**message, "id": i + 2})
        samples.append(time.perf_counter() - start)
        assert reply["id"] == i + 2
    pipe.close()
    return quantiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    results: dict[str, object] = {"in_process": anyio.run(in_process, args.calls)}
    with tempfile.TemporaryDirectory() as cwd:  # launched from outside the repo, empty environment
        results["stdio check_config"] = stdio_round_trips(cwd, args.calls)
        launches = [launch_to_tools_list(cwd) for _ in range(args.launches)]
    results["launch to first tools/list"] = quantiles([wall for wall, _ in launches])
    results["launch CPU time (start-up to exit)"] = quantiles([cpu for _, cpu in launches])
    results["CPU: import the mcp SDK server only"] = quantiles(
        [import_cpu("import mcp.server, mcp.server.stdio") for _ in range(args.launches)])
    results["CPU: import and build meshplan's server"] = quantiles(
        [import_cpu("import meshplan.faces.mcp.server") for _ in range(args.launches)])
    results["load_average_1min"] = [load_before, os.getloadavg()[0]]
    results["cpus"] = os.cpu_count()

    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'measurement':44} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9} {'n':>5}")
    rows = [*results["in_process"].items(), ("stdio check_config round trip", results["stdio check_config"]),
            ("launch -> first tools/list (wall)", results["launch to first tools/list"]),
            ("launch CPU time, start-up to exit", results["launch CPU time (start-up to exit)"]),
            ("CPU: import the mcp SDK server only", results["CPU: import the mcp SDK server only"]),
            ("CPU: import and build meshplan's server", results["CPU: import and build meshplan's server"])]
    for name, q in rows:
        print(f"{name:44} {q['p50_ms']:9.2f} {q['p90_ms']:9.2f} {q['max_ms']:9.2f} {q['n']:5d}")
    print(f"load average (1 min) before/after: {load_before:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
