"""The scheduler's calls that differ between SGLang's two buffer-mode API generations.

:class:`~.pipeline_driver.SteppedSGLang` makes the calls in the scheduler's order; the two drivers
here say how each generation spells them (docs/sglang.md, "Releases"). SGLang's own code decides in
both: where the scheduler's logic lives in ``scheduler.py`` rather than in the cache (0.5.19's retry
sweep), that method itself is called, on a stand-in for the scheduler holding only the fields it
reads.

=================  ======================================  ======================================
call               ``plan`` (0.5.19)                       ``prepare`` (0.5.20 and later)
=================  ======================================  ======================================
request key        the rid                                 ``CacheRequestHandle(rid, 0)``
issue              ``prefetch_from_storage`` (pins at      the same, with the retry book's
                   issue when the anchor lock is on)       ``storage_hit_end`` (pins at commit)
admission plan     ``plan_staged_splice(rid, prefix)``     ``prepare_staged_prefetch(req)``
retries            the missed-rid set, swept by            ``StoragePrefetchRetries.pop_ready``
                   ``Scheduler._retry_missed_storage_
                   prefetches`` each pass
loaded tokens      ``pop_prefetch_loaded_tokens``          ``pop_prefetch_loaded_span``
after admission    nothing                                 ``finish_storage_prefetch_admission``
anchor lock        opt-in, ``SGLANG_ENABLE_HICACHE_        on; a cap of 0 turns it off
                   BUFFER_ANCHOR_LOCK``
=================  ======================================  ======================================

What differs between releases of one generation (the ``timeout`` clock, a backup on request) is
declared per release in :mod:`.releases` and read from :attr:`~.pipeline_driver.SteppedSGLang.
release`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...integrations.sglang.tree import (
    device_prefix_indices,
    device_prefix_len,
    match_counts_tokens,
)
from . import require
from .pipeline_driver import Request, SteppedSGLang, retry_settings

Due = tuple[str, int | None]
"""A retry due now: ``(rid, storage_hit_end)`` (0.5.19's is always None)."""


@dataclass
class _WaitingReq:
    """The retry fields 0.5.19's ``Req`` carries (``schedule_batch.py``), at their defaults."""

    rid: str
    storage_prefetch_retry_pending: bool = False
    storage_prefetch_retry_wait_polls: int = 0
    storage_prefetch_retry_attempts: int = 0


@dataclass
class _SchedulerFields:
    """What ``Scheduler._retry_missed_storage_prefetches`` reads of its scheduler."""

    tree_cache: Any
    waiting_queue: list[_WaitingReq]
    due: list[str] = field(default_factory=list)

    def _prefetch_kvcache(self, req: _WaitingReq) -> None:
        self.due.append(req.rid)  # the driver re-issues it, as the scheduler's method would


@dataclass
class PlanDriver(SteppedSGLang):
    """0.5.19: PR #36834 as merged."""

    waiting: dict[str, _WaitingReq] = field(default_factory=dict)

    def request_key(self, rid: str) -> Any:
        return rid

    def load_back_rid(self, pending: Any) -> str:
        return str(pending.req_id)

    def issue_extras(self, storage_hit_end: int | None) -> dict[str, Any]:
        return {}  # 0.5.19's retries re-query L3 from the start

    def plan_load(self, req: Any, request: Request, match: Any) -> bool:
        cache = self.consumer.cache
        req.prefix_indices = device_prefix_indices(cache, match)  # as init_next_round_input does
        held, held_swa = cache.plan_staged_splice(request.handle, len(req.prefix_indices))
        if held <= 0:
            return False
        req.host_hit_length = held
        req.swa_host_hit_length = held_swa
        return True

    def forget_retries(self, rid: str) -> None:
        self.waiting.pop(rid, None)

    def _pop_loaded(self, request: Request) -> None:
        self.consumer.cache.pop_prefetch_loaded_tokens(request.handle)

    def close_storage_wait(self, request: Request) -> None:
        """0.5.19's scheduler keeps no storage wait past admission."""

    def anchor_lock_switch(self, envs: Any) -> Any:
        return envs.SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK  # opt-in (deprecated in 0.5.20)

    def retry_budget(self) -> int:
        """0.5.19 retries only missed prefetches, on its pacing: none when that is off."""
        interval, max_attempts = retry_settings()
        return max_attempts if interval > 0 else 0

    def due_retries(self, waiting: Sequence[str]) -> list[Due]:
        """0.5.19's own sweep over the waiting queue (``scheduler.py``)."""
        from sglang.srt.managers.scheduler import Scheduler

        queue = [self.waiting.setdefault(rid, _WaitingReq(rid)) for rid in waiting]
        scheduler = _SchedulerFields(self.consumer.cache, queue)
        Scheduler._retry_missed_storage_prefetches(scheduler)
        return [(rid, None) for rid in scheduler.due]


@dataclass
class PrepareDriver(SteppedSGLang):
    """0.5.20 and later: the rework (pin at the commit, ``prepare_staged_prefetch``)."""

    attempts: Counter[str] = field(default_factory=Counter)

    def request_key(self, rid: str) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        return CacheRequestHandle(rid, 0)

    def load_back_rid(self, pending: Any) -> str:
        return str(pending.request.rid)

    def issue_extras(self, storage_hit_end: int | None) -> dict[str, Any]:
        return {"storage_hit_end": storage_hit_end}

    def plan_load(self, req: Any, request: Request, match: Any) -> bool:
        req.cache_request_handle = request.handle
        # as init_next_round_input leaves them: 0.5.22 and later read the length, 0.5.20 and
        # 0.5.21 the slots
        req.prefix_len = device_prefix_len(match)
        if not match_counts_tokens(match):
            req.prefix_indices = device_prefix_indices(self.consumer.cache, match)
        return bool(self.consumer.cache.buffer_pipeline.prepare_staged_prefetch(req))

    def forget_retries(self, rid: str) -> None:
        self.attempts.pop(rid, None)

    def _pop_loaded(self, request: Request) -> None:
        self.consumer.cache.pop_prefetch_loaded_span(request.handle)

    def close_storage_wait(self, request: Request) -> None:
        """Close the request's storage wait (``finish_storage_prefetch_admission``, from
        ``_account_prefill_cache_admission``); a retracted request's storage hit is left out of
        the metrics (``discard_storage_prefetch_accounting``)."""
        cache = self.consumer.cache
        if request.retracted:
            self.world_loads.leave_out(cache, request.handle)
            cache.discard_storage_prefetch_accounting(request.handle)
            cache.finish_storage_prefetch_admission(request.handle, fulfilled_tokens=0, reason=None)
            return
        self.world_loads.loaded += request.credited_tokens
        cache.finish_storage_prefetch_admission(
            request.handle, fulfilled_tokens=request.loaded_tokens, reason=None
        )

    def anchor_lock_switch(self, envs: Any) -> Any:
        return None  # on by default; a cap of 0 turns it off

    def retry_budget(self) -> int:
        """0.5.20 on: ``max_attempts`` re-issues of any kind; an interval of 0 turns off only
        the paced miss polls (a known hit's deferral is re-issued all the same)."""
        return retry_settings()[1]

    def due_retries(self, waiting: Sequence[str]) -> list[Due]:
        """SGLang's retry book over the waiting queue, with its defaults."""
        interval, max_attempts = retry_settings()
        queue = [_Queued(rid, self.attempts[rid]) for rid in waiting]
        ready = self.consumer.cache.storage_prefetch_retries.pop_ready(
            queue, interval, max_attempts
        )
        due = []
        for queued, hit_end in ready:
            self.attempts[queued.rid] += 1
            due.append((queued.rid, hit_end))
        return due


@dataclass
class _Queued:
    """What 0.5.20's retry book reads of a waiting request."""

    rid: str
    storage_prefetch_retry_attempts: int


DRIVERS: dict[str, type[PlanDriver] | type[PrepareDriver]] = {
    "plan": PlanDriver,
    "prepare": PrepareDriver,
}


def stepped_sglang(**settings: Any) -> SteppedSGLang:
    """The driver of the release this interpreter imports (:func:`~.require`), built with
    ``settings`` (the fields of :class:`~.pipeline_driver.SteppedSGLang`)."""
    return DRIVERS[require().generation](**settings)
