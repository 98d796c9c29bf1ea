"""A module fixture made once for the whole test session, not once per xdist worker.

`make test` spreads one module's tests over four workers (`--maxschedchunk 1`), and a
`scope="module"` fixture is then built on every worker that runs one of them: the short
run of tests/run/test_lab_run.py was made four times a suite (about 20 s of a busy box
each). `once` builds the thing in the session's shared temporary folder under a file
lock; the other workers wait for it and read what it left.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The session's temporary folder all xdist workers share (each has its own below it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> tuple[Path, Any]:
    """(the folder `make` built in, what it returned: JSON). `make(folder)` runs once per
    session whichever worker asks first; a `make` that raised is tried again by the next."""
    root = shared_root(factory)
    folder = root / f"once-{name}"
    done = root / f"once-{name}.json"
    with (root / f"once-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.is_file():
            return folder, json.loads(done.read_text(encoding="utf-8"))
        folder.mkdir(parents=True, exist_ok=True)
        value = make(folder)
        done.write_text(json.dumps(value), encoding="utf-8")
        return folder, value
