"""Lockstep, verified every pass: what each rank fired, and the facts the ranks act on, agreed.

Each rank folds every transition it fires (request, event, target) into a 63-bit rolling digest
and keeps the last :attr:`Lockstep.RING` of them. At the start of each pass the ranks agree on
a fixed header: the digest, the number of transitions fired and the number of operations in
flight, each with MIN and MAX (a MAX travels as the MIN of the negated value, so one all-reduce
carries both). Equal MIN and MAX mean the ranks fired the same transitions; otherwise they
gather their rings and :class:`~.errors.LockstepError` names, for each rank, the first
transition where they differ, where SGLang's ranks would hang in the next collective. The
header also fixes the length of the pass's second all-reduce, the facts
(:meth:`Lockstep.agree_facts`): ranks out of step never enter a collective of another size (on
gloo, "Received data size doesn't match", SGLang #39267).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Sequence, Set
from typing import cast

from ..runtime import Completion
from .errors import LockstepError
from .group import Group
from .speeds import SpeedEstimate

_MASK = (1 << 63) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15 & _MASK

Transition = tuple[int, str, str, str]
"""(ordinal, request, event, target) of one fired transition."""


def negated(values: Sequence[int]) -> list[int]:
    """What a MAX is sent as inside a MIN all-reduce (and read back with the same function)."""
    return [-v for v in values]


class Lockstep:
    """One rank's record of what it fired, checked against the other ranks each pass."""

    RING = 64

    def __init__(self, group: Group) -> None:
        self.group = group
        self.digest = 0
        self.fired = 0
        self.ring: deque[Transition] = deque(maxlen=self.RING)

    def record(self, request: str, event: str, target: str) -> None:
        """Fold one fired transition into the digest and keep it in the ring."""
        self.fired += 1
        step = zlib.crc32(f"{request}\0{event}\0{target}".encode())
        self.digest = (self.digest * _MULTIPLIER + step + 1) & _MASK
        self.ring.append((self.fired, request, event, target))

    def _same_everywhere(self, values: Sequence[int]) -> bool:
        """Whether every rank holds ``values``: their MIN and MAX in one all-reduce."""
        agreed = self.group.all_reduce_min([*values, *negated(values)])
        return agreed[: len(values)] == negated(agreed[len(values) :])

    def agree_config(self, fingerprint: int) -> None:
        """Every rank was built with the same configuration (its rank aside)."""
        if not self._same_everywhere([fingerprint]):
            raise ValueError(
                f"rank {self.group.rank}: the tensor-parallel ranks were built with different "
                "PipelineConfigs (only tp_rank and device may differ); build every rank's "
                "pipeline from one config with tp_rank set per rank"
            )

    def agree_header(self, in_flight: int) -> None:
        """Raise :class:`LockstepError` unless every rank fired the same transitions."""
        if not self._same_everywhere([self.digest, self.fired, in_flight]):
            self._raise_divergence()

    def agree_facts(self, facts: Sequence[int]) -> list[int]:
        """The element-wise MIN of every rank's facts (their length agreed by the header)."""
        return self.group.all_reduce_min(facts)

    def _raise_divergence(self) -> None:
        gathered = cast(
            "list[tuple[int, list[Transition]]]",
            self.group.all_gather((self.fired, list(self.ring))),
        )
        by_rank = [{entry[0]: entry for entry in ring} for _fired, ring in gathered]
        fired = [count for count, _ring in gathered]
        oldest = max(
            min(ring, default=count + 1) for ring, count in zip(by_rank, fired, strict=True)
        )
        newest = max(fired)
        for ordinal in range(oldest, newest + 1):
            seen = [ring.get(ordinal) for ring in by_rank]
            if len({entry[1:] if entry else None for entry in seen}) > 1:
                lines = "; ".join(
                    f"rank {rank}: "
                    + (f"{e[1]} {e[2]} -> {e[3]}" if e else "nothing (it fired fewer)")
                    for rank, e in enumerate(seen)
                )
                raise LockstepError(
                    f"tensor-parallel ranks out of lockstep at transition #{ordinal}: {lines}. "
                    "A rank acted on a fact the others did not agree: every rank-local fact "
                    "(L3 hits, reads, host room) must go through the pass's agreement "
                    "(docs/tensor-parallel.md)"
                )
        raise LockstepError(
            f"tensor-parallel ranks out of lockstep (transitions fired, by rank: {fired}); "
            f"the first difference is older than the last {self.RING} transitions each keeps"
        )


class RankAgreement:
    """The pass's agreement on one rank: completions are acted on only once every rank has them.

    A completion drained here waits until every rank has drained its own; it is then acted on
    with what the ranks agreed: the fewest tokens any rank's operation brought (an L3 page one
    rank lacks, a short read), failed if it failed anywhere, its sliding window complete only if
    complete everywhere. The bounce room every rank has is agreed too (the smallest), as the
    slack :meth:`completions` leaves in :attr:`host_slack` for the commit's ``host_short``, and
    so is the speed estimate the commit's ``load_slower_than_compute`` reads (each cost the
    smallest any rank measured; unknown where any rank has not measured it), in
    :attr:`estimate`, and the reads in flight that every rank found overdue (run longer than
    computing their tokens takes there), which ``read_outlasts_compute`` reads, in
    :attr:`overdue`.
    """

    FACTS_PER_OP = 5

    def __init__(self, group: Group) -> None:
        self.lockstep = Lockstep(group)
        self._local: dict[int, Completion] = {}
        self.host_slack = [0, 0]
        """Agreed minus this rank's own free bounce (main, aux) at the pass's start; at most 0."""
        self.estimate = SpeedEstimate()
        """The speed estimate the ranks agreed at the pass's start."""
        self.overdue: frozenset[int] = frozenset()
        """The reads in flight every rank found overdue at the pass's start, by op id."""

    def completions(
        self,
        drained: Sequence[Completion],
        in_flight: Sequence[int],
        room: Sequence[int],
        estimate: SpeedEstimate,
        overdue: Set[int] = frozenset(),
    ) -> list[Completion]:
        """What to act on this pass: stale completions (their operation ended everywhere in
        lockstep, counted by the caller) and the agreed ones, in operation order."""
        local = self._local
        for completion in drained:
            local[completion.op_id] = completion
        live = set(in_flight)
        out = [local.pop(op_id) for op_id in [op for op in local if op not in live]]
        self.lockstep.agree_header(len(in_flight))
        speeds = estimate.as_facts()
        facts = [*room, *speeds]
        for op_id in in_flight:
            mine = local.get(op_id)
            late = int(op_id in overdue)
            if mine is None:
                facts += [0, 0, 0, 0, late]
            else:
                failed = -1 if mine.error is not None else 0
                facts += [1, mine.tokens, failed, int(mine.aux_complete), late]
        agreed = self.lockstep.agree_facts(facts)
        self.host_slack = [a - r for a, r in zip(agreed[: len(room)], room, strict=True)]
        base = len(room) + len(speeds)
        self.estimate = SpeedEstimate.of_facts(agreed[len(room) : base])
        late_everywhere = []
        for index, op_id in enumerate(in_flight):
            at = base + index * self.FACTS_PER_OP
            done, tokens, failed, aux_complete, late = agreed[at : at + self.FACTS_PER_OP]
            if late:
                late_everywhere.append(op_id)
            if not done:
                continue
            mine = local.pop(op_id)
            error = mine.error or ("failed on another rank" if failed else None)
            out.append(
                Completion(op_id, mine.kind, tokens, bool(aux_complete), error, mine.seconds)
            )
        self.overdue = frozenset(late_everywhere)
        return out
