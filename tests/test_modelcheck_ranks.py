"""The tensor-parallel model checker: per-rank L3, agreed facts, lockstep and rank_bytes.

The planted agreements are the rank fuzzer's planted bugs (tests/test_tensor_parallel.py) restated
over the abstract world: each must fail with a shortest counterexample naming the invariant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from stagefate.cli import main
from stagefate.spec import load_spec
from stagefate.spec.model_world import NOT_MODELLED_GUARDS, Bounds, Step, Violation
from stagefate.spec.modelcheck import ModelChecker
from stagefate.spec.modelcheck_ranks import (
    FAILED,
    UNDRAINED,
    Agreement,
    RankModelChecker,
    RankStep,
)

SPEC = load_spec()
SMALL = Bounds(pages=4, requests=2, host_pages=3, device_pages=3, cap_pages=1, issues_per_request=1)


class TrustsItsOwnOutcome(Agreement):
    def outcome(self, rank: int, outcomes: Sequence[int]) -> int:
        return outcomes[rank]


class MaxWhereMinIsDue(Agreement):
    def outcome(self, rank: int, outcomes: Sequence[int]) -> int:
        return max(outcomes)


class TrustsItsOwnRoom(Agreement):
    def room(self, rank: int, free: Sequence[int]) -> int:
        return free[rank]


class CountsTheLargestRoom(Agreement):
    def room(self, rank: int, free: Sequence[int]) -> int:
        return max(free)


@pytest.mark.parametrize(
    ("agreement", "invariant", "steps"),
    [
        (
            TrustsItsOwnOutcome(),
            "lockstep",
            [
                "r0: prefetch_from_storage",
                "rank 0 drains r0: exists completes full",
                "rank 1 drains r0: exists completes error",
            ],
        ),
        (
            MaxWhereMinIsDue(),
            "rank_bytes",
            [
                "r0: prefetch_from_storage",
                "rank 0 drains r0: exists completes error",
                "rank 1 drains r0: exists completes short (2 pages found)",
                "r0: IO commit (poll)",
                "rank 0 drains r0: read completes full",
                "rank 1 drains r0: read completes error",
            ],
        ),
        (
            TrustsItsOwnRoom(),
            "lockstep",
            [
                "r0: prefetch_from_storage",
                "rank 0 drains r0: exists completes full",
                "rank 1 drains r0: exists completes short (3 pages found)",
                "r0: IO commit (poll)",
            ],
        ),
        (
            CountsTheLargestRoom(),
            "hold_release",
            [
                "r0: prefetch_from_storage",
                "rank 0 drains r0: exists completes full",
                "rank 1 drains r0: exists completes short (3 pages found)",
                "r0: IO commit (poll)",
            ],
        ),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Agreement) else None,
)
def test_a_planted_agreement_fails_with_its_shortest_counterexample(
    agreement: Agreement, invariant: str, steps: list[str]
) -> None:
    result = RankModelChecker(SPEC, SMALL, agreement=agreement).run()
    assert result.invariant == invariant
    assert result.counterexample == steps


def test_lockstep_names_the_request_and_what_each_rank_holds() -> None:
    result = RankModelChecker(SPEC, SMALL, agreement=TrustsItsOwnRoom()).run()
    assert result.violation == (
        "lockstep: r0: rank 0 holds 'reading' (span to 4, 3 bounce pages, read 3, pin -1), "
        "rank 1 'parked' (span to 4, 0 bounce pages, read 0, pin -1)"
    )


def test_the_fuller_rank_is_checked_against_its_own_capacity() -> None:
    result = RankModelChecker(SPEC, SMALL, agreement=CountsTheLargestRoom()).run()
    assert result.violation == "hold_release: rank 1: -1 free + 3 owned != 2 host pages"


def test_ranks_in_lockstep_are_the_one_rank_world_seen_from_any_rank() -> None:
    """The agreed ranks hold every invariant, and projected onto any rank they reach exactly
    the states and edges of one rank whose bounce pool is the smallest rank's: what
    docs/tensor-parallel.md argues, checked."""
    ranked = RankModelChecker(SPEC, SMALL)  # the last rank's pool: 2 of 3 pages
    ranked_edges: set[tuple[str, str, str]] = set()
    search = ranked.explore(ranked_edges)
    assert search.failure is None and not search.truncated
    one = ModelChecker(SPEC, replace(SMALL, host_pages=SMALL.host_pages - 1))
    one.host_capacity = SMALL.host_pages  # the pool is fuller, not smaller: the config's size
    one_edges: set[tuple[str, str, str]] = set()
    alone = {one.decode(state) for state in one.explore(one_edges).parents}
    assert ranked_edges == one_edges
    for rank in range(ranked.ranks):
        offset = ranked.host_pages[rank] - one.bounds.host_pages  # rank 0 has a page unused
        projected = {
            (world := ranked.model.decode(ranked.rank_state(state, rank)))._replace(
                host_free=world.host_free - offset
            )
            for state in search.parents
        }
        assert projected == alone, rank


def _hits(checker: RankModelChecker, state: tuple[int, ...]) -> list[int | None]:
    """r0's recorded hit on each rank (None: no record)."""
    records = [
        checker.model.decode(checker.rank_state(state, rank)).slots[0].record
        for rank in range(checker.ranks)
    ]
    return [None if record is None else record.hit for record in records]


def test_a_rank_acts_only_once_every_rank_has_drained_and_then_on_the_minimum() -> None:
    checker = RankModelChecker(SPEC, SMALL)
    edges: set[tuple[str, str, str]] = set()
    state = checker.successor(checker.initial(), RankStep(-1, Step("issue", 0, "live")), edges)
    state = checker.successor(state, RankStep(0, Step("exists", 0, "full")), edges)
    assert _hits(checker, state) == [-1, -1]
    assert state[-4:] == (4, UNDRAINED, UNDRAINED, UNDRAINED)  # rank 0's outcome, waiting
    state = checker.successor(state, RankStep(1, Step("exists", 0, "short", 2)), edges)
    assert _hits(checker, state) == [2, 2]
    assert state[-4:] == (UNDRAINED,) * 4


def test_an_outcome_of_an_operation_that_ended_is_forgotten() -> None:
    """Rank 0 drained r0's query, then r0 aborted: its re-issue's query is a new operation, and
    rank 1's outcome of it must not be agreed with rank 0's stale one."""
    checker = RankModelChecker(SPEC, SMALL)
    edges: set[tuple[str, str, str]] = set()
    state = checker.successor(checker.initial(), RankStep(-1, Step("issue", 0, "live")), edges)
    state = checker.successor(state, RankStep(0, Step("exists", 0, "error")), edges)
    assert state[-4] == FAILED
    state = checker.successor(state, RankStep(-1, Step("event", 0, "abort")), edges)
    assert state[-4:] == (UNDRAINED,) * 4


def test_bad_rank_worlds_are_refused_with_the_fix_and_a_split_device_is_named() -> None:
    with pytest.raises(ValueError, match="needs 2 or more; use ModelChecker"):
        RankModelChecker(SPEC, SMALL, ranks=1)
    with pytest.raises(ValueError, match="can lack 0 to 3 of its 3 host pages"):
        RankModelChecker(SPEC, SMALL, fuller_host=4)
    checker = RankModelChecker(SPEC, SMALL)
    state = list(checker.initial())
    state[0] = 1  # rank 0's device holds a page rank 1's does not
    with pytest.raises(Violation, match="lockstep: rank 0's device holds 1 pages, rank 1's 0"):
        checker.check(tuple(state))


def test_check_ranks_refuses_a_fuller_host_than_the_pool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--ranks", "2", "--host-pages", "1", "--fuller-host", "2"]) == 2
    assert "pass at most 1 or raise --host-pages" in capsys.readouterr().err


@pytest.mark.slow
def test_check_ranks_2_reaches_every_modelled_edge_at_its_default_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The spec's edge count, not a literal: a new branch in the spec must be reached, not retyped.
    edges = len([e for e in ModelChecker(SPEC).all_edges() if e[2] not in NOT_MODELLED_GUARDS])
    assert main(["check", "--ranks", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(2 ranks, L3 per rank, the last rank's host pool 1 smaller; 5 pages, 2 requests" in out
    assert f"lockstep hold in every state; {edges} of {edges} modelled edges reached" in out
