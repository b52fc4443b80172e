"""Code written from the spec (spec/names.py's Literal types, statemachine/stats.py's Stats):
current with the spec, and what makes mypy reject a misspelt state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stagefate.spec import load_spec
from stagefate.spec.codegen import COMMAND, NAMES_FILE, STATS_FILE, render, render_stats
from stagefate.spec.names import LockableState, StateName
from stagefate.statemachine.pipeline import LockOutcome
from stagefate.statemachine.stats import Stats


def test_the_committed_names_are_what_the_spec_gives() -> None:
    assert NAMES_FILE.read_text(encoding="utf-8") == render(load_spec()), (
        f"spec/names.py is stale: run `{COMMAND}` and commit it"
    )


def test_the_committed_stats_are_what_the_spec_gives() -> None:
    assert STATS_FILE.read_text(encoding="utf-8") == render_stats(load_spec()), (
        f"statemachine/stats.py is stale: run `{COMMAND}` and commit it"
    )


def test_stats_has_a_field_per_counter_described_in_the_spec_s_words() -> None:
    spec = load_spec()
    assert tuple(Stats.model_fields) == spec.all_counters
    assert Stats.model_fields["l3_reads_wasted"].description == spec.counters["l3_reads_wasted"]
    assert spec.reasons["filled"] in (Stats.model_fields["filled"].description or "")


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
