"""The spec's guards, effects and exits re-stated over the abstract world's positions, one small
function each, next to the pipeline's names (``spec/`` imports no torch and no runtime): what the
model checker runs for each name the spec's rows use."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .model_world import Args, Effect, Exit, Guard, Rec, Violation, _Draft

if TYPE_CHECKING:
    from .modelcheck import ModelChecker

# ---------------------------------------------------------------------- guards over positions


def _read_pages(record: Rec) -> int:
    return min(record.hit, record.span_end - record.matched)


def _owns_page(mc: ModelChecker, other: Rec | None, j: int, i: int, page: int) -> bool:
    """Record ``j`` (not ``i``) owns page ``page`` for in-flight dedup."""
    if j == i or other is None or other.state not in mc.owning:
        return False
    return other.matched <= page < min(other.matched + other.read, other.span_end)


def _hit_end(record: Rec) -> int:
    """Where the pages the existence query found end."""
    return record.matched + _read_pages(record)


def _live_anchor(d: _Draft, record: Rec) -> int:
    """The deepest device position covering the prefix and the hit (SGLang's anchor)."""
    return min(d.device, _hit_end(record))


def _cap_busy(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> bool:
    anchor, cap = _live_anchor(d, r), mc.bounds.cap_pages
    return 0 < anchor <= cap and d.pinned_total() + anchor > cap


def _trimmed_hit(d: _Draft, r: Rec) -> int:
    """Pages of the hit past the live device prefix: what SGLang's bounce must hold."""
    return _hit_end(r) - max(r.matched, _live_anchor(d, r))


def _host_short_for_trimmed(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> bool:
    return d.host_free + a.host_slack < _trimmed_hit(d, r)


def _host_oversize(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> bool:
    return mc.bounds.host_pages < _trimmed_hit(d, r)


def _head_owner(mc: ModelChecker, d: _Draft, i: int, r: Rec) -> int | None:
    """The sibling owning the first page the read would bring (in-flight dedup's head)."""
    if not _read_pages(r):
        return None
    return next((j for j, o in enumerate(d.records) if _owns_page(mc, o, j, i, r.matched)), None)


def _span_inflight(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> bool:
    return _head_owner(mc, d, i, r) is not None


GUARDS: dict[str, Guard] = {
    "below_threshold": lambda mc, d, i, r, a: r.span_end - r.matched < mc.bounds.threshold_pages,
    "root_prefix": lambda mc, d, i, r, a: r.matched == 0,
    "live_match_short": lambda mc, d, i, r, a: d.device < r.matched,
    "over_cap": lambda mc, d, i, r, a: d.pinned_total() + r.matched > mc.bounds.cap_pages,
    "zero_pages": lambda mc, d, i, r, a: a.error or a.tokens == 0,
    "hit_below_threshold": lambda mc, d, i, r, a: a.tokens < mc.bounds.threshold_pages,
    "device_covers_span": lambda mc, d, i, r, a: d.device >= r.span_end,
    "span_inflight": _span_inflight,
    # (only a hit not yet parked asks: the model lets any parked hit be the FIFO's head, since
    # order decides no invariant)
    "parked_ahead": lambda mc, d, i, r, a: any(
        o is not None and o.state in mc.waiting_for_room for o in d.records
    ),
    "load_slower_than_compute": lambda mc, d, i, r, a: a.slower,
    "read_outlasts_compute": lambda mc, d, i, r, a: a.slower,
    "span_oversize": lambda mc, d, i, r, a: mc.host_capacity < _read_pages(r),
    "host_short": lambda mc, d, i, r, a: d.host_free + a.host_slack < _read_pages(r),
    "read_empty": lambda mc, d, i, r, a: a.error or a.tokens == 0,
    "prefix_shrank": lambda mc, d, i, r, a: a.prefix < r.matched,
    "span_device_resident": lambda mc, d, i, r, a: a.prefix >= r.span_end,
    "aux_cut": lambda mc, d, i, r, a: False,
    "trim_positive": lambda mc, d, i, r, a: a.prefix > r.matched,
    "plan_stale": lambda mc, d, i, r, a: a.prefix != r.plan,
    "device_short": lambda mc, d, i, r, a: mc.bounds.device_pages - d.device < r.span_end - r.plan,
    "device_fits": lambda mc, d, i, r, a: mc.bounds.device_pages - d.device >= r.span_end - r.plan,
    "copy_failed": lambda mc, d, i, r, a: a.error,
    # SGLang's designs (spec/designs/): the anchor is taken at the commit, past the live prefix
    "cap_busy": _cap_busy,
    # SGLang's prefetch_rate_limited: the bounce pool's use reached 0.9 of its tokens
    # (HICACHE_LOAD_POOL_USAGE_FRACTION in cache_controller.py); in whole pages of many
    # tokens, that is 0.9 of the pages rounded up
    "rate_limited": lambda mc, d, i, r, a: (
        mc.bounds.host_pages - d.host_free >= math.ceil(0.9 * mc.bounds.host_pages)
    ),
    "anchor_lost_within_cap": lambda mc, d, i, r, a: (
        r.pin < 0
        and r.matched > 0
        and d.pinned_total() + r.matched <= mc.bounds.cap_pages
        and d.device < r.matched
    ),
    "device_covers_hit": lambda mc, d, i, r, a: d.device >= _hit_end(r),
    "host_short_for_trimmed": _host_short_for_trimmed,
    "host_oversize": _host_oversize,
}


# ---------------------------------------------------------------------- effects over positions


def _pin_if_possible(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    if r.pin >= 0 or r.matched == 0 or d.device < r.matched:
        return r
    if d.pinned_total() + r.matched > mc.bounds.cap_pages:
        return r
    return r._replace(pin=r.matched, pin_charge=r.matched)


def _pin_if_attached(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    """blind: the anchor stored at issue, pinned if still in the tree (no re-match), charged
    to no cap (blind has none)."""
    if r.matched == 0 or d.device < r.matched:
        return r
    return r._replace(pin=r.matched, pin_charge=0)


def _trim_head(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    """The read starts at the live anchor: a sibling published the head before the commit."""
    anchor, end = _live_anchor(d, r), _hit_end(r)
    return r._replace(matched=anchor, hit=end - anchor)


def _pin_live_anchor(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    """Pin the (trimmed) anchor unless it is the root or larger than the whole cap."""
    if r.matched == 0 or r.matched > mc.bounds.cap_pages:
        return r
    return r._replace(pin=r.matched, pin_charge=r.matched)


def _alloc_bounce(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    pages = _read_pages(r)
    d.host_free -= pages
    return r._replace(bounce=r.bounce + pages)


def _stage_read(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    kept = min(a.tokens, r.bounce)
    d.host_free += r.bounce - kept
    return r._replace(bounce=kept, span_end=r.matched + kept)


def _free_bounce(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    d.host_free += r.bounce
    return r._replace(bounce=0)


def splice(d: _Draft, i: int, base: int, end: int) -> None:
    """Insert pages ``[base, end)``: add-only, so the device must end exactly at ``base``."""
    if end <= base:
        raise Violation(
            "splice_correctness", f"r{i} splices pages [{base}, {end}): nothing, or backwards"
        )
    if d.device != base:
        raise Violation(
            "aux_and_ownership",
            f"add-only insert: r{i} splices pages [{base}, {end}) but the device holds "
            f"{d.device}: it would overwrite a sibling's pages or leave a hole",
        )
    d.device = end


def _insert_tail(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    splice(d, i, r.plan, r.span_end)
    return r


def _wait_for_sibling(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    owner = _head_owner(mc, d, i, r)
    if owner is None:
        raise Violation("dedup_waiters", f"r{i} declined in flight but no sibling owns its head")
    d.waiting_on[i] = owner
    return r


def _live_fields(mc: ModelChecker, record: Rec | None) -> Rec | None:
    """``record`` with the fields no later step reads cleared: after the IO commit nothing
    reads the hit (it sized the read); an orphaned one (an abandoned read) keeps only its
    bounce and its op."""
    if record is None or record.state in mc.pre_commit:
        return record
    if record.state in mc.orphaned:
        return Rec(
            record.state, 0, 0, record.pin, record.pin_charge, bounce=record.bounce, op=record.op
        )
    if record.hit == -1:
        return record
    return record._replace(hit=-1)


EFFECTS: dict[str, Effect] = {
    "pin_anchor": lambda mc, d, i, r, a: r._replace(pin=r.matched, pin_charge=r.matched),
    "pin_if_possible": _pin_if_possible,
    "unpin": lambda mc, d, i, r, a: r._replace(pin=-1, pin_charge=0),
    # a re-issue is always enabled here: the retry's pacing is RetryBook's (tested on its own)
    "arm_retry": lambda mc, d, i, r, a: r,
    "record_hit": lambda mc, d, i, r, a: r._replace(hit=a.tokens),
    "enqueue_parked": lambda mc, d, i, r, a: r,
    "alloc_bounce": _alloc_bounce,
    "launch_read": lambda mc, d, i, r, a: r._replace(read=_read_pages(r), op="read"),
    "stage_read": _stage_read,
    "free_bounce": _free_bounce,
    "record_plan": lambda mc, d, i, r, a: r._replace(plan=a.prefix),
    # the line is the world's only content and its pages up to the plan are the request's live
    # prefix (else plan_stale held): there is nothing else to evict
    "evict_for_splice": lambda mc, d, i, r, a: r,
    "alloc_device": lambda mc, d, i, r, a: r,  # the device pool is `device`: insert_tail grows it
    "queue_h2d": lambda mc, d, i, r, a: r._replace(op="load"),
    "insert_tail": _insert_tail,
    "move_pin": lambda mc, d, i, r, a: r._replace(pin=r.span_end, pin_charge=0),
    "lock_request_prefix": lambda mc, d, i, r, a: r._replace(pin=r.span_end, pin_charge=0),
    "wait_for_sibling": _wait_for_sibling,
    "trim_head": _trim_head,
    "pin_live_anchor": _pin_live_anchor,
    "defer_admission": lambda mc, d, i, r, a: r,  # the hold stays for a later pass
    # blind (spec/designs/blind.yaml): the issue step submits the query (op "exists")
    "launch_query": lambda mc, d, i, r, a: r,
    "pin_if_attached": _pin_if_attached,
}


def _wake_waiters(mc: ModelChecker, d: _Draft, i: int) -> None:
    """Record ``i`` gave up its span's page keys: whoever waited on it is due at once."""
    d.woke = True
    for waiter, sibling in enumerate(d.waiting_on):
        if sibling == i:
            d.waiting_on[waiter] = -1  # its retry (armed) is due at once


EXITS: dict[str, Exit] = {
    # the model keeps no FIFO: any parked hit may be the head (witnesses keep its place)
    "leave_parked_fifo": lambda mc, d, i: None,
    "disown_span": _wake_waiters,
}
