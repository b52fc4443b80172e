"""Each finding's program on every SGLang release installed here (docs/sglang-findings.md): it
passes before the release it was found in, fails from there until the one that fixed it, and
passes from that one on; a finding not fixed upstream passes with its proposed fix.

The programs are slow: each release runs in its own environment's process. CI installs 0.5.19
and the newest (`stagefate targets install sglang==0.5.19`, `make sglang`); a release not
installed here is left out and named.
"""

from __future__ import annotations

import pytest

from stagefate.targets.sglang.environments import install_command, installed
from stagefate.targets.sglang.findings import FINDINGS, reproduce
from stagefate.targets.sglang.releases import RELEASES
from stagefate.targets.sglang.worker import call_in


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_a_finding_shows_before_its_fix_and_not_after(name: str) -> None:
    finding = FINDINGS[name]
    ready = installed()
    if finding.found_in not in ready:
        pytest.skip(
            f"SGLang {finding.found_in} is not installed: {install_command(finding.found_in)}"
        )
    fixed_in = finding.fixed_in
    if fixed_in is not None and not [v for v in ready if _key(v) >= _key(fixed_in)]:
        pytest.skip(f"no release from {fixed_in} on is installed: `make sglang`")
    for version, target in ready.items():
        broke = call_in(target, reproduce, name)
        if _key(version) < _key(finding.found_in):
            assert broke is None, f"{name}: SGLang {version}, before {finding.found_in}, fails"
        elif fixed_in is None or _key(version) < _key(fixed_in):
            assert broke, f"{name}: SGLang {version} (not fixed there) passed"
        else:
            assert broke is None, f"{name}: SGLang {version} still fails: {broke}"


UNFIXED = sorted(name for name, finding in FINDINGS.items() if finding.fixed_in is None)


@pytest.mark.slow
@pytest.mark.parametrize("name", UNFIXED)
def test_the_fix_proposed_upstream_passes_on_every_release(name: str) -> None:
    """A finding still present in the newest release comes with a fix (a patch applied in the
    release's process): its program passes with it on every release installed."""
    ready = installed()
    if not ready:
        pytest.skip(f"no SGLang release is installed: {install_command(FINDINGS[name].found_in)}")
    for version, target in ready.items():
        broke = call_in(target, reproduce, name, with_proposed_fix=True)
        assert broke is None, f"{name}: with the proposed fix, SGLang {version} fails: {broke}"


def test_every_finding_names_known_releases_in_order() -> None:
    for finding in FINDINGS.values():
        assert finding.found_in in RELEASES
        if finding.fixed_in is None:
            assert finding.proposed_fix is not None, "an unfixed finding proposes its fix"
        else:
            assert finding.fixed_in in RELEASES
            assert _key(finding.found_in) < _key(finding.fixed_in)


@pytest.mark.slow
def test_the_command_line_runs_a_campaign_in_a_releases_own_environment(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """``fuzz --target sglang==V`` re-runs the command in V's environment, which has every tool
    the command line needs but pygraphviz (it draws nothing there): the command must start
    (until 2026-12-04 it stopped at once, asking for pygraphviz)."""
    from stagefate.cli import main

    ready = installed()
    if not ready:
        pytest.skip(f"no SGLang release is installed: {install_command('0.5.19')}")
    version = min(ready, key=_key)
    argv = ["fuzz", "--target", f"sglang=={version}", "--steps", "1", "--seed", "0"]
    argv += ["--set-aside", "id_reuse", "--set-aside", "namespaces", "--set-aside", "sanity_check"]
    assert main(argv) == 0
    assert f"states checked in 1 programs over SGLang {version}'s" in capfd.readouterr().out


def test_every_set_aside_of_a_finding_is_a_choice_of_the_command_line() -> None:
    from stagefate.cli.fuzz import SET_ASIDE

    named = {finding.set_aside for finding in FINDINGS.values() if finding.set_aside}
    assert set(SET_ASIDE) == {"sanity_check", "namespaces", *named}
    for finding in FINDINGS.values():
        assert finding.set_aside is None or finding.proposed_fix is not None, finding.name
