"""Errors raised by the lifecycle. Each names what was wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Iterable


class LifecycleError(RuntimeError):
    """A command arrived in a state where the spec has no transition for it.

    Raised before anything changes: the record keeps its state and every resource it holds.
    """

    def __init__(
        self, request: str, state: str | None, event: str, legal: Iterable[str] = (), hint: str = ""
    ) -> None:
        self.request = request
        self.state = state
        self.event = event
        where = "no live prefetch" if state is None else f"state {state!r}"
        message = f"request {request!r}: event {event!r} is not allowed in {where}"
        legal_events = sorted(legal)
        if legal_events:
            message += f" (allowed there: {', '.join(legal_events)})"
        if hint:
            message += f"; {hint}"
        super().__init__(message)


class IncompleteImplementation(TypeError):
    """The guards or effects bound to a spec do not cover every name it uses."""


class LockstepError(RuntimeError):
    """Tensor-parallel ranks disagree: they fired different transitions, or one never arrived.

    Raised at the pass's agreement, where SGLang would hang in its next collective; the message
    names, for each rank, the first transition where the ranks differ.
    """
