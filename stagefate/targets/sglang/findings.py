"""What the fuzzer found in SGLang's releases, each as the minimal program it printed.

Every finding is a program in the fuzz world's moves (:mod:`.fuzzer`: the same sequences,
written to L3 under both namespaces before it starts), run on the release this interpreter
imports; :func:`reproduce` returns what broke, or None where the release passes it. A test runs
each program on every installed release (tests/test_sglang_findings.py), and
docs/sglang-findings.md tells each one: the release, the invariant, the program, the release
that fixed it and the upstream change.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from .fuzz_config import PAGE, FuzzConfig
from .fuzzer import SEQUENCES, fuzz_world
from .hit_accounting import HitMetrics, keeps_hit_metrics
from .pipeline_driver import SteppedSGLang
from .request_books import per_request_books


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
    set_aside: str | None = None
    """The ``fuzz --set-aside`` name that runs a campaign with :attr:`proposed_fix` applied, to
    look past the finding."""


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


def _aborted_query_revokes_its_ids_next_prefetch(driver: SteppedSGLang) -> str | None:
    """issue r0 (sequence 0); run the existence queries (the answer waits for the next pass);
    abort r0; a new request reuses the id r0; pump once: the new request's prefetch must still
    be under way."""
    tokens = SEQUENCES[0]
    driver.issue("r0", tokens, None)
    driver.run_existence_queries()
    driver.abort("r0")
    driver.issue("r0", tokens, None, fresh=True)
    driver.tick()
    return _revoked(driver, "r0", "existence query's answer")


def _aborted_parked_hit_revokes_its_ids_next_prefetch(driver: SteppedSGLang) -> str | None:
    """issue r0 and r1 (sequence 0); pump ×2: r1's hit is parked (the bounce holds r0's read);
    abort r1; a new request reuses the id r1; run the queries; pump once: the new request's
    prefetch must still be under way."""
    tokens = SEQUENCES[0]
    driver.issue("r0", tokens, None)
    driver.issue("r1", tokens, None)
    driver.settle(rounds=1)
    driver.settle(rounds=1)
    parked = [_handle_of(op) for op in driver.consumer.cache.buffer_pipeline.pending_hit_allocs]
    if driver.requests["r1"].handle not in parked:
        return None  # nothing parked: the release's gates took another path
    driver.abort("r1")
    driver.issue("r1", tokens, None, fresh=True)
    driver.run_existence_queries()
    driver.tick()
    return _revoked(driver, "r1", "parked hit")


def _revoked(driver: SteppedSGLang, rid: str, what: str) -> str | None:
    if driver.live(rid) or driver.requests[rid].state != "waiting":
        return None
    return (
        f"the new request {rid}'s prefetch was revoked by the aborted request's {what} (the "
        f"two share the handle {driver.requests[rid].handle!r}): no read, its L3 hit lost"
    )


def _abort_after_staging_leaves_the_loaded_span(driver: SteppedSGLang) -> str | None:
    """issue r0 (sequence 0); pump ×3 (its span is staged); abort r0: no structure of SGLang's
    may name r0 afterwards."""
    driver.issue("r0", SEQUENCES[0], None)
    for _ in range(3):
        driver.settle(rounds=1)
    driver.abort("r0")
    driver.settle()
    request = driver.requests["r0"]
    left = per_request_books({"cache": driver.consumer.cache}, {"r0", request.handle})
    return f"after the abort, SGLang still holds r0 in {left}" if left else None


def _hit_larger_than_the_host_pool_waits_for_ever(driver: SteppedSGLang) -> str | None:
    """issue r0 (sequence 1, a 32-token hit) on a 16-token host pool; 40 passes, each with an
    admission try: r0 must be admitted (with or without its hit)."""
    driver.issue("r0", SEQUENCES[1], None)
    for _ in range(40):
        driver.settle(rounds=1)
        driver.admit("r0")
        if driver.requests["r0"].state != "waiting":
            return None
    return (
        f"r0's hit of {len(SEQUENCES[1])} tokens is parked for a bounce the "
        f"{driver.baseline_host}-token host pool can never hold: wait_complete keeps it out of "
        "admission for ever"
    )


def _id_reused_while_its_read_lands_crashes_the_pass(driver: SteppedSGLang) -> str | None:
    """issue r0 (sequence 0); pump ×2 (its read under way); abort r0 (the read is abandoned);
    issue r1; a new request reuses the id r0; pump: the pass must not raise, and once
    everything is aborted and settled the host pool must be whole again."""
    tokens = SEQUENCES[0]
    driver.issue("r0", tokens, None)
    driver.settle(rounds=1)
    driver.settle(rounds=1)
    driver.abort("r0")
    driver.issue("r1", tokens, None)
    driver.issue("r0", tokens, None, fresh=True)
    try:
        driver.settle(rounds=1)
    except TypeError as error:  # the pass itself fails: the scheduler loop would die here
        return (
            f"the scheduler pass raised TypeError ({error}): the aborted r0's read was acked "
            "into the new r0's prefetch, which has no bounce yet"
        )
    for rid, request in driver.requests.items():
        if request.state == "waiting":
            driver.abort(rid)
    driver.settle()
    available = driver.pipeline_host_available()
    if available == driver.baseline_host:
        return None
    return (
        f"the host pool has {available} of its {driver.baseline_host} tokens free once "
        "everything ended: the bounce of the aborted r0's read was never freed"
    )


def _unusable_fetch_leaves_its_trimmed_head_unexported(driver: SteppedSGLang) -> str | None:
    """issue r0 (sequence 0); a sibling publishes r0's first page; pump (the IO commit trims
    that page off the read); every L3 object dropped; settle (the read lands nothing); admit
    r0: SGLang's storage-hit metrics must balance (docs/sglang.md, "SGLang's own counters")."""
    cache = driver.consumer.cache
    if not keeps_hit_metrics(cache):
        return None  # 0.5.19 exports no per-request hit metrics
    metrics = HitMetrics.on(cache)
    tokens = SEQUENCES[0]
    driver.issue("r0", tokens, None)
    driver.publish(tokens[:PAGE], None)
    driver.settle(rounds=1)
    driver.drop_l3(lambda name: False)
    driver.settle()
    driver.admit("r0")
    driver.settle()
    return metrics.problem(driver.world_loads)


@contextmanager
def _unusable_fetch_resolves_what_is_left() -> Iterator[None]:
    """The proposed fix, as a patch: when a fetch lands nothing usable, what is left of its hit
    (the head the IO commit trimmed because the device held it, which every other path labels
    at admission) is exported as ``device_covered`` instead of discarded."""
    from sglang.srt.mem_cache.buffer_mode.pipeline import BufferModePipeline

    stage = BufferModePipeline.stage_completed_prefetch

    def stage_and_resolve(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        cache = self._cache

        def resolve(handle: Any) -> None:
            cache._finish_storage_prefetch(handle, fulfilled_tokens=0, reason="device_covered")

        cache.discard_storage_prefetch_accounting = resolve  # the one discard staging makes
        try:
            return stage(self, request, *args, **kwargs)
        finally:
            del cache.discard_storage_prefetch_accounting

    BufferModePipeline.stage_completed_prefetch = stage_and_resolve
    try:
        yield
    finally:
        BufferModePipeline.stage_completed_prefetch = stage


def _handle_of(operation: Any) -> Any:
    """What an operation's request is keyed by: its handle (0.5.20 on) or its rid (0.5.19)."""
    return getattr(operation, "handle", operation.request_id)


def _stop_naming_its_request(operation: Any) -> None:
    """Give ``operation`` a key no request has, so SGLang's lookups by key miss it and take
    their "aborted/cleaned" path."""
    if hasattr(operation, "handle"):
        operation.handle = dataclasses.replace(operation.handle, attempt_id=-1)
    else:  # 0.5.19 keys by the rid
        operation.request_id = f"{operation.request_id} (superseded)"


@contextmanager
def _superseded_operation_names_no_request() -> Iterator[None]:
    """The proposed fix, as a patch: an operation is its request's only while it is the one
    ``ongoing_prefetch`` holds for the request (the test ``_drain_ack_prefetch`` already makes,
    ``is_current``). Before each drain of the storage queues, an answered or parked operation
    that a later attempt under the same key superseded (an aborted id reused, a retracted
    request re-issued) stops naming the request, so the hit drain and the bounce allocation
    take their "aborted/cleaned" path for it instead of the live attempt's record. The queues
    are not touched, so tensor-parallel ranks still drain equal counts."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    drain = UnifiedRadixCache._drain_storage_control_queues_impl

    def drain_current_only(self: Any, *args: Any, **kwargs: Any) -> Any:
        parked = () if self.buffer_pipeline is None else self.buffer_pipeline.pending_hit_allocs
        for operation in (*self.cache_controller.prefetch_hit_queue.queue, *parked):
            info = self.ongoing_prefetch.get(_handle_of(operation))
            if info is not None and info.operation is not operation:
                _stop_naming_its_request(operation)
        return drain(self, *args, **kwargs)

    UnifiedRadixCache._drain_storage_control_queues_impl = drain_current_only
    try:
        yield
    finally:
        UnifiedRadixCache._drain_storage_control_queues_impl = drain


_NOT_FIXED = "not fixed upstream as of 0.5.23 (no PR found whose description matches)"
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
            "abort_after_staging_leaves_the_loaded_span",
            "0.5.20",
            "0.5.21",
            "at quiescence no per-request structure of the target names a request",
            "PR #40262 (release_aborted_request pops the loaded-span dicts by CacheRequestHandle, "
            "not by rid; its test came in PR #40296)",
            _abort_after_staging_leaves_the_loaded_span,
        ),
        Finding(
            "hit_larger_than_the_host_pool_waits_for_ever",
            "0.5.19",
            "0.5.22",
            "liveness: every waiting request is admitted or ends within 40 passes",
            "no upstream PR found whose description matches; 0.5.22's wheel declines such a hit "
            "(_reject_oversized_prefetch, counted declined_host_oversize)",
            _hit_larger_than_the_host_pool_waits_for_ever,
            FuzzConfig(host_tokens=16),
        ),
        Finding(
            "id_reused_while_its_read_lands_crashes_the_pass",
            "0.5.19",
            "0.5.20",
            "no exception out of SGLang's code; every bounce slot freed once",
            "keyed by CacheRequestHandle from 0.5.20 (the rework, PR #39283); no PR found that "
            "names this crash",
            _id_reused_while_its_read_lands_crashes_the_pass,
            FuzzConfig(host_tokens=64),
        ),
        Finding(
            "aborted_query_revokes_its_ids_next_prefetch",
            "0.5.19",
            None,
            "SGLang's run follows its design: every record ends",
            _NOT_FIXED,
            _aborted_query_revokes_its_ids_next_prefetch,
            proposed_fix=_superseded_operation_names_no_request,
            set_aside="id_reuse",
        ),
        Finding(
            "unusable_fetch_leaves_its_trimmed_head_unexported",
            "0.5.22",
            None,
            "SGLang's storage-hit metrics: hit - unfulfilled = loaded + left out",
            _NOT_FIXED,
            _unusable_fetch_leaves_its_trimmed_head_unexported,
            proposed_fix=_unusable_fetch_resolves_what_is_left,
            set_aside="unusable_fetch",
        ),
        Finding(
            "aborted_parked_hit_revokes_its_ids_next_prefetch",
            "0.5.19",
            None,
            "SGLang's run follows its design: every record ends",
            _NOT_FIXED,
            _aborted_parked_hit_revokes_its_ids_next_prefetch,
            FuzzConfig(host_tokens=16),
            _superseded_operation_names_no_request,
            "id_reuse",
        ),
    )
}


def proposed_fixes(names: Iterable[str]) -> list[Callable[[], AbstractContextManager[None]]]:
    """The proposed fixes of the findings ``names`` (those that have one), each once, to apply
    as patches (``fuzz --set-aside``; a twin release applies the same)."""
    fixes = (FINDINGS[name].proposed_fix for name in names)
    return list(dict.fromkeys(fix for fix in fixes if fix is not None))


def set_aside(names: Iterable[str]) -> tuple[str, ...]:
    """The findings whose proposed fix ``fuzz --set-aside`` ``names`` applies."""
    chosen = set(names)
    return tuple(name for name, finding in FINDINGS.items() if finding.set_aside in chosen)


def reproduce(name: str, with_proposed_fix: bool = False) -> str | None:
    """Run finding ``name``'s program on this interpreter's release, on a fresh world (with the
    fix the doc proposes applied, if asked)."""
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # its fallbacks are not the point
    finding = FINDINGS[name]
    fix = finding.proposed_fix if with_proposed_fix else None
    driver = fuzz_world(finding.config)  # (SGLang is imported, behind its CPU patches, here)
    try:
        with nullcontext() if fix is None else fix():
            return finding.program(driver)
    finally:
        driver.close()
