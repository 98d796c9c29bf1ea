"""The registry of fault kinds: every kind is complete, its params schema names bad keys, and
docs/faults.md says what the registry says."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from lab.faults import docs
from lab.faults.checks import Fields, Issue
from lab.faults.kinds import NAMES, REGISTRY, Evidence, FaultKind, Unit, kind_of
from lab.faults.kinds.base import params_docs


def test_kinds_are_numbered_one_to_n_with_unique_names() -> None:
    assert [k.number for k in REGISTRY.values()] == list(range(1, len(REGISTRY) + 1))
    assert list(NAMES) == [k.name for k in REGISTRY.values()] and len(set(NAMES)) == len(NAMES)
    assert kind_of("kill_session").number == 14
    with pytest.raises(KeyError):
        kind_of("nope")


@pytest.mark.parametrize("name", NAMES)
def test_every_kind_declares_what_the_rest_of_the_lab_reads(name: str) -> None:
    k = REGISTRY[name]
    assert k.family and k.summary and k.applies_to and k.unit in (Unit.FLOW, Unit.EVENT)
    assert k.evidence and all(isinstance(e, Evidence) for e in k.evidence)
    assert k.feeds <= {1, 2, 3, 4, 5, 6, 15}  # the gates, and the modern era's check 15
    # Every parameter has a default, a spec and a meaning; an empty table gives the defaults.
    for d in params_docs(k.params_type):
        assert d.expected and d.doc, (name, d)
    issues: list[Issue] = []
    params = k.read_params(Fields({}, "params", issues), None, 0.5)
    assert issues == [] and params == k.params_type()
    # Event-level kinds act on events; flow-level ones act on the request or later.
    acts_on_events = type(k).on_event is not FaultKind.on_event
    if k.unit is Unit.EVENT:
        assert acts_on_events, name


def test_a_params_schema_names_the_key_and_what_was_expected() -> None:
    issues: list[Issue] = []
    kind_of("kill_session").read_params(
        Fields({"order": "after", "ordr": 1}, "faults[3].params", issues), None, 1
    )
    assert [str(i) for i in issues] == [
        "faults[3].params.order: expected one of 'before', 'concurrent', got 'after'",
        "faults[3].params.ordr: unknown key (did you mean 'order'?)",
    ]


def test_breaking_streams_and_gate_evidence_come_from_the_kinds() -> None:
    assert {k.name for k in REGISTRY.values() if k.breaks_streams} == {"cut_stream", "executed_then_lost"}
    assert {k.name for k in REGISTRY.values() if 3 in k.feeds} == {"expiry_race", "kill_session"}


def test_only_a_405_makes_kill_session_not_applicable() -> None:
    k = kind_of("kill_session")
    assert k.not_applicable({"delete_status": 405}) is not None
    assert "405" in (k.not_applicable({"delete_status": 405}) or "")
    for status in (200, 204, 404, -1):
        assert k.not_applicable({"delete_status": status}) is None
    assert kind_of("expiry_race").not_applicable({"admin_status": 405}) is None


def test_params_dataclasses_are_frozen_value_objects() -> None:
    for k in REGISTRY.values():
        p: Any = k.params_type()
        for f in fields(p):
            with pytest.raises(AttributeError):
                setattr(p, f.name, getattr(p, f.name))


# ---------------------------------------------------------------------- docs/faults.md


def test_docs_faults_md_is_generated_from_the_registry() -> None:
    page = docs.PAGE.read_text(encoding="utf-8")
    assert docs.render(page) == page, "docs/faults.md is stale: run `python -m lab.faults.docs --write`"
    assert docs.main(["--check"]) == 0


def test_the_check_catches_a_stale_page() -> None:
    page = docs.PAGE.read_text(encoding="utf-8")
    stale = page.replace("| 14 | `kill_session` |", "| 14 | `kill_sessions` |")
    assert stale != page and docs.render(stale) != stale
    with pytest.raises(ValueError, match="no section 'kinds'"):
        docs.render("# a page without its generated sections\n")
