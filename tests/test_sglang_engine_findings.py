"""docs/sglang-findings.md through SGLang's own engine (slow): each finding the engine can
reach, by its public calls alone, on every release whose engine serves here, must show its
symptom exactly on the releases the finding's record says hold it
(:mod:`stagefate.targets.sglang.engine.findings`)."""

from __future__ import annotations

import pytest

from stagefate.targets.sglang.engine.findings import SCRIPTS, STAND_IN_ONLY, affected, reproduce
from stagefate.targets.sglang.findings import FINDINGS
from stagefate.targets.sglang.releases import RELEASES

from .harness import engine_target


def test_every_finding_is_tried_through_the_engine_or_says_why_not() -> None:
    assert set(SCRIPTS) | set(STAND_IN_ONLY) == set(FINDINGS)
    assert not set(SCRIPTS) & set(STAND_IN_ONLY)


@pytest.mark.parametrize(
    ("name", "holders"),
    [
        ("l3_keys_ignore_the_namespace", {"0.5.19"}),
        ("hit_larger_than_the_host_pool_waits_for_ever", {"0.5.19", "0.5.20", "0.5.21"}),
        ("aborted_query_revokes_its_ids_next_prefetch", set(RELEASES)),
    ],
)
def test_a_finding_is_held_from_the_release_it_was_found_in_until_its_fix(
    name: str, holders: set[str]
) -> None:
    assert {version for version in RELEASES if affected(name, version)} == holders


@pytest.mark.slow
@pytest.mark.parametrize("version", list(RELEASES))
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_engine_shows_each_finding_on_the_releases_that_hold_it(
    name: str, version: str
) -> None:
    target = engine_target(version)
    seen = reproduce(target, name)
    expected = affected(name, version)
    assert seen.present == expected, (
        f"{name} on SGLang {version}: expected {'present' if expected else 'absent'}, "
        f"saw: {seen.seen}"
    )


@pytest.mark.parametrize(
    ("version", "message", "counted"),
    [
        (
            "0.5.19",
            "exited with status -9 ... AssertionError: Double-free detected: slots ...",
            True,
        ),
        (
            "0.5.23",
            "exited with status -9 ... AssertionError: Double-free detected: slots ...",
            False,
        ),
        ("0.5.19", "exited with status -9 ... ValueError: something else", False),
    ],
)
def test_an_engine_dead_of_the_reused_ids_double_free_counts_only_where_that_crash_is_held(
    version: str, message: str, counted: bool
) -> None:
    from types import SimpleNamespace

    from stagefate.targets.sglang.engine.client import EngineFailed
    from stagefate.targets.sglang.engine.findings import _died_of_the_reused_ids_double_free

    engine = SimpleNamespace(target=SimpleNamespace(version=version))
    assert _died_of_the_reused_ids_double_free(engine, EngineFailed(message)) is counted  # type: ignore[arg-type]
