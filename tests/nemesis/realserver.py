"""A real `toxiproxy-server`, when one is given, for the tests and scripts that compare the
embedded nemesis with it. The binary is never part of this repository: point
`LAB_TOXIPROXY_SERVER` at one built elsewhere (docs/nemesis.md says how). Without it,
the comparisons run against the embedded nemesis alone and the real-server cases skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.nemesis.client import ToxiproxyClient, wait_until_up
from lab.run.options import free_port
from tests.livesrv import stop

ENV = "LAB_TOXIPROXY_SERVER"


def real_server_binary() -> Path | None:
    """The `toxiproxy-server` named by `LAB_TOXIPROXY_SERVER`, if it exists."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    path = Path(value)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise FileNotFoundError(f"{ENV}={value}: not an executable file")
    return path


@contextmanager
def running_real_toxiproxy(binary: Path, log: Path, *, seed: int = 1) -> Iterator[str]:
    """`toxiproxy-server` on 127.0.0.1 (its API URL), stopped by PID at the end; its
    output goes to `log`."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(port), "-seed", str(seed)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(ToxiproxyClient(url, timeout=2), within=20)
        yield url
    finally:
        stop(proc)
