"""The CLI's check and diagram commands, through ``stagefate.cli.main``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.mutation import load_tests
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
    # the same bug as a program of public calls, which runs and fails on the planted spec
    program = out[out.index("from __future__ import annotations") :]
    assert "splice_correctness" in program
    (test,) = load_tests(program).values()
    with pytest.raises(AssertionError) as failed:
        test()  # on the planted spec: the model's predictions hold up to the breaking step
    assert failed.traceback[-2].name == "finish", "the books of the bad splice do not close"


def test_bounds_too_small_to_reach_every_edge_are_a_finding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--pages", "2", "--requests", "1", "--issues", "1"]) == 1
    out = capsys.readouterr().out
    assert "static checks passed" in out and "invariants hold in every state" in out
    assert "finding: edge never reached: parked --commit [span_inflight]-->" in out
    hint = "hint: --pages, --requests, --issues below the defaults leave a world too small"
    assert hint in " ".join(out.split())


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["fuzz", "--budget", "-3"], "argument --budget: must be greater than 0 (seconds to run)"),
        (["fuzz", "--steps", "0"], "argument --steps: must be at least 1 (states to check)"),
        (["fuzz", "--tp", "0"], "argument --tp: must be at least 1 (tensor-parallel ranks)"),
        (["check", "--pages", "0"], "argument --pages: must be at least 1"),
        (["check", "--host-pages", "-1"], "argument --host-pages: must be at least 0"),
        (["replay", "--page-size", "0"], "argument --page-size: must be at least 1 (tokens per"),
        (["replay", "--speed", "0"], "argument --speed: must be greater than 0"),
        (["replay", "--tp", "0"], "argument --tp: must be at least 1 (tensor-parallel ranks)"),
        (["replay", "--utilization", "0"], "argument --utilization: must be greater than 0"),
        (["replay", "--utilization", "1.2"], "argument --utilization: must lie in (0, 1]"),
        (["replay", "--speed", "fast"], "argument --speed: takes a number"),
        (["replay", "--instances", "0"], "argument --instances: must be at least 1"),
        (["replay", "--router", "nearest"], "argument --router: invalid choice: 'nearest'"),
        (["check", "--ranks", "0"], "argument --ranks: must be at least 1 (tensor-parallel"),
        (["replay", "--limit", "ten"], "argument --limit: takes a whole number"),
        (["fuzz", "--budget", "nan"], "argument --budget: takes a finite number"),
        (["fuzz", "--budget", "inf", "--steps", "200"], "argument --budget: takes a finite"),
        (["fuzz", "--seed", "-1"], "argument --seed: must be at least 0"),
        (["replay", "--speed", "inf"], "argument --speed: takes a finite number"),
        (["replay", "--speed", "1e-300"], "argument --speed: must be at least 0.001"),
        (["replay", "--utilization", "nan"], "argument --utilization: takes a finite number"),
    ],
)
def test_a_numeric_flag_out_of_range_is_refused_before_any_work(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "http" not in err


def test_check_refuses_more_requests_than_pages(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--pages", "2", "--requests", "3"]) == 2
    assert "pass --pages 3 or more" in capsys.readouterr().err


def test_a_validation_error_prints_the_field_without_pydantics_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A config pydantic refuses is reported as its field and message, never with a URL."""
    from pydantic import BaseModel, ValidationError

    from stagefate.cli import usage_message

    class Options(BaseModel):
        page_size: int

    with pytest.raises(ValidationError) as refused:
        Options(page_size="many")  # type: ignore[arg-type]
    message = usage_message(refused.value)
    assert message.startswith("invalid Options: page_size:") and "http" not in message


def test_an_internal_error_prints_its_traceback_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stagefate.cli import validate
    from stagefate.statemachine.errors import LifecycleError

    def broken(_args: object) -> int:
        raise LifecycleError("r", "staged", "hit")

    monkeypatch.setattr(validate, "run", broken)  # add_parser binds run when main builds it
    assert main(["validate", "whatever.jsonl"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "LifecycleError" in captured.err
    assert "internal error" in captured.err


def test_diagram_outside_a_checkout_names_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["diagram"]) == 2
    assert "pass --out DIR" in capsys.readouterr().err
    assert not (tmp_path / "docs").exists()
    assert main(["diagram", "--out", str(tmp_path / "here")]) == 0
    assert (tmp_path / "here" / "lifecycle.md").is_file()


def test_diagram_without_graphviz_names_the_extra_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the command that draws asks for Graphviz's binding (a GPU image has none)."""
    import importlib.util

    import stagefate.extras as extras

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        extras.importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "pygraphviz" else real_find_spec(name, *rest),
    )
    assert main(["diagram", "--out", str(tmp_path / "here")]) == 2
    assert "needs pygraphviz: pip install 'stagefate[tools]'" in capsys.readouterr().err
    assert not (tmp_path / "here").exists()


def test_fuzz_tp_runs_ranks_in_lockstep(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--tp", "2", "--steps", "300", "--seed", "1"]) == 0
    assert "over 2 ranks in lockstep" in capsys.readouterr().out


def test_fuzz_tp_refuses_another_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--tp", "2", "--target", "sglang", "--steps", "10"]) == 2
    assert "--tp fuzzes stagefate's own pipeline" in capsys.readouterr().err
    assert main(["fuzz", "--processes", "--steps", "10"]) == 2
    assert "give it with --tp 2 or more" in capsys.readouterr().err


def test_text_the_cli_did_not_write_is_printed_as_written(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """rich reads no markup in what the CLI prints: square brackets in a hint or a log survive."""
    from stagefate.cli.common import console, flagged

    flagged("error:", "install it: pip install 'stagefate[mooncake]'")
    console.print("no_anchor --hit [zero_pages]--> released")
    printed = capsys.readouterr().out
    assert "error: install it: pip install 'stagefate[mooncake]'" in printed
    assert "no_anchor --hit [zero_pages]--> released" in printed


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["replay", "--json", "{missing}/out.json"], "argument --json: the folder"),
        (["replay", "--json", "{folder}"], "argument --json: {folder} is a folder"),
        (["replay", "--plot", "{folder}/plot"], "argument --plot: must name a .png file"),
        (["replay", "--log", "{missing}/log.jsonl"], "argument --log: the folder"),
        (["fuzz", "--steps", "200", "--log", "{missing}/f.jsonl"], "argument --log: the folder"),
        (["check", "--emit-tests", "{file}"], "argument --emit-tests: {file} is a file"),
        (["diagram", "--out", "{missing}/docs"], "argument --out: the folder"),
        (["spec-diff", "stagefate", "stagefate", "--out", "{folder}"], "is a folder"),
        (["bench", "copy", "--report", "{missing}/b.md"], "argument --report: the folder"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    places = {"missing": tmp_path / "nope", "folder": tmp_path, "file": tmp_path / "a-file"}
    with pytest.raises(SystemExit) as exited:
        main([arg.format(**places) for arg in argv])
    assert exited.value.code == 2
    assert named.format(**places) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        # a replay that could never run (each once stalled, "pass a larger --device-tokens",
        # a bug report, or failed inside torch's allocator)
        (["replay", "--page-size", "100000"], "--max-prefill-tokens 16,384 is below one page"),
        (["replay", "--max-prefill-tokens", "1"], "pass --max-prefill-tokens 64 or more"),
        (["replay", "--chunked-prefill-size", "1"], "pass --chunked-prefill-size 64 or more"),
        (
            ["replay", "--device-tokens", "99999999999999"],
            "--device-tokens 99,999,999,999,999 is more",
        ),
        (["replay", "--host-tokens", "99999999999999"], "pass a smaller --host-tokens"),
        (
            ["replay", "--device-tokens", "10"],
            "--device-tokens 10 (64 in whole pages) cannot hold",
        ),
        # replay flags the rest of the line leaves without effect
        (["replay", "--speed", "1", "--sweep", "1,2"], "--sweep sets the speeds"),
        (
            ["replay", "--speed", "1", "--utilization", "0.5"],
            "--utilization is --speed auto's target",
        ),
        (["replay", "--utilization", "0.5"], "add --speed auto"),  # the slice runs at 0.3x
        (
            ["replay", "--router", "random"],
            "--router routes among --instances: add --instances 2",
        ),
        (["replay", "--sweep", ""], "--sweep takes finite speeds of at least 0.001"),
        (["replay", "--sweep", "1,inf"], "--sweep takes finite speeds of at least 0.001"),
        (["replay", "--sweep", "1,1e-300"], "--sweep takes finite speeds of at least 0.001"),
        # check flags that could not do what they say
        (["check", "--pages", "99999999999999999999"], "past 64 pages it cannot finish"),
        (["check", "--static", "--pages", "3"], "--static runs no model check: drop --pages"),
        (
            ["check", "--fuller-host", "1"],
            "--fuller-host shapes the ranks' model check: add --ranks 2",
        ),
        # a flag for another subcommand
        (["bench", "dispatch", "--peer", "sglang"], "--peer is for bench tree or lifecycle"),
        (["bench", "copy", "--trace", "t.jsonl"], "--trace is for bench replay, not copy"),
        (["bench", "all", "--limit", "5"], "--limit is for bench vllm or sglang, not all"),
        (["targets", "--force"], "drop the release and --force"),
        # issue 54's probe: absurd values once accepted
        (["replay", "--host-tokens", "8"], "--host-tokens 8 is below one page"),
        (["replay", "--host-tokens", "128"], "below --prefetch-threshold 256"),
        (["replay", "--tp", "3"], "tensor_parallel=3 does not divide Llama-3.1-8B's kv_heads=8"),
        (["replay", "--seeds", "100000000"], "--seeds 100,000,000: each seed is a whole replay"),
        (["replay", "--json", "{tmp}/x", "--log", "{tmp}/x"], "--json and --log both name"),
        (["replay", "--costs", "{tmp}/huge.yaml"], "each figure of the cost model is finite"),
        (["replay", "--trace", "{tmp}/far.jsonl"], "timestamp must be a finite number of ms"),
        (["replay", "--trace", "{tmp}/fifo"], "is not a regular file (a pipe or a device"),
        (["validate", "{tmp}/blank.jsonl"], "holds no transition (blank lines only)"),
    ],
)
def test_a_command_line_that_could_not_do_what_it_says_is_refused_before_any_work(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "huge.yaml").write_text("l3_latency_ms: 1.0e+300\n")
    row = {"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [1]}
    (tmp_path / "far.jsonl").write_text(json.dumps(row) + "\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "blank.jsonl").write_text("\n \n\n")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    command = [*argv[:1], "--limit", "5", *argv[1:]] if argv[0] == "replay" else argv
    assert main(command) == 2
    printed = " ".join(capsys.readouterr().err.split())
    assert named in printed and "internal error" not in printed
    assert "replaying" not in printed and "running bench" not in printed  # no work began


def test_validate_refuses_a_folder_an_empty_log_and_a_binary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty, binary = tmp_path / "empty.jsonl", tmp_path / "binary.jsonl"
    empty.write_text("")
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for path, named in (
        (tmp_path, "is a folder"),
        (empty, "is empty: nothing to validate"),
        (binary, f"{binary}: not a text file"),
    ):
        assert main(["validate", str(path)]) == 2
        assert named in " ".join(capsys.readouterr().err.split())


def test_a_searched_speed_is_one_a_user_can_type_back() -> None:
    """--speed auto once reported ×1.01544 and advised --speed 2.03088."""
    from stagefate.cli.replay import _three_digits

    assert _three_digits(1.01544) == 1.02 and _three_digits(2 * 1.01544) == 2.03
    assert _three_digits(0.300049) == 0.3


def test_piped_tables_keep_their_natural_width(capsys: pytest.CaptureFixture[str]) -> None:
    """Not on a terminal, nothing is wrapped or cut to 80 columns: a sweep table piped to a file
    once lost its last columns (issue 41)."""
    from rich.table import Table

    from stagefate.cli.common import UNWRAPPED_WIDTH, console

    assert console.width == UNWRAPPED_WIDTH  # pytest's captured stdout is not a terminal
    table = Table(title="a sweep of twelve columns")
    columns = [f"column {n} of twelve" for n in range(12)]
    for column in columns:
        table.add_column(column)
    table.add_row(*(f"{n:,} tokens read" for n in range(12)))
    console.print(table)
    lines = capsys.readouterr().out.splitlines()
    assert any(all(column in line for column in columns) for line in lines)  # one header line
    assert all("…" not in line for line in lines)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["replay", "--speed", "1", "--speed", "2"], "--speed 1.0 and --speed 2.0 both set speed"),
        (["fuzz", "--faults", "--no-faults"], "--faults and --no-faults both set faults"),
        (["check", "--pages", "3", "--pages", "4"], "both set pages"),
    ],
)
def test_a_flag_given_twice_is_refused_not_silently_overridden(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2 and named in capsys.readouterr().err


def test_a_command_re_run_in_another_environment_drops_the_flag_it_sets_anew() -> None:
    from stagefate.cli.fuzz import without_flag

    argv = ["--steps", "1", "--target", "sglang", "--seed", "0", "--target=sglang==0.5.19"]
    assert without_flag(argv, "--target") == ["--steps", "1", "--seed", "0"]
