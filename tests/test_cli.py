"""The CLI's check and diagram commands, through ``stagefate.cli.main``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.spec.load import DEFAULT_SPEC_PATH

REPO = Path(__file__).resolve().parent.parent


def test_check_passes_on_the_shipped_spec() -> None:
    assert main(["check", "--static"]) == 0


def test_committed_diagrams_are_in_step_with_the_spec() -> None:
    assert main(["diagram", "--check", "--out", str(REPO / "docs")]) == 0


def test_diagram_check_detects_stale_docs(tmp_path: Path) -> None:
    assert main(["diagram", "--out", str(tmp_path)]) == 0
    assert main(["diagram", "--check", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "lifecycle.md").read_text()
    (tmp_path / "lifecycle.md").write_text(text.replace("abandoned", "abandonned", 1))
    assert main(["diagram", "--check", "--out", str(tmp_path)]) == 1
    assert main(["diagram", "--out", str(tmp_path)]) == 0
    (tmp_path / "lifecycle-hold.svg").unlink()  # a phase diagram counts as much as the overview
    assert main(["diagram", "--check", "--out", str(tmp_path)]) == 1


def test_phase_diagrams_label_every_branch_with_event_guard_and_effects() -> None:
    text = (REPO / "docs" / "lifecycle.md").read_text()
    assert '-- "abort [else] / unpin" --> n_abandoned' in text
    assert "commit [live_match_short] / unpin, arm_retry" in text
    assert "## Phase: anchor lock" in text and "## Phase: end" not in text


def test_check_reports_a_broken_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "lifecycle.yaml"
    shutil.copy(REPO / "spec" / "lifecycle.yaml", broken)
    broken.write_text(
        broken.read_text().replace("effects: [unpin, free_bounce]}", "effects: [unpin]}", 1)
    )
    assert main(["check", "--spec", str(broken)]) == 1
    assert "leaks 'bounce'" in capsys.readouterr().out


def test_check_prints_the_shortest_counterexample_of_a_planted_bug(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trim before asking whether the device holds the whole span: statically fine, wrong."""
    text = DEFAULT_SPEC_PATH.read_text()
    covered = (
        "      - guard: span_device_resident\n        to: released\n"
        "        reason: device_covered\n        effects: [unpin, free_bounce]\n"
        "        count: [released_unusable]\n"
    )
    trim = "      - {guard: trim_positive, to: trimmed, effects: [record_plan]}\n"
    assert covered in text and trim in text
    spec = tmp_path / "lifecycle.yaml"
    spec.write_text(text.replace(covered, "").replace(trim, trim + covered))
    assert main(["check", "--spec", str(spec), "--issues", "1"]) == 1
    out = capsys.readouterr().out
    assert "static checks passed" in out and "VIOLATION splice_correctness:" in out
    assert "  1. r0: prefetch_from_storage" in out and "  7. r0: init_load_back" in out


def test_bounds_too_small_to_reach_every_edge_are_a_finding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--pages", "2", "--requests", "1", "--issues", "1"]) == 1
    out = capsys.readouterr().out
    assert "static checks passed" in out and "invariants hold in every state" in out
    assert "finding: edge never reached: parked --commit [span_inflight]-->" in out
