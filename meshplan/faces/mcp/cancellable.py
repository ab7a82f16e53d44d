"""Tool calls that stop computing when the client cancels them.

The SDK runs a sync tool with `anyio.to_thread.run_sync`, which cannot be interrupted: a
`notifications/cancelled` (or a client that hangs up) leaves the thread computing to the end. Here the
tool runs in a worker thread under a fresh `meshplan.core.cancel.Token`; when the awaiting task is cancelled
the token is set, the search raises `Cancelled` at its next checkpoint, and the thread ends. Over HTTP a client
that hangs up mid-call is turned into the same cancellation (http_edges.py).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from meshplan.core.cancel import Token, scope

T = TypeVar("T")

# How long a cancelled call waits for its thread to reach a checkpoint before giving up on it (the search
# checks once per layout or queue step, each well under 100 ms), so that a cancelled call has stopped
# computing when it returns.
STOP_WAIT_S = 1.0
_POLL_S = 0.005


async def run_cancellable(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """`fn(**kwargs)` in a worker thread that stops at its next checkpoint once this task is cancelled."""
    token = Token()

    def work() -> T:
        with scope(token):
            return fn(**kwargs)

    try:
        return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        token.cancel()
        with anyio.move_on_after(STOP_WAIT_S, shield=True):
            while not token.stopped:
                await anyio.sleep(_POLL_S)
        raise


def cancellable(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """An async tool that runs `fn` through `run_cancellable`, with `fn`'s name, docstring and signature.

    `functools.wraps` copies `__name__`, `__doc__`, `__annotations__` and `__dict__` (where an explicit
    `__signature__` lives) and sets `__wrapped__`, which `inspect.signature` and `typing.get_type_hints`
    follow to `fn`'s own module for string annotations: the SDK builds the same input and output schemas.
    """

    @functools.wraps(fn)
    async def tool(**kwargs: Any) -> T:
        return await run_cancellable(fn, **kwargs)

    return tool
