"""SGLang by release: names, environments and the worker (docs/sglang.md, "Releases").

Bad input is refused with exit 2 and the fix named, before anything is installed or run; an
install that fails or is interrupted leaves nothing `stagefate targets` lists as ready. One test
runs 0.5.19's pipeline in its own environment (skipped, naming the install, where it is not).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.targets.sglang import environments
from stagefate.targets.sglang.environments import (
    InstallFailed,
    install,
    installed,
    source_roots,
)
from stagefate.targets.sglang.releases import UnknownRelease, release, split_name


def test_release_names_are_checked() -> None:
    assert split_name("sglang==0.5.19", ("sglang",)) == ("sglang", "0.5.19")
    assert split_name("sglang-rust", ("sglang-rust",)) == ("sglang-rust", None)
    assert release("0.5.19").generation == "plan"
    assert {release(v).generation for v in ("0.5.20", "0.5.21", "0.5.22", "0.5.23")} == {"prepare"}
    with pytest.raises(UnknownRelease, match=r"0\.5\.18 has no buffer mode"):
        release("0.5.18")
    with pytest.raises(UnknownRelease, match="not a release stagefate knows"):
        release("0.6.0")
    with pytest.raises(UnknownRelease, match="not a release number"):
        release("latest")
    with pytest.raises(UnknownRelease, match="expected one of sglang"):
        split_name("sglang==", ("sglang",))


def test_what_each_installed_release_declares_is_in_its_own_sources() -> None:
    """The drivers read release differences from :mod:`releases`, not by probing SGLang: the
    declarations are held to every installed release's files (the others were read from their
    wheels when written)."""
    ready = installed()
    if not ready:
        pytest.skip("no SGLang release is installed here; run `make sglang`")
    for version, target in ready.items():
        cache = "".join(
            (root / "srt" / "mem_cache" / "unified_radix_cache.py").read_text(encoding="utf-8")
            for root in source_roots(target)
        )
        declared = release(version)
        assert ("def request_buffer_backup" in cache) == declared.backs_up_on_request, version
        assert ("class _StoragePrefetchWait" in cache) == declared.times_prefetch_wait, version


@pytest.fixture
def no_environments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STAGEFATE_TARGETS", str(tmp_path))
    return tmp_path


def test_targets_lists_every_release(
    no_environments: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["targets"]) == 0
    printed = capsys.readouterr().out
    for version in ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        assert version in printed


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["targets", "install", "sglang==0.5.18"], "has no buffer mode"),
        (["targets", "install", "sglang==9"], "not a release stagefate knows"),
        (["targets", "install", "vllm==1"], "expected one of sglang"),
        (["targets", "install"], "takes a release"),
        (["targets", "engine", "sglang==0.5.18"], "has no buffer mode"),
        (["targets", "engine", "sglang==0.5.20"], "stagefate targets install sglang==0.5.20"),
        (["targets", "engine", "vllm"], "expected one of sglang"),
        (["replay", "--policy", "sglang==0.5.19"], "stagefate targets install sglang==0.5.19"),
        (["replay", "--policy", "live==0.5.19"], "takes no release"),
        (["replay", "--policy", "live,live"], "name each policy once"),
        (["replay", "--policy", "all,live"], "stands alone"),
        (["replay", "--policy", "live", "--releases", "0.5.19"], "for --policy all"),
        (["replay", "--releases", "0.5.17"], "has no buffer mode"),
        (["replay", "--policy", "live", "--sglang-env", "NOEQUALS"], "KEY=VALUE"),
        (["replay", "--policy", "live", "--sglang-env", "PATH=/x"], "an SGLANG_ variable"),
        (
            [
                "replay",
                "--policy",
                "live",
                "--sglang-env",
                "SGLANG_A=1",
                "--sglang-env",
                "SGLANG_A=2",
            ],
            "twice",
        ),
        (
            ["replay", "--policy", "sglang==0.5.19", "--tree", "sglang-python==0.5.23"],
            "name two SGLang releases",
        ),
        (["fuzz", "--target", "sglang==0.5.20"], "stagefate targets install sglang==0.5.20"),
        (["fuzz", "--sglang-env", "SGLANG_A=1"], "use them with --target sglang"),
        (["fuzz", "--set-aside", "sanity_check"], "use them with --target sglang"),
        (["fuzz", "--compare", "anchor_lock=off"], "use them with --target sglang"),
        (["fuzz", "--waste-fails", "twin"], "use them with --target sglang"),
    ],
)
def test_bad_names_exit_2_naming_the_fix(
    no_environments: Path, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert says in " ".join(capsys.readouterr().err.split())
    assert not any(no_environments.iterdir())  # nothing installed, nothing half-made


def test_a_failed_install_leaves_nothing_ready(
    no_environments: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(version: str, partial: Path, say: object) -> None:
        (partial / "bin").mkdir(parents=True)  # half-way through
        raise InstallFailed(f"installing sglang=={version} failed at: a step")

    monkeypatch.setattr(environments, "_build", fails)
    assert main(["targets", "install", "sglang==0.5.19"]) == 1
    assert "failed at: a step" in capsys.readouterr().out
    assert not any(no_environments.iterdir())

    def interrupted(version: str, partial: Path, say: object) -> None:
        (partial / "bin").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(environments, "_build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        install("0.5.19", print)
    assert not any(no_environments.iterdir())
    assert "0.5.19" not in installed() or installed()["0.5.19"].here


def test_a_pip_failure_names_its_step(
    no_environments: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    class Done:
        returncode = 3

    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: Done())
    with pytest.raises(InstallFailed, match=r"failed at: venv .*exit status 3"):
        install("0.5.20", lambda step: None)
    assert not any(no_environments.iterdir())


@pytest.mark.slow  # a second interpreter imports SGLang 0.5.19: half a minute
def test_0_5_19_runs_its_own_pipeline_in_its_own_process() -> None:
    """Issue → query → commit → read → ack → admission on 0.5.19, through the worker."""
    ready = installed()
    if "0.5.19" not in ready:
        pytest.skip("SGLang 0.5.19 is not installed: stagefate targets install sglang==0.5.19")
    from stagefate.targets.sglang.worker import call_in, one_prefetch

    assert call_in(ready["0.5.19"], one_prefetch) == ("PlanDriver", 24, True, 0)


@pytest.mark.slow
def test_an_expired_wait_ends_the_prefetch_on_every_installed_release() -> None:
    """The ``timeout`` deadline is a release's own: 0.5.19 to 0.5.22 ask a hook of each
    operation, 0.5.23 keeps a wait book. Found when 0.5.20 and 0.5.21 first ran overloaded in
    the replay: their driver reached for 0.5.23's book and stopped with an ImportError."""
    from stagefate.targets.sglang.worker import call_in, one_expired_wait

    ready = installed()
    if not ready:
        pytest.skip("no SGLang release is installed: make sglang")
    for version, target in ready.items():
        assert call_in(target, one_expired_wait) == (True, False), version


def test_an_expired_wait_ends_the_prefetch_on_this_interpreters_release() -> None:
    from stagefate.targets import TargetUnavailable
    from stagefate.targets.sglang import require
    from stagefate.targets.sglang.worker import one_expired_wait

    try:
        require()
    except TargetUnavailable as missing:
        pytest.skip(str(missing))
    assert one_expired_wait() == (True, False)


@pytest.mark.slow
def test_every_installed_release_runs_behind_the_router() -> None:
    """Each release's pipeline, in its own process, as two instances over one store: the
    prompt that returns to the other instance is spliced from pages the first one wrote."""
    from stagefate.runner import run_instances

    from .test_instances import returning_prompt
    from .test_replay import SMALL

    ready = installed()
    if not ready:
        pytest.skip("no SGLang release is installed: make sglang")
    for version in ready:
        metrics = run_instances(f"sglang=={version}", returning_prompt(), SMALL, 2, "round_robin")
        away = metrics.instances[1].tokens_spliced
        assert metrics.cross_instance_hits == away > 0, version


@pytest.mark.slow
def test_every_installed_releases_replay_writes_its_design_log(tmp_path: Path) -> None:
    """``replay --log`` with every installed release, each in its own process: each writes
    ``live.sglang-V.jsonl`` in its own design's words, valid with every record ended."""
    from stagefate.spec import load_spec
    from stagefate.targets.sglang.design_log import DESIGNS
    from stagefate.transition_log import validate_log

    ready = installed()
    if not ready:
        pytest.skip("no SGLang release is installed: make sglang")
    log = tmp_path / "live.jsonl"
    policies = ",".join(f"sglang=={version}" for version in ready)
    assert main(["replay", "--policy", policies, "--limit", "120", "--log", str(log)]) == 0
    assert not log.exists()  # live did not run: its own log is not written
    for version in ready:
        design = "sglang-0.5.19.yaml" if version == "0.5.19" else "sglang-0.5.23.yaml"
        lines = (tmp_path / f"live.sglang-{version}.jsonl").read_text().splitlines()
        summary = validate_log(lines, load_spec(DESIGNS / design))
        assert summary.violation is None and not summary.live, version
        assert summary.ended["filled"] > 0, version
