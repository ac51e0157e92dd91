"""Hypothesis profiles. CI=true would load Hypothesis's own `ci` profile: load ours explicitly."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fast", max_examples=60, stateful_step_count=40, deadline=None, database=None,
    derandomize=True, suppress_health_check=[HealthCheck.too_slow],
)
# deep: fresh random seeds every run (print_blob so a failure can be replayed).
settings.register_profile(
    "deep", max_examples=2000, stateful_step_count=60, deadline=None, database=None,
    derandomize=False, print_blob=True, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
