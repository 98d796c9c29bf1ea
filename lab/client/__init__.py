"""The sans-IO core of the lab's MCP client: no sockets, no clocks, no threads.

Bytes and facts go in (with the time as a parameter); every call returns one `Output`:
the commands for the driver, the client-ledger records and the notices for the
application. Nothing here imports gevent, trio, httpx or locust, so the same core runs under a
Locust worker (gevent) and a trio driver, and is tested without any I/O. The wire
vocabulary it shares with the server, the proxy and the checker is `lab.wire`.

The modules are private; what a driver, a Locust user or a test may use is exported
here (`__all__`), and a test pins the list.
"""

from lab.client._acceptance import (
    ALL_CHECKS,
    Acceptance,
    Check,
    ConnectionView,
    DedupKey,
    InboxReceipt,
    InboxStore,
    OutboxDispatch,
    Outcome,
    RejectReason,
    SeenEvent,
    SessionView,
    StreamView,
    Watermark,
    accept_stream_event,
)
from lab.client._commands import (
    CallFinished,
    CallHandle,
    CallOutcome,
    CloseConnection,
    Command,
    Headers,
    LeaveFinished,
    LeaveReceipt,
    Notice,
    Output,
    Progress,
    Purpose,
    SendRequest,
    SessionEstablished,
    SessionLost,
)
from lab.client._config import ClientConfig
from lab.client._core import ClientCore
from lab.client._diagram import document as state_diagram_document
from lab.client._memory_inbox import MemoryInbox
from lab.client._reconnect import BackoffPolicy, ReconnectBudget, parse_retry_after
from lab.client._states import State

__all__ = [
    "ALL_CHECKS",
    "Acceptance",
    "BackoffPolicy",
    "CallFinished",
    "CallHandle",
    "CallOutcome",
    "Check",
    "ClientConfig",
    "ClientCore",
    "CloseConnection",
    "Command",
    "ConnectionView",
    "DedupKey",
    "Headers",
    "InboxReceipt",
    "InboxStore",
    "LeaveFinished",
    "LeaveReceipt",
    "MemoryInbox",
    "Notice",
    "OutboxDispatch",
    "Outcome",
    "Output",
    "Progress",
    "Purpose",
    "ReconnectBudget",
    "RejectReason",
    "SeenEvent",
    "SendRequest",
    "SessionEstablished",
    "SessionLost",
    "SessionView",
    "State",
    "StreamView",
    "Watermark",
    "accept_stream_event",
    "parse_retry_after",
    "state_diagram_document",
]
