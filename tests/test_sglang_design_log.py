"""SGLang's runs validated against its own design: the transition log its decisions write
(stagefate/targets/sglang/design_log/) follows the design of its release and knobs
(spec/designs/), on every installed release, and a log tampered with is refused, naming the
line. Runs where `make sglang` (and `stagefate targets install`) installed SGLang."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stagefate.cli import main
from stagefate.spec import load_spec
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.transition_log import validate_log

DESIGN = DEFAULT_SPEC_PATH.parent / "designs" / "sglang-0.5.23.yaml"


LOCK_ON = {"SGLANG_ENABLE_HICACHE_BUFFER_ANCHOR_LOCK": "1"}


def test_each_release_is_written_in_its_own_designs_words() -> None:
    from stagefate.targets.sglang.design_log import DESIGNS, design_path

    prepare = SimpleNamespace(prepare_staged_prefetch=None)
    assert design_path(prepare) == DESIGNS / "sglang-0.5.23.yaml"
    for lock, name in [(False, "sglang-0.5.19.yaml"), (True, "sglang-0.5.19-anchor-lock.yaml")]:
        assert design_path(SimpleNamespace(anchor_lock_enabled=lock)) == DESIGNS / name


@pytest.fixture(scope="module")
def genuine_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted program on this interpreter's SGLang (worker.one_logged_program): a whole
    fill, an abort while querying, a hold let go by an abort, an abort while reading, a hit
    too short."""
    from stagefate.targets import TargetUnavailable
    from stagefate.targets.sglang import require

    try:
        require()
    except TargetUnavailable as missing:
        pytest.skip(str(missing))
    from stagefate.targets.sglang.worker import one_logged_program

    path = tmp_path_factory.mktemp("design") / "sglang.jsonl"
    assert Path(one_logged_program(str(path))) == DESIGN
    return path


@pytest.mark.slow
def test_sglangs_run_follows_its_design(genuine_log: Path) -> None:
    lines = genuine_log.read_text().splitlines()
    summary = validate_log(lines, load_spec(DESIGN))
    assert summary.violation is None
    assert not summary.live
    assert summary.ended == {"filled": 1, "aborted": 3, "below_threshold": 1}
    taken = {(state, event) for state, event, _guard in summary.edges}
    assert {("staged", "consume"), ("consumed", "ack"), ("abandoned", "read_done")} <= taken
    assert main(["validate", "--spec", str(DESIGN), str(genuine_log)]) == 0


@pytest.mark.slow
def test_a_tampered_log_is_refused_naming_the_line(
    genuine_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = genuine_log.read_text().splitlines()
    number = next(n for n, line in enumerate(lines, 1) if json.loads(line)["event"] == "consume")
    step = json.loads(lines[number - 1])
    lines[number - 1] = json.dumps({**step, "target": "staged"})  # consume said it deferred
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(lines) + "\n")
    assert main(["validate", "--spec", str(DESIGN), str(tampered)]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    assert f"line {number}:" in printed and "INVALID" in printed
    # and stagefate's own spec does not describe SGLang's run at all
    assert main(["validate", str(genuine_log)]) == 1


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [{}, LOCK_ON], ids=["default", "anchor-lock"])
def test_every_installed_release_follows_its_design(knobs: dict[str, str], tmp_path: Path) -> None:
    """The same program on each release in its own process (0.5.19 with its anchor lock off,
    its default, and on): valid in its design's words, every record ended, the fill spliced."""
    from stagefate.targets.sglang.environments import installed
    from stagefate.targets.sglang.worker import call_in, one_logged_program

    ready = installed()
    if not ready:
        pytest.skip("no SGLang release is installed: make sglang")
    for version, target in ready.items():
        if knobs and version != "0.5.19":
            continue  # the anchor lock is a knob of 0.5.19 only (always on from 0.5.20)
        path = tmp_path / f"{version}.jsonl"
        design = Path(call_in(target, one_logged_program, str(path), sglang_env=knobs))
        expected = "sglang-0.5.23.yaml"
        if version == "0.5.19":
            expected = "sglang-0.5.19-anchor-lock.yaml" if knobs else "sglang-0.5.19.yaml"
        assert design.name == expected, version
        summary = validate_log(path.read_text().splitlines(), load_spec(design))
        assert summary.violation is None, (version, summary.violation)
        assert not summary.live, version
        assert summary.ended == {"filled": 1, "aborted": 3, "below_threshold": 1}, version
