"""Hypothesis profiles shared by the test suite and ``stagefate fuzz``.

``ci``: derandomized, short and without an example database (``make test``: every run the
same); ``dev``: more examples, random; ``fuzz``: long campaigns; ``repro``: one example,
printing the blob that replays a failure.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILES = ("ci", "dev", "fuzz", "repro")


def register_profiles() -> None:
    settings.register_profile(
        "ci",
        derandomize=True,
        database=None,  # no example replayed from an earlier run: the same programs every time
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("dev", max_examples=200, deadline=None)
    settings.register_profile(
        "fuzz", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
    )
    settings.register_profile("repro", max_examples=1, deadline=None, print_blob=True)
