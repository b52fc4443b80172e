"""What both API generations' design logs watch alike: the query's hit, the IO commit's checks
and bounce allocation, the read, the load back's ack, the scheduler's releases and aborts.

:class:`DesignObserver` wraps each of SGLang's calls where SGLang makes it (an instance
attribute over the bound method, so SGLang's own calls go through it too) and writes a line
from what the call returned or left behind; a generation (:mod:`.prepare`, :mod:`.plan`) adds
the calls it spells its own way (issue, plan, consume) and names the guards its design gives
the commit's outcomes. Nothing here evaluates a guard.

The request's state is what its last line said it became; a call SGLang makes in a state the
design has no row for is still written down (``validate`` then names it).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from ....spec.schema import LifecycleSpec
from ....transition_log import TransitionLog
from ..pipeline_driver import SteppedSGLang


def rid_of(key: Any) -> str:
    """The rid SGLang keys a request by: a ``CacheRequestHandle``'s (0.5.20 on), or the rid
    itself (0.5.19)."""
    return str(getattr(key, "rid", key))


class _WatchedParking(deque[Any]):
    """``pending_hit_allocs``, telling the log of every operation SGLang parks."""

    def __init__(self, items: deque[Any], parked: Callable[[Any, bool], None]) -> None:
        super().__init__(items)
        self._parked = parked

    def append(self, operation: Any) -> None:
        self._parked(operation, bool(self))
        super().append(operation)


class DesignObserver(ABC):
    """Writes SGLang's transitions, as ``design`` names them, to ``log``."""

    HOST_SHORT: ClassVar[str]
    """The guard the design gives a commit that parked for bounce room."""

    def __init__(self, driver: SteppedSGLang, log: TransitionLog, design: LifecycleSpec) -> None:
        cache = driver.consumer.cache
        pipeline = cache.buffer_pipeline
        self.log, self.driver, self.design = log, driver, design
        self.states: dict[str, str] = {}
        """Each rid's current attempt's state in the design."""
        self.names: dict[str, str] = {}
        """The log's name of a rid's current attempt, where it is not the rid: a rid issued
        afresh while its earlier attempt is still open (a read or load back in flight) names
        the new attempt ``rid@N``, so the two records stay apart."""
        self.retired: dict[str, list[tuple[str, str]]] = {}
        """Each rid's earlier attempts still open: ``(log name, state)``, oldest first."""
        self._fresh_issues: Counter[str] = Counter()
        self.awaiting_hit = {source for source, event, _ in design.edges() if event == "hit"}
        """The design's states whose existence query's hit is still to come."""
        self.holds = design.group("hold")
        self._attempted: set[str] = set()
        """Requests whose IO commit attempt this pass already wrote its outcome."""
        self._inside: str | None = None
        """The observed call in progress (``issue``, ``plan``, ``consume``, ``abort``): its
        releases and deferrals are its outcome, not transitions of their own."""
        self._released: dict[str, str | None] = {}
        self._abandoned_reads: dict[str, Any] = {}
        self._retired_reads: dict[str, Any] = {}
        """Abandoned reads of retired attempts, by their log name."""
        self._allocating: dict[str, Any] = {}
        """Requests past the commit's checks whose bounce allocation has not shown yet: their
        operation (its read queued, or parked by the pass's end)."""
        self.wrap(cache, "prefetch_from_storage", self._issue)
        self.wrap(cache, "_account_prefetch_outcome", self._hit)
        self.wrap(pipeline, "try_lock_anchor", self._lock)
        self.wrap(pipeline, "staged_span_covered", self._covered)
        self.wrap(pipeline, "stage_completed_prefetch", self._staged)
        self.wrap(cache, "_check_hybrid_prefetch_result", self._hybrid_checked)
        self.wrap(pipeline, "init_load_back", self._consume)
        self.wrap(pipeline, "try_finish_load_back", self._ack)
        self.wrap(pipeline, "release_staged_hold", self._release)
        self.wrap(cache, "release_aborted_request", self._abort)
        self.wrap(cache, "check_hicache_events", self._pass)
        self.wrap(driver, "run_reads", self._reads_ran)
        self.wrap(cache.cache_controller.prefetch_buffer, "put", self._read_queued)
        pipeline.pending_hit_allocs = _WatchedParking(pipeline.pending_hit_allocs, self._parked)

    @staticmethod
    def wrap(owner: Any, name: str, observe: Callable[..., Any]) -> None:
        """``owner.name`` becomes ``observe(original, *args)``."""
        original = getattr(owner, name)
        setattr(owner, name, functools.partial(observe, original))

    @property
    def pipeline(self) -> Any:
        return self.driver.consumer.cache.buffer_pipeline

    def write(
        self, rid: str, event: str, guard: str, target: str, reason: str | None = None
    ) -> None:
        source = self.states.get(rid, self.design.initial)
        self.log.record(self.names.get(rid, rid), source, event, guard, target, reason)
        if target == "released":
            self.states.pop(rid, None)
        else:
            self.states[rid] = target

    def retire(self, rid: str) -> None:
        """``rid`` is issued afresh while its current attempt is open: that attempt keeps its
        log name and state apart (:attr:`retired`), and the new one gets a name of its own."""
        state = self.states.pop(rid, None)
        if state is None:
            return
        earlier = self.retired.setdefault(rid, [])
        earlier.append((self.names.get(rid, rid), state))
        self._fresh_issues[rid] += 1
        self.names[rid] = f"{rid}@{self._fresh_issues[rid]}"
        operation = self._abandoned_reads.pop(rid, None)
        if operation is not None:
            self._retired_reads[earlier[-1][0]] = operation

    def end_retired(
        self, rid: str, state: str, event: str, reason: str, name: str | None = None
    ) -> bool:
        """The oldest earlier attempt of ``rid`` in ``state`` (the one logged as ``name``, if
        given) ends with ``event``; False if there is none."""
        earlier = self.retired.get(rid, [])
        for index, (logged, held) in enumerate(earlier):
            if held == state and name in (None, logged):
                self.log.record(logged, state, event, "else", "released", reason)
                del earlier[index]
                return True
        return False

    @contextmanager
    def during(self, call: str) -> Iterator[None]:
        saved, self._inside = self._inside, call
        try:
            yield
        finally:
            self._inside = saved

    def released_during(self, rid: str, call: Callable[[], Any]) -> tuple[Any, bool, str | None]:
        """``call()`` as part of the hold's ``rid`` transition: its result, whether it released
        the hold, and the reason SGLang gave."""
        self._released.pop(rid, None)
        with self.during("hold"):
            result = call()
        released = rid in self._released
        return result, released, self._released.pop(rid, None)

    def name_release(self, rid: str, reason: str) -> None:
        """The release of ``rid``'s hold in the call in progress had ``reason`` as its cause
        (the call it came through says so, where SGLang gave none)."""
        if rid in self._released:
            self._released[rid] = reason

    def load_back_in_flight(self, rid: str) -> bool:
        return any(
            self.driver.load_back_rid(pending) == rid
            for pending in self.pipeline.ongoing_buffer_load_back.values()
        )

    # ------------------------------------------------------------------ a generation's own

    @abstractmethod
    def issued(self) -> tuple[str, str]:
        """The guard and target of the design's first event for a request
        ``prefetch_from_storage`` just gave an operation."""

    @abstractmethod
    def _lock(self, original: Callable[..., Any], request: Any, *args: Any) -> Any:
        """``try_lock_anchor``: at issue (0.5.19) and at the IO commit."""

    @abstractmethod
    def _consume(self, original: Callable[..., Any], params: Any) -> Any:
        """``init_load_back``."""

    @abstractmethod
    def parked_unchecked(self, behind_others: bool) -> str:
        """The guard of a commit that parked a new hit before any check of its own ran."""

    # ------------------------------------------------------------------ the query and the commit

    def _issue(self, original: Callable[..., Any], request: Any, *args: Any, **kw: Any) -> Any:
        """``prefetch_from_storage``: the design's first event (its ``issue_event``) for a
        request with nothing live, by whether an operation exists after it."""
        cache = self.driver.consumer.cache
        live = request in cache.ongoing_prefetch or self.pipeline.has_staged(request)
        if not live:
            self.retire(rid_of(request))
        with self.during("issue"):
            result = original(request, *args, **kw)
        if not live:
            event, rid = self.design.issue_event, rid_of(request)
            if request in cache.ongoing_prefetch:
                self.write(rid, event, *self.issued())
            else:
                self.write(rid, event, "below_threshold", "released", "declined_too_short")
        return result

    def _hit(self, original: Callable[..., Any], operation: Any, revoked: bool) -> Any:
        rid = operation.request_id
        if self.states.get(rid) in self.awaiting_hit:
            if revoked:
                self.write(rid, "hit", "hit_below_threshold", "released", "below_threshold")
            else:
                self.write(rid, "hit", "else", self.states[rid])
        return original(operation, revoked)

    def _covered(self, original: Callable[..., Any], request: Any, tokens: int) -> Any:
        covered = original(request, tokens)
        rid = rid_of(request)
        if covered:
            self.commit(rid, "device_covers_hit", "released", "declined_device_covered")
        else:  # the bounce allocation decides next: a queued read, or parked
            self._attempted.add(rid)
            self._allocating[rid] = self.driver.consumer.cache.ongoing_prefetch[request].operation
        return covered

    def _read_queued(self, original: Callable[..., Any], operation: Any, *args: Any) -> Any:
        rid = operation.request_id
        if self._allocating.get(rid) is operation:
            del self._allocating[rid]
            self.commit(rid, "else", "reading")
        return original(operation, *args)

    def _allocation_outcomes(self) -> None:
        """At a pass's end: an operation past the checks that queued no read is parked (its
        bounce room was short) or was declined outright (0.5.20 on: an oversized bounce)."""
        parked = self.pipeline.pending_hit_allocs
        for rid, operation in self._allocating.items():
            if any(item is operation for item in parked):
                self.commit(rid, self.HOST_SHORT, "parked")
            else:
                self.commit(rid, "host_oversize", "released", "declined_host_oversize")
        self._allocating.clear()

    def _parked(self, operation: Any, behind_others: bool) -> None:
        rid = operation.request_id
        if self.states.get(rid) in self.awaiting_hit and rid not in self._attempted:
            self.commit(rid, self.parked_unchecked(behind_others), "parked")

    def commit(self, rid: str, guard: str, target: str, reason: str | None = None) -> None:
        self._attempted.add(rid)
        self.write(rid, "commit", guard, target, reason)

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
        rid = rid_of(request)
        if self.states.get(rid) == "reading":
            if self.pipeline.has_staged(request):
                self.write(rid, "read_done", "else", "staged")
            else:
                self.write(rid, "read_done", "read_empty", "released", "discarded")
        return result

    def _hybrid_checked(self, original: Callable[..., Any], request: Any, *args: Any) -> Any:
        """A hybrid's read is all or nothing: when a pool's pages did not all land (its SWA
        window, say), SGLang discards the fetch at the ack, before anything is staged."""
        usable = original(request, *args)
        rid = rid_of(request)
        if not usable and self.states.get(rid) == "reading":
            self.write(rid, "read_done", "read_empty", "released", "discarded")
        return usable

    def _reads_ran(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            self._abandoned_landed()

    def _read_in_flight(self, operation: Any) -> bool:
        queue = self.driver.consumer.cache.cache_controller.prefetch_buffer.queue
        return any(item is operation for item in queue)

    def _abandoned_landed(self) -> None:
        for rid, operation in list(self._abandoned_reads.items()):
            if not self._read_in_flight(operation):
                del self._abandoned_reads[rid]
                if self.states.get(rid) == "abandoned":
                    self.write(rid, "read_done", "else", "released", "aborted")
        for name, operation in list(self._retired_reads.items()):
            if not self._read_in_flight(operation):
                del self._retired_reads[name]
                rid = name.partition("@")[0]
                self.end_retired(rid, "abandoned", "read_done", "aborted", name)

    def _ack(self, original: Callable[..., Any], ack_id: int) -> Any:
        pending = self.pipeline.ongoing_buffer_load_back.get(ack_id)
        finished = original(ack_id)
        if finished and pending is not None:
            rid = self.driver.load_back_rid(pending)
            if not self.end_retired(rid, "consumed", "ack", "filled") and (
                self.states.get(rid) == "consumed"
            ):
                self.write(rid, "ack", "else", "released", "filled")
        return finished

    # ------------------------------------------------------------------ the scheduler lets go

    def _release(
        self, original: Callable[..., Any], request: Any, *args: Any, **kwargs: Any
    ) -> Any:
        released = original(request, *args, **kwargs)
        rid = rid_of(request)
        if released:
            reason = kwargs.get("reason", args[0] if args else None)
            if self._inside is not None:
                self._released[rid] = reason
            elif self.states.get(rid) in self.holds:
                self.write(rid, "release_hold", "else", "released", "released")
        return released

    def _abort(self, original: Callable[..., Any], request: Any) -> Any:
        """A read already under way is abandoned (its bounce goes when it lands), a load back
        in flight finishes; anything else SGLang lets go of at once."""
        rid = rid_of(request)
        state = self.states.get(rid)
        info = self.driver.consumer.cache.ongoing_prefetch.get(request)
        with self.during("abort"):
            result = original(request)
        if state == "reading":
            self.write(rid, "abort", "else", "abandoned")
            if info is not None:
                self._abandoned_reads[rid] = info.operation
            self._abandoned_landed()
        elif state in ("abandoned", "consumed"):
            self.write(rid, "abort", "else", state)
        elif state is not None:
            self.write(rid, "abort", "else", "released", "aborted")
        return result
