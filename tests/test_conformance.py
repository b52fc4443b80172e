"""The compiled table and the ``transitions`` oracle agree on every state, for any events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagefate.spec import load_spec
from stagefate.statemachine.errors import IncompleteImplementation, LifecycleError
from stagefate.statemachine.machine import CompiledMachine
from stagefate.statemachine.oracle import OracleMachine

SPEC = load_spec()


@dataclass
class World:
    """Guard answers drawn by Hypothesis; effects append to a log so both machines' runs compare."""

    answers: dict[str, bool]
    log: list[str] = field(default_factory=list)


@dataclass
class Rec:
    request_id: str
    world: World
    state: str = SPEC.initial


def bindings() -> tuple[dict[str, object], dict[str, object]]:
    guards = {name: (lambda r, n=name: r.world.answers[n]) for name in SPEC.guards}
    effects = {name: (lambda r, n=name: r.world.log.append(n)) for name in SPEC.effects}
    return guards, effects


def _outcome(fire: Callable[..., str]) -> str:
    try:
        return fire()
    except LifecycleError as exc:
        return f"error:{exc.state}:{exc.event}"


guard_answers = st.fixed_dictionaries({name: st.booleans() for name in SPEC.guards})
steps = st.lists(st.tuples(st.sampled_from(sorted(SPEC.events)), guard_answers), max_size=25)


@given(steps)
def test_compiled_and_oracle_agree_on_every_step(
    sequence: list[tuple[str, dict[str, bool]]],
) -> None:
    guards, effects = bindings()
    compiled = CompiledMachine(SPEC, guards, effects)  # type: ignore[arg-type]
    oracle = OracleMachine(SPEC, guards, effects)  # type: ignore[arg-type]
    compiled_world, oracle_world = World({}), World({})
    rec = Rec("r1", compiled_world)
    model = oracle.add(Rec("r1", oracle_world))
    for event, answers in sequence:
        compiled_world.answers = oracle_world.answers = answers
        before = rec.state
        results = [_outcome(lambda e=event: compiled.fire(rec, e).target)]
        results.append(_outcome(lambda e=event: oracle.trigger(model, e)))
        assert results[0] == results[1]
        if results[0].startswith("error:"):
            assert rec.state == model.state == before  # an illegal event changes nothing
        assert rec.state == model.state
        assert compiled_world.log == oracle_world.log


def test_invalid_event_names_request_state_and_event_on_both() -> None:
    guards, effects = bindings()
    compiled = CompiledMachine(SPEC, guards, effects)  # type: ignore[arg-type]
    oracle = OracleMachine(SPEC, guards, effects)  # type: ignore[arg-type]
    rec = Rec("req-7", World(dict.fromkeys(SPEC.guards, False)), state="reading")
    model = oracle.add(rec, state="reading")
    for fire in (lambda: compiled.fire(rec, "consume"), lambda: oracle.trigger(model, "consume")):
        with pytest.raises(LifecycleError) as info:
            fire()
        text = str(info.value)
        assert "'req-7'" in text and "'consume'" in text and "'reading'" in text
        assert "allowed there: abort, read_done" in text
    assert rec.state == model.state == "reading"
    assert rec.world.log == []


def test_machine_refuses_incomplete_bindings() -> None:
    guards, effects = bindings()
    del guards["host_short"]
    effects["surprise"] = lambda r: None
    with pytest.raises(IncompleteImplementation, match="missing guard implementations: host_short"):
        CompiledMachine(SPEC, guards, effects)  # type: ignore[arg-type]
