"""Written by `python -m stagefate.spec.codegen` from spec/lifecycle.yaml:
a pipeline's counters, one field per counter and per reason. Do not edit."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Stats(BaseModel):
    """Outcome counters of a pipeline (a snapshot): the spec's counters, then one per
    reason (each end counts itself)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    # counters
    attempts: int = 0
    """prefetch_from_storage calls, a live request id's included"""
    issued: int = 0
    """records that passed prefetch_threshold at issue (all but the too short)"""
    locked: int = 0
    """lock attempts that pinned the anchor"""
    no_anchor: int = 0
    """records issued against the root (nothing to pin)"""
    cap_skip: int = 0
    """lock attempts refused by the anchor-lock cap"""
    anchor_lost: int = 0
    """lock attempts that found the live match shorter than matched_len"""
    parked: int = 0
    """IO commits that found the host pool short and parked the hit"""
    staged: int = 0
    """reads that completed with something to hold"""
    released_unusable: int = 0
    """holds released at the plan (shrunk, device_covered, aux_cut)"""
    trimmed_tokens: int = 0
    """heads not spliced because a sibling had published them"""
    spliced_tokens: int = 0
    """tokens spliced into the device pool"""
    stale_completions: int = 0
    """IO completions dropped because their record ended or moved on"""
    retries_armed: int = 0
    """paced retries armed"""
    retries_exhausted: int = 0
    """retries refused because the request used its attempts"""
    l3_reads: int = 0
    """L3 reads launched into the bounce"""
    l3_read_tokens: int = 0
    """tokens those reads asked for"""
    l3_reads_wasted: int = 0
    """settled reads nothing was spliced from"""
    l3_read_tokens_wasted: int = 0
    """tokens read and not spliced (trimmed heads, short tails, discarded holds)"""
    # ends, one per reason
    declined_too_short: int = 0
    """records that ended declined_too_short: the span was below prefetch_threshold at issue"""
    revoked_full_miss: int = 0
    """records that ended revoked_full_miss: storage held no page of the span"""
    revoked_insufficient: int = 0
    """records that ended revoked_insufficient: storage held fewer tokens than the threshold"""
    declined_anchor_lost: int = 0
    """records that ended declined_anchor_lost: the IO commit found the anchor gone"""
    declined_device_covered: int = 0
    """records that ended declined_device_covered: the IO commit found the span already on the
    device"""
    declined_inflight: int = 0
    """records that ended declined_inflight: the IO commit found a live sibling already fetching
    the span's head"""
    declined_host_oversize: int = 0
    """records that ended declined_host_oversize: the IO commit found the hit larger than the
    whole host pool"""
    declined_slower_than_compute: int = 0
    """records that ended declined_slower_than_compute: the issue (for the whole span) or the IO
    commit (for the hit) estimated the load slower than computing those tokens"""
    discarded: int = 0
    """records that ended discarded: the read brought nothing usable"""
    shrunk: int = 0
    """records that ended shrunk: the device prefix shrank below matched_len before admission"""
    device_covered: int = 0
    """records that ended device_covered: the span became device-resident before admission"""
    aux_cut: int = 0
    """records that ended aux_cut: a trim would cut into the aux window"""
    dropped: int = 0
    """records that ended dropped: the live prefix changed between plan and consume"""
    device_capacity: int = 0
    """records that ended device_capacity: the device pool could not hold the splice"""
    filled: int = 0
    """records that ended filled: the tail was spliced and its copy acknowledged"""
    load_failed: int = 0
    """records that ended load_failed: the tail was spliced but its copy failed: the engine
    recomputes those tokens into the same slots before anything reads them (vLLM's recompute
    policy), or fails the request"""
    aborted: int = 0
    """records that ended aborted: the request was aborted"""
    outrun_by_compute: int = 0
    """records that ended outrun_by_compute: its request stopped waiting for the read (it had run
    as long as computing would take) and computed those tokens; the read, when it landed, was
    freed unused"""
    released: int = 0
    """records that ended released: the scheduler released the staged hold"""
