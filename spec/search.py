"""Breadth-first search over a checker's states, stopping at the first violation (which BFS makes
a shortest counterexample); shared by the one-rank, the ranks' and the API-granular checkers."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from .model_world import Violation

StateT = TypeVar("StateT", bound=Hashable)
StepT = TypeVar("StepT")


@dataclass
class Search(Generic[StateT, StepT]):
    """What :func:`breadth_first` explored: each state's parent and the step from it."""

    parents: dict[StateT, tuple[StateT, StepT] | None]
    truncated: bool = False
    failure: tuple[list[StepT], Violation] | None = None
    """The shortest path to the first violation, and the violation."""


def breadth_first(
    start: StateT,
    successors: Callable[[StateT], Iterable[tuple[StepT, StateT | Violation]]],
    check: Callable[[StateT], None],
    limit: int,
    done: Callable[[], bool] = lambda: False,
) -> Search[StateT, StepT]:
    """Every state reachable from ``start`` (up to ``limit``), each ``check``-ed once; a step
    that cannot run yields its :class:`Violation` in place of a state. BFS makes the first
    counterexample a shortest one. ``done``: asked after each state's successors, stops the
    search early when True. The collector is off while millions of small tuples are made
    (none of them forms a cycle)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        search: Search[StateT, StepT] = Search({start: None})
        parents = search.parents
        queue = deque([start])
        while queue:
            world = queue.popleft()
            for step, successor in successors(world):
                if isinstance(successor, Violation):
                    search.failure = (path_to(parents, world, step), successor)
                    return search
                if successor in parents:
                    continue
                if len(parents) >= limit:
                    search.truncated = True
                    continue
                parents[successor] = (world, step)
                try:
                    check(successor)
                except Violation as violation:
                    search.failure = (path_to(parents, world, step), violation)
                    return search
                queue.append(successor)
            if done():
                break
        return search
    finally:
        if collecting:
            gc.enable()


def attempts(
    steps: Iterable[StepT], take: Callable[[StepT], StateT]
) -> Iterator[tuple[StepT, StateT | Violation]]:
    """Each step with the state ``take`` makes of it, or the :class:`Violation` it raised (what
    :func:`breadth_first` expects of a checker's successors)."""
    for step in steps:
        try:
            yield step, take(step)
        except Violation as violation:
            yield step, violation


def path_to(
    parents: dict[StateT, tuple[StateT, StepT] | None], world: StateT, step: StepT
) -> list[StepT]:
    path = [step]
    node = world
    while (parent := parents[node]) is not None:
        node, previous = parent
        path.append(previous)
    path.reverse()
    return path
