"""Why each policy read what it read: its prefetches counted from issue to admission.

The engine counts what it sees of every policy alike (issues at arrival and again, admissions
that spliced, waits let go); each policy adds what it decided before or instead of a read, in
its own words (:meth:`~.policy.Policy.declines`). A difference in reads between two policies is
traced in the JSON without a rerun (docs/replay.md, "Why each policy read what it read")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict


class PrefetchCounts(BaseModel):
    """The ``prefetches`` block of ``stagefate replay --json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    issued: int
    """Prefetches issued at arrival, one a request (the policy may decline one at once: too
    short a span, in :attr:`declined`)."""
    retried: int
    """Issued again by the policy's own retries (a span not in L3 yet, or declined for a cause
    that may pass)."""
    timed_out: int
    """Requests admitted while their prefetch was still on its way: the timeout's deadline
    passed (under ``best_effort``, at once); the read is abandoned."""
    hit: int
    """Admissions that spliced tokens read from L3."""
    declined: dict[str, int]
    """Prefetches the policy ended before or instead of a read, by its own reason: live's and
    SGLang's counters (``declined_too_short``, ``declined_inflight``: waited on a sibling's read,
    ``revoked_full_miss``: not in L3, …), blind's drop reasons."""

    @classmethod
    def of(cls, engine: Mapping[str, int], declined: Mapping[str, int]) -> PrefetchCounts:
        return cls(**engine, declined={k: v for k, v in sorted(declined.items()) if v})

    @classmethod
    def total(cls, counts: list[PrefetchCounts]) -> PrefetchCounts:
        """Several instances' counts added up."""
        declined: Counter[str] = Counter()
        for each in counts:
            declined.update(each.declined)
        return cls(
            issued=sum(c.issued for c in counts),
            retried=sum(c.retried for c in counts),
            timed_out=sum(c.timed_out for c in counts),
            hit=sum(c.hit for c in counts),
            declined=dict(sorted(declined.items())),
        )


def declined_and_revoked(counters: Mapping[str, float]) -> dict[str, int]:
    """The ``declined_*`` and ``revoked_*`` counters of a pipeline's book (live's
    :class:`~stagefate.statemachine.stats.Stats` and SGLang's ``_prefetch_outcome_stats`` name
    them alike)."""
    return {
        name: int(value)
        for name, value in counters.items()
        if name.startswith(("declined_", "revoked_"))
    }
