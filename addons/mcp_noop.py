"""A pass-through addon: streams SSE responses untouched (the baseline of bench/bench_proxy.py).

    .venv/bin/mitmdump -q --mode reverse:http://127.0.0.1:PORT --listen-host 127.0.0.1 --listen-port 0 -s addons/mcp_noop.py

It does the least any SSE-aware addon must do: mark event streams as streamed in
`responseheaders` (else mitmproxy holds the body until it ends). Like the lab's addons it
drops mitmdump's inert default addons (mcp_faults_io.drop_inert_addons), so that a
comparison with them measures the addons' own work. Prints
`mcp_noop listening on http://HOST:PORT` when ready.
"""

from typing import Any

import mcp_faults_io
from mitmproxy import ctx, http


class McpNoop:
    def running(self) -> None:
        mcp_faults_io.drop_inert_addons()
        ps: Any = ctx.master.addons.get("proxyserver")  # type: ignore[no-untyped-call]
        for addr in ps.listen_addrs() if ps is not None else []:
            print(f"mcp_noop listening on http://{addr[0]}:{addr[1]}", flush=True)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        resp = flow.response
        if resp is not None and resp.headers.get("content-type", "").startswith("text/event-stream"):
            resp.stream = True


addons = [McpNoop()]
