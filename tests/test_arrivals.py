"""Causal turns: conversations inferred from the hash chains, a turn held until the one before it
finished, and the open-loop arrivals kept as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagefate.cli import main
from stagefate.registry import make_replay
from stagefate.sim.conversations import infer_turns
from stagefate.sim.trace import TraceRequest, load_trace

from .test_replay import SMALL


def _request(index: int, ms: float, blocks: list[int], output: int = 8) -> TraceRequest:
    return TraceRequest(index, ms, 512 * len(blocks), output, tuple(blocks))


def test_a_turn_follows_the_latest_whole_prompt_it_extends_and_shared_prefixes_are_no_turns() -> (
    None
):
    system = [1, 2]
    trace = [
        _request(0, 0, system),  # a system prompt alone: two later requests extend it
        _request(1, 1, [*system, 10]),  # conversation A, turn 1
        _request(2, 2, [*system, 20]),  # conversation B, turn 1
        _request(3, 3, [*system, 10, 11, 12]),  # A, turn 2: extends request 1 whole
        _request(4, 4, [*system, 10, 11, 12, 13]),  # A, turn 3: extends request 3 (the latest)
        _request(5, 5, [*system, 20, 21]),  # B, turn 2
        _request(6, 6, [7, 8]),  # alone
    ]
    turns = infer_turns(trace)
    assert turns.predecessor == {3: 1, 4: 3, 5: 2}
    assert turns.shared_prefixes == 1  # request 0, extended by requests 1 and 2
    assert turns.conversations == 2


def _partial(index: int, ms: float, blocks: list[int], tail: int) -> TraceRequest:
    """A prompt of ``blocks`` whose last block holds ``tail`` tokens (Mooncake's partial block)."""
    return TraceRequest(index, ms, 512 * (len(blocks) - 1) + tail, 8, tuple(blocks))


def test_a_follow_up_extends_the_earlier_prompt_less_its_partial_last_block() -> None:
    """In the Mooncake format the partial last block is re-hashed once the conversation grows:
    the follow-up keeps every block but that one. The whole-prompt rule alone found no turn in
    a real multi-turn trace (issue 41)."""
    system = 1
    trace = [
        _partial(0, 0, [system, 10, 11, 12], tail=100),  # A, turn 1: its last block partial
        _partial(1, 1, [system, 20, 21, 22], tail=300),  # B, turn 1
        _partial(2, 2, [system, 10, 11, 13, 14], tail=50),  # A, turn 2: block 12 re-hashed as 13
        _partial(3, 3, [system, 20, 21, 23], tail=400),  # B, turn 2: longer, same block count
        _partial(4, 4, [system, 10, 11, 13, 15, 16], tail=9),  # A, turn 3
        # B, turn 3: keeps what turns 1 and 2 both keep; turn 2 is the latest of that chain
        _request(5, 5, [system, 20, 21, 23]),
        _partial(6, 6, [system, 20, 21, 23, 24], tail=1),  # B, turn 4: extends 5 whole
    ]
    turns = infer_turns(trace)
    assert turns.predecessor == {2: 0, 3: 1, 4: 2, 5: 3, 6: 5}
    assert turns.less_partial_block == {2, 3, 4, 5} and turns.whole_prompt == 1
    assert turns.conversations == 2 and turns.shared_prefixes == 0


def test_the_longest_kept_prefix_is_the_turn_before_and_a_prefix_kept_twice_is_no_turn() -> None:
    system = [1, 2]
    trace = [
        _partial(0, 0, [*system, 9], tail=10),  # keeps the system blocks only
        # extends 0, the only prompt that kept the system blocks then: its turn by the hash ids
        # (they cannot tell a new conversation from one whose first message was short)
        _partial(1, 1, [*system, 10, 11], tail=10),
        _partial(2, 2, [*system, 10, 12, 13], tail=10),  # extends 1 (longer) and 0: follows 1
        _partial(3, 3, [*system, 30], tail=10),  # a second prompt keeping the system blocks
        _partial(4, 4, [*system, 40, 41], tail=10),  # extends 0 and 3 alike: which? neither
    ]
    turns = infer_turns(trace)
    assert turns.predecessor == {1: 0, 2: 1}
    assert turns.shared_prefixes == 1  # the system blocks, kept by requests 0 and 3


def test_a_prompt_that_ends_on_a_whole_block_is_extended_whole() -> None:
    trace = [
        _request(0, 0, [5, 6]),  # 1,024 tokens: both blocks whole, kept whole
        _partial(1, 1, [5, 6, 7], tail=3),  # extends it whole
        _request(2, 2, [5, 6]),  # the same prompt again: a repeat, not a turn
    ]
    turns = infer_turns(trace)
    assert turns.predecessor == {1: 0} and turns.whole_prompt == 1
    assert not turns.less_partial_block


def _conversation() -> list[TraceRequest]:
    """A long prompt that keeps the engine busy, then a conversation's two turns 10 ms apart,
    both arriving while that prompt's prefill runs, small enough to share one prefill chunk."""
    first_turn = list(range(100, 104))  # 4 blocks: 2,048 tokens
    return [
        _request(0, 0, list(range(1000, 1032))),  # 32 blocks of its own
        _request(1, 10, first_turn, output=32),
        _request(2, 20, [*first_turn, 200, 201], output=8),
    ]


@pytest.mark.parametrize("mode", ["open", "causal"])
def test_at_ten_times_the_second_turn_reuses_the_first_only_when_it_waits_for_it(
    mode: str,
) -> None:
    engine = SMALL.engine.model_copy(update={"prefetch_policy": "best_effort"})  # no L3 wait
    options = SMALL.model_copy(update={"speed": 10.0, "arrivals": mode, "engine": engine})
    replay = make_replay("live", _conversation(), options)
    metrics = replay.run()
    books = replay.engine.books
    reused = books.device_hit_tokens + metrics.tokens_spliced
    assert metrics.arrivals.mode == mode and metrics.arrivals.turns == 1
    if mode == "open":  # both turns are admitted in one batch: the first's pages are not there
        assert reused == 0 and metrics.arrivals.delayed == 0
    else:  # the second waits for the first to finish, then finds its whole prompt's pages
        assert reused == 4 * 512 and metrics.arrivals.delayed == 1
        assert metrics.arrivals.delay_ms.p50 > 0
    arrivals = metrics.arrivals
    assert (arrivals.turns_whole_prompt, arrivals.turns_less_partial_block) == (1, 0)


def test_open_arrivals_are_the_default_and_unchanged_where_there_are_no_turns() -> None:
    conversation = _conversation()
    plain = make_replay("live", conversation, SMALL).run()
    assert plain.arrivals.mode == "open"
    trace_without_turns = conversation[:2]
    causal = SMALL.model_copy(update={"arrivals": "causal"})
    one = make_replay("live", trace_without_turns, causal).run().model_dump()
    other = make_replay("live", trace_without_turns, SMALL).run().model_dump()
    for figures in (one, other):
        figures.pop("wall_seconds")
        figures["arrivals"].pop("mode")
    assert one == other


def test_the_bench_replays_the_arrivals_the_cli_would() -> None:
    from stagefate.bench.replay import bench_options

    conversation = _conversation()
    assert bench_options(conversation)[0].arrivals == "causal"
    assert bench_options(conversation[:2])[0].arrivals == "open"
    slice_options, slice_turns = bench_options(load_trace(None))
    assert (slice_options.arrivals, len(slice_turns.predecessor)) == ("causal", 109)


def test_the_cli_picks_causal_where_the_trace_has_turns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    rows = [
        {"timestamp": r.timestamp_ms, "input_length": r.input_length, "output_length": 8}
        | {"hash_ids": list(r.hash_ids)}
        for r in _conversation()
    ]
    trace = tmp_path / "conversation.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["replay", "--trace", str(trace), "--policy", "live", "--speed", "10"]
    assert main(argv) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "arrivals causal: 1 turns of 1 conversations follow an earlier turn" in printed
    assert "(1 extend its whole prompt, 0 its prompt less a partial last block;" in printed
    assert main([*argv, "--arrivals", "open"]) == 0
    assert "arrivals open: 1 turns" in " ".join(capsys.readouterr().out.split())
