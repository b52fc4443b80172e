"""Outputs that cannot clobber (issue 54): written whole or not at all, one run at a time,
one output a path, a transition log that says whether its run finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stagefate.bench.report import ReportMarkersError, Section, check_report, write_section
from stagefate.cli import main
from stagefate.output_files import (
    OutputLock,
    atomic_output,
    distinct_outputs,
    write_atomically,
)
from stagefate.transition_log import TransitionLog, closing_logs


def _listing(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_an_interrupted_write_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    out.write_text("old\n")
    with pytest.raises(KeyboardInterrupt), atomic_output(out) as handle:
        handle.write("half of the new")
        raise KeyboardInterrupt
    assert out.read_text() == "old\n" and _listing(tmp_path) == ["out.json"]
    write_atomically(out, "new\n")
    assert out.read_text() == "new\n" and _listing(tmp_path) == ["out.json"]
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as any file the user writes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _other_run_opens(out: Path) -> subprocess.CompletedProcess[str]:
    program = (
        "import sys\n"
        "from stagefate.transition_log import TransitionLog\n"
        "TransitionLog.open(sys.argv[1]).close()\n"
    )
    command = [sys.executable, "-c", program, str(out)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_a_second_run_on_the_same_output_is_refused_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    first = TransitionLog.open(out)
    refused = _other_run_opens(out)
    assert refused.returncode != 0 and "OutputBusy" in refused.stderr
    assert f"{out}: another run is writing it now" in refused.stderr
    first.close()
    assert _other_run_opens(out).returncode == 0  # free again once the first closed
    assert _listing(tmp_path) == ["log.jsonl"]  # no lock file left behind


def test_the_lock_is_the_processes_not_a_handles(tmp_path: Path) -> None:
    """A run holding an output for its whole length may write it (re-entrant in-process)."""
    out = tmp_path / "out.json"
    held = OutputLock(out).acquire()
    write_atomically(out, "{}\n")
    held.release()
    assert _listing(tmp_path) == ["out.json"]


def test_one_path_for_two_outputs_is_refused() -> None:
    distinct_outputs([("--json", "a.json"), ("--log", None), ("--plot", "a.png")])
    with pytest.raises(ValueError, match="--json and --log both name"):
        distinct_outputs([("--json", "x"), ("--log", "./x")])


def test_a_log_has_a_closing_record_and_one_cut_short_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    assert main(["replay", "--limit", "20", "--policy", "live", "--log", str(log)]) == 0
    lines = log.read_text().splitlines()
    assert json.loads(lines[-1]) == {"end": True, "transitions": len(lines) - 1}
    assert main(["validate", str(log)]) == 0
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[: len(lines) // 2]) + "\n")
    capsys.readouterr()
    assert main(["validate", str(cut)]) == 1
    assert "CUT SHORT" in capsys.readouterr().out
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("\n".join([*lines[:-2], lines[-1]]) + "\n")
    assert main(["validate", str(wrong)]) == 1
    assert "the closing record counts" in " ".join(capsys.readouterr().out.split())
    after = tmp_path / "after.jsonl"
    after.write_text("\n".join([*lines, lines[0]]) + "\n")
    assert main(["validate", str(after)]) == 1
    assert "a line after the log's closing record" in capsys.readouterr().out


def test_a_log_of_a_run_that_stopped_short_is_not_left_behind(tmp_path: Path) -> None:
    log = TransitionLog.open(tmp_path / "run.jsonl")
    with pytest.raises(KeyboardInterrupt), closing_logs([log]):
        log.record("r", "issued", "lock", "root_prefix", "no_anchor", None)
        raise KeyboardInterrupt
    assert _listing(tmp_path) == []


def test_validate_refuses_a_file_of_blank_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n  \n")
    assert main(["validate", str(blank)]) == 2
    assert "holds no transition" in capsys.readouterr().err


def test_replay_refuses_one_path_for_two_outputs_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    same = str(tmp_path / "x")
    assert main(["replay", "--limit", "20", "--json", same, "--log", same]) == 2
    assert "--json and --log both name" in capsys.readouterr().err
    assert _listing(tmp_path) == []


def test_a_read_only_output_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.json"
    out.write_text("{}\n")
    out.chmod(0o444)
    real_access = os.access

    def as_a_user(path: object, mode: int) -> bool:  # root may write a read-only file
        return not (mode & os.W_OK and Path(str(path)) == out) and real_access(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", as_a_user)
    with pytest.raises(SystemExit) as refused:  # argparse's own refusal of the flag
        main(["replay", "--limit", "20", "--json", str(out)])
    assert refused.value.code == 2
    assert "exists and is read-only" in capsys.readouterr().err
    assert out.read_text() == "{}\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("<!-- bench:a -->\nmine\n", "opened at line 1 is never closed"),
        ("<!-- bench:a -->\n<!-- bench:b -->\n<!-- /bench:b -->\n", "inside 'a'"),
        ("user's words\n<!-- /bench:a -->\n", "closes section 'a', which is not open"),
    ],
)
def test_a_report_with_stray_markers_is_refused_and_kept(
    tmp_path: Path, text: str, problem: str
) -> None:
    report = tmp_path / "benchmarks.md"
    report.write_text(text)
    with pytest.raises(ReportMarkersError, match=problem):
        check_report(report)
    with pytest.raises(ReportMarkersError):
        write_section(Section("a", "A", "figures"), "stagefate bench a", report)
    assert report.read_text() == text
