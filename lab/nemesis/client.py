"""The lab's own client of a Toxiproxy HTTP API (v2): this nemesis or a real Toxiproxy
server. Plain blocking code on the standard library's `http.client` (no trio, gevent or
requests): every call opens its own connection, so threads share a client freely, with no
lock, and every call has a timeout (the client's, or one given to the call).

`toxiproxy-python` stays the client for people (docs/nemesis.md shows it against the
embedded nemesis); this one is what the lab itself uses, because the library has no
timeouts, keeps its host in class attributes, cannot update a toxic, and mistakes some
error answers for success.

What it adds beyond the API:
- **Update in place** (`update_toxic`): the API's toxic update when only toxicity and
  attributes change, remove + add when the type or stream changes.
- **No toxicity 0.** A toxic with toxicity 0 is refused (`ValueError`): a real Toxiproxy
  still applies it (measured). Remove the toxic instead.
- **Optional logging** of every change to a `mcpLabNemesis.v1` log. Use it when driving a
  real Toxiproxy; the embedded nemesis logs its changes itself (log on one side only).

Errors (all `ToxiproxyError`)::

    ToxiproxyError
     ├── ToxiproxyUnreachable   no usable answer: `.maybe_done` says whether the request
     │    │                     may have reached the server (False: it could not connect)
     │    └── ToxiproxyTimeout  no answer within the timeout (the change may have happened)
     └── ToxiproxyRejected      the API answered with an error status (`.status`)
          ├── NotFoundError     404: unknown proxy or toxic
          └── ConflictError     409: the name exists (or the listen address is in use)
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote, urlsplit

from lab.nemesis.log import NemesisLog, NemesisRecord, down_record, proxy_record, toxic_record
from lab.nemesis.toxics import ToxicSpec

DEFAULT_TIMEOUT_S: Final = 5.0
_MAX_ANSWER: Final = 16 * 1024 * 1024  # an API answer larger than this is not a Toxiproxy's


class ToxiproxyError(Exception):
    """A call to a Toxiproxy API failed."""


class ToxiproxyUnreachable(ToxiproxyError):
    """No usable answer. `maybe_done` is False when the request never left (no connection
    could be made), True when it may have reached the server and acted."""

    def __init__(self, message: str, *, maybe_done: bool = True) -> None:
        super().__init__(message)
        self.maybe_done = maybe_done


class ToxiproxyTimeout(ToxiproxyUnreachable):
    """The request was sent and no answer came within the timeout: the change may or may
    not have happened."""


class ToxiproxyRejected(ToxiproxyError):
    """The API answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotFoundError(ToxiproxyRejected):
    """404: unknown proxy or toxic."""


class ConflictError(ToxiproxyRejected):
    """409: the proxy or toxic name exists (or the listen address is in use)."""


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    """A proxy as the API shows it."""

    name: str
    listen: str
    upstream: str
    enabled: bool


class ToxiproxyClient:
    """One Toxiproxy API (`http://host:port`). Thread-safe: no shared connection, no lock."""

    def __init__(
        self, api_url: str, *, timeout: float = DEFAULT_TIMEOUT_S, log: NemesisLog | None = None
    ) -> None:
        parts = urlsplit(api_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"a Toxiproxy API URL is http://host:port, got {api_url!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.url = api_url.rstrip("/")
        self.timeout = timeout
        self._host = parts.hostname
        self._port = parts.port
        self._log = log
        self._known: dict[str, ProxyInfo] = {}  # listen/upstream for log records

    # -- reading --------------------------------------------------------------------------

    def version(self, *, timeout: float | None = None) -> str:
        _, raw = self._call("GET", "/version", timeout=timeout, parse=False)
        text = bytes(raw).decode("utf-8", "replace").strip()
        try:  # newer servers answer JSON, older ones plain text
            decoded = json.loads(text)
        except ValueError:
            return text
        return str(decoded.get("version", text)) if isinstance(decoded, dict) else text

    def proxies(self, *, timeout: float | None = None) -> dict[str, ProxyInfo]:
        _, body = self._call("GET", "/proxies", timeout=timeout)
        if not isinstance(body, dict):
            raise ToxiproxyUnreachable(f"GET {self.url}/proxies: not a JSON object: {_show(body)}")
        out = {str(name): _info(p) for name, p in body.items()}
        self._known.update(out)
        return out

    def get_proxy(self, name: str, *, timeout: float | None = None) -> ProxyInfo | None:
        try:
            _, body = self._call("GET", _proxy_path(name), timeout=timeout)
        except NotFoundError:
            self._known.pop(name, None)
            return None
        info = _info(body)
        self._known[name] = info
        return info

    def toxics(self, proxy: str, *, timeout: float | None = None) -> dict[str, ToxicSpec]:
        _, body = self._call("GET", _proxy_path(proxy) + "/toxics", timeout=timeout)
        if not isinstance(body, list):
            raise ToxiproxyUnreachable(f"GET toxics of {proxy!r}: not a JSON array: {_show(body)}")
        specs = [_spec(t) for t in body]
        return {s.name: s for s in specs}

    # -- changing -------------------------------------------------------------------------

    def create_proxy(
        self,
        name: str,
        upstream: str,
        listen: str = "127.0.0.1:0",
        *,
        enabled: bool = True,
        timeout: float | None = None,
    ) -> ProxyInfo:
        body = {"name": name, "upstream": upstream, "listen": listen, "enabled": enabled}
        _, answer = self._call("POST", "/proxies", body, timeout=timeout)
        info = _info(answer)
        self._known[name] = info
        self._write(proxy_record("proxy_created", name, info.listen, info.upstream))
        if not info.enabled:
            self._write(down_record("toxic_added", name, info.listen, info.upstream))
        return info

    def delete_proxy(self, name: str, *, timeout: float | None = None) -> None:
        info = self._info(name)
        toxics = self.toxics(name, timeout=timeout) if self._log is not None else {}
        self._call("DELETE", _proxy_path(name), timeout=timeout)
        self._known.pop(name, None)
        for spec in toxics.values():
            self._write(toxic_record("toxic_removed", name, info.listen, info.upstream, spec))
        if not info.enabled:
            self._write(down_record("toxic_removed", name, info.listen, info.upstream))
        self._write(proxy_record("proxy_deleted", name, info.listen, info.upstream))

    def set_enabled(self, name: str, enabled: bool, *, timeout: float | None = None) -> None:
        """Take a proxy down (`enabled=False`: it stops listening, its connections drop) or up."""
        info = self._info(name)
        self._call("POST", _proxy_path(name), {"enabled": enabled}, timeout=timeout)
        if info.enabled != enabled:
            self._known[name] = ProxyInfo(info.name, info.listen, info.upstream, enabled)
            kind = "toxic_removed" if enabled else "toxic_added"
            self._write(down_record(kind, name, info.listen, info.upstream))

    def add_toxic(self, proxy: str, toxic: ToxicSpec, *, timeout: float | None = None) -> None:
        _refuse_toxicity_zero(toxic)
        info = self._info(proxy) if self._log is not None else None
        self._call("POST", _proxy_path(proxy) + "/toxics", toxic.to_json(), timeout=timeout)
        if info is not None:
            self._write(toxic_record("toxic_added", proxy, info.listen, info.upstream, toxic))

    def remove_toxic(self, proxy: str, name: str, *, timeout: float | None = None) -> None:
        """Remove a toxic (NotFoundError if there is none of that name)."""
        spec = self.toxics(proxy, timeout=timeout).get(name) if self._log is not None else None
        self._call("DELETE", _toxic_path(proxy, name), timeout=timeout)
        if spec is not None:
            info = self._info(proxy)
            self._write(toxic_record("toxic_removed", proxy, info.listen, info.upstream, spec))

    def update_toxic(self, proxy: str, toxic: ToxicSpec, *, timeout: float | None = None) -> None:
        """Make the toxic of that name be `toxic`: the API's update when only toxicity and
        attributes change, remove + add when the type or stream changes, add when absent."""
        _refuse_toxicity_zero(toxic)
        current = self.toxics(proxy, timeout=timeout).get(toxic.name)
        if current is None:
            self.add_toxic(proxy, toxic, timeout=timeout)
            return
        if (current.kind, current.stream) != (toxic.kind, toxic.stream):
            self.remove_toxic(proxy, toxic.name, timeout=timeout)
            self.add_toxic(proxy, toxic, timeout=timeout)
            return
        change = {"toxicity": toxic.toxicity, "attributes": dict(toxic.attributes)}
        self._call("POST", _toxic_path(proxy, toxic.name), change, timeout=timeout)
        if self._log is not None:
            info = self._info(proxy)
            t = time.time()
            self._write(toxic_record("toxic_removed", proxy, info.listen, info.upstream, current, t))
            self._write(toxic_record("toxic_added", proxy, info.listen, info.upstream, toxic, t))

    def reset(self, *, timeout: float | None = None) -> None:
        """Enable every proxy and remove every toxic."""
        before = (
            {name: self.toxics(name, timeout=timeout) for name in self.proxies(timeout=timeout)}
            if self._log is not None
            else {}
        )
        self._call("POST", "/reset", timeout=timeout)
        for name, toxics in before.items():
            info = self._info(name)
            for spec in toxics.values():
                self._write(toxic_record("toxic_removed", name, info.listen, info.upstream, spec))
            if not info.enabled:
                self._write(down_record("toxic_removed", name, info.listen, info.upstream))
                self._known[name] = ProxyInfo(info.name, info.listen, info.upstream, True)

    # -- plumbing -------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        timeout: float | None,
        parse: bool = True,
    ) -> tuple[int, Any]:
        """One request on its own connection: (status, decoded JSON or None; raw bytes
        with `parse=False`). Raises the errors of the module docstring."""
        limit = self.timeout if timeout is None else timeout
        where = f"{method} {self.url}{path}"
        payload = None if body is None else json.dumps(body, allow_nan=False).encode("utf-8")
        headers = {"Accept": "application/json", "User-Agent": "lab-nemesis-client"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self._host, self._port, timeout=limit)
        try:
            try:
                conn.connect()
            except OSError as exc:  # refused, or no connection in time: nothing was sent
                raise ToxiproxyUnreachable(f"{where}: cannot connect: {exc}", maybe_done=False) from exc
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read(_MAX_ANSWER + 1)
            except TimeoutError as exc:
                raise ToxiproxyTimeout(f"{where}: no answer within {limit}s") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise ToxiproxyUnreachable(f"{where}: the connection broke: {exc!r}") from exc
        finally:
            conn.close()
        status = response.status
        if status >= 400:
            text = _error_text(raw)
            if status == 404:
                raise NotFoundError(status, text)
            if status == 409:
                raise ConflictError(status, text)
            raise ToxiproxyRejected(status, text)
        if not 200 <= status < 300:
            raise ToxiproxyUnreachable(f"{where}: unexpected status {status}")
        if not parse or status == 204 or not raw.strip():
            return status, raw if not parse else None
        try:
            return status, json.loads(raw)
        except ValueError as exc:
            raise ToxiproxyUnreachable(f"{where}: the answer is not JSON: {_show(raw)}") from exc

    def _info(self, name: str) -> ProxyInfo:
        known = self._known.get(name)
        if known is None:
            known = self.get_proxy(name)
        if known is None:
            raise NotFoundError(404, f"proxy not found: {name}")
        return known

    def _write(self, record: NemesisRecord) -> None:
        if self._log is not None:
            self._log.write(record)


def _proxy_path(name: str) -> str:
    return "/proxies/" + quote(name, safe="")


def _toxic_path(proxy: str, toxic: str) -> str:
    return f"{_proxy_path(proxy)}/toxics/{quote(toxic, safe='')}"


def _refuse_toxicity_zero(toxic: ToxicSpec) -> None:
    if toxic.toxicity == 0:
        raise ValueError(
            f"toxic {toxic.name!r} has toxicity 0: a real Toxiproxy still applies it; remove the toxic instead"
        )


def _info(proxy: object) -> ProxyInfo:
    if not isinstance(proxy, dict):
        raise ToxiproxyUnreachable(f"a proxy must be a JSON object, got {_show(proxy)}")
    try:
        return ProxyInfo(
            str(proxy["name"]), str(proxy["listen"]), str(proxy["upstream"]), bool(proxy["enabled"])
        )
    except KeyError as exc:
        raise ToxiproxyUnreachable(f"a proxy without {exc}: {_show(proxy)}") from exc


def _spec(toxic: object) -> ToxicSpec:
    # Taken as the server states it (not re-validated): a real Toxiproxy may hold toxics
    # this lab would refuse, and reading them must not fail.
    if not isinstance(toxic, dict):
        raise ToxiproxyUnreachable(f"a toxic must be a JSON object, got {_show(toxic)}")
    attributes: Mapping[str, Any] = toxic.get("attributes") or {}
    return ToxicSpec(
        str(toxic.get("name")),
        str(toxic.get("type")),
        str(toxic.get("stream")),
        float(toxic.get("toxicity", 1.0)),
        MappingProxyType({str(k): v for k, v in attributes.items()}),
    )


def _error_text(raw: bytes) -> str:
    """The `error` of a Toxiproxy error body, or the body itself."""
    text = raw.decode("utf-8", "replace")
    try:
        decoded = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(decoded, dict):
        return str(decoded.get("error") or decoded.get("title") or text).strip()
    return text.strip()


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def wait_until_up(client: ToxiproxyClient, *, within: float = 10.0) -> str:
    """The server's version once it answers; ToxiproxyUnreachable after `within` seconds."""
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:  # bounded by `within`
        try:
            return client.version(timeout=min(client.timeout, max(0.1, deadline - time.monotonic())))
        except ToxiproxyUnreachable as exc:
            last = exc
            time.sleep(0.1)
    raise ToxiproxyUnreachable(f"{client.url} did not answer within {within}s: {last}", maybe_done=False)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ConflictError",
    "NotFoundError",
    "ProxyInfo",
    "ToxiproxyClient",
    "ToxiproxyError",
    "ToxiproxyRejected",
    "ToxiproxyTimeout",
    "ToxiproxyUnreachable",
    "wait_until_up",
]
