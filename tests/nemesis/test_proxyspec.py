"""Proxy field parsing (`lab.nemesis.proxyspec`): loopback only, clear refusals."""

from __future__ import annotations

import pytest

from lab.nemesis.proxyspec import (
    Address,
    ProxyConfig,
    parse_address,
    parse_listen,
    parse_populate,
    parse_proxy,
    parse_proxy_update,
    parse_upstream,
)


def test_create_defaults_to_a_free_loopback_port() -> None:
    p = parse_proxy({"name": "mcp", "upstream": "127.0.0.1:8000"})
    assert p == ProxyConfig("mcp", Address("127.0.0.1", 0), Address("127.0.0.1", 8000), True)
    assert str(p.listen) == "127.0.0.1:0"
    q = parse_proxy(
        {"name": "mcp", "upstream": "localhost:8000", "listen": "localhost:9000", "enabled": False}
    )
    assert (str(q.listen), str(q.upstream), q.enabled) == ("127.0.0.1:9000", "localhost:8000", False)


@pytest.mark.parametrize(
    ("value", "ok"),
    [("127.0.0.1:80", True), ("127.9.9.9:80", True), ("[::1]:80", True), ("localhost:1", True),
     ("10.0.0.1:80", False), ("0.0.0.0:80", False), ("example.com:80", False), ("127.0.0.1:0", False)],
)  # fmt: skip
def test_upstreams_stay_on_this_machine(value: str, ok: bool) -> None:
    if ok:
        assert str(parse_upstream(value)) == value
    else:
        with pytest.raises(ValueError, match="upstream"):
            parse_upstream(value)


@pytest.mark.parametrize("value", ["0.0.0.0:80", "[::]:80", ":80", "192.168.1.2:80"])
def test_listen_is_loopback_only(value: str) -> None:
    with pytest.raises(ValueError, match=r"binds 127\.0\.0\.1 only"):
        parse_listen(value)


@pytest.mark.parametrize("value", ["", "nocolon", "host:", "host:port", "host:70000", "[::1]80", "a:b:1", 80])
def test_malformed_addresses(value: object) -> None:
    with pytest.raises(ValueError, match=r"port|host:port"):
        parse_address(value, "upstream")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"upstream": "127.0.0.1:1"}, "missing required field: name"),
        ({"name": "x"}, "missing required field: upstream"),
        ({"name": "x", "upstream": "127.0.0.1:1", "enabled": "yes"}, "enabled must be true or false"),
        ({"name": "x", "upstream": "127.0.0.1:1", "lisen": "127.0.0.1:1"}, "unknown proxy field: 'lisen'"),
        ({"name": "a/b", "upstream": "127.0.0.1:1"}, "must not contain"),
        ("x", "must be a JSON object"),
    ],
)
def test_bad_proxies_are_refused(body: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_proxy(body)


def test_update_changes_only_what_it_names() -> None:
    current = parse_proxy({"name": "mcp", "upstream": "127.0.0.1:8000", "listen": "127.0.0.1:9000"})
    assert parse_proxy_update(current, {"enabled": False}) == ProxyConfig(
        "mcp", current.listen, current.upstream, False
    )
    assert parse_proxy_update(current, {"upstream": "127.0.0.1:8001"}).upstream.port == 8001
    assert parse_proxy_update(current, {"toxics": []}) == current, (
        "a proxy as GET shows it may be posted back"
    )
    with pytest.raises(ValueError, match="name cannot change"):
        parse_proxy_update(current, {"name": "other"})


def test_populate_and_endpoint_comparison() -> None:
    a, b = parse_populate(
        [{"name": "a", "upstream": "127.0.0.1:1"}, {"name": "b", "upstream": "127.0.0.1:2"}]
    )
    bound = ProxyConfig("a", Address("127.0.0.1", 41000), a.upstream)
    assert a.same_endpoints(bound), "a requested port 0 matches any port"
    assert not b.same_endpoints(bound)
    with pytest.raises(ValueError, match="names a proxy twice: a"):
        parse_populate([{"name": "a", "upstream": "127.0.0.1:1"}, {"name": "a", "upstream": "127.0.0.1:1"}])
    with pytest.raises(ValueError, match="JSON array"):
        parse_populate({"proxies": []})
