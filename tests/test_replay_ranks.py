"""``replay --tp N``: the live pipeline replayed as tensor-parallel ranks, each a whole engine,
in lockstep; each rank's transition log written and checked identical by ``validate``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from stagefate.cli import main
from stagefate.cli.replay_modes import rank_log_path
from stagefate.registry import policy_factories
from stagefate.sim.live import LivePolicy
from stagefate.sim.ranks import RankedReplay, build_replay, replays_of
from stagefate.sim.replay import Replay
from stagefate.sim.trace import TraceRequest
from stagefate.transition_log import TransitionLog

from .test_replay import SMALL, assert_books_close, siblings_trace

LIVE = policy_factories(["live"])["live"]
TWO = SMALL.model_copy(update={"tp_size": 2})


@pytest.fixture(scope="module")
def siblings(tmp_path_factory: pytest.TempPathFactory) -> list[TraceRequest]:
    return siblings_trace(tmp_path_factory)


def _figures(replay: Replay | RankedReplay) -> dict[str, object]:
    return replay.run().model_dump(exclude={"wall_seconds"})


def test_two_ranks_replay_to_one_ranks_figures_with_identical_logs(
    siblings: list[TraceRequest], tmp_path: Path
) -> None:
    ranked = build_replay(LIVE, siblings, TWO)
    assert isinstance(ranked, RankedReplay)
    paths = [tmp_path / f"rank{rank}.jsonl" for rank in range(2)]
    logs = [TransitionLog.open(path) for path in paths]
    for rank, log in zip(replays_of(ranked), logs, strict=True):
        assert isinstance(rank.policy, LivePolicy)
        assert (rank.policy.pipe.config.tp_rank, rank.policy.pipe.config.rank_kv_heads) == (
            replays_of(ranked).index(rank),
            1,
        )
        rank.policy.pipe.instruments.append(log)
    figures = _figures(ranked)
    for log in logs:
        log.close()
    assert figures == _figures(build_replay(LIVE, siblings, SMALL))
    assert figures["tokens_spliced"]  # the trace reads from L3: there is something to agree
    for rank in replays_of(ranked):
        assert_books_close(rank, ranked.metrics, siblings)
    assert paths[0].read_text() == paths[1].read_text() != ""
    assert main(["validate", *map(str, paths)]) == 0


def test_a_rank_whose_l3_lost_everything_costs_every_rank_every_hit_in_lockstep(
    siblings: list[TraceRequest],
) -> None:
    """Rank 1's L3 never keeps a write: its existence queries find nothing, the agreed hit is
    the MIN, so neither rank reads or splices anything, and both finish in lockstep."""
    ranked = build_replay(LIVE, siblings, TWO)
    pipe = replays_of(ranked)[1].policy.pipe  # type: ignore[attr-defined]

    def forgetting(keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
        del keys, tensors

    pipe.storage.batch_set = forgetting
    figures = _figures(ranked)
    assert (figures["l3_reads"], figures["tokens_spliced"]) == (0, 0)
    assert _figures(build_replay(LIVE, siblings, SMALL))["tokens_spliced"]
    for rank in replays_of(ranked):
        assert_books_close(rank, ranked.metrics, siblings)


def test_ranks_run_the_live_pipeline_only(siblings: list[TraceRequest]) -> None:
    with pytest.raises(ValueError, match="runs the live policy's pipeline as ranks; blind"):
        build_replay(policy_factories(["blind"])["blind"], siblings, TWO)


def test_validate_names_the_first_line_where_two_ranks_logs_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "live.jsonl"
    assert main(["replay", "--limit", "30", "--tp", "2", "--log", str(log)]) == 0
    first, second = (rank_log_path(log, rank, 2) for rank in range(2))
    assert second.name == "live.rank1.jsonl"
    assert main(["validate", str(first), str(second)]) == 0
    assert "the 2 ranks' logs are identical" in " ".join(capsys.readouterr().out.split())
    *transitions, closing = second.read_text().splitlines()
    steps = [json.loads(line) for line in transitions]
    # two adjacent steps of different requests, swapped: each log still follows the spec alone
    at = next(i for i in range(len(steps) - 1) if steps[i]["request"] != steps[i + 1]["request"])
    steps[at], steps[at + 1] = steps[at + 1], steps[at]
    lines = [json.dumps({**step, "seq": seq}) for seq, step in enumerate(steps, start=1)]
    second.write_text("\n".join([*lines, closing]) + "\n")
    assert main(["validate", str(first), str(second)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"OUT OF LOCKSTEP {first} and {second} differ at line {at + 1}:" in out
    shorter = [*transitions[:-1], json.dumps({"end": True, "transitions": len(transitions) - 1})]
    second.write_text("\n".join(shorter) + "\n")
    assert main(["validate", str(first), str(second)]) == 1
    assert f"{second} ends there, the other goes on" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--policy", "blind"], "--tp 2 replays the live pipeline as 2 ranks"),
        (["--policy", "live,blind"], "pass --policy live, or drop --tp"),
    ],
)
def test_a_policy_that_cannot_run_as_ranks_is_refused_with_the_fix(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--limit", "5", "--tp", "2", *argv]) == 2
    assert expected in " ".join(capsys.readouterr().err.split())


def test_policy_all_with_tp_replays_live_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--limit", "10", "--tp", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--policy all with --tp 2: live only" in out and "2 tensor-parallel ranks" in out
    assert "blind" not in out.split("--policy all with --tp 2: live only")[1]
