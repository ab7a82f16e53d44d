"""Which files on the machine meshplan runs on a request may make it read.

Over stdio, the CLI and the Python api the caller is the machine's own user: a path in a request (a model's
config.json, a launch script, the config file a script names) is theirs, read as given. Over HTTP (`meshplan serve
--transport http`) the caller is remote: a path names a file on the server, and reading it, or answering whether it
exists or where its JSON breaks, hands the server's files to whoever reaches the port. The HTTP server therefore runs
under `remote(...)`: every read a request names asks `server_path` (or `is_file`, `exists`), which refuses any path
outside the folders the operator allowed (`serve --allow-server-files DIR`; none by default), resolved first, so a
'..' or a symlink out of the folder is refused too. A refused path is never opened or probed, so its error holds
nothing of the file.

The policy lives in a ContextVar (as cancel.py's token): the tool calls' worker threads and the page's inherit the
server's. A model's config.json needs no file: its text is the model (`model`, MCP's config_text, the page's paste;
knowledge/model_config.architecture_from_text).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from meshplan.core.errors import MeshplanError

__all__ = ["confined", "exists", "is_dir", "is_file", "remote", "server_name", "server_path"]


@dataclass(frozen=True)
class Confinement:
    """A remote caller's reach: the resolved folders it may read, and the one a relative path is read from."""

    roots: tuple[Path, ...]
    base: Path | None  # the operator's folder (--allow-server-files); None: a relative path names nothing


_policy: ContextVar[Confinement | None] = ContextVar("meshplan_server_files", default=None)

SEND_CONTENT = ("Over HTTP send the content, not a path: a framework config or launch script as config_text; a "
                "model's config.json as its text, as model or config_text (or pasted in the web page at /); or a "
                "catalog key, Hugging Face id or size such as '70B' as model. Or the server's operator starts it with "
                "--allow-server-files DIR to let it read that folder (a relative path is read from there).")


@contextmanager
def remote(allowed: Sequence[Path] = ()) -> Iterator[None]:
    """Serve the body's requests as a remote caller's: no file read but inside `allowed` (resolved: each must be an
    existing folder, which the entry points check before the server starts)."""
    roots = tuple(Path(folder).resolve() for folder in allowed)
    token = _policy.set(Confinement(roots, roots[0] if roots else None))
    try:
        yield
    finally:
        _policy.reset(token)


def confined() -> bool:
    """Whether this request is a remote caller's (its reads confined)."""
    return _policy.get() is not None


def _refused(name: str, what: str, why: str) -> MeshplanError:
    return MeshplanError(f"{what} {name[:200]!r} names a file on the server, {why}; this server reads no file of "
                         "its own for a caller over HTTP.", fix=SEND_CONTENT)


def server_path(name: str | Path, what: str) -> Path:
    """The path a request names, to read: as given where the caller is local; for a remote caller resolved (symlinks
    and '..' followed), a relative one from the operator's folder, and refused unless inside an allowed folder."""
    policy = _policy.get()
    if policy is None:
        return Path(name)
    text = str(name)
    if text.startswith("~"):
        raise _refused(text, what, "in a home directory")
    path = Path(text)
    if not path.is_absolute():
        if policy.base is None:
            raise _refused(text, what, "and no folder is open to it")
        path = policy.base / path
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte: no path to read
        raise _refused(text, what, "which cannot be resolved") from None
    if not any(real.is_relative_to(root) for root in policy.roots):
        raise _refused(text, what, "outside the folder it may read" if policy.roots else "and no folder is open to it")
    return real


def server_name(name: str, what: str) -> str:
    """`server_path` as text: the name exactly as given where the caller is local (its messages unchanged)."""
    return str(server_path(name, what)) if confined() else name


def _probe(path: str | Path, test: str) -> bool:
    """`Path.is_file` / `Path.exists` of a path a request names, False for a remote caller's path it may not read (a
    refused path is not probed: whether it exists is the server's to keep)."""
    try:
        real = server_path(path, "a path") if confined() else Path(path).expanduser()
        return bool(getattr(real, test)())
    except (MeshplanError, OSError, RuntimeError, ValueError):
        return False


def is_file(path: str | Path) -> bool:
    """Whether `path` is a file this request may read."""
    return _probe(path, "is_file")


def is_dir(path: str | Path) -> bool:
    """Whether `path` is a folder this request may read."""
    return _probe(path, "is_dir")


def exists(path: str | Path) -> bool:
    """Whether `path` exists where this request may read (a local caller's '~' expanded)."""
    return _probe(path, "exists")
