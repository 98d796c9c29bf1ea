"""The report's section "Unanswered requests by hop" (report.json `unanswered`,
`lab.checker.health.unanswered`), as a block of lines and tables for report.md and report.html.
Always shown: zeros included, and "no requests" said as such (never "all answered").

The section's dict is read once into an `Unanswered` record; each part of the block (the
status, the verdict note, what was not counted, each table) is rendered from the record by
a function of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.report.table import NONE, Block, Column, Table, num, pct, table

UNANSWERED_HOPS = {
    "client_to_proxy": "client → proxy",
    "proxy_to_server": "proxy → server",
    "server_to_proxy": "server → proxy",
    "proxy_to_client": "proxy → client",
}
MAX_BIN_ROWS = 30
"""Every 10 s bin is listed up to this many; beyond, only the bins with unanswered requests."""

TITLE = "Unanswered requests by hop"

NOT_COUNTED = (
    (
        "closed_early",
        "closed by their client (left, stopped, cancelled) before the resume budget: not counted",
    ),
    ("proxy_only", "seen by the proxy with a connection ID no client ledger has: not counted"),
    (
        "open_at_proxy_stop",
        "still held by the proxy when it stopped (their connection unknown: the proxy recorded no flow for them)",
    ),
)
"""The requests left out of the count, by their key in the section, with what they are."""

CHAIN = (
    ("sent", "sent by the clients"),
    ("reached_proxy", "reached the proxy"),
    ("answered_by_server", "answered by the server"),
    ("answered_by_proxy", "answered by the proxy"),
    ("answered_at_client", "answer reached the client"),
)
"""The chain a request passes, by its key in the section (and in each bin)."""


@dataclass(frozen=True)
class Bin:
    """One time bin of the requests, by when they were sent."""

    start_s: float
    end_s: float
    counts: Mapping[str, Any]  # the CHAIN keys and "unanswered"
    by_hop: Mapping[str, Any]


@dataclass(frozen=True)
class Witness:
    hop: str
    explanation: str
    refs: Sequence[str]


@dataclass(frozen=True)
class Unanswered:
    """report.json's `unanswered` section, as the block reads it. Counts are kept as the
    checker wrote them (None: not known), so their cells read as before."""

    status: str | None
    chain: Mapping[str, Any]  # by CHAIN key
    requests: Any  # `sent`, or where the clients are not known `reached_proxy`
    lost: int
    share: float | None
    most_at: str
    lab_limit: str | None  # the verdict note of a lab limit
    many: bool
    hops: Mapping[str, Any]  # hop -> its description ("name: where")
    lab_saturated: Sequence[str]
    server_to_proxy_checked: bool
    not_counted: Mapping[str, Any]  # by NOT_COUNTED key
    by_hop: Mapping[str, Any]
    by_fault: Mapping[str, Any]
    errors_by_hop: Mapping[str, Mapping[str, Any]]
    bin_s: float
    bins: Sequence[Bin]
    witnesses: Sequence[Witness]


def read_unanswered(un: Mapping[str, Any]) -> Unanswered:
    """The section as the block reads it; a key the checker left out reads as not known."""
    lab = un.get("lab_limit")
    return Unanswered(
        status=un.get("status"),
        chain={key: un.get(key) for key, _ in CHAIN},
        requests=un.get("sent") if un.get("sent") is not None else un.get("reached_proxy"),
        lost=un.get("unanswered") or 0,
        share=un.get("share"),
        most_at=str(un.get("most_at")),
        lab_limit=f"{lab['text']}" if isinstance(lab, Mapping) else None,
        many=bool(un.get("many")),
        hops=un.get("hops") or {},
        lab_saturated=un.get("lab_saturated") or [],
        server_to_proxy_checked=bool(un.get("server_to_proxy_checked")),
        not_counted={key: un.get(key) for key, _ in NOT_COUNTED},
        by_hop=un.get("by_hop") or {},
        by_fault=un.get("by_fault") or {},
        errors_by_hop=un.get("errors_by_hop") or {},
        bin_s=un.get("bin_s", 10),
        bins=[_read_bin(b) for b in un.get("bins") or []],
        witnesses=[
            Witness(str(w["hop"]), str(w["explanation"]), w.get("refs") or [])
            for w in un.get("witnesses") or []
        ],
    )


def _read_bin(b: Mapping[str, Any]) -> Bin:
    counts = {key: b.get(key) for key in (*(k for k, _ in CHAIN), "unanswered")}
    return Bin(b["start_s"], b["end_s"], counts, b.get("by_hop") or {})


def unanswered_block(doc: Mapping[str, Any]) -> Block:
    """Always shown: 0s included, and "no requests" said as such (never as "all answered")."""
    un = doc.get("unanswered")
    if not isinstance(un, Mapping):
        return Block(
            "unanswered", TITLE, ["Could not be computed (see *Problems*): nothing is known of them."]
        )
    u = read_unanswered(un)
    lines = [*_status_lines(u), *_verdict_lines(u), *_not_counted_lines(u)]
    tables = [_chain_table(u), _per_hop_table(u)]
    tables += [t for t in (_bins_table(u), _witness_table(u)) if t is not None]
    return Block("unanswered", TITLE, lines, tables)


def _status_lines(u: Unanswered) -> list[str]:
    """What the count rests on, and the count."""
    lines: list[str] = []
    if u.status == "no_requests":
        lines.append('No request in the ledgers: nothing to count (inconclusive, not "all answered").')
        return lines
    if u.status == "tap_missing":
        lines.append(
            "No proxy record (tap): the requests that got no answer are counted from the clients' ledgers; "
            "where they were lost is not known."
        )
    elif u.status == "client_unknown":
        lines.append(
            "The client side is not known (no client ledger): the requests are those the proxy saw (its flows); "
            "client → proxy and proxy → client are not counted."
        )
    if u.lost:
        most = UNANSWERED_HOPS.get(u.most_at, "?")
        lines.append(
            f"{u.lost:,} of {u.requests:,} requests went unanswered ({pct(u.share)}); most at {most}."
        )
    else:
        lines.append(f"0 of {u.requests:,} requests went unanswered.")
    return lines


def _verdict_lines(u: Unanswered) -> list[str]:
    """Whether the lab's own limit explains the losses (the verdict's note), or what does."""
    if u.lab_limit is not None:
        return [f"Verdict note: {u.lab_limit}."]
    if not u.many:
        return []
    hop = u.most_at
    where = f"most were lost at {UNANSWERED_HOPS.get(hop, hop)} — {u.hops.get(hop, '')}"
    if u.lab_saturated:
        return [
            f"Many went unanswered: {where}; the lab parts saturated meanwhile ({'; '.join(u.lab_saturated)}) "
            "do not carry the hops that dropped them: not the lab's limit."
        ]
    return [
        "Many went unanswered and no lab part was saturated while they did (CPU, file descriptors, "
        f"connections failing before the proxy): {where}."
    ]


def _not_counted_lines(u: Unanswered) -> list[str]:
    """The hop the lab could not tell apart, and the requests left out of the count."""
    lines: list[str] = []
    if not u.server_to_proxy_checked:
        lines.append("No server ledger: server → proxy is not told apart from proxy → server.")
    for key, text in NOT_COUNTED:
        if u.not_counted[key]:
            lines.append(f"{u.not_counted[key]:,} request(s) {text}.")
    if any(u.by_fault.values()):
        lines.append(
            f"{sum(u.by_fault.values()):,} lost by an injected fault (proxy fault or nemesis toxic): not counted."
        )
    return lines


def _chain_cell(key: str) -> Callable[[Unanswered], str]:
    return lambda u: num(u.chain[key])


def _chain_table(u: Unanswered) -> Table:
    return table([Column(title, _chain_cell(key)) for key, title in CHAIN], [u], "The chain, over the run.")


def _per_hop_table(u: Unanswered) -> Table:
    def errors(hop: str) -> str:
        return ", ".join(f"{k} {v}" for k, v in (u.errors_by_hop.get(hop) or {}).items()) or NONE

    columns = [
        Column[str]("hop", lambda hop: UNANSWERED_HOPS[hop]),
        Column[str]("where", lambda hop: str(u.hops.get(hop, "")).split(": ", 1)[-1]),
        Column[str]("unanswered", lambda hop: num(u.by_hop.get(hop))),
        Column[str]("by fault", lambda hop: num(u.by_fault.get(hop))),
        Column[str]("how the client gave up", errors),
    ]
    return table(
        columns,
        UNANSWERED_HOPS,
        "Per hop: where each unanswered request was when its client stopped waiting.",
    )


def _bin_hop_cell(hop: str) -> Callable[[Bin], str]:
    return lambda b: num(b.by_hop.get(hop))


_BIN_COLUMNS: tuple[Column[Bin], ...] = (
    Column("T+ (s)", lambda b: f"{b.start_s:.0f}–{b.end_s:.0f}"),
    Column("sent", lambda b: num(b.counts["sent"])),
    Column("reached proxy", lambda b: num(b.counts["reached_proxy"])),
    Column("answered by server", lambda b: num(b.counts["answered_by_server"])),
    Column("answer reached client", lambda b: num(b.counts["answered_at_client"])),
    Column("unanswered", lambda b: num(b.counts["unanswered"])),
    *(Column(short, _bin_hop_cell(hop)) for hop, short in UNANSWERED_HOPS.items()),
)


def _bins_table(u: Unanswered) -> Table | None:
    """Every bin, or when there are too many only those with unanswered requests."""
    rows = list(u.bins)
    if len(rows) > MAX_BIN_ROWS:
        rows = [b for b in rows if b.counts["unanswered"]]
    if not rows:
        return None
    only = " (bins with unanswered requests only)." if len(rows) < len(u.bins) else "."
    return table(_BIN_COLUMNS, rows, f"Per {u.bin_s:g} s bin, by the time the requests were sent" + only)


_WITNESS_COLUMNS: tuple[Column[Witness], ...] = (
    Column("hop", lambda w: UNANSWERED_HOPS.get(w.hop, w.hop)),
    Column("witness", lambda w: w.explanation),
    Column("raw", lambda w: ", ".join(w.refs) or NONE),
)


def _witness_table(u: Unanswered) -> Table | None:
    if not u.witnesses:
        return None
    return table(_WITNESS_COLUMNS, u.witnesses, "Witnesses (the first of each hop).")
