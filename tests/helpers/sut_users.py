"""The Locust users of a client under test, in a process of their own (Locust
monkey-patches the whole process for gevent): tests/sut/test_sut_user.py runs

    python -m tests.helpers.sut_users

With a stand-in for the worker's adapter hub that records the commands sent, it checks
that every call ID (also the call's idempotency key) carries the run's own tag, and that a
scripted client under test plays its script under its own ID, leaves once and stops
itself. Prints one line per check, `ok <name>` or `FAILED <name>` with the traceback;
exits 1 if any failed.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import hashlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any, cast  # noqa: E402

from gevent.event import AsyncResult  # noqa: E402
from locust.env import Environment  # noqa: E402
from locust.exception import StopUser  # noqa: E402

from lab.load.clock import ScriptBook  # noqa: E402
from lab.load.scripted import ScriptedSutUser  # noqa: E402
from lab.load.settings import ClientScript, LoadSettings, run_tag, script_counters  # noqa: E402
from lab.load.sut_user import HUB, AdapterHub, SutUser, call_id  # noqa: E402
from lab.sut.protocol import Call, Leave, Start  # noqa: E402

KEY = bytes.fromhex("ab" * 32)


class FakeHub:
    """What a user asks of `AdapterHub`, answered at once: every start started, every call ok."""

    def __init__(self, scripts: tuple[ClientScript, ...] = ()) -> None:
        self.settings = LoadSettings(url="http://127.0.0.1:1/mcp", run_dir="r", clients=scripts)
        self.run_tag = run_tag(KEY)
        self.sent: list[Start | Call | Leave] = []
        self.ended: set[str] = set()
        self.counters: dict[str, int] = {"users": 0, "calls_ok": 0, "calls_failed": 0, "calls_unknown": 0}
        self.counters.update(script_counters(len(scripts)) if scripts else {})
        self.zero = time.time() - 60.0  # every script's times are past
        self.scripts = ScriptBook(scripts, lambda _now: self.zero)
        self._n = 0

    def up(self, timeout: float = 0.0) -> bool:
        return True

    def next_client_id(self) -> str:
        self._n += 1
        return f"w0-u{self._n}"

    def expect(self, kind: str, ident: str) -> AsyncResult:
        return AsyncResult()

    def send(self, cmd: Start | Call | Leave) -> None:
        self.sent.append(cmd)

    def wait(self, kind: str, ident: str, result: AsyncResult, timeout: float) -> dict[str, Any]:
        answers: dict[str, dict[str, Any]] = {
            "start": {"ev": "started", "elapsed_s": 0.01},
            "left": {"ev": "left"},
        }
        return answers.get(kind, {"ev": "outcome", "status": "ok", "elapsed_s": 0.01})


def new_hub() -> FakeHub:
    fake = FakeHub((ClientScript("w0-u7", ("read", "stream", "write"), (0.5, 0.75, 1.0)),))
    HUB.clear()
    HUB.append(cast(AdapterHub, fake))
    return fake


def raises_stop(step: Callable[[], None]) -> None:
    try:
        step()
    except StopUser:
        return
    raise AssertionError("the user did not stop itself (StopUser)")


class OneUser(SutUser):
    abstract = True


def check_every_call_id_carries_the_runs_own_tag(hub: FakeHub) -> None:
    tag = hashlib.blake2b(KEY, digest_size=4, person=b"mcp-lab/writes").hexdigest()
    assert run_tag(KEY) == tag and run_tag(bytes(32)) != tag  # the lab's own write keys use it too
    assert call_id("w0-u3", tag, 7) == f"w0-u3/{tag}/c7"
    user = OneUser(Environment())
    user.begin()
    for op in ("read", "stream", "write"):
        user.perform(op)
    calls = [c for c in hub.sent if isinstance(c, Call)]
    assert [(c.tool, c.call) for c in calls] == [
        ("echo", f"w0-u1/{tag}/c1"),
        ("ticker", f"w0-u1/{tag}/c2"),
        ("ledger.append", f"w0-u1/{tag}/c3"),
    ]
    # The call ID is the idempotency key: the checker joins the tap's key to the app log's call.
    assert all(c.idempotency_key == c.call for c in calls)


def check_a_scripted_client_under_test_plays_its_script_under_its_id_and_leaves_once(hub: FakeHub) -> None:
    user = ScriptedSutUser(Environment())
    user.on_start()
    assert hub.counters["scripted_started"] == 1 and user.wait_time() == 0.0  # every step is due
    for _ in range(4):  # connect, read, stream, write
        user.step()
    raises_stop(user.step)  # leave: then the user stops itself
    user.on_stop()  # Locust's on_stop: no second leave
    kinds = [type(c).__name__ for c in hub.sent]
    assert kinds == ["Start", "Call", "Call", "Call", "Leave"]
    assert {getattr(c, "client", None) for c in hub.sent} == {"w0-u7"}  # the script's ID, verbatim
    assert [c.tool for c in hub.sent if isinstance(c, Call)] == ["echo", "ticker", "ledger.append"]
    assert (hub.counters["scripted_done"], hub.counters["scripted_idle"], hub.counters["users"]) == (1, 0, 0)


def check_a_scripted_client_waits_for_its_time_and_counts_as_idle(hub: FakeHub) -> None:
    hub.zero = time.time()  # the load starts now: the first step is 0.5 s away
    user = ScriptedSutUser(Environment())
    user.on_start()
    user.step()  # not due: nothing sent
    assert hub.sent == [] and 0.3 < user.wait_time() <= 0.5 and hub.counters["scripted_idle"] == 1
    user.on_stop()  # stopped while it waits: no longer idle, and nothing to leave
    assert hub.counters["scripted_idle"] == 0 and hub.sent == []


def check_a_lost_scripted_client_is_not_replaced_under_another_id(hub: FakeHub) -> None:
    user = ScriptedSutUser(Environment())
    user.on_start()
    user.step()  # connect
    hub.ended.add("w0-u7")  # the implementation lost it (client_failed)
    user.step()  # read: nothing to send it to
    assert [type(c).__name__ for c in hub.sent] == ["Start"] and hub.counters["calls_failed"] == 1


def check_a_spare_scripted_user_stops_at_once(hub: FakeHub) -> None:
    hub.scripts = ScriptBook((), lambda _now: hub.zero)
    user = ScriptedSutUser(Environment())
    user.on_start()
    raises_stop(user.step)
    user.on_stop()
    assert hub.sent == [] and hub.counters["scripted_started"] == 0


CHECKS: list[Callable[[FakeHub], None]] = [
    check_every_call_id_carries_the_runs_own_tag,
    check_a_scripted_client_under_test_plays_its_script_under_its_id_and_leaves_once,
    check_a_scripted_client_waits_for_its_time_and_counts_as_idle,
    check_a_lost_scripted_client_is_not_replaced_under_another_id,
    check_a_spare_scripted_user_stops_at_once,
]


def main() -> int:
    failed = 0
    for check in CHECKS:
        try:
            check(new_hub())
            print(f"ok {check.__name__}", flush=True)
        except Exception:
            failed += 1
            print(f"FAILED {check.__name__}\n{traceback.format_exc()}", flush=True)
        finally:
            HUB.clear()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
