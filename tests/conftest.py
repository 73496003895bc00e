"""Test-run settings shared by every test module."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# "ci" runs more examples than a developer's default run, derandomised so a
# failure on CI reproduces; HYPOTHESIS_PROFILE picks another.
settings.register_profile(
    "ci",
    max_examples=400,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
