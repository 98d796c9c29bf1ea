"""How `lab run` stops its parts once the run is over: the Locust master and its workers
first, given time to let every user leave when the chain can still carry the goodbyes,
then every other part in the reverse order of their start; at once (SIGKILL) when the
user asked twice."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from lab.run.options import BROKEN_CHAIN, STOP_GRACE
from lab.run.processes import Child, ProcessGroup


def stop_parts(
    group: ProcessGroup,
    master: Child | None,
    run_dir: Path,
    *,
    end_reason: str,
    died: str | None,
    ui: bool,
    force: threading.Event,
) -> None:
    """Stop every child of `group`; `end_reason` and `died` are the run's (run.json), `ui`
    whether the Locust web UI is up, `force` set once the user asked to stop at once."""
    if force.is_set():
        group.kill_all()
        return
    # Locust's own stop lets every user leave (DELETE its session): worth waiting for
    # while the chain works. Not when a part died or stopped answering (the users' last
    # requests would hang), nor with the web UI up (Locust's quit then stops the load
    # but not the process, and a worker the UI's STOP let go is told nothing more).
    patient = not ui and died is None and not end_reason.startswith(BROKEN_CHAIN)
    workers = [c for c in group.children if c.name.startswith("worker-")]
    if patient and master is not None and master.alive():
        # Ask the master to quit (see lab/load/locustfile.py): it tells its workers, which
        # stop their users gracefully (users DELETE their sessions) and exit by themselves.
        with contextlib.suppress(OSError):  # a full disk: the master is stopped by signal then
            (run_dir / "stop-requested").touch()
        _wait_for([master], 20, force)
    if master is not None:
        group.stop(master, grace=STOP_GRACE if patient else 3)  # only if it did not go by itself
    _wait_for(workers, 30 if patient else 2, force)
    for child in workers:  # only the ones that did not go by themselves
        group.stop(child, grace=0 if force.is_set() else 15 if patient else 3)
    if force.is_set():
        group.kill_all()
    for child in reversed(group.children):
        group.stop(child, grace=0 if force.is_set() else STOP_GRACE)


def _wait_for(children: list[Child], seconds: float, force: threading.Event) -> None:
    """Until every one of `children` has exited, `seconds` have passed or `force` is set."""
    deadline = time.monotonic() + seconds
    while any(c.alive() for c in children) and time.monotonic() < deadline and not force.is_set():
        time.sleep(0.2)
