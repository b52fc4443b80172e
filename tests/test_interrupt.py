"""Ctrl-C (issue 54): one line on standard error, exit 130, the workers stopped, nothing left
under an output's name, and no "reproduce this failure" for an interrupt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis.stateful import RuleBasedStateMachine, rule

from stagefate.cli import main
from stagefate.fuzz.campaign import reported_unless_interrupted
from stagefate.sim.replay import Replay


def test_an_interrupted_replay_exits_130_with_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def pressed(self: Replay, on_request: object = None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Replay, "run", pressed)
    outputs = ["--json", str(tmp_path / "r.json"), "--log", str(tmp_path / "r.jsonl")]
    assert main(["replay", "--limit", "20", "--policy", "live", *outputs]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "interrupted: stagefate replay stopped (Ctrl-C); what it would have written was not"
    ]
    assert list(tmp_path.iterdir()) == []  # no log, no temporary file, no lock


class _Interrupted(RuleBasedStateMachine):
    @rule()
    def press_ctrl_c(self) -> None:
        raise KeyboardInterrupt


def test_hypothesis_says_nothing_of_reproducing_an_interrupt(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    with pytest.raises(KeyboardInterrupt), reported_unless_interrupted():
        run_state_machine_as_test(_Interrupted, settings=settings(database=None, max_examples=1))
    assert "reproduce" not in capsys.readouterr().out


@pytest.mark.slow
def test_ctrl_c_stops_a_pool_of_replays_and_its_workers(tmp_path: Path) -> None:
    """A real SIGINT to a replay over seeds in two processes: the parent prints one line and
    exits 130; the workers (which ignore SIGINT) are stopped, not left to finish."""
    out = tmp_path / "r.json"
    command = [sys.executable, "-m", "stagefate", "replay", "--seeds", "4", "--jobs", "2"]
    process = subprocess.Popen(
        [*command, "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    for line in process.stdout:  # the pool is running once it says so
        if "in up to 2 processes" in line:
            break
    workers: list[int] = []
    deadline = time.monotonic() + 60  # spawned workers import torch first: slow on a busy machine
    while len(workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        listed = subprocess.run(
            ["pgrep", "-P", str(process.pid)], capture_output=True, text=True, check=False
        )
        workers = [int(pid) for pid in listed.stdout.split()]
    assert len(workers) >= 2, "the pool's workers are running"
    time.sleep(2)  # into their replays
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and time.monotonic() - started < 20
    assert err.strip().splitlines() == [
        "interrupted: stagefate replay stopped (Ctrl-C); what it would have written was not"
    ]
    assert list(tmp_path.iterdir()) == []
    deadline = time.monotonic() + 10  # (spawn's resource tracker leaves once its pipe closes)
    while [pid for pid in workers if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if _alive(pid)], "a worker lives on"


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "State:\tZ" not in status.read_text()  # a zombie has ended
    except OSError:
        return False


def test_a_fuzz_program_cut_short_leaves_no_log_one_that_ended_a_whole_one(
    tmp_path: Path,
) -> None:
    from stagefate.fuzz.fuzzer import configured

    log = tmp_path / "program.jsonl"
    machine = configured(log_path=str(log))()
    machine.setup(knobs={}, window=None)
    with pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        finally:  # as Hypothesis runs it
            machine.teardown()
    assert list(tmp_path.iterdir()) == []
    ended = configured(log_path=str(log))()
    ended.setup(knobs={}, window=None)
    ended.teardown()
    assert log.read_text() == '{"end": true, "transitions": 0}\n'
