"""The report's section "Unanswered requests by hop" (report.json `unanswered`,
`lab.checker.health.unanswered`), as a block of lines and tables for report.md and report.html.
Always shown: zeros included, and "no requests" said as such (never "all answered")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.report.sections import Block, Table, _num, _pct

UNANSWERED_HOPS = {
    "client_to_proxy": "client → proxy",
    "proxy_to_server": "proxy → server",
    "server_to_proxy": "server → proxy",
    "proxy_to_client": "proxy → client",
}
MAX_BIN_ROWS = 30
"""Every 10 s bin is listed up to this many; beyond, only the bins with unanswered requests."""


def unanswered_block(doc: Mapping[str, Any]) -> Block:
    """Always shown: 0s included, and "no requests" said as such (never as "all answered")."""
    title = "Unanswered requests by hop"
    un = doc.get("unanswered")
    if not isinstance(un, Mapping):
        return Block(
            "unanswered", title, ["Could not be computed (see *Problems*): nothing is known of them."]
        )
    lines: list[str] = []
    status = un.get("status")
    if status == "no_requests":
        lines.append('No request in the ledgers: nothing to count (inconclusive, not "all answered").')
    elif status == "tap_missing":
        lines.append(
            "No proxy tap: the requests that got no answer are counted from the clients' ledgers; "
            "where they were lost is not known."
        )
    elif status == "client_unknown":
        lines.append(
            "The client side is not known (no client ledger): the requests are the proxy's flows; "
            "client → proxy and proxy → client are not counted."
        )
    sent = un.get("sent") if un.get("sent") is not None else un.get("reached_proxy")
    lost = un.get("unanswered") or 0
    if status != "no_requests":
        if lost:
            most = UNANSWERED_HOPS.get(str(un.get("most_at")), "?")
            lines.append(
                f"{lost:,} of {sent:,} requests went unanswered ({_pct(un.get('share'))}); most at {most}."
            )
        else:
            lines.append(f"0 of {sent:,} requests went unanswered.")
    lab = un.get("lab_limit")
    if isinstance(lab, Mapping):
        lines.append(f"Verdict note: {lab['text']}.")
    elif un.get("many"):
        hop = str(un.get("most_at"))
        where = f"most were lost at {UNANSWERED_HOPS.get(hop, hop)} — {(un.get('hops') or {}).get(hop, '')}"
        saturated = un.get("lab_saturated") or []
        if saturated:
            lines.append(
                f"Many went unanswered: {where}; the lab parts saturated meanwhile ({'; '.join(saturated)}) "
                "do not carry the hops that dropped them: not the lab's limit."
            )
        else:
            lines.append(
                "Many went unanswered and no lab part was saturated while they did (CPU, file descriptors, "
                f"connections failing before the proxy): {where}."
            )
    if not un.get("server_to_proxy_checked"):
        lines.append("No server ledger: server → proxy is not told apart from proxy → server.")
    for key, text in (
        (
            "closed_early",
            "closed by their client (left, stopped, cancelled) before the resume budget: not counted",
        ),
        ("proxy_only", "seen by the proxy with a conn no client ledger has: not counted"),
        (
            "open_at_proxy_stop",
            "still held by the proxy when it stopped (their conn unknown: the tap wrote no flow record)",
        ),
    ):
        if un.get(key):
            lines.append(f"{un[key]:,} request(s) {text}.")
    by_fault = un.get("by_fault") or {}
    if any(by_fault.values()):
        lines.append(
            f"{sum(by_fault.values()):,} lost by an injected fault (proxy fault or nemesis toxic): not counted."
        )
    funnel = Table(
        [
            "sent by the clients",
            "reached the proxy",
            "answered by the server",
            "answered by the proxy",
            "answer reached the client",
        ],
        [
            [
                _num(un.get(k))
                for k in (
                    "sent",
                    "reached_proxy",
                    "answered_by_server",
                    "answered_by_proxy",
                    "answered_at_client",
                )
            ]
        ],
        "The chain, over the run.",
    )
    hops = un.get("hops") or {}
    errors = un.get("errors_by_hop") or {}
    per_hop = Table(
        ["hop", "where", "unanswered", "by fault", "how the client gave up"],
        [
            [
                short,
                str(hops.get(h, "")).split(": ", 1)[-1],
                _num((un.get("by_hop") or {}).get(h)),
                _num(by_fault.get(h)),
                ", ".join(f"{k} {v}" for k, v in (errors.get(h) or {}).items()) or "—",
            ]
            for h, short in UNANSWERED_HOPS.items()
        ],
        "Per hop: where each unanswered request was when its client stopped waiting.",
    )
    tables = [funnel, per_hop]
    rows = list(un.get("bins") or [])
    if len(rows) > MAX_BIN_ROWS:
        rows = [b for b in rows if b.get("unanswered")]
    if rows:
        tables.append(
            Table(
                [
                    "T+ (s)",
                    "sent",
                    "reached proxy",
                    "answered by server",
                    "answer reached client",
                    "unanswered",
                    *UNANSWERED_HOPS.values(),
                ],
                [
                    [
                        f"{b['start_s']:.0f}–{b['end_s']:.0f}",
                        _num(b.get("sent")),
                        _num(b.get("reached_proxy")),
                        _num(b.get("answered_by_server")),
                        _num(b.get("answered_at_client")),
                        _num(b.get("unanswered")),
                        *(_num((b.get("by_hop") or {}).get(h)) for h in UNANSWERED_HOPS),
                    ]
                    for b in rows
                ],
                f"Per {un.get('bin_s', 10):g} s bin, by the time the requests were sent"
                + (
                    " (bins with unanswered requests only)." if len(rows) < len(un.get("bins") or []) else "."
                ),
            )
        )
    witnesses = [
        [
            UNANSWERED_HOPS.get(str(w["hop"]), str(w["hop"])),
            str(w["explanation"]),
            ", ".join(w.get("refs") or []) or "—",
        ]
        for w in un.get("witnesses") or []
    ]
    if witnesses:
        tables.append(Table(["hop", "witness", "raw"], witnesses, "Witnesses (the first of each hop)."))
    return Block("unanswered", title, lines, tables)
