"""SGLang's designs in the spec language (spec/designs/): each passes the static checks and a
broken copy of each fails them, the model checker reads them (and finds what a design needs of
its scheduler), their diagrams are in step, and spec-diff sets two side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.spec import load_spec, run_static_checks
from stagefate.spec.load import DEFAULT_SPEC_PATH, parse_spec
from stagefate.spec.model_world import Bounds
from stagefate.spec.modelcheck import ModelChecker
from stagefate.spec.spec_diff import spec_diff

DESIGNS = DEFAULT_SPEC_PATH.parent / "designs"
NAMES = ["sglang-0.5.19", "sglang-0.5.19-anchor-lock", "sglang-0.5.23"]


def _yaml(name: str) -> str:
    return (DESIGNS / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_each_design_passes_the_static_checks(name: str) -> None:
    spec = load_spec(DESIGNS / f"{name}.yaml")
    assert spec.design is not None and spec.design.source
    assert run_static_checks(spec) == []


BROKEN = {
    # the abandoned read can never end: its bounce would leak
    "sglang-0.5.19": (
        "  - from: [abandoned]\n    event: read_done\n    branches:\n"
        "      - {to: released, reason: aborted, effects: [free_bounce]}\n",
        "",
        "termination",
    ),
    # a commit declines an anchor lost but keeps the pin a parked hit may hold
    "sglang-0.5.19-anchor-lock": (
        "        reason: declined_anchor_lost\n        effects: [unpin, arm_retry]\n",
        "        reason: declined_anchor_lost\n        effects: [arm_retry]\n",
        "resource_balance",
    ),
    # a released hold keeps its bounce
    "sglang-0.5.23": (
        "      - {to: released, reason: released, effects: [unpin, free_bounce]}\n",
        "      - {to: released, reason: released, effects: [unpin]}\n",
        "resource_balance",
    ),
}


@pytest.mark.parametrize("name", NAMES)
def test_a_broken_copy_of_each_design_fails_them(name: str, tmp_path: Path) -> None:
    old, new, check = BROKEN[name]
    text = _yaml(name)
    assert text.count(old) == 1
    broken = tmp_path / f"{name}.yaml"
    broken.write_text(text.replace(old, new))
    findings = run_static_checks(load_spec(broken))
    assert findings and {finding.check for finding in findings} == {check}
    assert main(["check", "--static", "--spec", str(broken)]) == 1


def test_without_its_atomic_pass_0_5_23_splices_where_the_device_moved() -> None:
    """0.5.23's init_load_back asserts the plan's splice base instead of re-checking it: it
    relies on prepare_staged_prefetch and init_load_back sharing a pass. Drawn without that, the
    model checker finds the shortest interleaving that breaks the add-only insert."""
    text = _yaml("sglang-0.5.23").replace("atomic:\n  - [plan, consume]\n", "")
    import yaml

    spec = parse_spec(yaml.safe_load(text), "0.5.23 without atomic")
    result = ModelChecker(spec, Bounds()).run()
    assert result.invariant == "aux_and_ownership"
    assert result.counterexample is not None and len(result.counterexample) == 7
    assert "plan_staged_splice" in result.counterexample[4]
    assert result.counterexample[5] == "world: a sibling publishes the next page"


def test_the_model_checker_reads_a_design_at_small_bounds() -> None:
    small = Bounds(pages=3, requests=2, issues_per_request=1)
    for name in NAMES:
        design = load_spec(DESIGNS / f"{name}.yaml")
        result = ModelChecker(design, small).run()
        assert design.design is not None
        known = {finding.invariant for finding in design.design.known_findings}
        # 0.5.19's hit larger than the host pool: a known finding, found as the design says
        assert result.invariant in known if known else result.violation is None, (
            name,
            result.violation,
            result.counterexample,
        )


@pytest.mark.parametrize("name", NAMES)
def test_each_designs_diagrams_are_in_step(name: str) -> None:
    argv = ["diagram", "--spec", str(DESIGNS / f"{name}.yaml")]
    out = Path(__file__).parents[1] / "docs" / "designs" / name
    assert main([*argv, "--out", str(out), "--check"]) == 0


def test_spec_diff_sets_two_designs_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    old, new = (load_spec(DESIGNS / f"{name}.yaml") for name in ("sglang-0.5.19", "sglang-0.5.23"))
    page = spec_diff(old, new)
    assert page.startswith("# SGLang 0.5.19 (anchor lock off, its default) | SGLang 0.5.23")
    assert "| `trimmed` | bounce (always) | — |  |" in page  # 0.5.23 trims in the plan
    assert "| `querying` | commit | — | parked_ahead → parked;" in page
    assert "| `reading` | read_done | read_empty → released (discarded); else → staged" in page
    assert "`cap_busy`" in page and "`declined_rate_limited`" in page
    assert main(["spec-diff", "stagefate", str(DESIGNS / "sglang-0.5.23.yaml")]) == 0
    printed = capsys.readouterr().out
    assert "| `locked` |" in printed and "span_inflight" in printed


def test_an_unknown_atomic_pair_issue_event_or_completion_event_is_refused() -> None:
    import yaml

    document = yaml.safe_load(_yaml("sglang-0.5.23"))
    with pytest.raises(ValueError, match="only \\[plan, consume\\]"):
        parse_spec({**document, "atomic": [["hit", "commit"]]})
    with pytest.raises(ValueError, match="issue_event 'start' is not declared"):
        parse_spec({**document, "issue_event": "start"})
    landed = {"exists": "hit", "read": "landed", "load": "ack"}
    with pytest.raises(ValueError, match="'read' fires 'landed', which is not declared"):
        parse_spec({**document, "completions": landed})
    with pytest.raises(ValueError, match="name the event of each of exists, read and load"):
        parse_spec({**document, "completions": {"exists": "hit", "read": "read_done"}})


COMPARED = {
    "stagefate-vs-sglang-0.5.19.md": ("stagefate", "sglang-0.5.19"),
    "stagefate-vs-sglang-0.5.23.md": ("stagefate", "sglang-0.5.23"),
    "sglang-0.5.19-vs-0.5.23.md": ("sglang-0.5.19", "sglang-0.5.23"),
    "sglang-0.5.19-lock-off-vs-on.md": ("sglang-0.5.19", "sglang-0.5.19-anchor-lock"),
}


@pytest.mark.parametrize("page", sorted(COMPARED))
def test_the_committed_comparisons_are_what_spec_diff_prints(page: str) -> None:
    def spec(name: str) -> object:
        return load_spec(DEFAULT_SPEC_PATH if name == "stagefate" else DESIGNS / f"{name}.yaml")

    a, b = COMPARED[page]
    committed = (Path(__file__).parents[1] / "docs" / "designs" / page).read_text()
    assert committed == spec_diff(spec(a), spec(b)), f"run `stagefate spec-diff` for {page}"  # type: ignore[arg-type]


def test_a_designs_known_finding_is_reported_and_one_no_longer_found_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0.5.19 keeps the hit that parks for ever (its known finding, found as KNOWN); a design
    that lists a finding the checker does not find fails, so the list cannot go stale."""
    small = ["--pages", "3", "--requests", "2", "--issues", "1"]
    main(["check", "--spec", str(DESIGNS / "sglang-0.5.19.yaml"), *small])
    out = " ".join(capsys.readouterr().out.split())
    assert "KNOWN progress: r0 in 'parked' never ends" in out
    assert "the design's known finding, reproduced: 'A hit larger than the host pool" in out
    listed = _yaml("sglang-0.5.23").replace(
        "  releases:",
        "  known_findings:\n    - {invariant: progress, finding: stale}\n  releases:",
        1,
    )
    stale = tmp_path / "stale.yaml"
    stale.write_text(listed)
    assert main(["check", "--spec", str(stale), *small]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "NOT FOUND the design lists 'stale' as breaking 'progress'" in out
