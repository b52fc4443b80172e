"""SGLang's decisions written as a transition log in its own design's vocabulary.

Theory of operation
-------------------
``spec/designs/sglang-0.5.23.yaml`` writes SGLang's lifecycle (0.5.20 to 0.5.23) in the spec
language. :class:`DesignLog` watches a stepped SGLang pipeline (:mod:`.pipeline`) and writes one
line per transition SGLang's code makes, in that spec's words (``stagefate/transition_log.py``'s
format), so that ``stagefate validate --spec spec/designs/sglang-0.5.23.yaml LOG`` checks what
SGLang did against what its design says it may do, as TLA+ trace validation checks an
implementation's log against its spec.

The log is observation, not re-computation: every line comes from a value SGLang's own call
returned or a call SGLang's own code made, each wrapped where it is made. Nothing here evaluates
a guard:

=========================================  ============================================
SGLang's call, and what it returned          the line
=========================================  ============================================
``prefetch_from_storage``: an operation      ``issue``: ``else`` → querying; none:
in ``ongoing_prefetch`` after it             ``below_threshold`` → released
``_account_prefetch_outcome(revoked)``       ``hit``: ``hit_below_threshold`` → released
                                             if revoked, else ``else``
``try_lock_anchor``: anchor_lost, cap_busy   ``commit``: ``live_match_short`` → released,
                                             ``cap_busy`` → parked
``staged_span_covered``: True                ``commit``: ``device_covers_hit`` → released
False, then the read put in                  ``commit``: ``else`` → reading
``prefetch_buffer``
False, and by the pass's end the operation   ``commit``: ``host_short_for_trimmed`` →
parked (bounce room short)                   parked
a hit appended to ``pending_hit_allocs``     ``commit``: ``parked_ahead`` → parked (or
with no attempt of its own                   ``rate_limited``, which the design leaves out)
``stage_completed_prefetch``                 ``read_done``: ``else`` → staged, or
                                             ``read_empty`` → released if nothing is held
``prepare_staged_prefetch`` and the hold     ``plan``: by ``release_staged_hold``'s reason
it released, if any                          (device_covered, shrunk), else ``else``
``init_load_back``, with                     ``consume``: ``device_short`` → staged, else
``defer_staged_admission`` or a load back    ``else`` → consumed
``try_finish_load_back``: True               ``ack``: ``else`` → released (filled)
``release_aborted_request``                  ``abort`` from the request's state
``release_staged_hold`` outside the above    ``release_hold``: ``else`` → released
an aborted read leaves ``prefetch_buffer``   ``read_done``: ``else`` → released (aborted)
=========================================  ============================================

The request's state is what its last line said it became; a call SGLang makes in a state the
design has no row for is still written down (``validate`` then names it): that is the point.
It watches 0.5.22 and 0.5.23 (:func:`supported`); 0.5.20 and 0.5.21 name some releases
differently and 0.5.19 plans with other calls, so they are refused.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ...transition_log import TransitionLog
from .pipeline import SteppedSGLang

_GUARD_OF_RELEASE = {"device_covered": "span_device_resident", "shrunk": "prefix_shrank"}


class _WatchedParking(deque[Any]):
    """``pending_hit_allocs``, telling the log of every operation SGLang parks."""

    def __init__(self, items: deque[Any], parked: Callable[[Any, bool], None]) -> None:
        super().__init__(items)
        self._parked = parked

    def append(self, operation: Any) -> None:
        self._parked(operation, bool(self))
        super().append(operation)


def supported(pipeline: Any) -> bool:
    """Whether this release's pipeline makes its decisions where the log watches them: 0.5.22
    and 0.5.23. 0.5.20 and 0.5.21 follow the same design but release a device-covered hold
    without its reason and drop a hold the device cannot take instead of deferring it;
    0.5.19 plans with ``plan_staged_splice``."""
    return hasattr(pipeline, "prepare_staged_prefetch") and hasattr(
        pipeline, "defer_staged_admission"
    )


class DesignLog:
    """Writes SGLang's transitions, as its design names them, to ``log`` (the module says how)."""

    def __init__(self, driver: SteppedSGLang, log: TransitionLog) -> None:
        cache = driver.consumer.cache
        pipeline = cache.buffer_pipeline
        if not supported(pipeline):
            raise ValueError(
                "the design log speaks spec/designs/sglang-0.5.23.yaml as 0.5.22 and 0.5.23 "
                "decide it (a hold released with its reason, a short device deferred); this "
                "release does not: run 0.5.22 or later"
            )
        self.log, self.driver = log, driver
        self.states: dict[str, str] = {}
        self._attempted: set[str] = set()
        """Requests whose IO commit attempt this pass already wrote its outcome."""
        self._inside: str | None = None
        """The observed call in progress (``plan``, ``consume``, ``abort``): its releases and
        deferrals are its outcome, not transitions of their own."""
        self._released: dict[str, str | None] = {}
        self._deferred: set[str] = set()
        self._abandoned_reads: dict[str, Any] = {}
        self._allocating: dict[str, Any] = {}
        """Requests past the commit's checks whose bounce allocation has not shown yet: their
        operation (its read queued, or parked by the pass's end)."""
        self._wrap(cache, "prefetch_from_storage", self._issue)
        self._wrap(cache, "_account_prefetch_outcome", self._hit)
        self._wrap(pipeline, "try_lock_anchor", self._lock)
        self._wrap(pipeline, "staged_span_covered", self._covered)
        self._wrap(pipeline, "stage_completed_prefetch", self._staged)
        self._wrap(pipeline, "prepare_staged_prefetch", self._plan)
        self._wrap(pipeline, "init_load_back", self._consume)
        self._wrap(pipeline, "defer_staged_admission", self._defer)
        self._wrap(pipeline, "try_finish_load_back", self._ack)
        self._wrap(pipeline, "release_staged_hold", self._release)
        self._wrap(cache, "release_aborted_request", self._abort)
        self._wrap(cache, "check_hicache_events", self._pass)
        self._wrap(driver, "run_reads", self._reads_ran)
        self._wrap(cache.cache_controller.prefetch_buffer, "put", self._read_queued)
        pipeline.pending_hit_allocs = _WatchedParking(pipeline.pending_hit_allocs, self._parked)

    @staticmethod
    def _wrap(owner: Any, name: str, observe: Callable[..., Any]) -> None:
        original = getattr(owner, name)
        setattr(owner, name, functools.partial(observe, original))

    def _write(
        self, rid: str, event: str, guard: str, target: str, reason: str | None = None
    ) -> None:
        source = self.states.get(rid, "issued")
        self.log.record(rid, source, event, guard, target, reason)
        if target == "released":
            self.states.pop(rid, None)
        else:
            self.states[rid] = target

    @contextmanager
    def _during(self, call: str) -> Iterator[None]:
        saved, self._inside = self._inside, call
        try:
            yield
        finally:
            self._inside = saved

    # ------------------------------------------------------------------ up to the commit

    def _issue(self, original: Callable[..., Any], request: Any, *args: Any, **kwargs: Any) -> Any:
        cache = self.driver.consumer.cache
        live = request in cache.ongoing_prefetch or cache.buffer_pipeline.has_staged(request)
        result = original(request, *args, **kwargs)
        if not live:
            if request in cache.ongoing_prefetch:
                self._write(request.rid, "issue", "else", "querying")
            else:
                self._write(
                    request.rid, "issue", "below_threshold", "released", "declined_too_short"
                )
        return result

    def _hit(self, original: Callable[..., Any], operation: Any, revoked: bool) -> Any:
        rid = operation.handle.rid
        if self.states.get(rid) == "querying":
            if revoked:
                self._write(rid, "hit", "hit_below_threshold", "released", "below_threshold")
            else:
                self._write(rid, "hit", "else", "querying")
        return original(operation, revoked)

    def _lock(self, original: Callable[..., Any], request: Any, *args: Any) -> Any:
        result = original(request, *args)
        outcome = result if isinstance(result, str) else result[0]
        rid = request.rid
        if outcome == "anchor_lost":
            self._commit(rid, "live_match_short", "released", "declined_anchor_lost")
        elif outcome == "cap_busy":
            self._commit(rid, "cap_busy", "parked")
        return result

    def _covered(self, original: Callable[..., Any], request: Any, tokens: int) -> Any:
        covered = original(request, tokens)
        rid = request.rid
        if covered:
            self._commit(rid, "device_covers_hit", "released", "declined_device_covered")
        else:  # the bounce allocation decides next: a queued read, or parked
            self._attempted.add(rid)
            self._allocating[rid] = self.driver.consumer.cache.ongoing_prefetch[request].operation
        return covered

    def _read_queued(self, original: Callable[..., Any], operation: Any, *args: Any) -> Any:
        rid = operation.handle.rid
        if self._allocating.get(rid) is operation:
            del self._allocating[rid]
            self._commit(rid, "else", "reading")
        return original(operation, *args)

    def _allocation_outcomes(self) -> None:
        """At a pass's end: an operation past the checks that queued no read is parked (its
        bounce room was short) or was declined outright (an oversized bounce)."""
        parked = self.driver.consumer.cache.buffer_pipeline.pending_hit_allocs
        for rid, operation in self._allocating.items():
            if any(item is operation for item in parked):
                self._commit(rid, "host_short_for_trimmed", "parked")
            else:
                self._commit(rid, "else", "released", "declined_host_oversize")
        self._allocating.clear()

    def _parked(self, operation: Any, behind_others: bool) -> None:
        rid = operation.handle.rid
        if self.states.get(rid) == "querying" and rid not in self._attempted:
            self._commit(rid, "parked_ahead" if behind_others else "rate_limited", "parked")

    def _commit(self, rid: str, guard: str, target: str, reason: str | None = None) -> None:
        self._attempted.add(rid)
        self._write(rid, "commit", guard, target, reason)

    def _pass(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._attempted.clear()
        try:
            return original(*args, **kwargs)
        finally:
            self._allocation_outcomes()
            self._attempted.clear()
            self._abandoned_landed()

    # ------------------------------------------------------------------ the read and the hold

    def _staged(self, original: Callable[..., Any], request: Any, *args: Any) -> Any:
        result = original(request, *args)
        rid = request.rid
        if self.states.get(rid) == "reading":
            if self.driver.consumer.cache.buffer_pipeline.has_staged(request):
                self._write(rid, "read_done", "else", "staged")
            else:
                self._write(rid, "read_done", "read_empty", "released", "discarded")
        return result

    def _reads_ran(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            self._abandoned_landed()

    def _abandoned_landed(self) -> None:
        queue = self.driver.consumer.cache.cache_controller.prefetch_buffer.queue
        for rid, operation in list(self._abandoned_reads.items()):
            if not any(item is operation for item in queue):
                del self._abandoned_reads[rid]
                if self.states.get(rid) == "abandoned":
                    self._write(rid, "read_done", "else", "released", "aborted")

    def _plan(self, original: Callable[..., Any], req: Any) -> Any:
        rid = req.cache_request_handle.rid
        if self.states.get(rid) != "staged":
            return original(req)
        self._released.pop(rid, None)
        with self._during("plan"):
            result = original(req)
        if rid in self._released:
            reason = self._released.pop(rid) or "released"
            guard = _GUARD_OF_RELEASE.get(reason, "else")
            self._write(rid, "plan", guard, "released", reason)
        elif req.staged_prefetch_plan is not None:
            self._write(rid, "plan", "else", "staged")
        return result

    def _consume(self, original: Callable[..., Any], params: Any) -> Any:
        rid = params.req.cache_request_handle.rid
        if self.states.get(rid) != "staged":
            return original(params)
        self._deferred.discard(rid)
        self._released.pop(rid, None)
        with self._during("consume"):
            result = original(params)
        pipeline = self.driver.consumer.cache.buffer_pipeline
        if rid in self._deferred:
            self._deferred.discard(rid)
            if rid in self._released:  # the last deferral dropped the hold
                reason = self._released.pop(rid) or "released"
                self._write(rid, "consume", "device_short", "released", reason)
            else:
                self._write(rid, "consume", "device_short", "staged")
        elif any(f.request.rid == rid for f in pipeline.ongoing_buffer_load_back.values()):
            self._write(rid, "consume", "else", "consumed")
        return result

    def _defer(self, original: Callable[..., Any], req: Any, *args: Any) -> Any:
        self._deferred.add(req.cache_request_handle.rid)
        return original(req, *args)

    def _ack(self, original: Callable[..., Any], ack_id: int) -> Any:
        pending = self.driver.consumer.cache.buffer_pipeline.ongoing_buffer_load_back.get(ack_id)
        finished = original(ack_id)
        if finished and pending is not None and self.states.get(pending.request.rid) == "consumed":
            self._write(pending.request.rid, "ack", "else", "released", "filled")
        return finished

    # ------------------------------------------------------------------ the scheduler lets go

    def _release(
        self, original: Callable[..., Any], request: Any, *args: Any, **kwargs: Any
    ) -> Any:
        released = original(request, *args, **kwargs)
        rid = getattr(request, "rid", request)
        if released:
            reason = kwargs.get("reason", args[0] if args else None)
            if self._inside is not None:
                self._released[rid] = reason
            elif self.states.get(rid) == "staged":
                self._write(rid, "release_hold", "else", "released", "released")
        return released

    def _abort(self, original: Callable[..., Any], request: Any) -> Any:
        rid, state = request.rid, self.states.get(request.rid)
        cache = self.driver.consumer.cache
        info = cache.ongoing_prefetch.get(request)
        with self._during("abort"):
            result = original(request)
        if state in ("querying", "parked", "staged"):
            self._write(rid, "abort", "else", "released", "aborted")
        elif state == "reading":
            self._write(rid, "abort", "else", "abandoned")
            if info is not None:
                self._abandoned_reads[rid] = info.operation
            self._abandoned_landed()
        elif state in ("consumed", "abandoned"):
            self._write(rid, "abort", "else", state)
        return result
