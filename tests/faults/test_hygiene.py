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


def test_fault_modules_and_the_scenario_loader_import_nothing_heavy() -> None:
    imports = "import lab.faults.plan, lab.faults.pipeline, lab.faults.facts, lab.faults.checks, lab.scenario"
    assert loaded_after(imports) == []


def test_the_addon_imports_only_mitmproxy_the_stdlib_and_pure_lab_modules() -> None:
    pure = {
        "lab.faults.facts",
        "lab.faults.pipeline",
        "lab.faults.plan",
        "lab.wire.redact",
        "lab.wire.extensions",
    }
    for name in ("mcp_faults.py", "mcp_faults_io.py", "mcp_noop.py"):
        source = (ROOT / "addons" / name).read_text()
        tops = {
            line.split()[1].split(".")[0]
            for line in source.splitlines()
            if line.startswith(("from ", "import "))
        }
        assert tops <= {*sys.stdlib_module_names, "mitmproxy", "lab", "mcp_faults_io"}, (name, tops)
        labs = {
            line.split()[1] for line in source.splitlines() if line.startswith(("from lab", "import lab"))
        }
        assert labs <= pure, (name, labs)
