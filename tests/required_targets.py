"""A target CI installed has its tests run, never skipped (a pytest plugin; ``conftest`` loads it).

On a developer's machine a missing target skips its tests, naming the command that installs it.
CI installs its targets and names them in ``STAGEFATE_REQUIRED_TARGETS`` (``sglang==0.5.23
sglang==0.5.19 vllm``, and ``mooncake`` where its client imports): the session then refuses to
start where one of them cannot run, and fails at its end when any test skipped naming the
command that installs or checks one of them. A skip for a target CI did not install (SGLang
0.5.20, say) or for what a release lacks by design stays a skip; the Makefile's ``-rs`` prints
every skip with its reason, so what a run did not test is on the screen.
"""

from __future__ import annotations

import os

import pytest

_skips_of_required: list[tuple[str, str]] = []
"""(test, reason) of this session's skips that name a required target's fix."""


def required() -> tuple[str, ...]:
    """The targets CI installed (empty: a developer's machine, where a missing target skips)."""
    return tuple(os.environ.get("STAGEFATE_REQUIRED_TARGETS", "").split())


def _sglang_version(target: str) -> str | None:
    """The release of an ``sglang==V`` target, checked as every SGLang name is
    (:func:`stagefate.registry.split`); None for vLLM and Mooncake."""
    from stagefate.registry import split

    try:
        base, version = split(target, ("sglang", "vllm", "mooncake"), "target")
    except ValueError as unknown:
        raise pytest.UsageError(f"STAGEFATE_REQUIRED_TARGETS: {unknown}") from None
    if base == "sglang" and version is None:
        raise pytest.UsageError(
            f"STAGEFATE_REQUIRED_TARGETS names {target!r}: expected sglang==VERSION, vllm or "
            "mooncake"
        )
    return version


def fix_commands(target: str) -> tuple[str, ...]:
    """What a skip names when ``target`` is missing or its engine was not checked."""
    from stagefate.targets.sglang import INSTALL, NEWEST
    from stagefate.targets.sglang.engine.serving import check_command
    from stagefate.targets.sglang.environments import install_command
    from stagefate.targets.vllm.environment import INSTALL_COMMAND

    version = _sglang_version(target)
    if version is not None:
        newest = (INSTALL,) if version == NEWEST else ()
        return (install_command(version), check_command(version), *newest)
    if target == "vllm":
        return (INSTALL_COMMAND, "make vllm")
    return ("mooncake.store does not import",)


def why_unusable(target: str) -> str | None:
    """Why ``target`` cannot run its tests here (None: it can)."""
    version = _sglang_version(target)
    if version is not None:
        from stagefate.targets.sglang.engine.serving import recorded
        from stagefate.targets.sglang.environments import installed

        found = installed().get(version)
        if found is None:
            return f"SGLang {version} is not installed"
        check = recorded(found)
        if check is None or not check.serves:
            return f"SGLang {version}'s engine does not serve here ({check or 'never checked'})"
        return None
    if target == "vllm":
        from stagefate.targets.vllm import environment

        return None if environment.ready() else "vLLM is not installed"
    try:
        import mooncake.store  # noqa: F401
    except ImportError as error:
        return f"mooncake.store does not import ({error})"
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    _skips_of_required.clear()
    for target in required():
        fix_commands(target)  # an unknown name is refused before anything runs
    unusable = [f"{target}: {why}" for target in required() if (why := why_unusable(target))]
    if unusable:
        pytest.exit(
            "STAGEFATE_REQUIRED_TARGETS names targets that cannot run here, so their tests "
            "would skip: " + "; ".join(unusable) + ". Install them (make sglang, make vllm, "
            "stagefate targets install ...) or leave them out of the variable.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _note_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (report.skipped and required()):
        return
    reason = _reason(report)
    fixes = [fix for target in required() for fix in fix_commands(target)]
    if any(fix in reason for fix in fixes):
        _skips_of_required.append((report.nodeid, reason))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skips_of_required and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _skips_of_required:
        return
    terminalreporter.section("skipped, though CI installed their target", red=True)
    for nodeid, reason in _skips_of_required:
        terminalreporter.write_line(f"{nodeid}: {reason}")
