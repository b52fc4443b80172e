"""Hypothesis profiles (``HYPOTHESIS_PROFILE``; ``ci`` by default) and shared fixtures."""

from __future__ import annotations

import os

from hypothesis import settings

from stagefate.fuzz.profiles import register_profiles

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
