"""The faces people and agents use: the command line, its display, the skill docs generator, the MCP server."""
