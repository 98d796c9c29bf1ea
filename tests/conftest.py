"""Shared test settings.

Hypothesis profiles: `default` keeps `make test` fast; `HYPOTHESIS_PROFILE=deep` runs
many more examples (use it after touching the protocol core).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
