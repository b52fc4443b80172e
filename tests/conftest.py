"""Hypothesis profiles (``HYPOTHESIS_PROFILE``; ``ci`` by default) and shared fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from stagefate.fuzz.profiles import register_profiles

from .harness import DEVICES, on_device

# pytester: the plugin's own tests run sessions of their own
pytest_plugins = ("pytester", "tests.required_targets")

register_profiles()
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test that asks for it (or uses ``on_each_device``) runs on every device here."""
    with on_device(request.param):
        yield request.param


@pytest.fixture
def on_each_device(device: str) -> str:
    """For ``pytestmark = pytest.mark.usefixtures("on_each_device")``: a whole module per device."""
    return device


@pytest.fixture
def sglang() -> None:
    """For ``pytest.mark.usefixtures("sglang")``: skips, naming the install, where SGLang is not
    installed (``make sglang``)."""
    from stagefate.targets import TargetUnavailable
    from stagefate.targets.sglang import require

    try:
        require()
    except TargetUnavailable as missing:
        pytest.skip(str(missing))
