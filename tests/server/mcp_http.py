"""A small, deliberately literal HTTP client for testing the reference server's rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from lab.wire import jsonrpc
from lab.wire.sse import SseDecoder, SseEvent

V = "2025-11-25"
POST_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


@dataclass
class Mcp:
    url: str
    token: str | None = None
    version: str = V
    origin: str | None = None
    sid: str | None = None
    next_id: int = 1
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10.0))

    def headers(self, extra: dict[str, str] | None = None, *, session: bool = True) -> dict[str, str]:
        h: dict[str, str] = {}
        if self.token is not None:
            h["authorization"] = f"Bearer {self.token}"
        if self.origin is not None:
            h["origin"] = self.origin
        if session and self.sid is not None:
            h["mcp-session-id"] = self.sid
            h["mcp-protocol-version"] = self.version
        h.update(extra or {})
        return h

    def initialize(self, version: str | None = None) -> httpx.Response:
        body = jsonrpc.request(
            self.take_id(),
            "initialize",
            {
                "protocolVersion": version or self.version,
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        )
        r = self.client.post(
            self.url, content=json.dumps(body), headers=self.headers(POST_HEADERS, session=False)
        )
        if r.status_code == 200:
            self.sid = r.headers["mcp-session-id"]
            self.version = r.json()["result"]["protocolVersion"]
            self.post_raw(jsonrpc.notification("notifications/initialized"))
        return r

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def post_raw(self, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
        return self.client.post(
            self.url, content=json.dumps(body), headers=self.headers({**POST_HEADERS, **(headers or {})})
        )

    def call(
        self, tool: str, args: dict[str, Any] | None = None, *, key: str | None = None, rid: int | None = None
    ) -> tuple[httpx.Response, list[SseEvent]]:
        rid = self.take_id() if rid is None else rid
        meta: dict[str, Any] = {"progressToken": f"pt-{rid}"}
        if key is not None:
            meta["mcp-lab/idempotency-key"] = key
        body = jsonrpc.request(rid, "tools/call", {"name": tool, "arguments": args or {}, "_meta": meta})
        r = self.post_raw(body)
        return r, SseDecoder().feed(r.content) if r.status_code == 200 else []

    @contextmanager
    def stream(
        self, method: str, body: object | None = None, headers: dict[str, str] | None = None
    ) -> Iterator[tuple[httpx.Response, Iterator[SseEvent]]]:
        h = self.headers(
            {**(POST_HEADERS if method == "POST" else {"accept": "text/event-stream"}), **(headers or {})}
        )
        content = None if body is None else json.dumps(body)
        with self.client.stream(method, self.url, content=content, headers=h) as r:

            def events() -> Iterator[SseEvent]:
                dec = SseDecoder()
                for chunk in r.iter_raw():
                    yield from dec.feed(chunk)

            yield r, events()

    def close(self) -> None:
        self.client.close()


def messages(events: list[SseEvent]) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in events if e.data]
