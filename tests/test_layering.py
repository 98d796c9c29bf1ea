"""The package's layering, read from the source: every import runs down the layers, never
up or sideways, and there is no cycle. A new package must be placed in `LAYERS`."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"lab.wire", "lab.exitcodes", "lab.cliargs", "lab.resources", "lab.runfolder", "lab.oslimits"}),
    # Every part's stderr scrubbed of secrets (lab.wire's `scrub` on a stream).
    frozenset({"lab.logscrub"}),
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
    # Runs again what a run did (lab.run), from what the checker read of it.
    frozenset({"lab.replay"}),
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


# -- inside the checker: its rooms, ground floor first, and its one door ---------------

CHECKER_ROOMS: tuple[frozenset[str], ...] = (
    frozenset({"model", "explain"}),
    frozenset({"inputs"}),
    frozenset({"context"}),
    frozenset({"truth"}),
    frozenset({"health"}),
    frozenset({"timeline"}),
    frozenset({"rules"}),
    frozenset({"judge"}),
)
"""`lab/checker`'s folders (and top-level modules) in the order an import may go down."""
CHECKER = "lab.checker"


def _imports(path: Path) -> list[str]:
    """Absolute `lab...` imports of one file (module names, and `from X import name` as X.name)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def _room(module: str) -> str | None:
    """The checker room of `lab.checker.<room>[...]`; None for the package itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["lab", "checker"] else None


def checker_room_violations() -> list[str]:
    rank = {room: i for i, rooms in enumerate(CHECKER_ROOMS) for room in rooms}
    bad = []
    for path in sorted((ROOT / "lab" / "checker").rglob("*.py")):
        rel = path.relative_to(ROOT / "lab" / "checker").with_suffix("").parts
        if rel == ("__init__",):
            continue  # the public face re-exports every room
        src = rel[0]
        assert src in rank, f"lab/checker/{'/'.join(rel)}.py is in no room of CHECKER_ROOMS: place it"
        for name in _imports(path):
            dst = _room(name)
            if name == CHECKER:
                bad.append(f"{'/'.join(rel)} -> {name} (inside the checker, import a room, not the face)")
            elif dst in rank and dst != src and rank[dst] > rank[src]:
                bad.append(f"{'/'.join(rel)} -> {name}")
    return bad


def test_the_checkers_rooms_import_only_downwards() -> None:
    assert checker_room_violations() == []


def test_the_checker_has_at_most_ten_entries_named_by_concept() -> None:
    entries = sorted(p.name for p in (ROOT / "lab" / "checker").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 10, entries
    for folder in (ROOT / "lab" / "checker").iterdir():
        if folder.is_dir() and folder.name != "__pycache__":
            doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
            assert doc and len(doc.splitlines()) >= 1, f"lab/checker/{folder.name}/ says what it holds"


def outside_the_face() -> list[str]:
    """Imports of the checker's insides from anywhere else in the package."""
    bad = []
    for top in ("lab", "dashboards", "addons"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.is_relative_to(ROOT / "lab" / "checker"):
                continue
            for name in _imports(path):
                # `from lab.checker import X` is the face; `lab.checker.<room>...` is not.
                inside = name.startswith(CHECKER + ".") and _room(name) is not None
                if inside and not (name.count(".") == 2 and _is_face_name(name)):
                    bad.append(f"{path.relative_to(ROOT)} -> {name}")
    return bad


def _is_face_name(name: str) -> bool:
    import lab.checker

    return name.rsplit(".", 1)[1] in lab.checker.__all__


def test_the_report_and_run_code_use_only_the_checkers_public_face() -> None:
    assert outside_the_face() == []


def test_the_room_check_sees_an_arrow_going_up(tmp_path: Path) -> None:
    rank = {room: i for i, rooms in enumerate(CHECKER_ROOMS) for room in rooms}
    assert rank["truth"] < rank["rules"] < rank["judge"]
    assert _room("lab.checker.rules.resume") == "rules" and _room("lab.checker") is None
    face = tmp_path / "x.py"
    face.write_text("from lab.checker.truth.recoveries import latencies\nfrom lab.checker import judge\n")
    assert _imports(face) == [
        "lab.checker.truth.recoveries",
        "lab.checker.truth.recoveries.latencies",
        "lab.checker",
        "lab.checker.judge",
    ]
    assert _is_face_name("lab.checker.judge") and not _is_face_name("lab.checker.truth")
