"""A process that accepts events into a SQLite inbox until it is killed.

    python -m tests.helpers.inbox_writer DB COUNT [KILL_AT [split|group]]

With KILL_AT, the process SIGKILLs itself inside the transaction of commit number
KILL_AT, after the receipt is written and before the dispatch: the worst moment.
With `split`, it first commits the receipt on its own — the bug of writing receipt and
dispatch in two transactions — so a test can show that its check catches that bug.
With `group`, the inbox is one client of an `InboxDatabase` (group commit), flushed after
every 7 commits, and the kill comes before commit KILL_AT joins the pending batch.
Prints "ready" once the inbox is open, so the parent can time a kill of its own.
"""

from __future__ import annotations

import os
import signal
import sys

from lab.client import ConnectionView, SessionView, StreamView, accept_stream_event
from lab.inbox import InboxDatabase, SqliteInbox, connect
from lab.wire import jsonrpc
from lab.wire.sse import SseEvent


def main() -> None:
    db_path, count = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    split = len(sys.argv) > 4 and sys.argv[4] == "split"
    group = InboxDatabase(db_path) if len(sys.argv) > 4 and sys.argv[4] == "group" else None
    commits = 0
    db = connect(db_path) if group is None else group.db

    def between() -> None:
        if commits == kill_at:
            if split:
                db.execute("COMMIT")
                db.execute("BEGIN")
            os.kill(os.getpid(), signal.SIGKILL)

    inbox = SqliteInbox(db, "c1", between_writes=between, group=group)
    session = SessionView(1, True, "2025-11-25", None, None, False)
    conn = ConnectionView(1, 1, "2025-11-25", None)
    print("ready", flush=True)
    for i in range(count):
        stream = StreamView(f"post:{i}", i, i, f"op-{i}", None)
        data = jsonrpc.dumps(jsonrpc.result(i, {"n": i}))
        commits = i
        accept_stream_event(
            inbox,
            client_id="c1",
            session=session,
            conn=conn,
            stream=stream,
            event=SseEvent(data=data, id=f"ev-{i}"),
            event_id=f"ev-{i}",
            now=float(i),
        )
        if group is not None and i % 7 == 6:
            group.flush()
    print("done", flush=True)


if __name__ == "__main__":
    main()
