"""The model checker at every deployment the fuzzers draw (issue 40): the anchor-lock cap (0:
never pin), the prefetch threshold and the bounce buffer change which guards hold, so the spec's
invariants are checked at each combination, not only at the default bounds."""

from __future__ import annotations

import itertools

import pytest

from stagefate.spec import load_spec
from stagefate.spec.model_world import Bounds
from stagefate.spec.modelcheck import ModelChecker

SPEC = load_spec()
GRID = list(itertools.product((0, 1, 2), (1, 2, 3), (1, 2, 3)))
"""``(cap_pages, threshold_pages, host_pages)``: the cap off, below and at a span's anchor; the
threshold at one page up to more than a short span; a bounce of one page up to a whole span."""


@pytest.mark.slow
def test_every_invariant_holds_at_every_setting_of_cap_threshold_and_bounce() -> None:
    reached: set[tuple[str, str, str]] = set()
    for cap, threshold, host in GRID:
        bounds = Bounds(
            pages=4,
            requests=2,
            host_pages=host,
            cap_pages=cap,
            threshold_pages=threshold,
            issues_per_request=2,
        )
        result = ModelChecker(SPEC, bounds).run()
        assert result.violation is None, (bounds, result.violation, result.counterexample)
        assert not result.truncated, bounds
        reached |= result.edges
    # the grid reaches edges no single setting does: with the cap at 0 nothing is ever locked,
    # with a one-page bounce every longer hit is host-short
    assert {edge for edge in reached if edge[0] == "locked"}
    assert ("locked", "commit", "host_short") in reached
