"""docs/report.md's glossary explains every term the report's sentences keep, and what the
docs and `lab report --help` say about the number of rules is the registry's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from lab.checker.explain import token, who
from lab.checker.rules import REGISTRY
from lab.cli import build_parser
from tests.test_docs_links import slug

ROOT = Path(__file__).resolve().parents[1]
REPORT_DOC = ROOT / "docs" / "report.md"
ENTRY = re.compile(r'^- <a id="(?P<anchor>glossary-[a-z0-9-]+)"></a>\*\*(?P<term>[^*]+)\*\*')

KEPT_TERMS = (
    # Terms that user-facing sentences of the checker and the report keep (summaries,
    # witnesses, notes, evidence, section titles), each explained once in the glossary.
    "attribution",
    "budget",
    "censored",
    "check",
    "client under test",
    "connection",
    "cursor",
    "dedup key",
    "digest",
    "dispatch",
    "event",
    "evidence",
    "flow",
    "foreign replay",
    "gate",
    "home",
    "hop",
    "idempotency key",
    "inbox",
    "inconclusive",
    "incomplete",
    "knee",
    "Last-Event-ID",
    "limited by the lab",
    "logical stream",
    "loss",
    "nemesis",
    "outbox",
    "owed",
    "phase",
    "priming event",
    "proxy fault",
    "receipt",
    "recovery",
    "resumption",
    "saturated",
    "session generation",
    "shadow ledger",
    "share",
    "standalone stream",
    "stream key",
    "tap",
    "toxic",
    "truth source",
    "unanswered request",
    "watermark",
    "wire",
    "witness",
)


def glossary() -> list[tuple[str, str]]:
    """(anchor, term) of each glossary entry, in the page's order."""
    text = REPORT_DOC.read_text(encoding="utf-8")
    assert "\n## Glossary\n" in text, "docs/report.md has no Glossary section"
    section = text.split("\n## Glossary\n", 1)[1].split("\n## ", 1)[0]
    return [(m["anchor"], m["term"]) for line in section.splitlines() if (m := ENTRY.match(line))]


def test_the_glossary_explains_every_term_the_report_keeps() -> None:
    terms = {term for _, term in glossary()}
    missing = [t for t in KEPT_TERMS if t not in terms]
    assert not missing, f"docs/report.md's glossary lacks {missing}"


def test_the_glossary_is_alphabetical_with_one_anchor_per_term() -> None:
    entries = glossary()
    assert len(entries) >= len(KEPT_TERMS)
    names = [term.lower() for _, term in entries]
    assert names == sorted(names), "keep the glossary in alphabetical order"
    assert [a for a, _ in entries] == [f"glossary-{slug(term)}" for _, term in entries]


def test_the_report_points_at_its_glossary() -> None:
    text = REPORT_DOC.read_text(encoding="utf-8")
    assert "[Glossary](#glossary)" in text.split("\n## ", 1)[0]  # said before the first section
    assert "(docs/report.md#glossary)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_who_did_a_write_is_said_in_words_never_a_dash() -> None:
    assert who("subject-b") == "authenticated as subject-b"
    assert who("-") == who(None) == "not authenticated"
    assert token("t_a") == "bearer token t_a"
    assert token("-") == token(None) == "no bearer token"


def test_the_docs_and_the_help_give_the_registry_s_number_of_rules() -> None:
    n = len(REGISTRY)
    assert n == 16 and [r.number for r in REGISTRY] == list(range(1, n + 1))
    for page in ("README.md", "docs/spec.md", "docs/report.md"):
        assert f"{n} rules" in (ROOT / page).read_text(encoding="utf-8"), page
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert f"the lab's {n} rules" in (sub.choices["report"].description or "")
