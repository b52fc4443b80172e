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


@pytest.mark.slow
def test_the_model_checkers_state_count_quoted_is_todays() -> None:
    from stagefate.spec.model_world import NOT_MODELLED_GUARDS, Bounds
    from stagefate.spec.modelcheck import ModelChecker

    spec = load_spec(DEFAULT_SPEC_PATH)
    checker = ModelChecker(spec, Bounds())
    result = checker.run()
    edges = len([e for e in checker.all_edges() if e[2] not in NOT_MODELLED_GUARDS])
    assert result.violation is None and not result.unreached_edges
    for name, quote in STATE_COUNT_QUOTES:
        expected = quote.format(states=f"{result.states:,}", edges=edges)
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
