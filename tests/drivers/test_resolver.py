"""A Locust process resolves a numeric host without gevent's thread pool, and a name as
before (lab.load.resolver). Run in a process of its own: gevent patches it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.load.resolver import is_numeric_host

ROOT = Path(__file__).resolve().parents[2]

_PROBE = """
import gevent.monkey
gevent.monkey.patch_all()
import socket
import gevent
import lab.load.locustfile  # installs the resolver, as in every Locust process of a run
from lab.load.resolver import NumericFirstResolver

hub = gevent.get_hub()
assert isinstance(hub.resolver, NumericFirstResolver), hub.resolver
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
port = server.getsockname()[1]
socket.create_connection(("127.0.0.1", port), timeout=5).close()
want = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
assert socket.getaddrinfo("127.0.0.1", port, 0, socket.SOCK_STREAM) == want
assert hub.threadpool.size == 0, "a numeric host went through the thread pool"
assert socket.getaddrinfo("localhost", port, socket.AF_INET, socket.SOCK_STREAM)
assert hub.threadpool.size >= 1, "a name is resolved in the pool, off the loop"
print("ok")
"""


def test_a_numeric_host_skips_the_thread_pool_and_a_name_does_not() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_numeric_hosts_are_address_literals_only() -> None:
    assert is_numeric_host("127.0.0.1") and is_numeric_host(b"10.0.0.7") and is_numeric_host("::1")
    assert is_numeric_host("fe80::1%eth0")
    assert not is_numeric_host("localhost") and not is_numeric_host("mitmproxy")
    assert not is_numeric_host("127.0.0.1.example") and not is_numeric_host("")
