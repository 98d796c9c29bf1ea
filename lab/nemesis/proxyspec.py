"""Proxy specifications: parsing and validation of the Toxiproxy v2 proxy fields (pure).

A proxy, as the API carries it::

    {"name": str, "listen": "host:port", "upstream": "host:port", "enabled": bool}

This nemesis only ever touches loopback: `listen` must be `127.0.0.1` or `localhost`
(port 0 picks a free port; the API then shows the real one), and `upstream` must be a
loopback address (127.0.0.0/8, `localhost`, `::1`). A real Toxiproxy accepts any address;
refusing others here keeps every lab run on this machine (docs/spec.md: local servers
bind loopback only). This holds in compat mode too.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from typing import Final

from lab.nemesis.toxics import check_name

BIND_HOST: Final = "127.0.0.1"
_LISTEN_HOSTS: Final = frozenset({"127.0.0.1", "localhost"})
_CREATE_FIELDS: Final = frozenset({"name", "listen", "upstream", "enabled"})
# GET answers carry `toxics`; a client may post a proxy back as it got it.
_UPDATE_FIELDS: Final = _CREATE_FIELDS | {"toxics"}


@dataclass(frozen=True, slots=True)
class Address:
    """A TCP address. `str()` gives the API's `host:port` form (IPv6 in brackets)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """One validated proxy. `listen.port` 0 means "pick a free port"."""

    name: str
    listen: Address
    upstream: Address
    enabled: bool = True

    def same_endpoints(self, other: ProxyConfig) -> bool:
        """Same upstream and listen address (a requested port 0 matches any port)."""
        listen_same = self.listen.host == other.listen.host and (
            0 in (self.listen.port, other.listen.port) or self.listen.port == other.listen.port
        )
        return listen_same and self.upstream == other.upstream


def parse_address(value: object, what: str) -> Address:
    """`host:port` or `[v6]:port`."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a 'host:port' string, got {value!r}")
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"{what} {value!r} is not '[host]:port'")
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"{what} {value!r} is not 'host:port'")
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{what} {value!r} has no valid port (0..65535)")
    return Address(host, int(port_text))


def parse_listen(value: object, *, compat: bool = False) -> Address:
    """A listen address, normalised to 127.0.0.1 (the nemesis binds loopback only). With
    `compat`, a listen address without a host (`:PORT`, where Toxiproxy binds every
    interface) binds 127.0.0.1 too."""
    addr = parse_address(value, "listen")
    if compat and addr.host == "":
        return Address(BIND_HOST, addr.port)
    if addr.host not in _LISTEN_HOSTS:
        raise ValueError(f"listen {value!r}: the nemesis binds 127.0.0.1 only (use 127.0.0.1:PORT or port 0)")
    return Address(BIND_HOST, addr.port)


def parse_upstream(value: object) -> Address:
    """An upstream address; it must be on this machine (loopback)."""
    addr = parse_address(value, "upstream")
    if addr.port == 0:
        raise ValueError(f"upstream {value!r} needs a port (1..65535)")
    if not _is_loopback(addr.host):
        raise ValueError(f"upstream {value!r} is not a loopback address (127.0.0.0/8, localhost, ::1)")
    return addr


def parse_proxy(body: object, *, compat: bool = False) -> ProxyConfig:
    """A proxy from an API create body; `listen` defaults to 127.0.0.1:0, `enabled` to
    true. With `compat`, unknown fields are ignored (as Toxiproxy does)."""
    if not isinstance(body, dict):
        raise ValueError(f"a proxy must be a JSON object, got {type(body).__name__}")
    if not compat:
        _refuse_unknown(body, _UPDATE_FIELDS)
    for key in ("name", "upstream"):
        if not body.get(key):
            raise ValueError(f"missing required field: {key}")
    name = check_name(body["name"], "proxy name")
    enabled = _parse_enabled(body.get("enabled", True))
    listen = parse_listen(body.get("listen") or f"{BIND_HOST}:0", compat=compat)
    upstream = parse_upstream(body["upstream"])
    return ProxyConfig(name, listen, upstream, enabled)


def parse_proxy_update(current: ProxyConfig, body: object, *, compat: bool = False) -> ProxyConfig:
    """`current` with the fields of an API update body (any subset; the name cannot
    change). With `compat`, unknown fields and a different name are ignored."""
    if not isinstance(body, dict):
        raise ValueError(f"a proxy update must be a JSON object, got {type(body).__name__}")
    if not compat:
        _refuse_unknown(body, _UPDATE_FIELDS)
        if "name" in body and body["name"] != current.name:
            raise ValueError("a proxy's name cannot change: delete it and create another")
    out = current
    if "enabled" in body:
        _parse_enabled(body["enabled"])  # checked before anything changes
    if "listen" in body:
        out = replace(out, listen=parse_listen(body["listen"], compat=compat))
    if "upstream" in body:
        out = replace(out, upstream=parse_upstream(body["upstream"]))
    if "enabled" in body:
        out = replace(out, enabled=_parse_enabled(body["enabled"]))
    return out


def parse_populate(body: object, *, compat: bool = False) -> list[ProxyConfig]:
    """The body of `POST /populate`: a JSON array of proxies with distinct names."""
    if not isinstance(body, list):
        raise ValueError("populate takes a JSON array of proxies")
    if len(body) > 1000:
        raise ValueError("populate takes at most 1000 proxies")
    out = [parse_proxy(item, compat=compat) for item in body]
    names = [p.name for p in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"populate names a proxy twice: {', '.join(dupes)}")
    return out


def _parse_enabled(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"enabled must be true or false, got {value!r}")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse_unknown(body: dict[str, object], allowed: frozenset[str]) -> None:
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise ValueError(
            f"unknown proxy field: {', '.join(map(repr, unknown))}; expected one of {', '.join(sorted(_CREATE_FIELDS))}"
        )
