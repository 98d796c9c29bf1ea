"""The reference MCP server: every resumption rule of docs/spec.md done right (ASGI, uvicorn)."""
