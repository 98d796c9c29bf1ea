"""The addon raises mitmproxy's listen backlog (asyncio's default of 100 overflows under
reconnect storms): checked on a socket of this process, with `ss` reading the kernel's view."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest
from mcp_faults_io import raise_listen_backlog  # the addons folder is on sys.path (conftest.py)


def backlog_of(port: int) -> int:
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[2])  # State Recv-Q Send-Q: a listener's Send-Q is its backlog


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs `ss` (iproute2) to read a socket's backlog")
def test_backlog_of_a_listening_socket_is_raised() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(7)
        port = s.getsockname()[1]
        assert backlog_of(port) == 7
        assert raise_listen_backlog("127.0.0.1", port, 1234) is True
        assert backlog_of(port) == 1234
        assert s.fileno() >= 0  # the socket itself was left alone, still open


def test_no_listener_no_change() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound but not listening
        assert raise_listen_backlog("127.0.0.1", s.getsockname()[1]) is False
