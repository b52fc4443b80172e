"""The reference machine: a ``transitions`` Machine built from the same spec.

It is slower than :class:`~.machine.CompiledMachine` (several microseconds a trigger and O(N)
to add a model) and serves as the oracle: the conformance test and the fuzzer run it in
lockstep with the compiled table and require the same state after every event. It is built
from :meth:`LifecycleSpec.rows` independently of the compiled table, so a bug in one is not
silently shared by the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from transitions import Machine, MachineError

from ..spec import LifecycleSpec
from .errors import LifecycleError
from .machine import Ctx, Effect, Guard


class OracleModel:
    """The oracle's own view of one record: its state and the context guards read."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.state = ""


def _condition(guard: Guard[Any]) -> Callable[[Any], bool]:
    return lambda event_data: guard(event_data.model.ctx)


def _callback(effect: Effect[Any]) -> Callable[[Any], None]:
    return lambda event_data: effect(event_data.model.ctx)


class OracleMachine:
    """Wraps one ``transitions.Machine``; effects are optional (lockstep runs leave them out)."""

    def __init__(
        self,
        spec: LifecycleSpec,
        guards: Mapping[str, Guard[Ctx]],
        effects: Mapping[str, Effect[Ctx]] | None = None,
    ) -> None:
        self.spec = spec
        self.machine = Machine(
            model=[],
            states=list(spec.states),
            initial=spec.initial,
            auto_transitions=False,
            send_event=True,
        )
        for source, event, branches in spec.rows():
            for branch in branches:
                self.machine.add_transition(
                    event,
                    source,
                    spec.target_of(source, branch),
                    conditions=[] if branch.guard is None else [_condition(guards[branch.guard])],
                    before=[]
                    if effects is None
                    else [_callback(effects[e]) for e in branch.effects],
                )

    def add(self, ctx: Any, state: str | None = None) -> OracleModel:
        """Track ``ctx`` in the oracle from ``state`` (the spec's initial state by default)."""
        model = OracleModel(ctx)
        self.machine.add_model(model, initial=state or self.spec.initial)
        return model

    def remove(self, model: OracleModel) -> None:
        """Stop tracking ``model`` (its record ended)."""
        self.machine.remove_model(model)

    def trigger(self, model: OracleModel, event: str) -> str:
        """Fire ``event``; raise :class:`LifecycleError` (state unchanged) when it is illegal."""
        if event not in self.spec.events:
            raise LifecycleError(str(getattr(model.ctx, "request_id", "?")), model.state, event)
        try:
            self.machine.events[event].trigger(model)
        except MachineError:
            legal = [e for s, e, _b in self.spec.rows() if s == model.state]
            raise LifecycleError(
                str(getattr(model.ctx, "request_id", "?")), model.state, event, legal
            ) from None
        return model.state
