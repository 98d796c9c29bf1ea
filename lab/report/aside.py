"""The figures, drawn beside the judging: a forked child draws them while the parent
judges the same loaded ledgers.

`lab run` waits for `lab report` before it can say the verdict, and on a 100k-event run
the report was judging (~11 s) then drawing (~3-4 s) one after the other on a box whose
other core sat idle once the load was over: the release gate's wall time is the sum.
The child is forked after the ledgers are loaded, so it reads them without loading them
again (copy-on-write), and it only draws and writes PNG files; what it drew comes back as
JSON on a pipe. Whatever goes wrong with it (no `fork` on this platform, the child dies,
it says nothing within `WAIT_S`, or the process has other threads), the parent draws the
figures itself, as before: the report never loses a figure to this shortcut.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from lab.checker import RunData, fault_outcomes_of

type Drawn = tuple[list[dict[str, str]], list[str], list[str]]
"""draw_all's answer: figures written, figures that failed to draw, figures not written."""

WAIT_S = 120.0
"""How long the parent waits for the child's answer once it has judged (drawing takes a
few seconds; a child still silent then is stopped, and the parent draws)."""


def draw_beside(data: RunData, out_dir: Path) -> Callable[[], Drawn]:
    """Start drawing the run's figures (those every run has) in a child; returns the
    function that gives what was drawn (waiting for the child, or drawing here)."""
    from lab.report.figures import draw_all

    def here() -> Drawn:
        return draw_all(data, out_dir)

    # Only a single-threaded process forks: a child forked while another thread holds a
    # lock (logging's, the allocator's) can deadlock. `lab report` as `lab run` starts it
    # has one thread; a caller with threads (a test runner) draws here.
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return here
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return here
    if pid == 0:  # the child: draw, answer, and leave without running the parent's cleanups
        code = 1
        try:
            os.close(read_fd)
            payload = json.dumps(draw_all(data, out_dir, sections=_sections_here(data))).encode()
            with os.fdopen(write_fd, "wb") as pipe:
                pipe.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return lambda: _collect(pid, read_fd, here)


def _sections_here(data: RunData) -> dict[str, object] | None:
    """The one verdict section a figure needs that the child can compute alone, cheaply
    (what each fault did, ~0.2 s on a gate run): its figure is then drawn here too, not
    after the judging (the parent skips it when the child drew it). None if it fails: the
    parent draws it then, from the judging's own section."""
    try:
        return {"fault_outcomes": fault_outcomes_of(data)}
    except Exception:
        return None


def _collect(pid: int, read_fd: int, here: Callable[[], Drawn]) -> Drawn:
    chunks: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        while True:  # until the child closes the pipe, or the deadline
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                break
            chunk = pipe.read(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return here()
    try:
        written, errors, unwritten = json.loads(b"".join(chunks))
    except (ValueError, TypeError):
        return here()
    return list(written), list(errors), list(unwritten)
