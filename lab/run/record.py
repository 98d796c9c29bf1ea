"""run.json (`mcpLabRun.v1`) of one run: what it was asked to do, what ran, how it ended.

The record is written when the run starts (`status: running`, with its `owner`), and
again when it ends (`status: finished`); a run that never gets to the second write is
marked `abandoned` by the next `lab run` or `lab report` (`lab.runfolder`). Nothing
secret is in it: the per-run HMAC key, the admin token and the bearer tokens are
replaced by placeholders wherever they would appear (the scenario, process argvs).
"""

from __future__ import annotations

import json
import platform
import secrets
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from lab import __version__
from lab.run.processes import redact_argv
from lab.runfolder import owner, replace_file, write_run_json
from lab.scenario import Scenario

SCHEMA = "mcpLabRun.v1"


def versions(toxiproxy: str | None) -> dict[str, str]:
    out = {
        "lab": __version__,
        "python": platform.python_version(),
        "toxiproxy": toxiproxy or "embedded nemesis",
    }
    for dist in ("mitmproxy", "locust", "uvicorn", "httpx", "trio", "pandas", "gevent"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


class RunRecord:
    def __init__(self, scenario: Scenario, workers: int, target: str, toxiproxy: str | None) -> None:
        self.sc = scenario
        self.workers = workers
        self.target = target
        self.toxiproxy = toxiproxy
        self.key = secrets.token_bytes(32)
        self.dir = Path()
        self.started_at = time.time()
        self.run_start = self.started_at
        self.stopped_at: float | None = None
        self.status = "running"
        self.end_reason = "running"
        self.complete = False
        self.died: str | None = None
        self.processes: list[dict[str, Any]] = []
        self.toxic_outcomes: list[dict[str, Any]] = []
        self.target_facts: dict[str, Any] | None = None
        self.proxy_name: str | None = None
        self.client_url = ""
        self.client: dict[str, Any] = {"kind": "lab"}
        """run.json `client`: who the load was (lab.run.sut.ClientUnderTest.as_json)."""
        self._secrets: dict[str, str] = {self.key_hex: "ledger-key"}
        for i, token in enumerate(sorted(scenario.target.tokens), 1):
            self._secrets[token] = f"token-{i}"

    @property
    def key_hex(self) -> str:
        return self.key.hex()

    def add_secret(self, value: str, name: str) -> None:
        self._secrets[value] = name

    def secrets(self) -> dict[str, str]:
        """Secret value -> placeholder name, for redaction."""
        return dict(self._secrets)

    def start(self, folder: Path) -> None:
        self.dir = folder
        self.started_at = self.run_start = time.time()

    def end(self, reason: str, *, complete: bool = False, died: str | None = None) -> None:
        """How the run ended; the first call wins (a later failure while stopping does not
        overwrite why the run stopped)."""
        if self.end_reason != "running":
            return
        self.end_reason, self.complete, self.died = reason, complete, died

    def spoil(self, reason: str) -> None:
        """What turns out, once the parts are stopped, to make a complete run incomplete
        (a toxic whose removal failed while stopping): it is the end reason then."""
        if self.complete:
            self.end_reason, self.complete = reason, False

    def finish(self) -> None:
        self.stopped_at = time.time()
        self.status = "finished"
        if self.end_reason == "running":  # never told why: cannot be complete
            self.end_reason = "lab failed: the run ended without a reason"

    def write(self) -> None:
        write_run_json(self.dir, self.as_json())

    def write_plan(self, path: Path, run_start: float) -> None:
        """The fault plan for the addon, replaced atomically (RunFolderError if it cannot be)."""
        replace_file(path, self.sc.fault_plan_json(run_start))

    def scenario_json(self) -> dict[str, Any]:
        """The scenario as loaded, its bearer tokens replaced by placeholders."""
        doc = self.sc.to_dict()
        tokens = doc.get("target", {}).get("tokens", {})
        doc["target"]["tokens"] = {self._secrets.get(t, "token"): subject for t, subject in tokens.items()}
        return doc

    def as_json(self) -> dict[str, Any]:
        from lab.run.watch import real_fault_windows

        splits = []
        split_file = self.dir / "budget_split.jsonl"
        if split_file.exists():
            for raw in split_file.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    splits.append(json.loads(raw))
                except ValueError:
                    continue
        planned = self.sc.fault_windows(self.run_start)
        target: dict[str, Any] = {
            "kind": "reference" if self.target == "reference" else "url",
            "url": None if self.target == "reference" else self.target,
            "protocol_version": self.sc.target.protocol_version,
            "era": self.sc.target.era,
        }
        if self.target_facts is not None:
            target.update(self.target_facts)
        return {
            "schema": SCHEMA,
            "run_id": self.dir.name,
            "status": self.status,
            "owner": owner(),
            "scenario": self.scenario_json(),
            "scenario_file": str(self.sc.path),
            "seed": self.sc.seed,
            "started_at": self.run_start,
            "stopped_at": self.stopped_at,
            "complete": self.complete,
            "end_reason": self.end_reason,
            "part_died": self.died,
            "budgets": self.sc.budgets(),
            "budget_split": splits,
            "fault_windows": real_fault_windows(planned, self.toxic_outcomes, self.stopped_at),
            "toxic_outcomes": self.toxic_outcomes,
            "processes": [{**p, "argv": redact_argv(p["argv"], self._secrets)} for p in self.processes],
            "versions": versions(self.toxiproxy),
            "target": target,
            "nemesis_proxy": self.proxy_name,
            "client_url": self.client_url,
            "client": self.client,
            "workers": self.workers,
            "overrides": dict(self.sc.overrides),
        }
