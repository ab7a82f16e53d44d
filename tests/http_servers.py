"""A server process for a test to talk to over HTTP: started on a free loopback port as a host starts it, waited for
until it accepts connections, stopped after (the shared `http_server` fixture in conftest.py and the MCP transport
tests' own servers)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tree_under_test import tree_env


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(argv: list[str], cwd: Path, start_s: float = 60.0) -> Iterator[int]:
    """Runs `argv` plus a free port as its last argument (a server listening there) from `cwd` with only HOME and
    PATH in its environment, as a host starts it; yields the port once it accepts connections, and stops it after.
    Its stderr goes to cwd/stderr.log (a file, not a pipe: a full pipe would stall the server) and is shown if it
    does not start."""
    port = free_port()
    env = tree_env({k: v for k, v in os.environ.items() if k in ("HOME", "PATH")})
    log = cwd / "stderr.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([*argv, str(port)], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + start_s
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

