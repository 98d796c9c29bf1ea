"""A thin wrapper around `toxiproxy-python` 0.1.1 for one Toxiproxy API URL — this
nemesis or a real Toxiproxy server. Plain blocking code (no trio): use it from threads or
a simple loop.

What it adds to the library, and why:
- **Timeouts.** The library calls `requests` without a timeout (a hung API hangs the
  caller). Every call here has one: the library's module-level `requests` is replaced by a
  stand-in that adds `timeout` to each call (`install_timeouts`). It also raises for
  answers the library would mistake for success (5xx and other unexpected statuses).
- **One URL per client, thread-safe.** The library keeps host and port in class
  attributes (`APIConsumer.host/port`); calls are serialised under one lock that sets them.
- **Update = remove + add.** The library cannot update a toxic.
- **No toxicity 0.** A toxic with toxicity 0 is refused: DESIGN.md measured that a real
  Toxiproxy still applies it. Remove the toxic instead.
- **Optional logging** of every change to a `mcpLabNemesis.v1` log. Use it when driving a
  real Toxiproxy; the embedded nemesis logs its changes itself (log only on one side).

Errors (all `ToxiproxyError`)::

    ToxiproxyError
     ├── ToxiproxyUnreachable   no answer in time, or no connection: the change may or
     │                          may not have happened
     └── ToxiproxyRejected      the API answered with an error status (`.status`)
          ├── NotFoundError     404: unknown proxy or toxic
          └── ConflictError     409: the name exists (or the listen address is in use)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import urlsplit

import requests
import toxiproxy
import toxiproxy.api
import toxiproxy.exceptions

from lab.nemesis.log import NemesisLog, down_record, proxy_record, toxic_record
from lab.nemesis.toxics import ToxicSpec

DEFAULT_TIMEOUT_S: Final = 5.0

_LOCK = threading.RLock()  # guards APIConsumer.host/port and the timeout in force


class ToxiproxyError(Exception):
    """A call to a Toxiproxy API failed."""


class ToxiproxyUnreachable(ToxiproxyError):
    """No answer in time, or no connection: the change may or may not have happened."""


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


class _TimeoutRequests:
    """Stands in for the `requests` module inside `toxiproxy.api`: the three functions it
    calls, each with the timeout in force, raising for statuses the library ignores."""

    _HANDLED: Final = frozenset({400, 404, 409})  # the library raises its own for these

    def __init__(self) -> None:
        self.timeout = DEFAULT_TIMEOUT_S

    def get(self, url: str, params: Any = None, **kwargs: Any) -> Any:
        return self._call("GET", url, params=params, **kwargs)

    def post(self, url: str, data: Any = None, json: Any = None, **kwargs: Any) -> Any:
        return self._call("POST", url, data=data, json=json, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> Any:
        return self._call("DELETE", url, **kwargs)

    def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", self.timeout)
        try:
            response = requests.request(method, url, **kwargs)
        except requests.RequestException as exc:
            raise ToxiproxyUnreachable(f"{method} {url}: {exc}") from exc
        status = int(response.status_code)
        if status >= 400 and status not in self._HANDLED:
            raise ToxiproxyRejected(status, _error_text(response.content))
        return response


_SHIM = _TimeoutRequests()


def install_timeouts() -> None:
    """Make every `toxiproxy-python` call in this process go through the timeout stand-in."""
    with _LOCK:
        if toxiproxy.api.requests is not _SHIM:
            toxiproxy.api.requests = _SHIM


class ToxiproxyClient:
    """One Toxiproxy API (`http://host:port`), through `toxiproxy-python`, with timeouts."""

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
        self._known: dict[str, ProxyInfo] = {}  # for log records of toxics
        install_timeouts()

    # -- reading --------------------------------------------------------------------------

    def version(self) -> str:
        with self._api():
            raw: bytes = toxiproxy.api.APIConsumer.get("/version").content
        text = raw.decode("utf-8", "replace").strip()
        try:  # newer servers answer JSON, older ones plain text
            decoded = json.loads(text)
        except ValueError:
            return text
        return str(decoded.get("version", text)) if isinstance(decoded, dict) else text

    def proxies(self) -> dict[str, ProxyInfo]:
        with self._api():
            found = toxiproxy.Toxiproxy().proxies()
        out = {name: _info(p) for name, p in found.items()}
        self._known.update(out)
        return out

    def get_proxy(self, name: str) -> ProxyInfo | None:
        return self.proxies().get(name)

    def toxics(self, proxy: str) -> dict[str, ToxicSpec]:
        with self._api():
            found = self._proxy_obj(proxy).toxics()
        return {name: _spec(t) for name, t in found.items()}

    # -- changing -------------------------------------------------------------------------

    def create_proxy(
        self, name: str, upstream: str, listen: str = "127.0.0.1:0", *, enabled: bool = True
    ) -> ProxyInfo:
        with self._api():
            created = toxiproxy.Toxiproxy().create(
                upstream=upstream, name=name, listen=listen, enabled=enabled
            )
        info = _info(created)
        self._known[name] = info
        self._write(proxy_record("proxy_created", name, info.listen, info.upstream))
        if not enabled:
            self._write(down_record("toxic_added", name, info.listen, info.upstream))
        return info

    def delete_proxy(self, name: str) -> None:
        info = self._info(name)
        toxics = self.toxics(name) if self._log is not None else {}
        with self._api():
            self._proxy_obj(name).destroy()
        self._known.pop(name, None)
        for spec in toxics.values():
            self._write(toxic_record("toxic_removed", name, info.listen, info.upstream, spec))
        if not info.enabled:
            self._write(down_record("toxic_removed", name, info.listen, info.upstream))
        self._write(proxy_record("proxy_deleted", name, info.listen, info.upstream))

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Take a proxy down (`enabled=False`: it stops listening, its connections drop) or up."""
        info = self._info(name)
        with self._api():
            proxy = self._proxy_obj(name)
            if enabled:
                proxy.enable()
            else:
                proxy.disable()
        if info.enabled != enabled:
            self._known[name] = ProxyInfo(info.name, info.listen, info.upstream, enabled)
            kind = "toxic_removed" if enabled else "toxic_added"
            self._write(down_record(kind, name, info.listen, info.upstream))

    def add_toxic(self, proxy: str, toxic: ToxicSpec) -> None:
        if toxic.toxicity == 0:
            raise ValueError(
                f"toxic {toxic.name!r} has toxicity 0: a real Toxiproxy still applies it; remove the toxic instead"
            )
        info = self._info(proxy) if self._log is not None else None
        with self._api():
            self._proxy_obj(proxy).add_toxic(
                type=toxic.kind,
                name=toxic.name,
                stream=toxic.stream,
                toxicity=toxic.toxicity,
                attributes=dict(toxic.attributes),
            )
        if info is not None:
            self._write(toxic_record("toxic_added", proxy, info.listen, info.upstream, toxic))

    def remove_toxic(self, proxy: str, name: str) -> None:
        """Remove a toxic (NotFoundError if there is none of that name)."""
        spec = self.toxics(proxy).get(name) if self._log is not None else None
        with self._api():
            self._proxy_obj(proxy).destroy_toxic(name)
        if spec is not None:
            info = self._info(proxy)
            self._write(toxic_record("toxic_removed", proxy, info.listen, info.upstream, spec))

    def update_toxic(self, proxy: str, toxic: ToxicSpec) -> None:
        """Replace the toxic of the same name (or add it): remove, then add."""
        with suppress(NotFoundError):
            self.remove_toxic(proxy, toxic.name)
        self.add_toxic(proxy, toxic)

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        before = {name: self.toxics(name) for name in self.proxies()} if self._log is not None else {}
        with self._api():
            toxiproxy.Toxiproxy().reset()
        for name, toxics in before.items():
            info = self._info(name)
            for spec in toxics.values():
                self._write(toxic_record("toxic_removed", name, info.listen, info.upstream, spec))
            if not info.enabled:
                self._write(down_record("toxic_removed", name, info.listen, info.upstream))
                self._known[name] = ProxyInfo(info.name, info.listen, info.upstream, True)

    @contextmanager
    def using_library(self) -> Iterator[Any]:
        """The `toxiproxy` module itself, pointed at this API with this timeout, for a call
        this wrapper does not offer (the lock is held: keep the block short)."""
        with self._api():
            yield toxiproxy

    # -- plumbing -------------------------------------------------------------------------

    @contextmanager
    def _api(self) -> Iterator[None]:
        """Point the library at this API, with this timeout, and translate its errors."""
        with _LOCK:
            consumer = toxiproxy.api.APIConsumer
            consumer.host, consumer.port = self._host, self._port
            _SHIM.timeout = self.timeout
            try:
                yield
            except toxiproxy.exceptions.NotFound as exc:
                raise NotFoundError(404, _error_text(exc.args[0] if exc.args else b"")) from exc
            except toxiproxy.exceptions.ProxyExists as exc:
                raise ConflictError(409, _error_text(exc.args[0] if exc.args else b"")) from exc
            except toxiproxy.exceptions.InvalidToxic as exc:
                raise ToxiproxyRejected(400, _error_text(exc.args[0] if exc.args else b"")) from exc

    def _proxy_obj(self, name: str) -> Any:
        # A library Proxy object only carries the name for these calls: no need to fetch it.
        known = self._known.get(name)
        listen, upstream, enabled = (known.listen, known.upstream, known.enabled) if known else ("", "", True)
        return toxiproxy.Proxy(name=name, upstream=upstream, enabled=enabled, listen=listen)

    def _info(self, name: str) -> ProxyInfo:
        known = self._known.get(name)
        if known is None:
            known = self.proxies().get(name)
        if known is None:
            raise NotFoundError(404, f"proxy not found: {name}")
        return known

    def _write(self, record: Any) -> None:
        if self._log is not None:
            self._log.write(record)


def _info(proxy: Any) -> ProxyInfo:
    return ProxyInfo(str(proxy.name), str(proxy.listen), str(proxy.upstream), bool(proxy.enabled))


def _spec(toxic: Any) -> ToxicSpec:
    # Taken as the server states it (not re-validated): a real Toxiproxy may hold toxics
    # this module would refuse, and reading them must not fail.
    attributes: Mapping[str, Any] = toxic.attributes or {}
    return ToxicSpec(
        str(toxic.name),
        str(toxic.type),
        str(toxic.stream),
        float(toxic.toxicity),
        MappingProxyType({str(k): v for k, v in attributes.items()}),
    )


def _error_text(content: object) -> str:
    """The `error` of a Toxiproxy error body, or the body itself."""
    raw = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw.strip()
    if isinstance(decoded, dict):
        return str(decoded.get("error") or decoded.get("title") or raw).strip()
    return raw.strip()


def wait_until_up(client: ToxiproxyClient, *, within: float = 10.0) -> str:
    """The server's version once it answers; ToxiproxyUnreachable after `within` seconds."""
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:  # bounded by `within`
        try:
            return client.version()
        except ToxiproxyUnreachable as exc:
            last = exc
            time.sleep(0.1)
    raise ToxiproxyUnreachable(f"{client.url} did not answer within {within}s: {last}")
