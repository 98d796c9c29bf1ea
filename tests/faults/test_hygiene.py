"""The fault layer's lab modules stay pure: the addon may import them into mitmdump, and
the scenario loader runs before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "socket",
    "asyncio",
    "threading",
    "sqlite3",
    "trio",
    "httpx",
    "locust",
    "gevent",
    "pandas",
    "mitmproxy",
)


def loaded_after(imports: str) -> list[str]:
    code = f"import sys\n{imports}\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


PURE = {
    # The fault layer's pure modules, and the wire vocabulary they use: what the addons may
    # import. A module added here must pass the test above (nothing heavy, no I/O).
    "lab.faults.balance",
    "lab.faults.declarations",
    "lab.faults.events",
    "lab.faults.facts",
    "lab.faults.flows",
    "lab.faults.kinds",
    "lab.faults.kinds.base",
    "lab.faults.memory",
    "lab.faults.pins",
    "lab.faults.pipeline",
    "lab.faults.plan",
    "lab.faults.records",
    "lab.faults.results",
    "lab.logscrub",
    "lab.wire.capabilities",
    "lab.wire.extensions",
    "lab.wire.jsonrpc",
    "lab.wire.redact",
    "lab.wire.revisions",
}
ADDON_FILES = ("mcp_faults.py", "mcp_tap.py", "mcp_faults_io.py", "mcp_noop.py")
SIBLINGS = {"mcp_faults_io", "mcp_tap"}
"""Addon files that addons import from their own folder (mitmproxy puts it on sys.path)."""


def test_fault_modules_and_the_scenario_loader_import_nothing_heavy() -> None:
    modules = sorted(PURE | {"lab.faults.checks", "lab.faults.decisions", "lab.faults.docs", "lab.scenario"})
    assert loaded_after("import " + ", ".join(modules)) == []


def imports_of(source: str) -> list[str]:
    return [line.split()[1] for line in source.splitlines() if line.startswith(("from ", "import "))]


def test_the_addons_import_only_mitmproxy_the_stdlib_and_pure_lab_modules() -> None:
    for name in ADDON_FILES:
        names = imports_of((ROOT / "addons" / name).read_text())
        tops = {n.split(".")[0] for n in names}
        assert tops <= {*sys.stdlib_module_names, "mitmproxy", "lab", *SIBLINGS}, (name, tops)
        labs = {n for n in names if n.split(".")[0] == "lab"}
        assert labs <= PURE, (name, labs - PURE)


def test_the_check_sees_a_heavy_import() -> None:
    assert imports_of("import os\nfrom lab.checker.inputs.load import RunData\n") == [
        "os",
        "lab.checker.inputs.load",
    ]
    assert "pandas" in loaded_after("import lab.checker.inputs.load")
