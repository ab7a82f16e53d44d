"""meshplan's MCP server: the meshplan tools, cards and skills for IDE agents and coding assistants.

Run it with `meshplan serve`, `meshplan-mcp` or `python -m meshplan.faces.mcp` (stdio), or over
streamable HTTP with `--transport http`. The server object lives in `meshplan.faces.mcp.server`;
importing this package alone loads nothing heavy.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def start_up() -> Iterator[None]:
    """The server process's start-up (importing the SDK, building the server) with the cyclic garbage collector paused.

    Start-up allocates some 130,000 objects that live as long as the process (the SDK's protocol models, meshplan's
    schemas and tools) and next to no garbage (about 3,000 objects in cycles), yet the collector walked the growing
    heap over and over meanwhile: about a tenth of the start-up's CPU. When it resumes, what start-up built is frozen
    (`gc.freeze`), so neither the first collection after the pause nor any later one walks it again.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
