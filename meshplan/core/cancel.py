"""Cooperative cancellation: a token per computation, checked at the head of the search's loops.

Python cannot stop a thread from outside. The MCP server runs each tool call in a worker thread, so
when a client cancels the call the thread would compute to the end for nobody. Instead the server
opens a `scope` with a fresh `Token` around the call and sets the token on cancellation; the search
calls `checkpoint()` once per layout or queue step and raises `Cancelled` at the first one after the
token is set, which ends the thread within one step (well under 100 ms).

The token lives in a ContextVar, so concurrent calls in different threads each see their own, and code
that runs outside any scope (the CLI, the Python API, batch mode) pays one ContextVar read per step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from meshplan.core.errors import Cancelled

__all__ = ["Cancelled", "Token", "cancelled", "checkpoint", "running", "scope"]


class Token:
    """Set once by whoever may cancel (`cancel`); read by the computation (`checkpoint`); says when it stopped."""

    __slots__ = ("_cancelled", "_stopped")

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self._stopped = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def stopped(self) -> bool:
        """The computation under this token has left its scope (returned, raised or was cancelled)."""
        return self._stopped.is_set()


_current: ContextVar[Token | None] = ContextVar("meshplan_cancel_token", default=None)
_lock = threading.Lock()
_running = 0
_cancelled = 0


def checkpoint() -> None:
    """Raise `Cancelled` if the current computation's token was cancelled; a no-op outside any scope."""
    token = _current.get()
    if token is not None and token._cancelled.is_set():
        raise Cancelled("The computation was cancelled by the caller.")


@contextmanager
def scope(token: Token) -> Iterator[Token]:
    """Run the body under `token`: its `checkpoint()` calls obey the token, and `running()` counts it."""
    global _running, _cancelled
    reset = _current.set(token)
    with _lock:
        _running += 1
    try:
        yield token
    except Cancelled:
        with _lock:
            _cancelled += 1
        raise
    finally:
        with _lock:
            _running -= 1
        _current.reset(reset)
        token._stopped.set()


def running() -> int:
    """How many computations are inside a scope now (the MCP server: tool calls still computing)."""
    return _running


def cancelled() -> int:
    """How many computations have stopped at a checkpoint because their token was cancelled, since start-up."""
    return _cancelled
