"""The reference MCP server: every resumption rule of SPEC.md done right (ASGI, uvicorn)."""
