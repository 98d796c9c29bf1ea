"""The process's limit on open files, raised to what the box allows.

A proxy in the chain spends two file descriptors per client connection (the client's and
the upstream's), a Locust worker one per connection and one per SQLite file: thousands of
clients need thousands of descriptors, and many systems start processes with a soft limit
of 1,024 under a hard limit far above it. Raising the soft limit to the hard one is what
any unprivileged process may do; past the hard limit only the machine's owner can go
(docs/architecture.md, "How many clients the whole chain holds", says what this box
allows).
"""

from __future__ import annotations

import resource

UNLIMITED_TARGET = 1_048_576
"""The soft limit asked for when the hard limit is unlimited (Linux's default nr_open)."""


def raise_open_files_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit; returns (soft, hard) afterwards.
    Never fails: a limit that cannot be raised stays as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, hard
    return resource.getrlimit(resource.RLIMIT_NOFILE)
