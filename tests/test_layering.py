"""The package's layering, read from the source: every import runs down the layers, never
up or sideways, and there is no cycle. A new package must be placed in `LAYERS`."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"lab.wire", "lab.exitcodes", "lab.resources", "lab.runfolder", "lab.oslimits"}),
    # Independent of one another: the client core, the reference server, the fault layer,
    # the TCP nemesis, the adapters of clients under test. None of them may know another.
    frozenset({"lab.client", "lab.server", "lab.faults", "lab.nemesis", "lab.sut"}),
    frozenset({"lab.inbox", "lab.drivers"}),
    frozenset({"lab.load"}),
    frozenset({"lab.scenario"}),
    frozenset({"lab.checker"}),
    # The report's presentation (template, style sheets): data, importing nothing of the lab.
    frozenset({"dashboards"}),
    frozenset({"lab.report"}),
    frozenset({"lab.topology"}),
    frozenset({"lab.run", "lab.selftest"}),
    frozenset({"lab.cli"}),
)
ROOT_PACKAGE = "lab"
"""`lab/__init__.py` holds only the version; every layer may read it."""

KNOWN_BACK_ARROWS: frozenset[tuple[str, str]] = frozenset()
"""Arrows that break the layering today, each to be removed (never added to)."""


def _unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "dashboards":
        return "dashboards"
    return ROOT_PACKAGE if len(parts) == 1 else ".".join(parts[:2])


def import_graph(roots: tuple[str, ...] = ("lab", "dashboards")) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for top in roots:
        for path in (ROOT / top).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            src = _unit(module)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    if name.split(".")[0] in roots and _unit(name) != src:
                        graph[src].add(_unit(name))
    return graph


def _layer(unit: str) -> int:
    for i, members in enumerate(LAYERS):
        if unit in members:
            return i
    raise AssertionError(f"{unit} is in no layer of tests/test_layering.py: place it")


def violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        if src == ROOT_PACKAGE:
            continue
        for dst in sorted(targets):
            if dst == ROOT_PACKAGE or (src, dst) in KNOWN_BACK_ARROWS:
                continue
            if _layer(dst) >= _layer(src):
                bad.append(f"{src} -> {dst}")
    return bad


def test_every_import_runs_down_the_layers() -> None:
    graph = import_graph()
    assert "lab.wire" in graph["lab.client"], "the probe must see lab.client's imports"
    assert violations(graph) == []


def test_the_wire_imports_nothing_of_the_lab() -> None:
    assert import_graph().get("lab.wire", set()) <= {ROOT_PACKAGE}


def test_known_back_arrows_still_exist() -> None:
    # An exception that no longer happens must leave the list.
    graph = import_graph()
    assert [a for a in KNOWN_BACK_ARROWS if a[1] not in graph.get(a[0], set())] == []


def test_the_check_sees_an_arrow_going_up_or_sideways() -> None:
    assert violations({"lab.wire": {"lab.client"}}) == ["lab.wire -> lab.client"]
    assert violations({"lab.server": {"lab.client"}}) == ["lab.server -> lab.client"]
    assert violations({"lab.client": {"lab.wire"}}) == []
