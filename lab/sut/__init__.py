"""Clients under test: MCP client implementations the lab did not write, behind adapters.

An adapter is a process that hosts many clients of one implementation. It reads commands
(start a client, call a tool, cancel, leave, stop) as JSON lines on stdin and writes an
application log (`mcpLabAppLog.v1`): what the implementation delivered to the
application, each call's outcome, the reconnects it made, and its lifecycle. The
protocol is in `docs/clients.md`.

Modules:
    protocol     the commands and records, parsing and digests (no I/O)
    applog       the application log as a driver writes it (pseudonyms, digests, scrubbing)
    runtime      the adapter loop for Python implementations (one anyio event loop)
    python_sdk   the adapter for the official Python SDK (`python -m lab.sut.python_sdk`)
    host         starting an adapter process and talking to it (python-sdk,
                 typescript-sdk, or `cmd:<command>`)
    typescript/  the adapter for `@modelcontextprotocol/sdk` (Node; `make node-adapter`)

This package imports only `lab.wire` and `lab.exitcodes` from the lab: never the client
core, the load layer or Locust (an adapter never runs in a gevent-patched process).
"""
