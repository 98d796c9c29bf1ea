"""The client's public surface: `lab.client.__all__` is the curated list of what a driver,
a Locust user or another part of the lab may use, and nothing outside `lab/client` (and
its own tests) reaches into a private `lab.client._x` module."""

from __future__ import annotations

import ast
from pathlib import Path

import lab.client

ROOT = Path(__file__).resolve().parents[2]

EXPORTED = {
    "ALL_CHECKS",
    "Acceptance",
    "BackoffPolicy",
    "CallFinished",
    "CallHandle",
    "CallOutcome",
    "Check",
    "ClientConfig",
    "ClientCore",
    "CloseConnection",
    "Command",
    "ConnectionView",
    "DedupKey",
    "Headers",
    "InboxReceipt",
    "InboxStore",
    "LeaveFinished",
    "LeaveReceipt",
    "MemoryInbox",
    "Notice",
    "OutboxDispatch",
    "Outcome",
    "Output",
    "Progress",
    "Purpose",
    "ReconnectBudget",
    "RejectReason",
    "SeenEvent",
    "SendRequest",
    "SessionEstablished",
    "SessionLost",
    "SessionView",
    "State",
    "StreamView",
    "Watermark",
    "accept_stream_event",
    "parse_retry_after",
    "state_diagram_document",
}
"""Changing this list changes a contract: drivers, Locust users, `lab.inbox` and the CLI
use these names."""

PRIVATE_OK = ("lab/client/", "tests/client/")
SOURCE_DIRS = ("lab", "tests", "bench", "dashboards", "addons")


def test_the_exported_names_are_pinned() -> None:
    assert set(lab.client.__all__) == EXPORTED
    assert len(lab.client.__all__) == len(EXPORTED)  # no name twice
    for name in EXPORTED:
        assert getattr(lab.client, name) is not None


def private_imports(root: Path) -> list[str]:
    """`file: module` for every import of a private `lab.client._x` module under `root`,
    except in the client's own package and tests."""
    found = []
    paths = [p for d in SOURCE_DIRS for p in (root / d).rglob("*.py")] + list(root.glob("*.py"))
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(PRIVATE_OK):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module == "lab.client":
                names = [f"lab.client.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [f"{rel}: {n}" for n in names if n.startswith("lab.client._")]
    return found


def test_nothing_outside_the_client_imports_its_private_modules() -> None:
    assert private_imports(ROOT) == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text("from lab.client._core import ClientCore\n", encoding="utf-8")
    (tmp_path / "fine.py").write_text("from lab.client import ClientCore\n", encoding="utf-8")
    (tmp_path / "also.py").write_text("from lab.client import _streams\n", encoding="utf-8")
    assert private_imports(tmp_path) == ["also.py: lab.client._streams", "user.py: lab.client._core"]
