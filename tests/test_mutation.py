"""The generated tests under mutants of the spec (stagefate/mutation.py): every mutant that
changes behaviour within the bounds is killed, and a survivor is reported with the program that
tells it from the spec, as a generated test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stagefate.mutation import (
    Verdict,
    first_failure,
    load_tests,
    run_mutants,
    telling_test,
)
from stagefate.spec import load_spec
from stagefate.spec.generated_tests import FILE_NAME, ReplayedProgram
from stagefate.spec.model_world import Bounds
from stagefate.spec.mutants import KINDS, Mutant, mutants, telling_programs
from stagefate.spec.witnesses import ApiModelChecker, replayed

GENERATED = Path(__file__).parent / "generated" / FILE_NAME
DOCS = Path(__file__).parents[1] / "docs"
SMALL = Bounds(pages=3, requests=2, host_pages=2, device_pages=3, cap_pages=2, issues_per_request=1)
"""A world small enough to explore whole in a second or two."""


def _mutant(kind: str, what: str) -> Mutant:
    found = [m for m in mutants(load_spec()) if m.kind == kind and what in m.what]
    assert len(found) == 1, [m.what for m in found]
    return found[0]


def test_the_spec_passes_its_own_generated_tests() -> None:
    assert first_failure(GENERATED.read_text(), load_spec()) is None


def test_two_branches_that_end_alike_but_for_their_reasons_are_told_apart() -> None:
    # the review's example: both revoke the record at the hit; only the reason differs
    swapped = _mutant("swap_reasons", "[zero_pages] and [hit_below_threshold] trade reasons")
    failure = first_failure(GENERATED.read_text(), swapped.spec)
    assert failure is not None and failure.startswith("test_locked__hit__zero_pages")
    assert "revoked_full_miss" in failure


def test_every_kind_of_mutant_is_made() -> None:
    made = mutants(load_spec())
    assert {m.kind for m in made} == set(KINDS)
    assert all(m.spec != load_spec() for m in made)


def test_a_telling_program_passes_on_the_spec_and_fails_on_its_mutant() -> None:
    spec = load_spec()
    late = _mutant("reorder", "(staged, trimmed) --consume: [plan_stale] and [device_short]")
    telling = telling_programs(spec, [late], SMALL)
    assert list(telling.programs) == [0]
    steps = telling.programs[0]
    program = ReplayedProgram(steps, *replayed(ApiModelChecker(spec, SMALL), steps))
    source = telling_test(Verdict(late, True, None, program), SMALL)
    assert re.search(r"^def test_tells_reorder_of_row_\d+\(\) -> None:$", source, re.M)
    assert first_failure(source, spec) is None
    assert first_failure(source, late.spec) is not None
    assert len(load_tests(source)) == 1


@pytest.mark.slow
def test_every_mutant_that_changes_behaviour_is_killed() -> None:
    report = run_mutants(load_spec(), GENERATED)
    assert report.survivors == [], "\n\n".join(
        telling_test(verdict, Bounds()) for verdict in report.survivors
    )
    assert report.changing, "no mutant changes behaviour: the oracle is broken"
    quoted = f"{report.score} mutants that change behaviour"
    assert quoted in (DOCS / "design.md").read_text(), f"docs/design.md should say: {quoted}"
