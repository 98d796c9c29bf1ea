"""The ledger contract of docs/ledgers.md as data: which files, tables, record types and
fields the checker reads, and which schema names it knows.

A file whose schema name is not one of these, or which lacks a field listed here, is
refused with an error naming it (never read half-way). Extra fields are fine: a writer
may add fields without breaking the checker. Client ledger columns come from the record
dataclasses themselves (`lab.wire.client_ledger`), so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import fields

from lab.wire import client_ledger

RUN_SCHEMA = "mcpLabRun.v1"
CLIENT_SCHEMA = client_ledger.LEDGER_SCHEMA  # mcpClientLedger.v1
INBOX_SCHEMA = "lab.inbox.v1"
SERVER_SCHEMA = "mcpServerLedger.v1"
TAP_SCHEMA = "mcpLabTap.v1"
NEMESIS_SCHEMA = "mcpLabNemesis.v1"

RUN_FILE = "run.json"
CLIENTS_GLOB = "clients/*.sqlite"
SERVER_FILE = "server/ledger.sqlite"
TAP_FILE = "proxy/tap.jsonl"
NEMESIS_FILE = "nemesis.jsonl"

# A SQLite ledger may name its schema in a `meta(name, value)` table (lab.inbox writes
# name='schema'). docs/ledgers.md does not require the row, so its absence is accepted;
# a value the checker does not know is refused.
KNOWN_META_SCHEMAS: dict[str, frozenset[str]] = {
    "client": frozenset({INBOX_SCHEMA, CLIENT_SCHEMA}),
    "server": frozenset({SERVER_SCHEMA}),
}
META_NAMES = ("schema", "ledger")

# The inbox's `data` column (the whole message) is never read: the checker needs digests.
CLIENT_TABLES: dict[str, tuple[str, ...]] = {
    "inbox": (
        "client_id",
        "session_generation",
        "stream_key",
        "event_id",
        "message_digest",
        "sequence",
        "server_stream_id",
        "kind",
        "jsonrpc_id",
        "method",
        "conn_id",
        "accepted_at",
    ),
    "outbox": (
        "client_id",
        "dispatch_key",
        "session_generation",
        "stream_key",
        "event_id",
        "message_digest",
        "kind",
        "created_at",
    ),
}
for _record_type in client_ledger.RECORD_TYPES:
    CLIENT_TABLES[_record_type.table] = tuple(f.name for f in fields(_record_type))

SERVER_TABLES: dict[str, tuple[str, ...]] = {
    "sessions": (
        "session",
        "principal",
        "auth_subject",
        "handshake_receipt",
        "protocol_version",
        "origin_policy",
        "created_at",
        "expires_at",
        "generation",
        "resumable",
        "shadow",
        "ended_at",
        "end_reason",
    ),
    "streams": (
        "session",
        "stream_id",
        "opened_by",
        "request_id",
        "payload_digest",
        "conn",
        "opened_at",
        "last_sent_event_id",
        "last_acked_event_id",
        "retry_ms",
        "closed_at",
        "close_reason",
    ),
    "events_sent": (
        "session",
        "stream_id",
        "event_id",
        "sequence",
        "digest",
        "kind",
        "jsonrpc_id",
        "sent_at",
        "replay",
        "conn",
    ),
    "dispatches": ("idempotency_key", "session", "auth_subject", "request_id", "tool", "effect", "at"),
    "requests": (
        "at",
        "method",
        "conn",
        "session",
        "status",
        "reason",
        "origin",
        "origin_allowed",
        "protocol_version",
        "last_event_id",
        "cursor_verdict",
    ),
}

OPTIONAL_COLUMNS: dict[str, tuple[str, ...]] = {
    "dispatches": ("arguments_digest",),
}
"""Columns read when a ledger has them (added after the table's first version); a check
that needs one says so when it is absent."""

TAP_RECORDS: dict[str, tuple[str, ...]] = {
    "flow": (
        "flow",
        "t",
        "conn",
        "method",
        "path",
        "session",
        "jsonrpc_id",
        "jsonrpc_method",
        "idempotency_key",
        "origin_in",
        "origin_out",
        "origin_allowed_out",
        "last_event_id_in",
        "last_event_id_out",
        "status",
        "answered_by",
        "faults",
    ),
    "sent": ("flow", "t", "index", "event_id", "digest", "has_data", "priming", "stream_id", "session"),
    "forwarded": ("flow", "t", "index", "event_id", "digest", "source", "fault", "rule", "decision"),
    "dropped": ("flow", "t", "index", "fault", "rule", "decision"),
    "flow_end": ("flow", "t", "reason"),
    "fault": ("t", "fault", "rule", "decision", "flow", "detail"),
    # A fault plan that became active (or could not be used); read, not judged.
    "plan": ("t", "source", "digest", "error"),
    # The answer to a tool call as the server sent it (gate 2 from the wire): a digest of
    # its result, per (auth subject, idempotency key).
    "result": (
        "flow",
        "t",
        "session",
        "auth",
        "jsonrpc_id",
        "idempotency_key",
        "tool",
        "is_error",
        "result_digest",
    ),
    # What a session declared at initialize (the server's result, the client's request):
    # capability paths, for `declared_capabilities`.
    "capabilities": ("flow", "t", "session", "server", "client"),
    # What each `tools/list` answer annotated (readOnlyHint, idempotentHint), for the
    # retry rule of a client under test (`client_resend`).
    "tools": ("flow", "t", "session", "tools"),
    # A stream the proxy gave up: one SSE event of the target outgrew its bound.
    "oversize": ("flow", "t", "index", "chars", "limit"),
}

NEMESIS_RECORDS: dict[str, tuple[str, ...]] = {
    "proxy_created": ("t", "proxy"),
    "proxy_deleted": ("t", "proxy"),
    "toxic_added": ("t", "proxy", "toxic", "kind"),
    "toxic_removed": ("t", "proxy", "toxic", "kind"),
    # What became of each add or remove the schedule asked for; a removal that failed or
    # whose outcome is unknown means the toxic's window never closed.
    "toxic_outcome": ("t", "proxy", "toxic", "kind", "action", "outcome"),
}

# Fields that must be numbers wherever they are not null (a string there means the file
# is not what the contract says).
NUMERIC_FIELDS: frozenset[str] = frozenset(
    {
        "t",
        "index",
        "status",
        "at",
        "sent_at",
        "lost_at",
        "recovered_at",
        "started_at",
        "ended_at",
        "accepted_at",
        "created_at",
        "advised_delay",
        "planned_delay",
        "waited",
        "session_generation",
        "conn_id",
    }
)


# ---------------------------------------------------------------------------- run.json

RUN_STATES_UNFINISHED = frozenset({"running", "abandoned"})
"""`end_reason` (or `status`) values of a run that did not finish: still being written by
a live `lab run`, or left behind by one that died (`abandoned`)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_json_errors(run: dict[str, object]) -> list[str]:
    """What is wrong with run.json's fields, one phrase each naming the field and what
    was expected (docs/ledgers.md); [] when every field the checker reads is well-formed.
    Fields the checker does not read are not judged; missing optional ones are fine."""
    out: list[str] = []

    def want(name: str, ok: bool, expected: str, required: bool = False) -> None:
        if name not in run:
            if required:
                out.append(f"field '{name}' is missing (expected {expected})")
            return
        if not ok:
            out.append(f"field '{name}' is {_shown(run[name])} (expected {expected})")

    want("run_id", isinstance(run.get("run_id"), str), "a string")
    want("complete", isinstance(run.get("complete"), bool), "true or false", required=True)
    want("started_at", _is_number(run.get("started_at")), "epoch seconds", required=True)
    want(
        "stopped_at",
        run.get("stopped_at") is None or _is_number(run.get("stopped_at")),
        "epoch seconds or null",
    )
    want("end_reason", run.get("end_reason") is None or isinstance(run.get("end_reason"), str), "a string")
    want("status", isinstance(run.get("status"), str), "a string")
    want("seed", _is_count(run.get("seed")), "an integer >= 0, the scenario's")
    want("workers", _is_count(run.get("workers")), "an integer >= 0")
    want(
        "part_died", run.get("part_died") is None or isinstance(run.get("part_died"), str), "a string or null"
    )
    want("processes", _is_list_of_objects(run.get("processes")), "a list of objects")
    want("budget_split", _is_list_of_objects(run.get("budget_split")), "a list of objects")
    want("toxic_outcomes", _is_list_of_objects(run.get("toxic_outcomes")), "a list of objects")
    want("versions", isinstance(run.get("versions"), dict), "an object")
    want("client", isinstance(run.get("client"), dict), "an object")
    want("overrides", isinstance(run.get("overrides"), dict), "an object (scenario key -> value)")
    want("budgets", isinstance(run.get("budgets"), dict), "an object of numbers")
    want("scenario", isinstance(run.get("scenario"), dict), "an object")
    want("target", isinstance(run.get("target"), dict), "an object")
    want("fault_windows", isinstance(run.get("fault_windows"), list), "a list")
    budgets = run.get("budgets")
    if isinstance(budgets, dict):
        for name, value in budgets.items():
            if value is not None and not (_is_number(value) and value == value and value >= 0):
                out.append(f"field 'budgets.{name}' is {_shown(value)} (expected a number >= 0)")
    windows = run.get("fault_windows")
    if isinstance(windows, list):
        for i, w in enumerate(windows):
            if not (
                isinstance(w, dict)
                and isinstance(w.get("fault"), str)
                and _is_number(w.get("start"))
                and _is_number(w.get("end"))
            ):
                out.append(f"field 'fault_windows[{i}]' is {_shown(w)} (expected {{fault, start, end}})")
                break
    return out


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_list_of_objects(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, dict) for x in value)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
