"""Written by `python -m stagefate.spec.codegen` from spec/lifecycle.yaml:
the spec's names as types. Do not edit."""

from __future__ import annotations

from typing import Literal

StateName = Literal[
    "issued",
    "locked",
    "no_anchor",
    "cap_skip",
    "anchor_lost",
    "parked",
    "reading",
    "abandoned",
    "outrun",
    "staged",
    "trimmed",
    "consumed",
    "released",
]
"""Every state of the lifecycle."""

LiveStateName = Literal[
    "issued",
    "locked",
    "no_anchor",
    "cap_skip",
    "anchor_lost",
    "parked",
    "reading",
    "abandoned",
    "outrun",
    "staged",
    "trimmed",
    "consumed",
]
"""The states a record lives in (not terminal)."""

LockableState = Literal["locked", "no_anchor", "cap_skip", "anchor_lost"]
"""The ``lockable`` group: the anchor lock may be tried again (try_lock_anchor) and the storage
hit may arrive."""

PreCommitState = Literal["issued", "locked", "no_anchor", "cap_skip", "anchor_lost", "parked"]
"""The ``pre_commit`` group: before the IO commit; nothing allocated, nothing read, so an abort
ends the record at once."""

PendingState = Literal[
    "issued",
    "locked",
    "no_anchor",
    "cap_skip",
    "anchor_lost",
    "parked",
    "reading",
]
"""The ``pending`` group: the prefetch is still on its way (prefetch_pending is True): a
scheduler admitting the request now would admit it without what the prefetch brings."""

OwningState = Literal["reading", "staged", "trimmed", "consumed"]
"""The ``owning`` group: the record owns its span's page keys for in-flight dedup."""

HoldState = Literal["staged", "trimmed"]
"""The ``hold`` group: a staged hold the scheduler may plan, consume or release."""

WaitingForRoomState = Literal["parked"]
"""The ``waiting_for_room`` group: a hit waiting in the FIFO of parked hits for bounce room
(parked_ahead asks whether one is; leaving it leaves the FIFO)."""

OrphanedState = Literal["abandoned", "outrun"]
"""The ``orphaned`` group: its request no longer waits for the read (aborted, or computing
instead): only the bounce and the read in flight are left, freed when the read completes."""

SplicedState = Literal["consumed"]
"""The ``spliced`` group: spliced into the device pool and the tree; the H2D copy of the tail is
in flight."""

EventName = Literal[
    "lock",
    "hit",
    "commit",
    "read_done",
    "plan",
    "make_room",
    "consume",
    "ack",
    "abort",
    "give_up",
    "release_hold",
]
"""Every event."""

ExitName = Literal["leave_parked_fifo", "disown_span"]
"""Every exit (run on a move out of a group)."""

ReasonName = Literal[
    "declined_too_short",
    "revoked_full_miss",
    "revoked_insufficient",
    "declined_anchor_lost",
    "declined_device_covered",
    "declined_inflight",
    "declined_host_oversize",
    "declined_slower_than_compute",
    "discarded",
    "shrunk",
    "device_covered",
    "aux_cut",
    "dropped",
    "device_capacity",
    "filled",
    "load_failed",
    "aborted",
    "outrun_by_compute",
    "released",
]
"""Every reason a record ends with."""

CounterName = Literal[
    "attempts",
    "issued",
    "locked",
    "no_anchor",
    "cap_skip",
    "anchor_lost",
    "parked",
    "staged",
    "released_unusable",
    "trimmed_tokens",
    "spliced_tokens",
    "stale_completions",
    "retries_armed",
    "retries_exhausted",
    "l3_reads",
    "l3_read_tokens",
    "l3_reads_wasted",
    "l3_read_tokens_wasted",
    "declined_too_short",
    "revoked_full_miss",
    "revoked_insufficient",
    "declined_anchor_lost",
    "declined_device_covered",
    "declined_inflight",
    "declined_host_oversize",
    "declined_slower_than_compute",
    "discarded",
    "shrunk",
    "device_covered",
    "aux_cut",
    "dropped",
    "device_capacity",
    "filled",
    "load_failed",
    "aborted",
    "outrun_by_compute",
    "released",
]
"""Every counter (the declared, then one per reason)."""
