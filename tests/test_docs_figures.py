"""Figures and defaults the docs quote, checked against the code that makes them: a doc that
drifts from a default or a count fails here, not in a reader's hands (issue 42, "Docs that
drift"). Historical figures (a before/after in docs/benchmarks.md) are records, not quotes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stagefate.spec import load_spec
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.statemachine.config import PipelineConfig

DOCS = Path(__file__).parents[1] / "docs"


def _doc(name: str) -> str:
    return " ".join((DOCS / name).read_text(encoding="utf-8").split())  # lines rejoined


def test_the_retry_book_quoted_is_the_default_one() -> None:
    config = PipelineConfig()
    quote = (
        f"stagefate's retry book: {config.retry_interval} scheduling passes apart, "
        f"{config.retry_max_attempts} at most"
    )
    assert quote in _doc("replay.md")


STATE_COUNT_QUOTES = (
    ("fuzzing.md", "(host 2, device 4, cap 2, threshold 2): {states} states"),
    ("design.md", "5 pages × 3 requests × 2 issues each ({states} states)"),
    ("sglang.md", "| stagefate (`spec/lifecycle.yaml`) | {states} | {edges} of {edges} |"),
)
"""Where the docs quote the model checker's count at the CI bounds (``stagefate check``)."""


def _model_checked(spec_path: Path) -> tuple[int, int]:
    """``(states, modelled edges)`` of a clean ``stagefate check`` at the CI bounds."""
    from stagefate.spec.model_world import NOT_MODELLED_GUARDS
    from stagefate.spec.modelcheck import ModelChecker

    spec = load_spec(spec_path)
    checker = ModelChecker(spec)
    result = checker.run()
    known = {finding.invariant for finding in spec.design.known_findings} if spec.design else ()
    assert result.violation is None or result.invariant in known  # 0.5.19's known finding
    assert not result.unreached_edges
    return result.states, len([e for e in checker.all_edges() if e[2] not in NOT_MODELLED_GUARDS])


@pytest.mark.slow
def test_the_model_checkers_state_count_quoted_is_todays() -> None:
    states, edges = _model_checked(DEFAULT_SPEC_PATH)
    for name, quote in STATE_COUNT_QUOTES:
        expected = quote.format(states=f"{states:,}", edges=edges)
        assert expected in _doc(name), f"docs/{name} should quote {expected!r}"


def test_the_generated_tests_counts_quoted_are_the_committed_files() -> None:
    from stagefate.spec.witnesses import overlaps

    text = (Path(__file__).parent / "generated" / "test_edges.py").read_text(encoding="utf-8")
    cases = text.count("\ndef test_")
    met = len(re.findall(r"^def test_\w+__also__\w+\(", text, re.MULTILINE))
    pairs = len(overlaps(load_spec()))
    doc = _doc("fuzzing.md")
    assert f"{met} of the {pairs} neighbouring guarded pairs are met" in doc
    assert f"the other {pairs - met} are pairs" in doc
    assert f"All {cases} cases ({cases - met} edges, {met} overlaps)" in doc


DESIGN_ROWS = {
    "sglang-0.5.19": "SGLang 0.5.19, lock off",
    "sglang-0.5.19-anchor-lock": "SGLang 0.5.19, lock on",
    "sglang-0.5.23": "SGLang 0.5.23",
    "blind": "blind (the replay's baseline, before #36834)",
}
"""docs/sglang.md's row label for each design in spec/designs/."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DESIGN_ROWS))
def test_each_designs_state_count_quoted_is_todays(name: str) -> None:
    states, edges = _model_checked(DEFAULT_SPEC_PATH.parent / "designs" / f"{name}.yaml")
    label = re.escape(DESIGN_ROWS[name])
    row = rf"\| {label} \| {states:,} \(\d+ s\) \| {edges} of {edges} \|"
    assert re.search(row, _doc("sglang.md")), f"docs/sglang.md's row for {name} is stale"


def test_every_design_has_a_row() -> None:
    designs = {path.stem for path in (DEFAULT_SPEC_PATH.parent / "designs").glob("*.yaml")}
    assert designs == set(DESIGN_ROWS)
