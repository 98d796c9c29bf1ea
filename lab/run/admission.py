"""What refuses a `lab run` before anything starts (`RunError`): a load its reconnect
budget cannot carry, and a local chain the lab may not build — a target off loopback, a
fault whose needs the target cannot meet, a Toxiproxy off loopback, a missing addon.
The checks that need the run's own state (the client under test, the reference server's
settings) stay with `lab.run.orchestrator.Run.check`."""

from __future__ import annotations

from pathlib import Path

from lab import topology
from lab.faults.kinds import Need
from lab.nemesis.toxics import LAB_ONLY
from lab.run.options import RunError, is_loopback
from lab.run.phases import refusal
from lab.scenario import Scenario


def check_load(sc: Scenario, workers: int) -> None:
    """The workers (one for scripted clients) and the reconnect budget they share."""
    if workers < 1:
        raise RunError(f"--workers must be at least 1, got {workers}")
    if sc.load.clients and workers != 1:
        # Every worker would play every script, under the same client IDs.
        raise RunError(
            f"{sc.path}: its scripted clients ([[load.clients]]) run in one worker: --workers must be 1, "
            f"got {workers}"
        )
    if sc.reconnect.budget_qps < workers:
        raise RunError(
            f"{sc.path}: reconnect.budget_qps is {sc.reconnect.budget_qps:g}, below the number of "
            f"workers ({workers}): each worker needs a whole reconnect per second of the budget"
        )


def check_real_toxiproxy(sc: Scenario, instead: str) -> None:
    """A real Toxiproxy (`--toxiproxy`, compose) has none of the lab's own toxics."""
    lab_only = sorted({t.kind for t in sc.toxics if t.kind in LAB_ONLY})
    if lab_only:
        raise RunError(
            f"{sc.path}: the {', '.join(lab_only)} toxic is the lab's nemesis's own, which a real "
            f"Toxiproxy does not have: {instead}"
        )


def check_local_chain(sc: Scenario, target: str, toxiproxy: str | None) -> None:
    """The chain on 127.0.0.1: `target` ("reference" or a URL), `toxiproxy` (None: the
    embedded nemesis)."""
    if (why := refusal(sc, target)) is not None:
        raise RunError(why)
    if target != "reference" and sc.target.replicas > 1:
        raise RunError(f"{sc.path}: target.replicas needs the reference server (a URL target has its own)")
    if target != "reference" and not is_loopback(target):
        raise RunError(f"target {target}: this lab only sends traffic to 127.0.0.1 (loopback)")
    # A `--target URL` overrides the scenario's target, which its own checks took for granted.
    admin = [r.kind for r in sc.faults if Need.ADMIN_CONTROL in r.spec.needs]
    if target != "reference" and admin:
        raise RunError(f"{sc.path}: the {admin[0]} fault needs the reference server's admin control")
    if toxiproxy is not None and not is_loopback(str(toxiproxy)):
        raise RunError(f"--toxiproxy {toxiproxy}: only a Toxiproxy on 127.0.0.1 is allowed")
    if toxiproxy is not None:
        check_real_toxiproxy(sc, "run without --toxiproxy")
    if not Path(topology.LOCAL.addon).is_file():
        raise RunError(f"the mitmproxy addon is missing: {topology.LOCAL.addon}")
