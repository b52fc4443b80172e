"""What the fuzzer found in SGLang's releases, each as the minimal program it printed.

Every finding is a program in the fuzz world's moves (:mod:`.machine`: the same sequences,
written to L3 under both namespaces before it starts), run on the release this interpreter
imports; :func:`reproduce` returns what broke, or None where the release passes it. A test runs
each program on every installed release (tests/test_sglang_findings.py), and
docs/sglang-findings.md tells each one: the release, the invariant, the program, the release
that fixed it and the upstream change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ...fuzz.world import NAMESPACES
from .generations import stepped_sglang
from .machine import PAGE, SEQUENCES
from .pipeline import SteppedSGLang


@dataclass(frozen=True)
class Finding:
    name: str
    found_in: str
    """The oldest release the program fails on."""
    fixed_in: str
    """The first release that passes it."""
    invariant: str
    """The invariant it breaks: a spec id (spec/lifecycle.yaml) or the target's own check."""
    upstream: str
    program: Callable[[SteppedSGLang], str | None]


def _world() -> SteppedSGLang:
    """The fuzz world at its start: every sequence in L3 under both namespaces."""
    driver = stepped_sglang(page_size=PAGE, anchor_cap=24 / 512)
    for namespace in NAMESPACES:
        for tokens in SEQUENCES:
            driver.produce(tokens, namespace)
    return driver


def _l3_keys_ignore_the_namespace(driver: SteppedSGLang) -> str | None:
    """issue(sequence 0, 'tenant-b'); pump ×3; admit: the spliced slots must hold tenant-b's
    KV (the producer wrote the same tokens under both namespaces)."""
    tokens = SEQUENCES[0]
    driver.issue("r0", tokens, "tenant-b")
    for _ in range(3):
        driver.settle(rounds=1)
    loaded = driver.admit("r0")
    length, held = driver.device_marks(tokens, "tenant-b")
    if held:
        return None
    return (
        f"admission loaded {loaded} tokens from L3 for a request under 'tenant-b'; the "
        f"{length} device slots of its sequence hold the default namespace's KV"
    )


def _sanity_check_with_a_write_in_flight(driver: SteppedSGLang) -> str | None:
    """publish(sequence 0's head); pump; sanity_check: a sibling's publish is being written
    to L3 when the scheduler's idle check runs."""
    driver.publish(SEQUENCES[0][:PAGE], None)
    driver.settle(rounds=1)
    try:
        driver.consumer.cache.sanity_check()
    except AttributeError as error:
        return f"sanity_check raised AttributeError: {error}"
    return None


FINDINGS = {
    finding.name: finding
    for finding in (
        Finding(
            "l3_keys_ignore_the_namespace",
            "0.5.19",
            "0.5.20",
            "namespace_isolation",
            "PR #38577 ([HiCache][LoRA] Isolate storage pages by extra key; issue #26747)",
            _l3_keys_ignore_the_namespace,
        ),
        Finding(
            "sanity_check_with_a_write_in_flight",
            "0.5.19",
            "0.5.21",
            "SGLang's own sanity_check passes",
            "no upstream PR found whose description matches; 0.5.21's sanity_check reads the "
            "intent's snapshot",
            _sanity_check_with_a_write_in_flight,
        ),
    )
}


def reproduce(name: str) -> str | None:
    """Run finding ``name``'s program on this interpreter's release, on a fresh world."""
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # its fallbacks are not the point
    driver = _world()
    try:
        return FINDINGS[name].program(driver)
    finally:
        driver.close()
