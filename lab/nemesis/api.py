"""The Toxiproxy v2 HTTP API of the nemesis: routing (`ApiApp`, over the operations of
`NemesisOps`, which refuse with `ApiError`) and a small HTTP/1.1 server on trio streams
with h11 (`serve_api`).

Endpoints (JSON in and out; errors are `{"error": message, "status": code}`):

| method | path | answer |
| --- | --- | --- |
| GET | /version | 200 `{"version": ...}` |
| GET | /proxies | 200 `{name: proxy}` |
| POST | /proxies | 201 proxy; 400 bad input; 409 name exists or listen address in use |
| POST | /populate | 201 `{"proxies": [proxy, ...]}` (a JSON array in) |
| GET | /proxies/{proxy} | 200 proxy; 404 |
| POST, PATCH | /proxies/{proxy} | 200 proxy (update `listen`, `upstream`, `enabled`) |
| DELETE | /proxies/{proxy} | 204 |
| GET | /proxies/{proxy}/toxics | 200 `[toxic, ...]` |
| POST | /proxies/{proxy}/toxics | 200 toxic; 400; 404; 409 toxic name exists |
| GET | /proxies/{proxy}/toxics/{toxic} | 200 toxic; 404 |
| POST, PATCH | /proxies/{proxy}/toxics/{toxic} | 200 toxic (update `toxicity`, `attributes`) |
| DELETE | /proxies/{proxy}/toxics/{toxic} | 204 |
| POST | /reset | 204: every proxy enabled, every toxic removed |

Other answers: 404 unknown path, 405 wrong method (with `Allow`), 400 malformed HTTP,
413 body over 1 MiB, 403 for browsers (a `User-Agent` starting `Mozilla/`, as Toxiproxy
does, so a web page cannot drive the nemesis), 500 for a bug (logged to stderr; the
server goes on). Every connection is closed after one answer (`Connection: close`), and
each has a 10 s deadline.

In compat mode (`lab nemesis --compat`) the answers take Toxiproxy's form where it has
its own: an unknown path is a plain-text `404 page not found`, a wrong method an empty
405, a proxy carries Toxiproxy 2.12's empty `Logger` object, `/populate` answers
`"proxies": null` when it made none and adds `"proxies": null` to its errors.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Final, Protocol
from urllib.parse import unquote, urlsplit

import h11
import trio

from lab.nemesis.proxy import Proxy
from lab.nemesis.toxics import ToxicSpec

_MAX_BODY: Final = 1024 * 1024
_MAX_HEAD: Final = 16 * 1024
_DEADLINE_S: Final = 10.0


class ApiError(Exception):
    """An API request refused, with the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NemesisOps(Protocol):
    """What the API drives: one method per API operation, each raising `ApiError` with the
    status to answer (`lab.nemesis.server.Nemesis` is the one implementation). Declared
    here so that the API does not import the server, which imports the API to serve it."""

    def proxies(self) -> list[Proxy]: ...
    def proxy(self, name: str) -> Proxy: ...
    def toxic(self, proxy_name: str, toxic_name: str) -> ToxicSpec: ...
    async def create_proxy(self, body: object) -> Proxy: ...
    async def update_proxy(self, name: str, body: object) -> Proxy: ...
    async def delete_proxy(self, name: str) -> None: ...
    async def populate(self, body: object) -> list[Proxy]: ...
    async def add_toxic(self, proxy_name: str, body: object) -> ToxicSpec: ...
    async def update_toxic(self, proxy_name: str, toxic_name: str, body: object) -> ToxicSpec: ...
    async def remove_toxic(self, proxy_name: str, toxic_name: str) -> None: ...
    async def reset(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer: status, JSON body (None: no body), extra headers."""

    status: int
    body: object = None
    headers: tuple[tuple[str, str], ...] = ()
    text: str | None = None  # a plain-text body instead of JSON


def error_reply(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, {"error": message, "status": status}, headers)


type _Handler = Callable[[list[str], bytes], Awaitable[Reply]]


class ApiApp:
    """Maps requests to `NemesisOps` operations; never raises."""

    def __init__(self, nemesis: NemesisOps, version: str, *, compat: bool = False) -> None:
        self._nemesis = nemesis
        self._version = version
        self._compat = compat

    async def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        if headers.get("user-agent", "").startswith("Mozilla/"):
            return error_reply(403, "the nemesis API does not answer browsers")
        parts: list[str] = []
        try:
            path = urlsplit(target).path
            parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
            routes = self._routes(parts)
            if routes is None:
                if self._compat:
                    return Reply(404, text="404 page not found\n")
                return error_reply(404, f"no such endpoint: {path}")
            handler = routes.get(method)
            if handler is None:
                allow = ", ".join(sorted(routes))
                if self._compat:
                    return Reply(405, headers=(("allow", allow),))
                return error_reply(
                    405, f"{method} is not allowed here (allowed: {allow})", (("allow", allow),)
                )
            return await handler(parts, body)
        except ApiError as exc:
            reply = error_reply(exc.status, exc.message)
            if self._compat and parts[:1] == ["populate"]:
                return Reply(exc.status, {"error": exc.message, "status": exc.status, "proxies": None})
            return reply
        except Exception:  # a bug must not take the server down: say so and go on
            traceback.print_exc(file=sys.stderr)
            return error_reply(500, "internal error (see the nemesis' stderr)")

    def _routes(self, parts: list[str]) -> dict[str, _Handler] | None:
        match parts:
            case ["version"]:
                return {"GET": self._version_get}
            case ["reset"]:
                return {"POST": self._reset}
            case ["populate"]:
                return {"POST": self._populate}
            case ["proxies"]:
                return {"GET": self._proxies_get, "POST": self._proxy_create}
            case ["proxies", _]:
                return {
                    "GET": self._proxy_get,
                    "POST": self._proxy_update,
                    "PATCH": self._proxy_update,
                    "DELETE": self._proxy_delete,
                }
            case ["proxies", _, "toxics"]:
                return {"GET": self._toxics_get, "POST": self._toxic_create}
            case ["proxies", _, "toxics", _]:
                return {
                    "GET": self._toxic_get,
                    "POST": self._toxic_update,
                    "PATCH": self._toxic_update,
                    "DELETE": self._toxic_delete,
                }
        return None

    async def _version_get(self, parts: list[str], body: bytes) -> Reply:
        return Reply(200, {"version": self._version})

    async def _reset(self, parts: list[str], body: bytes) -> Reply:
        await self._nemesis.reset()
        return Reply(204)

    async def _populate(self, parts: list[str], body: bytes) -> Reply:
        proxies = [p.to_json(compat=self._compat) for p in await self._nemesis.populate(_json(body))]
        return Reply(201, {"proxies": None if self._compat and not proxies else proxies})

    async def _proxies_get(self, parts: list[str], body: bytes) -> Reply:
        return Reply(200, {p.config.name: p.to_json(compat=self._compat) for p in self._nemesis.proxies()})

    async def _proxy_create(self, parts: list[str], body: bytes) -> Reply:
        proxy = await self._nemesis.create_proxy(_json(body))
        return Reply(201, proxy.to_json(compat=self._compat))

    async def _proxy_get(self, parts: list[str], body: bytes) -> Reply:
        return Reply(200, self._nemesis.proxy(parts[1]).to_json(compat=self._compat))

    async def _proxy_update(self, parts: list[str], body: bytes) -> Reply:
        self._nemesis.proxy(parts[1])  # 404 before 400, as Toxiproxy
        proxy = await self._nemesis.update_proxy(parts[1], _json(body))
        return Reply(200, proxy.to_json(compat=self._compat))

    async def _proxy_delete(self, parts: list[str], body: bytes) -> Reply:
        await self._nemesis.delete_proxy(parts[1])
        return Reply(204)

    async def _toxics_get(self, parts: list[str], body: bytes) -> Reply:
        proxy = self._nemesis.proxy(parts[1])
        return Reply(200, [e.spec.to_json() for e in proxy.toxics.listing()])

    async def _toxic_create(self, parts: list[str], body: bytes) -> Reply:
        self._nemesis.proxy(parts[1])
        spec = await self._nemesis.add_toxic(parts[1], _json(body))
        return Reply(200, spec.to_json())

    async def _toxic_get(self, parts: list[str], body: bytes) -> Reply:
        return Reply(200, self._nemesis.toxic(parts[1], parts[3]).to_json())

    async def _toxic_update(self, parts: list[str], body: bytes) -> Reply:
        self._nemesis.toxic(parts[1], parts[3])
        spec = await self._nemesis.update_toxic(parts[1], parts[3], _json(body))
        return Reply(200, spec.to_json())

    async def _toxic_delete(self, parts: list[str], body: bytes) -> Reply:
        await self._nemesis.remove_toxic(parts[1], parts[3])
        return Reply(204)


def _json(body: bytes) -> object:
    """A request body as JSON, or ApiError 400."""
    if not body.strip():
        raise ApiError(400, "bad request body: empty (a JSON document was expected)")
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"bad request body: not JSON ({exc})") from exc


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# -- HTTP/1.1 on trio streams --------------------------------------------------------------


class _Refused(Exception):
    """The request cannot be served; `reply` says why."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


async def serve_api(
    app: ApiApp,
    listeners: list[trio.SocketListener],
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on `listeners` until cancelled."""

    async def handler(stream: trio.SocketStream) -> None:
        await serve_http_connection(stream, app)

    await trio.serve_listeners(handler, listeners, task_status=task_status)


async def serve_http_connection(stream: trio.SocketStream, app: ApiApp) -> None:
    """One request, one answer, then close. Never raises (but for cancellation)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
    try:
        with trio.move_on_after(_DEADLINE_S):
            try:
                method, target, headers, body = await _read_request(stream, conn)
                reply = await app.handle(method, target, headers, body)
            except _Refused as refused:
                reply = refused.reply
            except h11.RemoteProtocolError as exc:
                reply = error_reply(400, f"bad HTTP request: {exc}")
            await _send_reply(stream, conn, reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.LocalProtocolError):
        pass  # the client went away, or h11 cannot answer this connection any more
    except Exception:
        traceback.print_exc(file=sys.stderr)
    finally:
        stream.socket.close()


async def _read_request(
    stream: trio.SocketStream, conn: h11.Connection
) -> tuple[str, str, dict[str, str], bytes]:
    request: h11.Request | None = None
    body = bytearray()
    while True:  # bounded by the connection deadline and by _MAX_BODY
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(64 * 1024))
        elif isinstance(event, h11.Request):
            request = event
            length = dict(event.headers).get(b"content-length")
            if length is not None and length.isdigit() and int(length) > _MAX_BODY:
                raise _Refused(error_reply(413, f"request body over {_MAX_BODY} bytes"))
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > _MAX_BODY:
                raise _Refused(error_reply(413, f"request body over {_MAX_BODY} bytes"))
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
            return request.method.decode("ascii"), request.target.decode("latin-1"), headers, bytes(body)
        else:  # the client closed before a whole request
            raise trio.ClosedResourceError("connection closed before a complete request")


async def _send_reply(stream: trio.SocketStream, conn: h11.Connection, reply: Reply) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    if reply.text is not None:
        payload, content_type = reply.text.encode("utf-8"), "text/plain; charset=utf-8"
    else:
        payload = b"" if reply.body is None else json.dumps(reply.body).encode("utf-8")
        content_type = "application/json"
    headers = [("server", "lab-nemesis"), ("connection", "close"), *reply.headers]
    if reply.status != 204:
        headers += [("content-type", content_type), ("content-length", str(len(payload)))]
    phrase = HTTPStatus(reply.status).phrase.encode("ascii")
    out = conn.send(h11.Response(status_code=reply.status, headers=headers, reason=phrase)) or b""
    if payload and reply.status != 204:
        out += conn.send(h11.Data(data=payload)) or b""
    out += conn.send(h11.EndOfMessage()) or b""
    await stream.send_all(out)
