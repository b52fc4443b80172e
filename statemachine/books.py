"""The books of L3 reads: every read settled as spliced from or wasted, and why.

One :class:`ReadBooks` serves every implementation a replay compares (stagefate's pipeline, the
``blind`` policy, SGLang's pipeline driven as a policy), so their wasted reads are counted by the
same rules: a read nothing was spliced from is one wasted read under the reason its prefetch
ended with; of a read that was spliced from, the head a sibling had published is wasted as
``trimmed`` and the tail L3 did not return as ``short_read`` (tokens only). The wasted entries add
up to ``l3_reads_wasted`` and ``l3_read_tokens_wasted``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableMapping


class ReadBooks:
    """Counts into ``counts`` (a pipeline passes its own counters, so :attr:`Stats` shows the
    books; a policy without counters of its own gets a fresh ``Counter``)."""

    def __init__(self, counts: MutableMapping[str, int] | None = None) -> None:
        self.counts: MutableMapping[str, int] = Counter() if counts is None else counts
        self._wasted: dict[str, tuple[int, int]] = {}

    def read(self, tokens: int) -> None:
        """A read of ``tokens`` tokens was launched."""
        self.counts["l3_reads"] += 1
        self.counts["l3_read_tokens"] += tokens

    def spliced(self, tokens: int, trimmed: int) -> None:
        """``tokens`` were spliced from a read whose first ``trimmed`` a sibling had published."""
        self.counts["spliced_tokens"] += tokens
        self.counts["trimmed_tokens"] += trimmed

    def waste(self, reason: str, reads: int, tokens: int) -> None:
        """Settle ``reads`` reads of ``tokens`` tokens as wasted, for ``reason``."""
        if not reads and not tokens:
            return
        self.counts["l3_reads_wasted"] += reads
        self.counts["l3_read_tokens_wasted"] += tokens
        old_reads, old_tokens = self._wasted.get(reason, (0, 0))
        self._wasted[reason] = (old_reads + reads, old_tokens + tokens)

    def settle(self, reason: str, read_tokens: int, spliced_tokens: int, trimmed: int) -> None:
        """A read of ``read_tokens`` whose prefetch ended with ``reason``, ``spliced_tokens`` of
        it spliced after a trimmed head of ``trimmed`` tokens."""
        unspliced = read_tokens - spliced_tokens
        if not spliced_tokens:
            self.waste(reason, 1, unspliced)
            return
        self.waste("trimmed", 0, trimmed)
        self.waste("short_read", 0, unspliced - trimmed)

    def wasted_by_reason(self) -> dict[str, tuple[int, int]]:
        """``{reason: (reads, tokens)}``; sums to the two wasted counters."""
        return dict(self._wasted)

    def replay_counters(self) -> dict[str, int]:
        """The books under the replay's metric names."""
        return replay_counters(self.counts)


def replay_counters(counts: Mapping[str, int]) -> dict[str, int]:
    """The books' counters (a pipeline's ``stats``, or a policy's own books) under the
    replay's metric names."""
    return {
        "l3_reads": counts["l3_reads"],
        "l3_read_tokens": counts["l3_read_tokens"],
        "l3_reads_wasted": counts["l3_reads_wasted"],
        "l3_read_tokens_wasted": counts["l3_read_tokens_wasted"],
        "tokens_spliced": counts["spliced_tokens"],
        "tokens_trimmed": counts["trimmed_tokens"],
    }
