"""A driver hands an output's ledger records over before it carries out the output's
commands: a Locust user is killed by an exception thrown into its greenlet wherever it
yields, and closing a connection may yield. The records of that same output (the exchange
the client had just ended) must be written by then."""

from __future__ import annotations

import pytest

from lab.client import CloseConnection, Output, SendRequest
from lab.drivers.base import DriverBase
from lab.wire.client_ledger import HttpExchange, Record


class Killed(BaseException):
    """What gevent throws into a greenlet that is killed (GreenletExit is a BaseException)."""


class KilledOnClose(DriverBase):
    def __init__(self, written: list[Record]) -> None:
        super().__init__(None, "http://127.0.0.1:1/mcp", on_records=written.extend)  # type: ignore[arg-type]
        self.started: list[SendRequest] = []

    def _close(self, conn_id: int, *, finished: bool = False) -> None:
        raise Killed

    def _start(self, cmd: SendRequest) -> None:
        self.started.append(cmd)

    def _signal(self) -> None:
        pass


def exchange(conn_id: int) -> HttpExchange:
    return HttpExchange(
        client_id="c1",
        conn_id=conn_id,
        purpose="standalone",
        method="GET",
        stream_key="get:1",
        status=200,
        session="s-mac",
        session_generation=1,
        carried_session=True,
        started_at=1.0,
        ended_at=2.0,
        error="",
        last_event_id="7",
    )


def test_records_are_written_before_a_close_that_kills_the_user() -> None:
    written: list[Record] = []
    driver = KilledOnClose(written)
    out = Output(commands=(CloseConnection(conn_id=3, finished=True),), records=(exchange(3),))
    with pytest.raises(Killed):
        driver._after(out)
    assert written == [exchange(3)]
