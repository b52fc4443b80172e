"""Tests with teeth: five planted bugs, each caught by the model checker and by the fuzzer.

For the model checker a bug is planted in the spec (the YAML text) or in the abstract meaning of
an effect; for the fuzzer it is planted in the real pipeline's method. The clean code passes both
(tests/test_fuzz.py and ``stagefate check`` in CI).
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from stagefate.fuzz.fuzzer import configured
from stagefate.fuzz.invariants import violated_invariant
from stagefate.spec import model_rules
from stagefate.spec.load import DEFAULT_SPEC_PATH, parse_spec
from stagefate.spec.model_world import Bounds, Rec
from stagefate.spec.modelcheck import ModelChecker
from stagefate.statemachine.pipeline import BufferPipeline
from stagefate.statemachine.record import Record

from .harness import fuzz_settings

CAUGHT_BY: dict[str, tuple[str, set[str]]] = {
    # bug: (the invariant the model checker reports, those the fuzzer may report first)
    "anchor_pin_never_taken": ("pin_balance", {"pin_safety"}),
    "trim_ignored": ("aux_and_ownership", {"splice_correctness"}),
    "hold_not_released_at_plan": ("exactly_once_end", {"hold_release"}),
    # the checker's bounce overdraws the pool (free + owned != capacity) before the record's
    # own holds are looked at; the fuzzer sees either a bounce on a record before its commit or,
    # when the first program found revokes that record, the bounce it leaked
    "bounce_before_commit_verdict": ("hold_release", {"pure_revoke", "hold_release"}),
    "aborted_read_bounce_freed_twice": ("hold_release", {"hold_release"}),
}
"""Which spec invariant each planted bug breaks: a failure of any other kind (a typo in the
patch, a crash in a rule) does not count as caught."""
BUGS = list(CAUGHT_BY)
SMALL = Bounds(pages=4, requests=2, host_pages=2, device_pages=3, issues_per_request=1)


# ---------------------------------------------------------------------- the model checker


def _spec_with(old: str, new: str) -> object:
    text = DEFAULT_SPEC_PATH.read_text()
    assert old in text, f"the planted edit no longer applies: {old!r}"
    return parse_spec(yaml.safe_load(text.replace(old, new, 1)))


def _untrimmed_splice(mc: object, d: object, i: int, r: Rec, a: object) -> object:
    model_rules.splice(d, i, r.matched, r.span_end)  # type: ignore[arg-type]
    return r


def _model_bug(name: str, monkeypatch: pytest.MonkeyPatch) -> object:
    """The spec the checker runs, with ``name`` planted."""
    clean = _spec_with("", "")
    if name == "anchor_pin_never_taken":
        return _spec_with(
            "{to: locked, effects: [pin_anchor], count: [issued, locked]}",
            "{to: locked, count: [issued, locked]}",
        )
    if name == "trim_ignored":
        monkeypatch.setitem(model_rules.EFFECTS, "insert_tail", _untrimmed_splice)
        return clean
    if name == "hold_not_released_at_plan":
        return _spec_with(
            "reason: device_covered\n        effects: [unpin, free_bounce]",
            "reason: device_covered\n        effects: [unpin]",
        )
    if name == "bounce_before_commit_verdict":
        return _spec_with(
            "{to: same, effects: [record_hit]}", "{to: same, effects: [record_hit, alloc_bounce]}"
        )
    assert name == "aborted_read_bounce_freed_twice"
    return _spec_with(
        "      - {to: abandoned, effects: [unpin]}",
        "      - {to: abandoned, effects: [unpin, free_bounce]}",
    )


@pytest.mark.parametrize("bug", BUGS)
def test_model_checker_catches(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    result = ModelChecker(_model_bug(bug, monkeypatch), SMALL).run()  # type: ignore[arg-type]
    assert result.violation is not None, f"{bug} went unnoticed over {result.states} states"
    assert result.counterexample, "a violation comes with its steps"
    assert result.invariant == CAUGHT_BY[bug][0], result.violation


def test_model_checker_passes_the_clean_spec() -> None:
    result = ModelChecker(_spec_with("", ""), SMALL).run()  # type: ignore[arg-type]
    assert result.violation is None and not result.truncated


# ---------------------------------------------------------------------- the fuzzer


def _skip_pin(self: BufferPipeline, record: Record) -> None:
    return None


def _planted_pipeline_bug(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cls = BufferPipeline
    if name == "anchor_pin_never_taken":
        monkeypatch.setattr(cls, "_effect_pin_anchor", _skip_pin)
    elif name == "trim_ignored":
        queue = cls._effect_queue_h2d

        def untrimmed(self: BufferPipeline, record: Record) -> None:
            """Copy the bounce from its start, as if nothing had been trimmed."""
            assert record.plan_prefix is not None and record.host_indices is not None
            trim, saved = record.plan_prefix - record.matched_len, record.host_indices
            if trim:
                record.host_indices = np.concatenate([saved[:trim], saved[: len(saved) - trim]])
            queue(self, record)
            record.host_indices = saved

        monkeypatch.setattr(cls, "_effect_queue_h2d", untrimmed)
    elif name == "hold_not_released_at_plan":
        free = cls._effect_free_bounce

        def keep_hold(self: BufferPipeline, record: Record) -> None:
            if record.state not in ("staged", "trimmed"):
                free(self, record)

        monkeypatch.setattr(cls, "_effect_free_bounce", keep_hold)
    elif name == "bounce_before_commit_verdict":
        hit = cls._effect_record_hit

        def early_bounce(self: BufferPipeline, record: Record) -> None:
            hit(self, record)
            tokens = min(record.hit_tokens, record.span_tokens)
            record.host_indices = self.host_pool.alloc_array(tokens)

        monkeypatch.setattr(cls, "_effect_record_hit", early_bounce)
    else:
        assert name == "aborted_read_bounce_freed_twice"
        unpin = cls._effect_unpin

        def free_on_abort(self: BufferPipeline, record: Record) -> None:
            unpin(self, record)
            if record.state == "reading" and record.host_indices is not None:
                self.host_pool.free(record.host_indices)  # and again when the read completes

        monkeypatch.setattr(cls, "_effect_unpin", free_on_abort)


FUZZ = fuzz_settings(examples=300, steps=60)  # caught is enough: no time spent shrinking


@pytest.mark.slow
@pytest.mark.parametrize("bug", BUGS)
def test_fuzzer_catches(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _planted_pipeline_bug(bug, monkeypatch)
    with pytest.raises(Exception) as caught:  # which one: asserted below
        run_state_machine_as_test(configured(faults=True), settings=FUZZ)
    assert violated_invariant(caught.value) in CAUGHT_BY[bug][1], repr(caught.value)


@pytest.mark.slow
def test_fuzzer_passes_the_clean_pipeline_at_the_same_budget() -> None:
    run_state_machine_as_test(configured(faults=True), settings=FUZZ)


@pytest.mark.slow
def test_the_minimal_failing_program_prints_as_calls_that_replay_the_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hypothesis's report of a caught bug is a program one can paste: plain calls with named
    arguments (no ``data(...)`` draws), which raise the same invariant when run again."""
    _planted_pipeline_bug("anchor_pin_never_taken", monkeypatch)
    machine = configured(faults=True)
    shrinking = settings(FUZZ, phases=[Phase.explicit, Phase.generate, Phase.shrink])
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine, settings=shrinking)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    lines = notes.splitlines()
    start = lines.index("state = PipelineFuzzer()")
    calls = [i for i, line in enumerate(lines) if line.startswith(("state", "requests_"))]
    end = calls[-1] + 1
    while end < len(lines) and lines[end].startswith(" "):
        end += 1  # a long call (the drawn knobs) wraps onto indented lines
    program = lines[start:end]
    assert "data(" not in notes
    with pytest.raises(Exception) as replayed:  # which one: asserted below
        exec("\n".join(program), {"PipelineFuzzer": machine})  # the report, pasted
    assert violated_invariant(replayed.value) == violated_invariant(caught.value) == "pin_safety"
