"""Helpers of addons/mcp_faults.py: option parsing (pure), the tap writer, and the I/O seams.

Not an addon itself (loading it with -s adds nothing). mcp_faults.py imports it as a sibling
module: mitmproxy puts a script's folder on sys.path while it loads the script. The seams
(`cut_client_connection`, `admin_expire`) are attributes of the addon, so tests replace them.
"""

# No `from __future__ import annotations`: this module is imported while mitmproxy loads
# the script, and its dataclasses must resolve their annotations (see mcp_faults.py).
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from mitmproxy import ctx, exceptions, http

from lab.faults.pipeline import Record
from lab.faults.plan import EMPTY_PLAN, Plan, parse_plan

SESSION_HEADER: Final = "mcp-session-id"
ADMIN_PATH: Final = "/lab-admin/expire"


# ---------------------------------------------------------------------- option parsing (pure)


def parse_key(value: str) -> bytes:
    """The run's pseudonym key from hex (>= 16 bytes)."""
    try:
        key = bytes.fromhex(value.strip())
    except ValueError:
        raise ValueError("the ledger key must be hex (LAB_LEDGER_KEY or mcpfaults_key)") from None
    if len(key) < 16:
        raise ValueError(f"the ledger key must be at least 16 bytes (32 hex digits), got {len(key)}")
    return key


def parse_origin_patterns(value: str) -> tuple[str, ...]:
    """Comma-separated Origin patterns, as the reference server takes them (`:*` = any port)."""
    pats = tuple(p.strip() for p in value.split(",") if p.strip())
    for p in pats:
        if "://" not in p and p != "null":
            raise ValueError(f"an Origin pattern needs a scheme, like 'http://127.0.0.1:*': {p!r}")
    return pats


def read_plan(value: str) -> tuple[Plan, Path | None]:
    """The plan named by the option: "" (no faults), inline JSON (`{...}`), or a file path."""
    value = value.strip()
    if not value:
        return EMPTY_PLAN, None
    if value.startswith("{"):
        return parse_plan(value, name="mcpfaults_plan"), None
    path = Path(value)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the fault plan {path}: {e.strerror or e}") from None
    return parse_plan(text, name=str(path)), path


def options_error(message: str) -> exceptions.OptionsError:
    return exceptions.OptionsError(message)  # type: ignore[no-untyped-call]


def addon(name: str) -> Any:
    """Another loaded addon by name (mitmproxy's lookup is untyped), or None."""
    return ctx.master.addons.get(name)  # type: ignore[no-untyped-call]


def kill(flow: http.HTTPFlow) -> None:
    """flow.kill() where it is allowed (mitmproxy's is untyped and raises on a dead flow)."""
    if flow.killable:
        flow.kill()  # type: ignore[no-untyped-call]


def parse_seconds(name: str, value: str, *, default: float, positive: bool = False) -> float:
    """A number of seconds from a string option ("" = `default`)."""
    if not value.strip():
        return default
    try:
        v = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(
            f"{name} must be a finite number of seconds {'> 0' if positive else '>= 0'}, got {value!r}"
        )
    return v


def check_admin_url(value: str) -> str:
    if value and (urlsplit(value).scheme != "http" or not urlsplit(value).hostname):
        raise ValueError(f"mcpfaults_admin_url must be an http:// URL, got {value!r}")
    return value


# ---------------------------------------------------------------------- the tap


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


class Tap:
    """Append-only JSON lines; each batch of records goes out in one write(2), unbuffered."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, records: Sequence[Record]) -> None:
        data = ("\n".join(r if isinstance(r, str) else dumps(r) for r in records) + "\n").encode()
        view = memoryview(data)
        for _ in range(1000):  # a regular file takes it in one go; bounded just in case
            if not view:
                return
            n = os.write(self._fd, view)
            view = view[n:]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# ---------------------------------------------------------------------- I/O seams


def cut_client_connection(flow: http.HTTPFlow) -> None:
    """Close the client's socket now (flow.kill() does not stop a flow that is streaming).

    Closing the writer sends what is buffered, then FIN; mitmproxy skips every later write
    to a closing writer, so the client never gets the end of the body (for chunked
    encoding the `0` chunk) and sees the cut. mitmproxy then notices the closed
    connection itself and tears the server side down.
    """
    ps = addon("proxyserver")
    handler = ps.connections.get(flow.client_conn.id) if ps is not None else None
    io = handler.transports.get(handler.client) if handler is not None else None
    if io is not None and io.writer is not None:
        io.writer.close()
    else:
        kill(flow)


@dataclass(frozen=True, slots=True)
class AdminCall:
    url: str
    token: str
    session_id: str
    timeout: float


def admin_expire(call: AdminCall) -> int:
    """POST the reference server's expire control; the HTTP status, or -1 if it failed."""
    u = urlsplit(call.url)
    conn = HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=call.timeout)
    try:
        conn.request(
            "POST",
            u.path or ADMIN_PATH,
            body=b"",
            headers={"x-lab-admin-token": call.token, SESSION_HEADER: call.session_id},
        )
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return -1
    finally:
        conn.close()


# ---------------------------------------------------------------------- listen backlog

LISTEN_BACKLOG: Final = 4096


def raise_listen_backlog(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> bool:
    """Raise the listen backlog of this process's socket listening on (host, port).

    mitmproxy listens with asyncio's default backlog of 100; a burst of a few hundred
    (re)connecting clients overflows it and the kernel drops their handshakes (measured: a
    burst of 1,500 connects made ~2,200 listen overflows; clients saw resets). Calling
    listen() again on a listening socket updates its backlog; the socket is reached through
    a duplicate of its descriptor, so mitmproxy's own socket object is left untouched.
    Returns whether such a socket was found.
    """
    import socket

    for name in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            dup = socket.socket(fileno=os.dup(fd))  # family and type are read from the descriptor
        except OSError:
            continue
        with dup:
            try:
                listening = dup.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                addr = dup.getsockname()
            except OSError:
                continue
            if (
                listening
                and isinstance(addr, tuple)
                and addr[1] == port
                and addr[0] in (host, "0.0.0.0", "::")
            ):
                dup.listen(backlog)
                return True
    return False
