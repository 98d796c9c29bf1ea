"""Shared test settings.

Hypothesis profiles: `default` keeps `make test` fast; `HYPOTHESIS_PROFILE=deep` runs
many more examples (use it after touching the protocol core).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the long poles first and on different workers, then the other live tests,
    then the rest, which fill the workers' last minutes.

    `long` tests (the marker's argument is their rough minutes, 1 by default) go first,
    the longest first, ordered so that `make test`'s workers (xdist, `--maxschedchunk 1`:
    two tests to each worker at the start, then one more as each finishes) each start
    with one of the longest: [1st, (n+1)th, 2nd, (n+2)th, ...] for n workers. Without
    this, the minute-long runs were collected last (tests/selftest/, tests/sut/) and
    began when the other workers were running out of work."""
    weight = {}
    for item in items:
        long = item.get_closest_marker("long")
        if long is not None:
            weight[item.nodeid] = float(long.args[0] if long.args else 1)
    poles = sorted((i for i in items if i.nodeid in weight), key=lambda i: -weight[i.nodeid])
    workers = config.getoption("numprocesses", default=None)
    n = workers if isinstance(workers, int) and workers > 0 else 1
    first = [x for k in range(n) for x in (poles[k : k + 1] + poles[n + k : n + k + 1])]
    order = first + [p for p in poles if p not in first]
    rest = [i for i in items if i.nodeid not in weight]
    rest.sort(key=lambda i: 0 if i.get_closest_marker("live") else 1)  # stable
    items[:] = order + rest
