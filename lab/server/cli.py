"""`lab serve`: run the reference server under uvicorn on 127.0.0.1."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the reference MCP server (Streamable HTTP, resumable streams, ledgers)",
        description="Run the reference MCP server. Prints `lab-serve listening on URL` when ready.",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback only unless --tokens is set)")
    p.add_argument("--port", type=int, default=8000, help="port (0 = any free port); default 8000")
    p.add_argument("--path", default="/mcp", help="the MCP endpoint path (default /mcp)")
    p.add_argument("--ledger", help="SQLite ledger file (mcpServerLedger.v1); none if omitted")
    p.add_argument("--tokens", default="", help="bearer tokens: token=subject,token2=subject2")
    p.add_argument("--allowed-origins", help="comma-separated Origin allow-list; `:*` matches any port")
    p.add_argument("--allowed-hosts", help="comma-separated Host allow-list (DNS-rebinding protection)")
    p.add_argument("--session-ttl", type=float, default=300.0, help="idle seconds before a session expires")
    p.add_argument("--delete", choices=["allow", "refuse"], default="allow", help="refuse: DELETE gets 405")
    p.add_argument("--cursor-policy", choices=["reject", "fresh"], default="reject")
    p.add_argument("--cursor-reject-status", type=int, default=400, help="400 (default), 409, 410 or 422")
    p.add_argument("--max-streams", type=int, default=10_000, help="concurrent SSE streams before 503")
    p.add_argument("--max-rps", type=float, default=0.0, help="requests/s before 429 (0 = unlimited)")
    p.add_argument("--retry-after", type=int, default=1, help="seconds advised when shedding load")
    p.add_argument(
        "--resumable-fraction", type=float, default=1.0, help="rollout: share of resumable sessions"
    )
    p.add_argument("--rollback", action="store_true", help="new streams are not resumable (old cursors stay)")
    p.add_argument("--admin-token", help="enables /lab-admin/* (loopback only) with this token")
    p.add_argument("--heartbeat-ms", type=int, default=0, help="notification period on standalone streams")
    p.add_argument("--event-retention", type=int, default=10_000, help="events kept per stream for replay")
    p.add_argument(
        "--keepalive", type=float, default=10.0, help="seconds of silence before an SSE comment (0: never)"
    )
    p.add_argument(
        "--completed-stream-ttl", type=float, default=120.0, help="seconds a completed stream stays resumable"
    )
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from lab.server.config import ServerConfig, parse_list, parse_tokens

    defaults = ServerConfig()
    key_hex = os.environ.get("LAB_LEDGER_KEY")
    return ServerConfig(
        host=args.host,
        port=args.port,
        ledger_path=args.ledger,
        ledger_key=bytes.fromhex(key_hex) if key_hex else secrets.token_bytes(32),
        tokens=parse_tokens(args.tokens),
        allowed_origins=parse_list(args.allowed_origins)
        if args.allowed_origins
        else defaults.allowed_origins,
        allowed_hosts=parse_list(args.allowed_hosts) if args.allowed_hosts else defaults.allowed_hosts,
        session_ttl=args.session_ttl,
        refuse_delete=args.delete == "refuse",
        cursor_policy=args.cursor_policy,
        cursor_reject_status=args.cursor_reject_status,
        max_streams=args.max_streams,
        max_rps=args.max_rps,
        retry_after=args.retry_after,
        resumable_fraction=args.resumable_fraction,
        rollback=args.rollback,
        admin_token=args.admin_token,
        heartbeat_ms=args.heartbeat_ms,
        event_retention=args.event_retention,
        keepalive_s=args.keepalive,
        completed_stream_ttl=args.completed_stream_ttl,
    )


def run(args: argparse.Namespace) -> int:
    import signal
    import socket

    import uvicorn

    from lab.server.app import McpApp

    try:
        config = config_from_args(args)
        app = McpApp(config, path=args.path)
    except ValueError as e:
        print(f"lab serve: {e}", file=sys.stderr)
        return 2
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        print(f"lab serve: cannot bind {config.host}:{config.port}: {e}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if family == socket.AF_INET6 else config.host
    url = f"http://{host}:{port}{args.path}"

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            print(f"lab-serve listening on {url}", flush=True)

    uv = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=1,
        timeout_keep_alive=30,
        backlog=4096,
    )
    # uvicorn re-raises SIGINT/SIGTERM once it has shut down gracefully; answer that with a
    # clean exit, so that a stop by signal reads as exit 0 (it was not a crash).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(0))
    try:
        Server(uv).run(sockets=[sock])
    finally:
        app.close()
    return 0
