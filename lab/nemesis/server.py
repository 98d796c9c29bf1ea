"""The nemesis' state (trio): its proxies, every change to them, and the log of changes.

`Nemesis` is what the HTTP API drives (`lab.nemesis.api.NemesisOps`); each method is one
API operation and raises `ApiError` with the status Toxiproxy answers (400 bad input, 404
unknown proxy or toxic, 409 a name that exists or a listen address in use). Changes are
serialised by one lock, and each is written to the `mcpLabNemesis.v1` log once it has
taken effect.

`run_nemesis` is the whole server: the API on 127.0.0.1, until SIGINT or SIGTERM; on the
way out every proxy is stopped and its end logged.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Final

import trio

from lab import __version__
from lab.nemesis.api import ApiApp, ApiError, serve_api
from lab.nemesis.log import NemesisLog, down_record, proxy_record, toxic_record
from lab.nemesis.proxy import Proxy
from lab.nemesis.proxyspec import BIND_HOST, ProxyConfig, parse_populate, parse_proxy, parse_proxy_update
from lab.nemesis.toxics import ToxicSpec, parse_toxic, parse_toxic_update

VERSION: Final = f"lab-nemesis {__version__} (Toxiproxy API v2)"
_SHUTDOWN_GRACE_S: Final = 5.0


_OWN_TEXTS: Final = ("missing required field", "invalid toxic type", "stream was invalid")
"""Refusals Toxiproxy words without its `bad request body: ` prefix."""


def _bad_input(exc: ValueError) -> ApiError:
    text = str(exc)
    return ApiError(400, text if text.startswith(_OWN_TEXTS) else f"bad request body: {text}")


def _listen_error(proxy: Proxy, exc: OSError, *, compat: bool) -> ApiError:
    if compat:  # Toxiproxy's answer: 500 and Go's error text
        return ApiError(500, f"listen tcp {proxy.config.listen}: bind: {(exc.strerror or str(exc)).lower()}")
    # 409 says what it is (the address is taken) and makes toxiproxy-python raise,
    # where Toxiproxy's 500 would be returned as if it were a proxy.
    return ApiError(409, f"cannot listen on {proxy.config.listen}: {exc.strerror or exc}")


class Nemesis:
    """All proxies, and every change to them (each one logged)."""

    def __init__(
        self, nursery: trio.Nursery, log: NemesisLog, rng: random.Random, *, compat: bool = False
    ) -> None:
        self.compat = compat
        self._nursery = nursery
        self._log = log
        self._rng = rng
        self._proxies: dict[str, Proxy] = {}
        self._lock = trio.Lock()

    def proxies(self) -> list[Proxy]:
        return list(self._proxies.values())

    def proxy(self, name: str) -> Proxy:
        found = self._proxies.get(name)
        if found is None:
            raise ApiError(404, "proxy not found")
        return found

    def toxic(self, proxy_name: str, toxic_name: str) -> ToxicSpec:
        entry = self.proxy(proxy_name).toxics.get(toxic_name)
        if entry is None:
            raise ApiError(404, "toxic not found")
        return entry.spec

    async def create_proxy(self, body: object) -> Proxy:
        try:
            config = parse_proxy(body, compat=self.compat)
        except ValueError as exc:
            raise _bad_input(exc) from exc
        async with self._lock:
            return await self._create(config)

    async def update_proxy(self, name: str, body: object) -> Proxy:
        async with self._lock:
            proxy = self.proxy(name)
            try:
                new = parse_proxy_update(proxy.config, body, compat=self.compat)
            except ValueError as exc:
                raise _bad_input(exc) from exc
            old = proxy.config
            if new.listen != old.listen or new.upstream != old.upstream:
                # Toxiproxy restarts the proxy, dropping its connections: logged as a delete
                # and a create. Its toxics, and its being down, carry on.
                await proxy.stop()
                self._log_proxy("proxy_deleted", proxy)
                proxy.config = replace(old, listen=new.listen, upstream=new.upstream)
                if old.enabled and new.enabled:
                    try:
                        await proxy.start(self._nursery)
                    except OSError as exc:
                        proxy.config = replace(proxy.config, enabled=False)
                        self._log_proxy("proxy_created", proxy)
                        self._log_down("toxic_added", proxy)
                        raise _listen_error(proxy, exc, compat=self.compat) from exc
                self._log_proxy("proxy_created", proxy)
            if new.enabled and not proxy.config.enabled:
                await self._start(proxy)
                proxy.config = replace(proxy.config, enabled=True)
                self._log_down("toxic_removed", proxy)
            elif not new.enabled and proxy.config.enabled:
                await proxy.stop()
                proxy.config = replace(proxy.config, enabled=False)
                self._log_down("toxic_added", proxy)
            return proxy

    async def delete_proxy(self, name: str) -> None:
        async with self._lock:
            await self._delete(self.proxy(name))

    async def populate(self, body: object) -> list[Proxy]:
        """Create the listed proxies; one that exists with the same endpoints is kept, one
        with other endpoints is replaced. All or nothing for new ones: on a failure, the
        proxies created by this call are deleted again."""
        try:
            configs = parse_populate(body, compat=self.compat)
        except ValueError as exc:
            raise _bad_input(exc) from exc
        async with self._lock:
            out: list[Proxy] = []
            created: list[Proxy] = []
            try:
                for config in configs:
                    existing = self._proxies.get(config.name)
                    if existing is not None and existing.config.same_endpoints(config):
                        out.append(existing)
                        continue
                    if existing is not None:
                        await self._delete(existing)
                    proxy = await self._create(config)
                    created.append(proxy)
                    out.append(proxy)
            except ApiError:
                for proxy in created:
                    await self._delete(proxy)
                raise
            return out

    async def add_toxic(self, proxy_name: str, body: object) -> ToxicSpec:
        async with self._lock:
            proxy = self.proxy(proxy_name)
            try:
                spec = parse_toxic(body, compat=self.compat)
            except ValueError as exc:
                raise _bad_input(exc) from exc
            if proxy.toxics.get(spec.name) is not None:
                raise ApiError(409, "toxic already exists")
            proxy.toxics.add(spec)
            self._log_toxic("toxic_added", proxy, spec)
            return spec

    async def update_toxic(self, proxy_name: str, toxic_name: str, body: object) -> ToxicSpec:
        async with self._lock:
            proxy = self.proxy(proxy_name)
            current = self.toxic(proxy_name, toxic_name)
            try:
                spec = parse_toxic_update(current, body, compat=self.compat)
            except ValueError as exc:
                raise _bad_input(exc) from exc
            proxy.toxics.update(spec)
            self._log_toxic("toxic_removed", proxy, current)
            self._log_toxic("toxic_added", proxy, spec)
            return spec

    async def remove_toxic(self, proxy_name: str, toxic_name: str) -> None:
        async with self._lock:
            proxy = self.proxy(proxy_name)
            spec = self.toxic(proxy_name, toxic_name)
            proxy.remove_toxic(toxic_name)
            self._log_toxic("toxic_removed", proxy, spec)

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic (`POST /reset`)."""
        async with self._lock:
            for proxy in self.proxies():
                self._remove_all_toxics(proxy)
                if not proxy.config.enabled:
                    await self._start(proxy)
                    proxy.config = replace(proxy.config, enabled=True)
                    self._log_down("toxic_removed", proxy)

    async def aclose(self) -> None:
        """Stop every proxy, logging the end of each toxic and proxy."""
        async with self._lock:
            for proxy in self.proxies():
                await self._delete(proxy)

    # -- helpers; the lock is held -------------------------------------------------------

    async def _create(self, config: ProxyConfig) -> Proxy:
        if config.name in self._proxies:
            raise ApiError(409, "proxy already exists")
        proxy = Proxy(config, self._rng)
        if config.enabled:
            await self._start(proxy)
        self._proxies[config.name] = proxy
        self._log_proxy("proxy_created", proxy)
        if not config.enabled:
            self._log_down("toxic_added", proxy)
        return proxy

    async def _delete(self, proxy: Proxy) -> None:
        del self._proxies[proxy.config.name]
        await proxy.stop()
        self._remove_all_toxics(proxy)
        if not proxy.config.enabled:
            self._log_down("toxic_removed", proxy)
        self._log_proxy("proxy_deleted", proxy)

    async def _start(self, proxy: Proxy) -> None:
        try:
            await proxy.start(self._nursery)
        except OSError as exc:
            raise _listen_error(proxy, exc, compat=self.compat) from exc

    def _remove_all_toxics(self, proxy: Proxy) -> None:
        for entry in proxy.toxics.entries():
            proxy.remove_toxic(entry.spec.name)
            self._log_toxic("toxic_removed", proxy, entry.spec)

    def _log_proxy(self, type_: str, proxy: Proxy) -> None:
        c = proxy.config
        self._log.write(proxy_record(type_, c.name, str(c.listen), str(c.upstream)))

    def _log_toxic(self, type_: str, proxy: Proxy, spec: ToxicSpec) -> None:
        c = proxy.config
        self._log.write(toxic_record(type_, c.name, str(c.listen), str(c.upstream), spec))

    def _log_down(self, type_: str, proxy: Proxy) -> None:
        c = proxy.config
        self._log.write(down_record(type_, c.name, str(c.listen), str(c.upstream)))


async def run_nemesis(
    api_port: int,
    log_path: Path,
    *,
    seed: int | None,
    announce: Callable[[str], None],
    compat: bool = False,
) -> None:
    """Serve the API on 127.0.0.1:`api_port` (0: a free port) until SIGINT or SIGTERM.

    `announce` gets one line, `lab-nemesis api http://127.0.0.1:PORT`, once the API listens.
    `compat` accepts what a real Toxiproxy accepts and answers as it does (docs/nemesis.md).
    """
    with NemesisLog(log_path) as log:
        listeners = await trio.open_tcp_listeners(api_port, host=BIND_HOST)
        port = listeners[0].socket.getsockname()[1]
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nemesis = Nemesis(nursery, log, random.Random(seed), compat=compat)
                await nursery.start(serve_api, ApiApp(nemesis, VERSION, compat=compat), listeners)
                announce(f"lab-nemesis api http://{BIND_HOST}:{port}")
                async for _ in signals:
                    break
                with trio.CancelScope(shield=True), trio.move_on_after(_SHUTDOWN_GRACE_S):
                    await nemesis.aclose()
                nursery.cancel_scope.cancel()
