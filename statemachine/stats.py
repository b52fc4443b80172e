"""Outcome counters of a pipeline, as a pydantic model (a snapshot of the pipeline's dict)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Stats(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # calls and issue-time outcomes
    attempts: int = 0
    issued: int = 0
    declined_too_short: int = 0
    locked: int = 0
    no_anchor: int = 0
    cap_skip: int = 0
    anchor_lost: int = 0
    # IO commit and hit verdicts
    declined_anchor_lost: int = 0
    declined_device_covered: int = 0
    declined_inflight: int = 0
    revoked_full_miss: int = 0
    revoked_insufficient: int = 0
    parked: int = 0
    # reads, plans and splices
    staged: int = 0
    discarded: int = 0
    trimmed_tokens: int = 0
    spliced_tokens: int = 0
    released_unusable: int = 0
    shrunk: int = 0
    device_covered: int = 0
    aux_cut: int = 0
    dropped: int = 0
    device_capacity: int = 0
    # ends
    filled: int = 0
    aborted: int = 0
    released: int = 0
    # bookkeeping
    stale_completions: int = 0
    retries_armed: int = 0
    retries_exhausted: int = 0
    l3_reads: int = 0
    l3_read_tokens: int = 0
    # settled when a record ends: reads nothing was spliced from, and tokens read but not spliced
    # (a trimmed head, a short read's missing tail, a discarded hold)
    l3_reads_wasted: int = 0
    l3_read_tokens_wasted: int = 0
