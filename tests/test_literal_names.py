"""The spec's names as Literal types (spec/names.py): current with the spec, and what makes
mypy reject a misspelt state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stagefate.spec import load_spec
from stagefate.spec.literal_names import COMMAND, NAMES_FILE, render
from stagefate.spec.names import LockableState, StateName
from stagefate.statemachine.pipeline import LockOutcome


def test_the_committed_names_are_what_the_spec_gives() -> None:
    assert NAMES_FILE.read_text(encoding="utf-8") == render(load_spec()), (
        f"spec/names.py is stale: run `{COMMAND}` and commit it"
    )


def test_the_types_hold_the_spec_s_names() -> None:
    spec = load_spec()
    assert StateName.__args__ == tuple(spec.states)  # type: ignore[attr-defined]
    assert set(LockableState.__args__) == spec.group("lockable")  # type: ignore[attr-defined]
    assert LockOutcome is LockableState


@pytest.mark.slow
def test_mypy_rejects_a_misspelt_state(tmp_path: Path) -> None:
    program = tmp_path / "typo.py"
    program.write_text(
        "from stagefate.statemachine.record import Record\n\n\n"
        "def locked(record: Record) -> bool:\n"
        '    return record.state == "lockd"\n'
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(program)], capture_output=True, text=True
    )
    assert checked.returncode == 1
    assert "Non-overlapping equality check" in checked.stdout and "lockd" in checked.stdout
