"""The tests generated from the spec (tests/generated/): they name every modelled edge, the
committed file is what the spec generates, and a spec change shows up as a failing diff."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.spec import load_spec
from stagefate.spec.generated_tests import FILE_NAME, edge_of_test
from stagefate.spec.load import DEFAULT_SPEC_PATH
from stagefate.spec.model_world import NOT_MODELLED_GUARDS
from stagefate.testing import LineWorld

GENERATED = Path(__file__).parent / "generated"


def _named(source: str) -> list[tuple[tuple[str, str, str], str | None]]:
    tree = ast.parse(source)
    return [
        edge_of_test(node.name)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


def test_the_generated_tests_name_every_modelled_edge_once() -> None:
    named = _named((GENERATED / FILE_NAME).read_text())
    spec = load_spec()
    modelled = [edge for edge in spec.edges() if edge[2] not in NOT_MODELLED_GUARDS]
    edges = [edge for edge, also in named if also is None]
    assert len(edges) == len(set(edges)), "an edge has two tests"
    assert set(edges) == set(modelled)
    assert len(modelled) == len(spec.edges()) - 2  # the two aux_cut branches


def test_each_overlap_test_names_two_neighbouring_branches_of_its_row() -> None:
    named = _named((GENERATED / FILE_NAME).read_text())
    pairs = {edge: set(guards) for edge, guards in _neighbours().items()}
    overlaps = [(edge, also) for edge, also in named if also is not None]
    assert overlaps, "no overlap was met: the branch order would go untested"
    for edge, also in overlaps:
        assert also in pairs[edge], f"{edge} has no neighbour guarded by {also}"


def _neighbours() -> dict[tuple[str, str, str], list[str]]:
    """Each edge's next branch's guard, where both are guarded."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for state, event, branches in load_spec().rows():
        for taken, also in pairwise(branches):
            if taken.guard is not None and also.guard is not None:
                found.setdefault((state, event, taken.guard), []).append(also.guard)
    return found


def test_a_step_that_fires_other_transitions_than_the_model_fails() -> None:
    world = LineWorld()
    world.publish()
    world.fired()
    world.issue(0)
    fired = r"fired \['r0: \(issued\) --lock\[else\]--> locked'\]"
    with pytest.raises(AssertionError, match=fired):
        world.fired("r0: (issued) --lock[over_cap]--> cap_skip")
    world.issue(1)
    world.fired("r1: (issued) --lock[else]--> locked")  # the failed check read r0's line
    world.finish()


def test_the_line_world_refuses_a_move_the_model_would_not_make() -> None:
    world = LineWorld()
    with pytest.raises(AssertionError, match="the model predicts"):
        world.expect(device=1, host_free=2, pinned=0, r0=None, r1=None, r2=None)
    with pytest.raises(KeyError):
        world.complete(0)  # r0 has no record, so no operation to complete
    world.publish()
    world.issue(0)  # pins page 1
    with pytest.raises(AssertionError, match="pinned"):
        world.evict()
    world.finish()


@pytest.mark.slow
def test_the_committed_tests_are_what_the_spec_generates() -> None:
    assert main(["check", "--emit-tests", str(GENERATED), "--diff"]) == 0


@pytest.mark.slow
def test_an_edge_removed_from_the_spec_fails_the_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    removed = "  - from: [locked]\n    event: lock\n    branches:\n      - {to: same}\n"
    text = DEFAULT_SPEC_PATH.read_text()
    assert text.count(removed) == 1
    planted = tmp_path / "lifecycle.yaml"
    planted.write_text(text.replace(removed, ""))
    argv = ["check", "--spec", str(planted), "--emit-tests", str(GENERATED), "--diff"]
    assert main(argv) == 1
    printed = capsys.readouterr().out
    assert "-def test_locked__lock__else() -> None:" in printed
    assert "STALE" in printed and "stagefate check --emit-tests tests/generated" in printed
