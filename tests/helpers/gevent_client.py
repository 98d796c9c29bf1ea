"""A gevent-patched process (as in a Locust worker) driving one lab client with the sync driver.

    python -m tests.helpers.gevent_client URL DB

Prints one JSON line: what happened, for the test to check; `idle_sockets` is how many
connections the client holds once its session is up and it has sat idle past its
keep-alive (the standalone GET stream alone, if idle connections are closed);
`calls_leaving_a_kept_connection`: of three calls in a row, after how many the pool
still held an idle connection for the next (the POST's, when it is kept).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from lab.client import (  # noqa: E402
    BackoffPolicy,
    CallFinished,
    CallHandle,
    ClientConfig,
    ClientCore,
    LeaveFinished,
    Notice,
    ReconnectBudget,
    State,
)
from lab.drivers.sync import IDLE_CHECK_S, SyncDriver, default_client  # noqa: E402
from lab.inbox import InboxDatabase  # noqa: E402
from lab.wire.redact import Redactor  # noqa: E402

KEEPALIVE = 0.3


def sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return n


def main() -> None:
    url, db_path = sys.argv[1], sys.argv[2]
    db = InboxDatabase(db_path)
    notices: list[Notice] = []
    core = ClientCore(
        ClientConfig(client_id="g1", backoff=BackoffPolicy(0.05, 0.5)),
        inbox=db.inbox("g1"),
        budget=ReconnectBudget(20.0),
        redactor=Redactor(b"g" * 32),
        rng=random.Random(1),
    )
    before = sockets()
    with default_client(keepalive=KEEPALIVE) as http:
        driver = SyncDriver(core, url, http, on_records=db.record, on_notice=notices.append)
        driver.call(core.connect)
        assert driver.wait_for(lambda: core.state is State.SESSION_ACTIVE, 10)
        assert driver.wait_for(lambda: any(k.startswith("get:") for k in core.streams), 10)
        time.sleep(KEEPALIVE + IDLE_CHECK_S + 0.7)
        idle_sockets = sockets() - before
        outcomes = []
        for tool, args in (
            ("echo", {"text": "x"}),
            ("ticker", {"count": 9, "interval_ms": 30, "close_after": 3, "retry_ms": 50}),
        ):
            handle: CallHandle = driver.call(core.call_tool, tool, args)

            def finished(h: CallHandle = handle) -> bool:
                return any(isinstance(n, CallFinished) and n.call == h for n in notices)

            driver.wait_for(finished, 20)
            outcomes += [str(n.outcome) for n in notices if isinstance(n, CallFinished) and n.call == handle]
        # Three calls in a row, each answered on its POST's SSE stream: the connection of
        # one goes back to the pool for the next (the driver lets each message end).
        kept = 0
        for i in range(3):
            again: CallHandle = driver.call(core.call_tool, "echo", {"text": f"again {i}"})

            def answered(h: CallHandle = again) -> bool:
                return any(isinstance(n, CallFinished) and n.call == h for n in notices)

            driver.wait_for(answered, 20)
            time.sleep(0.1)  # (the reader lets the message end just after the answer)
            pool = http._transport._pool.connections  # type: ignore[attr-defined]
            # Whether an idle connection waits for the next call (the GET stream is busy: not
            # counted). Counted once per call: a resumption's connection that went back to
            # the pool too (a loaded box's timing) is no second kept one.
            kept += any(c.is_idle() for c in pool)
        driver.call(core.leave)
        driver.wait_for(lambda: any(isinstance(n, LeaveFinished) for n in notices), 10)
        driver.stop()
    time.sleep(0.1)
    db.close()
    leave = [str(n.receipt) for n in notices if isinstance(n, LeaveFinished)]
    print(
        json.dumps(
            {
                "outcomes": outcomes,
                "leave": leave,
                "gevent": "gevent" in sys.modules,
                "idle_sockets": idle_sockets,
                "calls_leaving_a_kept_connection": kept,
            }
        )
    )


if __name__ == "__main__":
    main()
