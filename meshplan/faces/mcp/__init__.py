"""meshplan's MCP server: the meshplan tools, cards and skills for IDE agents and coding assistants.

Run it with `meshplan serve`, `meshplan-mcp` or `python -m meshplan.faces.mcp` (stdio), or over
streamable HTTP with `--transport http`. The server object lives in `meshplan.faces.mcp.server`;
importing this package alone loads nothing heavy.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# The help of --allow-server-files, the same on `meshplan serve` and `meshplan-mcp` (here: neither loads the server to
# print its help).
ALLOW_SERVER_FILES_HELP = (
    "Over HTTP the caller is remote, so the server reads none of its own files for a request: a model's config.json "
    "path, a launch script or a config file a pasted script names is refused, and the content is sent instead "
    "(a config.json's text as model or config_text, a framework config as config_text, or a config.json pasted in "
    "the web page). This opens DIR: paths inside it (resolved, no symlink "
    "out) are read, a relative one from the first DIR given (repeatable; default: none; stdio reads its user's paths "
    "as given)")


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
