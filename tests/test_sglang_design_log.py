"""SGLang's runs validated against its own design: the transition log its decisions write
(stagefate/targets/sglang/design_log.py) follows spec/designs/sglang-0.5.23.yaml, and a log
tampered with is refused, naming the line. Runs where `make sglang` installed SGLang."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stagefate.cli import main
from stagefate.spec import load_spec
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.transition_log import TransitionLog, validate_log

DESIGN = DEFAULT_SPEC_PATH.parent / "designs" / "sglang-0.5.23.yaml"


def test_the_design_log_refuses_the_plan_generation() -> None:
    pytest.importorskip("torch")
    from stagefate.targets.sglang.design_log import DesignLog

    plan_generation = SimpleNamespace(
        consumer=SimpleNamespace(cache=SimpleNamespace(buffer_pipeline=object()))
    )
    with pytest.raises(ValueError, match=r"run 0\.5\.22 or later"):
        DesignLog(plan_generation, TransitionLog(io.StringIO()))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def genuine_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted program on SGLang's own pipeline: a whole fill, an abort while querying, a
    hold let go by an abort, an abort while reading, a hit too short."""
    from stagefate.targets import TargetUnavailable
    from stagefate.targets.sglang import require

    try:
        require()
    except TargetUnavailable as missing:
        pytest.skip(str(missing))
    from stagefate.targets.sglang.design_log import DesignLog
    from stagefate.targets.sglang.generations import stepped_sglang
    from stagefate.targets.sglang.machine import PAGE, SEQUENCES

    path = tmp_path_factory.mktemp("design") / "sglang.jsonl"
    driver = stepped_sglang(page_size=PAGE, core="python", anchor_cap=24 / 512)
    try:
        for tokens in SEQUENCES:
            driver.produce(tokens, None)
        with path.open("w") as sink:
            DesignLog(driver, TransitionLog(sink))
            driver.issue("fill", SEQUENCES[0], None)
            driver.settle(3)
            assert driver.admit("fill") > 0
            driver.settle(3)
            driver.issue("querying", SEQUENCES[1], None)
            driver.abort("querying")
            driver.issue("held", SEQUENCES[2], None)
            driver.settle(3)
            driver.abort("held")
            driver.issue("reading", SEQUENCES[1], None)
            driver.run_existence_queries()
            driver.tick()
            driver.abort("reading")
            driver.evict(10_000)
            driver.publish(SEQUENCES[1][:PAGE], None)
            driver.issue("short", SEQUENCES[1], None, stale=True)
            driver.settle(3)
    finally:
        driver.close()
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
