"""First contact with a target that is not ours, before any load: `lab run --target URL`.

What the target offers in each protocol era (docs/eras.md), straight to it (no proxy, no
fault): first `server/discover` under 2026-07-28, as a client of both eras probes (its
answer, or why there is none, is recorded: `eras.modern`); then one `initialize`,
`notifications/initialized`, one `tools/list`, and `DELETE` of the session
(`eras.handshake`). The run is refused, naming the reason, when the target:
- does not answer, or answers `initialize` with an error;
- negotiates a protocol revision without sessions (2026-07-28 and later removed
  sessions and resumption: there is nothing for this lab to check there), or one the lab
  does not speak;
- gives no `MCP-Session-Id` (no session, so nothing to resume);
- lacks a tool of the target contract (docs/targets.md): echo, clock, ticker,
  ledger.append — each missing one is named.

The revision it negotiated goes into run.json (`target.protocol_version`), and what it
offers in each era (`target.eras`). The run's era (`target.era`: handshake, modern or
both) decides what the target must serve: a run of the modern era asks only
`server/discover` and a modern `tools/list`; a target that does not serve an era the run
asks for is refused, saying which era it does serve and the `--era` that would run.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Final

import httpx

from lab.wire.jsonrpc import DISCOVER
from lab.wire.revisions import (
    MODERN_REVISIONS,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    SUPPORTED_REVISIONS,
    modern_stamp,
)
from lab.wire.sse import SseDecoder

CONTRACT_TOOLS: Final = ("echo", "clock", "ticker", "ledger.append")
"""The tools a target must offer (the reference server's, `lab.server.tools.TOOLS`)."""
SESSIONLESS_FROM: Final = "2026-07-28"
"""The first revision without sessions or resumption."""


class PreflightRefused(RuntimeError):
    """The target cannot be run against; the message says why, in one paragraph."""


@dataclass(frozen=True, slots=True)
class ModernOffer:
    """What the target answered `server/discover` under 2026-07-28."""

    versions: tuple[str, ...]
    """The modern revisions it lists (empty: it serves no modern era)."""
    answer: str
    """The answer in brief: the versions listed, or the error / status it gave."""

    def as_json(self) -> dict[str, Any]:
        return {"versions": list(self.versions), "answer": self.answer}


@dataclass(frozen=True, slots=True)
class TargetFacts:
    protocol_version: str | None
    """The handshake era's revision it negotiated (None: a run of the modern era only)."""
    server_info: dict[str, Any]
    tools: tuple[str, ...]
    modern: ModernOffer | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "protocol_version": self.protocol_version,
            "server_info": self.server_info,
            "tools": self.tools,
            "eras": {
                "handshake": self.protocol_version,
                "modern": None if self.modern is None else self.modern.as_json(),
            },
        }


def check_target(
    url: str,
    *,
    protocol_version: str,
    era: str = "handshake",
    token: str | None = None,
    origin: str | None = None,
    timeout: float = 10.0,
) -> TargetFacts:
    """What `url` serves in the era(s) the run tests (`era`: handshake, modern or both):
    PreflightRefused when it cannot serve this run (see the module docstring)."""
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if origin:
        headers["origin"] = origin
    with httpx.Client(timeout=timeout, headers=headers) as http:
        modern = probe_modern(http, url)
        if era in ("modern", "both") and not modern.versions:
            raise PreflightRefused(
                f"target {url} does not serve the modern protocol era ({modern.answer}), and the run asks for "
                f'era = "{era}": run it in the handshake era (era = "handshake", --era handshake), or serve '
                f"{MODERN_REVISIONS[-1]} (docs/eras.md)"
            )
        if era == "modern":
            return _modern_facts(http, url, modern)
        try:
            init = _post(
                http,
                url,
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": protocol_version,
                        "capabilities": {},
                        "clientInfo": {"name": "lab-preflight", "version": "1"},
                    },
                },
                {},
            )
        except PreflightRefused as e:
            raise _modern_only(url, modern, str(e)) from None
        result = init.get("result")
        if not isinstance(result, dict):
            raise _modern_only(url, modern, f"target {url}: initialize was answered with {_brief(init)}")
        revision = str(result.get("protocolVersion", ""))
        _check_revision(url, revision)
        session = init.get("_session")
        if not session:
            raise PreflightRefused(
                f"target {url}: initialize gave no Mcp-Session-Id header; without a session there is "
                "nothing to resume, and this lab checks session resumption"
            )
        after = {SESSION_HEADER: session, PROTOCOL_VERSION_HEADER: revision}
        _post(http, url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, after, expect=False)
        listed = _post(http, url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, after)
        with contextlib.suppress(httpx.HTTPError):  # leaving politely is not part of the contract
            http.delete(url, headers=after)
    tools = _contract_tools(url, listed)
    info = result.get("serverInfo")
    return TargetFacts(revision, info if isinstance(info, dict) else {}, tools, modern)


def _contract_tools(url: str, listed: dict[str, Any]) -> tuple[str, ...]:
    """The tools a `tools/list` answer names; PreflightRefused without the contract's."""
    tools_obj = listed.get("result", {}).get("tools") if isinstance(listed.get("result"), dict) else None
    if not isinstance(tools_obj, list):
        raise PreflightRefused(f"target {url}: tools/list was answered with {_brief(listed)}")
    tools = tuple(str(t.get("name")) for t in tools_obj if isinstance(t, dict))
    missing = [t for t in CONTRACT_TOOLS if t not in tools]
    if missing:
        raise PreflightRefused(
            f"target {url} lacks {'the tool' if len(missing) == 1 else 'the tools'} "
            f"{', '.join(missing)} of the target contract (docs/targets.md: {', '.join(CONTRACT_TOOLS)}); "
            f"it offers: {', '.join(tools) or 'none'}"
        )
    return tools


def probe_modern(http: httpx.Client, url: str) -> ModernOffer:
    """`server/discover` under 2026-07-28, as the modern era asks it (`_meta`, the
    mirrored headers); never raises: a handshake-only target answers it 400 or 404."""
    try:
        answer = _post_modern(http, url, 0, DISCOVER, MODERN_REVISIONS[-1])
    except PreflightRefused as e:
        return ModernOffer((), str(e).removeprefix(f"target {url}: "))
    result = answer.get("result")
    listed = result.get("supportedVersions") if isinstance(result, dict) else None
    if not isinstance(listed, list):
        return ModernOffer((), f"server/discover was answered with {_brief(answer)}")
    versions = tuple(v for v in listed if isinstance(v, str) and v in MODERN_REVISIONS)
    return ModernOffer(versions, f"server/discover lists {', '.join(map(str, listed)) or 'nothing'}")


def _modern_only(url: str, modern: ModernOffer, why: str) -> PreflightRefused:
    """The refusal of a target whose `initialize` failed: saying, when it serves the modern
    era, that it serves that era only."""
    if not modern.versions:
        return PreflightRefused(why)
    return PreflightRefused(
        f"target {url} serves the modern protocol era only ({modern.answer}; {why.removeprefix(f'target {url}: ')}), "
        "and the run asks for the handshake era (initialize, sessions, resumption): run it in the modern era "
        f'(era = "modern", --era modern), or serve a handshake revision too ({", ".join(SUPPORTED_REVISIONS)}; '
        "docs/eras.md)"
    )


def _post_modern(http: httpx.Client, url: str, mid: int, method: str, version: str) -> dict[str, Any]:
    """A request of the modern era, stamped as the lab's client stamps one (`_meta`, the
    mirrored headers); its JSON-RPC answer (`_post`)."""
    message, headers = modern_stamp({"jsonrpc": "2.0", "id": mid, "method": method}, version, "lab-preflight")
    return _post(http, url, message, dict(headers))


def _modern_facts(http: httpx.Client, url: str, modern: ModernOffer) -> TargetFacts:
    """A run of the modern era only: the tools, listed as a modern client lists them."""
    listed = _post_modern(http, url, 1, "tools/list", modern.versions[-1])
    tools = _contract_tools(url, listed)
    return TargetFacts(None, {}, tools, modern)


def _check_revision(url: str, revision: str) -> None:
    if revision in SUPPORTED_REVISIONS:
        return
    if revision >= SESSIONLESS_FROM:
        raise PreflightRefused(
            f"target {url} negotiated protocol revision {revision}: from {SESSIONLESS_FROM} on, MCP has no "
            "sessions and session resumption does not exist there, so this lab has nothing to check; "
            f"offer one of {', '.join(SUPPORTED_REVISIONS)}"
        )
    raise PreflightRefused(
        f"target {url} negotiated protocol revision {revision or '(none)'}, which this lab does not speak "
        f"(it speaks {', '.join(SUPPORTED_REVISIONS)})"
    )


def _post(
    http: httpx.Client, url: str, message: dict[str, Any], headers: dict[str, str], *, expect: bool = True
) -> dict[str, Any]:
    """POST one message; the JSON-RPC answer (from JSON or the SSE stream) with the
    session header under `_session`. `expect=False`: a notification, no answer wanted."""
    try:
        with http.stream("POST", url, json=message, headers=headers) as r:
            if not expect:
                return {}
            if r.status_code >= 400:
                body = r.read().decode("utf-8", "replace")[:200]
                raise PreflightRefused(f"target {url}: {message['method']} got HTTP {r.status_code}: {body}")
            answer = _answer(r, message.get("id"))
            answer["_session"] = r.headers.get(SESSION_HEADER)
            return answer
    except httpx.HTTPError as e:
        raise PreflightRefused(f"target {url}: {message['method']} failed: {type(e).__name__}: {e}") from None


def _answer(r: httpx.Response, mid: object) -> dict[str, Any]:
    """The JSON-RPC response to `mid` from a JSON body or an SSE stream."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        decoder = SseDecoder()
        for chunk in r.iter_bytes():
            for event in decoder.feed(chunk):
                found = _match(event.data, mid)
                if found is not None:
                    return found
        return {"error": "the stream ended without a response"}
    found = _match(r.read().decode("utf-8", "replace"), mid)
    return found if found is not None else {"error": "no JSON-RPC response in the body"}


def _match(text: str, mid: object) -> dict[str, Any] | None:
    try:
        obj = json.loads(text) if text else None
    except ValueError:
        return None
    if isinstance(obj, dict) and obj.get("id") == mid and ("result" in obj or "error" in obj):
        return obj
    return None


def _brief(answer: dict[str, Any]) -> str:
    text = json.dumps({k: v for k, v in answer.items() if k != "_session"})
    return text if len(text) <= 200 else text[:200] + "..."
