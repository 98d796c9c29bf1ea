"""Helpers of addons/mcp_faults.py and addons/mcp_tap.py: option parsing (pure) and I/O seams.

Not an addon itself (loading it with -s adds nothing). The addons import it as a sibling
module: mitmproxy puts a script's folder on sys.path while it loads the script. The seams
(`cut_client_connection`, `http_call`) are attributes of the addon, so tests replace them.
"""

# No `from __future__ import annotations`: this module is imported while mitmproxy loads
# the script, and its dataclasses must resolve their annotations (see mcp_faults.py).
import asyncio
import inspect
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from mitmproxy import ctx, exceptions, http

from lab.faults.balance import Affinity, Replica, parse_affinity, parse_replicas
from lab.faults.kinds.base import HttpCall, ProxyEnv
from lab.faults.plan import EMPTY_PLAN, Plan, parse_plan

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


@dataclass(frozen=True, slots=True)
class FaultOptions:
    """The fault addon's options, parsed."""

    plan: Plan
    path: Path | None
    run_start: float
    poll: float
    env: ProxyEnv
    replicas: tuple[Replica, ...] = ()
    """The upstreams to balance over (`mcpfaults_replicas`); empty = the one upstream."""
    affinity: Affinity = "none"


def parse_fault_options(o: Mapping[str, str]) -> FaultOptions:
    """The fault addon's `mcpfaults_*` options by name (ValueError names the bad one)."""
    env = ProxyEnv(
        o["mcpfaults_admin_token"] or os.environ.get("LAB_ADMIN_TOKEN", ""),
        check_admin_url(o["mcpfaults_admin_url"]),
        parse_seconds("mcpfaults_admin_timeout", o["mcpfaults_admin_timeout"], default=2.0, positive=True),
    )
    start = parse_seconds("mcpfaults_run_start", o["mcpfaults_run_start"], default=0.0)
    poll = parse_seconds("mcpfaults_poll", o["mcpfaults_poll"], default=1.0, positive=True)
    plan, path = read_plan(o["mcpfaults_plan"])
    replicas = parse_replicas(o.get("mcpfaults_replicas", ""))
    affinity = parse_affinity(o.get("mcpfaults_affinity", ""))
    return FaultOptions(plan, path, start, poll, env, replicas, affinity)


class PlanFile:
    """The plan file of `mcpfaults_plan`, looked at (mtime, size, inode) at most every `poll` s."""

    def __init__(self, path: Path | None, poll: float) -> None:
        self.path, self.poll = path, poll
        self._stamp = self._stamp_now()
        self._next_check = 0.0

    def _stamp_now(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat() if self.path is not None else None
        except OSError:
            return None
        return None if st is None else (st.st_mtime_ns, st.st_size, st.st_ino)

    def changed(self, now: float) -> Plan | None:
        """The new plan if the file changed since last time (ValueError: it is not usable)."""
        if self.path is None or now < self._next_check:
            return None
        self._next_check = now + self.poll
        stamp = self._stamp_now()
        if stamp is None or stamp == self._stamp:
            return None
        self._stamp = stamp
        return read_plan(str(self.path))[0]


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


# ---------------------------------------------------------------------- I/O seams


class TapFile:
    """Append-only JSON lines; each batch of records goes out in one write(2), unbuffered."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, records: list[str | dict[str, Any]]) -> None:
        text = "\n".join(r if isinstance(r, str) else json.dumps(r, separators=(",", ":")) for r in records)
        view = memoryview((text + "\n").encode())
        for _ in range(1000):  # a regular file takes it in one go; bounded just in case
            if not view:
                return
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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


async def http_call(call: HttpCall) -> int:
    """Make an HTTP/1.1 request of the proxy's own (a side call) without blocking the event
    loop; the response status, or -1 if there was none within `call.timeout`."""
    try:
        return await asyncio.wait_for(_http_status(call), call.timeout)
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        return -1


async def _http_status(call: HttpCall) -> int:
    reader, writer = await asyncio.open_connection(call.host, call.port)
    try:
        head = [f"{call.method} {call.path} HTTP/1.1"]
        head += [f"{name}: {value}" for name, value in call.headers]
        head += ["content-length: 0", "connection: close", "", ""]
        writer.write("\r\n".join(head).encode("latin-1"))
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError("not an HTTP response")
        return int(parts[1])
    finally:
        writer.close()


def announce(name: str) -> None:
    """Print `<name> listening on http://HOST:PORT` (flushed) for each listening address, once
    the proxy listens, after raising its listen backlog and dropping the inert addons."""
    dropped = drop_inert_addons()
    skip_unshown_logs()
    kept = "" if dropped else " (an option the lab does not set was given: every addon kept)"
    print(f"{name}: {len(dropped)} inert mitmproxy addons dropped{kept}", flush=True)
    ps = addon("proxyserver")
    for addr in ps.listen_addrs() if ps is not None else []:
        raise_listen_backlog(addr[0], addr[1])
        print(f"{name} listening on http://{addr[0]}:{addr[1]}", flush=True)


# ---------------------------------------------------------------------- inert addons

INERT_ADDONS: Final = frozenset(
    {
        "AntiCache", "AntiComp", "BlockList", "Browser", "ClientPlayback", "CommandHistory",
        "Comment", "Cut", "DisableH2C", "DnsResolver", "Dumper", "Export", "KeepServing",
        "MapLocal", "MapRemote", "ModifyBody", "ModifyHeaders", "Onboarding", "ProxyAuth",
        "ReadFileStdin", "Save", "SaveHar", "ServerPlayback", "StickyAuth", "StickyCookie",
        "StripDnsHttpsRecords", "UpdateAltSvc", "UpstreamAuth",
    }
)  # fmt: skip
"""mitmdump's default addons that do nothing in the lab's proxy: each acts only when an
option the lab never sets is set (a blocklist, a map, a replay, a save file, proxy auth,
the flow dump that -q silences...), or in a mode the lab does not use (DNS, regular-proxy
onboarding, alt-svc rewriting of upstream proxies)."""


LAB_SET_OPTIONS: Final = frozenset(
    {
        "mode",
        "listen_host",
        "listen_port",
        "connection_strategy",
        "scripts",
        "flow_detail",
        "termlog_verbosity",
    }
)
"""The mitmproxy options the lab's own command line sets (lab.faults.launch), besides the
addons' own (`mcp*`)."""


def drop_inert_addons() -> list[str]:
    """Remove `INERT_ADDONS` from mitmproxy's addon chain when the proxy runs with the
    lab's own options only (`LAB_SET_OPTIONS`, `mcp*`): then none of them has work to do.
    A proxy given any other option keeps every addon (the option may be one of theirs).
    Returns the names of the addons removed.

    Why: mitmproxy calls every hook of every flow event on every addon of its chain (and
    an `update` event after each); with mitmdump's 36 default addons that dispatch, not
    the lab's addons, was most of the proxy's CPU per request. Measured on this box
    (docs/faults.md): a request on a new connection 5.2 -> 3.1 ms of mitmdump CPU, one on
    a kept-alive connection 2.2 -> 1.5 ms.
    """
    master: Any = getattr(ctx, "master", None)
    if master is None:
        return []
    options: Any = ctx.options
    names: list[str] = list(options.keys())  # an OptManager is not iterable itself
    foreign = [
        name
        for name in names
        if options.has_changed(name) and name not in LAB_SET_OPTIONS and not name.startswith("mcp")
    ]
    if foreign:
        return []
    removed = []
    for a in list(master.addons.chain):
        # remove() runs the addon's `done` hook at once, and cannot run an async one.
        if type(a).__name__ in INERT_ADDONS and not inspect.iscoroutinefunction(getattr(a, "done", None)):
            master.addons.remove(a)
            removed.append(type(a).__name__)
    return removed


def skip_unshown_logs() -> None:
    """Let mitmproxy's loggers make only the records its terminal log shows.

    mitmdump sets the root logger to DEBUG and filters in its handler, so the proxy built a
    log record for every connection and flow event that `-q` then dropped (about 5 % of its
    CPU under the lab's load, sampled). Raising the `mitmproxy` logger to the terminal's
    verbosity drops them before they are made; nothing else in mitmdump reads them once the
    inert addons are gone.
    """
    level = logging.getLevelName(str(getattr(ctx.options, "termlog_verbosity", "info")).upper())
    if isinstance(level, int):
        logging.getLogger("mitmproxy").setLevel(level)


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


# ---------------------------------------------------------------------- bounds mitmproxy lacks

MAX_RESPONSE_HEAD: Final = 64 * 1024
"""The most bytes of a response head (status line and headers) the proxy holds from the
target. mitmproxy 12 has no such bound: a target whose headers never end made mitmdump
grow to 1.1 GiB in 25 s. Over it, the proxy answers its client 502 and closes the
target's connection, as for a head it cannot parse."""


def bound_response_heads(limit: int = MAX_RESPONSE_HEAD) -> None:
    """Make mitmproxy's HTTP/1 client layer give up a response head over `limit` bytes (its
    `Http1Client.read_headers`, wrapped once per process). A private part of mitmproxy,
    pinned with it (pyproject.toml); tests/faults/test_bounds_live.py fails if the wrap no
    longer takes."""
    from h11._receivebuffer import ReceiveBuffer
    from mitmproxy.proxy import commands
    from mitmproxy.proxy.layers.http import _http1
    from mitmproxy.proxy.layers.http._base import ReceiveHttp
    from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError

    cls: Any = _http1.Http1Client
    if getattr(cls.read_headers, "lab_limit", None) is not None:
        return
    original = cls.read_headers

    def read_headers(self: Any, event: Any) -> Any:
        yield from original(self, event)
        if self.response is None and self.stream_id is not None and len(self.buf) > limit:
            held = len(self.buf)
            self.buf = ReceiveBuffer()  # let it go now, not when the connection is collected
            yield commands.CloseConnection(self.conn)
            yield ReceiveHttp(
                ResponseProtocolError(
                    self.stream_id,
                    f"response head of {held} bytes and not ended, over the limit of {limit} (the target's)",
                    ErrorCode.GENERIC_SERVER_ERROR,
                )
            )

    read_headers.lab_limit = limit  # type: ignore[attr-defined]
    cls.read_headers = read_headers
