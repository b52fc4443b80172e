"""Model checking tensor-parallel ranks: one abstract world per rank, L3 adversarial per rank.

Theory of operation
-------------------
Under tensor parallelism every rank runs the lifecycle over its own shard: its own tree (kept
identical by the engine, which schedules the same batch everywhere), its own bounce pool and its
own L3 keys. The ranks stay in lockstep only if every fact one rank may see differently from
another is agreed before any guard reads it (docs/tensor-parallel.md). This checker makes that
claim exhaustive over the small world of :mod:`.modelcheck`:

* a state is one :mod:`.modelcheck` state per rank, plus the completions each rank has drained
  that not every rank has yet;
* the scheduler's steps and the tree's (issue, lock, the IO commit, plan, consume, release,
  abort, evict, publish) run on every rank at once, as the engine issues them;
* L3 is adversarial **per rank**: each rank's existence query or read finds any prefix of what
  it asked (all, none, an error, any number of pages between), independently of the others,
  and each rank drains its completion at its own time (a late rank is any interleaving in
  which others act first);
* when the last rank has drained an operation, every rank fires it with what
  :class:`Agreement` makes of the ranks' outcomes (the pipeline's: the fewest pages any rank
  found, failed if any failed); the IO commit's ``host_short`` reads the room the ranks agreed
  (the smallest), and the last rank's bounce pool can be made fuller than the others'.

After every step each rank's own invariants (docs/design.md §4, as :mod:`.modelcheck` checks
them, against that rank's bounce capacity) and **lockstep** are checked: every rank holds the
same records, the same device prefix and the same waits; and, where a read's agreed outcome is
acted on, **rank_bytes**: no rank stages more of a read than its own read brought (bytes are not
modelled, so this is where a rank would splice pages its shard lacks). A planted agreement that
lets a rank act on its own outcome fails lockstep; one that reduces with MAX keeps the ranks in
lockstep and fails rank_bytes; each with a shortest counterexample.

One :class:`~.modelcheck.ModelChecker` serves every rank: its steps are pure functions of a
rank's state tuple (a rank's bounce capacity is read only by the conservation check), so its
memo and its numbering of slots are shared, and two ranks in lockstep hold equal tuples.
Timeouts are not modelled (the abstract world has no clock); the stateful rank fuzzer covers
them (docs/fuzzing.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

from .model_world import Bounds, Edge, Slot, State, Step, Violation
from .modelcheck import ModelChecker, Result
from .schema import COMPLETION_KINDS, LifecycleSpec
from .search import Search, attempts, breadth_first

FAILED = -1
"""A rank's outcome when its operation failed (outcomes are pages found otherwise)."""
UNDRAINED = -2
"""No outcome drained yet on that rank."""
RANK_BOUNDS = Bounds(pages=5, requests=2, host_pages=3, device_pages=4, cap_pages=2)
"""The rank world's defaults (``stagefate check --ranks 2``): every modelled edge reached in
under a minute; each rank's outcomes multiply the single world's branching, so a third
request is left to the one-rank check (docs/tensor-parallel.md has the figures)."""


class Agreement:
    """What each rank acts on, from every rank's rank-local fact: SGLang's reductions, as
    :class:`~stagefate.statemachine.lockstep.RankAgreement` applies them. Planted bugs
    override a method."""

    def outcome(self, rank: int, outcomes: Sequence[int]) -> int:
        """Pages ``rank`` acts on (:data:`FAILED` sorts below every count): the MIN."""
        return min(outcomes)

    def room(self, rank: int, free: Sequence[int]) -> int:
        """Free bounce pages ``rank``'s IO commit may count on: the MIN."""
        return min(free)


class RankStep(NamedTuple):
    """``step`` on every rank (``rank`` -1), or one rank draining its completion ``step``."""

    rank: int
    step: Step


class RankModelChecker:
    """:mod:`.modelcheck`'s world, once per rank, with the ranks' facts agreed."""

    def __init__(
        self,
        spec: LifecycleSpec,
        bounds: Bounds | None = None,
        ranks: int = 2,
        fuller_host: int = 1,
        agreement: Agreement | None = None,
    ) -> None:
        bounds = bounds or Bounds()
        if ranks < 2:
            raise ValueError(f"ranks={ranks}: the rank model needs 2 or more; use ModelChecker")
        if not 0 <= fuller_host <= bounds.host_pages:
            raise ValueError(
                f"fuller_host={fuller_host}: the last rank's pool can lack 0 to "
                f"{bounds.host_pages} of its {bounds.host_pages} host pages"
            )
        self.model = ModelChecker(spec, bounds)
        self.bounds = bounds
        self.ranks = ranks
        self.agreement = agreement or Agreement()
        self.host_pages = [bounds.host_pages] * (ranks - 1) + [bounds.host_pages - fuller_host]
        self._width = 2 + bounds.requests
        """Length of one rank's state; the drained outcomes follow the last rank's."""

    # ------------------------------------------------------------------ states

    def initial(self) -> State:
        first = self.model.initial()
        parts = [(first[0], pages, *first[2:]) for pages in self.host_pages]
        undrained = (UNDRAINED,) * (self.bounds.requests * self.ranks)
        return tuple(value for part in parts for value in part) + undrained

    def rank_state(self, state: State, rank: int) -> State:
        return state[rank * self._width : (rank + 1) * self._width]

    # ------------------------------------------------------------------ steps

    def actions(self, state: State) -> list[RankStep]:
        """Rank 0's actions, every rank at once, but a completion: one per rank yet to drain."""
        out: list[RankStep] = []
        drained = state[self.ranks * self._width :]
        for step in self.model.actions(self.rank_state(state, 0)):
            if step.kind not in COMPLETION_KINDS:
                out.append(RankStep(-1, step))
                continue
            at = step.request * self.ranks
            out += [
                RankStep(rank, step)
                for rank in range(self.ranks)
                if drained[at + rank] == UNDRAINED
            ]
        return out

    def successor(self, state: State, taken: RankStep, edges: set[Edge]) -> State:
        parts = [self.rank_state(state, rank) for rank in range(self.ranks)]
        drained = state[self.ranks * self._width :]
        rank, step = taken
        if rank < 0:
            free = [part[1] for part in parts]
            parts = [
                self.model.successor(part, self._on_rank(step, r, free), edges)
                for r, part in enumerate(parts)
            ]
            drained = self._forget_ended(parts[0], drained)
        else:
            at = step.request * self.ranks
            outcomes = list(drained[at : at + self.ranks])
            outcomes[rank] = self._outcome(parts[rank], step)
            if UNDRAINED in outcomes:
                agreed = tuple(outcomes)
            else:
                parts = [
                    self.model.successor(part, self._agreed(step, r, outcomes), edges)
                    for r, part in enumerate(parts)
                ]
                agreed = (UNDRAINED,) * self.ranks
            drained = drained[:at] + agreed + drained[at + self.ranks :]
        joined = drained
        for part in reversed(parts):
            joined = part + joined
        return joined

    def _on_rank(self, step: Step, rank: int, free: list[int]) -> Step:
        """The IO commit on ``rank`` counts the agreed room (its slack below its own)."""
        if step.what != "commit":
            return step
        return step._replace(slack=self.agreement.room(rank, free) - free[rank])

    def _outcome(self, part: State, step: Step) -> int:
        """What one rank's completion ``step`` found, as pages (:data:`FAILED` for an error)."""
        if step.what == "error":
            return FAILED
        if step.what == "short":
            return step.pages
        record = self.model.decode(part).slots[step.request].record
        assert record is not None and record.op == step.kind
        return {"exists": record.span_end - record.matched, "read": record.read}.get(step.kind, 0)

    def _agreed(self, step: Step, rank: int, outcomes: Sequence[int]) -> Step:
        """``step`` as ``rank`` fires it: with the pages the agreement gives it."""
        if step.kind == "load":  # an H2D acknowledgement carries no pages
            return step
        pages = self.agreement.outcome(rank, outcomes)
        if pages == FAILED:
            return Step(step.kind, step.request, "error")
        if step.kind == "read" and pages > outcomes[rank]:
            raise Violation(
                "rank_bytes",
                f"rank {rank} would stage {pages} pages of r{step.request}'s read; its own read "
                f"brought {max(outcomes[rank], 0)}: the rest of its shard is not in its bounce",
            )
        return Step(step.kind, step.request, "short", pages)

    def _forget_ended(self, part: State, drained: State) -> State:
        """Outcomes of operations that ended without completing (an aborted query) are stale,
        as the pipeline drops completions of operations no longer in flight."""
        if all(outcome == UNDRAINED for outcome in drained):
            return drained
        slots = self.model.decode(part).slots
        return tuple(
            UNDRAINED
            if (record := slots[at // self.ranks].record) is None or not record.op
            else outcome
            for at, outcome in enumerate(drained)
        )

    # ------------------------------------------------------------------ invariants

    def check(self, state: State) -> None:
        """Lockstep first (every rank as rank 0, its bounce pool aside), then each rank's own."""
        first = self.rank_state(state, 0)
        for rank in range(1, self.ranks):
            part = self.rank_state(state, rank)
            if part[0] != first[0] or part[2:] != first[2:]:
                raise Violation("lockstep", self._difference(first, part, rank))
        for rank in range(self.ranks):
            try:
                self.model.check(self.rank_state(state, rank), self.host_pages[rank])
            except Violation as violation:
                raise Violation(violation.invariant, f"rank {rank}: {violation.message}") from None

    def _difference(self, first: State, other: State, rank: int) -> str:
        a, b = self.model.decode(first), self.model.decode(other)
        if a.device != b.device:
            return f"rank 0's device holds {a.device} pages, rank {rank}'s {b.device}"
        for index, (mine, theirs) in enumerate(zip(a.slots, b.slots, strict=True)):
            if mine != theirs:
                return f"r{index}: rank 0 holds {_said(mine)}, rank {rank} {_said(theirs)}"
        raise AssertionError("states differ but no field does")

    # ------------------------------------------------------------------ search

    def run(self) -> Result:
        edges: set[Edge] = set()
        return self.model.result(self.explore(edges), edges, self.describe)

    def explore(self, edges: set[Edge]) -> Search[State, RankStep]:
        """Every reachable state of the ranks, the edges fired on the way added to ``edges``."""
        return breadth_first(
            self.initial(),
            lambda world: self._successors(world, edges),
            self.check,
            self.bounds.max_states,
        )

    def _successors(
        self, world: State, edges: set[Edge]
    ) -> Iterator[tuple[RankStep, State | Violation]]:
        return attempts(self.actions(world), lambda taken: self.successor(world, taken, edges))

    def describe(self, taken: RankStep) -> str:
        rank, step = taken
        text = self.model.describe(step)
        return text if rank < 0 else f"rank {rank} drains {text}"


def _said(slot: Slot) -> str:
    record = slot.record
    if record is None:
        return f"no record ({slot.issues} issues)"
    waits = f", waiting on r{slot.waiting_on}" if slot.waiting_on >= 0 else ""
    return (
        f"{record.state!r} (span to {record.span_end}, {record.bounce} bounce pages, "
        f"read {record.read}, pin {record.pin}{waits})"
    )
