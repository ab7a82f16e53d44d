"""`python -m meshplan.faces.mcp` and the `meshplan-mcp` console script: start the MCP server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from meshplan.core.errors import MeshplanError
from meshplan.faces.mcp import ALLOW_SERVER_FILES_HELP, start_up


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshplan-mcp", description="Run the meshplan MCP server (stdio by default).")
    parser.add_argument("--transport", choices=["stdio", "http", "streamable-http"], default=None,
                        help="(default: stdio)")
    parser.add_argument("--http", action="store_true",
                        help="The same as --transport http (meshplan serve --http)")
    parser.add_argument("--host", default=None, help="HTTP bind address (default: 127.0.0.1, loopback unless told "
                                                     "otherwise)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default: 8765)")
    parser.add_argument(
        "--allowed-host", action="append", default=[], metavar="HOST[:PORT]",
        help="Extra Host header to accept over HTTP when binding beyond loopback (repeatable)",
    )
    parser.add_argument("--allow-server-files", action="append", default=[], metavar="DIR",
                        help=ALLOW_SERVER_FILES_HELP)
    args = parser.parse_args(argv)

    with start_up():
        from meshplan.faces.mcp.server import EXIT_INTERRUPTED, chosen_transport, run

    try:
        run(transport=chosen_transport(args.transport, args.http), host=args.host, port=args.port,
            allowed_hosts=args.allowed_host, allow_server_files=args.allow_server_files)
    except MeshplanError as exc:
        print(f"meshplan-mcp: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # HTTP mode after its shutdown; stdio mode ends itself (server.run)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
