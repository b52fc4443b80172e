"""Mutants of the lifecycle spec, and which of them change what a program of public calls sees.

Theory of operation
-------------------
The tests generated from the spec (:mod:`.generated_tests`) are worth what they catch. A mutant
is the spec with one row changed the way a slip in an edit would change it:

* ``swap_reasons``: two branches of a row that end a record trade their reasons;
* ``drop_guard``: a guarded branch loses its guard, so it is taken whenever it is reached;
* ``retarget``: a branch into a live state goes to the next live state of the table instead;
* ``reorder``: two neighbouring branches trade places.

A mutant *changes behaviour* when some program of public calls within the bounds fires another
transition under it than under the spec: another branch of the row (by its place in the spec),
another target, reason, effects or counters. :func:`telling_programs` decides that for every
mutant in one exploration of the spec's own states at the API's granularity
(:class:`~.witnesses.ApiModelChecker`). Up to the first step where a mutant's row decides
differently, the mutant's run is the spec's run step for step, so it is enough to ask, at each
branch the spec takes, which branch each mutant of that row would take on the same draft (guards
only read): the first such step, breadth first, ends the shortest program that tells the mutant
from the spec. A mutant never told apart is equivalent within the bounds. A generated test must
fail under every mutant that changes behaviour (tests/test_mutation.py runs them:
``stagefate check --mutants``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

from .model_rules import GUARDS
from .model_world import (
    NOT_MODELLED_GUARDS,
    Args,
    Bounds,
    Edge,
    Rec,
    Step,
    _Draft,
)
from .schema import BranchSpec, LifecycleSpec
from .search import path_to
from .witnesses import ApiModelChecker, first_firings

KINDS = ("swap_reasons", "drop_guard", "retarget", "reorder")


@dataclass(frozen=True)
class Mutant:
    """The spec with row ``row`` (an index into ``transitions``) given ``branches``; ``origin``
    is each new branch's place in the spec's row."""

    kind: str
    row: int
    what: str
    branches: tuple[BranchSpec, ...]
    origin: tuple[int, ...]
    spec: LifecycleSpec


def mutants(spec: LifecycleSpec) -> list[Mutant]:
    """Every mutant of ``spec`` of the four kinds, row by row in the spec's order; a branch
    guarded by a part the model leaves out (``aux_cut``) is left alone."""
    live = [name for name, state in spec.states.items() if not state.terminal]
    made: list[Mutant] = []
    for index, row in enumerate(spec.transitions):
        where = f"({', '.join(row.sources)}) --{row.event}"
        for kind, what, new, origin in _row_mutants(row.branches, live):
            rows = list(spec.transitions)
            rows[index] = row.model_copy(update={"branches": new})
            changed = spec.model_copy(update={"transitions": tuple(rows)})
            made.append(Mutant(kind, index, f"{where}: {what}", new, origin, changed))
    return made


Made = tuple[str, str, tuple[BranchSpec, ...], tuple[int, ...]]
"""A row's mutant: its kind, what changed, the new branches and each one's place before."""


def _row_mutants(branches: tuple[BranchSpec, ...], live: list[str]) -> Iterator[Made]:
    order = tuple(range(len(branches)))

    def replaced(i: int, branch: BranchSpec) -> tuple[BranchSpec, ...]:
        return (*branches[:i], branch, *branches[i + 1 :])

    for i, a in enumerate(branches):
        for j, b in enumerate(branches[i + 1 :], start=i + 1):
            if a.reason is not None and b.reason is not None and a.reason != b.reason:
                new = replaced(i, a.model_copy(update={"reason": b.reason}))
                new = (*new[:j], b.model_copy(update={"reason": a.reason}), *new[j + 1 :])
                yield "swap_reasons", f"[{_name(a)}] and [{_name(b)}] trade reasons", new, order
    modelled = [
        (i, branch) for i, branch in enumerate(branches) if branch.guard not in NOT_MODELLED_GUARDS
    ]
    for i, branch in modelled:
        if branch.guard is not None:
            new = replaced(i, branch.model_copy(update={"guard": None}))
            yield "drop_guard", f"[{branch.guard}] loses its guard", new, order
    for i, branch in modelled:
        if branch.to in live:
            to = live[(live.index(branch.to) + 1) % len(live)]
            new = replaced(i, branch.model_copy(update={"to": to}))
            yield "retarget", f"[{_name(branch)}] goes to {to}, not {branch.to}", new, order
    for i, (a, b) in enumerate(pairwise(branches)):
        if not {a.guard, b.guard} & NOT_MODELLED_GUARDS:
            new = (*branches[:i], b, a, *branches[i + 2 :])
            origin = (*order[:i], i + 1, i, *order[i + 2 :])
            yield "reorder", f"[{_name(a)}] and [{_name(b)}] trade places", new, origin


def _name(branch: BranchSpec) -> str:
    return branch.guard or "else"


class _Teller(ApiModelChecker):
    """The spec's own checker, asking at every branch it takes what each mutant would take."""

    def __init__(self, spec: LifecycleSpec, bounds: Bounds, made: list[Mutant]) -> None:
        super().__init__(spec, bounds)
        self.by_row: dict[tuple[str, str], list[tuple[int, Mutant]]] = {}
        self.told: set[int] = set()
        """Mutants already told apart: asked no more."""
        for number, m in enumerate(made):
            row = spec.transitions[m.row]
            for source in row.sources:
                self.by_row.setdefault((source, row.event), []).append((number, m))

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
        candidates = self.by_row.get((record.state, event))
        if not candidates:
            return
        taken = _outcome(branches.index(branch), branch)
        for number, m in candidates:
            if number in self.told:
                continue
            chosen = next(
                j
                for j, other in enumerate(m.branches)
                if other.guard is None or GUARDS[other.guard](self, draft, index, record, args)
            )
            if _outcome(m.origin[chosen], m.branches[chosen]) != taken:
                self.told.add(number)
                edges.add(("mutant", str(number), ""))


def _outcome(place: int, branch: BranchSpec) -> tuple[object, ...]:
    return (place, branch.to, branch.reason, branch.effects, branch.count)


@dataclass(frozen=True)
class Telling:
    """What :func:`telling_programs` found: for each mutant (by its index) that changes
    behaviour, the shortest program that tells it from the spec; and how many states the
    exploration visited (``exhaustive``: all of them, so every other mutant is equivalent within
    the bounds)."""

    programs: dict[int, list[Step]]
    states: int
    exhaustive: bool


def telling_programs(
    spec: LifecycleSpec, made: list[Mutant], bounds: Bounds | None = None
) -> Telling:
    """Which of ``made`` (mutants of ``spec``) change behaviour within ``bounds`` (the module
    says how), each with its shortest telling program; stops once every mutant is told."""
    mc = _Teller(spec, bounds or Bounds(), made)
    search, first = first_firings(mc, lambda _: len(mc.told) == len(made))
    if search.failure is not None:
        raise ValueError(f"the spec itself breaks at the API's granularity: {search.failure[1]}")
    told = sorted((int(number), at) for (kind, number, _), at in first.items() if kind == "mutant")
    programs = {number: path_to(search.parents, *at) for number, at in told}
    exhaustive = len(programs) < len(made) and not search.truncated
    return Telling(programs, len(search.parents), exhaustive)
