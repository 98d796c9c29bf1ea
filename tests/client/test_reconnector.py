"""The one reconnector: one table of kinds, one set of steps, Recovery rows built in one place."""

from __future__ import annotations

import ast
import math
import random
from pathlib import Path

from lab.client import BackoffPolicy, ClientConfig, ClientCore, MemoryInbox, ReconnectBudget
from lab.client._reconnector import KINDS, RECOVERY_TARGETS, EndPath, Kind, Target
from lab.wire.client_ledger import ReconnectAttempt, Recovery
from lab.wire.redact import Redactor

CLIENT = Path(__file__).resolve().parents[2] / "lab" / "client"


def core(**cfg: object) -> ClientCore:
    return ClientCore(
        ClientConfig(client_id="c1", backoff=BackoffPolicy(0.2, 2.0), **cfg),  # type: ignore[arg-type]
        inbox=MemoryInbox(),
        budget=ReconnectBudget(math.inf),
        redactor=Redactor(b"r" * 32),
        rng=random.Random(1),
    )


def constructed_in(path: Path, names: set[str]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            found.add(node.func.id)
    return found


def test_recovery_and_attempt_rows_are_built_in_the_reconnector_only() -> None:
    rows = {Recovery.__name__, ReconnectAttempt.__name__}
    builders = {p.name: constructed_in(p, rows) for p in CLIENT.glob("*.py")}
    assert {name for name, found in builders.items() if found} == {"_reconnector.py"}
    assert builders["_reconnector.py"] == rows


def test_the_probe_sees_a_row_built_elsewhere(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text("from x import Recovery\nRecovery('c', 'k', None, 'x', 0.0, None, 'p', 0, False)\n")
    assert constructed_in(stray, {"Recovery"}) == {"Recovery"}


def test_every_kind_has_a_rule_and_a_handler() -> None:
    c = core()
    assert set(KINDS) == set(Kind) == set(c.reconnector.handlers)


def test_the_table_says_what_follows_a_resumption_that_cannot_work() -> None:
    assert KINDS[Kind.RESUME].fallback == {Target.CALL: Kind.RESEND, Target.STANDALONE: Kind.REOPEN}
    assert all(not KINDS[k].fallback for k in Kind if k is not Kind.RESUME)


def test_attempt_limits_come_from_the_config() -> None:
    cfg = ClientConfig(client_id="c1", max_attempts=5, max_delete_attempts=4)
    limits = {k: KINDS[k].limit(cfg) for k in Kind}
    assert limits == {
        Kind.RESUME: 5,
        Kind.RESEND: 5,
        Kind.REOPEN: 5,
        Kind.REINITIALIZE: None,  # a client without a session can do nothing: it keeps trying
        Kind.DELETE: 3,  # the first DELETE is not a reconnect: 4 requests in all
    }


def test_only_calls_and_the_standalone_stream_are_recoveries() -> None:
    assert {Target.CALL, Target.STANDALONE} == RECOVERY_TARGETS
    c = core()
    for target in Target:
        loss = c.reconnector.open(target, "op" if target is Target.CALL else "", 1.0, "x", kind=Kind.RESEND)
        c.reconnector.end(loss, EndPath.CLIENT_STOPPED)
    rows = [r for r in c.fx.take().records if isinstance(r, Recovery)]
    assert [(r.operation_key, r.path, r.recovered_at) for r in rows] == [
        (None, "client_stopped", None),
        (None, "client_stopped", None),
    ]


def test_a_recovery_ends_once() -> None:
    c = core()
    loss = c.reconnector.open(
        Target.STANDALONE, "", 1.0, "connection_lost", kind=Kind.RESUME, subject="get:1"
    )
    c.reconnector.recovered(loss, 2.0)
    c.reconnector.end(loss, EndPath.LEFT)
    (row,) = c.fx.take().records
    assert isinstance(row, Recovery) and (row.path, row.recovered_at) == ("resumed", 2.0)
    assert c.reconnector.get(Target.STANDALONE) is None


def test_kinds_are_the_reconnect_kinds_of_the_ledger() -> None:
    doc = ReconnectAttempt.__doc__ or ""
    assert all(str(k) in doc for k in Kind)
