"""What the buffer-mode pipeline costs the scheduler, and what it reads from L3, measured the
same way whichever pipeline SGLang's engine runs (SGLang's own or stagefate's lifecycle).

Attached to a built ``Scheduler`` (:func:`attach`, in the scheduler's process, by the engine
target's startup hook), it wraps, on that scheduler's objects only:

* **the calls the scheduler and its cache make on the pipeline's behalf**, each timed on the
  scheduler's thread: the cache's prefetch entry points, its per-pass event check, the
  load-back, the abort release and ``insert`` (where write-through is scheduled, or with
  stagefate done), and the pipeline's own admission calls. Their sum over the scheduler's
  passes (``get_next_batch_to_run`` calls) is the pipeline's time per step;
* **every L3 read** of the storage each pipeline reads (SGLang's backend's ``batch_get_v1`` /
  ``batch_get``; stagefate's store's ``batch_get_into``): reads that brought at least one page,
  the pages, and the pages read again after an earlier read of the same key (a span loaded by
  two requests).

:func:`report` is what the books RPC returns under ``probe`` (:mod:`.books`); a benchmark takes
the difference of two reports to measure one phase.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

CACHE_CALLS = (
    "prefetch_from_storage",
    "check_prefetch_progress",
    "pop_prefetch_loaded_span",
    "check_hicache_events",
    "init_load_back",
    "ready_to_load_host_cache",
    "release_aborted_request",
    "insert",
)
PIPELINE_CALLS = ("prepare_staged_prefetch", "defer_staged_admission", "has_staged")


class Probe:
    """The counters of one scheduler (read by :func:`report`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: Counter[str] = Counter()
        self.steps = 0
        self.reads = 0
        self.pages = 0
        self.pages_again = 0
        self._seen: set[str] = set()
        self._depth = 0  # the scheduler's thread only
        self._lock = threading.Lock()  # reads land on IO threads

    def timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` timed under ``name``; a timed call made inside another (a splice's insert
        inside ``init_load_back``) counts toward the outer one only."""

        @functools.wraps(call)
        def run(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return call(*args, **kwargs)
            self._depth += 1
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] += 1
                self._depth -= 1

        return run

    def counted_step(self, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.steps += 1
            return call(*args, **kwargs)

        return run

    def read(self, keys: list[str]) -> None:
        """``keys``: the pages one read brought, in order."""
        if not keys:
            return
        with self._lock:
            self.reads += 1
            self.pages += len(keys)
            again = sum(key in self._seen for key in keys)
            self.pages_again += again
            self._seen.update(keys)

    def as_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "seconds": dict(self.seconds),
            "calls": dict(self.calls),
            "reads": self.reads,
            "pages": self.pages,
            "pages_again": self.pages_again,
        }


def leading(results: Any, present: Callable[[Any], bool]) -> int:
    """How many of ``results`` hold a page, counted from the first until one does not."""
    count = 0
    for result in results or ():
        if not present(result):
            break
        count += 1
    return count


def _wrap_sglang_storage(backend: Any, probe: Probe) -> None:
    for name, present in (("batch_get_v1", bool), ("batch_get", lambda page: page is not None)):
        original = getattr(backend, name, None)
        if original is None:
            continue

        def counting(
            keys: list[str],
            *args: Any,
            _original: Callable[..., Any] = original,
            _present: Callable[[Any], bool] = present,
            **kwargs: Any,
        ) -> Any:
            results = _original(keys, *args, **kwargs)
            if isinstance(results, list):
                probe.read(list(keys[: leading(results, _present)]))
            return results

        setattr(backend, name, counting)


def _wrap_stagefate_storage(storage: Any, probe: Probe) -> None:
    original = storage.batch_get_into

    def counting(keys: list[str], *args: Any, **kwargs: Any) -> int:
        pages = int(original(keys, *args, **kwargs))
        probe.read(list(keys[:pages]))
        return pages

    storage.batch_get_into = counting


def attach(scheduler: Any) -> Probe:
    """Wrap this scheduler's pipeline calls and L3 reads (see the module's docstring)."""
    probe = Probe()
    cache = scheduler.tree_cache
    for name in CACHE_CALLS:
        if hasattr(cache, name):
            setattr(cache, name, probe.timed(name, getattr(cache, name)))
    pipeline = getattr(cache, "buffer_pipeline", None)
    if pipeline is not None:
        for name in PIPELINE_CALLS:
            if hasattr(pipeline, name):
                setattr(pipeline, name, probe.timed(name, getattr(pipeline, name)))
        lifecycle = getattr(pipeline, "lifecycle", None)
        if lifecycle is not None:  # stagefate's: built now, its store wrapped
            _wrap_stagefate_storage(lifecycle.storage, probe)
    backend = getattr(getattr(cache, "cache_controller", None), "storage_backend", None)
    if backend is not None:
        _wrap_sglang_storage(backend, probe)
    scheduler.get_next_batch_to_run = probe.counted_step(scheduler.get_next_batch_to_run)
    scheduler.stagefate_probe = probe
    return probe


def report(scheduler: Any) -> dict[str, Any] | None:
    probe = getattr(scheduler, "stagefate_probe", None)
    return None if probe is None else probe.as_json()
