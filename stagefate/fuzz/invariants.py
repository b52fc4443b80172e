"""Spec invariants as the stateful fuzzer checks them, and which one a failure broke."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from hypothesis.stateful import RuleBasedStateMachine, invariant

from ..runtime import ManualIO
from ..runtime.pools import PoolError
from ..spec.schema import Level, LifecycleSpec
from ..statemachine.pipeline import BufferPipeline
from ..statemachine.record import Record

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


# ---------------------------------------------------------------------- one pipeline's checks
# What both fuzzers (one pipeline, and each of N tensor-parallel ranks) assert of a pipeline.


def bounce_owned(pipe: BufferPipeline) -> int:
    """Bounce slots the live records hold."""
    return sum(
        len(r.host_indices) for r in pipe.live_records.values() if r.host_indices is not None
    )


def assert_pins_counted(pipe: BufferPipeline) -> None:
    """The pinned total is the records' pins, and within the cap."""
    pinned = [r for r in pipe.live_records.values() if r.pinned_node is not None]
    assert sum(r.pinned_tokens for r in pinned) == pipe.pinned_tokens
    assert pipe.pinned_tokens <= pipe.cap


def assert_books_close(pipe: BufferPipeline) -> None:
    """Every L3 read (and token) is spliced from, wasted, or still in flight."""
    stats, (reads, tokens) = pipe.stats, pipe.reads_in_flight()
    assert stats.l3_reads == pipe.spliced_from_reads() + stats.l3_reads_wasted + reads
    assert stats.l3_read_tokens == stats.spliced_tokens + stats.l3_read_tokens_wasted + tokens


def copies_in_flight(pipe: BufferPipeline) -> set[int]:
    """Device slots whose H2D copy has not run yet (a copy that ran is checked)."""
    assert isinstance(pipe.io, ManualIO), "the fuzzers step a ManualIO"
    queued = set(pipe.io.queued("load"))
    spliced = pipe.spec.group("spliced")
    return {
        int(slot)
        for r in pipe.live_records.values()
        if r.state in spliced and r.op_id in queued and r.device_indices is not None
        for slot in r.device_indices.tolist()
    }


def held(record: Record) -> dict[str, bool]:
    """What ``record`` holds, under the spec's resource names: ``pin`` the anchor's path lock or,
    after consume, the spliced tail's; ``bounce`` its host slots."""
    pinned = record.pinned_node is not None or record.spliced_node is not None
    return {"pin": pinned, "bounce": record.host_indices is not None}


def holds_problems(
    spec: LifecycleSpec, record: Record, resources: tuple[str, ...] = ("pin", "bounce")
) -> list[str]:
    """Where ``record`` holds other than its state's ``holds`` says, of ``resources``: one it
    must hold (``always``) and lacks, or one its state never holds and it has."""
    state = spec.states[record.state]
    problems = []
    for resource, has in held(record).items():
        if resource not in resources:
            continue
        level = state.level(resource)
        if level is Level.ALWAYS and not has:
            problems.append(f"{record.request_id} is {record.state} without its {resource}")
        elif level is Level.NONE and has:
            problems.append(f"{record.request_id} is {record.state} yet holds a {resource}")
    return problems
