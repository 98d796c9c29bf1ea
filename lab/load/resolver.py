"""Name resolution in a Locust process: numeric hosts without gevent's thread pool.

Under gevent every `socket.create_connection` resolves its host through the hub's
resolver, and gevent's default one (`gevent.resolver.thread`) hands each `getaddrinfo`
to a native thread of the hub's pool and waits for it, even for a numeric address such
as the 127.0.0.1 of every run's chain: a py-spy profile of a worker under the release
gate's traffic put about 10 % of its CPU there (`Resolver.getaddrinfo`, `ThreadPool.spawn`,
the pool's condition and lock). A numeric address needs no lookup at all, so this
resolver answers it at once in the calling greenlet (`getaddrinfo` with
`AI_NUMERICHOST` never touches DNS, so it cannot block the loop) and leaves names (a
compose service, `localhost`) to the thread pool as before.
"""

from __future__ import annotations

import _socket
import functools
import ipaddress
import os
from typing import Any

import gevent
from gevent.resolver.thread import Resolver as ThreadResolver


@functools.lru_cache(maxsize=256)
def is_numeric_host(host: str | bytes) -> bool:
    """An IPv4 or IPv6 address literal (with an IPv6 scope, too), not a name."""
    text = host.decode("ascii", "replace") if isinstance(host, bytes) else host
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class NumericFirstResolver(ThreadResolver):  # type: ignore[misc]
    """gevent's thread resolver, but a numeric host is answered without the pool."""

    def getaddrinfo(
        self, host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[tuple[Any, ...]]:
        if isinstance(host, str | bytes) and is_numeric_host(host):
            return _socket.getaddrinfo(host, port, family, type, proto, flags | _socket.AI_NUMERICHOST)
        return super().getaddrinfo(host, port, family, type, proto, flags)  # type: ignore[no-any-return]


def install_numeric_first_resolver() -> bool:
    """Make the current thread's hub resolve numeric hosts without its thread pool.
    Changes nothing (False) if the process chose another resolver (`GEVENT_RESOLVER`):
    that choice is the operator's."""
    if os.environ.get("GEVENT_RESOLVER") or gevent.config.resolver is not ThreadResolver:
        return False
    hub = gevent.get_hub()
    if not isinstance(hub.resolver, NumericFirstResolver):
        hub.resolver = NumericFirstResolver(hub=hub)
    return True
