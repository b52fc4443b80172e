"""CI's rule: a target it installed has its tests run, never skipped (tests/required_targets.py)."""

from __future__ import annotations

import pytest

from stagefate.targets.vllm.environment import INSTALL_COMMAND

from . import required_targets

SKIPS = f"""
import pytest

def test_runs():
    pass

def test_needs_vllm():
    pytest.skip("vLLM is not installed here; run `{INSTALL_COMMAND}`")

def test_needs_a_release_ci_did_not_install():
    pytest.skip("SGLang 0.5.20 is not installed: stagefate targets install sglang==0.5.20")

def test_by_design():
    pytest.skip("this release exports no per-request hit metrics (0.5.19)")
"""


@pytest.fixture
def vllm_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM counts as installed, whether or not this machine has it."""
    monkeypatch.setattr(required_targets, "why_unusable", lambda target: None)


@pytest.mark.usefixtures("vllm_usable")
def test_a_skip_naming_a_required_targets_install_fails_the_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGEFATE_REQUIRED_TARGETS", "vllm")
    pytester.makepyfile(SKIPS)
    result = pytester.runpytest_inprocess("-p", "tests.required_targets", "-rs")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(
        ["*skipped, though CI installed their target*", "*test_needs_vllm: vLLM is not installed*"]
    )
    summary = result.stdout.str().split("skipped, though CI installed their target")[1]
    summary = summary.split("short test summary info")[0]  # -rs lists every skip after it
    assert "0.5.20" not in summary and "by design" not in summary and "hit metrics" not in summary


@pytest.mark.usefixtures("vllm_usable")
def test_without_the_variable_a_missing_target_only_skips(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STAGEFATE_REQUIRED_TARGETS", raising=False)
    pytester.makepyfile(SKIPS)
    result = pytester.runpytest_inprocess("-p", "tests.required_targets")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=3)


def test_a_required_target_that_cannot_run_stops_the_session_before_any_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAGEFATE_REQUIRED_TARGETS", "sglang==0.5.19 vllm")
    monkeypatch.setattr(
        required_targets, "why_unusable", lambda t: "vLLM is not installed" if t == "vllm" else None
    )
    pytester.makepyfile(SKIPS)
    result = pytester.runpytest_inprocess("-p", "tests.required_targets")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "vllm: vLLM is not installed" in output and "sglang==0.5.19" not in output
    assert "passed" not in output  # nothing ran


def test_an_unknown_target_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(pytest.UsageError, match="expected sglang==VERSION, vllm or mooncake"):
        required_targets.fix_commands("sglang")
    with pytest.raises(pytest.UsageError, match="choose one of sglang, vllm, mooncake"):
        required_targets.fix_commands("lmcache")
    with pytest.raises(pytest.UsageError, match=r"0\.5\.99"):
        required_targets.fix_commands("sglang==0.5.99")
