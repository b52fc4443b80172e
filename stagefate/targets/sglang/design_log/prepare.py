"""The design log of the ``prepare`` generation (0.5.20 to 0.5.23), in
``spec/designs/sglang-0.5.23.yaml``'s words.

=========================================  ============================================
SGLang's call, and what it returned          the line
=========================================  ============================================
``prefetch_from_storage``: an operation      ``issue``: ``else`` → querying; none:
in ``ongoing_prefetch`` after it             ``below_threshold`` → released
``try_lock_anchor``: anchor_lost, cap_busy   ``commit``: ``live_match_short`` → released,
                                             ``cap_busy`` → parked
a hit appended to ``pending_hit_allocs``     ``commit``: ``parked_ahead`` → parked, or
with no attempt of its own                   ``rate_limited`` when none is ahead
``prepare_staged_prefetch``, and the hold    ``plan``: ``span_device_resident`` →
it released: through                         released if through
``_resolve_device_covered``, or as shrunk    ``_resolve_device_covered``,
                                             ``prefix_shrank`` if shrunk, else ``else``
``init_load_back``: the hold still staged    ``consume``: ``device_short`` → staged (then
after it (or dropped as device_capacity),    ``release_hold`` if dropped), else ``else``
or a load back in flight                     → consumed
=========================================  ============================================

The rest (the hit, the commit's coverage check and bounce, the read, the ack, releases and
aborts) is :mod:`.observer`'s. 0.5.20 and 0.5.21 release a device-covered hold with no reason
and defer a short device inside ``init_load_back`` (a closure, not 0.5.22's
``defer_staged_admission``): so a release is told device-covered by the call it came through,
and a deferral by the hold ``init_load_back`` leaves behind, the same on all four releases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ....spec.schema import LifecycleSpec
from ....transition_log import TransitionLog
from ..pipeline_driver import SteppedSGLang
from .observer import DesignObserver

_DEVICE_CAPACITY = "device_capacity"
"""The reason SGLang releases a hold with after its last device deferral."""
_DEVICE_COVERED = "device_covered"
"""The reason of a hold released through ``_resolve_device_covered``."""


class PrepareDesignLog(DesignObserver):
    HOST_SHORT = "host_short_for_trimmed"

    def __init__(self, driver: SteppedSGLang, log: TransitionLog, design: LifecycleSpec) -> None:
        super().__init__(driver, log, design)
        self.wrap(self.pipeline, "prepare_staged_prefetch", self._plan)
        self.wrap(self.pipeline, "_resolve_device_covered", self._device_covered)

    def parked_unchecked(self, behind_others: bool) -> str:
        return "parked_ahead" if behind_others else "rate_limited"

    def issued(self) -> tuple[str, str]:
        return "else", "querying"

    def _lock(self, original: Callable[..., Any], request: Any, *args: Any) -> Any:
        result = original(request, *args)
        outcome = result[0]  # (outcome, matched)
        if outcome == "anchor_lost":
            self.commit(request.rid, "live_match_short", "released", "declined_anchor_lost")
        elif outcome == "cap_busy":
            self.commit(request.rid, "cap_busy", "parked")
        return result

    def _plan(self, original: Callable[..., Any], req: Any) -> Any:
        rid = req.cache_request_handle.rid
        if self.states.get(rid) != "staged":
            return original(req)
        result, released, reason = self.released_during(rid, lambda: original(req))
        if reason == _DEVICE_COVERED:
            self.write(rid, "plan", "span_device_resident", "released", reason)
        elif released:
            guard = "prefix_shrank" if reason == "shrunk" else "else"
            self.write(rid, "plan", guard, "released", reason or "released")
        elif req.staged_prefetch_plan is not None:
            self.write(rid, "plan", "else", "staged")
        return result

    def _device_covered(self, original: Callable[..., Any], req: Any, *args: Any) -> Any:
        """The release this call made is device-covered, whatever reason SGLang gave it
        (0.5.20 and 0.5.21 give none)."""
        result = original(req, *args)
        self.name_release(req.cache_request_handle.rid, _DEVICE_COVERED)
        return result

    def _consume(self, original: Callable[..., Any], params: Any) -> Any:
        handle = params.req.cache_request_handle
        rid = handle.rid
        if self.states.get(rid) != "staged":
            return original(params)
        result, _, reason = self.released_during(rid, lambda: original(params))
        dropped = reason == _DEVICE_CAPACITY
        if self.load_back_in_flight(rid):
            self.write(rid, "consume", "else", "consumed")
        elif dropped or self.pipeline.has_staged(handle):
            # deferred for device room; the last deferral drops the hold, which the design
            # writes as the scheduler's release (its deferral is unbounded)
            self.write(rid, "consume", "device_short", "staged")
            if dropped:
                self.write(rid, "release_hold", "else", "released", "released")
        return result
