"""The MCP Inspector CLI, a third-party client, against the real server over stdio.

The Inspector is pinned (npm `@modelcontextprotocol/inspector@2.12.0`) and fetched by `npx` from
the npm registry on first use, then served from npm's cache. Its exit status is the contract:
0 for success, 5 when a tool returns `isError`. Skipped only where Node's `npx` is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tree_under_test import tree_env

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
NPX = shutil.which("npx")
pytestmark = pytest.mark.skipif(NPX is None, reason="npx (Node.js) is not installed")

# The first run downloads the package; give it time, and retry once if the registry hiccups.
FIRST_RUN_TIMEOUT = 600
NETWORK_HINTS = ("ETIMEDOUT", "ECONNRESET", "EAI_AGAIN", "ENOTFOUND", "network", "npm error code E")


def inspector(cwd: Path, *method_args: str) -> subprocess.CompletedProcess:
    env = tree_env({**os.environ, "npm_config_yes": "true", "npm_config_update_notifier": "false",
           "npm_config_fund": "false", "npm_config_audit": "false", "MCP_INSPECTOR_SECRET_STORE": "memory"})
    # the Inspector starts the server with an environment of its own: the tree under test is passed to it with -e
    argv = [NPX, "-y", INSPECTOR, "--cli", "-e", f"PYTHONPATH={env['PYTHONPATH']}", sys.executable, "-m",
            "meshplan.faces.mcp", *method_args, "--format", "json"]
    for attempt in range(2):
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=FIRST_RUN_TIMEOUT)
        if proc.returncode in (0, 5) or attempt or not any(h in proc.stderr for h in NETWORK_HINTS):
            return proc
    return proc


def payload(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON on stdout (exit {proc.returncode}); stderr: {proc.stderr[-2000:]}"
    return json.loads(lines[-1])["result"]


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inspector")


def test_inspector_lists_the_tools(outside):
    proc = inspector(outside, "--method", "tools/list")
    assert proc.returncode == 0, proc.stderr[-2000:]
    tools = payload(proc)["tools"]
    assert {t["name"] for t in tools} >= {"recommend_parallelism", "check_config", "estimate_memory"}
    assert all(t["annotations"]["readOnlyHint"] is True for t in tools)


def test_inspector_strict_schema_lint_passes(outside):
    proc = inspector(outside, "--method", "tools/list", "--strict")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_inspector_calls_recommend_parallelism(outside):
    args = json.dumps({"model": "llama-3.1-8b", "num_gpus": 8, "top_k": 2})
    proc = inspector(outside, "--method", "tools/call", "--tool-name", "recommend_parallelism",
                     "--tool-args-json", args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = payload(proc)
    assert result["isError"] is False
    assert 1 <= len(result["structuredContent"]["candidates"]) <= 2


def test_inspector_invalid_call_exits_5_with_the_reason(outside):
    args = json.dumps({"model": "llama-3.1-8b", "num_gpus": 8, "gpu": "h1000"})
    proc = inspector(outside, "--method", "tools/call", "--tool-name", "recommend_parallelism",
                     "--tool-args-json", args)
    assert proc.returncode == 5, proc.stderr[-2000:]
    result = payload(proc)
    assert result["isError"] is True and "Unknown GPU 'h1000'" in result["content"][0]["text"]
