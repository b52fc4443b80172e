"""The stateful fuzzer over the real pipeline, at the active Hypothesis profile (``ci``: fast)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from stagefate.cli.fuzz import _violation
from stagefate.fuzz.campaign import failing_programs
from stagefate.fuzz.fuzzer import PipelineFuzzer
from stagefate.fuzz.invariants import InvariantViolated, holds_problems
from stagefate.fuzz.world import KNOB_CHOICES, PAGE, mark
from stagefate.runtime.hashing import ROOT_NAMESPACE
from stagefate.spec import load_spec
from stagefate.statemachine.record import Record

TestPipelineFuzz = PipelineFuzzer.TestCase


def _world_with_a_published_prefix() -> PipelineFuzzer:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None)
    fuzzer.sibling_publish(sequence=0, pages=3, salt="tenant-b")
    return fuzzer


def test_namespace_isolation_catches_a_slot_holding_another_namespaces_kv() -> None:
    fuzzer = _world_with_a_published_prefix()
    fuzzer.namespace_isolation()  # the clean world passes
    node = fuzzer.pipe.tree.nodes()[0]
    slot = int(node.value[1])
    fuzzer.pipe.device_pool.kv[:, :, slot] = float(mark([node.tokens()[1]], None)[0])
    with pytest.raises(InvariantViolated, match="namespace_isolation: KV of another namespace"):
        fuzzer.namespace_isolation()


def test_plan_equals_consume_catches_a_splice_of_another_size() -> None:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None)
    fuzzer.issue(request_id="r0", sequence=0, pages=4, salt=None, stale=False)
    fuzzer.complete_all_io()  # the existence query; the commit launches the read
    fuzzer.complete_all_io()  # the read: staged
    fuzzer.admit(request_id="r0")
    record = fuzzer.pipe.live_records["r0"]
    assert record.state == "consumed"
    fuzzer.plan_equals_consume()
    record.plan_prefix = 0 if record.plan_prefix else PAGE  # charged at the plan: another size
    with pytest.raises(InvariantViolated, match="plan_equals_consume"):
        fuzzer.plan_equals_consume()


def test_a_program_runs_under_the_knobs_it_drew() -> None:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None, knobs={"host_tokens": 4, "dedup_inflight": False})
    config = fuzzer.pipe.config
    assert (config.host_tokens, config.dedup_inflight) == (4, False)
    assert config.retry_max_attempts == KNOB_CHOICES["retry_max_attempts"][0]  # not drawn


def test_a_retracted_request_prefetches_its_prompt_again_under_its_id() -> None:
    fuzzer = PipelineFuzzer()
    fuzzer.setup(window=None)
    fuzzer.issue(request_id="r0", sequence=0, pages=4, salt=None, stale=False)
    fuzzer.complete_all_io()
    fuzzer.complete_all_io()
    assert not fuzzer._retractable()  # staged: not running yet
    fuzzer.admit(request_id="r0")
    fuzzer.complete_all_io()  # the load back lands: r0 runs
    assert "r0" not in fuzzer.pipe.live_records and fuzzer._retractable() == ["r0"]
    fuzzer.evict(tokens=40)  # its KV left the device while it was out of the batch
    fuzzer.retract(request_id="r3")  # the draw falls through to the one retractable request
    assert (
        fuzzer.pipe.live_records["r0"].tokens.tolist() == fuzzer.asked["r0"][0]
    )  # the same prompt
    assert not fuzzer._retractable()


class _FailsOnSeven(RuleBasedStateMachine):
    @rule(x=st.integers(0, 10))
    def step(self, x: int) -> None:
        assert x < 7, "seven or more"


def test_a_campaigns_failure_prints_its_minimal_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hypothesis attaches the program to the error as notes (it prints none outside pytest):
    the CLI prints them, runnable, above the violation."""
    with pytest.raises(AssertionError) as failed:
        run_state_machine_as_test(_FailsOnSeven, settings=settings(database=None, max_examples=50))
    (program,) = failing_programs(failed.value)
    assert "state = _FailsOnSeven()\nstate.step(x=7)" in program
    assert program.startswith("# AssertionError: seven or more")
    assert _violation(failed.value, Path("db")) == 1
    out = capsys.readouterr().out
    assert out.index("state.step(x=7)") < out.index("VIOLATION AssertionError: seven or more")
    assert "The minimal failing program is printed above; the example is saved in db" in out


def test_what_a_record_holds_is_checked_against_its_states_holds() -> None:
    spec = load_spec()
    record = Record("r0", (1, 2), 0, ROOT_NAMESPACE, state="consumed")
    assert holds_problems(spec, record) == [
        "r0 is consumed without its pin",
        "r0 is consumed without its bounce",
    ]
    record.state = "no_anchor"
    record.host_indices = np.arange(2)
    assert holds_problems(spec, record) == ["r0 is no_anchor yet holds a bounce"]
    record.state = "staged"  # pin: maybe, bounce: always
    assert holds_problems(spec, record) == []
    record.state = "consumed"  # each invariant asks of its own resource
    assert holds_problems(spec, record, ("pin",)) == ["r0 is consumed without its pin"]
    assert holds_problems(spec, record, ("bounce",)) == []
