"""What `lab run` tells the Locust processes (master and workers): the load settings.

`lab run` writes them as JSON to `<run>/locust-settings.json` and passes the path in the
environment variable `LAB_LOCUST_SETTINGS`; the per-run HMAC key travels separately in
`LAB_LEDGER_KEY` (hex) and is never written to disk. Without them (the locustfile run by
hand: `locust -f lab/load/locustfile.py --host http://127.0.0.1:8000/mcp`) the defaults
apply and a random key is made for the process. Pure data: no Locust import here.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from lab.wire.revisions import MODERN_REVISIONS, era_of_client

SETTINGS_ENV = "LAB_LOCUST_SETTINGS"
SETTINGS_WAIT_S = 120.0
"""How long a Locust process waits for `lab run` to write its settings (the chain's start,
each part of which may take 30 s on a busy box)."""
KEY_ENV = "LAB_LEDGER_KEY"
DEFAULT_URL = "http://127.0.0.1:8000/mcp"
"""`lab serve`'s default address."""
DEFAULT_RUN_DIR = "results/locust"


@dataclass(frozen=True)
class ToolMix:
    """Relative weights of the user's tasks (0 disables a task)."""

    read: int = 3
    stream: int = 2
    write: int = 2
    churn: int = 0
    """Leave (DELETE the session) and come back as a new client: sessions come and go."""


TOOL_OF_OP: Final = {"read": "echo", "stream": "ticker", "write": "ledger.append"}
SCRIPT_OPS: Final = tuple(TOOL_OF_OP)
"""What a scripted client (`[[load.clients]]`) may do, one call each, as the task mix's
tasks do: `read` the read-only `echo`, `stream` the streaming `ticker`, `write` the
`ledger.append` with an idempotency key (`McpClient.perform`, lab/load/user.py)."""


@dataclass(frozen=True, slots=True)
class ClientScript:
    """One scripted client of a scenario's `[[load.clients]]` (docs/scenarios.md).

    The client uses `id` as its client ID, connects at its first `at` (at 0 without
    ops), starts `ops[i]` at `at[i]` seconds after the load's start or right after
    `ops[i - 1]` finished, whichever is later, then leaves (DELETE) and does nothing more."""

    id: str
    ops: tuple[str, ...] = ()
    at: tuple[float, ...] = ()
    """Seconds since the load's start, one per op, non-decreasing."""

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> ClientScript:
        return ClientScript(
            id=str(raw["id"]),
            ops=tuple(str(op) for op in raw.get("ops", ())),
            at=tuple(float(t) for t in raw.get("at", ())),
        )


class ScriptCursor:
    """Where a scripted client is in its script: before its handshake, before op i, or
    (every op done) leaving. Pure: a `ScriptedUser` (lab/load/scripted.py) steps through it."""

    __slots__ = ("connected", "ops_done", "script")

    def __init__(self, script: ClientScript) -> None:
        self.script = script
        self.connected = False
        self.ops_done = 0

    def next_step(self) -> str:
        """`connect`, the next op (`read`, `stream`, `write`) or `leave`."""
        if not self.connected:
            return "connect"
        if self.ops_done < len(self.script.ops):
            return self.script.ops[self.ops_done]
        return "leave"

    def due(self) -> float:
        """Seconds since the load's start from which the next step may begin: the
        handshake at the first op's time (0 without ops), each op at its own, leaving at
        once (0: any time is past it)."""
        s = self.script
        if not self.connected:
            return s.at[0] if s.at else 0.0
        if self.ops_done < len(s.ops):
            return s.at[self.ops_done]
        return 0.0

    def advance(self) -> None:
        """The next step has begun (it is never repeated, even when it fails)."""
        if not self.connected:
            self.connected = True
        elif self.ops_done < len(self.script.ops):
            self.ops_done += 1


READ_TIMEOUT_S: Final = 20.0
"""The lab's client's read timeout unless a scenario says otherwise (`reconnect.read_timeout`):
the sync driver's own default too (lab.drivers.base.READ_IDLE_TIMEOUT, kept apart so that
reading settings does not import the client)."""


@dataclass(frozen=True)
class LoadSettings:
    url: str
    """Where clients connect: the front of the fault chain (nemesis proxy or mitmdump)."""
    run_dir: str
    protocol_version: str = "2025-11-25"
    era: str = "handshake"
    """handshake, modern or both (`client_revision` chooses each client's revision)."""
    origin: str | None = "http://127.0.0.1"
    tokens: tuple[tuple[str, str], ...] = ()
    """(token, subject) pairs; each client takes one by `token_for` (from the seed and its
    client ID). Empty: no authentication."""
    mix: ToolMix = field(default_factory=ToolMix)
    ticker: dict[str, Any] = field(default_factory=lambda: {"count": 5, "interval_ms": 100})
    wait_min: float = 0.5
    wait_max: float = 2.0
    reconnect_qps: float = 100.0
    """The global reconnect budget, split across workers by the master."""
    reconnect_burst: float = 1.0
    """Token-bucket depth of each worker's share (the per-second cap holds regardless)."""
    backoff_base: float = 0.25
    backoff_cap: float = 10.0
    max_attempts: int = 12
    read_timeout: float = READ_TIMEOUT_S
    """Seconds without a byte before a connection counts as lost (the driver's read
    timeout)."""
    resume_silence: float = 10.0
    """Seconds a resumed call stream may stay without a message before it counts as lost."""
    stream_idle: float = 30.0
    """Seconds a call stream may carry no message (keep-alives only) before it counts as lost."""
    call_timeout: float = 30.0
    write_retries: int = 3
    """How often a user re-runs a write whose outcome was UNKNOWN (same idempotency key)."""
    open_standalone_stream: bool = True
    seed: int = 0
    workers: int = 1
    """Worker processes expected: each starts with its share of the budget until the
    master's split arrives."""
    client: str = "lab"
    """Who the users are: `lab` (the lab's own client core) or a client under test behind
    an adapter (`python-sdk`, `typescript-sdk`, `cmd:<command>`; lab/load/sut_user.py)."""
    stages: tuple[tuple[float, int, float], ...] = ()
    """The load shape: (until seconds, users, spawn rate) — reach `users` by `until`.
    Empty: Locust's -u/-r/-t decide."""
    plan_file: str = ""
    """The fault plan the proxy's addon reads: the master sets its clock when the load
    starts (lab.load.clock). Empty: no plan to set (compose, by hand)."""
    clients: tuple[ClientScript, ...] = ()
    """The scenario's scripted clients (`[[load.clients]]`), in file order: the users are
    then `ScriptedUser`s, each playing the next script not yet taken (one worker only).
    Empty: the task mix (`LabUser`)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> LoadSettings:
        raw = json.loads(text)
        raw["mix"] = ToolMix(**raw.get("mix", {}))
        raw["tokens"] = tuple(tuple(t) for t in raw.get("tokens", ()))
        raw["stages"] = tuple(tuple(t) for t in raw.get("stages", ()))
        raw["clients"] = tuple(ClientScript.from_dict(c) for c in raw.get("clients", ()))
        return LoadSettings(**raw)

    @staticmethod
    def from_env(wait_s: float = SETTINGS_WAIT_S) -> LoadSettings:
        """The settings `lab run` wrote; the defaults when its variable is not set.

        `lab run` starts Locust while the chain is still starting (Locust's imports take
        about a second, as long as the proxy's), and writes the file, whole, once the
        chain is up: it is waited for, up to `wait_s`."""
        path = os.environ.get(SETTINGS_ENV)
        if not path:
            return LoadSettings(url=DEFAULT_URL, run_dir=DEFAULT_RUN_DIR)
        file = Path(path)
        deadline = time.monotonic() + wait_s
        while not file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            return LoadSettings.from_json(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError) as e:
            raise RuntimeError(f"{SETTINGS_ENV}={path}: cannot read the load settings: {e}") from e

    @property
    def by_hand(self) -> bool:
        """Run without `lab run` (no settings file): the defaults, Locust's --host."""
        return not os.environ.get(SETTINGS_ENV)


def ledger_key() -> bytes:
    """The run's pseudonym key from `lab run`; a random one for a process run by hand
    (its pseudonyms then match no other process: nothing joins them without `lab run`)."""
    key = os.environ.get(KEY_ENV, "")
    if not key:
        # (logging imported here: the scenario loader reads this module, and must not
        # start threading's machinery, tests/faults/test_hygiene.py)
        import logging

        logging.getLogger(__name__).warning(
            "%s is not set: pseudonyms use a random key of this process only", KEY_ENV
        )
        return secrets.token_bytes(32)
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raw = b""
    if len(raw) < 16:
        raise RuntimeError(f"{KEY_ENV} must be hex of at least 16 bytes")
    return raw


RUN_TAG_PERSON: Final = b"mcp-lab/writes"


def run_tag(key: bytes) -> str:
    """The run's own tag, from its ledger key (random per run, shared by its workers): 8 hex
    digits in every idempotency key a run's clients send (the lab's `<client>/<tag>/k<n>`,
    a client under test's call ID `<client>/<tag>/c<n>`). Client IDs repeat from run to run
    (`w0-u1`...), and a server that outlives a run (`--target URL`, `lab replay`) would
    answer the next run's writes with the last run's receipts: no write would happen."""
    return hashlib.blake2b(key, digest_size=4, person=RUN_TAG_PERSON).hexdigest()


def script_counters(scripts: int) -> dict[str, int]:
    """The progress counters of a worker that plays `scripts` scripted clients (summed into
    progress.json): how many there are, how many a user took, how many wait for their next
    `at` (not a stall) and how many were played to the end (the run then ends:
    lab.run.watch, end reason `scripts_done`). Both kinds of scripted users keep them
    (lab/load/scripted.py)."""
    return {"scripted": scripts, "scripted_started": 0, "scripted_idle": 0, "scripted_done": 0}


def stable_index(seed: int, name: str, n: int) -> int:
    """A choice among `n` made from the scenario seed and a name only: a SHA-256 digest,
    the same in every process and every run with that seed (unlike `hash()`, which
    PYTHONHASHSEED changes from process to process)."""
    if n < 1:
        raise ValueError("a choice among no items")
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def client_revision(settings: LoadSettings, client_id: str) -> str:
    """The revision a client speaks: the handshake era's `protocol_version`, the modern
    era's newest revision, or (era `both`) one of the two by its ID (`era_of_client`)."""
    era = settings.era if settings.era != "both" else era_of_client(client_id)
    return MODERN_REVISIONS[-1] if era == "modern" else settings.protocol_version


def token_for(settings: LoadSettings, client_id: str) -> tuple[str | None, str | None]:
    """The (token, subject) a client uses: chosen by `stable_index` from the seed and its ID."""
    if not settings.tokens:
        return None, None
    token, subject = settings.tokens[stable_index(settings.seed, f"token/{client_id}", len(settings.tokens))]
    return token, subject


class SeededOnFirstDraw:
    """`random.Random(seed)`, made when it is first drawn from: the same draws, without the
    generator's 2.5 KiB of state in every client that never draws (only reconnects do:
    backoff and the budget's jitter), of which a Locust worker holds thousands."""

    __slots__ = ("_rng", "_seed")

    def __init__(self, seed: str) -> None:
        self._seed = seed
        self._rng: random.Random | None = None

    def random(self) -> float:
        if self._rng is None:
            self._rng = random.Random(self._seed)
        return self._rng.random()


def rng_for(settings: LoadSettings, client_id: str) -> SeededOnFirstDraw:
    """A client's jitter: seeded by the run's seed and its ID, so a run replays."""
    return SeededOnFirstDraw(f"{settings.seed}/{client_id}")


def split_budget(total: float, workers: list[str]) -> dict[str, float]:
    """Split a global reconnect budget (attempts/s) across workers.

    Whole-number shares that add up to floor(total), the remainder going to the first
    workers (in sorted order), because each worker caps its attempts per calendar second
    at floor(share): whole shares make the caps add up to the global budget exactly. With
    fewer whole units than workers, the last workers get 0 (no reconnects at all);
    `lab run` refuses such a scenario up front.
    """
    if not workers:
        return {}
    ordered = sorted(workers)
    base, extra = divmod(int(total), len(ordered))
    return {w: float(base + (1 if i < extra else 0)) for i, w in enumerate(ordered)}
