"""What the pipeline implements of the spec (read by ``stagefate check`` and the tests)."""

from __future__ import annotations

from typing import NamedTuple


class Implementation(NamedTuple):
    """The names the pipeline binds: guards, effects, counters (``Stats``), the state groups it
    reads and exits; :func:`~stagefate.spec.checks.implementation_problems` compares them with a
    spec."""

    guards: frozenset[str]
    effects: frozenset[str]
    counters: frozenset[str]
    groups: frozenset[str]
    exits: frozenset[str]


def implemented_names() -> Implementation:
    """The names :class:`BufferPipeline` implements, for the static checks against a spec."""
    from .pipeline import BufferPipeline
    from .stats import Stats

    return Implementation(
        frozenset(BufferPipeline.GUARDS),
        frozenset(BufferPipeline.EFFECTS),
        frozenset(Stats.model_fields),
        frozenset(BufferPipeline.GROUPS),
        frozenset(BufferPipeline.EXITS),
    )
