"""Spec invariants as the stateful fuzzer checks them, and which one a failure broke."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from hypothesis.stateful import RuleBasedStateMachine, invariant

from ..runtime.pools import PoolError

Machine = TypeVar("Machine", bound=RuleBasedStateMachine)


class InvariantViolated(AssertionError):
    """A spec invariant failed; ``invariant`` is its id in spec/lifecycle.yaml."""

    def __init__(self, invariant: str, message: str) -> None:
        self.invariant = invariant
        super().__init__(f"{invariant}: {message}")


def spec_invariant(check: Callable[[Machine], None]) -> Callable[[Machine], None]:
    """An ``@invariant`` named by a spec invariant id; its failure says which invariant broke."""

    @functools.wraps(check)
    def checked(self: Machine) -> None:
        try:
            check(self)
        except AssertionError as failed:
            if isinstance(failed, InvariantViolated):
                raise
            raise InvariantViolated(check.__name__, str(failed) or "failed") from failed

    return invariant()(checked)


def violated_invariant(failure: BaseException) -> str | None:
    """The spec invariant a fuzz failure shows broken: an ``@invariant``'s id, or
    ``hold_release`` for a slot freed twice or by a stranger (the pool raises before anything
    changes, as the invariant demands); None for anything else (a bug in a rule, a typo)."""
    if isinstance(failure, InvariantViolated):
        return failure.invariant
    if isinstance(failure, PoolError):
        return "hold_release"
    return None
