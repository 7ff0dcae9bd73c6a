"""contextd over MCP: the `memory` and `build_prompt` tools at `/mcp` (streamable HTTP)."""
