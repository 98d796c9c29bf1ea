"""A gevent-patched process (as in a Locust worker) driving one lab client with the sync driver.

    python -m tests.helpers.gevent_client URL DB

Prints one JSON line: what happened, for the test to check.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import httpx  # noqa: E402

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
from lab.drivers.sync import SyncDriver  # noqa: E402
from lab.inbox import InboxDatabase  # noqa: E402
from lab.wire.redact import Redactor  # noqa: E402


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
    with httpx.Client(timeout=10.0) as http:
        driver = SyncDriver(core, url, http, on_records=db.record, on_notice=notices.append)
        driver.call(core.connect)
        assert driver.wait_for(lambda: core.state is State.SESSION_ACTIVE, 10)
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
        driver.call(core.leave)
        driver.wait_for(lambda: any(isinstance(n, LeaveFinished) for n in notices), 10)
        driver.stop()
    time.sleep(0.1)
    db.close()
    leave = [str(n.receipt) for n in notices if isinstance(n, LeaveFinished)]
    print(json.dumps({"outcomes": outcomes, "leave": leave, "gevent": "gevent" in sys.modules}))


if __name__ == "__main__":
    main()
