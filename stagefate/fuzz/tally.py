"""What every fuzz run adds to: the spec edges its transitions took and the states checked."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..statemachine.record import TransitionEvent

Edge = tuple[str, str, str]


@dataclass
class Tally:
    """What every fuzz run adds to; a campaign resets it and reports it."""

    edges: Counter[Edge] = field(default_factory=Counter)
    """``(state, event, guard or 'else')`` of every transition fired."""
    states: int = 0
    """States whose invariants were checked (one per executed step, plus setups)."""

    def reset(self) -> None:
        self.edges.clear()
        self.states = 0


TALLY = Tally()


def record_edge(event: TransitionEvent) -> None:
    outcome = event.outcome
    TALLY.edges[(outcome.source, outcome.event, outcome.guard or "else")] += 1
