"""The server's own evidence under abuse (issue 11): text that is not Unicode never stops
the ledger writer nor hangs a request, and a writer that fails for real stops the server
loudly (exit 4, a log line, no write left hanging)."""

from __future__ import annotations

import os
import resource
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lab.exitcodes import ExitCode
from lab.server.ledger import INSERT_DISPATCH, Ledger, LedgerFailed
from tests.livesrv import LAB, LEDGER_KEY, ROOT, LiveProcess, reference_server, stop, wait_for_line
from tests.server.mcp_http import POST_HEADERS, Mcp, messages

pytestmark = pytest.mark.live
SHORT = httpx.Timeout(5.0)
"""No answer within this is a hang: every answer here takes milliseconds."""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProcess]:
    with reference_server(tmp_path_factory.mktemp("evidence"), "--tokens", "tok=alice") as p:
        yield p


def _post_text(m: Mcp, body: str) -> httpx.Response:
    """POST a body given as JSON text, so that it can carry a `\\udc00` escape verbatim."""
    return m.client.post(m.url, content=body.encode(), headers=m.headers(POST_HEADERS), timeout=SHORT)


def _dispatch_keys(srv: LiveProcess) -> list[str]:
    time.sleep(0.3)  # the writer commits every 50 ms
    db = sqlite3.connect(Path(srv.log).parent / "ledger.sqlite")
    try:
        return [r[0] for r in db.execute("SELECT idempotency_key FROM dispatches")]
    finally:
        db.close()


def test_a_lone_surrogate_key_is_refused_and_later_writes_are_still_recorded(srv: LiveProcess) -> None:
    m = Mcp(srv.url, token="tok")
    m.initialize()
    bad = (
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ledger.append",'
        '"arguments":{"entry":"x"},"_meta":{"mcp-lab/idempotency-key":"\\udc00k"}}}'
    )
    r = _post_text(m, bad)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == -32600 and "lone surrogate" in err["message"]
    assert "$.params._meta.mcp-lab/idempotency-key" in err["message"]
    # The writer is alive: a later write is answered, and recorded.
    m.client.timeout = SHORT
    r2, events = m.call("ledger.append", {"entry": "y"}, key="k-after-surrogate")
    assert r2.status_code == 200
    assert messages(events)[-1]["result"]["structuredContent"]["receipt"].startswith("r-")
    assert "k-after-surrogate" in _dispatch_keys(srv)


@pytest.mark.parametrize(
    ("where", "body"),
    [
        (
            "echo text",
            '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"\\ud800"}}}',
        ),
        ("request id", '{"jsonrpc":"2.0","id":"\\udc00","method":"tools/call","params":{"name":"clock"}}'),
        (
            "progressToken",
            '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"ticker",'
            '"arguments":{"count":1,"interval_ms":0},"_meta":{"progressToken":"\\udfff"}}}',
        ),
        ("method", '{"jsonrpc":"2.0","id":3,"method":"tools/\\ud834call"}'),
        ("tool name", '{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"\\udd1e"}}'),
        ("object key", '{"jsonrpc":"2.0","id":5,"method":"ping","params":{"\\ud800":1}}'),
        ("notification", '{"jsonrpc":"2.0","method":"notifications/\\ud800"}'),
        ("batch", '[{"jsonrpc":"2.0","id":6,"method":"ping","params":{"x":"\\ud800"}}]'),
    ],
)
def test_lone_surrogates_anywhere_get_a_json_rpc_error_never_a_hang_or_500(
    srv: LiveProcess, where: str, body: str
) -> None:
    m = Mcp(srv.url, token="tok")
    m.initialize()
    r = _post_text(m, body)  # raises ReadTimeout on a hang
    assert r.status_code == 400, f"{where}: {r.status_code} {r.text[:200]}"
    assert r.json()["error"]["code"] == -32600
    assert "Traceback" not in r.text
    # A surrogate *pair* is Unicode (U+1D11E) and is answered as usual.
    ok = _post_text(
        m,
        '{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"echo","arguments":{"text":"\\ud834\\udd1e"}}}',
    )
    assert ok.status_code == 200
    from lab.wire.sse import SseDecoder

    assert messages(SseDecoder().feed(ok.content))[-1]["result"]["content"][0]["text"] == "\U0001d11e"
    assert srv.proc.poll() is None


def test_ledger_writes_text_sqlite_cannot_take_escaped_never_dropped(tmp_path: Path) -> None:
    """The writer itself (real SQLite, in-process): a row holding a lone surrogate is
    written with it escaped, the rows around it too, and the barrier after it resolves."""
    ledger = Ledger(tmp_path / "l.sqlite")
    try:
        for key in ("before", "\udc00k", "after"):
            ledger.write(
                INSERT_DISPATCH, (key, "s", "alice", "1", "ledger.append", "performed", "r", 0.0, "d")
            )
        ledger.barrier().result(timeout=5)
        assert ledger.failure is None and ledger.rows_escaped == 1
    finally:
        ledger.close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    keys = [r[0] for r in db.execute("SELECT idempotency_key FROM dispatches ORDER BY rowid")]
    db.close()
    assert keys == ["before", "\\udc00k", "after"]


def test_ledger_that_fails_for_real_fails_every_waiter_at_once(tmp_path: Path) -> None:
    """A writer whose database is gone for good (a directory where the file was) fails
    every barrier, now and later, instead of leaving it hanging."""
    path = tmp_path / "l.sqlite"
    ledger = Ledger(path)
    try:
        ledger.barrier().result(timeout=5)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        path.mkdir()  # reopening or writing the file now fails with an I/O error
        ledger.write("INSERT INTO no_such_table VALUES (?)", (1,))
        with pytest.raises(LedgerFailed):
            ledger.barrier().result(timeout=5)
        with pytest.raises(LedgerFailed):
            ledger.barrier().result(timeout=1)
        ledger.write(INSERT_DISPATCH, ("k", "s", "a", "1", "t", "performed", "r", 0.0, "d"))
        assert ledger.failure is not None and ledger.rows_lost >= 1
    finally:
        ledger.close()


def _limit_file_size() -> None:
    # Files this process writes may not grow past 256 KiB: the ledger's WAL soon hits it
    # (EFBIG, as on a full disk). Python ignores SIGXFSZ, so the write fails, not the process.
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


def test_a_full_disk_stops_the_server_with_exit_4_and_no_hanging_write(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    argv = [LAB, "serve", "--port", "0", "--ledger", str(tmp_path / "ledger.sqlite"), "--tokens", "tok=alice"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "LAB_LEDGER_KEY": LEDGER_KEY},
            preexec_fn=_limit_file_size,
        )
    try:
        url = wait_for_line(proc, log, "lab-serve listening on ")
        m = Mcp(url, token="tok")
        m.client.timeout = SHORT
        m.initialize()
        answers: list[str] = []
        deadline = time.monotonic() + 60
        i = 0
        while proc.poll() is None and time.monotonic() < deadline:
            i += 1
            try:
                _r, events = m.call("ledger.append", {"entry": "x" * 2000}, key=f"k{i}")
            except httpx.ConnectError:
                break  # the server is gone
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # Cut mid-answer by the shutdown (a close, or a reset when the process exits
                # with the request unread): an end, not a hang. A hang is a ReadTimeout.
                continue
            msgs = messages(events)
            if msgs and "error" in msgs[-1]:
                answers.append(msgs[-1]["error"]["message"])
        proc.wait(timeout=15)
        assert proc.returncode == ExitCode.LAB_FAILED
        text = log.read_text()
        assert "ledger writer failed" in text and "exit 4" in text
        assert all("ledger failed" in a for a in answers), answers
    finally:
        stop(proc)
