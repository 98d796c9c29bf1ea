"""A run whose load was a client under test (run.json `client.kind` other than `lab`):
which gates judge it, where their truth comes from, and what the report says of it.

Such a run keeps no client ledger: the client is an implementation the lab did not
write. Its gates read the proxy tap (the wire), the server ledger where there is one,
and the adapters' application logs (lab.checker.truth.applog):

    rule                          reading (lab.checker.rules)   truth from
    1  cross_stream               cross_stream_sut              app log x tap; server: wire
    2  duplicate_dispatch         duplicates_sut                server ledger + wire; app log
    3  missing_rehandshake        rehandshake_sut               wire
    4  illegal_origin             origin                        wire (as for any client)
    5  resume_p99                 resume_sut                    wire losses, app-log recoveries
    6  reconnect_qps              reconnect (one judgement)     wire
    9  client_resume_cursor       client_cursor                 wire
    10 client_reconnect_after_gone client_after_gone            wire
    11 client_disconnect_cancel   client_cancel                 wire + app log (cancels asked)
    12 client_resend              client_resend                 wire

(Each rule's `check_under_test` in the registry; 7 and 8 judge any client where they apply.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.checker.context import Context
from lab.checker.inputs.load import MissingInput
from lab.checker.model import ClientInfo, Liveness
from lab.checker.rules import resume_sut
from lab.checker.truth.applog import AppLogs, load_app_logs


def client_of(run: Mapping[str, Any] | None) -> ClientInfo | None:
    """run.json `client`, None when run.json does not say (a run of the lab's own clients
    from before the field existed)."""
    client = (run or {}).get("client")
    if not isinstance(client, Mapping) or not isinstance(client.get("kind"), str):
        return None
    impl = client.get("implementation")
    text = f"{impl.get('name', '?')} {impl.get('version', '?')}" if isinstance(impl, Mapping) else None
    expected = client.get("expected_failures")
    baseline = client.get("baseline")
    return ClientInfo(
        kind=client["kind"],
        implementation=text,
        expected_failures=tuple(str(i) for i in expected if isinstance(i, str))
        if isinstance(expected, list)
        else (),
        baseline=str(baseline) if isinstance(baseline, str) else None,
    )


def under_test(run: Mapping[str, Any] | None) -> bool:
    client = client_of(run)
    return client is not None and client.kind != "lab"


def logs_of(ctx: Context) -> AppLogs:
    """The application logs as loaded (sources and problems included), whatever their state."""
    return ctx.cached("app_logs", lambda: load_app_logs(ctx.data))


def implementations(ctx: Context, client: ClientInfo) -> ClientInfo:
    """The client with the implementation its adapters' `ready` lines name, when run.json
    does not (or names another)."""
    found = logs_of(ctx).implementations()
    if not found or client.implementation in found:
        return client
    return ClientInfo(client.kind, ", ".join(found), client.expected_failures, client.baseline)


def liveness(ctx: Context) -> Liveness:
    """Calls the wire shows that never got an outcome in the application log."""
    try:
        stuck = resume_sut.calls_without_outcome(ctx)
    except MissingInput as e:
        return Liveness(None, (), notes=(f"calls without outcome not counted: {e}",))
    return Liveness(
        calls_without_outcome=len(stuck),
        clients_stuck=tuple(sorted(set(stuck["client_id"].astype(str).tolist())))[:50],
        notes=("from the application logs of the client under test and the proxy's record (tap)",),
    )
