"""One proxy of the nemesis (trio): accept on 127.0.0.1, connect to the upstream, and pass
the bytes of each direction through the proxy's toxics.

Per connection ("link") and direction, a reader task stamps each chunk with the time it
was read and queues it; a writer task takes chunks one by one through the toxics of that
direction, in the order they were added, then writes them. Toxics are looked up per chunk,
so adding or removing one acts on live connections at once (as in Toxiproxy). Semantics
follow Toxiproxy's toxics (see `lab.nemesis.toxics` for the attributes):

- latency: a chunk leaves `latency ± jitter` after it was read (delays are pipelined, not
  added up chunk after chunk); several latency toxics add up.
- bandwidth: chunks are paced to `rate` KB/s, in pieces of at most 100 ms worth of data.
- slicer: a chunk is cut into slices of `average_size ± size_variation`, `delay` µs apart.
- limit_data: `bytes` pass (counted per connection and toxic), then the connection closes.
- timeout: data is dropped; the connection closes `timeout` ms after the toxic first
  applied to it (never, for 0). Removing the toxic closes every connection of the proxy,
  whether the toxic applied to it or not (as Toxiproxy does; a held byte stream has a hole).
- reset_peer: the first chunk after the toxic applies is dropped; `timeout` ms later the
  connection is reset (RST, SO_LINGER 0) towards the receiving side of that direction,
  even if the toxic was removed meanwhile (Toxiproxy's removal waits for the reset).
- slow_close: the end of the stream (EOF) is passed on `delay` ms late.
- idle_timeout (the lab's own, not Toxiproxy's): data passes unchanged; the connection
  is closed (FIN both ways) once the toxic's direction has carried no byte for `timeout`
  ms, counted from the last chunk, or from when the toxic first applied to the
  connection: a proxy's read timeout (nginx's `proxy_read_timeout`, 60 s by default) or
  a CDN's idle cut.
- buffer (the lab's own): bytes are held until `size` bytes are held, every response
  begun is complete (`lab.nemesis.framing`), `flush` ms have passed since the first held
  byte (0: no timed flush), the stream ends or the toxic is removed; then they go on at
  once, through the toxics after it. A proxy that buffers responses (nginx's
  `proxy_buffering`, on by default) passes a short answer whole and holds an SSE
  stream's events that way. A response head with `X-Accel-Buffering: no` (the header
  nginx honours) ends the buffering of its connection.
- header_hold (the lab's own): each response's head is held until the first byte of its
  body (`lab.nemesis.framing` finds where heads and bodies end), as some CDNs send the
  status and headers only with the first body byte; released at the end of the stream
  or when the toxic leaves.
- toxicity: rolled once per connection and toxic version (an update rolls again).

A sleep inside a toxic ends early when that toxic is removed, and the data goes on at
once ("never drop data on the floor", as Toxiproxy puts it); reset_peer's wait is the
exception, as in Toxiproxy. Unlike Toxiproxy, the end of
one direction is passed on as a half-close (FIN), and the connection closes when both
directions have ended.

A proxy's toxics are a `lab.nemesis.chain.ToxicChain`; each connection's toxic state is a
`lab.nemesis.link.Link`.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import re
import socket
import struct
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Final

import trio

from lab.nemesis.chain import ToxicChain, ToxicEntry
from lab.nemesis.framing import HeaderHold
from lab.nemesis.link import Link
from lab.nemesis.proxyspec import BIND_HOST, Address, ProxyConfig
from lab.nemesis.toxics import ToxicSpec

_READ_SIZE: Final = 16 * 1024  # with toxics: the unit a toxic acts on (latency stamps, slicing)
_QUEUE_CHUNKS: Final = 16  # per direction: at most 256 KiB waits inside the proxy
_BULK_SIZE: Final = 256 * 1024
"""Without toxics a direction copies through one reused buffer that grows to this size: the
cost of a pass is trio's scheduling, so fewer, larger passes carry more bytes per CPU second
(bench/bench_nemesis.py: 16 KiB passes reached about a third of a real Toxiproxy's MB/s)."""
_FIRST_SIZE: Final = 4 * 1024
"""...but it starts at this size and grows (x4) only when a read fills it: a buffer's pages
are all written when it is made, and an idle MCP connection (a standalone GET stream that
waits) held two 256 KiB buffers, 512 KiB of memory per connection, 3.3 GB at 6,000 clients."""
_CONNECT_TIMEOUT_S: Final = 5.0
_ACCEPT_ERROR_PAUSE_S: Final = 0.1
_PASSES_PER_CHECKPOINT: Final = 16
"""Passes the fast path makes without blocking before it lets the other tasks run."""
_IO_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

_BACK_TO_CLEAN: Final = (b"", -1.0)
"""Queued by a direction's reader when no toxic acts on it any more (compared by identity)."""
_END: Final = (b"", -2.0)
"""What `_receive_until` returns at the end of the stream (compared by identity)."""
_NO_BUFFERING: Final = re.compile(rb"(?:^|\n)x-accel-buffering:[ \t]*no\b")
"""The response header that turns a proxy's buffering off (matched on lowered bytes)."""

type _Onward = Callable[[bytes, float], Awaitable[bool]]
"""The continuation a toxic hands its output to (a piece, and when it left the toxic);
it answers False when the connection is over."""


class Proxy:
    """A proxy: its configuration, its toxics, and (while enabled) its listener and links."""

    def __init__(self, config: ProxyConfig, rng: random.Random) -> None:
        self.config = config
        self.toxics = ToxicChain()
        self._rng = rng
        self._scope: trio.CancelScope | None = None
        self._stopped: trio.Event | None = None
        self._links: set[Link] = set()
        self._numbers = itertools.count(1)

    @property
    def running(self) -> bool:
        return self._scope is not None

    def to_json(self, *, compat: bool = False) -> dict[str, object]:
        """The proxy as the API shows it (with its toxics). `compat` adds the empty
        `Logger` object that Toxiproxy 2.12 shows (its logger, marshalled by mistake)."""
        out: dict[str, object] = {
            "name": self.config.name,
            "listen": str(self.config.listen),
            "upstream": str(self.config.upstream),
            "enabled": self.config.enabled,
        }
        if compat:
            out["Logger"] = {}
        out["toxics"] = [e.spec.to_json() for e in self.toxics.listing()]
        return out

    async def start(self, nursery: trio.Nursery) -> None:
        """Bind the listen address (OSError if it cannot) and serve in `nursery`."""
        if self._scope is not None:
            return
        listeners = await trio.open_tcp_listeners(self.config.listen.port, host=BIND_HOST)
        listener = listeners[0]
        for extra in listeners[1:]:  # 127.0.0.1 gives one; never serve another address
            await extra.aclose()
        port = listener.socket.getsockname()[1]
        self.config = replace(self.config, listen=Address(BIND_HOST, port))
        await nursery.start(self._serve, listener)

    async def stop(self) -> None:
        """Stop listening and drop every connection; returns once all are closed."""
        scope, stopped = self._scope, self._stopped
        if scope is None or stopped is None:
            return
        scope.cancel()
        await stopped.wait()

    async def _serve(self, listener: trio.SocketListener, *, task_status: trio.TaskStatus[None]) -> None:
        stopped = trio.Event()
        self._stopped = stopped
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                async with listener, trio.open_nursery() as links:
                    task_status.started()
                    while True:  # until the proxy stops (its cancel scope)
                        try:
                            stream = await listener.accept()
                        except OSError:  # e.g. out of file descriptors: wait, do not spin
                            await trio.sleep(_ACCEPT_ERROR_PAUSE_S)
                            continue
                        links.start_soon(self._serve_link, stream)
        finally:
            self._scope = None
            stopped.set()

    async def _serve_link(self, client: trio.SocketStream) -> None:
        link = Link(next(self._numbers), self._rng)
        upstream: trio.SocketStream | None = None
        self._links.add(link)
        try:
            with trio.move_on_after(_CONNECT_TIMEOUT_S):
                upstream = await trio.open_tcp_stream(self.config.upstream.host, self.config.upstream.port)
            if upstream is None:
                return
            async with trio.open_nursery() as nursery:
                link.scope = nursery.cancel_scope
                nursery.start_soon(self._pump, link, "upstream", client, upstream)
                nursery.start_soon(self._pump, link, "downstream", upstream, client)
                nursery.start_soon(self._watch_timeouts, link)
        except OSError:
            pass  # the upstream refused: the client sees its connection closed, as with Toxiproxy
        except Exception:  # a bug in one connection must not take the nemesis down
            traceback.print_exc(file=sys.stderr)
        finally:
            self._links.discard(link)
            _close(client, reset=link.reset_side == "client")
            if upstream is not None:
                _close(upstream, reset=link.reset_side == "upstream")

    async def _pump(
        self, link: Link, direction: str, source: trio.SocketStream, sink: trio.SocketStream
    ) -> None:
        while True:  # clean, then through toxics, then clean again when they are gone, ...
            first = await self._copy_while_clean(link, direction, source, sink)
            if first is None:  # the sink broke
                ended = False
                break
            if first == b"":  # the end of the stream, with no toxic in the way
                ended = await self._end_stream(link, direction, sink)
                break
            # A toxic came: this chunk and the rest go through the toxics, until none acts
            # on this direction any more and what was read has left.
            link.toxic_spells[direction] = link.toxic_spells.get(direction, 0) + 1
            send, recv = trio.open_memory_channel[tuple[bytes, float]](_QUEUE_CHUNKS)
            send.send_nowait((first, trio.current_time()))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_read_chunks, source, send, lambda: self._toxic_on(link, direction))
                outcome = await self._write_chunks(link, direction, recv, sink)
                nursery.cancel_scope.cancel()
            if outcome is not None:
                ended = outcome
                break
        if ended:
            link.direction_ended(direction)
        else:
            link.finish(f"{direction} peer gone")

    def _toxic_on(self, link: Link, direction: str) -> bool:
        """Some toxic acts on this direction of this connection (its toxicity roll
        included: a toxic that does not apply to a connection leaves its bytes alone)."""
        return any(link.applies(e) for e in self.toxics.for_stream(direction))

    async def _copy_while_clean(
        self, link: Link, direction: str, source: trio.SocketStream, sink: trio.SocketStream
    ) -> bytes | None:
        """The fast path: while this direction has no toxic, copy through one buffer with
        no queue and no per-chunk work. Returns `b""` at the end of the stream (or when
        the source broke), the first chunk read once a toxic is present, None if the sink
        broke.

        It reads and writes the stdlib sockets under trio's (non-blocking) and waits on
        trio only when a call would block: trio's `recv_into` and `send_all` each pass
        through its scheduler twice per call even when the data is there, which made a
        small chunk (an SSE event) cost the nemesis about twice what toxiproxy-server
        spends on it (bench/bench_nemesis_events.py). A direction that never blocks still
        yields to the others every `_PASSES_PER_CHECKPOINT` passes."""
        raw_in, raw_out = _stdlib_socket(source), _stdlib_socket(sink)
        buffer = bytearray(_FIRST_SIZE)
        view = memoryview(buffer)
        passes = 0
        while True:  # until the stream ends, the sink breaks, or a toxic arrives
            try:
                n = raw_in.recv_into(buffer)
            except BlockingIOError:
                try:
                    await trio.lowlevel.wait_readable(raw_in)
                except _IO_ERRORS:
                    return b""
                passes = 0
                continue
            except OSError:
                return b""
            if not n:
                return b""
            if self.toxics.for_stream(direction) and self._toxic_on(link, direction):
                return bytes(view[:n])  # read before the toxic's time: its turn from here
            if not await _send_raw(raw_out, view[:n]):
                return None
            passes += 1
            if passes >= _PASSES_PER_CHECKPOINT:
                passes = 0
                await trio.lowlevel.checkpoint()
            if n == len(buffer) < _BULK_SIZE:  # bulk traffic: larger passes
                buffer = bytearray(min(4 * len(buffer), _BULK_SIZE))
                view = memoryview(buffer)

    async def _write_chunks(
        self,
        link: Link,
        direction: str,
        recv: trio.MemoryReceiveChannel[tuple[bytes, float]],
        sink: trio.SocketStream,
    ) -> bool | None:
        """Pass every chunk on, then the end of stream; False if the sink broke; None when
        the reader found no toxic acting any more (everything it read has been written:
        the fast path takes over). While a buffer toxic holds bytes, the wait for the next
        chunk also ends when its flush is due or the toxics change."""
        async with recv:
            while True:  # until the source ends
                held = link.buffers.get(direction)
                if held:
                    item = await self._receive_until(recv, self._flush_due(link, held))
                    if item is None:  # a flush is due, or a buffer may have left
                        if not await self._flush(link, direction, sink, due_only=True):
                            return False
                        continue
                else:
                    try:
                        item = await recv.receive()
                    except trio.EndOfChannel:
                        item = _END
                if item is _END:
                    break
                if item is _BACK_TO_CLEAN:
                    return None if await self._flush(link, direction, sink) else False
                data, read_at = item
                chain = [e for e in self.toxics.for_stream(direction) if link.applies(e)]
                if not await self._through(link, direction, chain, 0, data, read_at, sink):
                    return False
                link.last_data[direction] = trio.current_time()
        if not await self._flush(link, direction, sink):
            return False
        return await self._end_stream(link, direction, sink)

    async def _receive_until(
        self, recv: trio.MemoryReceiveChannel[tuple[bytes, float]], deadline: float
    ) -> tuple[bytes, float] | None:
        """The next chunk (`_END` at the end of the stream), or None once `deadline` has
        come or the toxics changed first (a receive that is cancelled loses nothing)."""
        got: list[tuple[bytes, float]] = []
        changed = self.toxics.changed_event()
        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = deadline

            async def receive() -> None:
                try:
                    got.append(await recv.receive())
                except trio.EndOfChannel:
                    got.append(_END)
                nursery.cancel_scope.cancel()

            async def wake() -> None:
                await changed.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(receive)
            nursery.start_soon(wake)
        return got[0] if got else None

    @staticmethod
    def _flush_due(link: Link, held: dict[int, ToxicEntry]) -> float:
        """When the first of these buffers must let its bytes go (trio clock)."""
        return min((link.state_for(entry).flush_at(entry.spec) for entry in held.values()), default=math.inf)

    async def _flush(
        self, link: Link, direction: str, sink: trio.SocketStream, *, due_only: bool = False
    ) -> bool:
        """Let the held bytes of this direction's buffers go on (only the ones whose flush is
        due, and the ones whose toxic has left, with `due_only`), through the toxics after
        each buffer; a buffer that left passes them straight on. False if the sink broke."""
        held = link.buffers.get(direction) or {}
        now = trio.current_time()
        for added_id, entry in list(held.items()):
            state = link.state_for(entry)
            current = self.toxics.get(entry.spec.name)
            if current is not None and current.added_id != entry.added_id:
                current = None  # another toxic of that name: this one has left
            if due_only and current is not None and now < state.flush_at(current.spec):
                continue
            del held[added_id]
            if entry.spec.kind == "header_hold":
                piece = state.framing.release() if state.framing is not None else b""
            else:
                piece = state.take_held()
            if not piece:
                continue
            chain = [e for e in self.toxics.for_stream(direction) if link.applies(e)]
            index = next((i for i, e in enumerate(chain) if e.added_id == added_id), None)
            if index is None:
                ok = await self._through(link, direction, [], 0, piece, now, sink)
            else:
                ok = await self._through(link, direction, chain, index + 1, piece, now, sink)
            if not ok:
                return False
        return True

    async def _end_stream(self, link: Link, direction: str, sink: trio.SocketStream) -> bool:
        """Pass the end of the stream on (after slow_close's delay); False if the sink broke."""
        for entry in self.toxics.for_stream(direction):
            if entry.spec.kind == "slow_close" and link.applies(entry):
                await self._sleep_while_present(
                    entry, trio.current_time() + entry.spec.attribute("delay") / 1000
                )
        try:
            await sink.send_eof()
        except _IO_ERRORS:
            return False
        return True

    async def _through(
        self,
        link: Link,
        direction: str,
        chain: list[ToxicEntry],
        index: int,
        data: bytes,
        read_at: float,
        sink: trio.SocketStream,
    ) -> bool:
        """Take `data` through toxics `chain[index:]`, then write it; False ends the pump."""
        if index == len(chain):
            try:
                await sink.send_all(data)
            except _IO_ERRORS:
                return False
            return True
        entry = chain[index]
        spec = entry.spec

        async def onward(piece: bytes, at: float) -> bool:
            return await self._through(link, direction, chain, index + 1, piece, at, sink)

        if spec.kind == "latency":
            await self._sleep_while_present(entry, read_at + self._latency_s(spec))
            return await onward(data, trio.current_time())
        if spec.kind == "bandwidth":
            return await self._pace(link, entry, data, onward)
        if spec.kind == "slicer":
            return await self._slice(entry, data, read_at, onward)
        if spec.kind == "limit_data":
            state = link.state_for(entry)
            limit = spec.attribute("bytes")
            piece = data[: max(0, limit - state.sent)]
            if piece:
                if not await onward(piece, read_at):
                    return False
                state.sent += len(piece)
            if state.sent >= limit:
                link.finish("limit_data")
                return False
            return True
        if spec.kind == "timeout":
            return True  # dropped; `_watch_timeouts` closes the connection when it is time
        if spec.kind == "buffer":
            return await self._hold(link, direction, entry, data, read_at, onward)
        if spec.kind == "header_hold":
            state = link.state_for(entry)
            if state.framing is None:
                state.framing = HeaderHold()
            piece = state.framing.feed(data)
            held = link.buffers.setdefault(direction, {})
            if state.framing.holding:
                held[entry.added_id] = entry  # released at the end of the stream or on removal
            else:
                held.pop(entry.added_id, None)
            return await onward(piece, read_at) if piece else True
        if spec.kind == "reset_peer":
            state = link.state_for(entry)
            if state.triggered:
                return True
            state.triggered = True  # this chunk is dropped; the reset follows
            # Once triggered, the reset happens at its time even if the toxic is removed or
            # updated meanwhile, as with Toxiproxy (whose removal waits for it). Going on
            # instead would deliver the stream with this chunk missing: a corruption no
            # real proxy makes.
            await trio.sleep_until(trio.current_time() + spec.attribute("timeout") / 1000)
            link.finish("reset_peer", "client" if direction == "downstream" else "upstream")
            return False
        return await onward(data, read_at)  # slow_close acts at the end of the stream

    async def _hold(
        self, link: Link, direction: str, entry: ToxicEntry, data: bytes, read_at: float, onward: _Onward
    ) -> bool:
        """A buffer toxic: hold `data` with what it holds already, and let it all go on once
        `size` bytes are held, every response begun is complete, or the server said
        `X-Accel-Buffering: no` (the timed flush and the end of the stream:
        `_write_chunks`)."""
        state = link.state_for(entry)
        if state.unbuffered:
            return await onward(data, read_at)
        if state.framing is None:
            state.framing = HeaderHold(hold_heads=False)
        state.framing.feed(data)  # (only to know where responses end)
        if not state.held:
            state.held_since = read_at
            link.buffers.setdefault(direction, {})[entry.added_id] = entry
        state.held += data
        window = bytes(state.held[-(len(data) + 40) :]).lower()  # a header cut across two chunks too
        state.unbuffered = _NO_BUFFERING.search(window) is not None
        complete = state.framing.between_responses
        if not state.unbuffered and not complete and len(state.held) < entry.spec.attribute("size"):
            return True
        link.buffers.get(direction, {}).pop(entry.added_id, None)
        return await onward(state.take_held(), trio.current_time())

    def _latency_s(self, spec: ToxicSpec) -> float:
        # Negative values (compat mode only) act as Toxiproxy's: no jitter, no delay.
        jitter = spec.attribute("jitter")
        delay_ms = spec.attribute("latency") + (self._rng.randint(-jitter, jitter) if jitter > 0 else 0)
        return max(0, delay_ms) / 1000

    async def _pace(self, link: Link, entry: ToxicEntry, data: bytes, onward: _Onward) -> bool:
        state = link.state_for(entry)
        rate = entry.spec.attribute("rate") * 1000  # bytes per second
        if rate <= 0:  # compat mode only: Toxiproxy spins (0) or panics (< 0); here no cap
            return await onward(data, trio.current_time())
        step = max(1, rate // 10)  # at most 100 ms worth of data per write keeps the rate smooth
        for offset in range(0, len(data), step):
            piece = data[offset : offset + step]
            state.paced_until = max(trio.current_time(), state.paced_until) + len(piece) / rate
            if not await self._sleep_while_present(entry, state.paced_until):
                return await onward(data[offset:], trio.current_time())  # removed: the rest goes now
            if not await onward(piece, trio.current_time()):
                return False
        return True

    async def _slice(self, entry: ToxicEntry, data: bytes, read_at: float, onward: _Onward) -> bool:
        delay_s = entry.spec.attribute("delay") / 1_000_000
        bounds = list(_slice_bounds(len(data), entry.spec, self._rng))
        for i, (start, end) in enumerate(bounds):
            if not await onward(data[start:end], read_at):
                return False
            last = i + 1 == len(bounds)
            if not last and not await self._sleep_while_present(entry, trio.current_time() + delay_s):
                return await onward(data[end:], read_at)  # removed: the rest goes now
        return True

    async def _sleep_while_present(self, entry: ToxicEntry, until: float) -> bool:
        """Sleep until `until` (trio clock); False as soon as the toxic leaves the chain."""
        while True:  # bounded: each pass waits for a change, and the wait ends at `until`
            if not self.toxics.is_current(entry):
                return False
            if trio.current_time() >= until:
                return True
            changed = self.toxics.changed_event()
            with trio.move_on_at(until):
                await changed.wait()

    def remove_toxic(self, name: str) -> ToxicEntry:
        """Take a toxic out of the chain (KeyError if absent). Removing a `timeout` toxic
        closes every connection of the proxy, whether or not the toxic applied to it
        (Toxiproxy's timeout toxic closes its stub on cleanup, and every connection has a
        stub of every toxic, whatever its toxicity roll said)."""
        entry = self.toxics.remove(name)
        if entry.spec.kind == "timeout":
            for link in list(self._links):
                if link.scope is not None:  # its pumps run: the toxic was in its path
                    link.finish("timeout toxic removed")
        return entry

    async def _watch_timeouts(self, link: Link) -> None:
        """Close the connection when a timeout toxic that applies to it has run its time,
        or when an idle_timeout's direction has been silent for its time."""
        since: dict[int, float] = {}  # added_id -> when the toxic first applied to this link
        while True:  # until the connection ends (its cancel scope)
            now = trio.current_time()
            present = {e.added_id: e for e in self.toxics.entries() if e.spec.kind in _TIMED}
            for gone in [added_id for added_id in since if added_id not in present]:
                del since[gone]
            deadline, reason = math.inf, ""
            for added_id, entry in present.items():
                if not link.applies(entry):
                    since.pop(added_id, None)
                    continue
                start = since.setdefault(added_id, now)
                if entry.spec.kind == "idle_timeout":  # silence since the last chunk
                    start = max(start, link.last_data.get(entry.spec.stream, -math.inf))
                if entry.spec.attribute("timeout") > 0:
                    at = start + entry.spec.attribute("timeout") / 1000
                    if at < deadline:
                        deadline, reason = at, entry.spec.kind
            if now >= deadline:
                link.finish(reason)
                return
            changed = self.toxics.changed_event()
            with trio.move_on_at(deadline):  # an idle_timeout's data moves it: looked at again then
                await changed.wait()


_TIMED: Final = frozenset({"timeout", "idle_timeout"})
"""The toxics `_watch_timeouts` ends connections for."""


async def _read_chunks(
    source: trio.SocketStream,
    send: trio.MemorySendChannel[tuple[bytes, float]],
    toxic_on: Callable[[], bool],
) -> None:
    """Queue what the source sends, stamped with the time it was read; closing `send`
    tells the writer the stream ended (EOF, or the source broke: both end the direction).
    Before each read, once no toxic acts on the direction any more, it queues
    `_BACK_TO_CLEAN` instead and stops: the writer passes on what is queued, then the
    fast path reads on. (A connection kept alive across a latency window used to stay on
    this queued path for the rest of its life: two tasks and a channel per chunk.)"""
    async with send:
        while True:  # until EOF, an error on the source, or no toxic acting
            if not toxic_on():
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await send.send(_BACK_TO_CLEAN)
                return
            try:
                data = await source.receive_some(_READ_SIZE)
            except _IO_ERRORS:
                return
            if not data:
                return
            try:
                await send.send((data, trio.current_time()))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the writer has stopped: the connection is ending


def _stdlib_socket(stream: trio.SocketStream) -> socket.socket:
    """The non-blocking stdlib socket under a trio stream (trio keeps it as `_sock`)."""
    raw = getattr(stream.socket, "_sock", None)
    if not isinstance(raw, socket.socket):
        raise TypeError(f"no stdlib socket under {stream.socket!r}")
    return raw


async def _send_raw(sock: socket.socket, data: memoryview) -> bool:
    """Write all of `data`, waiting on trio only while the socket's buffer is full; False
    if the peer is gone (or the socket was closed meanwhile)."""
    while data:
        try:
            sent = sock.send(data)
        except BlockingIOError:
            try:
                await trio.lowlevel.wait_writable(sock)
            except _IO_ERRORS:
                return False
            continue
        except OSError:
            return False
        data = data[sent:]
    return True


def _slice_bounds(size: int, spec: ToxicSpec, rng: random.Random) -> Iterator[tuple[int, int]]:
    # Compat mode may bring average_size <= 0 or variation >= average: every slice still
    # carries at least one byte.
    average, variation = spec.attribute("average_size"), max(0, spec.attribute("size_variation"))
    start = 0
    while start < size:  # each slice is at least 1 byte long
        length = max(1, average + (rng.randint(-variation, variation) if variation else 0))
        end = min(size, start + length)
        yield start, end
        start = end


def _close(stream: trio.SocketStream, *, reset: bool) -> None:
    """Close now (no checkpoint, so it also works in a cancelled scope); with `reset`, the
    peer gets RST instead of FIN (SO_LINGER with a zero timeout)."""
    if reset:
        with contextlib.suppress(OSError):
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()
