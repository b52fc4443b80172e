"""The shortest program that takes each edge of the spec, at the granularity of the public API.

Theory of operation
-------------------
The model checker (:mod:`.modelcheck`) lets the IO commit of a hit happen at any later step,
so that every interleaving of the scheduler's calls and the world's moves is explored. The
pipeline's API is coarser: :meth:`~stagefate.BufferPipeline.poll` drains the completions and
runs the commits in the same pass, parked hits first in FIFO order (stopping at the first that
stays parked), then the new hits. A program of public calls can only take the paths where that
is so. :class:`ApiModelChecker` is the model checker restricted to them:

* a completion (an existence query, a read, an H2D copy) is one step that fires its event and
  then runs the pass's commits, exactly as one ``complete`` followed by one ``poll``;
* a hit is never committed on its own; ``poll`` alone is a step while anything is parked, and
  it commits the parked FIFO from its head;
* a parked hit keeps its place in the FIFO (``Rec.queued``), so the head is the real head.

Every other step (issue, lock, plan, consume, abort, release a hold; evict and publish) is
the model checker's own. :func:`shortest_witnesses` explores breadth first and keeps, for each
edge, the first step that fired it: the shortest program that takes it, stopping once every
modelled edge has one. :mod:`.generated_tests` writes each as a test of public calls, asserting
after every step the state and the transitions fired (:meth:`ApiModelChecker.replay`).

A witness per edge tells a branch taken from every other, but not the order of two branches
whose guards can hold at once: swapping them changes only the situations where both hold, which
no edge's witness needs to meet. So the search also notes, whenever a branch is taken while the
next branch's guard holds too, an *overlap* (``taken`` over ``also``), and keeps the shortest
program for each such pair it meets (:data:`OVERLAP_STATES` bounds the search for them past the
last edge). A pair never met is a pair whose order no program within the bounds can see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeGuard

from .model_rules import EFFECTS, GUARDS, _live_fields
from .model_world import (
    NOT_MODELLED_GUARDS,
    Args,
    Bounds,
    Edge,
    Fired,
    Rec,
    Slot,
    State,
    Step,
    Violation,
    World,
    _Draft,
)
from .modelcheck import ModelChecker
from .schema import COMPLETION_KINDS, BranchSpec, LifecycleSpec
from .search import Search, attempts, breadth_first, path_to

POLL = Step("poll", -1, "poll")
ALSO = "__also__"
"""Joins the two guards of an overlap in the search's edge set: ``(state, event,
taken__also__next)``."""
OVERLAP_STATES = 200_000
"""How many states past the last edge's witness the search goes on for overlaps not yet met."""


def _enqueue_parked(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    """A hit parked anew goes to the back of the FIFO; a parked one keeps its place."""
    if r.state in mc.waiting_for_room:
        return r
    behind = [o.queued for j, o in enumerate(d.records) if j != i and _parked(o, mc)]
    return r._replace(queued=max(behind, default=0) + 1)


def _parked(record: Rec | None, mc: ModelChecker) -> TypeGuard[Rec]:
    return record is not None and record.state in mc.waiting_for_room


class ApiModelChecker(ModelChecker):
    """The model checker at the public API's granularity (the module says how)."""

    def __init__(self, spec: LifecycleSpec, bounds: Bounds | None = None) -> None:
        super().__init__(spec, bounds)
        self._next_guard = {
            (state, event, taken): also
            for state, event, joined in overlaps(spec)
            for taken, also in [joined.split(ALSO)]
        }
        """The next branch's guard after each guarded branch, where :func:`overlaps` pairs them."""
        self.effects = {**EFFECTS, "enqueue_parked": _enqueue_parked}
        self.lockable = spec.group("lockable", required=False)

    def _request_steps(self, i: int, slot: Slot, below_want: bool) -> tuple[Step, ...]:
        steps = super()._request_steps(i, slot, below_want)
        commit = ("event", self._first_event("poll"))  # poll commits, never a step of its own
        kept = [step for step in steps if (step.kind, step.what) != commit]
        if self.draws_speeds:  # a hit found whole, committed in a pass that finds loads slow
            hits = [step for step in kept if (step.kind, step.what) == ("exists", "full")]
            kept += [step._replace(slower=True) for step in hits]
        return tuple(kept)

    def _note_choice(
        self,
        draft: _Draft,
        index: int,
        record: Rec,
        event: str,
        branches: tuple[BranchSpec, ...],
        branch: BranchSpec,
        args: Args,
        edges: set[Edge],
    ) -> None:
        """An overlap when the next branch's guard holds as well (guards only read)."""
        also = self._next_guard.get((record.state, event, branch.guard or "else"))
        if also is not None and GUARDS[also](self, draft, index, record, args):
            edges.add((record.state, event, f"{branch.guard}{ALSO}{also}"))

    def actions(self, state: State) -> list[Step]:
        steps = super().actions(state)
        if any(_parked(slot.record, self) for slot in self.decode(state).slots):
            steps.append(POLL)
            if self.draws_speeds:
                steps.append(POLL._replace(slower=True))
        return steps

    def successor(self, state: State, step: Step, edges: set[Edge], pinned: int = -1) -> State:
        if step.kind != "poll" and step.kind not in COMPLETION_KINDS:
            return super().successor(state, step, edges, pinned)
        draft = _Draft.of(self.decode(state))
        self._poll_or_complete(draft, step, edges)
        return self._encode(draft)

    def replay(self, state: State, step: Step) -> tuple[State, list[Fired]]:
        """``step`` from ``state`` on a whole draft, past the memo: the state after it (what
        :meth:`successor` gives) and the transitions it fired, in order."""
        if step.kind == "world":
            return self.successor(state, step, set()), []
        draft, ignored = _Draft.of(self.decode(state)), set[Edge]()
        draft.fired = []
        if step.kind == "poll" or step.kind in COMPLETION_KINDS:
            self._poll_or_complete(draft, step, ignored)
        else:
            self.apply(draft, step, ignored)
        return self._encode(draft), draft.fired

    def _poll_or_complete(self, draft: _Draft, step: Step, edges: set[Edge]) -> None:
        """A completion fires its event, then the pass's commits run; a poll runs them alone."""
        if step.kind in COMPLETION_KINDS:
            self._complete(draft, step.request, step, edges)
        self._run_commits(draft, Args(slower=step.slower), edges)

    def _run_commits(self, draft: _Draft, args: Args, edges: set[Edge]) -> None:
        """A pass's commits: the parked FIFO from its head, then the new hits."""
        records, commit = draft.records, self._first_event("poll")
        fifo = sorted((r.queued, j) for j, r in enumerate(records) if _parked(r, self))
        for _, j in fifo:
            self._fire(draft, j, commit, args, edges)
            if _parked(records[j], self):
                break
        for j, record in enumerate(records):
            if record and record.hit >= 0 and not record.op and record.state in self.lockable:
                self._fire(draft, j, commit, args, edges)

    def _encode(self, draft: _Draft) -> State:
        slots = [
            self._intern(Slot(_live_fields(self, record), issues, waiting_on))
            for record, issues, waiting_on in zip(
                draft.records, draft.issues, draft.waiting_on, strict=True
            )
        ]
        return (draft.device, draft.host_free, *slots)

    def describe(self, step: Step) -> str:
        if step.kind == "poll":
            slow = ", loads measured slower than computing" if step.slower else ""
            return f"poll (the parked hits commit from the FIFO's head{slow})"
        return super().describe(step)


@dataclass(frozen=True)
class Witness:
    """The shortest program taking ``edge`` (with ``also``: while the next branch's guard
    ``also`` held too): its steps, the world after each and the transitions each fired."""

    edge: Edge
    also: str | None
    target: str
    reason: str | None
    steps: list[Step]
    worlds: list[World]
    fired: list[list[Fired]]


def first_firings(
    mc: ApiModelChecker, done: Callable[[dict[Edge, tuple[State, Step]]], bool]
) -> tuple[Search[State, Step], dict[Edge, tuple[State, Step]]]:
    """Breadth first over ``mc``'s states, keeping for each edge it fires (the search's own
    pseudo-edges included) the state and step that fired it first: the end of the shortest
    program that takes it. ``done(first)``, asked after each state's successors, stops early."""
    fired: set[Edge] = set()
    first: dict[Edge, tuple[State, Step]] = {}

    def successors(world: State) -> Iterator[tuple[Step, State | Violation]]:
        for step in mc.actions(world):
            try:
                successor = mc.successor(world, step, fired)
            except Violation as violation:
                yield step, violation
                continue
            if len(fired) > len(first):
                for edge in fired.difference(first):
                    first[edge] = (world, step)
            yield step, successor

    search = breadth_first(
        mc.initial(), successors, mc.check, mc.bounds.max_states, lambda: done(first)
    )
    return search, first


def overlaps(spec: LifecycleSpec) -> list[Edge]:
    """Every pair of neighbouring guarded branches, as the search's edge of its overlap, in
    the spec's order."""
    return [
        (state, event, f"{taken.guard}{ALSO}{also.guard}")
        for state, event, branches in spec.rows()
        for taken, also in pairwise(branches)
        if taken.guard is not None
        and also.guard is not None
        and not {taken.guard, also.guard} & NOT_MODELLED_GUARDS
    ]


def shortest_witnesses(spec: LifecycleSpec, bounds: Bounds | None = None) -> list[Witness]:
    """One witness per modelled edge of ``spec``, in the spec's order, each followed by the
    witnesses of the overlaps it begins that the search met; an edge no program of public calls
    reaches within ``bounds`` raises, naming it."""
    mc = ApiModelChecker(spec, bounds)
    wanted = [edge for edge in mc.all_edges() if edge[2] not in NOT_MODELLED_GUARDS]
    pairs = overlaps(spec)
    expanded_since_edges = 0

    def done(first: dict[Edge, tuple[State, Step]]) -> bool:
        nonlocal expanded_since_edges
        if not all(edge in first for edge in wanted):
            return False
        expanded_since_edges += 1
        return all(pair in first for pair in pairs) or expanded_since_edges > OVERLAP_STATES

    search, first = first_firings(mc, done)
    if search.failure is not None:
        path, violation = search.failure
        raise ValueError(
            f"the spec breaks {violation.invariant or 'a step'} at the API's granularity: "
            f"{violation}; run `stagefate check` for the counterexample ({len(path)} steps)"
        )
    missing = [edge for edge in wanted if edge not in first]
    if missing:
        raise ValueError(
            f"no program of public calls takes {missing} within the bounds; raise them "
            "(stagefate check --pages/--requests/--issues) or mark the guard not modelled"
        )
    witnesses = []
    for edge in wanted:
        witnesses.append(_witness(mc, spec, edge, None, path_to(search.parents, *first[edge])))
        for pair in pairs:
            state, event, guards = pair
            taken, also = guards.split(ALSO)
            if (state, event, taken) == edge and pair in first:
                path = path_to(search.parents, *first[pair])
                witnesses.append(_witness(mc, spec, edge, also, path))
    return witnesses


def api_counterexample(
    spec: LifecycleSpec, bounds: Bounds | None = None
) -> tuple[list[Step], Violation] | None:
    """The shortest program of public calls that breaks an invariant of ``spec`` (its last step
    the one that breaks it), or None when no such program exists within ``bounds`` (the model
    checker's violation then needs an interleaving the API does not allow)."""
    mc = ApiModelChecker(spec, bounds)
    ignored: set[Edge] = set()

    def successors(world: State) -> Iterator[tuple[Step, State | Violation]]:
        return attempts(mc.actions(world), lambda step: mc.successor(world, step, ignored))

    return breadth_first(mc.initial(), successors, mc.check, mc.bounds.max_states).failure


def replayed(mc: ApiModelChecker, steps: list[Step]) -> tuple[list[World], list[list[Fired]]]:
    """The world after each of ``steps`` from the initial state, and the transitions each fired
    (checked against the memoised :meth:`~ApiModelChecker.successor` the search took)."""
    state, worlds, fired = mc.initial(), [], []
    for step in steps:
        expected = mc.successor(state, step, set())
        state, transitions = mc.replay(state, step)
        assert state == expected, f"replaying {step} left another state than the search"
        worlds.append(mc.decode(state))
        fired.append(transitions)
    return worlds, fired


def _witness(
    mc: ApiModelChecker, spec: LifecycleSpec, edge: Edge, also: str | None, steps: list[Step]
) -> Witness:
    worlds, fired = replayed(mc, steps)
    source, event, guard = edge
    branch = next(
        b
        for row_state, row_event, branches in spec.rows()
        if (row_state, row_event) == (source, event)
        for b in branches
        if (b.guard or "else") == guard
    )
    return Witness(edge, also, spec.target_of(source, branch), branch.reason, steps, worlds, fired)
