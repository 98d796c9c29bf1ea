"""The balancer's routing rules (lab.faults.balance), without mitmproxy: round robin request
by request, session affinity learnt from an answer's session header, the bound on what it
remembers, and the options that turn it on (or leave it off)."""

from __future__ import annotations

import mcp_faults_io
import pytest

from lab.faults.balance import Balancer, Replica, parse_affinity, parse_replicas
from lab.faults.launch import balancer_options

THREE = (Replica("127.0.0.1", 8001), Replica("127.0.0.1", 8002), Replica("127.0.0.1", 8003))


def test_round_robin_goes_request_by_request_in_list_order() -> None:
    b = Balancer(THREE)
    assert [b.route(None) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_without_affinity_a_session_does_not_stick() -> None:
    b = Balancer(THREE[:2], "none")
    first = b.route(None)
    b.learn("sess-A", first)  # the initialize's answer came from `first`
    assert [b.route("sess-A") for _ in range(4)] == [1, 0, 1, 0]
    assert b.replica_of("sess-A") == 0, "learnt all the same: the proxy's own calls need it"


def test_session_affinity_is_learnt_from_the_answer_that_assigned_the_session() -> None:
    b = Balancer(THREE, "session")
    a, c = b.route(None), b.route(None)  # two initializes, round-robin: replicas 0 and 1
    b.learn("sess-A", a)
    b.learn("sess-C", c)
    assert (a, c) == (0, 1)
    routed = [(b.route("sess-A"), b.route("sess-C")) for _ in range(3)]
    assert routed == [(0, 1)] * 3
    # Requests of known sessions do not move the counter: the next newcomer gets replica 2.
    assert b.route(None) == 2


def test_an_unknown_session_or_none_goes_round_robin() -> None:
    b = Balancer(THREE, "session")
    b.learn("sess-A", 2)
    assert [b.route("never-seen"), b.route(None), b.route(""), b.route("never-seen")] == [0, 1, 2, 0]
    assert b.route("sess-A") == 2


def test_a_later_answer_moves_the_session() -> None:
    b = Balancer(THREE, "session")
    b.learn("sess-A", 0)
    b.learn("sess-A", 2)  # re-initialized on another replica under the same ID
    assert b.route("sess-A") == 2 and len(b) == 1


def test_the_least_recently_used_session_is_forgotten_past_the_bound() -> None:
    b = Balancer(THREE, "session", max_sessions=2)
    b.learn("old", 2)
    b.learn("mid", 2)
    assert b.route("old") == 2  # used: now "mid" is the least recently used
    b.learn("new", 1)
    assert len(b) == 2
    assert b.replica_of("mid") is None and b.replica_of("old") == 2 and b.replica_of("new") == 1
    assert b.route("mid") == 0, "forgotten: round-robin again"


def test_sessions_are_held_by_digest_and_never_shown() -> None:
    b = Balancer(THREE, "session")
    b.learn("secret-session-id", 1)
    assert "secret-session-id" not in repr(b)
    assert all(isinstance(key, bytes) and b"secret" not in key for key in b._sessions)


def test_home_of_the_proxys_own_calls() -> None:
    b = Balancer(THREE, "none")
    b.learn("sess-A", 2)
    assert b.home("sess-A", answered_by=0) == 2, "the session's replica when known"
    assert b.home("unknown", answered_by=1) == 1, "else the replica that answered the raced request"
    assert b.home(None, answered_by=None) == 0, "else the first"


def test_learn_refuses_a_replica_that_does_not_exist() -> None:
    with pytest.raises(ValueError, match="no replica 3"):
        Balancer(THREE).learn("s", 3)
    with pytest.raises(ValueError, match="at least one replica"):
        Balancer(())


def test_options_parse_and_name_what_is_wrong() -> None:
    assert parse_replicas("") == () and parse_replicas(" , ") == ()
    assert parse_replicas("127.0.0.1:8001, localhost:9") == (
        Replica("127.0.0.1", 8001),
        Replica("localhost", 9),
    )
    v6 = parse_replicas("[::1]:8000")
    assert v6 == (Replica("::1", 8000),) and v6[0].authority == "[::1]:8000"
    for bad in ("127.0.0.1", "http://127.0.0.1:8001", ":80", "h:0", "h:70000", "h:x"):
        with pytest.raises(ValueError, match="mcpfaults_replicas: expected host:port"):
            parse_replicas(bad)
    with pytest.raises(ValueError, match="listed twice"):
        parse_replicas("h:1,h:1")
    assert parse_affinity("") == "none" and parse_affinity("session") == "session"
    with pytest.raises(ValueError, match="mcpfaults_affinity: expected one of none, session"):
        parse_affinity("sticky")


def test_off_when_no_replicas_are_given() -> None:
    base = {
        "mcpfaults_plan": "",
        "mcpfaults_run_start": "",
        "mcpfaults_poll": "",
        "mcpfaults_admin_token": "",
        "mcpfaults_admin_url": "",
        "mcpfaults_admin_timeout": "",
    }
    off = mcp_faults_io.parse_fault_options({**base, "mcpfaults_replicas": "", "mcpfaults_affinity": ""})
    assert off.replicas == () and off.affinity == "none"
    assert mcp_faults_io.parse_fault_options(base).replicas == (), "options from before replicas"
    on = mcp_faults_io.parse_fault_options(
        {**base, **balancer_options(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], "session")}
    )
    assert on.replicas == THREE[:2] and on.affinity == "session"
