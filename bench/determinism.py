"""Issue 23's first "done when": three identical calls give identical candidates (plans and numbers) on every face,
while two CPU-bound processes run beside them.

    python bench/determinism.py [--calls 3] [--burners 2] [--only NAME]

For each of the issue's named requests, the same arguments go `--calls` times through each face: the Python api (in
this process, one call after another, as a notebook would ask), the CLI's `--json` (a fresh `meshplan` process per
call, as a terminal user asks) and the MCP tool over stdio (one `meshplan-mcp` server, the calls in turn, as an agent
asks). Meanwhile `--burners` processes spin on the CPU (the 2-core machine then has more runnable processes than
cores). Every answer is compared whole, less the words only the MCP face adds (`summary`, `next_steps`): the ranked
candidates with their plans and every number, what was considered and rejected per rule, the notes. The table says,
per request, how many distinct answers the calls gave (1 is the target) and the wall time per call under load (a
clock never decides an answer; it is printed only to show the load was real). The launched processes import the
installed meshplan, or the checkout PYTHONPATH names (bench/mcp_speed.child_env).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from meshplan import api
from meshplan.request.parse import parse_request

sys.path.insert(0, os.path.dirname(__file__))
from mcp_speed import child_env

WORDS = ("summary", "next_steps")
H100 = {"gpu": "h100"}
# (name, MCP tool, its arguments): the requests issue 23 names
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("recommend DeepSeek-V3, 1,024 H100, Megatron-Bridge, 4K x 4,096", "recommend_parallelism",
     {"model": "deepseek-v3", "num_gpus": 1024, "framework": "megatron-bridge", "seq_length": 4096,
      "global_batch_size": 4096, **H100}),
    ("recommend DeepSeek-V3, 256 H100", "recommend_parallelism", {"model": "deepseek-v3", "num_gpus": 256, **H100}),
    ("recommend Llama-3.1-70B, 64 H100", "recommend_parallelism", {"model": "llama-3.1-70b", "num_gpus": 64, **H100}),
    ("recommend Kimi-K2, 256 H100", "recommend_parallelism", {"model": "kimi-k2", "num_gpus": 256, **H100}),
    ("recommend GRPO Qwen3-30B-A3B, 16 H100 (verl)", "recommend_parallelism",
     {"model": "qwen3-30b-a3b", "num_gpus": 16, "framework": "verl", "job": "rl", "algorithm": "grpo", **H100}),
    ("min-gpus Kimi-K2, H100", "minimum_gpus", {"model": "kimi-k2", **H100}),
]
COMMANDS = {"recommend_parallelism": "recommend", "minimum_gpus": "min-gpus"}


def digest(result: dict[str, Any]) -> str:
    """A short name for one whole answer (less the MCP face's words), the same for equal answers."""
    body = json.dumps({k: v for k, v in result.items() if k not in WORDS}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def via_api(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    ask = api.recommend if tool == "recommend_parallelism" else api.minimum_gpus
    return ask(parse_request(dict(args))).model_dump(mode="json")


def via_cli(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One `meshplan` process, as a terminal user runs it."""
    argv = [sys.executable, "-m", "meshplan.faces.cli", COMMANDS[tool], "--json"]
    for name, value in args.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **child_env()}, timeout=600)
    if not done.stdout.strip():
        raise SystemExit(f"{' '.join(argv[3:])}: no answer (exit {done.returncode}): {done.stderr[-400:]}")
    return json.loads(done.stdout)


async def via_mcp(tool: str, args: dict[str, Any], calls: int, cwd: str) -> list[tuple[dict[str, Any], float]]:
    """`calls` calls of the tool to one server over stdio, each with its wall time."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "meshplan.faces.mcp"], cwd=cwd,
                                   env=child_env() or None)
    out = []
    async with Client(params) as client:
        for _ in range(calls):
            start = time.perf_counter()
            result = await client.call_tool(tool, args)
            if result.is_error:
                raise SystemExit(f"MCP {tool}: {result.content[0].text}")
            out.append((result.structured_content, time.perf_counter() - start))
    return out


def timed(ask, *args) -> tuple[dict[str, Any], float]:
    start = time.perf_counter()
    result = ask(*args)
    return result, time.perf_counter() - start


def burners(count: int) -> list[subprocess.Popen]:
    """CPU-bound processes beside the calls (each spins one core)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def one_case(tool: str, args: dict[str, Any], calls: int, cwd: str) -> dict[str, list[tuple[str, float]]]:
    """Per face, each call's (answer digest, wall seconds)."""
    faces = {"api": [timed(via_api, tool, args) for _ in range(calls)],
             "cli": [timed(via_cli, tool, args) for _ in range(calls)],
             "mcp": anyio.run(via_mcp, tool, args, calls, cwd)}
    return {face: [(digest(result), wall) for result, wall in answers] for face, answers in faces.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--only", default=None, help="run the cases whose name contains this text")
    args = parser.parse_args()
    cases = [case for case in CASES if args.only is None or args.only.lower() in case[0].lower()]
    spinning = burners(args.burners)
    try:
        time.sleep(1.0)
        print(f"load average at start {os.getloadavg()[0]:.2f} ({args.burners} CPU-bound processes beside, "
              f"{os.cpu_count()} cores)")
        print("| request | calls per face | distinct answers | answer | wall s per call under load (api / CLI / MCP, "
              "median) | identical? |")
        print("|---|---|---|---|---|---|")
        all_same = True
        with tempfile.TemporaryDirectory() as cwd:
            for name, tool, request in cases:
                faces = one_case(tool, request, args.calls, cwd)
                digests = {d for answers in faces.values() for d, _ in answers}
                walls = " / ".join(f"{sorted(w for _, w in faces[f])[len(faces[f]) // 2]:.2f}" for f in faces)
                same = len(digests) == 1
                all_same &= same
                print(f"| {name} | {args.calls} x api, CLI, MCP | {len(digests)} | {', '.join(sorted(digests))} | "
                      f"{walls} | {'yes' if same else '**no**'} |", flush=True)
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    finally:
        for proc in spinning:
            proc.kill()
    sys.exit(0 if all_same else 1)


if __name__ == "__main__":
    main()
