"""Headless Chromium driven over the DevTools protocol through a pipe (--remote-debugging-pipe: JSON messages
separated by NUL on fds 3 and 4), so no websocket library is needed. Used by tests/test_report_browser.py.

Chromium is Debian's `chromium` package (.ci/run installs it); without it the browser tests skip, except under
CI=true, where they fail.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """The browser's path; skips the test when there is none (fails under CI=true, where .ci/run installs it)."""
    for name in CANDIDATES:
        if found := shutil.which(name):
            return found
    reason = "headless Chromium is not installed (apt-get install chromium; .ci/run does)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}: CI=true requires the browser tests to run")
    pytest.skip(reason)


def _above_nine(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Browser:
    """One headless Chromium with one page; records console errors, exceptions and every request's URL."""

    def __init__(self, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.TemporaryDirectory(prefix="meshplan-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the child's ends above fd 9, so moving them onto 3 and 4 cannot close one another
        to_browser_r, from_browser_w = (_above_nine(fd) for fd in (to_browser_r, from_browser_w))
        args = [chromium_path(), "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--metrics-recording-only", "--mute-audio", f"--user-data-dir={self.profile.name}",
                "--window-size=1400,1800", "about:blank"]
        # the browser reads fd 3 and writes fd 4: the shell moves the pipe's ends there, then becomes the browser
        shell = f'exec 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-; exec "$@"'
        self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *args], pass_fds=(to_browser_r, from_browser_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.call(f"{domain}.enable", session=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, after: int = 0) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for event in self.events[after:]:
                if event.get("method") == method:
                    return event
            self.events.append(self._read_message(deadline))

    def load(self, url: str) -> None:
        mark = len(self.events)
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired", mark)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: str) -> None:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as out:
            out.write(base64.b64decode(data))

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def console_errors(self) -> list[str]:
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(str(params["entry"].get("text")))
        return found

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        os.close(self._to_browser)
        os.close(self._from_browser)
        self.profile.cleanup()
