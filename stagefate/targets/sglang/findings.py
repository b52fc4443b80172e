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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .fuzz_config import PAGE, FuzzConfig
from .machine import SEQUENCES, fuzz_world
from .pipeline import SteppedSGLang


@dataclass(frozen=True)
class Finding:
    name: str
    found_in: str
    """The oldest release the program fails on."""
    fixed_in: str | None
    """The first release that passes it; None: not fixed upstream as of 0.5.23."""
    invariant: str
    """The invariant it breaks: a spec id (spec/lifecycle.yaml) or the target's own check."""
    upstream: str
    program: Callable[[SteppedSGLang], str | None]
    config: FuzzConfig = field(default_factory=FuzzConfig)
    """The deployment the program runs under (the configuration the campaign drew)."""
    proposed_fix: Callable[[], AbstractContextManager[None]] | None = None
    """For a finding not fixed upstream: the fix docs/sglang-findings.md proposes, applied to
    the release in this process while the context is open."""


def _world(config: FuzzConfig) -> SteppedSGLang:
    """The fuzz world at its start under ``config``: every sequence in L3 under both
    namespaces."""
    return fuzz_world(config)


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


def _aborted_parked_hit_revokes_its_ids_next_prefetch(driver: SteppedSGLang) -> str | None:
    """issue r0 and r1 (sequence 0); pump ×2: r1's hit is parked (the bounce holds r0's read);
    abort r1; a new request reuses the id r1; pump: the new request's prefetch must still be
    under way, or have an outcome of its own."""
    tokens = SEQUENCES[0]
    driver.issue("r0", tokens, None)
    driver.issue("r1", tokens, None)
    driver.settle(rounds=1)
    driver.settle(rounds=1)
    cache = driver.consumer.cache
    parked = [_handle_of(op) for op in cache.buffer_pipeline.pending_hit_allocs]
    if driver.requests["r1"].handle not in parked:
        return None  # nothing parked: the release's gates took another path
    driver.abort("r1")
    handle = driver.issue("r1", tokens, None, fresh=True).handle
    driver.run_existence_queries()
    driver.tick()
    if driver.live("r1") or driver.requests["r1"].state != "waiting":
        return None
    return (
        "the new request r1's prefetch was revoked by the parked operation of the aborted "
        f"request whose id it reuses ({handle!r}): no hit, no read, its L3 hit lost"
    )


def _handle_of(operation: Any) -> Any:
    """What an operation's request is keyed by: its handle (0.5.20 on) or its rid (0.5.19)."""
    return getattr(operation, "handle", operation.request_id)


@contextmanager
def _abort_unparks_the_hit() -> Iterator[None]:
    """The proposed fix: an abort takes the request's parked operation out of
    ``pending_hit_allocs`` (the FIFO otherwise outlives the request, and the next pass acts on
    whatever ongoing prefetch holds the same handle)."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    release = UnifiedRadixCache.release_aborted_request

    def release_and_unpark(self: Any, request: Any) -> Any:
        pipeline = self.buffer_pipeline
        if pipeline is not None:
            kept = [op for op in pipeline.pending_hit_allocs if _handle_of(op) != request]
            pipeline.pending_hit_allocs.clear()
            pipeline.pending_hit_allocs.extend(kept)
        return release(self, request)

    UnifiedRadixCache.release_aborted_request = release_and_unpark
    try:
        yield
    finally:
        UnifiedRadixCache.release_aborted_request = release


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
        Finding(
            "aborted_parked_hit_revokes_its_ids_next_prefetch",
            "0.5.19",
            None,
            "SGLang's run follows its design: every record ends",
            "not fixed upstream as of 0.5.23 (no PR found whose description matches)",
            _aborted_parked_hit_revokes_its_ids_next_prefetch,
            FuzzConfig(host_tokens=16),
            _abort_unparks_the_hit,
        ),
    )
}


def reproduce(name: str, with_proposed_fix: bool = False) -> str | None:
    """Run finding ``name``'s program on this interpreter's release, on a fresh world (with the
    fix the doc proposes applied, if asked)."""
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # its fallbacks are not the point
    finding = FINDINGS[name]
    fix = finding.proposed_fix if with_proposed_fix else None
    driver = _world(finding.config)  # (SGLang is imported, behind its CPU patches, here)
    try:
        with nullcontext() if fix is None else fix():
            return finding.program(driver)
    finally:
        driver.close()
