"""The design log of the ``plan`` generation (0.5.19, PR #36834 as merged), in the words of
``spec/designs/sglang-0.5.19.yaml`` (the anchor lock off, its default) or
``sglang-0.5.19-anchor-lock.yaml`` (``SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK=1``).

=========================================  ============================================
SGLang's call, and what it returned          the line
=========================================  ============================================
``prefetch_from_storage``: no operation      ``lock``: ``below_threshold`` → released
after it; else the ``try_lock_anchor`` it    ``lock``: lock off: ``else`` → no_anchor; on:
made at once: no_anchor, cap_skip,           ``root_prefix`` → no_anchor, ``over_cap`` →
anchor_lost, locked                          cap_skip, ``live_match_short`` → anchor_lost,
                                             ``else`` → locked
``try_lock_anchor`` at the commit:           ``commit``: ``anchor_lost_within_cap`` →
anchor_lost                                  released
a hit appended to ``pending_hit_allocs``     ``commit``: ``host_short`` → parked (the
with no attempt of its own                   load-saturation gate, which the design counts
                                             as bounce room short)
``plan_staged_splice``: the hold released    ``plan``: ``prefix_shrank`` → released if the
(its splice is 0)                            prefix it was given is below the hold's
                                             matched_len, else ``span_device_resident``
its splice tokens                            ``trim_positive`` → trimmed when fewer than
                                             the hold's, else ``else`` → staged
``init_load_back``: whether it called        ``make_room``: ``plan_stale`` (dropped before
``evict_for_alloc`` and                      either), ``device_fits`` (no eviction),
``cache_controller.load``, and a load back   ``else``; ``consume``: ``else`` → consumed,
in flight after it                           ``device_short`` → released if dropped after
                                             either, ``plan_stale`` if before
=========================================  ============================================

SGLang's ``plan_staged_splice`` releases a shrunk hold and a device-resident one with one call
and no reason (``staged_splice_tokens`` is 0 for both); the line tells them apart by the two
values SGLang compared, the device prefix it was given and the hold's ``matched_len``. Its
``init_load_back`` drops a hold with one closure for every cause; the line tells a stale plan
(the live pre-check, before any eviction or allocation) from a short device (after them) by
which of SGLang's calls the drop came after. The rest is :mod:`.observer`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ....spec.schema import LifecycleSpec
from ....transition_log import TransitionLog
from ..pipeline_driver import SteppedSGLang
from .observer import DesignObserver

_LOCK_AT_ISSUE = {
    "no_anchor": ("root_prefix", "no_anchor"),
    "cap_skip": ("over_cap", "cap_skip"),
    "anchor_lost": ("live_match_short", "anchor_lost"),
    "locked": ("else", "locked"),
}
"""``try_lock_anchor``'s outcome at issue, with the anchor lock on: the ``lock`` branch."""


class PlanDesignLog(DesignObserver):
    HOST_SHORT = "host_short"

    def __init__(self, driver: SteppedSGLang, log: TransitionLog, design: LifecycleSpec) -> None:
        super().__init__(driver, log, design)
        self.lock_on = bool(self.pipeline.anchor_lock_enabled)
        self._issued_lock: str | None = None
        """``try_lock_anchor``'s outcome inside the ``prefetch_from_storage`` in progress."""
        self._device_calls: set[str] = set()
        """SGLang's device calls the ``init_load_back`` in progress made."""
        cache = driver.consumer.cache
        self.wrap(self.pipeline, "plan_staged_splice", self._plan)
        self.wrap(cache, "evict_for_alloc", self._device_call("evict_for_alloc"))
        self.wrap(cache.cache_controller, "load", self._device_call("load"))

    def parked_unchecked(self, behind_others: bool) -> str:
        return self.HOST_SHORT

    def issued(self) -> tuple[str, str]:
        if not self.lock_on:
            return "else", "no_anchor"
        outcome, self._issued_lock = self._issued_lock, None
        return _LOCK_AT_ISSUE[outcome or "no_anchor"]

    def _lock(self, original: Callable[..., Any], rid: str, *args: Any) -> Any:
        outcome = original(rid, *args)
        if self._inside == "issue":
            self._issued_lock = outcome
        elif outcome == "anchor_lost":  # the commit's second chance found the base gone
            self.commit(rid, "anchor_lost_within_cap", "released", "declined_anchor_lost")
        return outcome

    def _plan(self, original: Callable[..., Any], rid: str, device_prefix_len: int) -> Any:
        hold = self.pipeline.staged_prefetches.get(rid)
        if self.states.get(rid) not in self.holds or hold is None:
            return original(rid, device_prefix_len)
        result, released, _ = self.released_during(rid, lambda: original(rid, device_prefix_len))
        if released:
            if device_prefix_len < hold.matched_len:
                self.write(rid, "plan", "prefix_shrank", "released", "shrunk")
            else:
                self.write(rid, "plan", "span_device_resident", "released", "device_covered")
        elif result[0] < hold.num_tokens:
            self.write(rid, "plan", "trim_positive", "trimmed")
        else:
            self.write(rid, "plan", "else", "staged")
        return result

    def _device_call(self, name: str) -> Callable[..., Any]:
        def observed(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if self._inside == "consume":
                self._device_calls.add(name)
            return original(*args, **kwargs)

        return observed

    def _consume(self, original: Callable[..., Any], params: Any) -> Any:
        rid = params.req.rid
        if self.states.get(rid) not in self.holds:
            return original(params)
        self._device_calls.clear()
        with self.during("consume"):
            result = original(params)
        if not self._device_calls:  # dropped by the live pre-check, before either
            self.write(rid, "make_room", "plan_stale", self.states[rid])
            self.write(rid, "consume", "plan_stale", "released", "dropped")
            return result
        evicted = "evict_for_alloc" in self._device_calls
        self.write(rid, "make_room", "else" if evicted else "device_fits", self.states[rid])
        if self.load_back_in_flight(rid):
            self.write(rid, "consume", "else", "consumed")
        else:
            self.write(rid, "consume", "device_short", "released", "device_capacity")
        return result
