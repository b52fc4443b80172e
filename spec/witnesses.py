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
modelled edge has one. :mod:`.generated_tests` writes each as a test of public calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

from .modelcheck import (
    EFFECTS,
    NOT_MODELLED_GUARDS,
    Args,
    Bounds,
    Edge,
    ModelChecker,
    Rec,
    Slot,
    State,
    Step,
    Violation,
    World,
    _Draft,
    _live_fields,
    breadth_first,
    path_to,
)
from .schema import LifecycleSpec

POLL = Step("poll", -1, "poll")
_COMPLETIONS = {"exists": "hit", "read": "read_done", "load": "ack"}


def _enqueue_parked(mc: ModelChecker, d: _Draft, i: int, r: Rec, a: Args) -> Rec:
    """A hit parked anew goes to the back of the FIFO; a parked one keeps its place."""
    if r.state == "parked":
        return r
    behind = [o.queued for j, o in enumerate(d.records) if j != i and _parked(o)]
    return r._replace(queued=max(behind, default=0) + 1)


def _parked(record: Rec | None) -> TypeGuard[Rec]:
    return record is not None and record.state == "parked"


class ApiModelChecker(ModelChecker):
    """The model checker at the public API's granularity (the module says how)."""

    def __init__(self, spec: LifecycleSpec, bounds: Bounds | None = None) -> None:
        super().__init__(spec, bounds)
        self.effects = {**EFFECTS, "enqueue_parked": _enqueue_parked}
        self.lockable = spec.group("lockable")

    def _request_steps(self, i: int, slot: Slot, below_want: bool) -> tuple[Step, ...]:
        steps = super()._request_steps(i, slot, below_want)
        return tuple(step for step in steps if (step.kind, step.what) != ("event", "commit"))

    def actions(self, state: State) -> list[Step]:
        steps = super().actions(state)
        if any(_parked(slot.record) for slot in self.decode(state).slots):
            steps.append(POLL)
        return steps

    def successor(self, state: State, step: Step, edges: set[Edge], pinned: int = -1) -> State:
        if step.kind != "poll" and step.kind not in _COMPLETIONS:
            return super().successor(state, step, edges, pinned)
        world = self.decode(state)
        draft = _Draft.of(world)
        if step.kind in _COMPLETIONS:
            self._complete(draft, step.request, _COMPLETIONS[step.kind], step, edges)
        self._run_commits(draft, edges)
        return self._encode(draft)

    def _run_commits(self, draft: _Draft, edges: set[Edge]) -> None:
        """A pass's commits: the parked FIFO from its head, then the new hits."""
        records = draft.records
        fifo = sorted((r.queued, j) for j, r in enumerate(records) if _parked(r))
        for _, j in fifo:
            self._fire(draft, j, "commit", Args(), edges)
            if _parked(records[j]):
                break
        for j, record in enumerate(records):
            if record and record.hit >= 0 and not record.op and record.state in self.lockable:
                self._fire(draft, j, "commit", Args(), edges)

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
            return "poll (the parked hits commit from the FIFO's head)"
        return super().describe(step)


@dataclass(frozen=True)
class Witness:
    """The shortest program taking ``edge``: its steps, and the world after each."""

    edge: Edge
    target: str
    reason: str | None
    steps: list[Step]
    worlds: list[World]


def shortest_witnesses(spec: LifecycleSpec, bounds: Bounds | None = None) -> list[Witness]:
    """One witness per modelled edge of ``spec``, in the spec's order; an edge no program of
    public calls reaches within ``bounds`` raises, naming it."""
    mc = ApiModelChecker(spec, bounds)
    wanted = [edge for edge in mc.all_edges() if edge[2] not in NOT_MODELLED_GUARDS]
    fired: set[Edge] = set()
    first: dict[Edge, tuple[State, Step]] = {}
    remaining = set(wanted)

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
                    remaining.discard(edge)
            yield step, successor

    search = breadth_first(
        mc.initial(), successors, mc.check, mc.bounds.max_states, lambda: not remaining
    )
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
    return [_witness(mc, spec, edge, path_to(search.parents, *first[edge])) for edge in wanted]


def _witness(mc: ApiModelChecker, spec: LifecycleSpec, edge: Edge, steps: list[Step]) -> Witness:
    state, worlds, ignored = mc.initial(), [], set[Edge]()
    for step in steps:
        state = mc.successor(state, step, ignored)
        worlds.append(mc.decode(state))
    source, event, guard = edge
    branch = next(
        b
        for row_state, row_event, branches in spec.rows()
        if (row_state, row_event) == (source, event)
        for b in branches
        if (b.guard or "else") == guard
    )
    return Witness(edge, spec.target_of(source, branch), branch.reason, steps, worlds)
