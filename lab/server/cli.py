"""`lab serve`: run the reference server under uvicorn on 127.0.0.1.

Settings come from `ServerConfig`'s defaults, then `--config FILE` (a JSON object of
ServerConfig fields), then the flags given on the command line: a flag overrides the file.
Exit codes (lab/exitcodes.py): 0 stopped by a signal, 3 bad settings, a store it cannot
restore from, or cannot bind, 4 the ledger's or the store's writer failed (the server
stops at once rather than lose evidence, or state a restart would need).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any

from lab.exitcodes import ExitCode

_DEFECTS_HELP = """\
defects (--defect NAME, repeatable; the server then breaks that rule on purpose):
{defects}

--config FILE: a JSON object whose keys are the settings' field names, e.g.
  {{"tokens": {{"t1": "alice,evil=mallory"}}, "allowed_origins": ["http://127.0.0.1:*"],
   "session_ttl": 60, "defects": ["no-priming"], "event_ids": "seq"}}
Flags given on the command line override the file. Fields: {fields}.
"""

# flag -> (ServerConfig field, converter from the flag's text)
_Conv = Callable[[str], Any]


def _conversions() -> dict[str, tuple[str, _Conv]]:
    from lab.server.config import parse_list, parse_tokens

    return {
        "host": ("host", str),
        "port": ("port", int),
        "ledger": ("ledger_path", str),
        "store": ("store", str),
        "tokens": ("tokens", parse_tokens),
        "allowed_origins": ("allowed_origins", parse_list),
        "allowed_hosts": ("allowed_hosts", parse_list),
        "session_ttl": ("session_ttl", float),
        "delete": ("refuse_delete", lambda v: v == "refuse"),
        "cursor_policy": ("cursor_policy", str),
        "cursor_reject_status": ("cursor_reject_status", int),
        "max_streams": ("max_streams", int),
        "max_rps": ("max_rps", float),
        "retry_after": ("retry_after", int),
        "resumable_fraction": ("resumable_fraction", float),
        "rollback": ("rollback", bool),
        "admin_token": ("admin_token", str),
        "heartbeat_ms": ("heartbeat_ms", int),
        "event_retention": ("event_retention", int),
        "keepalive": ("keepalive_s", float),
        "completed_stream_ttl": ("completed_stream_ttl", float),
        "event_ids": ("event_ids", str),
        "defect": ("defects", tuple),
        "max_sessions": ("max_sessions", int),
        "max_session_streams": ("max_session_streams", int),
        "max_session_event_bytes": ("max_session_event_bytes", int),
        "max_header_bytes": ("max_header_bytes", int),
        "header_timeout": ("header_timeout", float),
        "body_timeout": ("body_timeout", float),
        "protocol_versions": ("protocol_versions", lambda v: tuple(parse_list(v))),
        "json_answers": ("json_answers", bool),
    }


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from lab.server.config import EVENT_ID_SCHEMES, FIELDS
    from lab.server.defects import DEFECT_NAMES, help_text

    p = sub.add_parser(
        "serve",
        help="run the reference MCP server (Streamable HTTP, resumable streams, ledgers)",
        description="Run the reference MCP server. Prints `lab-serve listening on URL` when ready.",
        epilog=_DEFECTS_HELP.format(defects=help_text(), fields=", ".join(FIELDS)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=None,  # unset flags stay None: only given ones override --config
    )
    a = p.add_argument
    a("--config", metavar="FILE", help="JSON object of settings (field names as below); flags override it")
    a("--host", help="bind address (loopback only unless tokens are set); default 127.0.0.1")
    a("--port", type=int, help="port (0 = any free port); default 8000")
    a(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="answer on N ports, one state: replicas over one shared store (the first port is --port, "
        "the others free ones; the ready line lists every URL)",
    )
    a("--path", default="/mcp", help="the MCP endpoint path (default /mcp)")
    a("--ledger", help="SQLite ledger file (mcpServerLedger.v1); none if omitted")
    a(
        "--store",
        metavar="FILE",
        help="SQLite store of sessions, streams and events, so that a restart keeps them "
        "(private: it holds raw session IDs); in memory only if omitted",
    )
    a("--tokens", help="bearer tokens: token=subject,token2=subject2 (use --config for any other text)")
    a("--allowed-origins", help="comma-separated Origin allow-list; `:*` matches any port")
    a("--allowed-hosts", help="comma-separated Host allow-list (DNS-rebinding protection)")
    a("--session-ttl", type=float, help="idle seconds before a session expires (300)")
    a("--delete", choices=["allow", "refuse"], help="refuse: DELETE gets 405 (allow)")
    a("--cursor-policy", choices=["reject", "fresh"], help="what a bad Last-Event-ID gets (reject)")
    a("--cursor-reject-status", type=int, help="400 (default), 409, 410 or 422")
    a("--max-streams", type=int, help="concurrent SSE streams before 503 (10000)")
    a("--max-rps", type=float, help="requests/s before 429 (0 = unlimited)")
    a("--retry-after", type=int, help="seconds advised when shedding load (1)")
    a("--resumable-fraction", type=float, help="rollout: share of resumable sessions (1.0)")
    a(
        "--rollback",
        action="store_true",
        default=None,
        help="new streams are not resumable (old cursors stay)",
    )
    a("--admin-token", help="enables /lab-admin/* (loopback only) with this token")
    a("--heartbeat-ms", type=int, help="notifications/message period on standalone streams (0: none)")
    a("--event-retention", type=int, help="events kept per stream for replay (10000)")
    a("--keepalive", type=float, help="seconds of silence before an SSE comment (10; 0: never)")
    a("--completed-stream-ttl", type=float, help="seconds a completed stream stays resumable (120)")
    a("--event-ids", choices=EVENT_ID_SCHEMES, help="e1 (default): MAC'd IDs; seq, uuid: opaque IDs")
    a("--defect", action="append", choices=DEFECT_NAMES, metavar="NAME", help="misbehave on purpose (below)")
    a("--max-sessions", type=int, help="live sessions; then evict the oldest idle one, or 503 (10000)")
    a("--max-session-streams", type=int, help="open streams per session; then 429 (64)")
    a("--max-session-event-bytes", type=int, help="bytes of events a session retains (1048576)")
    a("--max-header-bytes", type=int, help="bytes of a request head before 431 (65536)")
    a("--header-timeout", type=float, help="seconds to receive a request head before 408 (10)")
    a("--body-timeout", type=float, help="seconds to receive a request body before 408 (30)")
    a(
        "--protocol-versions",
        help="comma-separated revisions it serves: handshake-era ones (negotiated at initialize) and "
        "2026-07-28 (the modern era, sessionless; docs/eras.md) (default: every one it knows)",
    )
    a(
        "--json-answers",
        action="store_const",
        const=True,
        help="answer tools/call of every tool but ticker as application/json, not an SSE stream",
    )
    a("--log-level", default="warning")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    """The ServerConfig the flags (and `--config FILE`) ask for; ValueError if they are bad."""
    from lab.server.config import ServerConfig, read_config_file

    values: dict[str, Any] = {"port": 8000}
    if args.config is not None:
        values.update(read_config_file(args.config))
    for flag, (name, conv) in _conversions().items():
        given = getattr(args, flag)
        if given is not None:
            values[name] = conv(given)
    key_hex = os.environ.get("LAB_LEDGER_KEY")
    if key_hex:
        try:
            values["ledger_key"] = bytes.fromhex(key_hex)
        except ValueError:
            raise ValueError("LAB_LEDGER_KEY must be hex") from None
    values.setdefault("ledger_key", secrets.token_bytes(32))
    return ServerConfig(**values)


def run(args: argparse.Namespace) -> int:
    import signal
    import socket

    import uvicorn

    from lab.logscrub import scrub_stderr
    from lab.server.app import McpApp
    from lab.server.durable import DurableState
    from lab.server.protocol import bounded_protocol

    scrub_stderr()  # no token or session ID in its log, whoever prints it (uvicorn's tracebacks)

    try:
        config = config_from_args(args)
        app = McpApp(config, path=args.path)
    except ValueError as e:
        print(f"lab serve: {e}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    if not 1 <= args.replicas <= 64:
        print(f"lab serve: --replicas must be 1..64, got {args.replicas}", file=sys.stderr)
        app.close()
        return ExitCode.CANNOT_RUN
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    socks: list[socket.socket] = []
    for port_wanted in [config.port] + [0] * (args.replicas - 1):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.host, port_wanted))
        except OSError as e:
            print(f"lab serve: cannot bind {config.host}:{port_wanted}: {e}", file=sys.stderr)
            app.close()
            return ExitCode.CANNOT_RUN
        socks.append(sock)
    restored = app.state.restored if isinstance(app.state, DurableState) else None
    if restored is not None:  # counts only: never an ID
        print(
            f"lab-serve restored from the store: sessions {restored.sessions}, streams {restored.streams}, "
            f"events {restored.events}, interrupted calls answered with an error {restored.interrupted}"
            + ("" if restored.clean else "; the last stop was not clean (its last batch may be lost)"),
            flush=True,
        )
    host = f"[{config.host}]" if family == socket.AF_INET6 else config.host
    url = " ".join(f"http://{host}:{s.getsockname()[1]}{args.path}" for s in socks)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if config.defects:
                print(f"lab-serve DEFECTS ON PURPOSE: {', '.join(config.defects)}", flush=True)
            print(f"lab-serve listening on {url}", flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            # The live SSE responses end first (their streams go on, or are paused in the
            # store): else uvicorn waits out its graceful timeout on each open stream.
            app.end_live_connections()
            await super().shutdown(sockets)

        async def on_tick(self, counter: int) -> bool:
            # A lost ledger writer stops the server: evidence must not go missing quietly;
            # nor may the state a restart needs (the store's writer).
            if app.ledger.failure is not None or (app.store is not None and app.store.failure is not None):
                return True
            return await super().on_tick(counter)

    uv = uvicorn.Config(
        app,
        loop="uvloop",
        http=bounded_protocol(config.max_header_bytes, config.header_timeout, config.body_timeout),
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
        Server(uv).run(sockets=socks)
    finally:
        app.close()
        if app.ledger.failure is not None:
            print(
                f"lab serve: the ledger writer failed ({app.ledger.failure!r}); "
                f"{app.ledger.rows_lost} rows were not recorded; stopping with exit 4",
                file=sys.stderr,
                flush=True,
            )
        store_failure = None if app.store is None else app.store.failure
        if store_failure is not None:
            print(
                f"lab serve: the store writer failed ({store_failure!r}); a restart would not find "
                "what happened since; stopping with exit 4",
                file=sys.stderr,
                flush=True,
            )
    failed = app.ledger.failure is not None or (app.store is not None and app.store.failure is not None)
    return ExitCode.LAB_FAILED if failed else ExitCode.PASS
