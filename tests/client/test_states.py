"""The state table: legal moves, illegal moves leave the state alone, the doc is generated."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.client._diagram import document, mermaid
from lab.client._states import (
    INITIAL,
    STREAM_OPEN_REQUIRES,
    TERMINAL_STREAM_STATES,
    TRANSITIONS,
    Machine,
    Role,
    State,
    Trigger,
)
from lab.wire.errors import LocalProtocolError

DOC = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"


def test_spec_diagram_edges_are_all_in_the_table() -> None:
    """Every arrow of the rules' diagram is a move of the table (or the stream-open rule)."""
    sess, stream = TRANSITIONS[Role.SESSION], TRANSITIONS[Role.STREAM]

    def reachable(table: dict[State, dict[Trigger, State]] | object, a: State, b: State) -> bool:
        assert isinstance(table, dict)
        return b in table[a].values()

    assert STREAM_OPEN_REQUIRES is State.SESSION_ACTIVE and INITIAL[Role.STREAM] is State.STREAM_OPEN
    assert reachable(stream, State.STREAM_OPEN, State.DISCONNECTED)
    assert reachable(stream, State.DISCONNECTED, State.RESUME_PENDING)
    for dst in (State.STREAM_OPEN, State.CURSOR_REJECTED, State.SESSION_EXPIRED):
        assert reachable(stream, State.RESUME_PENDING, dst)
    assert reachable(sess, State.SESSION_ACTIVE, State.DELETE_REQUESTED)
    assert reachable(sess, State.DELETE_REQUESTED, State.TERMINATED)
    assert reachable(sess, State.SESSION_EXPIRED, State.REINITIALIZE_REQUIRED)
    assert reachable(sess, State.TERMINATED, State.REINITIALIZE_REQUIRED)


def test_every_state_of_the_spec_exists() -> None:
    names = {s.value for s in State}
    for required in [
        "SESSION_ACTIVE",
        "STREAM_OPEN",
        "DISCONNECTED",
        "RESUME_PENDING",
        "CURSOR_REJECTED",
        "SESSION_EXPIRED",
        "DELETE_REQUESTED",
        "TERMINATED",
        "REINITIALIZE_REQUIRED",
    ]:
        assert required in names


@pytest.mark.parametrize("role", list(Role))
def test_every_illegal_move_raises_and_leaves_state_unchanged(role: Role) -> None:
    illegal = 0
    for state, moves in TRANSITIONS[role].items():
        for trigger in Trigger:
            m = Machine(role, state)
            if trigger in moves:
                assert m.process(trigger) is moves[trigger]
                assert m.history == [(state, trigger, moves[trigger])]
            else:
                illegal += 1
                with pytest.raises(LocalProtocolError):
                    m.process(trigger)
                assert m.state is state and m.history == []
    assert illegal > 0


def test_every_state_reachable_from_initial() -> None:
    for role in Role:
        seen = {INITIAL[role]}
        frontier = [INITIAL[role]]
        while frontier:
            s = frontier.pop()
            for nxt in TRANSITIONS[role][s].values():
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen == set(TRANSITIONS[role]), role


def test_terminal_stream_states() -> None:
    assert {State.CURSOR_REJECTED, State.SESSION_EXPIRED, State.CLOSED} == TERMINAL_STREAM_STATES


def test_a_full_session_life() -> None:
    m = Machine(Role.SESSION)
    for t in (
        Trigger.INITIALIZE_SENT,
        Trigger.INITIALIZE_OK,
        Trigger.SESSION_NOT_FOUND,
        Trigger.REINITIALIZE,
        Trigger.INITIALIZE_SENT,
        Trigger.INITIALIZE_OK,
        Trigger.DELETE_SENT,
        Trigger.DELETE_REFUSED,  # 405: still active, not deleted
        Trigger.DELETE_SENT,
        Trigger.DELETE_CONFIRMED,
    ):
        m.process(t)
    assert m.state is State.TERMINATED


def test_docs_diagram_is_generated_from_the_table() -> None:
    assert DOC.read_text(encoding="utf-8") == document(), "run `lab diagram --write`"
    # and it is really derived: every move of the table appears in the Mermaid text
    text = mermaid()
    for role in Role:
        for src, moves in TRANSITIONS[role].items():
            for trigger, dst in moves.items():
                assert f"{role}_{src} --> {role}_{dst}: {trigger}" in text
