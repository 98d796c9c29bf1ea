"""Whether this box can hold what a scenario asks, before anything starts: `lab run` warns
(or, with `--strict`, refuses) naming the figure, instead of letting a run degrade and
then blaming the lab for it at the end.

From measured figures (docs/architecture.md, "How many clients the whole chain holds"):

    CLIENTS_PER_CORE        3,000  the whole chain held 6,000 mostly idle clients on a
                                   2-core box (bench/bench_chain_steps.py,
                                   scenarios/clients-10k.toml); past it the proxy hop
                                   stopped answering, mitmdump at a full core
    CONNECTIONS_PER_CLIENT  1.4    open connections per client at the nemesis (a standalone
                                   stream, and a call's through both proxies)
    KIB_PER_CLIENT          120    memory per client across the chain: ~44 KiB in a Locust
                                   worker (bench_worker_capacity --users), ~42 KiB in the
                                   nemesis (165 MiB at 4,000 clients), and mitmdump's
                                   share, taken as much again
Each proxy (the nemesis, mitmdump) spends two descriptors per connection.

Pure: the box's figures (cores, available memory, the open-files limit a proxy can
raise to) are given by the caller (`this_box`), so tests give any box.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Final

from lab.scenario import Scenario
from lab.scenario.size import peak_clients

CLIENTS_PER_CORE: Final = 3_000
CONNECTIONS_PER_CLIENT: Final = 1.4
KIB_PER_CLIENT: Final = 120
FDS_PER_CONNECTION: Final = 2
MEMORY_SHARE: Final = 0.8
"""The share of the box's available memory a run may plan to take."""


@dataclass(frozen=True, slots=True)
class Box:
    cores: int
    available_bytes: int | None
    """MemAvailable (None: unknown, not checked)."""
    open_files: int
    """The open-files limit a part can raise itself to (the hard RLIMIT_NOFILE)."""


def this_box() -> Box:
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        available = None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return Box(os.cpu_count() or 1, available, 1 << 20 if hard == resource.RLIM_INFINITY else hard)


def misfits(sc: Scenario, box: Box) -> list[str]:
    """What of the scenario this box cannot be expected to hold, one sentence each, with the
    figure it comes from (empty: nothing)."""
    clients = peak_clients(sc)
    out: list[str] = []
    held = CLIENTS_PER_CORE * box.cores
    if clients > held:
        out.append(
            f"{clients:,} clients at once, where a box of {box.cores} core(s) held about {held:,} "
            f"({CLIENTS_PER_CORE:,} per core, measured: docs/architecture.md); past it the proxy hop "
            "stops answering and the run measures the lab, not the target"
        )
    fds = int(clients * CONNECTIONS_PER_CLIENT * FDS_PER_CONNECTION)
    if fds > box.open_files:
        out.append(
            f"about {fds:,} open files in each proxy ({CONNECTIONS_PER_CLIENT} connections per client, "
            f"{FDS_PER_CONNECTION} descriptors each), over this box's limit of {box.open_files:,}"
        )
    need = clients * KIB_PER_CLIENT * 1024
    if box.available_bytes is not None and need > MEMORY_SHARE * box.available_bytes:
        out.append(
            f"about {need / 2**30:.1f} GiB for {clients:,} clients ({KIB_PER_CLIENT} KiB each across "
            f"the chain), over {MEMORY_SHARE:.0%} of the {box.available_bytes / 2**30:.1f} GiB available"
        )
    return out
