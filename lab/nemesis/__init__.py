"""The TCP nemesis: an embedded TCP proxy that speaks the Toxiproxy HTTP API (v2).

Modules, and what each may import:
- `toxics`, `proxyspec` — pure parsing and validation of toxic and proxy fields (no I/O).
- `log` — the `mcpLabNemesis.v1` JSON-lines log (plain file writes, no trio).
- `client`, `schedule` — a thin wrapper around `toxiproxy-python` and the toxics schedule
  runner; plain blocking code (threads or a simple loop), usable against this nemesis or
  a real Toxiproxy server. They never import trio.
- `proxy`, `server`, `api` — the trio proxy, its state, and the HTTP API (h11 on trio).
- `cli` — `lab nemesis`; imports trio only inside the command.

This package imports nothing at import time (see `lab/__init__.py` for why).
"""
