"""The core's modules are layers: each imports only the ones below it (imports made only
for type checking count too), so the parts form no circle, and no part knows the core."""

from __future__ import annotations

import ast
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "lab" / "client"

LAYERS = (
    # the vocabulary: no part, no state
    "_states",
    "_commands",
    "_reconnect",
    "_acceptance",
    "_memory_inbox",
    "_config",
    "_model",
    "_diagram",
    # the state, then the parts in the order the core makes them (lab/client/_core.py)
    "_client_state",
    "_http",
    "_reconnector",
    "_stream_table",
    "_tools",
    "_calls",
    "_streams",
    "_leaving",
    "_handshake",
    "_core",
    "__init__",
)


def client_imports(path: Path) -> set[str]:
    """The lab.client modules `path` imports, wherever the import is (`TYPE_CHECKING` too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n.removeprefix("lab.client.") for n in names if n.startswith("lab.client.")}
        if "lab.client" in names:
            found.add("__init__")
    return found


def upward_imports(layers: tuple[str, ...], directory: Path) -> list[str]:
    below: set[str] = set()
    wrong = []
    for name in layers:
        wrong += [f"{name} -> {dep}" for dep in sorted(client_imports(directory / f"{name}.py") - below)]
        below.add(name)
    return wrong


def test_every_module_of_the_core_has_its_layer() -> None:
    assert sorted(p.stem for p in CLIENT.glob("*.py")) == sorted(LAYERS)


def test_every_import_goes_down_the_layers() -> None:
    assert upward_imports(LAYERS, CLIENT) == []


def test_the_probe_sees_an_import_made_for_type_checking(tmp_path: Path) -> None:
    (tmp_path / "_low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lab.client._high import X\n"
    )
    (tmp_path / "_high.py").write_text("from lab.client._low import Y\n")
    assert upward_imports(("_low", "_high"), tmp_path) == ["_low -> _high"]
