"""IO executors: where storage operations and H2D copies run, and when they complete.

An operation is a closure with an id; its completion is posted as a :class:`Completion` and
picked up by the pipeline's ``poll()`` on the caller's thread, which is where every state change
happens. The executors never touch lifecycle state.

* :class:`ManualIO` runs nothing until told: tests and fuzzers choose which operation completes,
  when, fully, short or with an error.
* :class:`ThreadedIO` runs storage operations on a worker pool and posts completions to a queue;
  H2D copies are launched on the caller's thread (CUDA streams belong to it) and complete when
  their handle reports done.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from .copy import FINISHED, CopyHandle

OpKind = Literal["exists", "read", "load"]


# The three records below are NamedTuples, not frozen dataclasses: each prefetch makes several
# and a frozen dataclass costs a microsecond more per construction.


class IOResult(NamedTuple):
    """What an operation produced: tokens found or read, and whether its aux part is whole."""

    tokens: int = 0
    aux_complete: bool = True
    handle: CopyHandle = FINISHED


class IOOp(NamedTuple):
    """One storage operation handed to an :class:`IOExecutor`: an existence query, a read or a
    load, run off the scheduler's thread."""

    op_id: int
    kind: OpKind
    run: Callable[[int | None], IOResult]
    """Run the operation; the argument caps the tokens a read may bring (a short read)."""


class Completion(NamedTuple):
    """What an operation reports back: the tokens it found or brought, whether an aux window
    came whole, and why it failed (None: it did not)."""

    op_id: int
    kind: OpKind
    tokens: int = 0
    aux_complete: bool = True
    error: str | None = None
    seconds: float | None = None
    """How long a storage operation took from its submission (None: not timed, as a
    :class:`ManualIO` without a clock does not: a test decides when it completes)."""


class IOExecutor(Protocol):
    """Where the pipeline's storage operations run: :class:`ThreadedIO` in production,
    :class:`ManualIO` where a test or fuzzer decides when each completes."""

    def submit(self, op: IOOp) -> None:
        """Queue ``op``; it runs when the executor decides (a thread now, or a test's call)."""
        ...

    def drain(self) -> list[Completion]:
        """Completions posted since the last drain, in completion order."""
        ...

    def pending(self) -> int:
        """Operations submitted and not yet drained."""
        ...

    def close(self) -> None:
        """Stop running operations; later submissions are refused by the pipeline."""
        ...


@runtime_checkable
class TimesReads(Protocol):
    """An executor that knows how long each read in flight has run (:class:`ThreadedIO`, and a
    :class:`ManualIO` given a clock): the pipeline's speed estimate takes the oldest as a floor
    under a load's latency, and ``give_up_slow_read`` compares a read's time so far with the
    time computing its tokens would take."""

    def reads_running(self) -> dict[int, float]:
        """Seconds since its submission of each read not yet done (queued or running), by
        op id."""
        ...


@runtime_checkable
class Closable(Protocol):
    """An executor that knows it was closed (both of stagefate's): the pipeline then refuses
    calls before they change anything, rather than failing inside a transition."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`IOExecutor.close` was called."""
        ...


def _completion(op: IOOp, result: IOResult, seconds: float | None = None) -> Completion:
    """A done operation's completion (a copy that failed carries its handle's error)."""
    error = None if result.handle is FINISHED else result.handle.error()
    return Completion(op.op_id, op.kind, result.tokens, result.aux_complete, error, seconds)


class ManualClock:
    """A clock that moves only when the test moves it (trio's ``MockClock``, reduced to what
    stagefate times): a :class:`ManualIO` given one times its reads deterministically."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        if not seconds >= 0.0:
            raise ValueError(f"advance({seconds!r}): a clock moves forward only")
        self.now += seconds


class ManualIO:
    """Deterministic IO: operations wait in submission order until completed by hand.

    ``clock``: seconds from a clock the test moves (a :class:`ManualClock`); with one, reads
    are timed by it (:class:`TimesReads`, and each completion's ``seconds``), as
    :class:`ThreadedIO` times them by the wall clock. Without one nothing is timed.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._queued: dict[int, IOOp] = {}
        self._done: list[Completion] = []
        self._closed = False
        self._clock = clock
        self._submitted: dict[int, float] = {}
        """When each read not yet done was submitted, by the clock (timed reads only)."""

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def clock(self) -> Callable[[], float] | None:
        """The clock that times the reads (None: untimed)."""
        return self._clock

    def submit(self, op: IOOp) -> None:
        self._queued[op.op_id] = op
        if self._clock is not None and op.kind == "read":
            self._submitted[op.op_id] = self._clock()

    def reads_running(self) -> dict[int, float]:
        if self._clock is None:
            return {}
        now = self._clock()
        return {op_id: now - submitted for op_id, submitted in self._submitted.items()}

    def _seconds(self, op: IOOp) -> float | None:
        """How long ``op`` ran, by the clock (a read's only: the others are not timed)."""
        submitted = self._submitted.pop(op.op_id, None)
        return None if submitted is None or self._clock is None else self._clock() - submitted

    def pending(self) -> int:
        return len(self._queued)

    def queued(self, kind: OpKind | None = None) -> list[int]:
        """Ids of waiting operations (of one kind), oldest first."""
        return [op_id for op_id, op in self._queued.items() if kind is None or op.kind == kind]

    def _queued_op(self, op_id: int) -> IOOp:
        try:
            return self._queued[op_id]
        except KeyError:
            raise KeyError(f"no queued IO operation {op_id}; see ManualIO.queued()") from None

    def complete(self, op_id: int, limit: int | None = None) -> None:
        """Run operation ``op_id`` now (a read capped at ``limit`` tokens is a short read)."""
        op = self._queued_op(op_id)
        del self._queued[op_id]
        self._run(op, limit)

    def _run(self, op: IOOp, limit: int | None) -> None:
        result = op.run(limit)
        if result.handle is not FINISHED:
            result.handle.wait()
        self._done.append(_completion(op, result, self._seconds(op)))

    def complete_short(self, op_id: int, tokens: int) -> None:
        self.complete(op_id, limit=tokens)

    def fail(self, op_id: int, error: str = "injected IO error") -> None:
        """End operation ``op_id`` with an error, without running it."""
        op = self._queued_op(op_id)
        del self._queued[op_id]
        self._done.append(Completion(op.op_id, op.kind, error=error, seconds=self._seconds(op)))

    def complete_all(self) -> None:
        """Complete every queued operation, oldest first (ones they submit wait for next time)."""
        queued = self._queued
        for op_id in list(queued):
            self._run(queued.pop(op_id), None)

    def drain(self) -> list[Completion]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        self._queued.clear()
        self._submitted.clear()
        self._closed = True


@dataclass
class _Launched:
    op: IOOp
    result: IOResult


@dataclass
class ThreadedIO:
    """L3 reads on ``workers`` threads, existence queries on a thread of their own, H2D loads
    launched on the caller's thread.

    A query is a lookup and a read moves pages: behind a read of a slow L3 (one its request
    stopped waiting for included, which still runs to its end) a query would wait for the
    read, and its request with it, though L3 answers it at once."""

    workers: int = 2
    _results: queue.SimpleQueue[Completion] = field(default_factory=queue.SimpleQueue)
    _loads: list[_Launched] = field(default_factory=list)
    _early: list[Completion] = field(default_factory=list)
    """Completions :meth:`wait` took off the queue, handed out by the next drain first."""
    _in_flight: int = 0
    _closed: bool = False
    _reads: dict[int, float] = field(default_factory=dict)
    """Reads not yet done: op id -> when it was submitted (written by both threads: a dict's
    single item operations are atomic in CPython)."""

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="stagefate-io")
        self._queries = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stagefate-query")

    def submit(self, op: IOOp) -> None:
        if op.kind == "load":
            self._loads.append(_Launched(op, op.run(None)))
            return
        self._in_flight += 1
        submitted = time.perf_counter()
        if op.kind == "read":
            self._reads[op.op_id] = submitted
        lane = self._queries if op.kind == "exists" else self._pool
        lane.submit(self._run, op, submitted)

    def _run(self, op: IOOp, submitted: float) -> None:
        try:
            result = op.run(None)
            completion = _completion(op, result, time.perf_counter() - submitted)
        except Exception as exc:  # the IO side reports failures; the caller decides
            completion = Completion(op.op_id, op.kind, error=f"{type(exc).__name__}: {exc}")
        self._reads.pop(op.op_id, None)
        self._results.put(completion)

    def reads_running(self) -> dict[int, float]:
        reads = dict(self._reads)  # a copy: the worker threads remove theirs meanwhile
        now = time.perf_counter()
        return {op_id: now - submitted for op_id, submitted in reads.items()}

    def wait(self, timeout_s: float) -> bool:
        """Block (the GIL released) until a storage operation completes or ``timeout_s``
        passes; True if one did. For a caller with nothing else to do this step: its IO threads
        then run at once, instead of waiting for the caller to give up the GIL (a caller that
        spins keeps them from it, and a read that takes a millisecond alone took hundreds)."""
        if self._early or not self._in_flight:
            return bool(self._early)
        try:
            self._early.append(self._results.get(timeout=timeout_s))
        except queue.Empty:
            return False
        return True

    def drain(self) -> list[Completion]:
        done, self._early = self._early, []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                break
        self._in_flight -= len(done)
        still = []
        for launched in self._loads:
            if launched.result.handle.done():
                done.append(_completion(launched.op, launched.result))
            else:
                still.append(launched)
        self._loads = still
        return done

    def pending(self) -> int:
        return self._in_flight + len(self._loads)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._queries.shutdown(wait=True)
        self._pool.shutdown(wait=True)
