"""``stagefate bench lifecycle``'s opcode counts: a figure that does not move with the load."""

from __future__ import annotations

import sys

from stagefate.bench.lifecycle import PHASES, StagefatePrefetcher, opcodes_per_phase


def test_opcode_counts_are_deterministic_and_cover_every_step() -> None:
    tracer = sys.gettrace()
    first = opcodes_per_phase(StagefatePrefetcher(), prefetches=3)
    assert sys.gettrace() is tracer  # whatever traced before traces again
    second = opcodes_per_phase(StagefatePrefetcher(), prefetches=3)
    assert first == second
    assert list(first) == [name for name, _what in PHASES]
    assert all(count > 0 for count in first.values())
    # consume re-matches (as the scheduler's match does) and then splices: it must count more
    assert first["consume"] > first["match"] and first["issue"] > first["exists"]
