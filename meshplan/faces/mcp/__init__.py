"""meshplan's MCP server: the meshplan tools, cards and skills for IDE agents and coding assistants.

Run it with `meshplan serve`, `meshplan-mcp` or `python -m meshplan.faces.mcp` (stdio), or over
streamable HTTP with `--transport http`. The server object lives in `meshplan.faces.mcp.server`;
importing this package alone loads nothing heavy.
"""
