"""The real nemesis (`lab nemesis --api-port 0`) as a subprocess on 127.0.0.1, driven
through toxiproxy-python (`lab.nemesis.client`). Stopped by PID at the end."""

from __future__ import annotations

import contextlib
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.nemesis.client import NotFoundError, ProxyInfo, ToxiproxyClient
from lab.nemesis.log import NemesisRecord, read_nemesis_log
from tests.livesrv import stop

LAB = str(Path(sys.executable).with_name("lab"))
ANNOUNCE = re.compile(r"^lab-nemesis api (http://127\.0\.0\.1:\d+)$")


@dataclass
class NemesisProcess:
    proc: subprocess.Popen[str]
    url: str
    log: Path
    stderr: Path

    def records(self, proxy: str | None = None) -> list[NemesisRecord]:
        return [r for r in read_nemesis_log(self.log) if proxy is None or r.proxy == proxy]

    def alive(self) -> bool:
        return self.proc.poll() is None


def _read_announcement(proc: subprocess.Popen[str], stderr: Path, timeout: float = 20.0) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"lab nemesis said nothing within {timeout}s:\n{stderr.read_text()}")
    line = proc.stdout.readline().strip()
    match = ANNOUNCE.match(line)
    if match is None:
        raise RuntimeError(f"unexpected first line {line!r}:\n{stderr.read_text()}")
    return match.group(1)


@contextmanager
def running_nemesis(folder: Path) -> Iterator[NemesisProcess]:
    """`lab nemesis` in a subprocess; stopped by PID; it must exit 0 with no traceback."""
    log, stderr = folder / "nemesis.jsonl", folder / "stderr.txt"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            [LAB, "nemesis", "--api-port", "0", "--log", str(log), "--seed", "1"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        yield NemesisProcess(proc, _read_announcement(proc, stderr), log, stderr)
    finally:
        code = stop(proc)
    assert code == 0, f"lab nemesis exited with {code}:\n{stderr.read_text()}"
    assert "Traceback" not in stderr.read_text(), "a handler hit a bug:\n" + stderr.read_text()


@pytest.fixture(scope="session")
def nemesis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NemesisProcess]:
    with running_nemesis(tmp_path_factory.mktemp("nemesis")) as process:
        yield process


@pytest.fixture
def client(nemesis: NemesisProcess) -> ToxiproxyClient:
    return ToxiproxyClient(nemesis.url, timeout=5.0)


class ProxyFactory:
    """Creates proxies with names unique to the test and deletes them afterwards."""

    def __init__(self, client: ToxiproxyClient, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.names: list[str] = []

    def __call__(self, upstream_port: int, suffix: str = "") -> ProxyInfo:
        name = f"{self.prefix}{suffix}"
        self.names.append(name)
        return self.client.create_proxy(name, f"127.0.0.1:{upstream_port}")

    def cleanup(self) -> None:
        for name in self.names:
            with contextlib.suppress(NotFoundError):
                self.client.delete_proxy(name)


@pytest.fixture
def make_proxy(client: ToxiproxyClient, request: pytest.FixtureRequest) -> Iterator[ProxyFactory]:
    prefix = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:80] + f"_{time.monotonic_ns() % 10**6}"
    factory = ProxyFactory(client, prefix)
    yield factory
    factory.cleanup()


def listen_port(info: ProxyInfo) -> int:
    return int(info.listen.rsplit(":", 1)[1])
