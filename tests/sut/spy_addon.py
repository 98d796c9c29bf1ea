"""A mitmproxy addon for tests/sut only: the wire between a client under test and the server.

    mitmdump -q --mode reverse:http://127.0.0.1:PORT --listen-host 127.0.0.1 --listen-port 0 -s tests/sut/spy_addon.py

It passes every flow through untouched (SSE streamed as it arrives) and writes one JSON
line per response to $LAB_SUT_SPY_FILE: the HTTP method, the JSON-RPC method of a POST,
the raw session ID the request carried and the one the response gave, whether the
request carried Last-Event-ID, and the status. The raw IDs let a test expire a session
through the server's admin control and grep the adapter's output for them; they are
written only into the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from mitmproxy import ctx, http


class Spy:
    def __init__(self) -> None:
        self._out = open(os.environ["LAB_SUT_SPY_FILE"], "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def running(self) -> None:
        proxyserver: Any = ctx.master.addons.get("proxyserver")  # type: ignore[no-untyped-call]
        for addr in proxyserver.listen_addrs():
            print(f"spy listening on http://{addr[0]}:{addr[1]}/mcp", flush=True)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        flow.response.stream = True
        rpc_method = None
        if flow.request.method == "POST":
            try:
                body = json.loads(flow.request.content or b"null")
                rpc_method = body.get("method") if isinstance(body, dict) else None
            except ValueError:
                pass
        rec = {
            "t": time.time(),
            "method": flow.request.method,
            "rpc": rpc_method,
            "sent": flow.request.headers.get("mcp-session-id"),
            "given": flow.response.headers.get("mcp-session-id"),
            "lastEventId": "last-event-id" in flow.request.headers,
            "status": flow.response.status_code,
        }
        self._out.write(json.dumps(rec) + "\n")


addons = [Spy()]
