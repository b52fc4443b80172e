"""The transition log and ``stagefate validate``: real runs validate; every broken rule is caught
at its line; a malformed line is a clear error."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from hypothesis.stateful import run_state_machine_as_test

from stagefate.cli import main
from stagefate.fuzz.fuzzer import configured
from stagefate.spec import load_spec
from stagefate.transition_log import TransitionLog, validate_log

from .harness import config, fuzz_settings, make_pair, seq_of, settle


def _scenario_log() -> list[dict[str, object]]:
    """A filled prefetch, a revoked miss and an abort, logged."""
    pair = make_pair(config(4))
    sink = io.StringIO()
    pair.consumer.instruments.append(TransitionLog(sink))
    seq = seq_of(4, 4)
    pair.publish(seq, mark=9)
    consumer = pair.consumer
    consumer.prefetch_from_storage("a", seq, 0)
    consumer.prefetch_from_storage("miss", seq_of(4, 4, start=900), 0)
    consumer.prefetch_from_storage("gone", seq_of(4, 4, start=500), 0)
    consumer.release_aborted_request("gone")
    settle(consumer)
    assert consumer.plan_staged_splice("a", 0) == (16, 0)
    consumer.init_load_back("a", torch.empty(0, dtype=torch.int64))
    settle(consumer)
    return [json.loads(line) for line in sink.getvalue().splitlines()]


def _write(path: Path, steps: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(step) + "\n" for step in steps))
    return path


def test_a_scenario_log_follows_the_spec() -> None:
    steps = _scenario_log()
    assert [s["seq"] for s in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["target"] == "released" and steps[-1]["reason"] == "filled"
    summary = validate_log((json.dumps(s) for s in steps), load_spec())
    assert summary.violation is None
    assert summary.records == 3 and dict(summary.ended) == {
        "filled": 1,
        "revoked_full_miss": 1,
        "aborted": 1,
    }
    assert not summary.live


def test_replay_and_fuzzer_logs_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "replay.jsonl"
    assert main(["replay", "--limit", "40", "--policy", "live", "--log", str(log)]) == 0
    assert main(["validate", str(log)]) == 0
    assert "follow the spec" in capsys.readouterr().out
    fuzz_log = tmp_path / "fuzz.jsonl"
    kept: list[str] = []  # each program rewrites the log: keep every program's

    class Keeping(configured(log_path=str(fuzz_log))):  # type: ignore[misc]
        def teardown(self) -> None:
            super().teardown()
            kept.append(fuzz_log.read_text())

    run_state_machine_as_test(Keeping, settings=fuzz_settings(examples=6, steps=60))
    written = [text for text in kept if text.strip()]
    assert written, "no program fired a transition"
    for number, text in enumerate(written):
        program = tmp_path / f"program-{number}.jsonl"
        program.write_text(text)
        assert main(["validate", str(program)]) == 0


def _broken(steps: list[dict[str, object]], kind: str) -> tuple[list[dict[str, object]], int]:
    """``steps`` with one rule broken; returns them and the (1-based) line that breaks it."""
    steps = [dict(s) for s in steps]
    first_end = next(i for i, s in enumerate(steps) if s["reason"] is not None)
    follow = next(i for i, s in enumerate(steps) if s["request"] == "a" and i > 0)
    if kind == "source":
        steps[follow]["source"] = "parked"
        return steps, follow + 1
    if kind == "edge":
        steps[follow]["guard"] = "moon_phase"
        return steps, follow + 1
    if kind == "target":
        steps[0]["target"] = "locked"
        return steps, 1
    if kind == "reason":
        steps[first_end]["reason"] = "filled"
        return steps, first_end + 1
    if kind == "after_end":  # the ended record takes one more step
        again = dict(steps[first_end], seq=10_000)
        return [*steps, again], len(steps) + 1
    if kind == "start":
        steps[0]["source"] = "locked"
        return steps, 1
    assert kind == "seq"
    steps[1]["seq"] = steps[0]["seq"]
    return steps, 2


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("source", "but the step leaves 'parked'"),
        ("edge", "[moon_phase]--> is not an edge of the spec"),  # brackets printed as written
        ("target", "leads to 'no_anchor', not 'locked'"),
        ("reason", "not 'filled'"),
        ("after_end", "has no live record"),
        ("start", "must start a record at 'issued'"),
        ("seq", "does not follow"),
    ],
)
def test_validate_reports_the_first_broken_step_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    steps, line = _broken(_scenario_log(), kind)
    log = _write(tmp_path / f"{kind}.jsonl", steps)
    assert main(["validate", str(log)]) == 1
    printed = capsys.readouterr().out
    assert f"INVALID {log}:line {line}: " in printed
    assert message in printed


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ('["a list"]', "line 2: expected a JSON object"),
        ('{"seq": 9, "request": "x"}', "line 2: missing field(s) source, event, guard"),
        (
            '{"seq": "9", "request": "x", "source": "issued", "event": "lock", "guard": "else",'
            ' "target": "locked", "reason": null}',
            "line 2: seq must be an integer",
        ),
    ],
)
def test_a_malformed_line_is_a_clear_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    first = json.dumps(_scenario_log()[0])
    log = tmp_path / "bad.jsonl"
    log.write_text(first + "\n" + line + "\n")
    assert main(["validate", str(log)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_validate_names_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
