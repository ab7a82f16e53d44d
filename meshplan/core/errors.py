"""One exception type for every user-facing failure, so each face (CLI, MCP, batch) can report it cleanly.

A `MeshplanError` always says what was wrong and what would work; the CLI prints it without a
traceback, the MCP server turns it into a `ToolError`, batch mode turns it into `{"error": ...}`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MeshplanError(ValueError):
    """A request meshplan cannot answer, with the reason and (when known) the fix."""

    def __init__(self, message: str, fix: str | None = None, fields: Iterable[str] = ()):
        self.reason = message
        self.fix = fix
        self.fields = tuple(fields)  # the request fields refused, so a face that read them from a file can cite it
        super().__init__(message if not fix else f"{message} Fix: {fix}")

    def cited(self, sources: dict[str, str]) -> MeshplanError:
        """The same refusal with where a file set its fields (`sources`: field -> 'path:line key', a config reader's
        ImportedConfig.sources), so a refusal of a value read from a file names the line to change."""
        said = "; ".join(f"{name} at {sources[name]}" for name in self.fields if name in sources)
        if not said:
            return self
        beside = "A value given beside the file (a flag beside --config, or the tool's argument) overrides the file's."
        return MeshplanError(f"{self.reason.rstrip('.')} (read from the file: {said}).",
                             fix=f"{self.fix} {beside}" if self.fix else beside, fields=self.fields)


def closest(name: str, choices: Iterable[str], n: int = 5) -> list[str]:
    """Closest known names to a misspelt one, for 'did you mean' hints."""
    if not str(name).strip():
        return []  # an empty name is in every name: no guess is better than the first five
    pool = list(choices)
    lowered = {c.lower(): c for c in pool}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    if not hits:
        hits = [c for c in lowered if name.lower() in c or c in name.lower()][:n]
    return [lowered[h] for h in hits]


class Cancelled(Exception):
    """The caller cancelled the computation (an MCP `notifications/cancelled`); raised by
    `meshplan.core.cancel.checkpoint`.

    Deliberately not a `MeshplanError` (nor a `ValueError`): the search catches those per layout and moves on
    to the next one, which would swallow the cancellation and keep the work running.
    """
