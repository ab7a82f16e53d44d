"""The contract: pydantic models for every input and output (they are the MCP schemas too)."""
