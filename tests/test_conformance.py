"""The compiled table and the ``transitions`` oracle agree on every state, for any events."""

from __future__ import annotations

import traceback
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
        assert "allowed there: abort, give_up, read_done" in text
    assert rec.state == model.state == "reading"
    assert rec.world.log == []


def test_machine_refuses_incomplete_bindings() -> None:
    guards, effects = bindings()
    del guards["host_short"]
    effects["surprise"] = lambda r: None
    with pytest.raises(IncompleteImplementation) as refused:
        CompiledMachine(SPEC, guards, effects)  # type: ignore[arg-type]
    assert "guards the spec declares with no implementation: host_short" in str(refused.value)
    assert "effect implementations the spec never declares: surprise" in str(refused.value)


def test_machine_refuses_counts_that_are_not_the_specs() -> None:
    """A counter the spec adds that Stats lacks is refused at build, not as a KeyError inside a
    generated row after its effects ran."""
    guards, effects = bindings()
    counts = dict.fromkeys(SPEC.all_counters, 0)
    del counts["parked"]
    with pytest.raises(
        IncompleteImplementation,
        match=r"counters the spec declares with no implementation: parked .*statemachine/stats.py",
    ):
        CompiledMachine(SPEC, guards, effects, counts=counts)  # type: ignore[arg-type]
    with pytest.raises(IncompleteImplementation, match="does not declare: hold_on"):
        CompiledMachine(SPEC, guards, effects, groups=("hold_on",))  # type: ignore[arg-type]


def test_a_branch_counts_then_runs_the_spec_s_exits_then_ends_after_its_effects() -> None:
    guards, effects = bindings()
    counts = dict.fromkeys(SPEC.all_counters, 0)
    world = World(dict.fromkeys(SPEC.guards, False))

    def hook(name: str) -> Callable[[Rec], None]:
        def run(r: Rec) -> None:
            r.world.log.append(f"exit {name} { ({k: n for k, n in counts.items() if n}) }")

        return run

    def end(r: Rec, reason: str) -> None:
        r.world.log.append(f"end {reason}")

    exits = {name: hook(name) for name in SPEC.exits}
    compiled = CompiledMachine(SPEC, guards, effects, counts, exits, end)  # type: ignore[arg-type]
    rec = Rec("r1", world)
    assert compiled.decide(rec, "lock").target == "locked" and world.log == []  # nothing ran
    compiled.fire(rec, "lock")
    compiled.fire(rec, "hit")
    assert world.log == ["pin_anchor", "record_hit"]  # no exit: nothing left a group
    world.answers["host_short"] = True
    compiled.fire(rec, "commit")
    world.answers["host_short"] = False
    world.log.clear()
    assert compiled.fire(rec, "commit").target == "reading"
    assert world.log == [
        "pin_if_possible",
        "alloc_bounce",
        "launch_read",
        "exit leave_parked_fifo {'issued': 1, 'locked': 1, 'parked': 1}",
    ]
    world.log.clear()
    world.answers["read_empty"] = True
    compiled.fire(rec, "read_done")
    assert world.log == [
        "unpin",
        "free_bounce",
        "exit disown_span {'issued': 1, 'locked': 1, 'parked': 1}",
        "end discarded",
    ]
    assert rec.state == "released"


def test_a_machine_refuses_exits_other_than_the_spec_s() -> None:
    guards, effects = bindings()
    with pytest.raises(IncompleteImplementation, match="exits the spec declares with no impl"):
        CompiledMachine(SPEC, guards, effects, exits={"leave_parked_fifo": print})  # type: ignore[arg-type]


def test_a_raising_guard_changes_nothing_and_its_traceback_shows_the_generated_row() -> None:
    guards, effects = bindings()

    def broken(_r: Rec) -> bool:
        raise RuntimeError("guard failed")

    guards["below_threshold"] = broken
    compiled = CompiledMachine(SPEC, guards, effects)  # type: ignore[arg-type]
    rec = Rec("r1", World(dict.fromkeys(SPEC.guards, False)))
    with pytest.raises(RuntimeError) as info:
        compiled.fire(rec, "lock")
    assert rec.state == "issued" and rec.world.log == []
    shown = "".join(traceback.format_exception(info.value))
    assert "<stagefate lifecycle" in shown and "# 'below_threshold'" in shown
