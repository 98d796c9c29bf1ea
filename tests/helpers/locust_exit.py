"""A Locust worker's life cut short: users killed while they are being built, then quit.

    python -m tests.helpers.locust_exit USERS

Runs the lab's locustfile in this process with Locust's local runner (LAB_LOCUST_SETTINGS
and LAB_LEDGER_KEY come from the environment), spawns USERS users slowly, and quits as
soon as a few calls have ended (at most 20 s in), then fires `quitting` as Locust's own
shutdown does. Building a client is made to yield (as starting a driver's greenlet used
to), so the quit lands in the middle of a user's construction: the worst moment. Prints one JSON line: the
client-ledger records handed to the file per table, the inbox commits, and how many
clients began and finished being built.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import httpx  # noqa: E402
from locust import events  # noqa: E402
from locust.env import Environment  # noqa: E402

import lab.load.locustfile as locustfile  # noqa: E402
from lab.load import user as load_user  # noqa: E402
from lab.wire.client_ledger import Record  # noqa: E402


def main() -> None:
    users = int(sys.argv[1])
    env = Environment(user_classes=[locustfile.LabUser], events=events)
    runner = env.create_local_runner()
    events.init.fire(environment=env, runner=runner, web_ui=None)  # type: ignore[no-untyped-call]
    ctx = load_user.WORKER[0]

    handed: Counter[str] = Counter()
    write = ctx.db.record

    def counting(records: Iterable[Record]) -> None:
        records = list(records)
        handed.update(r.table for r in records)
        write(records)

    ctx.db.record = counting  # type: ignore[method-assign]

    building: list[int] = [0, 0]  # begun, finished
    make_http = ctx.http_client

    def yielding_http() -> httpx.Client:
        building[0] += 1
        gevent.sleep(0.05)  # a construction step that yields: a kill can land here
        return make_http()

    ctx.http_client = yielding_http  # type: ignore[method-assign]
    init = load_user.McpClient.__init__

    def counted_init(self: load_user.McpClient, *args: Any) -> None:
        init(self, *args)
        building[1] += 1

    load_user.McpClient.__init__ = counted_init  # type: ignore[method-assign, assignment]

    runner.start(users, spawn_rate=users * 100)
    counters = ctx.counters
    for _ in range(400):
        if counters["calls_ok"] + counters["calls_failed"] + counters["calls_unknown"] >= 3:
            break
        gevent.sleep(0.05)
    runner.quit()
    events.quitting.fire(environment=env, reverse=True)  # type: ignore[no-untyped-call]
    print(
        json.dumps(
            {
                "handed": dict(handed),
                "commits": ctx.db.commits,
                "db": str(ctx.db.path),
                "begun": building[0],
                "built": building[1],
                "closed": ctx.db.closed,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
